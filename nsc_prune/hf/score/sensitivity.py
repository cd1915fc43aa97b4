"""Measured layer sensitivity (``nsc-prune --score measured``): how much cutting ONE layer to each option of an
elastic space damages the model, measured on calibration text; a table the exact DP maximises.

The measure. For layer ``l`` and option ``o`` (FFN channels kept, KV groups kept, or the layer dropped), all other
layers whole, ``e_l(o)`` is the damage on the calibration text, in nats per token: the KL divergence of the cut
model's next-token distribution from the dense one's (``target`` ``kl``, the default), or the increase of the
language-model loss (``loss``). It is measured exactly for the narrowest FFN option and, with ``probe_widths`` 2
(the default for ``kl``), a middle one, and for dropping the
layer: the cut block's output on the first ``probe_tokens`` tokens is carried through every later layer and the LM
head, on fewer tokens for a layer more than ``probe_depth`` layers from the head, so that the probes cost O(L) and
not O(L^2) layer passes, and scored at every ``probe_stride``-th position (half the LM heads at the default 2);
probe streams of one length pass a layer in one batch. The other options follow the shape of the block output's
relative error, per token and averaged over all calibration tokens,

    r_l(o) = mean_t ||Y'_t - Y_t||^2 / ||Y_t||^2        Y_t: the residual stream leaving layer l at token t

through the anchors' measured damage (``probes.scaled_errors``). Why the model's output and not the block error
alone: on SmolLM2-135M the block error misses that the last layer is the second most fragile, and a diagonal-Fisher
estimate over-rates the early layers threefold (measurements: docs/sensitivity.md).

The kept channels are the ones extraction keeps: ``selection`` ``activation`` (the default) is computed in the
same pass over the same tokens with the same hooks as ``nsc-prune extract --selection activation --calib FILE``,
so the table describes the checkpoints extract writes from the same text. Streamed (``hf.weights.streaming``): one
layer's float32 weights in memory; each layer's input is the previous layer's clean output, computed once; per
option only the removed units' contribution is subtracted (prefix sums along the channel order), and the MLP is
re-run once per KV-group count.

The DP value of an option is ``-e_l(o)``: the plan minimises the predicted damage ``sum_l e_l(o_l)`` under the
budget. Additivity is an assumption; docs/sensitivity.md checks it against held-out loss of random plans. A
plan-conditioned table (``plan``; ``nsc-prune --refine``) measures each layer with the others cut as a plan says,
so the DP's next plan is judged around the last one instead of around the dense model.

Tables are cached (``$NSC_PRUNE_CACHE/sensitivity``, or ``table=PATH``) under a key of the weights, the
calibration text and settings, the selection and the option grid; a second search at another budget reads it
and runs no forward pass. A corrupt table file is rebuilt; a ``table`` file made for other inputs is refused.

This module is the entry point and the table the DP reads; the work lives in ``block_error`` (a cut block's
output and relative error), ``probes`` (the walk over the layers that measures the damage) and
``sensitivity_cache`` (the table's key and file).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsc_prune._deprecated import forward_moved
from nsc_prune._io import check_cache_path, check_output, provenance
from nsc_prune._validation import is_int, must_be
from nsc_prune.choices import SENSITIVITY_TARGETS
from nsc_prune.core.front import SearchSpace
from nsc_prune.core.solver import value_step
from nsc_prune.core.spec import refuse_kv_cuts
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.hf.cut.selection import (
    SelectionConfig,
    calibration_seq_len,
    calibration_tokens,
    channel_orders,
    read_calibration_text,
    tokenizer_folder,
)
from nsc_prune.hf.ranks import current_ranks
from nsc_prune.hf.score.probes import PROBE_DEPTH, PROBE_STRIDE, ProbeConfig, measure_errors
from nsc_prune.hf.score.sensitivity_cache import cached_table, default_table_path, table_key, write_table
from nsc_prune.hf.weights.compute import Compute
from nsc_prune.plan import LayerPlan, elastic_layer_plans

if TYPE_CHECKING:
    from nsc_prune.hf.weights.base import BaseModel

BACKEND = "measured"
HARMLESS_CUT = 1e-9  # nats per unit cut, at least: far below any measured damage (raised to a few DP value steps)


@dataclass(frozen=True)
class SensitivityConfig:
    """How the table is measured. Defaults equal extraction's ``activation`` selection, so the same text gives
    the same channels."""

    calib: str  # UTF-8 text file: the calibration text (never the text you evaluate on)
    selection: str = "activation"  # the channels extraction will keep: first, magnitude or activation
    calib_tokens: int = 4096  # calibration tokens (fewer if the file is shorter)
    seq_len: int = 512  # tokens per forward pass (capped at the model's context)
    tokenizer: str | None = None  # folder with tokenizer files; None: the weights folder's
    probe_tokens: int = 512  # tokens (the first of the calibration text) on which the LM loss increases are measured
    compute: Compute = field(default_factory=Compute)  # where the base runs while measuring, and in which dtype
    target: str = "kl"  # "kl": KL(dense || cut), no labels; "loss": LM loss increase on the text's own labels
    probe_depth: int = PROBE_DEPTH  # a probe costs at most this many layers of probe_tokens (0: no cap, L^2 growth)
    probe_widths: int | None = None  # FFN widths probed a layer: 1 the narrowest, 2 also the middle; None: auto
    probe_stride: int = PROBE_STRIDE  # a probe's damage is averaged over every probe_stride-th position

    def selection_config(self) -> SelectionConfig:
        """The extraction selection this table measures (validates the shared fields)."""
        return SelectionConfig(
            self.selection, self.calib, self.calib_tokens, self.seq_len, self.tokenizer, self.compute
        )

    def probe_config(self) -> ProbeConfig:
        """How this table's probes measure (validates the probe fields)."""
        return ProbeConfig(self.probe_tokens, self.target, self.probe_depth, self.probe_widths, self.probe_stride)

    def __post_init__(self) -> None:
        self.selection_config()
        if self.seq_len == 1:  # every damage would be 0: the table would rank nothing
            raise InvalidInputError(
                must_be(
                    "--calib-seq-len",
                    "at least 2 for --score measured (a block of one token has no next token to predict)",
                    self.seq_len,
                )
            )
        if self.probe_widths is None and self.target in SENSITIVITY_TARGETS:
            # a middle anchor on the labels can measure a gain, and the DP cuts it for free
            object.__setattr__(self, "probe_widths", 2 if self.target == "kl" else 1)
        self.probe_config()


def _cut_share(cut: LayerPlan, row: tuple[LayerPlan, ...]) -> float:
    """How much of its layer ``cut`` removes, in [0, 2]: the FFN and KV-group shares, 2 for a dropped layer."""
    if not cut.keep:
        return 2.0
    shares = 0.0
    for width in (lambda c: c.ffn, lambda c: c.kv_groups):  # None: the layer's own size, never cut
        full = max((width(c) for c in row if c.keep and width(c) is not None), default=None)
        shares += 1 - width(cut) / full if width(cut) is not None else 0.0
    return shares


@dataclass(frozen=True)
class SensitivityTable:
    """``errors[l][j]``: the measured damage of option ``j`` of layer ``l`` (aligned with ``cuts``) and the record
    (calibration text, tokens, time, cache)."""

    cuts: tuple[tuple[LayerPlan, ...], ...]
    errors: tuple[tuple[float, ...], ...]
    record: dict[str, Any]

    def __post_init__(self) -> None:
        # A negative damage (a gain) would rank a cut above the whole layer and drop the full model from the front:
        # measurement clamps gains to 0, a table file with one is refused (sensitivity_cache), and so is one built here.
        bad = next((e for row in self.errors for e in row if not (math.isfinite(e) and e >= 0)), None)
        if bad is not None:
            raise InvalidInputError(must_be("every damage of a sensitivity table", "finite and >= 0", bad))

    def values(self) -> list[list[list[float]]]:
        """DP values ``[subspace][layer][option]``: minus the damage, less a nudge per unit cut.

        A measured gain is clamped to no damage, so a cut can tie with the whole layer; the DP would then keep the
        cheaper one and drop the full model from the front (a percentage budget would be of a smaller model, and the
        noise would decide the cut). The nudge ranks every cut below keeping the layer whole: ``HARMLESS_CUT``, or
        four of the DP's value steps for the smallest cut where that is more (32 layers of a few nats each put a
        step near 2e-10, which rounded a 1e-9 nudge of a 2 % cut away)."""
        shares = [[_cut_share(cut, row) for cut in row] for row in self.cuts]
        smallest = min((share for row in shares for share in row if share > 0), default=1.0)
        nudge = max(HARMLESS_CUT, 4 * value_step([[-e for e in row] for row in self.errors]) / smallest)
        return [
            [[-e - nudge * share for e, share in zip(errors, row, strict=True)]
             for errors, row in zip(self.errors, shares, strict=True)]
        ]  # fmt: skip

    def predicted_damage(self, options: tuple[int, ...]) -> float:
        """``sum_l e_l(o_l)`` of a plan given as one option index per layer."""
        return float(sum(row[j] for row, j in zip(self.errors, options, strict=True)))

    def shrunk(self, weight: float) -> SensitivityTable:
        """The table shrunk toward the layers' mean (``--sensitivity-shrink``): ``(1 - weight) e_l(j) + weight *
        m(j)`` for every option ``j``, ``m(j)`` its mean damage over the layers that have it (a protected layer has
        only its full width, the first layer of a depth space no drop). One calibration text's table is noisy and
        fits that text's domain (docs/sensitivity.md); the mean over layers is layer-symmetric, as psi_MP is.
        Weight 0 is the table as measured."""
        if weight == 0:
            return self
        pooled: dict[LayerPlan, list[float]] = {}
        for row, errors in zip(self.cuts, self.errors, strict=True):
            for cut, error in zip(row, errors, strict=True):
                pooled.setdefault(cut, []).append(error)
        means = {cut: sum(errors) / len(errors) for cut, errors in pooled.items()}
        errors = tuple(
            tuple((1 - weight) * e + weight * means[cut] for cut, e in zip(row, errs, strict=True))
            for row, errs in zip(self.cuts, self.errors, strict=True)
        )
        return SensitivityTable(self.cuts, errors, self.record | {"shrink": weight})


def check_table_inputs(
    space: SearchSpace,
    weights: str | os.PathLike,
    model_config: dict[str, Any],
    config: SensitivityConfig,
    table: str | os.PathLike | None = None,
) -> tuple[BaseModel, list[list[LayerPlan]]]:
    """``sensitivity_table``'s checks of its inputs, before anything is hashed or measured: the base (its family,
    that it is the model of ``model_config``), the space's options per layer, the device, the calibration text
    and the ``table`` path. Returns the base and the options."""
    from nsc_prune.hf.weights.base import check_weights_match, open_base

    if table is not None:  # read when it holds this table, else written: never a folder or a pipe
        check_output(table, (weights, config.calib), marker=None, rewritable=True, flag="--sensitivity-table")
    cuts = elastic_layer_plans(space, "--score measured")
    base = open_base(weights, job="--score measured", flag="--weights")
    refuse_kv_cuts(base.config.get("model_type"), cuts, base.kv_heads, "--score measured")
    check_weights_match(base.folder, base.tensors, model_config)
    config.compute.check()
    read_calibration_text(config.calib)  # a missing, empty, binary or JSON file: one clear error before any hashing
    tokenizer_folder(
        base, config.selection_config(), "--score measured", "--weights"
    )  # said as the search's flags say it
    return base, cuts


def sensitivity_table(
    space: SearchSpace,
    weights: str | os.PathLike,
    model_config: dict[str, Any],
    config: SensitivityConfig,
    table: str | os.PathLike | None = None,
    progress: bool = True,
    plan: tuple[int, ...] | None = None,
) -> SensitivityTable:
    """The measured table of every option of the elastic ``space`` of the model in ``weights``: read from the
    cache (or ``table``) when one was built for the same inputs, else measured and written there. ``plan`` (one
    option index per layer): the table with every other layer cut as the plan says (``measure_errors``), kept in
    the cache under its key and the plan, never in ``table``.

    ConfigError when ``weights`` is not the model of ``model_config``, the space is not elastic, or ``table`` is a
    valid table built for other inputs; a corrupt cache file is rebuilt with a warning."""
    base, cuts = check_table_inputs(space, weights, model_config, config, table if plan is None else None)
    key = table_key(base, cuts, config) | ({"conditioned_on": list(plan)} if plan is not None else {})
    if plan is not None:
        _check_plan(plan, cuts)
        table = None
    ranks = current_ranks(config.compute.device)
    ranks.check_same("the inputs of the sensitivity table (weights, calibration text and settings, space)", key)
    path = Path(os.path.abspath(table)) if table is not None else default_table_path(key)  # recorded: read elsewhere
    if table is None:  # an explicit --sensitivity-table was checked as an output; the cache's entry is checked here
        check_cache_path(path)
    existed = os.path.lexists(path)  # a link to no file yet is replaced by the table, as before: not "made meanwhile"
    cached = cached_table(path, key, cuts, explicit=table is not None) if path.is_file() else None
    if ranks.every(cached is not None):  # the same text (its sha256 is in the key), maybe at another path: this run's
        record = cached[1] | {"calib": str(Path(config.calib).resolve()), "calib_sha256": key["calib_sha256"]}
        return SensitivityTable(_tuples(cuts), _tuples(cached[0]), record)
    start = time.perf_counter()
    selection = config.selection_config()
    ids, used = calibration_tokens(base, selection)
    orders = None if config.selection == "activation" else channel_orders(base, selection)[0]
    seq_len = calibration_seq_len(base, config.seq_len)
    errors, measured = measure_errors(
        base, ids, seq_len, cuts, orders, config.probe_config(), progress=progress, compute=config.compute,
        ranks=ranks, plan=plan,
    )  # fmt: skip
    record = {
        "measure": key["measure"],
        **measured,
        "selection": config.selection,
        **used,
        "seq_len": seq_len,
        "compute": config.compute.record(),
        "processes": ranks.count,
        "seconds": round(time.perf_counter() - start, 3),
        "built": provenance(),
    }
    new_file = table is not None and not existed  # another search of these inputs may have written it meanwhile
    if ranks.main and not (new_file and _table_for(path, key, cuts)):  # one writer: every rank holds the table
        write_table(path, key, cuts, errors, record, overwrite=table is None or existed)  # yours: never replaced
    return SensitivityTable(_tuples(cuts), _tuples(errors), record | {"table": str(path), "cache_hit": False})


def _table_for(path: Path, key: dict[str, Any], cuts: list[list[LayerPlan]]) -> bool:
    """Whether ``path`` holds a table of ``key``: another search with the same new ``--sensitivity-table`` wrote it
    while this one measured (its table is this one's; anything else there is not replaced)."""
    try:
        return path.is_file() and cached_table(path, key, cuts, explicit=True) is not None
    except ConfigError:
        return False


def _check_plan(plan: tuple[int, ...], cuts: list[list[LayerPlan]]) -> None:
    if len(plan) != len(cuts) or not all(is_int(j) and 0 <= j < len(row) for j, row in zip(plan, cuts)):
        raise ConfigError(must_be("plan", f"one option index per layer of the space ({len(cuts)} layers)", plan))


def _tuples(rows: list[list[Any]]) -> tuple[tuple[Any, ...], ...]:
    return tuple(tuple(row) for row in rows)


# Public names this module had before it was split by job: they resolve, with a DeprecationWarning, for one release.
__getattr__ = forward_moved(
    __name__,
    {
        "MEASURE": "nsc_prune.hf.score.sensitivity_cache",
        "MEASURE_KL": "nsc_prune.hf.score.sensitivity_cache",
        "MIN_PROBE_TOKENS": "nsc_prune.hf.score.probes",
        "PROBE_BATCH_TOKENS": "nsc_prune.hf.score.block_error:BATCH_TOKENS",
        "TABLE_FORMAT": "nsc_prune.hf.score.sensitivity_cache",
        "anchor_cuts": "nsc_prune.hf.score.probes",
        "cut_outputs": "nsc_prune.hf.score.block_error",
        "gated_activation": "nsc_prune.hf.score.block_error",
        "probe_token_count": "nsc_prune.hf.score.probes",
        "relative_error_sums": "nsc_prune.hf.score.block_error",
        "scaled_errors": "nsc_prune.hf.score.probes",
    },
)
