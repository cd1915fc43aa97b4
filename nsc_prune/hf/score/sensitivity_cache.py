"""Sensitivity tables on disk: the key a table depends on, the cache path, and reading and writing a table file
(``$NSC_PRUNE_CACHE/sensitivity``, or ``--sensitivity-table``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsc_prune import _files
from nsc_prune._io import parse_json, publish_text, to_json
from nsc_prune._validation import is_number
from nsc_prune._warn import warn
from nsc_prune.errors import ConfigError
from nsc_prune.hf.cut.selection import calibration_bos, calibration_seq_len, calibration_sha256
from nsc_prune.hf.weights.fingerprint import older_fingerprint_note, tokenizer_fingerprint, weights_fingerprint
from nsc_prune.plan import LayerPlan

if TYPE_CHECKING:
    from nsc_prune.hf.score.sensitivity import SensitivityConfig
    from nsc_prune.hf.weights.base import BaseModel

TABLE_FORMAT = 1
MEASURE = (
    "LM loss increase (nats/token) of cutting one layer alone: measured at the narrowest FFN option (and for dropping "
    "the layer), the other options by the block output's relative error ||Y'-Y||^2/||Y||^2 scaled to it"
)
MEASURE_KL = (
    "KL divergence (nats/token) of the cut model's next-token distribution from the dense model's, cutting one layer "
    "alone: measured at the narrowest FFN option (and for dropping the layer), the other options by the block "
    "output's relative error ||Y'-Y||^2/||Y||^2 scaled to it"
)


def table_key(base: BaseModel, cuts: list[list[LayerPlan]], config: SensitivityConfig) -> dict[str, Any]:
    """What a table depends on: the measure, the weights, the calibration text and settings, the selection and
    the option grid. Equal keys mean an equal table."""
    grid = json.dumps([[[c.ffn, c.kv_groups, c.keep] for c in row] for row in cuts], separators=(",", ":"))
    tokenizer = Path(config.tokenizer) if config.tokenizer else base.folder
    seq_len = calibration_seq_len(base, config.seq_len)
    return {
        "format": TABLE_FORMAT,
        "measure": MEASURE if config.target == "loss" else MEASURE_KL,
        "probe_tokens": config.probe_tokens,
        # uncapped tables keep their old key; a depth of every later layer caps nothing
        **({"probe_depth": config.probe_depth} if 0 < config.probe_depth < len(cuts) - 1 else {}),
        **({"probe_widths": config.probe_widths} if config.probe_widths != 1 else {}),
        **({"probe_stride": config.probe_stride} if config.probe_stride != 1 else {}),
        "weights": weights_fingerprint(base.folder, base.tensors),
        "calib_sha256": calibration_sha256(config.calib),  # the text as read: a BOM or CRLF copy is the same
        "calib_tokens": config.calib_tokens,
        "seq_len": seq_len,  # what is measured: capped at the context
        "tokenizer": tokenizer_fingerprint(tokenizer),
        # tables measured before chunks started with BOS were of BOS-less text: not reused
        **({"bos_each_window": True} if calibration_bos(tokenizer, seq_len) is not None else {}),
        "selection": config.selection,
        "grid_sha256": hashlib.sha256(grid.encode()).hexdigest(),
        # float32 tables keep the key they had before --calib-dtype existed; the device does not change a table
        **({"dtype": config.compute.dtype} if config.compute.dtype != "float32" else {}),
        # tables measured before these were fixed are not reused: rows cutting KV groups alone were probed uncut
        # (all 0), and a plan's damage and the clean loss were taken on whole chunks, not the probe tokens
        **({"kv_alone_probed": True} if any(_cuts_kv_alone(row) for row in cuts) else {}),
        **({"probed_prefix": True} if min(config.probe_tokens, config.calib_tokens) % seq_len else {}),
    }


def _cuts_kv_alone(row: list[LayerPlan]) -> bool:
    """Whether a layer's kept options share one FFN width and differ in KV groups (``probes.anchor_cuts``)."""
    kept = [cut for cut in row if cut.keep]
    return len({cut.ffn for cut in kept}) == 1 and len({cut.kv_groups for cut in kept}) > 1


def default_table_path(key: dict[str, Any]) -> Path:
    """Where the cache keeps the table of ``key``: ``$NSC_PRUNE_CACHE/sensitivity/<key digest>.json``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return _files.cache_dir("sensitivity") / f"{digest[:32]}.json"


# The record fields the search reports (the calibration text, its tokens, the channel selection).
_RECORD_FIELDS = {"calib": str, "calib_tokens": int, "selection": str}
MAX_DAMAGE = 1e6  # nats per token: far past any measured damage, and summed over layers well inside a float


def _read_table(path: Path) -> dict[str, Any]:
    """A table file's JSON; ValueError when it is not a format-``TABLE_FORMAT`` table with a key and a record."""
    data = parse_json(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        raise ValueError(f"not a format-{TABLE_FORMAT} sensitivity table")
    if not isinstance(data.get("key"), dict) or not isinstance(data.get("record"), dict):
        raise ValueError("it has no key or record")
    record = data["record"]
    wrong = [name for name, kind in _RECORD_FIELDS.items() if not isinstance(record.get(name), kind)]
    if "conditioned_on" in data["key"] and not is_number(record.get("plan_damage")):
        wrong.append("plan_damage")  # a conditioned table's: what refinement compares
    if "seconds" in record and not (is_number(record["seconds"]) and record["seconds"] >= 0):
        wrong.append("seconds")  # pareto.json's score reports it
    if "built" in record and not isinstance(record["built"], dict):
        wrong.append("built")
    if wrong:
        raise ValueError(f"its record lacks {', '.join(wrong)} (or holds another type)")
    return data


def _table_errors(data: dict[str, Any], cuts: list[list[LayerPlan]]) -> list[list[float]]:
    """The errors of a table read for ``cuts``; ValueError when they are not one finite, non-negative number for
    each option of the space."""
    layers = data.get("layers")
    shape = [len(row) if isinstance(row, list) else None for row in layers] if isinstance(layers, list) else None
    if shape != [len(row) for row in cuts]:
        raise ValueError("its layers do not have one entry per option of the space")
    errors = []
    for row, cut_row in zip(layers, cuts, strict=True):
        values = []
        for entry, cut in zip(row, cut_row, strict=True):
            if not isinstance(entry, dict):
                raise ValueError(f"an option's entry must be an object; got {entry!r}")
            error = entry.get("error")
            if [entry.get("ffn"), entry.get("kv_groups"), entry.get("keep")] != [cut.ffn, cut.kv_groups, cut.keep]:
                raise ValueError(f"its options are not the space's ({entry} against {cut})")
            if isinstance(error, bool) or not isinstance(error, int | float) or not 0 <= error <= MAX_DAMAGE:
                raise ValueError(f"error {error!r} is not a number in [0, {MAX_DAMAGE:g}]")
            values.append(float(error))
        whole = max(cut_row, key=lambda cut: (cut.keep, cut.ffn, cut.kv_groups or 0))
        if values[cut_row.index(whole)] != 0:  # the full model is the costliest point of every front
            raise ValueError(f"the whole layer's error must be 0 (nothing cut); got {values[cut_row.index(whole)]!r}")
        errors.append(values)
    return errors


def write_table(
    path: Path,
    key: dict[str, Any],
    cuts: list[list[LayerPlan]],
    errors: list[list[float]],
    record: dict[str, Any],
    overwrite: bool = True,
) -> None:
    """Write a table file atomically: its format, key, record and every option's damage (without ``overwrite``, a
    file made at ``path`` while the table was measured is kept, and the table beside it: ``publish_text``)."""
    layers = [
        [{"ffn": c.ffn, "kv_groups": c.kv_groups, "keep": c.keep, "error": e} for c, e in zip(row, err, strict=True)]
        for row, err in zip(cuts, errors, strict=True)
    ]
    document = {"format": TABLE_FORMAT, "key": key, "record": record, "layers": layers}
    publish_text(path, to_json(document), overwrite, checked=True)  # after the measurement


def cached_table(
    path: Path, key: dict[str, Any], cuts: list[list[LayerPlan]], explicit: bool
) -> tuple[list[list[float]], dict[str, Any]] | None:
    """The errors and record of the table stored at ``path`` when it was measured for ``key`` (the record names the
    file and says it came from the cache); None (with a warning) when it is an unreadable
    cache entry or one for other inputs; ConfigError when it is an explicit ``--sensitivity-table`` that is not a
    table (a file of yours: never overwritten) or was measured for other inputs."""
    try:
        data = _read_table(path)
        found = data["key"]
        errors = _table_errors(data, cuts) if found == key else None
    except (ValueError, OSError, UnicodeDecodeError, AttributeError) as err:
        if explicit:
            raise ConfigError(
                f"--sensitivity-table {path} exists and is not a sensitivity table ({err}); it is not overwritten: "
                "pass another path (or none, to use the cache)"
            ) from err
        warn(f"sensitivity table {path} is unreadable ({err}); measuring it again")
        return None
    if errors is not None:
        return errors, data["record"] | {"table": str(path), "cache_hit": True}
    changed = sorted(name for name in key.keys() | found.keys() if found.get(name) != key.get(name))
    older = older_fingerprint_note(found.get("weights")) if "weights" in changed else ""
    if explicit:
        raise ConfigError(
            f"--sensitivity-table {path} was measured for other inputs (different {', '.join(changed)}){older}; pass another "
            "--sensitivity-table path (or none, to use the cache) or delete that file to measure again"
        )
    warn(
        f"sensitivity cache {path} is for other inputs ({', '.join(changed)}){older}; measuring again",
    )
    return None
