"""The front page and the search manual run as written; the README stays a front page; links resolve.

Every core-only command line of the ``bash`` blocks of README.md and docs/search.md runs exactly as typed (core
install only: commands that need weights, an extra, a hub download or a local model are skipped), the output the
README shows under a command is what it prints, docs/families.md's NAS table is what its searches print, the README
stays short, the first example of docs/library.md runs as written, and every relative link in README.md, docs/*.md and
evals/**/*.md names a file (and heading) that exists.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from nsc_prune.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/search.md")  # pages whose core-only commands run
PROGRAMS = ("nsc-prune", ".venv/bin/nsc-prune")  # the CLI, installed or in the README's non-activated .venv
NEEDS_EXTRA = ("extract", "heal", "train-supernet", "eval", "profile")  # sub-commands of the [hf] / [eval] extras
NEEDS_MORE = ("./my-llama", "meta-llama/", "SMOLLM2", "--prepare", "--latency-table")  # a local model, a hub
# download, the SmolLM2 weights (`models --prepare` and "$SMOLLM2"), a table measured by `profile`
MAX_README_LINES = 220
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SHOWN = re.compile(r"```bash\n([^\n]+)\n```\n\n```\n(.*?)```", re.DOTALL)  # a command, then its output
TIMING = re.compile(r"\d+(?:\.\d+)? ms")


def page_commands(page: str) -> list[str]:
    """Every core-only command line of a page's ``bash`` blocks (``\\`` continuations joined); a ``venv && pip install
    && CMD`` chain keeps CMD (the test runs in an environment where the package is installed)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), re.DOTALL):
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            line = line.split("  #")[0].strip()
            if not line or line.startswith("#") or any(skip in line for skip in NEEDS_MORE):
                continue
            command = line.split(" && ")[-1]
            words = shlex.split(command)
            if words[0] in PROGRAMS and not (len(words) > 1 and words[1] in NEEDS_EXTRA):
                commands.append(command)
    return commands


def _all_commands() -> list[tuple[str, str]]:
    return [(page, command) for page in PAGES for command in page_commands(page)]


def test_the_pages_have_the_commands():
    readme, search = page_commands("README.md"), page_commands("docs/search.md")
    assert ".venv/bin/nsc-prune --model llama-7b --budget 5.7B" in readme
    assert "nsc-prune models" in readme
    assert "nsc-prune rank --benchmark evals/ranking/lts_gpt2_wt103_200.json" in readme
    assert "nsc-prune --model llama-7b --budget 1.4T --cost macs" in search and len(search) >= 6


def _run(command: str, folder: Path) -> subprocess.CompletedProcess:
    """``command`` as a reader types it from the repository root (``.venv`` and ``evals/`` linked into ``folder``)."""
    (folder / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the README's non-activated .venv
    (folder / "evals").symlink_to(ROOT / "evals")  # `rank --benchmark evals/...`, typed from the repository root
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    return subprocess.run(
        shlex.split(command), check=False, cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(("page", "command"), _all_commands(), ids=[f"{p}: {c}" for p, c in _all_commands()])
def test_page_command_runs(page, command, tmp_path):
    done = _run(command, tmp_path)
    assert done.returncode == 0, f"{page}: {command}\n{done.stderr}"
    assert "warning" not in done.stderr


def shown_outputs(page: str) -> list[tuple[str, str]]:
    """(command, what the page shows it prints): a ``bash`` block of one command followed by a plain block."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return [(line.split("  #")[0].strip(), shown) for line, shown in SHOWN.findall(text)]


@pytest.mark.parametrize(
    ("command", "shown"), shown_outputs("README.md"), ids=[c for c, _ in shown_outputs("README.md")]
)
def test_readme_shows_what_the_command_prints(command, shown, tmp_path):
    """The output under a README command is its output today (its first lines; timings aside)."""
    done = _run(command, tmp_path)
    assert done.returncode == 0, done.stderr
    printed = TIMING.sub("N ms", done.stdout).splitlines()
    expected = TIMING.sub("N ms", shown).splitlines()
    assert printed[: len(expected)] == expected


def test_readme_first_output_is_what_command_one_prints(tmp_path):
    """The block under "Two commands" is what the search at the end of command 1 prints (timings aside)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Two commands\n.*?```bash\n(.*?)```.*?\n```\n(.*?)```", text, re.DOTALL)
    command = block[1].splitlines()[1].split(" && ")[-1]
    assert command == ".venv/bin/nsc-prune --model llama-7b --budget 5.7B"
    done = _run(command, tmp_path)
    assert done.returncode == 0, done.stderr
    assert TIMING.sub("N ms", done.stdout).splitlines() == TIMING.sub("N ms", block[2]).splitlines()


NAS_ROW = re.compile(
    r"^\| ([\w-]+), ([\d.]+M) \| ([\w ]+?)(?: \(.*?\))? \| .+? \| ([\d.]+M) \| ([\d,.]+) \|$", re.MULTILINE
)


def test_families_nas_table_is_what_the_search_prints(tmp_path, capsys):
    """docs/families.md's exact NAS searches: each row's params and NSC are what the search prints today."""
    text = (ROOT / "docs/families.md").read_text(encoding="utf-8")
    rows = NAS_ROW.findall(text.split("### Exact NAS searches")[1])
    assert len(rows) == 5
    for space, budget, attention, params, nsc in rows:
        per_head = ["--set", "attention=per_head"] if space.startswith("txl") and attention == "per head" else []
        out = tmp_path / f"{space}-{attention}"
        assert main(["--space", space, "--budget", budget, *per_head, "--no-plot", "--out", str(out)]) == 0
        printed = re.search(r"^params ([\d.]+)M .*, NSC ([\d,.]+)$", capsys.readouterr().out, re.MULTILINE)
        assert (f"{float(printed[1]):.2f}M", printed[2]) == (params, nsc), (space, attention)


def test_readme_stays_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines; the manual goes to docs/ (at most {MAX_README_LINES})"
    )


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        slug = _slug(heading)
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _relative_links() -> list[tuple[str, str]]:
    links = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "evals").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)  # code is not a link
        for target in LINK.findall(text):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked here
                links.append((str(page.relative_to(ROOT)), target))
    return links


def test_relative_links_resolve():
    links = _relative_links()
    assert any(page == "README.md" for page, _ in links) and any(page.startswith("docs/") for page, _ in links)
    broken = []
    for page, target in links:
        file, _, anchor = target.partition("#")
        path = (ROOT / page).parent / file if file else ROOT / page
        if not path.exists():
            broken.append(f"{page}: {target} (no file {path.relative_to(ROOT)})")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{page}: {target} (no heading #{anchor} in {path.relative_to(ROOT)})")
    assert not broken, "\n".join(broken)


def test_the_library_page_example_runs_as_written(tmp_path, monkeypatch):
    # A block a reader pastes must define what it uses (it once used W, config_dict and values undefined).
    block = re.search(r"```python\n(.*?)```", (ROOT / "docs/library.md").read_text(encoding="utf-8"), re.DOTALL)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block.group(1), "docs/library.md", "exec"), namespace)
    assert namespace["found"].selected == 66  # the README's point for llama-7b at 5.7B
    assert namespace["solver"].best_under(namespace["values"], namespace["costs"], namespace["budget"])[0] <= 4
