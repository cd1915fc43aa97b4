"""One walk over the layers that measures every option's damage (``measure_errors``): the block errors of every
cut on all calibration tokens, and the anchor cuts' probes carried through the later layers and the LM head.

A probe is the cut block's output on the first ``probe_tokens`` tokens, carried through every later layer as it is
loaded and scored against the dense model (the LM loss increase, or the KL divergence from its next-token
distribution). Probes of layers more than ``probe_depth`` layers from the head run on fewer tokens, so they cost
O(L) and not O(L^2) layer passes; they are scored at every ``probe_stride``-th position; probe streams of one length
pass a layer in one batch. The other options follow the shape of their block error through the anchors
(``scaled_errors``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nsc_prune._validation import is_int, must_be
from nsc_prune.choices import SENSITIVITY_TARGETS
from nsc_prune.errors import ConfigError, require
from nsc_prune.hf.cut.keep import LayerOrder
from nsc_prune.hf.cut.selection import mean_scores, orders_from_scores, record_hooks, run_hooked
from nsc_prune.hf.ranks import Ranks
from nsc_prune.hf.score.block_error import BATCH_TOKENS, cut_outputs, relative_error_sums, whole_layer
from nsc_prune.hf.weights.compute import Compute
from nsc_prune.plan import LayerPlan

if TYPE_CHECKING:
    from nsc_prune.hf.weights.base import BaseModel

PROBE_DEPTH = 6  # docs/sensitivity.md, "Cheaper probes": with PROBE_STRIDE 2, <= 3x an activation pass
PROBE_STRIDE = 2  # docs/sensitivity.md, "Cheaper probes": every other position halves the LM heads
MIN_PROBE_TOKENS = 32  # the fewest tokens a shortened probe is carried on (its loss is a mean over them)


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
        if not is_int(self.tokens) or self.tokens < 2:  # one token predicts nothing: every damage would read 0
            raise ConfigError(must_be("probe_tokens", "an integer >= 2 (a next token to predict)", self.tokens))
        if not is_int(self.depth) or self.depth < 0:
            raise ConfigError(must_be("probe_depth", "a non-negative integer (0: no cap)", self.depth))
        if self.target not in SENSITIVITY_TARGETS:
            raise ConfigError(must_be("target", f"one of {', '.join(SENSITIVITY_TARGETS)}", self.target))
        if self.widths not in (1, 2):
            raise ConfigError(must_be("probe_widths", "1 or 2 (None: 2 for kl, 1 for loss)", self.widths))
        if not is_int(self.stride) or self.stride < 1:
            raise ConfigError(must_be("probe_stride", "a positive integer (1: every position)", self.stride))


def anchor_cuts(cuts: tuple[LayerPlan, ...], probe_widths: int = 1, whole: LayerPlan | None = None) -> list[int]:
    """The cuts whose LM loss is measured: the narrowest FFN option with the most KV groups (where no option cuts the
    FFN, the fewest KV groups), with ``probe_widths`` 2 also the FFN option of those KV groups nearest the middle of
    the narrowest and the full width, and dropping the layer when the table has it. ``whole``, the uncut layer
    (default: the widest kept option), is never one: its damage is 0, and a table anchored on it read 0 throughout."""
    kept = [j for j, cut in enumerate(cuts) if cut.keep]
    if whole is None and kept:
        whole = cuts[max(kept, key=lambda j: (cuts[j].ffn, cuts[j].kv_groups))]
    cutting = [j for j in kept if cuts[j] != whole]
    narrowest = min(cutting, key=lambda j: (cuts[j].ffn, -cuts[j].kv_groups)) if cutting else None
    if narrowest is not None and whole is not None and cuts[narrowest].ffn >= whole.ffn:
        narrowest = min(cutting, key=lambda j: cuts[j].kv_groups)  # KV cuts alone: the others fall below it
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


def _probed(total: int, seq_len: int, tokens: int) -> int:
    """How many of a text's first ``tokens`` (of ``total``, in chunks of ``seq_len``) a probe carries, over all
    ranks: not a chunk's prefix of one token (``_prefix_lengths``)."""
    chunks = list(range(math.ceil(min(total, tokens) / seq_len)))
    return sum(_prefix_lengths(chunks, [min(seq_len, total - n * seq_len) for n in chunks], seq_len, tokens))


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
    shown = progress and ranks.main  # the layers' bar and the LM head's
    with StreamedDecoder(base, compute) as model, torch.no_grad():
        hidden = model.embed(ids, seq_len, mine)
        dense = hidden if orders is None else hidden[: len(probing)]  # under a plan: the orders and references
        for i in bar(range(len(cuts)), "sensitivity table", "layer") if shown else range(len(cuts)):
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
        probed = _prefix_lengths(probing, lengths, seq_len, probes.tokens)  # whole chunks carried it: cut to it
        clean_hidden = [h[:, :m] for h, m in zip(dense if plan is not None else hidden, probed)]
        streams = walk.streams(hidden, probed)
        sums = _headed_sums(model, clean_hidden, streams, probing, ids, seq_len, probes.target, probes.stride, shown)
    summed = ranks.sum_floats(sums)
    shapes = _summed_means(shape_sums, ranks)
    _check_finite([*summed, *(mean for row in shapes for mean in row)], compute)
    increases = [(cut - reference) / max(count, 1) for cut, reference, count in _triples(summed[2:])]
    errors = [
        scaled_errors(shape, measured, tuple(row))
        for shape, measured, row in zip(shapes, walk.anchor_damage(increases), cuts, strict=True)
    ]
    record = {"probe_tokens": _probed(len(ids), seq_len, probes.tokens), "probe_depth": probes.depth}
    record |= {"probe_widths": probes.widths, "probe_stride": probes.stride}
    record["probe_tokens_per_layer"] = [_probed(len(ids), seq_len, count) for count in probe_counts]
    record["probe_clean_loss"] = summed[0] / max(summed[1], 1)
    if plan is not None:
        record |= {"conditioned_on": list(plan), "plan_damage": increases[-1]}
    return errors, record


def _check_finite(values: list[float], compute: Compute | None) -> None:
    """ConfigError unless every measured sum is finite: NaN or inf in the weights (or a float type too narrow)
    would make every damage NaN, which the table would read as no damage."""
    if not all(math.isfinite(value) for value in values):
        dtype = (compute or Compute()).dtype
        raise ConfigError(
            f"the model's outputs on the calibration text are not finite (NaN or inf) in {dtype}: check the weights "
            "for NaN or inf values" + ("" if dtype == "float32" else ", or measure in float32 (--calib-dtype float32)")
        )


def _headed_sums(model: Any, clean_hidden: list[Any], streams: list[list[tuple[int, Any]]], probing: list[int],
                 ids: Any, seq_len: int, target: str, stride: int, shown: bool = False) -> list[float]:  # fmt: skip
    """Every probe stream through the final norm and LM head, against the clean model's ``clean_hidden``: the
    clean model's (summed loss, scored positions), then each stream's ``_probe_damage`` triple, flat (what ranks
    add); ``shown``: under a bar (a fifth of the table's time on SmolLM2, silent before)."""
    from nsc_prune.hf.progress import progress as bar

    (norm, head), cap = model.head(), model.logit_softcap
    references = _clean_references(norm, head, clean_hidden, probing, ids, seq_len, cap, target, stride)
    clean = _lm_loss_totals(references) if target == "loss" else (0.0, 0)
    each = bar(streams, "sensitivity table: LM head", "probe") if shown else streams
    damage = [_probe_damage(norm, head, p, references, probing, ids, seq_len, cap, target, stride) for p in each]
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
        whole = whole_layer(order)
        if cut is None or cut == whole:
            self.probes = _carried_together(model, self.probes)
        else:
            self.probes = [[(at, self._through(model, layer, order, cut, h)) for at, h in p] for p in self.probes]
        wanted = [(j, row[j]) for j in anchor_cuts(row, probe_widths, whole)]
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
        if cut is None or cut == whole_layer(order):
            return model.run(h)
        if not cut.keep:
            return h
        outputs, captured, mlp_io, _ = _run_recorded(layer, [h], model.run, False)
        (z, attn), io = captured[0], mlp_io[0]
        return self._cut_output(layer, order, cut, (h[0], z, attn, outputs[0][0]), io)

    def streams(self, hidden: list[Any], probed: list[int]) -> list[list[tuple[int, Any]]]:
        """Every measurement's stream, in ``measured`` order, then (under a plan) the planned model's on all probe
        tokens (``probed`` of each probing chunk); a walked measurement is the walked stream's prefixes."""
        out = []
        for sources in self.measured:
            for _, source in sources:
                if isinstance(source, int):
                    out.append(self.probes[source])
                else:
                    spans = source[1]
                    out.append([(at, hidden[at][:, :m]) for at, m in enumerate(spans) if m > 0])
        if self.plan is not None:
            out.append([(at, hidden[at][:, :m]) for at, m in enumerate(probed) if m > 0])
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
    batches of at most ``BATCH_TOKENS`` tokens: fewer, larger forward calls, the same outputs."""
    torch = require("torch", "hf")
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s, probe in enumerate(probes):
        for e, (at, h) in enumerate(probe):
            groups.setdefault((at, h.shape[1]), []).append((s, e))
    carried = [list(probe) for probe in probes]
    for (_, tokens), members in groups.items():
        size = max(1, BATCH_TOKENS // tokens)
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
