"""What a subnet keeps: the kept index sets of each layer, from a plan and a channel order.

The plan (``nsc_prune.plan.LayerPlan``, from the search) says HOW MANY of each unit a layer keeps: FFN
channels, KV groups (each with its query heads, so GQA stays valid), LoRA ranks, or nothing (``keep=False``
drops the layer). A ``LayerOrder`` (from ``nsc_prune.hf.cut.selection``) says WHICH ones: units ranked most
important first. The kept units are the first ``k`` of the order, written in ascending index order. With the
identity order this is the LoNAS convention: the first ``k`` channels and first ``r`` ranks.

An index set is an ``int`` ``n`` when it is the prefix ``0..n-1`` (streamed without reading the rest),
else a sorted tuple of indices, or None for the whole axis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nsc_prune.core.spec import FUSED
from nsc_prune.errors import ConfigError
from nsc_prune.plan import LayerPlan

if TYPE_CHECKING:
    from nsc_prune.hf.weights.adapter import LoraAdapter


@dataclass(frozen=True)
class LayerOrder:
    """Which units of one layer matter most: permutations of the FFN channels and of the KV groups."""

    ffn: tuple[int, ...]
    kv_groups: tuple[int, ...]

    @classmethod
    def identity(cls, width: int, kv_groups: int) -> LayerOrder:
        return cls(tuple(range(width)), tuple(range(kv_groups)))


def identity_orders(widths: tuple[int, ...], kv_heads: tuple[int, ...]) -> list[LayerOrder]:
    """The LoNAS / ``first`` selection: every layer keeps its first channels and KV groups."""
    return [LayerOrder.identity(width, kv) for width, kv in zip(widths, kv_heads, strict=True)]


Index = int | tuple[int, ...] | None


@dataclass(frozen=True)
class LayerIndex:
    """The kept index sets of one (kept) layer: FFN channels, and q / k-v projection rows."""

    ffn: Index
    q: Index
    kv: Index
    sizes: tuple[int, int, int] = (0, 0, 0)  # the base layer's FFN channels, q rows, k (= v) rows


def _index(chosen: list[int], full: int) -> Index:
    chosen = sorted(chosen)
    if len(chosen) == full:
        return None
    return len(chosen) if chosen == list(range(len(chosen))) else tuple(chosen)


def layer_index(plan: LayerPlan, order: LayerOrder, group_size: int, head_dim: int) -> LayerIndex:
    """Index sets a kept layer keeps: the first ``plan.ffn`` channels and ``plan.kv_groups`` KV groups of
    ``order``; KV group ``g`` brings query heads ``g * group_size .. (g + 1) * group_size - 1``."""
    width, groups = len(order.ffn), len(order.kv_groups)
    kv = plan.groups_of(groups)
    kept_groups = sorted(order.kv_groups[:kv])
    heads = [g * group_size + j for g in kept_groups for j in range(group_size)]
    q_rows = [h * head_dim + d for h in heads for d in range(head_dim)]
    kv_rows = [g * head_dim + d for g in kept_groups for d in range(head_dim)]
    return LayerIndex(
        ffn=_index(list(order.ffn[: plan.ffn]), width),
        q=_index(q_rows, groups * group_size * head_dim),
        kv=_index(kv_rows, groups * head_dim),
        sizes=(width, groups * group_size * head_dim, groups * head_dim),
    )


def plan_rank(plan: LayerPlan, full: int, module: str = "", fixed_ranks: Mapping[str, int] | None = None) -> int:
    """The LoRA rank a kept layer's ``module`` (``mlp.down_proj``) keeps: for a projection a lonas space holds at its
    ``lora_rank`` (``fixed_ranks``, from ``nsc_prune.spaces.lonas.fixed_rank_modules``) that rank, else
    ``plan.lora_rank``, else ``full`` (never more than ``full``, the adapter's)."""
    name = module.rsplit(".", 1)[-1]
    if fixed_ranks and name in fixed_ranks:
        return min(fixed_ranks[name], full)
    return full if plan.lora_rank is None else plan.lora_rank


def check_plan_fits(
    plans: list[LayerPlan], widths: tuple[int, ...], kv_heads: tuple[int, ...], adapter: LoraAdapter | None
) -> None:
    """Raise ConfigError when the plan asks for more layers, channels or ranks than base and adapter have
    (``widths`` and ``kv_heads`` are the base's per layer)."""
    if len(plans) != len(widths):
        raise ConfigError(f"the plan has {len(plans)} layers but the base has {len(widths)}")
    if not any(plan.keep for plan in plans):
        raise ConfigError("the plan drops every layer; keep at least one")
    for i, (plan, width, kv) in enumerate(zip(plans, widths, kv_heads, strict=True)):
        if not plan.keep:
            continue
        if plan.kv_groups is not None and not 1 <= plan.kv_groups <= kv:
            raise ConfigError(
                f"plan layer {i} keeps kv_groups={plan.kv_groups} KV groups; the base layer has {kv} (need 1..{kv}, "
                "whole groups with their query heads, or keep: false to drop the layer)"
            )
        if not 1 <= plan.ffn <= width:
            raise ConfigError(
                f"plan layer {i} keeps ffn={plan.ffn} channels; the base layer has {width} (need 1..{width})"
            )
        if plan.lora_rank is None:
            continue
        if plan.lora_rank < 0:
            raise ConfigError(f"plan layer {i} has lora_rank={plan.lora_rank}; ranks are >= 0")
        limit = adapter.layer_rank(i) if adapter is not None else None
        if limit is not None and plan.lora_rank > limit:
            raise ConfigError(f"plan layer {i} keeps lora_rank={plan.lora_rank}; the adapter has rank {limit} there")


def _part_size(part: str, index: LayerIndex) -> int:
    ffn, q, kv = index.sizes
    return ffn if part.startswith("mlp.") else q if part == "self_attn.q_proj" else kv


def fused_rows(module: str, index: LayerIndex) -> tuple[Index, tuple[int, ...]]:
    """The kept rows of a fused weight (each part's kept rows, offset by the parts before it), and where they go
    in a full-size tensor (each part's kept rows first in its own block: the padded format)."""
    rows, at, offset = [], [], 0
    for part in FUSED[module]:
        kept, full = kept_block(part, index)[0], _part_size(part, index)
        kept = range(full) if kept is None else range(kept) if isinstance(kept, int) else kept
        rows += [offset + r for r in kept]
        at += range(offset, offset + len(kept))
        offset += full
    return _index(rows, offset), tuple(at)


def kept_block(module: str, index: LayerIndex) -> tuple[Index, Index]:
    """(rows, cols) index sets of ``module``'s weight that a kept layer keeps; None keeps the whole axis."""
    if module in FUSED:
        return fused_rows(module, index)[0], None
    return {
        "mlp.gate_proj": (index.ffn, None),
        "mlp.up_proj": (index.ffn, None),
        "mlp.down_proj": (None, index.ffn),
        "self_attn.q_proj": (index.q, None),
        "self_attn.k_proj": (index.kv, None),
        "self_attn.v_proj": (index.kv, None),
        "self_attn.o_proj": (None, index.q),
    }.get(module, (None, None))
