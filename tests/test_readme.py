"""The README's command lines run exactly as written (core install only; hub models and installs skipped)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("## Two commands", "### Search")
NEEDS_MORE = ("./my-llama", "meta-llama/", "bash .ci/run")  # a local model, a hub download, the test runner


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = re.compile(r"^#{2,3} ", re.M).search(text, start + len(heading) + 1)
    return text[start : end.start() if end else len(text)]


def readme_commands() -> list[str]:
    """Every command line of the sections' ``bash`` blocks; a ``venv && pip install && CMD`` chain keeps CMD
    (the test runs in an environment where the package is installed)."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for heading in SECTIONS:
        for block in re.findall(r"```bash\n(.*?)```", _section(text, heading), re.S):
            for line in block.splitlines():
                line = line.split("  #")[0].strip()
                if line and not line.startswith("#") and not any(skip in line for skip in NEEDS_MORE):
                    commands.append(line.split(" && ")[-1])
    return commands


def test_readme_has_the_commands():
    commands = readme_commands()
    assert ".venv/bin/nsc-prune --model llama-7b --budget 5.7B" in commands and len(commands) >= 5


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs(command, tmp_path):
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the README's non-activated .venv
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
