"""What a subnet keeps: per-layer plans read from a Pareto point, checked against base and adapter.

The plan (from the search) says HOW MANY of each unit a layer keeps: FFN channels, KV groups (each with
its query heads, so GQA stays valid), LoRA ranks, or nothing (``keep=False`` drops the layer). A
``LayerOrder`` (from ``nsc_prune.selection``) says WHICH ones: units ranked most important first. The
kept units are the first ``k`` of the order, written in ascending index order. With the identity order
this is the LoNAS convention (DESIGN.md): the first ``k`` channels and first ``r`` ranks.

An index set is an ``int`` ``n`` when it is the prefix ``0..n-1`` (streamed without reading the rest),
else a sorted tuple of indices, or None for the whole axis.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nsc_prune.budget import parse_budget
from nsc_prune.errors import ConfigError, InfeasibleBudgetError, InvalidInputError
from nsc_prune.validation import is_int

if TYPE_CHECKING:
    from nsc_prune.adapter import LoraAdapter

_KNOWN_LAYER_KEYS = {"ffn", "lora_rank", "kv_heads", "keep"}


@dataclass(frozen=True)
class LayerPlan:
    """How much one decoder layer keeps: ``ffn`` FFN channels, ``kv_heads`` KV groups, ``lora_rank`` ranks."""

    ffn: int
    lora_rank: int | None = None  # None: the adapter's full rank (plans for plain models omit it)
    kv_heads: int | None = None  # None: the base's; else KV groups kept, each with its query heads
    keep: bool = True  # False drops the whole layer (ffn and kv_heads are then ignored)


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
class LayerKeep:
    """The kept index sets of one (kept) layer: FFN channels, and q / k-v projection rows."""

    ffn: Index
    q: Index
    kv: Index


def _index(chosen: list[int], full: int) -> Index:
    chosen = sorted(chosen)
    if len(chosen) == full:
        return None
    return len(chosen) if chosen == list(range(len(chosen))) else tuple(chosen)


def layer_keep(plan: LayerPlan, order: LayerOrder, group_size: int, head_dim: int) -> LayerKeep:
    """Index sets a kept layer keeps: the first ``plan.ffn`` channels and ``plan.kv_heads`` KV groups of
    ``order``; KV group ``g`` brings query heads ``g * group_size .. (g + 1) * group_size - 1``."""
    width, groups = len(order.ffn), len(order.kv_groups)
    kv = groups if plan.kv_heads is None else plan.kv_heads
    kept_groups = sorted(order.kv_groups[:kv])
    heads = [g * group_size + j for g in kept_groups for j in range(group_size)]
    q_rows = [h * head_dim + d for h in heads for d in range(head_dim)]
    kv_rows = [g * head_dim + d for g in kept_groups for d in range(head_dim)]
    return LayerKeep(
        ffn=_index(list(order.ffn[: plan.ffn]), width),
        q=_index(q_rows, groups * group_size * head_dim),
        kv=_index(kv_rows, groups * head_dim),
    )


COST_KINDS = ("params", "macs")  # what a Pareto point's cost can count (pareto.json "cost"/"kind")


def front_cost_kind(pareto: Mapping[str, Any]) -> str:
    """The cost the front was searched under: ``pareto["cost"]["kind"]`` (``params`` for files without one)."""
    kind = (pareto.get("cost") or {}).get("kind", "params")
    if kind not in COST_KINDS:
        raise ConfigError(f"the pareto file's cost kind must be one of {COST_KINDS}. Got {kind!r} instead; re-run the search")
    return kind


def select_point(pareto: Mapping[str, Any], point: int | None = None, budget: str | int | None = None) -> int:
    """Index of the chosen point: ``point``; else the largest point whose cost (of the front's kind,
    ``params`` or ``macs``) is <= ``budget``; else 'selected'. A percentage budget is of the largest
    point's cost of that kind (the full model), as in the search."""
    points = pareto["points"]
    if point is not None and budget is not None:
        raise InvalidInputError("pass either a point index or a budget, not both")
    if point is not None:
        if not -len(points) <= point < len(points):
            raise InvalidInputError(f"The 'point' parameter must be in [0, {len(points)}). Got {point} instead.")
        return point % len(points)
    if budget is not None:
        kind = front_cost_kind(pareto)
        costs = [int(p[kind]) for p in points]
        limit = budget if isinstance(budget, int) else parse_budget(budget, full=max(costs))
        fitting = [i for i, cost in enumerate(costs) if cost <= limit]
        if not fitting:
            raise InfeasibleBudgetError(
                f"no Pareto point fits a budget of {limit:,} {kind}; the smallest needs {min(costs):,} {kind}", min(costs)
            )
        return max(fitting, key=lambda i: (costs[i], -i))
    if isinstance(pareto.get("selected"), int):
        return select_point(pareto, point=pareto["selected"])
    raise InvalidInputError("pass --point N or --budget B: the pareto file has no 'selected' point")


def layer_plans(point: Mapping[str, Any]) -> list[LayerPlan]:
    """Per-layer plans from one Pareto point (axes nsc-prune cannot extract yet are refused)."""
    plans = []
    for i, layer in enumerate(point.get("layers") or []):
        unknown = sorted(set(layer) - _KNOWN_LAYER_KEYS)
        if unknown:
            warnings.warn(f"plan layer {i}: ignoring unknown keys {unknown} (written by a newer nsc-prune?)", stacklevel=2)
        ffn, rank, kv, keep = layer.get("ffn"), layer.get("lora_rank"), layer.get("kv_heads"), layer.get("keep", True)
        wrong = {key: value for key, value in (("ffn", ffn), ("lora_rank", rank), ("kv_heads", kv))
                 if not (is_int(value) or (value is None and key != "ffn"))}  # fmt: skip
        if not isinstance(keep, bool):
            wrong["keep"] = keep
        if wrong:
            got = ", ".join(f"{key}={value!r} ({type(value).__name__})" for key, value in wrong.items())
            raise ConfigError(
                f"plan layer {i}: 'ffn', 'lora_rank', 'kv_heads' must be integers and 'keep' a bool; got {got}. "
                "Re-run the search or fix the pareto file"
            )
        plans.append(LayerPlan(ffn=ffn, lora_rank=rank, kv_heads=kv, keep=keep))
    if not plans:
        raise ConfigError("the Pareto point has no 'layers' list")
    return plans


def check_same_model(pareto_config: Mapping[str, Any], base_config: Mapping[str, Any]) -> None:
    """Raise ConfigError when pareto.json was computed for another architecture than the base."""
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        if key in pareto_config and key in base_config and pareto_config[key] != base_config[key]:
            raise ConfigError(
                f"the plan was made for {key}={pareto_config[key]} but the base has {key}={base_config[key]}; "
                "pass the base the search was run for"
            )


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
        if plan.kv_heads is not None and not 1 <= plan.kv_heads <= kv:
            raise ConfigError(
                f"plan layer {i} keeps kv_heads={plan.kv_heads} KV groups; the base layer has {kv} (need 1..{kv}, "
                "whole groups with their query heads, or keep: false to drop the layer)"
            )
        if not 1 <= plan.ffn <= width:
            raise ConfigError(f"plan layer {i} keeps ffn={plan.ffn} channels; the base layer has {width} (need 1..{width})")
        if plan.lora_rank is None:
            continue
        if plan.lora_rank < 0:
            raise ConfigError(f"plan layer {i} has lora_rank={plan.lora_rank}; ranks are >= 0")
        if adapter is not None and plan.lora_rank > adapter.layer_rank(i):
            raise ConfigError(
                f"plan layer {i} keeps lora_rank={plan.lora_rank}; the adapter has rank {adapter.layer_rank(i)} there"
            )


def kept_block(module: str, keep: LayerKeep) -> tuple[Index, Index]:
    """(rows, cols) index sets of ``module``'s weight that a kept layer keeps; None keeps the whole axis."""
    return {
        "mlp.gate_proj": (keep.ffn, None), "mlp.up_proj": (keep.ffn, None), "mlp.down_proj": (None, keep.ffn),
        "self_attn.q_proj": (keep.q, None), "self_attn.k_proj": (keep.kv, None), "self_attn.v_proj": (keep.kv, None),
        "self_attn.o_proj": (None, keep.q),
    }.get(module, (None, None))  # fmt: skip
