"""The evaluation report: per-task records from lm-eval results, Avg and recovery, ``results.json`` and
``results.md`` (a table shaped like the paper's Table 4). Pure functions, no model."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from nsc_prune._files import RECORD_NAME, user_path
from nsc_prune._io import (
    WRITTEN_FILES_KEY,
    atomic_dir,
    atomic_write_text,
    check_output,
    checkpoint_record,
    to_json,
    written_files,
)
from nsc_prune._validation import must_be
from nsc_prune._warn import warn
from nsc_prune.core.budget import format_count
from nsc_prune.errors import InvalidInputError, NSCError
from nsc_prune.eval.tasks import SHORT_NAMES, average, canonical_task, headline_metric
from nsc_prune.presets import folder_model_name

SCHEMA = "nsc-prune/eval-results/1"
RESULTS_JSON = "results.json"
RESULTS_OWNER = "results written by nsc-prune eval"  # what --overwrite may replace
RESULTS_MD = "results.md"
METRICS = ("acc", "acc_norm")


def task_record(raw: Mapping[str, Any], task: str, metric: str | None = None) -> dict[str, Any]:
    """One task's entry from an lm-eval results dict (``evaluate``, ``simple_evaluate``): acc/acc_norm (+stderr), n,
    version; ``metric`` the one it is averaged by (``tasks.task_metric``; None: ``headline_metric`` of those it
    reports, which cannot know the YAML's order of a task without acc)."""
    metrics = raw["results"][task]
    filters = [key.partition(",")[2] for key in metrics if "," in key]
    shown = "none" if "none" in filters or not filters else filters[0]  # gsm8k's: strict-match, flexible-extract
    record: dict[str, Any] = {metric: None for metric in (*METRICS, *(f"{m}_stderr" for m in METRICS))}
    for key, value in metrics.items():
        name, _, filt = key.partition(",")
        if filt != shown or name in ("alias", "name", "sample_len"):
            continue
        record[name] = None if value in ("N/A", None) else float(value)
    reported = [m for m, value in record.items() if not m.endswith("_stderr") and value is not None]
    n = raw.get("n-samples", {}).get(task, {})
    record.update(
        metric=metric or headline_metric(task, reported),
        n=n.get("effective"),
        n_total=n.get("original"),
        version=raw.get("versions", {}).get(task),
    )
    return record


def summarise(
    checkpoints: list[dict[str, Any]], base: int | None, unrelated: Collection[int] = ()
) -> list[dict[str, Any]]:
    """Add ``avg`` and ``recovery`` (= avg / base avg; None without a base, and for the ``unrelated`` indexes:
    checkpoints cut from another model) to each checkpoint record."""
    out = [{**c, "avg": average(c["results"])} for c in checkpoints]
    base_avg = out[base]["avg"] if base is not None else None
    for i, record in enumerate(out):
        ok = base_avg not in (None, 0) and record["avg"] is not None and i not in unrelated
        record["recovery"] = record["avg"] / base_avg if ok else None
    return out


def other_bases(paths: Sequence[Path], base: int | None) -> set[int]:
    """Indexes of the checkpoints whose records lead to bases other than ``paths[base]`` (``ancestors``): cut from
    another model, so no recovery against this one."""
    if base is None:
        return set()
    target = paths[base].resolve()
    return {
        i
        for i, path in enumerate(paths)
        if i != base and (found := ancestors(path)) and target not in found and path.resolve() != target
    }


def find_base(paths: Sequence[Path], labels: Sequence[str], explicit: str | None = None) -> int | None:
    """Index of the base model: ``explicit`` (a label or path), else the checkpoint that every pruned one in the
    list was cut from, however many steps back (``ancestors``: a checkpoint pruned again from a healed one reaches
    the base through the healed one's record); the earliest such when the list holds several; None when none
    applies (a warning when the checkpoints lead to different models of the list)."""
    resolved = [p.resolve() for p in paths]
    if explicit is not None:
        if explicit in labels:
            return list(labels).index(explicit)
        if user_path(explicit).resolve() in resolved:  # --base=~/m, which no shell expands
            return resolved.index(user_path(explicit).resolve())
        raise InvalidInputError(must_be("base", f"one of the checkpoints {list(labels)}", explicit))
    earliest = set()
    for path in paths:
        listed = [resolved.index(folder) for folder in ancestors(path) if folder in resolved]
        if listed:
            earliest.add(listed[-1])
    if len(earliest) > 1:
        models = ", ".join(labels[i] for i in sorted(earliest))
        warn(
            f"the checkpoints were cut from different models of the list ({models}): no recovery column; pass --base "
            "to choose one",
        )
    return earliest.pop() if len(earliest) == 1 else None


def ancestors(path: Path) -> list[Path]:
    """The folders a checkpoint was made from, nearest first: the base its record names, then the base that one's
    record names (a pruned or healed base), and so on (resolved; the chain ends at a folder with no record)."""
    chain: list[Path] = []
    name = _named_base(checkpoint_record(path))
    while name is not None:
        folder = Path(name).resolve()
        if folder in chain or folder == path.resolve():  # a record edited into a loop
            break
        chain.append(folder)
        try:
            name = _named_base(checkpoint_record(folder)) if folder.is_dir() else None
        except NSCError:  # a record that does not read (not a listed checkpoint's, which were checked): the end
            break
    return chain


def _named_base(record: Mapping[str, Any]) -> str | None:
    """The base folder a record's provenance names (a record nsc-prune did not write may hold anything there)."""
    provenance = record.get("provenance")
    base = provenance.get("base") if isinstance(provenance, Mapping) else None
    return base if isinstance(base, str) and base else None


def _folder_name(path: Path) -> str:
    """``path``'s folder name as given (a symlink keeps its own), or as resolved where it has none (``.``, ``..``)."""
    return path.name if path.name not in ("", ".", "..") else path.resolve().name


def _model_name(path: Path, records: Sequence[Mapping[str, Any]]) -> str:
    """A checkpoint's name in the table. A checkpoint nsc-prune wrote keeps its folder name (chosen with extract
    --out; it tells budgets apart). Any other (a base) gets its model's name: config.json's ``_name_or_path``
    or the GGUF it was prepared from (``folder_model_name``), else the model name of an extract record that
    names it as its base, else its folder name (which may be a cache key)."""
    folder = _folder_name(path)
    if (path / RECORD_NAME).is_file():
        return folder
    own = folder_model_name(path)
    if own:
        return own
    for record in records:
        base = _named_base(record)
        if base and Path(base).resolve() == path.resolve() and record.get("model_name"):
            return str(record["model_name"])
    return folder


def checkpoint_labels(paths: Sequence[Path]) -> list[str]:
    """Model names (``_model_name``), made unique where they clash with their folder's name (two fine-tunes whose
    config.json names one model), then their parent folder, then an index."""
    records = [checkpoint_record(p) for p in paths]
    names = [_model_name(p, records) for p in paths]
    folders = [_folder_name(p) for p in paths]
    names = [f"{n} ({f})" if names.count(n) > 1 and n != f else n for n, f in zip(names, folders)]
    labels = [f"{Path(os.path.abspath(p)).parent.name}/{n}" if names.count(n) > 1 else n for p, n in zip(paths, names)]
    return [f"{lab}#{i}" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels)]


def _pct(value: float | None, stderr: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.2f}" + (f" ± {100 * stderr:.2f}" if stderr is not None else "")


def render_markdown(doc: Mapping[str, Any]) -> str:
    """results.md: a table shaped like the paper's Table 4, then acc/acc_norm ± stderr per task."""
    tasks, label = doc["tasks"], doc["avg_label"]
    short = [SHORT_NAMES.get(canonical_task(t) or "", t) for t in tasks]
    heads = [name if short.count(name) == 1 else t for name, t in zip(short, tasks)]  # two stand-ins of one task
    lines = [
        "| Model | Params | " + " | ".join(map(_cell, heads)) + f" | {label} | Recovery |",
        "|---|---:|" + "---:|" * (len(tasks) + 2),
    ]
    base = doc.get("base")
    for c in doc["checkpoints"]:
        name = _cell(c["label"]) + (" (base)" if c["label"] == base else "")
        cells = [_pct(c["results"][t].get(c["results"][t]["metric"])) for t in tasks]
        rec = f"{100 * c['recovery']:.2f}%" if c["recovery"] is not None else "-"
        lines.append(
            f"| {name} | {format_count(c['params'])} | " + " | ".join(cells) + f" | {_pct(c['avg'])} | {rec} |"
        )
    metrics = ", ".join(f"{t}: {doc['task_info'][t]['metric']}" for t in tasks)
    run = doc["config"]
    shots = run.get("num_fewshot") or 0  # a task whose YAML sets 0 stays zero-shot (runner._seed_and_shots)
    stderr = " (no stderr: --bootstrap-iters 0)" if run.get("bootstrap_iters") == 0 else " ± stderr"
    shown = f"{shots}-shot accuracy in % (zero-shot where a task's YAML sets 0)" if shots else "Zero-shot accuracy in %"
    lines += [
        "",
        f"{shown}. {label} = unweighted mean of the per-task metric ({metrics}); recovery = Avg / Avg of the base.",
        (
            f"lm-eval {doc['provenance']['lm_eval_version']}, limit {run['limit']}, {shots}-shot, device "
            f"{doc['device']}, dtype {doc['dtype']}, batch size {run['batch_size']}, seed {run['seed']}."
        ),
        "",
        f"Per task: acc and acc_norm in %{stderr}; n = documents evaluated; seconds = wall time of the task.",
        "",
        "| Model | Task | acc | acc_norm | n | seconds |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for c in doc["checkpoints"]:
        for t in tasks:
            r = c["results"][t]
            cells = [_pct(r.get(m), r.get(f"{m}_stderr")) for m in METRICS]
            lines.append(
                f"| {_cell(c['label'])} | {_cell(t)} | {cells[0]} | {cells[1]} | {r['n']} | {r['wall_s']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """``text`` in a markdown table cell: a ``|`` (a folder named ``a|b``) split the row into one cell more."""
    return text.replace("|", "\\|")


def write_results(
    doc: Mapping[str, Any], out: str | os.PathLike, overwrite: bool = False, checked: bool = False
) -> Path:
    """Write results.json and results.md into ``out`` atomically (both appear, or neither); results.json lists the
    files (``files``), so that a later ``--overwrite`` replaces a folder holding nothing else. ``checked``: ``out``
    was checked before the evaluation (``atomic_dir``)."""
    replaceable = lambda found: check_output(found, (), True, marker=RESULTS_JSON, owner=RESULTS_OWNER)  # noqa: E731
    with atomic_dir(out, overwrite, replaceable, checked=checked) as tmp:
        atomic_write_text(tmp / RESULTS_MD, render_markdown(doc))
        atomic_write_text(tmp / RESULTS_JSON, to_json({**doc, WRITTEN_FILES_KEY: written_files(tmp, RESULTS_JSON)}))
    return Path(out)
