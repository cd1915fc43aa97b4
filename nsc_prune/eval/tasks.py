"""Tasks for ``nsc-prune eval``: the Avg8 convention, the offline sets, and ``--tasks`` -> lm-eval tasks.

Avg8 (``headline_metric``, ``average``): acc_norm for hellaswag, arc_challenge and openbookqa, acc for
boolq, piqa, social_iqa, winogrande and arc_easy (the usual pick in pruning papers); a variant such as
``hellaswag_offline`` or ``social_iqa_bigbench`` counts as its task; any other task contributes acc (without
acc, its metric_list's first: ``task_metric``).

What ``--tasks`` accepts, in one place:

- ``commonsense8``: the eight lm-eval tasks of the paper (their datasets must be in the local
  Hugging Face datasets cache when offline);
- ``commonsense8_offline`` or ``<task>_offline``: the project's own small JSONL sets in ``evals/``
  (same fields and prompts as the eight), rendered to absolute data paths at run time;
- any lm-eval task, group or tag name;
- a task YAML file (only that file: other YAMLs beside it are not read), or a folder of task YAMLs
  (every task defined in its ``.yaml`` files runs; its ``.yml`` files that define one are named in a warning);
  both are copied into a private folder with ``@EVALS_DATA@`` rendered, which becomes lm-eval's
  ``include_path``. A task or group name defined twice (two files, or a file and lm-eval's built-in tasks) is an
  error naming both files.

Groups and tags are expanded into their leaf tasks, which are reported one by one.
lm-eval is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import glob
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsc_prune._files import user_path
from nsc_prune._io import read_utf8, sha256_file
from nsc_prune._validation import must_be, yaml_problem
from nsc_prune._warn import warn
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.progress import quiet_logger

COMMONSENSE8 = (
    "boolq",
    "piqa",
    "social_iqa",
    "hellaswag",
    "winogrande",
    "arc_easy",
    "arc_challenge",
    "openbookqa",
)
#: Avg8 convention (the usual one in pruning papers): acc_norm for these three, acc for the rest.
ACC_NORM_TASKS = frozenset({"hellaswag", "arc_challenge", "openbookqa"})
#: Column titles of the paper's Table 4.
SHORT_NAMES = {
    "boolq": "BoolQ",
    "piqa": "PIQA",
    "social_iqa": "SIQA",
    "hellaswag": "HSwag",
    "winogrande": "WGrnd",
    "arc_easy": "ARC-e",
    "arc_challenge": "ARC-c",
    "openbookqa": "OBQA",
}
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


def average_stderr(results: Mapping[str, Mapping[str, Any]]) -> float | None:
    """Standard error of ``average``: sqrt(sum of the tasks' squared stderr) / number of tasks (tasks independent)."""
    errors = [r.get(f"{r['metric']}_stderr") for r in results.values()]
    if not errors or any(e is None for e in errors):
        return None
    return math.sqrt(sum(e * e for e in errors)) / len(errors)


def avg_label(tasks: Sequence[str]) -> str:
    """'Avg8' when the tasks are the eight commonsense tasks (or their stand-ins), else 'Avg'."""
    canon = [canonical_task(t) for t in tasks]
    return "Avg8" if len(tasks) == 8 and sorted(filter(None, canon)) == sorted(COMMONSENSE8) else "Avg"


def evals_dir() -> Path:
    """The offline task folder: ``$NSC_PRUNE_EVALS_DIR``, else the copy shipped in the package.

    The repository's ``evals/data`` and ``evals/tasks`` are links to the packaged folder.
    """
    given = os.environ.get(EVALS_ENV)
    return user_path(given) if given else Path(__file__).resolve().parent / "offline"  # '~/evals' as NSC_PRUNE_CACHE


def _render(text: str, data: Path) -> str:
    """A task YAML with ``@EVALS_DATA@`` replaced by the absolute path of ``data``."""
    return text.replace(DATA_PLACEHOLDER, data.resolve().as_posix())


def render_offline_tasks(dest: str | os.PathLike, source: str | os.PathLike | None = None) -> list[Path]:
    """Write the offline task YAMLs into ``dest`` with their data paths made absolute.

    lm-eval's ``json`` datasets need absolute ``data_files``; the templates in ``evals/tasks``
    carry the placeholder ``@EVALS_DATA@`` instead, so the repository can live anywhere.
    """
    source = Path(source) if source is not None else evals_dir()
    written = []
    for template in sorted((source / "tasks").glob("*.yaml")):
        out = Path(dest) / template.name
        out.write_text(_render(template.read_text(encoding="utf-8"), source / "data"), encoding="utf-8")
        written.append(out)
    return written


def _stage_path(path: Path, dest: Path) -> dict[Path, Path]:
    """Copy a user task YAML, or a folder of them, into the private folder ``dest``; return {copy: original}.

    YAMLs are copied with ``@EVALS_DATA@`` rendered, as the bundled templates are; other files are
    linked, so ``!function`` helpers and lm-eval's ``*_yaml`` templates still resolve. A single file
    is staged alone with the non-YAML files beside it: other task YAMLs in its folder (or below) can
    neither add nor replace tasks.
    """
    data = evals_dir() / "data"
    staged: dict[Path, Path] = {}

    def copy(src: str | Path, dst: str | Path) -> Path:
        src, dst = Path(src), Path(dst)
        task = src.suffix.lower() == ".yaml" or src == path  # a single .yml file is staged as .yaml (lm-eval: *.yaml)
        template = src.suffix.lower() == ".yml" and b"@EVALS_DATA@" in src.read_bytes()  # rendered, its own name
        if not (task or template):
            dst.symlink_to(src.resolve())
            return dst
        dst = dst.with_suffix(".yaml") if task else dst
        dst.write_text(_render(read_utf8(src, "task file"), data), encoding="utf-8")
        if task:
            staged[dst.resolve()] = src
        return dst

    if path.is_dir():
        shutil.copytree(
            path,
            dest,
            ignore=shutil.ignore_patterns("__pycache__", ".*"),
            copy_function=copy,
            ignore_dangling_symlinks=True,
        )
        return staged
    dest.mkdir(parents=True)
    for sibling in path.parent.iterdir():
        if sibling.is_file() and sibling.suffix.lower() not in (".yaml", ".yml"):  # A.YAML is a task of its own
            copy(sibling, dest / sibling.name)
    copy(path, dest / path.name)
    return staged


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
        raise InvalidInputError(must_be("tasks", "at least one task name", []))
    return out


def _scan(root: Path, single_file: bool = False) -> list[Any]:
    """lm-eval index entries (name, kind, yaml_path) of the task and group YAMLs under ``root``.

    YAMLs lm-eval cannot read are skipped, as lm-eval's own index does, except a file given alone.
    """
    from lm_eval.tasks._index import Kind, TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    entries = []
    for yaml_path in sorted(root.rglob("*.yaml"), key=lambda p: p.as_posix()):
        one: dict[str, Any] = {}
        try:
            TaskIndex.process_cfg(load_yaml(yaml_path, resolve_func=False), yaml_path.resolve(), one)
            unnamed = [entry.name for entry in one.values() if not (isinstance(entry.name, str) and entry.name)]
            if unnamed:  # `task: null` was indexed under None and failed later, in a traceback
                raise ConfigError(must_be("its 'task' or 'group'", "a non-empty name", unnamed[0]))
        except Exception as err:  # malformed YAML, unknown shape, missing include, no name
            if not single_file:
                continue
            hint = (
                "; a file is read alone (with the non-YAML files beside it): to include a sibling .yaml, "
                "pass the folder"
            )
            raise ConfigError(
                f"task file {yaml_path.name} could not be read as an lm-eval task YAML: {yaml_problem(err)}"
                + (hint if isinstance(err, FileNotFoundError) else "")
            ) from err
        entries += [entry for entry in one.values() if entry.kind != Kind.TAG]
    return entries


def _stage_spec(spec: str, path: Path, dest: Path, origin: dict[Path, Path]) -> list[str]:
    """Stage a ``--tasks`` path into ``dest`` (``_stage_path``); the tasks it asks for, in order."""
    from lm_eval.tasks._index import Kind

    origin.update(_stage_path(path, dest))
    if path.is_file():
        entries = _scan(dest, single_file=True)
        if not entries:
            raise ConfigError(f"task file {path} defines no 'task' or 'group' key")
        return [entries[0].name]
    names = [e.name for e in _scan(dest) if e.kind in (Kind.TASK, Kind.PY_TASK)]
    # staged (hidden folders left out) .yml files that define a task: lm-eval reads .yaml only; a template an
    # included .yaml names keeps its name, and is no task
    ymls = (copy for copy in dest.rglob("*") if copy.suffix.lower() == ".yml" and copy.is_file())
    skipped = sorted(str(copy.relative_to(dest)) for copy in ymls if _defines_a_task(copy))
    if not names:
        others = " (lm-eval reads a folder's .yaml files only: rename its .yml ones)" if skipped else ""
        raise ConfigError(f"no task YAML (a file with a 'task' key) was found under {spec}{others}")
    if skipped:
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        warn(f"--tasks {spec}: its .yml files that define a task ({', '.join(skipped[:3])}{more}) are not read "
             "(lm-eval reads a folder's .yaml files only); rename them .yaml")  # fmt: skip
    return names


def _defines_a_task(path: Path) -> bool:
    """Whether the YAML file ``path`` has a top-level ``task`` key (a file that does not read: no)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        found = load_yaml(path, resolve_func=False, recursive=False)
    except Exception:  # not YAML lm-eval reads (a binary, a template of another tool): no task of ours
        return False
    return isinstance(found, dict) and "task" in found


def _a_task_folder(spec: str, folder: Path) -> bool:
    """Whether ``spec``, a folder, means its task YAMLs: a path (``tasks/``, ``./piqa``), or a bare name whose folder
    holds YAML; a bare name such as ``piqa`` is the task when its folder holds none (``eval --out piqa``'s results)."""
    if os.sep in spec or (os.altsep or os.sep) in spec:
        return True
    hidden = lambda path: any(part.startswith(".") or part == "__pycache__" for part in path.parts)  # noqa: E731
    yamls = (path for path in folder.rglob("*") if path.suffix.lower() == ".yaml")  # what staging reads (.YAML too)
    return any(not hidden(path.relative_to(folder)) for path in yamls)


def _is_yaml(path: Path) -> bool:
    return path.suffix.lower() in (".yaml", ".yml")  # Task.YML too


def _expand(specs: list[str], workspace: Path, origin: dict[Path, Path]) -> tuple[list[str], list[Path]]:
    """Names to load (aliases expanded, paths replaced by the tasks they define) and the staged user folders."""
    names: list[str] = []
    roots: list[Path] = []
    for spec in specs:
        path = user_path(spec)
        if spec in ALIASES:
            names += ALIASES[spec]
        elif path.exists() and (_is_yaml(path) or (path.is_dir() and _a_task_folder(spec, path))):
            roots.append(workspace / f"user-{len(roots)}")
            names += _stage_spec(spec, path.resolve(), roots[-1], origin)
        elif path.exists() and (path.suffix or os.sep in spec):  # a text file, say; not a task name that is a file
            raise InvalidInputError(
                f"The 'tasks' parameter names {spec}, which is neither a task YAML (.yaml, .yml) nor a folder of them"
            )
        elif _is_yaml(path) or os.sep in spec:
            raise InvalidInputError(f"The 'tasks' parameter names a path that does not exist: {spec}")
        else:
            names.append(spec)
    return list(dict.fromkeys(names)), roots


def _defined_twice(name: str, first: Path | str, second: Path | str) -> ConfigError:
    return ConfigError(
        f"task {name!r} is defined twice, differently: in {first} and in {second}; rename one of them "
        "(its 'task:' or 'group:' key) or leave one file out of --tasks"
    )


def _definitions(roots: Sequence[Path], origin: Mapping[Path, Path]) -> dict[str, Any]:
    """Task and group names defined under ``roots`` -> their lm-eval index entry (``yaml_path``: the staged copy).

    lm-eval would let one silently replace another; a name defined by two files whose rendered
    text differs is refused instead, naming both files.
    """
    defined: dict[str, Any] = {}
    for root in roots:
        for entry in _scan(root):
            previous = defined.get(entry.name)
            if previous is not None and previous.yaml_path.read_bytes() != entry.yaml_path.read_bytes():
                first, second = (origin.get(e.yaml_path, e.yaml_path) for e in (previous, entry))
                raise _defined_twice(entry.name, first, second)
            defined[entry.name] = entry
    return defined


def _needs_builtin(names: Sequence[str], defined: Mapping[str, Any]) -> bool:
    """Whether a requested name, or a task of a requested group (recursively), is not defined locally."""
    pending, seen = list(names), set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        entry = defined.get(name)
        if entry is None:
            return True
        children = (entry.cfg or {}).get("task") if entry.cfg and "group" in entry.cfg else []
        pending += _task_names(children)
    return False


def _task_names(children: Any) -> list[str]:
    """The task and group names a group's ``task:`` list names, inline subgroups' (``- group: x``) included."""
    names: list[str] = []
    for child in children if isinstance(children, list) else [children]:
        if isinstance(child, str):
            names.append(child)
        elif isinstance(child, dict) and "group" in child:
            names += _task_names(child.get("task") or [])
        elif isinstance(child, dict) and isinstance(child.get("task"), str):
            names.append(child["task"])
    return names


def _check_unshadowed(tm: Any, defined: Mapping[str, Any], origin: Mapping[Path, Path]) -> None:
    """Refuse a name of ours that a later include path (lm-eval's built-in tasks) defines differently."""
    for name, ours in defined.items():
        entry = tm.task_index.get(name)
        winner = Path(entry.yaml_path).resolve() if entry is not None and entry.yaml_path else None
        if entry is not None and (winner is None or winner.read_bytes() != ours.yaml_path.read_bytes()):
            raise _defined_twice(name, origin.get(ours.yaml_path, ours.yaml_path), winner or f"a tag named {name!r}")


def _unknown_task_error(name: str, known: Sequence[str]) -> InvalidInputError:
    close = difflib.get_close_matches(name, [*ALIASES, *known], n=5, cutoff=0.6)
    hint = f"close matches: {', '.join(close)}" if close else "no close match"
    return InvalidInputError(
        f"unknown task {name!r} ({hint}). --tasks takes commonsense8, {OFFLINE_GROUP}, an lm-eval task, "
        "group or tag name ('lm-eval ls tasks' lists them), a task YAML file, or a folder of task YAMLs."
    )


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
                '; pre-download it on a machine with network access: python -c "import datasets; '
                + "; ".join(dict.fromkeys(calls))
                + '" (it lands in the Hugging Face datasets cache, ~/.cache/huggingface/datasets or '
                "$HF_DATASETS_CACHE; copy that folder to this machine), then run with HF_DATASETS_OFFLINE=1"
            )
        if len(calls) < len(self.missing):
            text += "; for local files, check the task's dataset_path and data_files paths"
        super().__init__(text)


def _load_call(cfg: dict[str, Any] | None) -> str | None:
    """The ``datasets.load_dataset(...)`` call that caches a task's hub dataset (None for local files)."""
    path, name = (cfg or {}).get("dataset_path"), (cfg or {}).get("dataset_name")
    if not path or not isinstance(path, str) or path in _packaged_builders() or _is_local_path(path):
        return None
    return f"datasets.load_dataset({path!r}" + (f", {name!r})" if name else ")")


def _is_local_path(path: str) -> bool:
    """Whether a ``dataset_path`` names a folder here, not a Hub dataset (``owner/name`` never starts so)."""
    return path.startswith((os.sep, ".", "~")) or os.path.isabs(path) or os.path.exists(path)


def _load_one(tm: Any, name: str) -> dict[str, Any]:
    """Build one task, group or tag; turn a missing dataset into an error that says what to do."""
    entry = tm.task_index.get(name)
    try:
        with quiet_logger("datasets"):  # its own error line came before ours; the cause is in ours
            return tm.load([name])["tasks"]
    except Exception as err:
        if isinstance(err, _DATASET_ERRORS) or type(err).__name__ in _HUB_ERRORS:
            cause = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            raise DatasetUnavailableError([(name, _load_call(entry.cfg if entry else None), cause)]) from err
        root = err
        while (root.__cause__ or root.__context__) is not None:
            root = root.__cause__ or root.__context__
        because = f" ({type(root).__name__}: {' '.join(str(root).split())})" if root is not err else ""
        if isinstance(root, OSError) and root.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            because += (  # a shared, read-only HF_HOME on a cluster
                "; datasets writes every task's data, a local file's too, under HF_DATASETS_CACHE (default "
                "$HF_HOME/datasets): set HF_DATASETS_CACHE to a folder you can write"
            )
        raise ConfigError(
            f"task {name!r} could not be built by lm-eval: {type(err).__name__}: {' '.join(str(err).split())}{because}"
        ) from err


@contextlib.contextmanager
def resolve_tasks(specs: str | Sequence[str]) -> Iterator[TaskSet]:
    """Resolve ``--tasks`` values into built lm-eval tasks (datasets loaded), in a temporary workspace.

    The bundled offline YAMLs and every user YAML are rendered into the workspace, which is lm-eval's
    ``include_path`` (then lm-eval's built-in tasks, when a name needs them). Fails before any model is
    loaded: unknown names list close matches; a name defined twice names both files; a task whose
    dataset is missing is named with the command that pre-downloads it.
    """
    lm_tasks = require("lm_eval.tasks", "eval")
    require("lm_eval.tasks._index", "eval")
    spec_list = _split_specs(specs)
    with tempfile.TemporaryDirectory(prefix="nsc-prune-tasks-") as tmp:
        workspace, source = Path(tmp).resolve(), evals_dir()
        bundled = workspace / "offline"
        bundled.mkdir()
        origin = {out.resolve(): source / "tasks" / out.name for out in render_offline_tasks(bundled, source)}
        names, user_roots = _expand(spec_list, workspace, origin)
        defined = _definitions([bundled, *user_roots], origin)
        if any(name.endswith(OFFLINE_SUFFIX) and name not in defined for name in names) and not any(bundled.iterdir()):
            raise ConfigError(
                f"the offline task sets were not found in {source}; set {EVALS_ENV} to a folder holding data/ "
                "and tasks/"
            )
        builtin = [Path(lm_tasks.__file__).parent] if _needs_builtin(names, defined) else []
        tm = lm_tasks.TaskManager(
            include_path=[str(p) for p in (bundled, *user_roots, *builtin)], include_defaults=False
        )
        _check_unshadowed(tm, defined, origin)
        for name in names:
            if name not in tm.all_tasks:
                raise _unknown_task_error(name, tm.all_tasks)
        tasks: dict[str, Any] = {}
        missing: list[DatasetUnavailableError] = []
        for name in names:
            try:
                built = _load_one(tm, name)
            except DatasetUnavailableError as err:
                if not _offline_mode():  # each miss may cost half a minute of retries: stop at the first
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
            path = Path(entry.yaml_path).resolve() if entry and entry.yaml_path else None
            sources[leaf] = str(origin.get(path, path)) if path is not None else "lm-eval"
        yield TaskSet(tasks=tasks, task_manager=tm, sources=sources)


def _offline_mode() -> bool:
    flags = (os.environ.get(k, "").upper() for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))
    return any(flag in ("1", "ON", "YES", "TRUE") for flag in flags)


def task_metric(name: str, task: Any) -> str:
    """The metric lm-eval task ``task`` contributes to the average (``headline_metric`` over its ``metric_list`` in
    the YAML's order; a task without one has its output type's defaults, a perplexity's for
    loglikelihood_rolling)."""
    return headline_metric(name, [m["metric"] for m in task.config.metric_list or []] or list(task.higher_is_better()))


def describe_tasks(tasks: TaskSet) -> dict[str, dict[str, Any]]:
    """What each task is: lm-eval version, source YAML, dataset, sha256 of local data files."""
    info = {}
    for name, task in tasks.tasks.items():
        cfg = task.config
        metric = task_metric(name, task)
        if task.higher_is_better().get(metric) is False:  # a perplexity was shown x100 as an accuracy, and averaged
            raise InvalidInputError(
                f"task {name} reports {metric}, where lower is better: nsc-prune eval averages accuracies (higher is "
                "better) into Avg and recovery; evaluate it with lm-eval itself, or give the task an accuracy metric"
            )
        info[name] = {
            "canonical": canonical_task(name),
            "metric": metric,
            "version": (cfg.metadata or {}).get("version"),
            "source": tasks.sources.get(name),
            "dataset": {"path": cfg.dataset_path, "name": cfg.dataset_name},
            "data_sha256": {p: sha256_file(p) for p in _local_files(cfg.dataset_path, cfg.dataset_kwargs)},
        }
    return info


def task_config_sha256(tasks: TaskSet, without_paths: bool = False) -> dict[str, str]:
    """sha256 of each built task's resolved config (its YAML with every include and template filled in; functions
    by name; the temporary workspace's path left out): a changed included template changes it, which the hashes of
    the task files named on the command line did not see. ``without_paths``: the local data's paths left out too
    (``data_files``, ``data_dir``, a local ``dataset_path``), for copies of one task at other paths (their content
    is compared by ``describe_tasks``' hashes)."""

    def named(value: Any) -> str:
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}"

    def is_local_data_path(key: str, value: Any) -> bool:
        local = key == "dataset_path" and isinstance(value, str) and os.path.exists(value)
        return without_paths and (key in ("data_files", "data_dir") or local)

    def without_source(value: Any) -> Any:  # lm-eval names the workspace's copy of the YAML, in metadata too
        if isinstance(value, Mapping):
            return {
                k: without_source(v) for k, v in value.items() if k != "config_source" and not is_local_data_path(k, v)
            }
        return value

    digests = {}
    for name, task in tasks.tasks.items():
        config = without_source(task.dump_config())
        digests[name] = hashlib.sha256(json.dumps(config, sort_keys=True, default=named).encode()).hexdigest()
    return digests


def _local_files(dataset_path: Any, dataset_kwargs: Any) -> list[str]:
    """The local files a task reads, whose hashes are the rerun key's: the ``data_files`` of a packaged builder
    (``json``, ``csv``, ...; globs expanded; under its ``data_dir``, or every file there when it names none), or
    every file of a ``dataset_path`` that is a local folder (but its hidden ones, which ``datasets`` skips too). A
    hub dataset's files are in its repository, none here; a folder named like a builder (``./json``) is not read."""
    kwargs = dataset_kwargs if isinstance(dataset_kwargs, Mapping) else {}
    packaged = isinstance(dataset_path, str) and dataset_path in _packaged_builders()
    folder = Path(dataset_path) if isinstance(dataset_path, str) and not packaged else None
    if folder is not None and not folder.is_dir():
        return []
    data_dir = kwargs.get("data_dir")
    base = (folder or Path()) / Path(data_dir).expanduser() if isinstance(data_dir, str) else folder  # as datasets
    found = []
    for pattern in _data_files(kwargs.get("data_files")):
        pattern = str(base / pattern) if base is not None and not Path(pattern).is_absolute() else pattern
        found += sorted(glob.glob(pattern, recursive=True)) if any(c in pattern for c in "*?[") else [pattern]
    walked = base if folder is not None or not kwargs.get("data_files") else None  # a local folder: all it reads
    if walked is not None and walked.is_dir():
        found += [
            str(p)
            for p in walked.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(walked).parts)
        ]
    return sorted({p for p in found if Path(p).is_file()})


def _packaged_builders() -> frozenset[str]:
    """The builder names ``datasets`` reads before it looks for a local folder of that name."""
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:  # its private table moved: the builders eval tasks use
        return frozenset({"json", "csv", "text", "parquet", "arrow", "pandas"})
    return frozenset(_PACKAGED_DATASETS_MODULES)


def _data_files(files: Any) -> list[str]:
    """The paths of a task's ``data_files`` as datasets takes them: a path, a list, or a split -> path (or list)."""
    if isinstance(files, str):
        return [files]
    if isinstance(files, dict):
        return [path for value in files.values() for path in _data_files(value)]
    return [path for path in files if isinstance(path, str)] if isinstance(files, list | tuple) else []
