"""Ranking benchmark files: architectures paired with trained performance (paper section 4.1).

Formats are auto-detected from the JSON structure:

* ``flexibert-glue``: a list of ``{"id", "scores": {"glue", ...}, "hparams": {
  "model_hparam_overrides": {"hidden_size", "nas_config": {"encoder_layers": [...]}}}}``
  (training-free-nas ``BERT_benchmark.json``; GLUE, higher is better);
* ``lts-gpt2``: an object ``name -> {"config": {"d_model", "n_layer", "n_head", "d_inner", ...},
  "valid_ppl", "test_ppl", "params"}`` (archai LiteTransformerSearch logs; perplexity, lower is
  better, negated for ranking);
* ``autoformer-ood``: an object ``id -> {"net_setting": {"layer_num", "embed_dim", "num_heads",
  "mlp_ratio"}, "performance": {"Imagenet": {"clean"}}, "params", "flops"}`` (OoD-ViT-NAS; top-1);
* ``nsc-ranking``: our own, for any registered family: ``{"format": "nsc-ranking", "family",
  "target", "higher_is_better", "architectures": [{"id", "config", "target"}, ...]}``.

Files we may not redistribute (AutoFormer-Tiny) are looked up in ``benchmarks_dir()``: a folder
passed explicitly, else ``$NSC_PRUNE_BENCHMARKS``, else ``../shared/benchmarks`` beside the
source checkout.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nsc_prune._files import PACKAGE_DIR
from nsc_prune._io import existing_file, parse_json, sha256_file
from nsc_prune._validation import is_int, must_be
from nsc_prune.errors import InvalidInputError
from nsc_prune.ranking import families
from nsc_prune.ranking.families.autoformer import AutoFormerOptions
from nsc_prune.ranking.families.base import ArchBatch

GENERIC_FORMAT = "nsc-ranking"
BENCHMARKS_ENV = "NSC_PRUNE_BENCHMARKS"
DEFAULT_BENCHMARKS_DIR = PACKAGE_DIR.parents[1] / "shared" / "benchmarks"  # beside a source checkout
AUTOFORMER_TINY_FILE = "autoformer_tiny_1001.json"  # no licence: read from benchmarks_dir(), never vendored


def benchmarks_dir(directory: str | Path | None = None) -> Path:
    """The folder of the benchmark files that are not vendored: ``directory`` when given, else
    ``$NSC_PRUNE_BENCHMARKS``, else ``DEFAULT_BENCHMARKS_DIR``."""
    if directory is not None:
        return Path(directory)
    return Path(os.environ.get(BENCHMARKS_ENV) or DEFAULT_BENCHMARKS_DIR)


def check_benchmarks_option(directory: str | Path | None, name: str = AUTOFORMER_TINY_FILE) -> None:
    """Refuse a ``--benchmarks DIR`` given on the command line that does not hold ``name``: a study skips a
    benchmark the default folder lacks, but not one the user pointed at."""
    if directory is not None and not (benchmarks_dir(directory) / name).is_file():
        raise InvalidInputError(missing_benchmark_note(benchmarks_dir(directory) / name, directory))


def missing_benchmark_note(path: Path, directory: str | Path | None = None) -> str:
    """Why a benchmark file under ``benchmarks_dir(directory)`` was not found, and how to point at it."""
    if directory is not None:
        return f"{path} not found: --benchmarks must name the folder that holds {path.name}"
    if os.environ.get(BENCHMARKS_ENV):
        source = f"${BENCHMARKS_ENV}"
    else:
        source = f"the default, ../shared/benchmarks beside the checkout; ${BENCHMARKS_ENV} is not set"
    return (
        f"{path} not found (looked in {path.parent}: {source}); set {BENCHMARKS_ENV}=DIR "
        "(the scripts also take --benchmarks DIR)"
    )


BASELINE_NOTES = {
    "flexibert": {
        "params": "non-embedding parameters of the scored spec (weights, biases, LayerNorms)",
        "flops": "multiply-accumulates of one 128-token forward pass (linear layers + SA score/context products)",
    },
    "gpt2": {
        "params": (
            "non-embedding parameters (equals the LTS 'nonembedding' count; summing every 'params' entry double-counts)"
        ),
        "flops": "multiply-accumulates of one 192-token segment attending 192 memory tokens",
    },
    "autoformer": {
        "params": "all parameters (equals AutoFormer's own 'params')",
        "flops": "the file's 'flops' (AutoFormer's count) when present, else our multiply-accumulates per image",
    },
    "nats-sss": {"params": "all parameters", "flops": "multiply-accumulates per image"},
    "ofa-mbv3": {"params": "all parameters", "flops": "multiply-accumulates per image"},
}


@dataclass(frozen=True)
class Benchmark:
    """A parsed benchmark: per-architecture configs and the target, oriented higher-is-better."""

    path: str
    format: str
    family: str
    ids: tuple[str, ...]
    configs: tuple[Any, ...]
    target: np.ndarray
    target_name: str
    higher_is_better: bool
    reported: Mapping[str, np.ndarray] = field(default_factory=dict)
    sha256: str = ""
    skipped: tuple[str, ...] = ()  # ids of the file's rows without the target (left out of ids/configs/target)

    def __repr__(self) -> str:  # the generated one printed every id, config and target (227 kB for AutoFormer)
        return (
            f"Benchmark({Path(self.path).name!r}, format={self.format!r}, family={self.family!r}, "
            f"{len(self.ids)} architectures, target={self.target_name!r})"
        )

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, options: Any = None) -> ArchBatch:
        """The batched spec of every architecture under the family ``options`` (defaults: paper)."""
        fam = families.get_family(self.family)
        archs = fam.parse(self.ids, self.configs)
        if self.reported and hasattr(archs, "reported"):
            archs = dataclasses.replace(archs, reported=dict(self.reported))
        return fam.build(archs, families.checked_options(fam, options))

    def describe(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "family": self.family,
            "target": self.target_name,
            "higher_is_better": self.higher_is_better,
            "sha256": self.sha256,
        }

    def skipped_report(self) -> dict[str, Any]:
        """JSON-ready account of the rows left out: ``{"count", "rows_in_file", "reason", "ids"}``."""
        return {
            "count": len(self.skipped),
            "rows_in_file": len(self.ids) + len(self.skipped),
            "reason": f"no {self.target_name!r} value",
            "ids": list(self.skipped),
        }

    def baseline_notes(self, options: Mapping[str, Any] | None = None) -> dict[str, str]:
        """What the params and flops baselines count, under the family ``options`` the scores used."""
        notes = dict(BASELINE_NOTES.get(self.family, {"params": "all parameters", "flops": "multiply-accumulates"}))
        head_dim = (options or {}).get("head_dim")
        if self.family == "autoformer" and head_dim not in (None, AutoFormerOptions.head_dim):
            notes["params"] = f"all parameters at head_dim {head_dim} (AutoFormer's own 'params' count head_dim 64)"
        return notes


@dataclass(frozen=True)
class _Format:
    family: str
    expects: str
    targets: tuple[str, ...]  # first is the default
    higher_is_better: bool
    detect: Callable[[Any], bool]
    rows: Callable[[Any], list[tuple[str, Any]]]  # (id, record)
    config: Callable[[Mapping[str, Any]], Any]
    value: Callable[[Mapping[str, Any], str], Any]
    reported: tuple[str, ...] = ()
    minimum: float = -np.inf  # the least value a target can take (a perplexity is at least 1)
    maximum: float = np.inf  # the most (a top-1 accuracy in percent is at most 100)


def _some_row(data: Any, container: type, keys: set[str], any_of: set[str] | None = None) -> bool:
    """Whether ``data`` (a ``container`` of rows) has a row among its first ``DETECT_ROWS`` that is an object with
    every key of ``keys`` (and one of ``any_of``): a damaged first row is then named as a row, not taken for a
    file of no known format."""
    if not isinstance(data, container):
        return False
    rows = data.values() if isinstance(data, dict) else data
    for _, row in zip(range(DETECT_ROWS), rows):
        if isinstance(row, dict) and keys <= set(row) and (any_of is None or any_of & set(row)):
            return True
    return False


DETECT_ROWS = 20


def _row_id(arch_id: Any, index: int) -> str:
    """Row ``index``'s ``id`` as text: a string or an integer (null, a list or a float would become "None",
    "[1, 2]")."""
    if not (isinstance(arch_id, str) or is_int(arch_id)):
        raise InvalidInputError(f"architecture #{index}: {must_be(repr('id'), 'a string or integer', arch_id)}")
    return str(arch_id)


def _flexibert_config(record: Mapping[str, Any]) -> dict[str, Any]:
    overrides = record["hparams"]["model_hparam_overrides"]
    return {"hidden_size": overrides["hidden_size"], "encoder_layers": overrides["nas_config"]["encoder_layers"]}


FORMATS: dict[str, _Format] = {
    "flexibert-glue": _Format(
        family="flexibert",
        expects=(
            "a JSON list of {id, scores: {glue}, "
            "hparams: {model_hparam_overrides: {hidden_size, nas_config: {encoder_layers}}}}"
        ),
        targets=("glue", "cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst", "sts"),
        higher_is_better=True,
        detect=lambda d: _some_row(d, list, {"scores", "hparams"}),
        rows=lambda d: [(_row_id(r.get("id", i), i) if isinstance(r, dict) else str(i), r) for i, r in enumerate(d)],
        config=_flexibert_config,
        value=lambda r, t: r["scores"][t],
    ),
    "lts-gpt2": _Format(
        family="gpt2",
        expects="a JSON object name -> {config: {d_model, n_layer, n_head, d_inner}, valid_ppl, test_ppl}",
        targets=("valid_ppl", "test_ppl"),
        higher_is_better=False,
        detect=lambda d: _some_row(d, dict, {"config"}, {"valid_ppl", "test_ppl"}),
        rows=lambda d: list(d.items()),
        config=lambda r: r["config"],
        value=lambda r, t: r[t],
        minimum=1.0,
    ),
    "autoformer-ood": _Format(
        family="autoformer",
        expects=(
            "a JSON object id -> {net_setting: {layer_num, embed_dim, num_heads, mlp_ratio}, "
            "performance: {Imagenet: {clean}}, params, flops}"
        ),
        targets=("clean",),
        higher_is_better=True,
        detect=lambda d: _some_row(d, dict, {"net_setting"}),
        rows=lambda d: list(d.items()),
        config=lambda r: r["net_setting"],
        value=lambda r, t: r["performance"]["Imagenet"][t],
        reported=("flops",),
        minimum=0.0,
        maximum=100.0,
    ),
}


def _expected_formats() -> str:
    lines = [f"{name}: {fmt.expects}" for name, fmt in FORMATS.items()]
    lines.append(
        f"{GENERIC_FORMAT}: {{format: {GENERIC_FORMAT}, family, target, higher_is_better, "
        "architectures: [{id, config, target}]}"
    )
    return "; ".join(lines)


def detect_format(data: Any) -> str:
    """Name of the format ``data`` (parsed JSON) is in; raises listing the formats expected."""
    if isinstance(data, dict) and data.get("format") == GENERIC_FORMAT:
        return GENERIC_FORMAT
    if isinstance(data, (list, dict)) and len(data) == 0:
        raise InvalidInputError("the benchmark file holds no architectures")
    for name, fmt in FORMATS.items():
        if fmt.detect(data):
            return name
    raise InvalidInputError(f"unrecognised benchmark format; expected one of: {_expected_formats()}")


def _read_json(path: Path) -> Any:
    try:
        return parse_json(path.read_text(encoding="utf-8"), constants=True)  # NaN in a column not read: as json
    except UnicodeDecodeError as err:
        raise InvalidInputError(f"{path} is not a UTF-8 text file; expected a JSON benchmark") from err
    except json.JSONDecodeError as err:
        raise InvalidInputError(f"{path} is not valid JSON ({err}); expected one of: {_expected_formats()}") from err
    except ValueError as err:  # a key twice, an integer past a float, nesting past the limit: JSON of no use here
        raise InvalidInputError(f"{path}: {err}") from err


def _generic_rows(data: Mapping[str, Any], where: str) -> tuple[str, str, bool, list[tuple[str, Any, Any]]]:
    try:
        family, target, higher = data["family"], data.get("target", "target"), data["higher_is_better"]
        archs = data["architectures"]
    except KeyError as err:
        raise InvalidInputError(f"{where}: {GENERIC_FORMAT} file is missing {err}") from err
    for key, value in (("family", family), ("target", target)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidInputError(f"{where}: {must_be(repr(key), 'a non-empty string', value)}")
    if not isinstance(higher, bool):  # bool("false") is True: a string would invert the ranking
        raise InvalidInputError(f"{where}: {must_be(repr('higher_is_better'), 'true or false', higher)}")
    if not isinstance(archs, list) or not archs:
        raise InvalidInputError(f"{where}: 'architectures' must be a non-empty list")
    rows = []
    for i, arch in enumerate(archs):
        if not isinstance(arch, dict) or "config" not in arch:
            raise InvalidInputError(f"{where}: architecture #{i} must be an object with 'config' and 'target'")
        try:
            arch_id = _row_id(arch.get("id", i), i)
        except InvalidInputError as err:
            raise InvalidInputError(f"{where}: {err}") from err
        rows.append((arch_id, arch["config"], arch.get("target")))
    return family, target, higher, rows


def _format_rows(
    fmt: _Format, data: Any, target: str, where: str
) -> tuple[tuple[str, ...], tuple[Any, ...], list[Any], dict[str, list[Any]]]:
    """A known format's ids, configs, ``target`` values (None where a row lacks it) and reported figures by key."""
    ids, configs, values, extra = [], [], [], {key: [] for key in fmt.reported}
    try:
        rows = fmt.rows(data)
    except InvalidInputError as err:
        raise InvalidInputError(f"{where}: {err}") from err
    for arch_id, record in rows:
        try:
            configs.append(fmt.config(record))
            values.append(_value_or_missing(fmt, record, target))
            for key in fmt.reported:
                extra[key].append(record.get(key))
        except (KeyError, TypeError, IndexError) as err:
            shape = f"({err})" if isinstance(record, Mapping) else f"(a {type(record).__name__}, not an object)"
            what = f"lacks {err}" if isinstance(err, KeyError) else f"is malformed {shape}"
            raise InvalidInputError(f"{where}: row {arch_id!r} {what}; expected {fmt.expects}") from err
        ids.append(arch_id)
    return tuple(ids), tuple(configs), values, extra


def _value_or_missing(fmt: _Format, record: Mapping[str, Any], target: str) -> Any:
    """The row's target value, or None when the row has no such key (or holds null)."""
    try:
        return fmt.value(record, target)
    except KeyError:
        return None


def load_benchmark(
    path: str | Path, family: str | None = None, target: str | None = None, strict: bool = False
) -> Benchmark:
    """Read and validate a benchmark file (format auto-detected).

    ``family``, when given, must agree with the family the file holds; ``target`` picks the
    metric (default: the format's first, e.g. ``glue``, ``valid_ppl``, ``clean``). Rows without
    the target (no key, or null) are left out and listed in ``Benchmark.skipped``; ``strict``
    makes them an error.
    """
    path = existing_file(path, "benchmark file")  # before Path(''), which is '.'
    data = _read_json(path)
    name = detect_format(data)
    where = f"{path} ({name} format)"
    extra: dict[str, list[Any]] = {}
    if name == GENERIC_FORMAT:
        fam_name, target_name, higher, rows = _generic_rows(data, where)
        if target is not None and target != target_name:
            raise InvalidInputError(f"{where}: the file's target is {target_name!r}; got --target {target!r}")
        ids = tuple(r[0] for r in rows)
        configs = tuple(r[1] for r in rows)
        values = [r[2] for r in rows]
    else:
        fmt = FORMATS[name]
        fam_name, higher = fmt.family, fmt.higher_is_better
        target_name = fmt.targets[0] if target is None else target  # --target '' is refused, not the default
        if target_name not in fmt.targets:
            raise InvalidInputError(f"{where}: unknown target {target_name!r}; choose one of {', '.join(fmt.targets)}")
        ids, configs, values, extra = _format_rows(fmt, data, target_name, where)
    if family is not None and family != fam_name:
        families.get_family(family)  # unknown names get the registry's message
        raise InvalidInputError(f"{where}: this file holds {fam_name!r} architectures; got --family {family!r}")
    families.get_family(fam_name)
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InvalidInputError(f"{where}: architecture id {dup!r} appears more than once")
    keep = [i for i, v in enumerate(values) if v is not None]
    skipped = tuple(ids[i] for i, v in enumerate(values) if v is None)
    if not keep:
        raise InvalidInputError(
            f"{where}: target {target_name!r} must be present in some rows; got none in {len(ids)} rows. "
            "Pick another --target"
        )
    if skipped and strict:
        raise InvalidInputError(
            f"{where}: target {target_name!r} must be present in every row (--strict); got {len(skipped)} of "
            f"{len(ids)} rows without it ({', '.join(skipped[:5])}). Drop --strict to score the others"
        )
    ids, configs, values = tuple(ids[i] for i in keep), tuple(configs[i] for i in keep), [values[i] for i in keep]
    reported = _reported({key: [vals[i] for i in keep] for key, vals in extra.items()}, ids, where)
    fmt = FORMATS.get(name)
    bounds = (fmt.minimum, fmt.maximum) if fmt else (-np.inf, np.inf)
    raw = _numbers(values, ids, f"{where}: target {target_name!r}", *bounds)
    return Benchmark(
        path=str(Path(path).resolve()),
        format=name,
        family=fam_name,
        ids=ids,
        configs=configs,
        target=raw if higher else -raw,
        target_name=target_name,
        higher_is_better=higher,
        reported=reported,
        sha256=sha256_file(path),
        skipped=skipped,
    )


def _reported(extra: Mapping[str, list[Any]], ids: Sequence[str], where: str) -> dict[str, np.ndarray]:
    """The file's own baseline figures (AutoFormer's ``flops``) that every row has; a key that some rows lack is
    refused (one missing row would switch every row's baseline to ours), one that all lack is left out."""
    reported = {}
    for key, vals in extra.items():
        lacking = [arch_id for arch_id, v in zip(ids, vals) if v is None]
        if lacking and len(lacking) < len(vals):
            raise InvalidInputError(
                f"{where}: {key!r} must be in every row or in none; got {len(lacking)} of {len(vals)} rows without "
                f"it ({', '.join(lacking[:5])})"
            )
        if not lacking:
            reported[key] = _numbers(vals, ids, f"{where}: {key!r}", positive=True)
    return reported


def _range(minimum: float, maximum: float, positive: bool) -> str:
    """What ``_numbers`` requires, in words: ``> 0``, ``at least 1``, ``in [0, 100]``."""
    if positive:
        return "> 0"
    if maximum == np.inf:
        return f"at least {minimum:g}"
    return f"at most {maximum:g}" if minimum == -np.inf else f"in [{minimum:g}, {maximum:g}]"


def _numbers(
    values: Sequence[Any],
    ids: Sequence[str],
    what: str,
    minimum: float = -np.inf,
    maximum: float = np.inf,
    positive: bool = False,
) -> np.ndarray:
    """``values`` as floats; InvalidInputError naming the first row that is not a finite number, or is outside what
    the metric can be (``minimum``: a perplexity is at least 1; ``maximum``: an accuracy in percent at most 100;
    ``positive``: a FLOP count is above 0)."""
    out = np.empty(len(values), dtype=np.float64)
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise InvalidInputError(f"{what} of row {ids[i]!r} must be a finite number; got {v!r}")
        if v < minimum or v > maximum or (positive and v <= 0):
            raise InvalidInputError(f"{what} of row {ids[i]!r} must be {_range(minimum, maximum, positive)}; got {v:g}")
        out[i] = v
    return out
