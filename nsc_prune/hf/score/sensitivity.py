"""Measured layer sensitivity (``nsc-prune --score measured``): how much cutting ONE layer to each option of an
elastic space damages the model, measured on calibration text; a table the exact DP maximises.

The measure. For layer ``l`` and option ``o`` (FFN channels kept, KV groups kept, or the layer dropped), all other
layers whole, ``e_l(o)`` is the increase of the language-model loss (nats per token) on the calibration text. It is
measured exactly for the narrowest FFN option (with ``probe_widths`` 2 also a middle one) and for dropping the
layer: the cut block's output on the first ``probe_tokens`` tokens is carried through every later layer and the LM
head, on fewer tokens for a layer more than ``probe_depth`` layers from the head, so that the probes cost O(L) and
not O(L^2) layer passes, and scored at every ``probe_stride``-th position (half the LM heads at the default 2);
probe streams of one length pass a layer in one batch. The other options follow the shape of the block output's
relative error, per token and averaged over all calibration tokens,

    r_l(o) = mean_t ||Y'_t - Y_t||^2 / ||Y_t||^2        Y_t: the residual stream leaving layer l at token t

through the anchors' measured loss increases (``scaled_errors``). Why the loss and not the block error
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
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsc_prune import _files
from nsc_prune._io import atomic_write_text, provenance, to_json
from nsc_prune._validation import is_int, must_be
from nsc_prune.choices import SENSITIVITY_TARGETS
from nsc_prune.core.front import SearchSpace
from nsc_prune.core.spec import refuse_kv_cuts
from nsc_prune.errors import ConfigError, UnsupportedArchitectureError, require
from nsc_prune.hf.cut.keep import LayerOrder
from nsc_prune.hf.cut.selection import (
    SelectionConfig,
    calibration_seq_len,
    calibration_tokens,
    channel_orders,
    mean_scores,
    orders_from_scores,
    read_calibration_text,
    record_hooks,
    run_hooked,
)
from nsc_prune.hf.ranks import Ranks, current_ranks
from nsc_prune.hf.weights.compute import Compute
from nsc_prune.hf.weights.fingerprint import tokenizer_fingerprint, weights_fingerprint
from nsc_prune.plan import LayerPlan, elastic_layer_plans

if TYPE_CHECKING:
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
BACKEND = "measured"
PROBE_DEPTH = 6  # docs/sensitivity.md, "Cheaper probes": with PROBE_STRIDE 2, <= 3x an activation pass
PROBE_STRIDE = 2  # docs/sensitivity.md, "Cheaper probes": every other position halves the LM heads
_RECONSTRUCTION_RTOL = 1e-3  # the block rebuilt from its parts must match its own output (float32 round-off)
_RECONSTRUCTION_RTOL_HALF = 3e-2  # the same in bfloat16 / float16 (8 and 11 mantissa bits)


@dataclass(frozen=True)
class ProbeConfig:
    """How ``measure_errors`` measures the anchor cuts' damage; the field names of ``SensitivityConfig`` less
    ``probe_``. The defaults are the exact, most expensive measure (every probe on all ``tokens``, every position,
    one anchor, the labels' loss); ``SensitivityConfig.probe_config()`` gives a table's own."""

    tokens: int = 512  # the first calibration tokens, on which the damage is measured
    target: str = "loss"  # "loss": LM loss increase on the text's labels; "kl": KL(dense || cut)
    depth: int = 0  # a probe costs at most this many layers of ``tokens`` (0: no cap, L^2 growth)
    widths: int = 1  # FFN widths probed a layer: 1 the narrowest, 2 also the middle
    stride: int = 1  # the damage is averaged over every ``stride``-th position

    def __post_init__(self) -> None:
        if not is_int(self.tokens) or self.tokens < 1:
            raise ConfigError(must_be("probe_tokens", "a positive integer", self.tokens))
        if not is_int(self.depth) or self.depth < 0:
            raise ConfigError(must_be("probe_depth", "a non-negative integer (0: no cap)", self.depth))
        if self.target not in SENSITIVITY_TARGETS:
            raise ConfigError(must_be("target", f"one of {', '.join(SENSITIVITY_TARGETS)}", self.target))
        if self.widths not in (1, 2):
            raise ConfigError(must_be("probe_widths", "1 or 2 (None: 2 for kl, 1 for loss)", self.widths))
        if not is_int(self.stride) or self.stride < 1:
            raise ConfigError(must_be("probe_stride", "a positive integer (1: every position)", self.stride))


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
        if self.probe_widths is None and self.target in SENSITIVITY_TARGETS:
            # a middle anchor on the labels can measure a gain, and the DP cuts it for free
            object.__setattr__(self, "probe_widths", 2 if self.target == "kl" else 1)
        self.probe_config()


PROBE_BATCH_TOKENS = 2048  # tokens a probe batch or a block-error product holds (memory: 4 chunks' activations)
MIN_PROBE_TOKENS = 32  # the fewest tokens a shortened probe is carried on (its loss is a mean over them)
HARMLESS_CUT = 1e-9  # nats per unit cut: far below any measured damage, above float64's resolution of the sums


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

    def values(self) -> list[list[list[float]]]:
        """DP values ``[subspace][layer][option]``: minus the damage, less ``HARMLESS_CUT`` per unit cut.

        A measured gain is clamped to no damage, so a cut can tie with the whole layer; the DP would then keep the
        cheaper one and drop the full model from the front (a percentage budget would be of a smaller model, and the
        noise would decide the cut). The tie-break ranks every cut below keeping the layer whole."""
        return [
            [[-e - HARMLESS_CUT * _cut_share(cut, row) for e, cut in zip(errors, row, strict=True)]
             for errors, row in zip(self.errors, self.cuts, strict=True)]
        ]  # fmt: skip

    def predicted_damage(self, options: tuple[int, ...]) -> float:
        """``sum_l e_l(o_l)`` of a plan given as one option index per layer."""
        return float(sum(row[j] for row, j in zip(self.errors, options, strict=True)))

    def shrunk(self, weight: float) -> SensitivityTable:
        """The table shrunk toward the layers' mean (``--sensitivity-shrink``): ``(1 - weight) e_l(j) + weight *
        mean_l' e_l'(j)`` for every option ``j``. One calibration text's table is noisy and fits that text's domain
        (docs/sensitivity.md); the mean over layers is layer-symmetric, as psi_MP is. Needs every layer to have the
        same options; weight 0 is the table as measured."""
        if weight == 0:
            return self
        check_shrinkable(self.cuts)
        means = [sum(column) / len(column) for column in zip(*self.errors, strict=True)]
        errors = tuple(
            tuple((1 - weight) * e + weight * m for e, m in zip(row, means, strict=True)) for row in self.errors
        )
        return SensitivityTable(self.cuts, errors, self.record | {"shrink": weight})


def check_shrinkable(cuts: Sequence[Sequence[LayerPlan]]) -> None:
    """``--sensitivity-shrink`` pools each option over the layers: ConfigError unless every layer has the same
    options (``protect_layers``, for one, leaves a layer only its full width)."""
    if any(list(row) != list(cuts[0]) for row in cuts):
        raise ConfigError(
            "--sensitivity-shrink needs every layer to have the same options; this space's differ (drop "
            "--set protect_layers, or --sensitivity-shrink)"
        )


# ---------------------------------------------------------------------------------------------- measuring


def _cut_columns(order: LayerOrder, groups: int, group_size: int, head_dim: int) -> list[int]:
    """o_proj input columns of the query heads of the KV groups that a cut to ``groups`` groups removes."""
    removed = order.kv_groups[groups:]
    return [(g * group_size + j) * head_dim + d for g in removed for j in range(group_size) for d in range(head_dim)]


def _block_norms(layer: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any], Callable[[Any], Any]]:
    """(the norm before the MLP, the norm after attention, the norm after the MLP) of a decoder layer: LLaMA's
    pre-norm block has only the first (``post_attention_layernorm``, despite its name); OLMo 2's post-norm block
    (``post_feedforward_layernorm``) normalises each sublayer's output instead and has no norm before the MLP;
    Gemma 2/3's block has all three (``pre_feedforward_layernorm``, ``post_attention_layernorm``,
    ``post_feedforward_layernorm``), besides the input norm before attention."""
    if hasattr(layer, "pre_feedforward_layernorm"):
        return layer.pre_feedforward_layernorm, layer.post_attention_layernorm, layer.post_feedforward_layernorm
    if hasattr(layer, "post_feedforward_layernorm") and not hasattr(layer, "input_layernorm"):
        return _identity, layer.post_attention_layernorm, layer.post_feedforward_layernorm
    return layer.post_attention_layernorm, _identity, _identity


def gated_activation(mlp: Any, x: Any) -> Any:
    """The MLP's down_proj input: act(gate(x)) * up(x), from Phi-3's fused gate_up_proj (gate rows, then up) too."""
    if hasattr(mlp, "gate_up_proj"):
        gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
        return mlp.activation_fn(gate) * up
    return mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)


def _identity(t: Any) -> Any:
    return t


def _residual_multiplier(layer: Any) -> float:
    """What the block scales each sublayer's output by before adding it to the stream (Granite; 1 elsewhere)."""
    return float(getattr(layer, "residual_multiplier", 1.0))


def _cut_parts(
    layer: Any, x: Any, z: Any, attn: Any, order: LayerOrder, cuts: tuple[LayerPlan, ...], group_size: int,
    mlp_io: tuple[Any, Any] | None = None,
):  # fmt: skip
    """Yield ``(j, h, out, removed)`` for each kept cut ``j`` of one layer on one chunk: the residual stream after
    attention ``h`` (the cut KV groups' heads removed; the uncut one is ``x + r post_attn(attn)``), the MLP's uncut
    output ``out`` and the removed FFN channels' contribution to it ``removed`` (0 when none), so the cut block's
    output is ``h + r post_mlp(out - removed)``. ``x``, ``z``, ``attn``: the block input, the o_proj input and
    output (``[tokens, features]``); ``mlp_io``: the uncut block's down_proj input and output when the forward
    captured them. Only the removed units' contribution is formed, by prefix sums along the channel order (updated
    in place: use ``removed`` before the next cut); the MLP runs once per cut KV-group count, and not at all for
    the uncut attention when ``mlp_io`` is given."""
    torch = require("torch", "hf")
    mlp, head_dim = layer.mlp, layer.self_attn.head_dim
    r = _residual_multiplier(layer)
    pre, post_attn, _ = _block_norms(layer)
    w_o, w_down = layer.self_attn.o_proj.weight, mlp.down_proj.weight
    ffn_order = torch.as_tensor(order.ffn, device=x.device)
    width = len(order.ffn)
    for c in sorted({cut.kv_groups for cut in cuts if cut.keep}, reverse=True):
        columns = _cut_columns(order, c, group_size, head_dim)
        kept_attn = attn - z[:, columns] @ w_o[:, columns].T if columns else attn
        h = x + r * post_attn(kept_attn)
        if columns or mlp_io is None:
            act = gated_activation(mlp, pre(h))
            out = mlp.down_proj(act)  # the MLP's own forward: its bias, if any, stays with every cut
        else:
            act, out = mlp_io
        act = act[:, ffn_order]  # channels in the order extraction keeps them
        removed, upto = 0, width  # removed = contribution of channels order[k:], grown as k falls
        for k in sorted({cut.ffn for cut in cuts if cut.keep and cut.kv_groups == c}, reverse=True):
            if k < upto:
                part = act[:, k:upto] @ w_down[:, ffn_order[k:upto]].T
                removed = part if upto == width else removed.add_(part)
                upto = k
            for j, cut in enumerate(cuts):
                if cut.keep and (cut.ffn, cut.kv_groups) == (k, c):
                    yield j, h, out, removed


def cut_outputs(
    layer: Any, x: Any, z: Any, attn: Any, order: LayerOrder, cuts: tuple[LayerPlan, ...], group_size: int,
    mlp_io: tuple[Any, Any] | None = None,
) -> Iterator[tuple[int, Any]]:  # fmt: skip
    """Yield ``(j, Y'_j)`` for each cut ``j`` of one layer: the block output on one chunk when only this layer is cut
    (``_cut_parts``; a dropped layer's output is its input ``x``). The block must be ``h + r post(mlp(pre(h)))``
    with ``h = x + r post(attn)``, ``r`` the layer's ``residual_multiplier`` (1 but for Granite) and the norms of
    ``_block_norms``; ``relative_error_sums`` checks it."""
    r = _residual_multiplier(layer)
    post_mlp = _block_norms(layer)[2]
    for j, h, out, removed in _cut_parts(layer, x, z, attn, order, cuts, group_size, mlp_io):
        yield j, h + r * post_mlp(out - removed)
    for j, cut in enumerate(cuts):
        if not cut.keep:
            yield j, x


def relative_error_sums(
    layer: Any, chunks: list[tuple[Any, Any, Any, Any]], order: LayerOrder, cuts: tuple[LayerPlan, ...],
    group_size: int, where: str, mlp_io: list[tuple[Any, Any]] | None = None,
) -> tuple[list[float], int]:  # fmt: skip
    """``sum_t ||Y'_t - Y_t||^2 / ||Y_t||^2`` of each cut of one layer over ``chunks`` (per chunk: block input,
    o_proj input and output, block output; ``mlp_io``: per chunk, ``cut_outputs``') and the token count: the
    relative block errors before the mean (what ranks add). Checks that the uncut block rebuilt from its parts is
    its output. Where nothing normalises the MLP's output and the attention is whole, ``Y' - Y`` is
    ``-r removed`` (``_cut_parts``) and the cut output is never formed."""
    torch = require("torch", "hf")
    whole = _whole(order)
    r = _residual_multiplier(layer)
    post_mlp = _block_norms(layer)[2]
    sums, tokens = [0.0] * len(cuts), 0
    for (x, z, attn, y), io in _stacked(chunks, mlp_io):
        stream = _squared_norms(y).clamp_min(torch.finfo(torch.float64).tiny)
        for j, h, out, removed in _cut_parts(layer, x, z, attn, order, (*cuts, whole), group_size, io):
            if j == len(cuts):  # the uncut block rebuilt from its parts (removed is 0) must be its output
                error = float((_squared_norms(h + r * post_mlp(out) - y) / stream).sum())
                if error > _reconstruction_rtol(y) ** 2 * len(y):
                    raise UnsupportedArchitectureError(
                        f"{where}: the block's output is not h + r post(mlp(pre(h))), h = x + r post(attn) (relative "
                        f"error {error / len(y):.2e}); --score measured supports LLaMA-style pre-norm and OLMo 2-style "
                        "post-norm blocks"
                    )
            elif cuts[j] == whole:
                continue
            elif post_mlp is _identity and cuts[j].kv_groups == whole.kv_groups:
                sums[j] += float((_squared_norms(r * removed) / stream).sum())
            else:
                delta = h + r * post_mlp(out - removed) - y
                sums[j] += float((_squared_norms(delta) / stream).sum())
        for j, cut in enumerate(cuts):
            if not cut.keep:
                sums[j] += float((_squared_norms(x - y) / stream).sum())
        tokens += len(y)
    return sums, tokens


def _stacked(chunks: list[tuple[Any, ...]], mlp_io: list[tuple[Any, Any]] | None):
    """``(chunk, mlp_io)`` pairs with consecutive chunks' tensors joined along the tokens, up to
    ``PROBE_BATCH_TOKENS`` a pair (at least one chunk): the block errors are per token, so fewer, larger products."""
    torch = require("torch", "hf")
    group: list[int] = []
    for n, chunk in enumerate(chunks):
        group.append(n)
        last = n + 1 == len(chunks)
        if last or sum(len(chunks[m][0]) for m in group) + len(chunks[n + 1][0]) > PROBE_BATCH_TOKENS:
            joined = tuple(torch.cat([chunks[m][k] for m in group]) for k in range(len(chunk)))
            io = None if mlp_io is None else tuple(torch.cat([mlp_io[m][k] for m in group]) for k in range(2))
            yield joined, io
            group = []


def _squared_norms(t: Any) -> Any:
    """Per-row ``||t||^2`` in float64, the squares summed in float32 (the rows are a few thousand features)."""
    torch = require("torch", "hf")
    return torch.linalg.vecdot(t, t).double() if t.dtype == torch.float32 else _squared_norms(t.float())


def _whole(order: LayerOrder) -> LayerPlan:
    """The uncut layer of ``order``: every FFN channel and KV group kept."""
    return LayerPlan(ffn=len(order.ffn), kv_groups=len(order.kv_groups))


def _reconstruction_rtol(tensor: Any) -> float:
    torch = require("torch", "hf")
    return _RECONSTRUCTION_RTOL if tensor.dtype in (torch.float32, torch.float64) else _RECONSTRUCTION_RTOL_HALF


def anchor_cuts(cuts: tuple[LayerPlan, ...], probe_widths: int = 1) -> list[int]:
    """The cuts whose LM loss is measured: the narrowest FFN option with the most KV groups, with ``probe_widths``
    2 also the FFN option of those KV groups nearest the middle of the narrowest and the full width, and dropping
    the layer when the table has it."""
    kept = [j for j, cut in enumerate(cuts) if cut.keep]
    narrowest = min(kept, key=lambda j: (cuts[j].ffn, -cuts[j].kv_groups)) if kept else None
    middle = None
    if probe_widths == 2 and narrowest is not None:
        low, groups = cuts[narrowest].ffn, cuts[narrowest].kv_groups
        high = max(cuts[j].ffn for j in kept)
        between = [j for j in kept if cuts[j].kv_groups == groups and low < cuts[j].ffn < high]
        middle = min(between, key=lambda j: abs(2 * cuts[j].ffn - low - high), default=None)
    dropped = (j for j, cut in enumerate(cuts) if not cut.keep)
    return [j for j in (narrowest, middle, *dropped) if j is not None]


def scaled_errors(shape: list[float], measured: dict[int, float], row: tuple[LayerPlan, ...]) -> list[float]:
    """One layer's table from its options' block-error ``shape`` and the loss ``measured`` at its anchors: a
    dropped layer is its own measurement; a kept option's damage is piecewise linear in its block error through
    (0, 0) and the kept anchors (made non-decreasing), extended past the last anchor through the origin's line."""
    points = sorted((shape[j], e) for j, e in measured.items() if row[j].keep and shape[j] > 0)
    errors = []
    for j, cut in enumerate(row):
        if not cut.keep:
            errors.append(measured[j])
            continue
        r, (r0, e0), damage = shape[j], (0.0, 0.0), None
        for r1, e1 in points:
            e1 = max(e0, e1)
            if r <= r1:
                damage = e0 + (e1 - e0) * (r - r0) / (r1 - r0) if r1 > r0 else e1
                break
            r0, e0 = r1, e1
        errors.append(damage if damage is not None else (e0 * r / r0 if r0 > 0 else 0.0))
    return errors


def _run_recorded(layer: Any, inputs: list[Any], run: Callable[[Any], Any], with_scores: bool, capture: bool = True):
    """Run every chunk through ``layer``; returns the outputs, the captured (o_proj input, output) and (down_proj
    input, output) per chunk when ``capture``, and the activation sums (``selection.record_hooks``) when
    ``with_scores``."""
    captured: list[tuple[Any, Any]] = []
    mlp_io: list[tuple[Any, Any]] = []
    sums = [None, None]
    hooks = (
        [
            layer.self_attn.o_proj.register_forward_hook(lambda m, a, out: captured.append((a[0][0], out[0]))),
            layer.mlp.down_proj.register_forward_hook(lambda m, a, out: mlp_io.append((a[0][0], out[0]))),
        ]
        if capture
        else []
    )
    outputs = run_hooked([*hooks, *(record_hooks(layer, sums) if with_scores else ())], run, inputs)
    return outputs, captured, mlp_io, sums


def _logits(norm: Any, head: Any, h: Any, softcap: float | None, stride: int = 1) -> Any:
    """float32 next-token logits of one chunk's hidden states at every ``stride``-th position but the last (the
    norm is per position); soft-capped to ``softcap tanh(logits / softcap)`` when given (Gemma 2)."""
    torch = require("torch", "hf")
    logits = (norm(h[:, :-1:stride])[0] @ head.T).float()  # the loss in float32 whatever the compute dtype
    return softcap * torch.tanh(logits / softcap) if softcap else logits


def _clean_references(norm: Any, head: Any, hidden: list[Any], chunks: list[int], ids: Any, seq_len: int,
                      softcap: float | None, target: str, stride: int = 1) -> list[Any]:  # fmt: skip
    """Per probing chunk, what a probe is compared with at every ``stride``-th position: the clean model's LM loss
    ([P], ``target`` "loss"), or its next-token probabilities p ([P, V]) with ``_kl_sums``' offset ([P], "kl")."""
    torch = require("torch", "hf")
    references = []
    for n, h in zip(chunks, hidden, strict=True):
        logits = _logits(norm, head, h, softcap, stride)
        if target == "loss":
            targets = ids[n * seq_len + 1 : n * seq_len + h.shape[1]][::stride].to(h.device)
            references.append(torch.nn.functional.cross_entropy(logits, targets, reduction="none"))
        else:
            log_p = torch.log_softmax(logits, dim=-1)
            p, normaliser = log_p.exp(), torch.logsumexp(logits, dim=-1).double()
            offset = torch.linalg.vecdot(p, log_p).double() + normaliser * (p.double().sum(-1) - 1)
            references.append((p, offset))
    return references


def _kl_sums(reference: tuple[Any, Any], logits: Any) -> float:
    """``sum_t KL(p_t || softmax(logits_t))`` over the positions of ``logits``; ``reference``: the dense model's
    probabilities p and ``sum p log p + logsumexp(dense logits) (sum p - 1)`` per position (``_clean_references``).
    ``KL = sum p log p - p . logits + logsumexp(logits)``: one pass over the vocabulary instead of a log-softmax and
    a KL pass (after the LM head the probes' largest cost). The offset's second term corrects for float32 ``p`` not
    summing to 1, which would otherwise bias each position by about 1e-4 nats."""
    torch = require("torch", "hf")
    p, offset = reference[0][: len(logits)], reference[1][: len(logits)]
    return float((offset - torch.linalg.vecdot(p, logits).double() + torch.logsumexp(logits, dim=-1).double()).sum())


def _probe_damage(norm: Any, head: Any, probe: list[tuple[int, Any]], references: list[Any], chunks: list[int],
                  ids: Any, seq_len: int, softcap: float | None, target: str,
                  stride: int = 1) -> tuple[float, float, int]:  # fmt: skip
    """(the probe's summed loss, the clean model's on the same positions, scored positions) of one probe stream
    ``probe`` (pairs of an index into ``chunks`` and a hidden-state prefix of that chunk), at every ``stride``-th
    position. For ``target`` "kl" the first is the summed KL(dense || cut) and the second 0."""
    torch = require("torch", "hf")
    cut_sum, clean_sum, count = 0.0, 0.0, 0
    for at, h in probe:
        logits = _logits(norm, head, h, softcap, stride)
        if target == "loss":
            start = chunks[at] * seq_len
            targets = ids[start + 1 : start + h.shape[1]][::stride].to(h.device)
            cut_sum += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            clean_sum += float(references[at][: len(logits)].sum())
        else:
            cut_sum += _kl_sums(references[at], logits)
        count += len(logits)
    return cut_sum, clean_sum, count


def probe_token_count(probe_tokens: int, probe_depth: int, later_layers: int) -> int:
    """Tokens on which the probe of a layer with ``later_layers`` layers after it is carried: ``probe_tokens``
    within ``probe_depth`` layers of the head, else ``probe_tokens * probe_depth / later_layers`` (at least
    ``MIN_PROBE_TOKENS``), so no probe costs more than ``probe_depth`` layers of ``probe_tokens`` tokens and the
    probes grow as L, not L^2. ``probe_depth`` 0: every probe on ``probe_tokens`` tokens."""
    if probe_depth == 0 or later_layers <= probe_depth:
        return probe_tokens
    return min(probe_tokens, max(MIN_PROBE_TOKENS, math.ceil(probe_tokens * probe_depth / later_layers)))


def _prefix_lengths(chunks: list[int], lengths: list[int], seq_len: int, tokens: int) -> list[int]:
    """How many tokens of each of ``chunks`` (numbered in the text, of ``lengths`` tokens) lie in the text's first
    ``tokens``; a prefix of one token predicts nothing and counts as none."""
    spans = [max(0, min(length, tokens - n * seq_len)) for n, length in zip(chunks, lengths, strict=True)]
    return [span if span > 1 else 0 for span in spans]


def measure_errors(
    base: BaseModel,
    ids: Any,
    seq_len: int,
    cuts: list[list[LayerPlan]],
    orders: list[LayerOrder] | None,
    probes: ProbeConfig | None = None,
    *,
    progress: bool = True,
    compute: Compute | None = None,
    ranks: Ranks | None = None,
    plan: tuple[int, ...] | None = None,
) -> tuple[list[list[float]], dict[str, Any]]:
    """The damage of every cut of every layer (nats of LM loss) over the tokens ``ids`` (1-D) in chunks of
    ``seq_len``, in one forward walk over the layers (one layer's weights at a time), and what was measured.

    Per layer: the relative block error of every cut on all tokens (its shape), and the damage of the anchor cuts
    (``anchor_cuts`` of ``probes.widths``) on the first ``probes.tokens`` tokens (fewer for early layers:
    ``probes.depth``, ``probe_token_count``): their perturbed hidden states are carried through every later layer
    as it is loaded, then through the final norm and LM head, and compared with the clean model's on the same
    positions (every ``probes.stride``-th; all are carried: the attention needs them), as the LM loss increase or,
    ``probes.target`` "kl", the KL divergence from the dense model's next-token distribution. The kept options'
    errors follow their block error through the anchors' damage (``scaled_errors``; one anchor: a scaling);
    dropping a layer gets its own measured damage. ``probes``: default ``ProbeConfig()``, the exact measure.
    ``orders``: the channel orders extraction keeps; None computes the ``activation`` orders in the same pass.
    ``compute``: where the layers run and in which dtype (default float32 on the CPU). ``ranks``: the processes
    of a data-parallel run; each takes every ``count``-th chunk and the sums are added over ranks (every rank
    returns the same table).

    ``plan`` (one option index per layer): each layer measured with the others cut as the plan says (``_ProbeWalk``;
    the dense model is walked beside it for the references and ``activation`` orders); the record adds the plan's
    own damage on all probe tokens (``plan_damage``)."""
    from nsc_prune.hf.progress import progress as bar
    from nsc_prune.hf.weights.streaming import StreamedDecoder

    torch = require("torch", "hf")
    ranks, probes = ranks or Ranks(), probes or ProbeConfig()
    probe_chunks = max(1, math.ceil(probes.tokens / seq_len))
    mine = ranks.mine(math.ceil(len(ids) / seq_len))  # the chunks of this rank, ascending
    probing = [n for n in mine if n < probe_chunks]  # and those on which the loss is measured: its first ones
    lengths = [min(seq_len, len(ids) - n * seq_len) for n in probing]
    probe_counts = [probe_token_count(probes.tokens, probes.depth, len(cuts) - 1 - i) for i in range(len(cuts))]
    shape_sums, walk = [], _ProbeWalk(plan, base.group_size)
    with StreamedDecoder(base, compute) as model, torch.no_grad():
        hidden = model.embed(ids, seq_len, mine)
        dense = hidden if orders is None else hidden[: len(probing)]  # under a plan: the orders and references
        for i in bar(range(len(cuts)), "sensitivity table", "layer") if progress and ranks.main else range(len(cuts)):
            with model.layer(i) as layer:
                outputs, captured, mlp_io, sums = _run_recorded(
                    layer, hidden, model.run, orders is None and plan is None
                )
                if plan is not None:
                    dense, _, _, sums = _run_recorded(layer, dense, model.run, orders is None, capture=False)
                order = orders[i] if orders is not None else _ranked_order(layer, sums, len(ids), base, ranks)
                chunks = [(h[0], z, attn, y[0]) for h, (z, attn), y in zip(hidden, captured, outputs, strict=True)]
                row = tuple(cuts[i])
                shape_sums.append(relative_error_sums(layer, chunks, order, row, base.group_size, f"layer {i}", mlp_io))
                spans = _prefix_lengths(probing, lengths, seq_len, probe_counts[i])
                hidden = walk.layer(model, layer, order, row, i, chunks, mlp_io, outputs, spans, probes.widths)
        clean_hidden = (dense if plan is not None else hidden)[: len(probing)]
        streams = walk.streams(hidden, len(probing))
        sums = _headed_sums(model, clean_hidden, streams, probing, ids, seq_len, probes.target, probes.stride)
    summed = ranks.sum_floats(sums)
    shapes = _summed_means(shape_sums, ranks)
    increases = [(cut - reference) / max(count, 1) for cut, reference, count in _triples(summed[2:])]
    errors = [
        scaled_errors(shape, measured, tuple(row))
        for shape, measured, row in zip(shapes, walk.anchor_damage(increases), cuts, strict=True)
    ]
    available = min(len(ids), probe_chunks * seq_len)
    record = {"probe_tokens": available, "probe_depth": probes.depth, "probe_widths": probes.widths}
    record["probe_stride"] = probes.stride
    record["probe_tokens_per_layer"] = [min(count, available) for count in probe_counts]
    record["probe_clean_loss"] = summed[0] / max(summed[1], 1)
    if plan is not None:
        record |= {"conditioned_on": list(plan), "plan_damage": increases[-1]}
    return errors, record


def _headed_sums(model: Any, clean_hidden: list[Any], streams: list[list[tuple[int, Any]]], probing: list[int],
                 ids: Any, seq_len: int, target: str, stride: int) -> list[float]:  # fmt: skip
    """Every probe stream through the final norm and LM head, against the clean model's ``clean_hidden``: the
    clean model's (summed loss, scored positions), then each stream's ``_probe_damage`` triple, flat (what ranks
    add)."""
    (norm, head), cap = model.head(), model.logit_softcap
    references = _clean_references(norm, head, clean_hidden, probing, ids, seq_len, cap, target, stride)
    clean = _lm_loss_totals(references) if target == "loss" else (0.0, 0)
    damage = [_probe_damage(norm, head, p, references, probing, ids, seq_len, cap, target, stride) for p in streams]
    return [*clean, *(value for triple in damage for value in triple)]


class _ProbeWalk:
    """The probe streams of one walk over the layers, and, for a plan-conditioned table, the planned model.

    Each layer opens one stream per anchor cut (``anchor_cuts``): the cut block's output on a prefix of each
    probing chunk, carried through every later layer. Under a ``plan`` the later layers are cut as it says, the
    walked stream is the planned model's, and each layer also measures its whole width (the anchors' zero); a
    measurement whose cut is the plan's own is read off the walked stream instead of carried (a prefix of the planned
    model's output)."""

    def __init__(self, plan: tuple[int, ...] | None, group_size: int):
        self.plan, self.group_size = plan, group_size
        self.probes: list[list[tuple[int, Any]]] = []  # (index into the probing chunks, hidden-state prefix)
        self.measured: list[list[tuple[int, Any]]] = []  # per layer: (anchor option or -1 for whole, source)

    def layer(self, model: Any, layer: Any, order: LayerOrder, row: tuple[LayerPlan, ...], i: int, chunks, mlp_io,
              outputs: list[Any], spans: list[int], probe_widths: int) -> list[Any]:  # fmt: skip
        """Carry the streams through layer ``i``, open its anchors' streams, and return the walked stream's next
        hidden states (the layer's outputs, cut by the plan when there is one)."""
        cut = row[self.plan[i]] if self.plan is not None else None
        whole = _whole(order)
        if cut is None or cut == whole:
            self.probes = _carried_together(model, self.probes)
        else:
            self.probes = [[(at, self._through(model, layer, order, cut, h)) for at, h in p] for p in self.probes]
        wanted = [(j, row[j]) for j in anchor_cuts(row, probe_widths)]
        wanted += [(-1, whole)] if self.plan is not None else []
        sources, carried = [], [w for w in wanted if w[1] != cut]
        streams = _anchor_streams(layer, chunks, mlp_io, spans, order, [c for _, c in carried], self.group_size)
        for (j, _), stream in zip(carried, streams, strict=True):
            sources.append((j, len(self.probes)))
            self.probes.append(stream)
        sources += [(j, ("walked", spans)) for j, option in wanted if option == cut]
        self.measured.append(sources)
        if cut is None or cut == whole:
            return outputs
        return [self._cut_output(layer, order, cut, chunk, io) for chunk, io in zip(chunks, mlp_io, strict=True)]

    def _cut_output(self, layer: Any, order: LayerOrder, cut: LayerPlan, chunk, io) -> Any:
        x, z, attn, _ = chunk
        return next(cut_outputs(layer, x, z, attn, order, (cut,), self.group_size, io))[1][None]

    def _through(self, model: Any, layer: Any, order: LayerOrder, cut: LayerPlan | None, h: Any) -> Any:
        """``h`` through the layer in place, cut as ``cut`` says (None or whole: the layer as it is)."""
        if cut is None or cut == _whole(order):
            return model.run(h)
        if not cut.keep:
            return h
        outputs, captured, mlp_io, _ = _run_recorded(layer, [h], model.run, False)
        (z, attn), io = captured[0], mlp_io[0]
        return self._cut_output(layer, order, cut, (h[0], z, attn, outputs[0][0]), io)

    def streams(self, hidden: list[Any], probing: int) -> list[list[tuple[int, Any]]]:
        """Every measurement's stream, in ``measured`` order, then (under a plan) the planned model's on all probe
        tokens; a walked measurement is the walked stream's prefixes."""
        out = []
        for sources in self.measured:
            for _, source in sources:
                if isinstance(source, int):
                    out.append(self.probes[source])
                else:
                    spans = source[1]
                    out.append([(at, hidden[at][:, :m]) for at, m in enumerate(spans) if m > 0])
        if self.plan is not None:
            out.append([(at, hidden[at]) for at in range(probing)])
        return out

    def anchor_damage(self, increases: list[float]) -> list[dict[int, float]]:
        """Per layer, each anchor option's measured damage (``streams`` order in ``increases``): its increase,
        less the whole layer's in the same plan, clamped at 0 (a measured gain is noise, not a free cut)."""
        values, at = [], 0
        for sources in self.measured:
            found = dict(zip((j for j, _ in sources), increases[at : at + len(sources)], strict=True))
            at += len(sources)
            zero = found.pop(-1, 0.0)
            values.append({j: max(0.0, e - zero) for j, e in found.items()})
        return values


def _carried_together(model: Any, probes: list[list[tuple[int, Any]]]) -> list[list[tuple[int, Any]]]:
    """Every probe stream's prefixes through the (uncut) layer in place, those of one chunk and length stacked in
    batches of at most ``PROBE_BATCH_TOKENS`` tokens: fewer, larger forward calls, the same outputs."""
    torch = require("torch", "hf")
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s, probe in enumerate(probes):
        for e, (at, h) in enumerate(probe):
            groups.setdefault((at, h.shape[1]), []).append((s, e))
    carried = [list(probe) for probe in probes]
    for (_, tokens), members in groups.items():
        size = max(1, PROBE_BATCH_TOKENS // tokens)
        for start in range(0, len(members), size):
            batch = members[start : start + size]
            outputs = model.run(torch.cat([probes[s][e][1] for s, e in batch]))
            for (s, e), h in zip(batch, outputs.split(1), strict=True):
                carried[s][e] = (carried[s][e][0], h)
    return carried


def _anchor_streams(layer: Any, chunks: list[tuple[Any, Any, Any, Any]], mlp_io: list[tuple[Any, Any]],
                    spans: list[int], order: LayerOrder, anchors: list[LayerPlan], group_size: int):  # fmt: skip
    """One new probe stream per anchor cut of this layer: ``(index into the probing chunks, the cut block's output
    on that chunk's first ``spans[index]`` tokens)``. The probing chunks are the first ``len(spans)`` of
    ``chunks``; those with no span are left out."""
    streams: list[list[tuple[int, Any]]] = [[] for _ in anchors]
    for at, ((x, z, attn, _), (act, out), m) in enumerate(zip(chunks, mlp_io, spans)):
        if m == 0:
            continue
        io = (act[:m], out[:m])
        for j, y_cut in cut_outputs(layer, x[:m], z[:m], attn[:m], order, tuple(anchors), group_size, io):
            streams[j].append((at, y_cut[None]))
    return streams


def _lm_loss_totals(references: list[Any]) -> tuple[float, int]:
    """(summed clean LM loss, predicted positions) over the probing chunks of this rank."""
    return float(sum(float(r.sum()) for r in references)), sum(len(r) for r in references)


def _triples(flat: list[float]) -> list[tuple[float, float, float]]:
    return list(zip(flat[0::3], flat[1::3], flat[2::3], strict=True))


def _ranked_order(layer: Any, sums: list[Any], tokens: int, base: BaseModel, ranks: Ranks) -> LayerOrder:
    """The ``activation`` order of one layer from every rank's activation sums (``selection.record_hooks``)."""
    torch = require("torch", "hf")
    device = layer.mlp.down_proj.weight.device
    sizes = (layer.mlp.down_proj.in_features, layer.self_attn.o_proj.in_features // layer.self_attn.head_dim)
    sums = [s if s is not None else torch.zeros(n, dtype=torch.float64, device=device) for s, n in zip(sums, sizes)]
    return orders_from_scores([mean_scores([ranks.sum(s) for s in sums], tokens, layer)], base.group_size)[0]


def _summed_means(per_layer: list[tuple[list[float], int]], ranks: Ranks) -> list[list[float]]:
    """Each layer's per-cut means from every rank's ``relative_error_sums``, in one reduction."""
    flat = ranks.sum_floats([value for sums, tokens in per_layer for value in (*sums, tokens)])
    means, at = [], 0
    for sums, _ in per_layer:
        tokens = flat[at + len(sums)]
        means.append([s / max(tokens, 1) for s in flat[at : at + len(sums)]])
        at += len(sums) + 1
    return means


# ---------------------------------------------------------------------------------------------- the cached table


def table_key(base: BaseModel, cuts: list[list[LayerPlan]], config: SensitivityConfig) -> dict[str, Any]:
    """What a table depends on: the measure, the weights, the calibration text and settings, the selection and
    the option grid. Equal keys mean an equal table."""
    from nsc_prune._io import sha256_file

    grid = json.dumps([[[c.ffn, c.kv_groups, c.keep] for c in row] for row in cuts], separators=(",", ":"))
    tokenizer = Path(config.tokenizer) if config.tokenizer else base.folder
    return {
        "format": TABLE_FORMAT,
        "measure": MEASURE if config.target == "loss" else MEASURE_KL,
        "probe_tokens": config.probe_tokens,
        **({"probe_depth": config.probe_depth} if config.probe_depth else {}),  # uncapped tables keep their old key
        **({"probe_widths": config.probe_widths} if config.probe_widths != 1 else {}),
        **({"probe_stride": config.probe_stride} if config.probe_stride != 1 else {}),
        "weights": weights_fingerprint(base.folder, base.tensors),
        "calib_sha256": sha256_file(config.calib),
        "calib_tokens": config.calib_tokens,
        "seq_len": config.seq_len,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "selection": config.selection,
        "grid_sha256": hashlib.sha256(grid.encode()).hexdigest(),
        # float32 tables keep the key they had before --calib-dtype existed; the device does not change a table
        **({"dtype": config.compute.dtype} if config.compute.dtype != "float32" else {}),
    }


def default_table_path(key: dict[str, Any]) -> Path:
    """Where the cache keeps the table of ``key``: ``$NSC_PRUNE_CACHE/sensitivity/<key digest>.json``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return _files.cache_dir("sensitivity") / f"{digest[:32]}.json"


def _read_table(path: Path) -> dict[str, Any]:
    """A table file's JSON; ValueError when it is not a format-``TABLE_FORMAT`` table with a key and a record."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        raise ValueError(f"not a format-{TABLE_FORMAT} sensitivity table")
    if not isinstance(data.get("key"), dict) or not isinstance(data.get("record"), dict):
        raise ValueError("it has no key or record")
    return data


def _table_errors(data: dict[str, Any], cuts: list[list[LayerPlan]]) -> list[list[float]]:
    """The errors of a table read for ``cuts``; ValueError when they are not one finite, non-negative number for
    each option of the space."""
    layers = data.get("layers")
    if not isinstance(layers, list) or [len(row) for row in layers] != [len(row) for row in cuts]:
        raise ValueError("its layers do not have one entry per option of the space")
    errors = []
    for row, cut_row in zip(layers, cuts, strict=True):
        values = []
        for entry, cut in zip(row, cut_row, strict=True):
            error = entry.get("error") if isinstance(entry, dict) else None
            if [entry.get("ffn"), entry.get("kv_groups"), entry.get("keep")] != [cut.ffn, cut.kv_groups, cut.keep]:
                raise ValueError(f"its options are not the space's ({entry} against {cut})")
            if isinstance(error, bool) or not isinstance(error, int | float) or not math.isfinite(error) or error < 0:
                raise ValueError(f"error {error!r} is not a finite non-negative number")
            values.append(float(error))
        errors.append(values)
    return errors


def _write_table(path: Path, key: dict[str, Any], cuts: list[list[LayerPlan]], errors, record) -> None:
    layers = [
        [{"ffn": c.ffn, "kv_groups": c.kv_groups, "keep": c.keep, "error": e} for c, e in zip(row, err, strict=True)]
        for row, err in zip(cuts, errors, strict=True)
    ]
    atomic_write_text(path, to_json({"format": TABLE_FORMAT, "key": key, "record": record, "layers": layers}))


def _cached_table(
    path: Path, key: dict[str, Any], cuts: list[list[LayerPlan]], explicit: bool
) -> SensitivityTable | None:
    """The table stored at ``path`` when it was measured for ``key``; None (with a warning) when it is an unreadable
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
        warnings.warn(f"sensitivity table {path} is unreadable ({err}); measuring it again", stacklevel=3)
        return None
    if errors is not None:
        record = data["record"] | {"table": str(path), "cache_hit": True}
        return SensitivityTable(_tuples(cuts), _tuples(errors), record)
    changed = sorted(name for name in key if found.get(name) != key[name])
    if explicit:
        raise ConfigError(
            f"--sensitivity-table {path} was measured for other inputs (different {', '.join(changed)}); pass another "
            "--sensitivity-table path (or none, to use the cache) or delete that file to measure again"
        )
    warnings.warn(f"sensitivity cache {path} is for other inputs ({', '.join(changed)}); measuring again", stacklevel=3)
    return None


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
    from nsc_prune.hf.weights.base import check_weights_match, open_base

    cuts = elastic_layer_plans(space, "--score measured")
    base = open_base(weights, job="--score measured")
    refuse_kv_cuts(base.config.get("model_type"), cuts, base.kv_heads, "--score measured")
    check_weights_match(base.folder, base.tensors, model_config)
    config.compute.check()
    read_calibration_text(config.calib)  # a missing, empty or binary file: one clear error before any hashing
    key = table_key(base, cuts, config) | ({"conditioned_on": list(plan)} if plan is not None else {})
    if plan is not None:
        _check_plan(plan, cuts)
        table = None
    ranks = current_ranks(config.compute.device)
    ranks.check_same("the inputs of the sensitivity table (weights, calibration text and settings, space)", key)
    path = Path(table) if table is not None else default_table_path(key)
    cached = _cached_table(path, key, cuts, explicit=table is not None) if path.is_file() else None
    if ranks.every(cached is not None):
        return cached
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
    if ranks.main:  # one writer; every rank holds the same reduced table
        _write_table(path, key, cuts, errors, record)
    return SensitivityTable(_tuples(cuts), _tuples(errors), record | {"table": str(path), "cache_hit": False})


def _check_plan(plan: tuple[int, ...], cuts: list[list[LayerPlan]]) -> None:
    if len(plan) != len(cuts) or not all(is_int(j) and 0 <= j < len(row) for j, row in zip(plan, cuts)):
        raise ConfigError(must_be("plan", f"one option index per layer of the space ({len(cuts)} layers)", plan))


def _tuples(rows: list[list[Any]]) -> tuple[tuple[Any, ...], ...]:
    return tuple(tuple(row) for row in rows)
