"""What the SmolLM2 studies share (scripts/study_*.py, compare_peers_smollm2.py, bench_speed.py): the local texts
they calibrate, train and measure on, the pruning grid, the front search on it, and the random baseline plan.

Texts, all local: calibration and training use Python's ``pydoc_data.topics`` (the language reference topics
``help()`` shows); held-out perplexity uses the docstrings of ``EVAL_MODULES`` and English prose from lm-eval's
task READMEs (``PROSE_SOURCE``), and Python source code of ``CODE_MODULES`` with docstrings and comments removed
(a third domain: code, not English), none ever calibrated or trained on.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nsc_prune.plan import ParetoDocument
    from nsc_prune.planning import ScoreSettings

MIN_FRACTION = 0.25  # the narrowest FFN width of the studies' grid, as a fraction of the full width
FFN_STEP = 64  # the grid's step
GRID = {"ffn_step": FFN_STEP, "ffn_min_fraction": MIN_FRACTION}  # the studies' ffn-grid settings
TASKS = "commonsense8_offline"  # the zero-shot task set (8 x 40 questions: Avg8's standard error is ~2.5 points)
EVAL_MODULES = (
    "argparse",
    "collections",
    "json",
    "logging",
    "pathlib",
    "subprocess",
    "threading",
    "unittest",
    "email.message",
    "csv",
)
CODE_MODULES = ("bisect", "difflib", "fractions", "heapq", "shlex", "statistics", "textwrap", "tokenize")
"""Standard-library modules whose code (no docstrings, no comments) is the third held-out domain; none is in
``EVAL_MODULES``, so no text of theirs is in the docstrings either."""
PROSE_SOURCE = "abstracts and descriptions in lm-eval's task READMEs (lm_eval/tasks/**/README.md, sorted by path)"


def calibration_text(window: int = 0, windows: int = 1) -> str:
    """The calibration and training text: every ``pydoc_data.topics`` topic, in key order. ``window`` of
    ``windows``: the same topics starting at the first of the ``window``-th of ``windows`` equal shares (wrapping
    around), so the first calibration tokens differ by window and every window has the whole text."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    if not 0 <= window < windows:
        raise ValueError(f"window must be in [0, {windows}), got {window}")
    start = window * len(keys) // windows
    return "\n\n".join(topics[key] for key in keys[start:] + keys[:start])


def calibration_ids(tokenizer: Any, tokens: int, batch_tokens: int) -> list[int]:
    """At most ``tokens`` token ids of ``calibration_text`` (the benchmarks' training batches); ConfigError when
    they hold less than one batch of ``batch_tokens``."""
    from nsc_prune.errors import ConfigError

    ids = tokenizer(calibration_text(), add_special_tokens=False)["input_ids"][:tokens]
    if len(ids) < batch_tokens:
        raise ConfigError(
            f"the calibration text holds {len(ids):,} tokens, less than one batch of --batch-size x --seq-len = "
            f"{batch_tokens:,}: lower either"
        )
    return ids


def heldout_text() -> str:
    """The held-out docstrings: those of the functions and classes each of ``EVAL_MODULES`` defines, in name order."""
    parts = []
    for name in EVAL_MODULES:
        module = importlib.import_module(name)
        for _, obj in sorted(vars(module).items()):
            doc = inspect.getdoc(obj) if (inspect.isfunction(obj) or inspect.isclass(obj)) else None
            if doc and getattr(obj, "__module__", None) == module.__name__:
                parts.append(doc)
    return "\n\n".join(parts)


def _is_prose(text: str) -> bool:
    """A paragraph of 200+ characters that starts with a letter and holds no code, table, citation, link or list."""
    markers = ("`", "|", "@", "{", "http", "[x]", "[ ]", "\n*", "\n-")
    return len(text) >= 200 and text[0].isalpha() and not any(c in text for c in markers)


def prose_text() -> str:
    """English prose from a second local source, never used for calibration or training: the prose paragraphs
    (paper abstracts, task descriptions) of the READMEs that the installed lm-eval ships with its tasks
    (``PROSE_SOURCE``). Code, tables, citations, links and checklists are left out."""
    root = Path(importlib.util.find_spec("lm_eval").submodule_search_locations[0]) / "tasks"
    parts = []
    for readme in sorted(root.rglob("README.md")):
        for paragraph in readme.read_text(encoding="utf-8", errors="replace").split("\n\n"):
            if _is_prose(paragraph.strip()):
                parts.append(paragraph.strip())
    return "\n\n".join(dict.fromkeys(parts))  # READMEs repeat some abstracts: keep the first copy


def _without_docstrings(tree: ast.Module) -> ast.Module:
    """``tree`` with the docstring statement of the module and of every class and function removed."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def code_text() -> str:
    """Python source of ``CODE_MODULES``, in that order, with docstrings and comments removed (``ast.unparse``): the
    third held-out domain, code rather than English. Deterministic for one Python version."""
    parts = []
    for name in CODE_MODULES:
        source = Path(inspect.getsourcefile(importlib.import_module(name))).read_text(encoding="utf-8")
        parts.append(ast.unparse(_without_docstrings(ast.parse(source))))
    return "\n\n".join(parts)


def heldout_domains() -> dict[str, str]:
    """The three held-out texts by name: docstrings, prose and code (none calibrated or trained on)."""
    return {"docstrings": heldout_text(), "prose": prose_text(), "code": code_text()}


def grid_front(
    model: str,
    out: Path,
    space: str = "ffn-grid",
    overrides: Mapping[str, Any] | None = None,
    score: ScoreSettings | None = None,
) -> ParetoDocument:
    """The whole front of ``space`` on the studies' grid (``FFN_STEP``, down to ``MIN_FRACTION``, layer 0
    protected unless ``overrides`` say otherwise), written to ``out``/pareto.json."""
    from nsc_prune.planning import search_plan

    settings = {**GRID, "protect_layers": [0], **(overrides or {})}
    document = search_plan(model, "100%", space, overrides=settings, score=score).document
    document.write(out)
    return document


def measured_search(base_dir: Path, text: Path, budget: str) -> Any:
    """The ``ffn-grid`` search (the studies' grid, no layer protected) at ``budget`` by ``--score measured``
    calibrated on ``text`` (``nsc_prune.planning.search_plan``'s result). The table is the one the recorded recovery
    studies used (the loss target, one probed width, no probe cap: the defaults then), so a rerun finds their plans."""
    from nsc_prune.hf.score.sensitivity import SensitivityConfig
    from nsc_prune.planning import ScoreSettings, search_plan

    table = SensitivityConfig(str(text), target="loss", probe_depth=0, probe_widths=1, probe_stride=1)
    score = ScoreSettings("measured", str(base_dir), table, progress=False)
    return search_plan(str(base_dir), budget, "ffn-grid", overrides=GRID, score=score)


def check_budget(budget: str, model: str = "smollm2-135m") -> None:
    """Refuse, in one line and in a second, a ``budget`` ``measured_search`` would refuse only after its minutes of
    measuring: the same ``ffn-grid`` front of the preset ``model``'s config, by psi_MP."""
    from nsc_prune._validation import must_be
    from nsc_prune.core.budget import format_count
    from nsc_prune.errors import InvalidInputError
    from nsc_prune.planning import search_plan

    found = search_plan(model, budget, "ffn-grid", overrides=GRID, allow_above_full=True)
    if found.above_full:  # search_plan's own message names --allow-above-full, which a study has no use for
        full = found.full.params
        raise InvalidInputError(
            must_be("--budget", f"at most the full model's {format_count(full)} params (100%)", budget)
        )


def measured_point(base_dir: Path, text: Path, budget: str, out: Path) -> Any:
    """The ``budget`` point of ``measured_search``, extracted to ``out`` (float32) in the ``activation`` order of
    ``text``. Returns the search."""
    from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders
    from nsc_prune.hf.extract import ExtractOptions, extract_plan
    from nsc_prune.hf.weights.base import open_base

    base = open_base(base_dir)
    found = measured_search(base_dir, text, budget)
    orders, _ = channel_orders(base, SelectionConfig("activation", calib=str(text)))
    plans = found.document.points[found.selected].layer_plans()
    extract_plan(plans, base, out, options=ExtractOptions(dtype="float32"), orders=orders)
    return found


def random_plan(widths: list[int], grid: list[int], protected: set[int], rng: random.Random) -> list[int]:
    """Random ``grid`` widths (widest first, one step apart) for the layers not in ``protected``, moved one step at
    a time until their sum is in ``(total - step, total]``, ``total = sum(widths)``: a random plan of (nearly) the
    same FFN parameter count as ``widths``."""
    step = grid[0] - grid[1]
    free = [i for i in range(len(widths)) if i not in protected]
    plan = list(widths)
    for i in free:
        plan[i] = rng.choice(grid)
    target = sum(widths)
    for _ in range(100_000):
        total = sum(plan)
        if target - step < total <= target:
            return plan
        i = rng.choice(free)
        if total > target and plan[i] > grid[-1]:
            plan[i] -= step
        elif total <= target - step and plan[i] < grid[0]:
            plan[i] += step
    raise RuntimeError("could not match the budget with a random plan")
