"""The checkpoints an eval run has finished, kept beside its output until the run completes (``.OUT.eval``), so the
same command run again after a failure or a Ctrl-C evaluates only the checkpoints that had not finished.

A finished checkpoint is stored as ``<key>.json``, its key the sha256 of what decides its numbers: its weights and
tokenizer (``nsc_prune.hf.weights.fingerprint``), its label, the run's settings that change a number (not
``base``, the device as typed, nor ``max_batch_size`` beside a fixed batch size), the tasks with their data hashes,
the library versions, the resolved device and dtype. A record whose key differs is not read; the folder goes when the results
are written. Only a run in one process keeps records (the ranks of a launched run would have to agree on them).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nsc_prune._files import ADAPTER_DIR
from nsc_prune._io import (
    atomic_write_text,
    missing_parents,
    read_json_object,
    remove_empty,
    remove_work_dir,
    sha256_file,
    to_json,
)
from nsc_prune._warn import warn
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.hf.weights.fingerprint import tokenizer_fingerprint, weights_fingerprint

KEPT_NAME = re.compile(r"[0-9a-f]{64}\.json|\.[0-9a-f]{64}\.json\.\w+\.tmp")  # a record, or one a kill left half
RECORD_KEYS = ("label", "path", "params", "load_s", "wall_s", "results")  # what the results read of a record


def finished_path(out: str | Path) -> Path:
    """``.OUT.eval`` beside ``out``, unchecked (``finished_dir`` checks it)."""
    out = Path(out).absolute()  # "." has no name to put a sibling beside
    return out.parent / f".{out.name}.eval"


def finished_dir(out: str | Path) -> Path:
    """``finished_path(out)``; InvalidInputError (one line) when that is a file or holds files an eval did not
    write, since the folder is removed when the results are written."""
    folder = finished_path(out)
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in _own(folder)) if folder.is_dir() else []
    if folder.exists() and not folder.is_dir() or foreign:
        raise InvalidInputError(
            f"{folder}, where eval keeps the checkpoints it has finished until the results are written, "
            f"{'holds files eval did not write (' + ', '.join(foreign[:3]) + ')' if foreign else 'is a file'}; "
            f"move {'them' if foreign else 'it'}, or pass another --out"
        )
    return folder


def _own(folder: Path) -> list[str]:
    """The records in ``folder`` (regular files named as eval names them: a folder of that name is not eval's)."""
    if not folder.is_dir():
        return []
    return sorted(
        p.name for p in folder.iterdir() if KEPT_NAME.fullmatch(p.name) and p.is_file() and not p.is_symlink()
    )


def checkpoint_key(path: Path, label: str, run: Mapping[str, Any]) -> str:
    """The sha256 of what decides a checkpoint's results (module docstring); a kept LoRA adapter (``adapter/``, which
    eval loads with the weights) is hashed whole."""
    described = {"weights": weights_fingerprint(path), "tokenizer": tokenizer_fingerprint(path), "label": label}
    adapter = path / ADAPTER_DIR
    if adapter.is_dir():
        described["adapter"] = {p.name: sha256_file(p) for p in sorted(adapter.iterdir()) if p.is_file()}
    return hashlib.sha256(json.dumps({**described, "run": run}, sort_keys=True, default=str).encode()).hexdigest()


def task_files_sha256(sources: list[str]) -> dict[str, str]:
    """sha256 of each task YAML file among ``sources`` and of the Python files beside it (``!function`` helpers):
    their text decides a user task's prompts, which its path and data hashes do not."""
    files = set()
    for source in sources:
        path = Path(source)
        if path.is_file():
            files |= {path, *path.parent.glob("*.py")}
    return {str(p): sha256_file(p) for p in sorted(files)}


def load_finished(folder: Path, key: str, label: str, tasks: Sequence[str]) -> dict[str, Any] | None:
    """The record stored under ``key`` (of the checkpoint ``label`` on ``tasks``), or None; one that is unreadable or
    not such a record is warned about and evaluated again."""
    path = folder / f"{key}.json"
    if not path.is_file():
        return None
    try:
        stored = read_json_object(path, unique_keys=True)
        if stored.get("key") != key or not _whole(stored.get("record"), label, tasks):
            raise ConfigError(f"{path} is not a finished checkpoint's record")
    except ConfigError as err:
        warn(f"{err}; evaluating that checkpoint again")
        return None
    return stored["record"]


def _whole(record: Any, label: str, tasks: Sequence[str]) -> bool:
    """Whether ``record`` is what ``_evaluate_one`` returns for ``label`` on ``tasks`` (the results read each field)."""
    if not (isinstance(record, dict) and set(RECORD_KEYS) <= set(record) and record["label"] == label):
        return False
    results, params = record["results"], record["params"]
    return (
        isinstance(params, int)
        and isinstance(results, dict)
        and set(results) == set(tasks)
        and all(isinstance(r, dict) and r.get("metric") in r for r in results.values())
    )


def save_finished(folder: Path, key: str, record: Mapping[str, Any]) -> None:
    """Store a finished checkpoint's record under ``key`` (atomically)."""
    made = [*missing_parents(folder), folder] if not folder.exists() else []
    folder.mkdir(parents=True, exist_ok=True)  # --out's parents are made when the results are written
    try:
        atomic_write_text(folder / f"{key}.json", to_json({"key": key, "record": dict(record)}))
    except BaseException:
        remove_empty(made)  # a full disk left the empty folders behind
        raise


def remove_finished(folder: Path) -> None:
    """Remove the stored records, then the folder when nothing else is in it (files eval did not write stay)."""
    if folder.is_dir():
        remove_work_dir(folder, _own(folder))
