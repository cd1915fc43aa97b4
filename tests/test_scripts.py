"""Checks by parsing: scripts/ import only the package, and no function grows past a screenful; and how every
script ends (``run_script``, run in a child process).

- a script neither edits ``sys.path`` nor imports another script: what two scripts need is a library function;
- no function in ``nsc_prune/`` or ``scripts/`` is longer than ``MAX_LINES`` lines unless its ``def`` line says
  why in a ``# long:`` comment.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
MAX_LINES = 80
LONG_MARKER = "# long:"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_ends_through_run_script(script):
    """A Ctrl-C printed a traceback, and a SIGTERM skipped the clean-ups (bench_scale left 13 GB behind)."""
    assert 'if __name__ == "__main__":\n    raise SystemExit(run_script(main))\n' in script.read_text()


# What the script does before it stops: its clean-up, then the stop its argument names.
STOPPING = """
import os, signal, sys, time
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import InvalidInputError

def main():
    try:
        if sys.argv[1] == "bad":
            raise InvalidInputError("--tokens must be positive")
        os.kill(os.getpid(), {"term": signal.SIGTERM, "hup": signal.SIGHUP, "int": signal.SIGINT}[sys.argv[1]])
        time.sleep(10)
    finally:
        print("cleaned up")

raise SystemExit(run_script(main))
"""


@pytest.mark.parametrize(
    ("how", "status", "said"),
    [
        ("bad", 2, "error: --tokens must be positive"),
        ("term", 143, "stopped by SIGTERM"),
        ("hup", 129, "stopped by SIGHUP"),
        ("int", 130, "interrupted"),
    ],
)
def test_a_script_stopped_cleans_up_and_says_so_in_one_line(tmp_path, how, status, said):
    import subprocess
    import sys

    from tests.conftest import as_in_a_terminal

    script = tmp_path / "stopping.py"
    script.write_text(STOPPING)

    done = subprocess.run(
        [sys.executable, str(script), how], capture_output=True, text=True, timeout=60, cwd=ROOT,
        preexec_fn=as_in_a_terminal,
    )  # fmt: skip
    assert done.returncode == status and done.stdout == "cleaned up\n"
    assert done.stderr == f"stopping.py: {said}\n"


def sys_path_edits(tree: ast.AST) -> Iterator[str]:
    """Each ``sys.path`` mutation (a call on it, an assignment to it) or ``site.addsitedir`` call in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func.startswith("sys.path.") or func in ("site.addsitedir", "addsitedir"):
                yield f"line {node.lineno}: {func}(...)"
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if ast.unparse(target).startswith("sys.path"):
                    yield f"line {node.lineno}: {ast.unparse(target)} = ..."


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every import in ``tree``, at any depth, ``importlib.import_module("x")`` too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, "." if node.level else (node.module or "").split(".")[0]
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                yield node.lineno, name.value.split(".")[0]


def script_imports(tree: ast.AST, scripts: set[str]) -> list[str]:
    """The imports in ``tree`` of a module named like one of ``scripts`` (or relative ones)."""
    return [f"line {line}: {name}" for line, name in imported_modules(tree) if name in scripts or name == "."]


def long_functions(path: Path, max_lines: int = MAX_LINES) -> Iterator[str]:
    """Functions of ``path`` longer than ``max_lines`` (``def`` to last line) without ``# long:`` on the def line."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > max_lines and LONG_MARKER not in lines[node.lineno - 1]:
                name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                yield f"{name}:{node.lineno} {node.name} ({length} lines)"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_import_only_the_package(script):
    tree = ast.parse(script.read_text(encoding="utf-8"))
    assert not list(sys_path_edits(tree)), f"{script.name} edits sys.path: import the installed package instead"
    found = script_imports(tree, {p.stem for p in SCRIPTS})
    assert not found, f"{script.name} imports a script ({found}): move what both need into nsc_prune"


def test_no_function_over_the_limit_without_a_reason():
    files = [*sorted((ROOT / "nsc_prune").rglob("*.py")), *SCRIPTS]
    too_long = [line for path in files for line in long_functions(path)]
    assert not too_long, (
        f"functions over {MAX_LINES} lines: split them into named parts, or say why one must stay whole in a "
        f"'{LONG_MARKER} reason' comment on its def line:\n" + "\n".join(too_long)
    )


# the checks themselves, on code written here: each must catch what it is for


@pytest.mark.parametrize(
    "source",
    [
        "import sys\nsys.path.insert(0, 'x')",
        "import sys\nsys.path.append('x')",
        "import sys\nsys.path[:0] = ['x']",
        "import sys\nsys.path += ['x']",
        "import site\nsite.addsitedir('x')",
    ],
)
def test_sys_path_edits_are_found(source):
    assert list(sys_path_edits(ast.parse(source)))


def test_reading_sys_path_is_not_an_edit():
    assert not list(sys_path_edits(ast.parse("import sys\nprint(sys.path[0])\nfor p in sys.path: pass")))


@pytest.mark.parametrize(
    "source",
    [
        "import study_smollm2",
        "import study_smollm2 as study",
        "from bench_scale import child_build",
        "def f():\n    from bench_families import bench_families",
        "import importlib\nimportlib.import_module('bench_scale')",
        "from . import bench_scale",
    ],
)
def test_script_imports_are_found(source):
    assert script_imports(ast.parse(source), {"study_smollm2", "bench_scale", "bench_families"})


def test_package_imports_are_not_script_imports():
    source = "import json\nfrom nsc_prune.eval import studies\nimport nsc_prune.hf.extract"
    assert not script_imports(ast.parse(source), {"study_smollm2", "bench_scale"})


def test_long_functions_are_found_unless_marked(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    path = tmp_path / "m.py"
    path.write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n\ndef marked():  # long: one table\n{body}")
    assert [line.split()[1] for line in long_functions(path)] == ["long"]
