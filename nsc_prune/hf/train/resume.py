"""What a recovery run stores beside its checkpoints (``OUT/checkpoints/nsc_prune_train.json``), and the checks a
``--resume`` must pass: the same recipe, data, teacher and time budget, and a timed run's stored sizing."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nsc_prune._io import read_json_object, remove_work_dir
from nsc_prune._warn import warn
from nsc_prune.errors import InvalidInputError
from nsc_prune.hf.ranks import launched_processes
from nsc_prune.hf.train.budget import SizedRun, TimeBudget
from nsc_prune.hf.train.data import EARLIER_READER, TextBlocks
from nsc_prune.hf.train.precision import precision_name
from nsc_prune.hf.train.recipe import TrainConfig, is_cached_teacher
from nsc_prune.hf.weights.fingerprint import older_fingerprint_note

CHECKPOINTS_DIR = "checkpoints"
RUN_RECORD = "nsc_prune_train.json"
TRAINER_STATE = "trainer_state.json"  # the Trainer writes it last: a checkpoint without it is an unfinished save
_CHECKPOINT = re.compile(r"checkpoint-\d+")
RESUMED_STATE = ("optimizer.pt", "scheduler.pt")  # what a resume continues besides the weights
WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "model.safetensors.index.json")  # LoRA, or full


@contextlib.contextmanager
def removed_unless_resumable(work: Path, names: tuple[str, ...], made: Sequence[Path] = ()) -> Iterator[None]:
    """Remove ``names`` from a fresh run's ``work`` folder (``remove_work_dir``, with the folders ``made`` above it)
    when the block fails before the first checkpoint: there is nothing to resume, so nothing is left behind."""
    fresh = not work.exists()
    try:
        yield
    except BaseException:
        if fresh and last_checkpoint(work / CHECKPOINTS_DIR) is None:
            remove_work_dir(work, names, made)
        raise


def _logits_digest(teacher: Any) -> str | None:
    """sha256 of the cached teacher logits' key (a ``TeacherLogits`` or its key), None for a live teacher."""
    key = teacher.key if is_cached_teacher(teacher) else teacher if isinstance(teacher, dict) else None
    return None if key is None else hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def run_record(
    config: TrainConfig,
    blocks: TextBlocks,
    teacher: Any,
    minutes: float | None = None,
    sized: SizedRun | None = None,
    inputs: dict[str, Any] | None = None,
    warmup: int | None = None,
) -> dict[str, Any]:
    """What a run stores beside its checkpoints (``RUN_RECORD``) and a resume must match: the recipe and the
    precision it trains in here (bf16 "auto" resolves per machine), the data, the teacher, the minutes and the
    warm-up a timed run asked for (``asked_warmup``: its recipe's is the sized one), the sizing and the command's
    ``inputs`` (fingerprints of the model folders, the space: what the run starts from beyond its recipe and data),
    and the processes it runs in (each takes its own batches: the global batch and the data's order follow them)."""
    return {
        "config": config.to_dict(),
        "processes": launched_processes(),
        "precision": precision_name(config),
        "data_sha256": blocks.sha256,
        "blocks_sha256": blocks.fingerprint(),
        "teacher": bool(teacher is not None and teacher is not False),
        "teacher_logits": _logits_digest(teacher),
        "minutes": minutes,
        **({"warmup_asked": warmup} if warmup is not None else {}),
        "budget": sized.to_dict() if sized is not None else None,
        "inputs": json.loads(json.dumps(inputs or {})),  # as read back: tuples are lists
    }


def asked_warmup(config: TrainConfig, budget: TimeBudget | None) -> int | None:
    """The warm-up a timed run asks for (the budget's, else its recipe's), before sizing caps it; None untimed."""
    if budget is None:
        return None
    return budget.warmup_steps if budget.warmup_steps is not None else config.warmup_steps


def stored_sizing(
    folder: Path, config: TrainConfig, budget: TimeBudget | None, resume: bool
) -> tuple[TrainConfig, SizedRun | None]:
    """A resumed timed run's recipe: the stored sized steps (never measured again, so it reaches the weights of
    the uninterrupted run) and the warm-up they give. Returns (config, the stored SizedRun or None)."""
    if budget is None or not resume or not (folder / RUN_RECORD).is_file():
        return config, None
    stored = read_json_object(folder / RUN_RECORD, unique_keys=True).get("budget")
    if not stored:
        return config, None  # a run without --minutes: the minutes compare as changed
    try:
        sized = SizedRun.from_dict(stored)
    except ValueError as err:
        raise InvalidInputError(f"--resume: {folder / RUN_RECORD} is damaged ({err}); remove the folder") from err
    return dataclasses.replace(config, max_steps=sized.probe_max_steps, warmup_steps=sized.warmup_steps), sized


def check_resume(
    out_dir: str | os.PathLike,
    config: TrainConfig,
    blocks: TextBlocks,
    teacher: bool | dict[str, Any],
    resume: bool,
    budget: TimeBudget | None = None,
    inputs: dict[str, Any] | None = None,
) -> str | None:
    """Before loading any model: the checkpoint ``train`` would resume from (None for none), or the one-line
    refusal of a resume with other settings / of a fresh run over existing checkpoints. ``teacher``: whether a
    teacher is used, or the key of the cached teacher logits (``teacher_logits.logits_key``); ``inputs``: as
    ``run_record``."""
    folder = Path(out_dir) / CHECKPOINTS_DIR
    warmup = asked_warmup(config, budget)
    config, _ = stored_sizing(folder, config, budget, resume)
    minutes = budget.minutes if budget is not None else None
    record = run_record(config, blocks, teacher, minutes, inputs=inputs, warmup=warmup)
    return checkpoint_to_resume(folder, record, resume)


def saved_checkpoints(folder: Path) -> list[Path]:
    """The ``checkpoint-STEP`` folders in ``folder``, newest (highest step) first, finished or not."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and _CHECKPOINT.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]), reverse=True)


def last_checkpoint(folder: Path) -> Path | None:
    """The newest checkpoint in ``folder`` a resume can load (``unreadable`` finds nothing wrong), None if none."""
    return next((p for p in saved_checkpoints(folder) if unreadable(p) is None), None)


def checkpoint_to_resume(folder: Path, record: dict[str, Any], resume: bool) -> str | None:
    """What to pass as ``resume_from_checkpoint`` (None: start at the first step); refuses a resume with other settings, and a fresh run over
    existing checkpoints. A checkpoint that cannot be read back (a run stopped while it wrote it, a full disk) is
    passed over, with a warning, for the one before it; a resume with none to continue from starts at the first step,
    with a warning (a job script may pass ``--resume`` whether or not an earlier run was stopped)."""
    saved = saved_checkpoints(folder)
    if not resume:
        if saved:
            raise InvalidInputError(
                f"{folder} already holds checkpoints of a run; pass --resume to continue it, or remove the folder"
            )
        return None
    if saved and not (folder / RUN_RECORD).is_file():
        raise InvalidInputError(
            f"--resume: {folder} holds checkpoints but no {RUN_RECORD}, so nothing shows they are of this run's "
            "settings and data; remove the folder or pass another work folder"
        )
    if (folder / RUN_RECORD).is_file():
        _check_same_run(folder, record)
    passed_over = []
    for checkpoint in saved:
        problem = unreadable(checkpoint)
        if problem is None:
            if passed_over:
                warn(f"--resume: {'; '.join(passed_over)}; continuing from {checkpoint} instead")
            return str(checkpoint)
        passed_over.append(problem)
    warn(
        f"--resume: {folder} holds no checkpoint to continue from"
        + (f" ({'; '.join(passed_over)})" if passed_over else "")
        + "; starting at the first step"
    )
    return None


def _check_same_run(folder: Path, record: dict[str, Any]) -> None:
    """InvalidInputError unless the run stored in ``folder`` had ``record``'s recipe, data, teacher and inputs."""
    saved = read_json_object(folder / RUN_RECORD, unique_keys=True)
    if not isinstance(saved.get("config"), dict):
        raise InvalidInputError(
            f"--resume: {folder / RUN_RECORD} is damaged (its 'config' is not an object); remove the folder"
        )
    if "inputs" in saved and not isinstance(saved["inputs"], dict):  # older records have none; this one was spoilt
        raise InvalidInputError(
            f"--resume: {folder / RUN_RECORD} is damaged (its 'inputs' is not an object); remove the folder"
        )
    _check_same_precision(folder, saved, record)
    if saved.get("processes", record["processes"]) != record["processes"]:  # older records stored none
        count = saved["processes"]
        raise InvalidInputError(
            f"--resume continues the run in {folder}, which trained in {count} process{'es' if count != 1 else ''}, "
            f"and this run has {record['processes']}: each takes its own batches, so the global batch and the blocks "
            f"already trained on would change; launch it in {count} (torchrun --nproc_per_node {count}, or none for "
            "1) to continue it"
        )
    compared = [k for k in record["config"] if k != "bf16" or "precision" not in saved]  # older records: the flag
    changed = sorted(k for k in compared if saved["config"].get(k) != record["config"][k])
    keys = ("data_sha256", "blocks_sha256", "teacher", "teacher_logits", "minutes")
    changed += [k for k in keys if saved.get(k) != record[k]]
    if "data_sha256" in changed and "blocks_sha256" not in changed:  # the blocks trained on are the same: an hf:
        changed.remove("data_sha256")  # dataset's digest follows its files' times and the split as typed
    if "warmup_asked" in record and "warmup_steps" not in changed:  # a timed recipe's warm-up is the sized one
        if saved.get("warmup_asked", record["warmup_asked"]) != record["warmup_asked"]:  # older runs stored none
            changed.append("warmup_steps")
    if "inputs" in saved:  # older records have none: their inputs cannot be compared
        given = record["inputs"]
        changed += [k for k in sorted({*given, *saved["inputs"]}) if saved["inputs"].get(k) != given.get(k)]
    if changed:
        inputs = saved.get("inputs") if isinstance(saved.get("inputs"), dict) else {}
        older = older_fingerprint_note(*(inputs.get(k) for k in changed if k in ("checkpoint", "teacher", "base")))
        what = "--data content" if set(changed) <= {"data_sha256", "blocks_sha256"} else "settings"
        if changed == ["blocks_sha256"]:  # nothing else stored explains it
            older += (
                " (the same files in other blocks: another --max-tokens, --val-fraction or --text-field, another "
                f"tokenizer, or a run of {EARLIER_READER})"
            )
        elif what != "settings":
            older += f" (other --data files, or the same ones read by {EARLIER_READER})"
        raise InvalidInputError(
            f"--resume continues the run in {folder}, which used other {what} ({', '.join(changed)} differ){older}; "
            "pass the same settings and data, or drop --resume and use a new output folder"
        )


def _check_same_precision(folder: Path, saved: dict[str, Any], record: dict[str, Any]) -> None:
    """InvalidInputError unless the stored run trained in ``record``'s precision: ``--bf16 auto`` and ``true`` are
    one setting where both resolve to bf16, and not one where "auto" resolves to float32 on this machine."""
    if saved.get("precision", record["precision"]) != record["precision"]:
        switch = "true" if saved["precision"] == "bf16 autocast" else "false"
        raise InvalidInputError(
            f"--resume continues the run in {folder}, which trained in {saved['precision']}, with "
            f"{record['precision']} here; pass --bf16 {switch} to continue it as it ran"
        )


def unreadable(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from, or None: its save did not finish (no ``trainer_state.json``, which
    the Trainer writes last), it lacks the optimizer, the schedule or the weights (``RESUMED_STATE``,
    ``WEIGHT_FILES``), or a file cannot be read back: its state JSON, safetensors headers and torch archives'
    directories (not their contents: an optimizer state is as large as the model)."""
    from safetensors import safe_open

    if not (checkpoint / TRAINER_STATE).is_file():
        return f"{checkpoint} is incomplete (no {TRAINER_STATE}: the run stopped while it wrote it)"
    lacking = [name for name in RESUMED_STATE if not (checkpoint / name).is_file()]
    lacking += [] if any((checkpoint / name).is_file() for name in WEIGHT_FILES) else ["its weights"]
    if lacking:  # the Trainer would restart the optimizer or schedule silently, or fail to find the weights
        return f"{checkpoint} lacks {' and '.join(lacking)}"
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        try:
            if path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
            elif path.suffix == ".safetensors":
                with safe_open(path, framework="pt"):
                    pass
            elif path.suffix in (".pt", ".pth", ".bin"):  # torch's zip archives: a cut file has no central directory
                zipfile.ZipFile(path).close()
        except Exception as err:  # json's, safetensors' and zipfile's errors alike
            return f"{path} cannot be read ({type(err).__name__})"
    return None
