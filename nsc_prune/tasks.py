"""Tasks for ``nsc-prune eval``: the Avg8 convention, the offline sets, and ``--tasks`` -> lm-eval tasks.

Avg8 (``headline_metric``, ``average``): acc_norm for hellaswag, arc_challenge and openbookqa, acc for
boolq, piqa, social_iqa, winogrande and arc_easy (the usual pick in pruning papers); a variant such as
``hellaswag_offline`` or ``social_iqa_bigbench`` counts as its task; any other task contributes acc.

What ``--tasks`` accepts, in one place:

- ``commonsense8``: the eight lm-eval tasks of the paper (their datasets must be in the local
  Hugging Face datasets cache when offline);
- ``commonsense8_offline`` or ``<task>_offline``: the project's own small JSONL sets in ``evals/``
  (same fields and prompts as the eight), rendered to absolute data paths at run time;
- any lm-eval task, group or tag name;
- a task YAML file, or a folder of task YAMLs (every task defined there runs), found through
  lm-eval's ``include_path``.

Groups and tags are expanded into their leaf tasks, which are reported one by one.
lm-eval is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.io import sha256_file

COMMONSENSE8 = (
    "boolq", "piqa", "social_iqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa",
)  # fmt: skip
#: Avg8 convention (the usual one in pruning papers): acc_norm for these three, acc for the rest.
ACC_NORM_TASKS = frozenset({"hellaswag", "arc_challenge", "openbookqa"})
#: Column titles of the paper's Table 4.
SHORT_NAMES = {
    "boolq": "BoolQ", "piqa": "PIQA", "social_iqa": "SIQA", "hellaswag": "HSwag", "winogrande": "WGrnd",
    "arc_easy": "ARC-e", "arc_challenge": "ARC-c", "openbookqa": "OBQA",
}  # fmt: skip
OFFLINE_SUFFIX = "_offline"
OFFLINE_GROUP = "commonsense8" + OFFLINE_SUFFIX
#: Suffixes of task variants that stand for one of the eight (offline sets, converted real data).
VARIANT_SUFFIXES = (OFFLINE_SUFFIX, "_bigbench")
ALIASES = {"commonsense8": COMMONSENSE8, OFFLINE_GROUP: tuple(t + OFFLINE_SUFFIX for t in COMMONSENSE8)}

EVALS_ENV = "NSC_PRUNE_EVALS_DIR"
DATA_PLACEHOLDER = "@EVALS_DATA@"  # in evals/tasks/*.yaml; replaced by the absolute evals/data path


def canonical_task(name: str) -> str | None:
    """Which of the eight ``name`` stands for (``hellaswag_offline`` -> ``hellaswag``), else None."""
    if name in COMMONSENSE8:
        return name
    for suffix in VARIANT_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in COMMONSENSE8:
            return name[: -len(suffix)]
    return None


def headline_metric(name: str, metrics: Sequence[str] = ()) -> str:
    """The metric a task contributes to the average (Avg8 convention; ``acc`` for other tasks).

    Falls back to the first of ``metrics`` when a task does not report the conventional one.
    """
    canonical = canonical_task(name)
    wanted = "acc_norm" if canonical in ACC_NORM_TASKS else "acc"
    if metrics and wanted not in metrics:
        return metrics[0]
    return wanted


def average(results: Mapping[str, Mapping[str, Any]]) -> float | None:
    """Unweighted mean over tasks of each task's headline metric (Avg8 for the eight tasks)."""
    values = [r[r["metric"]] for r in results.values() if r.get(r["metric"]) is not None]
    return sum(values) / len(values) if values and len(values) == len(results) else None


def avg_label(tasks: Sequence[str]) -> str:
    """'Avg8' when the tasks are the eight commonsense tasks (or their stand-ins), else 'Avg'."""
    canon = [canonical_task(t) for t in tasks]
    return "Avg8" if len(tasks) == 8 and sorted(filter(None, canon)) == sorted(COMMONSENSE8) else "Avg"


def evals_dir() -> Path:
    """The offline task folder: ``$NSC_PRUNE_EVALS_DIR``, else the copy shipped in the package.

    The repository's ``evals/data`` and ``evals/tasks`` are links to the packaged folder.
    """
    return Path(os.environ.get(EVALS_ENV) or Path(__file__).resolve().parent / "evals")


def render_offline_tasks(dest: str | os.PathLike, source: str | os.PathLike | None = None) -> list[Path]:
    """Write the offline task YAMLs into ``dest`` with their data paths made absolute.

    lm-eval's ``json`` datasets need absolute ``data_files``; the templates in ``evals/tasks``
    carry the placeholder ``@EVALS_DATA@`` instead, so the repository can live anywhere.
    """
    source = Path(source) if source is not None else evals_dir()
    data = (source / "data").resolve()
    written = []
    for template in sorted((source / "tasks").glob("*.yaml")):
        text = template.read_text(encoding="utf-8").replace(DATA_PLACEHOLDER, data.as_posix())
        out = Path(dest) / template.name
        out.write_text(text, encoding="utf-8")
        written.append(out)
    return written


@dataclass
class TaskSet:
    """Resolved tasks ready for lm-eval's ``evaluate``: leaf Task objects in run order."""

    tasks: dict[str, Any]  # name -> lm_eval.api.task.Task
    task_manager: Any  # lm_eval.tasks.TaskManager that built them
    sources: dict[str, str] = field(default_factory=dict)  # name -> YAML path or "lm-eval"

    @property
    def names(self) -> list[str]:
        return list(self.tasks)


def _split_specs(specs: str | Sequence[str]) -> list[str]:
    items = [specs] if isinstance(specs, str) else list(specs)
    out = [part.strip() for item in items for part in str(item).split(",") if part.strip()]
    if not out:
        raise InvalidInputError("The 'tasks' parameter must name at least one task. Got an empty list instead.")
    return out


def _yaml_tasks(path: Path) -> list[str]:
    """Task (or group) names defined by a YAML file, or every task defined in a folder of YAMLs."""
    from lm_eval.tasks._index import Kind, TaskIndex

    if path.is_file():
        try:
            entry = TaskIndex.entry_from_path(path)
        except Exception as err:  # malformed YAML, unknown shape
            raise ConfigError(f"task file {path} could not be read as an lm-eval task YAML: {err}") from err
        if entry is None:
            raise ConfigError(f"task file {path} defines no 'task' or 'group' key")
        return [entry.name]
    index = TaskIndex.build([path])
    names = [name for name, entry in index.items() if entry.kind in (Kind.TASK, Kind.PY_TASK)]
    if not names:
        raise ConfigError(f"no task YAML (a file with a 'task' key) was found under {path}")
    return names


def _expand(specs: list[str], offline: list[str]) -> tuple[list[str], list[Path]]:
    """Names to load (aliases expanded, paths replaced by the tasks they define) and include paths."""
    names: list[str] = []
    paths: list[Path] = []
    for spec in specs:
        if spec in ALIASES:
            names += ALIASES[spec]
        elif Path(spec).expanduser().exists() and (spec.endswith((".yaml", ".yml")) or Path(spec).is_dir()):
            path = Path(spec).expanduser().resolve()
            paths.append(path.parent if path.is_file() else path)
            names += _yaml_tasks(path)
        elif spec.endswith((".yaml", ".yml")) or os.sep in spec:
            raise InvalidInputError(f"The 'tasks' parameter names a path that does not exist: {spec}")
        else:
            names.append(spec)
    if not offline and any(name.endswith(OFFLINE_SUFFIX) for name in names):
        raise ConfigError(
            f"the offline task sets were not found in {evals_dir()}; set {EVALS_ENV} to a folder holding data/ and tasks/"
        )
    return list(dict.fromkeys(names)), paths


def _unknown_task_error(name: str, known: Sequence[str]) -> InvalidInputError:
    close = difflib.get_close_matches(name, [*ALIASES, *known], n=5, cutoff=0.6)
    hint = f"close matches: {', '.join(close)}" if close else "no close match"
    return InvalidInputError(
        f"unknown task {name!r} ({hint}). --tasks takes commonsense8, {OFFLINE_GROUP}, an lm-eval task, "
        "group or tag name ('lm-eval ls tasks' lists them), a task YAML file, or a folder of task YAMLs."
    )


_LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
_DATASET_ERRORS = (ConnectionError, FileNotFoundError, TimeoutError)  # DatasetNotFoundError is a FileNotFoundError
_HUB_ERRORS = ("OfflineModeIsEnabled", "LocalEntryNotFoundError", "DatasetNotFoundError")


class DatasetUnavailableError(ConfigError):
    """Tasks whose datasets are neither reachable nor in the local Hugging Face datasets cache."""

    def __init__(self, missing: Sequence[tuple[str, str | None, str]]):
        self.missing = list(missing)  # (task, datasets.load_dataset(...) call or None, cause)
        names = ", ".join(repr(task) for task, _, _ in self.missing)
        calls = [call for _, call, _ in self.missing if call]
        causes = "; ".join(dict.fromkeys(cause for _, _, cause in self.missing))
        text = f"the dataset of task(s) {names} is not available ({causes})"
        if calls:
            text += (
                "; pre-download it on a machine with network access: python -c \"import datasets; "
                + "; ".join(dict.fromkeys(calls))
                + "\" (it lands in the Hugging Face datasets cache, ~/.cache/huggingface/datasets or "
                "$HF_DATASETS_CACHE; copy that folder to this machine), then run with HF_DATASETS_OFFLINE=1"
            )
        if len(calls) < len(self.missing):
            text += "; for local files, check the task's data_files paths"
        super().__init__(text)


def _load_call(cfg: dict[str, Any] | None) -> str | None:
    """The ``datasets.load_dataset(...)`` call that caches a task's hub dataset (None for local files)."""
    path, name = (cfg or {}).get("dataset_path"), (cfg or {}).get("dataset_name")
    if not path or path in _LOCAL_BUILDERS:
        return None
    return f"datasets.load_dataset({path!r}" + (f", {name!r})" if name else ")")


def _load_one(tm: Any, name: str) -> dict[str, Any]:
    """Build one task, group or tag; turn a missing dataset into an error that says what to do."""
    entry = tm.task_index.get(name)
    try:
        return tm.load([name])["tasks"]
    except Exception as err:
        if isinstance(err, _DATASET_ERRORS) or type(err).__name__ in _HUB_ERRORS:
            cause = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            raise DatasetUnavailableError([(name, _load_call(entry.cfg if entry else None), cause)]) from err
        raise ConfigError(f"task {name!r} could not be built by lm-eval: {type(err).__name__}: {err}") from err


@contextlib.contextmanager
def resolve_tasks(specs: str | Sequence[str]) -> Iterator[TaskSet]:
    """Resolve ``--tasks`` values into built lm-eval tasks (datasets loaded), in a temporary workspace.

    Fails before any model is loaded: unknown names list close matches; a task whose dataset is
    missing is named with the command that pre-downloads it.
    """
    lm_tasks = require("lm_eval.tasks", "eval")
    require("lm_eval.tasks._index", "eval")
    spec_list = _split_specs(specs)
    with tempfile.TemporaryDirectory(prefix="nsc-prune-tasks-") as tmp:
        offline_dir = evals_dir()
        rendered = render_offline_tasks(tmp, offline_dir) if (offline_dir / "tasks").is_dir() else []
        offline_index = _offline_names(rendered)
        names, paths = _expand(spec_list, offline_index)
        local = set(offline_index) | {n for p in paths for n in _index_names(p)}
        include = [Path(tmp), *paths]
        needs_defaults = any(name not in local for name in names)
        tm = lm_tasks.TaskManager(include_path=[str(p) for p in include], include_defaults=needs_defaults)
        for name in names:
            if name not in tm.all_tasks:
                raise _unknown_task_error(name, tm.all_tasks)
        tasks: dict[str, Any] = {}
        missing: list[DatasetUnavailableError] = []
        for name in names:
            try:
                built = _load_one(tm, name)
            except DatasetUnavailableError as err:
                if not _offline_mode():  # each miss may cost a minute of retries: stop at the first
                    raise
                missing.append(err)
                continue
            for leaf, task in built.items():
                tasks.setdefault(leaf, task)
        if missing:
            raise DatasetUnavailableError([m for err in missing for m in err.missing]) from missing[0]
        sources = {}
        for leaf in tasks:
            entry = tm.task_index.get(leaf)
            path = Path(entry.yaml_path) if entry and entry.yaml_path else None
            if path is not None and path.parent == Path(tmp):  # a rendered template: name the source
                path = offline_dir / "tasks" / path.name
            sources[leaf] = str(path) if path is not None else "lm-eval"
        yield TaskSet(tasks=tasks, task_manager=tm, sources=sources)


def _offline_mode() -> bool:
    flags = (os.environ.get(k, "").upper() for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))
    return any(flag in ("1", "ON", "YES", "TRUE") for flag in flags)


def _offline_names(rendered: list[Path]) -> list[str]:
    return [n for p in {r.parent for r in rendered} for n in _index_names(p)]


def _index_names(path: Path) -> list[str]:
    from lm_eval.tasks._index import TaskIndex

    return list(TaskIndex.build([path]))


def describe_tasks(tasks: TaskSet) -> dict[str, dict[str, Any]]:
    """What each task is: lm-eval version, source YAML, dataset, sha256 of local data files."""
    info = {}
    for name, task in tasks.tasks.items():
        cfg = task.config
        files = ((cfg.dataset_kwargs or {}).get("data_files") or {}) if cfg.dataset_path == "json" else {}
        files = {files: files} if isinstance(files, str) else files
        info[name] = {
            "canonical": canonical_task(name),
            "metric": headline_metric(name, [m["metric"] for m in cfg.metric_list or []]),
            "version": (cfg.metadata or {}).get("version"),
            "source": tasks.sources.get(name),
            "dataset": {"path": cfg.dataset_path, "name": cfg.dataset_name},
            "data_sha256": {Path(p).name: sha256_file(p) for p in files.values() if isinstance(p, str) and Path(p).is_file()},
        }
    return info
