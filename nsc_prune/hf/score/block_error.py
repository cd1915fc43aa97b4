"""A cut layer's block output and its relative error, formed from the uncut layer's parts: the measured score's
cheap half (``nsc_prune.hf.score.sensitivity``). Per option only the removed units' contribution is subtracted
(prefix sums along the channel order extraction keeps), and the MLP is re-run once per KV-group count."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from nsc_prune.errors import UnsupportedArchitectureError, require
from nsc_prune.hf.cut.keep import LayerOrder
from nsc_prune.plan import LayerPlan

BATCH_TOKENS = 2048  # tokens a probe batch or a block-error product holds (memory: 4 chunks' activations)
_RECONSTRUCTION_RTOL = 1e-3  # the block rebuilt from its parts must match its own output (float32 round-off)
_RECONSTRUCTION_RTOL_HALF = 3e-2  # the same in bfloat16 / float16 (8 and 11 mantissa bits)


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
    whole = whole_layer(order)
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
    ``BATCH_TOKENS`` a pair (at least one chunk): the block errors are per token, so fewer, larger products."""
    torch = require("torch", "hf")
    group: list[int] = []
    for n, chunk in enumerate(chunks):
        group.append(n)
        last = n + 1 == len(chunks)
        if last or sum(len(chunks[m][0]) for m in group) + len(chunks[n + 1][0]) > BATCH_TOKENS:
            joined = tuple(torch.cat([chunks[m][k] for m in group]) for k in range(len(chunk)))
            io = None if mlp_io is None else tuple(torch.cat([mlp_io[m][k] for m in group]) for k in range(2))
            yield joined, io
            group = []


def _squared_norms(t: Any) -> Any:
    """Per-row ``||t||^2`` in float64, the squares summed in float32 (the rows are a few thousand features)."""
    torch = require("torch", "hf")
    return torch.linalg.vecdot(t, t).double() if t.dtype == torch.float32 else _squared_norms(t.float())


def whole_layer(order: LayerOrder) -> LayerPlan:
    """The uncut layer of ``order``: every FFN channel and KV group kept."""
    return LayerPlan(ffn=len(order.ffn), kv_groups=len(order.kv_groups))


def _reconstruction_rtol(tensor: Any) -> float:
    torch = require("torch", "hf")
    return _RECONSTRUCTION_RTOL if tensor.dtype in (torch.float32, torch.float64) else _RECONSTRUCTION_RTOL_HALF
