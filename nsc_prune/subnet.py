"""What a subnet keeps: per-layer plans read from a Pareto point, checked against base and adapter.

LoNAS convention (DESIGN.md): a layer with FFN width ``k`` keeps the first ``k`` channels (gate/up rows,
down columns) and LoRA rank ``r`` keeps the first ``r`` ranks. Axes added later (``kv_heads``, layer
dropping with ``keep``) become fields of ``LayerPlan`` and cases of ``kept_block``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nsc_prune.budget import parse_budget
from nsc_prune.errors import ConfigError, InfeasibleBudgetError, InvalidInputError

if TYPE_CHECKING:
    from nsc_prune.adapter import LoraAdapter

_KNOWN_LAYER_KEYS = {"ffn", "lora_rank", "kv_heads", "keep"}


@dataclass(frozen=True)
class LayerPlan:
    """What one decoder layer keeps: its first ``ffn`` FFN channels and first ``lora_rank`` LoRA ranks."""

    ffn: int
    lora_rank: int | None = None  # None: the adapter's full rank (plans for plain models omit it)
    kv_heads: int | None = None  # None: the base's; other values are not extractable yet
    keep: bool = True  # False drops the layer; not extractable yet


def select_point(pareto: Mapping[str, Any], point: int | None = None, budget: str | int | None = None) -> int:
    """Index of the chosen point: ``point``; else the largest point with params <= ``budget``; else 'selected'."""
    points = pareto["points"]
    if point is not None and budget is not None:
        raise InvalidInputError("pass either a point index or a budget, not both")
    if point is not None:
        if not -len(points) <= point < len(points):
            raise InvalidInputError(f"The 'point' parameter must be in [0, {len(points)}). Got {point} instead.")
        return point % len(points)
    if budget is not None:
        params = [int(p["params"]) for p in points]
        limit = budget if isinstance(budget, int) else parse_budget(budget, full=max(params))
        fitting = [i for i, cost in enumerate(params) if cost <= limit]
        if not fitting:
            raise InfeasibleBudgetError(
                f"no Pareto point fits a budget of {limit:,} params; the smallest has {min(params):,}", min(params)
            )
        return max(fitting, key=lambda i: (params[i], -i))
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
        if not isinstance(ffn, int) or not all(isinstance(v, int | None) for v in (rank, kv)) or not isinstance(keep, bool):
            raise ConfigError(f"plan layer {i}: 'ffn', 'lora_rank', 'kv_heads' must be integers, 'keep' a bool; got {layer}")
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
    for i, (plan, width, kv) in enumerate(zip(plans, widths, kv_heads, strict=True)):
        if not plan.keep or plan.kv_heads not in (None, kv):
            raise ConfigError(
                f"plan layer {i} drops the layer or keeps {plan.kv_heads} of {kv} KV heads; this nsc-prune "
                "extracts FFN widths and LoRA ranks only"
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


def kept_block(module: str, plan: LayerPlan) -> tuple[int | None, int | None]:
    """Leading (rows, cols) of ``module``'s weight a layer keeps under LoNAS; None keeps the whole axis."""
    if module in ("mlp.gate_proj", "mlp.up_proj"):
        return plan.ffn, None
    if module == "mlp.down_proj":
        return None, plan.ffn
    return None, None
