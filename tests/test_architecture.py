"""The import boundaries of docs/architecture.md, checked by parsing every module (no imports run).

- no cycle between modules (function-level imports included: a lazy import is still an arrow);
- ``core/``, ``spaces/`` and ``plan`` (and everything they import, transitively) never reach torch,
  transformers, ``hf/``, ``eval/`` or ``cli/``;
- no library module imports ``cli/``;
- ``ranking/`` stays torch-free too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nsc_prune"
HEAVY = ("torch", "transformers", "peft", "accelerate", "safetensors", "lm_eval", "datasets")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for p in PACKAGE.rglob("*.py")
        # shipped in checkpoints: torch/transformers only
        if not (p.parent.name == "modeling" and p.name != "__init__.py")
    }


def _imports(module: str, path: Path) -> Iterator[str]:
    """Every module ``module`` imports, at any depth of its code (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.walk(node)
    }
    known = _modules()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("require") and node.args:
            if isinstance(node.args[0], ast.Constant):  # errors.require("torch", "hf") imports its argument
                yield node.args[0].value
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}: use absolute imports"
            target = node.module or ""
            yield target
            for alias in node.names:  # ``from nsc_prune.core import solver`` imports a sub-module
                if f"{target}.{alias.name}" in known:
                    yield f"{target}.{alias.name}"


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target in _imports(name, path):
            if target.startswith("nsc_prune"):
                # ``nsc_prune.hf.extract`` also runs ``nsc_prune/hf/__init__``; a module's own packages (and the
                # root package) are initialised before it whatever it imports, so they are not arrows it chose.
                parts = target.split(".")
                prefixes = (".".join(parts[:i]) for i in range(2, len(parts) + 1))
                edges.update(p for p in prefixes if p in modules and not name.startswith(p + "."))
            else:
                edges.add(target.split(".")[0])
        edges.discard(name)
        graph[name] = edges
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module reachable from ``start`` -> the module that imports it (for the error message)."""
    seen, stack = {start: start}, [start]
    while stack:
        current = stack.pop()
        for target in graph.get(current, ()):
            if target not in seen:
                seen[target] = current
                stack.append(target)
    return seen


def _path(seen: dict[str, str], end: str) -> str:
    chain = [end]
    while seen[chain[-1]] != chain[-1]:
        chain.append(seen[chain[-1]])
    return " -> ".join(reversed(chain))


GRAPH = _graph()
TORCH_FREE = sorted(
    name
    for name in GRAPH
    if name.startswith(("nsc_prune.core", "nsc_prune.spaces", "nsc_prune.ranking")) or name == "nsc_prune.plan"
)


def test_the_graph_sees_the_package():
    assert {"nsc_prune.core.front", "nsc_prune.plan", "nsc_prune.hf.extract", "nsc_prune.cli"} <= set(GRAPH)
    assert "torch" in GRAPH["nsc_prune.hf.cut.jobs"] and "nsc_prune.core.spec" in GRAPH["nsc_prune.core.front"]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_free_parts_never_reach_torch_hf_eval_or_cli(module):
    seen = _reachable(GRAPH, module)
    forbidden = [
        name for name in seen if name in HEAVY or name.startswith(("nsc_prune.hf", "nsc_prune.eval", "nsc_prune.cli"))
    ]
    assert not forbidden, f"{module} reaches {forbidden[0]}: {_path(seen, forbidden[0])}"


def test_no_library_module_imports_the_cli():
    offenders = {
        name: sorted(t for t in targets if t.startswith("nsc_prune.cli"))
        for name, targets in GRAPH.items()
        if not name.startswith("nsc_prune.cli") and name != "nsc_prune.__main__"
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_training_and_export_formats_never_import_the_extraction_entry_point():
    """``hf/extract.py`` is the top of the weights flow: what the formats and the training share lives below it
    (``hf/cut/jobs.py``, ``_io.check_out_dir``), so nothing under ``hf/train/`` or ``hf/export/`` imports it."""
    below = [name for name in GRAPH if name.startswith(("nsc_prune.hf.train", "nsc_prune.hf.export"))]
    assert "nsc_prune.hf.export.pruned" in below and "nsc_prune.hf.train.heal" in below
    offenders = [name for name in below if "nsc_prune.hf.extract" in GRAPH[name]]
    assert not offenders, offenders
    # and neither folder reaches into the other, or into eval/ (docs/architecture.md's table)
    for name in below:
        other = "nsc_prune.hf.export" if name.startswith("nsc_prune.hf.train") else "nsc_prune.hf.train"
        wrong = sorted(t for t in GRAPH[name] if t.startswith((other, "nsc_prune.eval", "nsc_prune.cli")))
        assert not wrong, (name, wrong)


# hf/ is one sub-package per job of the pipeline; each may import only the jobs below it (docs/architecture.md).
# ``progress`` and ``model_card`` are hf/'s shared helpers; ``extract`` is the entry point over cut and export.
HF_JOBS: dict[str, set[str]] = {
    "modeling": set(),  # shipped in checkpoints: imports nothing of the package
    "progress": set(),
    "model_card": {"modeling"},  # the config keys of the checkpoints it describes
    "ranks": set(),  # the processes of a data-parallel run
    "random_state": set(),  # the caller's generators, kept
    "weights": {"modeling", "progress"},
    "cut": {"weights", "progress"},
    "score": {"weights", "cut", "progress", "ranks"},
    "export": {"weights", "cut", "modeling", "model_card", "progress"},
    "train": {"weights", "cut", "modeling", "model_card", "progress", "ranks", "random_state"},
    "latency": {
        "weights",
        "export",
        "modeling",
        "progress",
        "random_state",
    },  # llama.cpp times GGUF files written by export
    "extract": {"weights", "cut", "export", "progress"},
}


def _hf_job(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if module.startswith("nsc_prune.hf.") else None


def test_hf_folders_name_the_pipeline_and_import_only_the_jobs_below():
    jobs = {_hf_job(name) for name in GRAPH if _hf_job(name)}
    assert jobs == set(HF_JOBS), f"a new part of hf/ needs its row in HF_JOBS: {sorted(jobs ^ set(HF_JOBS))}"
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        if _hf_job(name)
        for target in targets
        if _hf_job(target) and _hf_job(target) != _hf_job(name) and _hf_job(target) not in HF_JOBS[_hf_job(name)]
    )
    assert not wrong, wrong


@pytest.mark.parametrize(
    ("question", "module"),
    [
        ("reading weights", "nsc_prune.hf.weights.safetensors_io"),
        ("which channels to keep", "nsc_prune.hf.cut.selection"),
        ("measured sensitivity", "nsc_prune.hf.score.sensitivity"),
        ("psi_W", "nsc_prune.hf.score.psi_w"),
        ("latency profiling", "nsc_prune.hf.latency.profile"),
        ("the GGUF export", "nsc_prune.hf.export.gguf_format"),
        ("the vLLM export", "nsc_prune.hf.export.nemotron_nas"),
        ("training", "nsc_prune.hf.train.trainer"),
        ("evaluation", "nsc_prune.eval.runner"),
        ("the choice lists", "nsc_prune.choices"),
    ],
)
def test_where_is_x_is_answered_by_a_folder_name(question, module):
    assert module in GRAPH, f"{question}: {module} moved; update docs/architecture.md and this table"


def test_the_choice_lists_are_torch_free_and_the_export_registry_follows_them():
    from nsc_prune.choices import FORMATS
    from nsc_prune.hf.export import EXPORTS

    assert not {t for t in GRAPH["nsc_prune.choices"] if t.startswith("nsc_prune") or t in HEAVY}
    assert tuple(EXPORTS) == FORMATS


def test_every_export_format_is_one_registered_module_with_the_protocol():
    from nsc_prune.hf.export import EXPORTS, ExportFormat

    for name, module in EXPORTS.items():
        assert module in GRAPH, name
        defined = set()
        for node in ast.parse(_modules()[module].read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef):
                defined.add(node.name)
            elif isinstance(node, ast.ImportFrom):
                defined |= {alias.asname or alias.name for alias in node.names}
            elif isinstance(node, ast.Assign):
                defined |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        protocol = {n for n in vars(ExportFormat) if not n.startswith("_")}
        assert protocol == {"output_file", "check_out", "check", "write"} and protocol <= defined, (name, module)


def test_no_import_cycles():
    # A module is on a cycle iff one of the modules it imports can reach it back.
    cycles = [
        f"{name} -> {_path(_reachable(GRAPH, target), name)}"
        for name, targets in GRAPH.items()
        for target in targets
        if target in GRAPH and name in _reachable(GRAPH, target)
    ]
    assert not cycles, cycles[:3]


def test_shipped_modeling_file_agrees_on_the_heads_key():
    pytest.importorskip("transformers")
    from nsc_prune.core.spec import PER_LAYER_HEADS_KEY
    from nsc_prune.hf import modeling
    from nsc_prune.hf.modeling import modeling_nsc_llama

    assert modeling_nsc_llama.HEADS_KEY == PER_LAYER_HEADS_KEY
    assert set(modeling_nsc_llama.MODEL_CLASSES) == set(modeling.ARCHITECTURES)
