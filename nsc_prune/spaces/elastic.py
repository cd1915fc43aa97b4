"""Elastic spaces for plain pretrained LLaMA-family models (no supernet needed).

Per layer: FFN width on a grid (``ffn_step``, down to ``ffn_min_fraction`` of the base width),
optionally the number of kept KV groups (each with its query heads, so GQA stays valid), and
optionally dropping the whole block. Protected layers keep their full width. ``homogeneous`` restricts the
plans to one kept option (FFN width and KV groups) shared by every kept layer, dropped layers free: what
llama.cpp's own architectures for gemma2, gemma3, granite, olmo2, phi3, smollm3 can hold, and the uniform-width
baseline.

A plan must keep at least one layer. Protected layers are never dropped; with ``depth`` and no protected
layer, layer 0 may shrink but is never dropped. Under psi_MP every layer of a homogeneous model has the
same option table, so this loses no (cost, NSC) point of the front: a plan that keeps only layer j has
the same cost and NSC as the one keeping only layer 0 (with per-layer psi_W values it is a restriction).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nsc_prune._validation import is_int, is_number
from nsc_prune.core.front import SearchSpace, Subspace
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.core.spec import (
    DecoderDims,
    DecoderLayerChoice,
    LayerOption,
    decoder_dims,
    decoder_fixed_option,
    decoder_layer_option,
    layer_dims,
)
from nsc_prune.errors import ConfigError
from nsc_prune.spaces.registry import register_space_kind


@dataclass(frozen=True)
class ElasticSpaceConfig:
    """Per-layer elastic axes of a plain model. YAML keys equal these field names."""

    ffn_step: int = 256  # FFN grid step (channels)
    ffn_min_fraction: float = 0.5  # narrowest FFN width, as a fraction of the base width
    kv_heads: bool = False  # also choose how many KV groups (with their query heads) to keep
    kv_min: int = 1  # fewest KV groups a kept layer may have
    depth: bool = False  # allow dropping whole layers
    protect_layers: tuple[int, ...] = ()  # layers kept at full width, all heads, never dropped
    homogeneous: bool = False  # every kept layer keeps the same FFN width and KV groups (dropped layers free)
    init: str | float = "xavier"

    def __post_init__(self) -> None:
        for name in ("kv_heads", "depth", "homogeneous"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                hint = " (the fewest KV groups a layer may keep is kv_min)" if name == "kv_heads" else ""
                raise ConfigError(
                    f"{name} must be true or false; got {value!r} ({type(value).__name__}). "
                    f"Use --set {name}=true or false{hint}"
                )
        for name, example in (("ffn_step", 256), ("kv_min", 1)):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(
                    f"{name} must be a positive integer; got {value!r} ({type(value).__name__}), "
                    f"e.g. --set {name}={example}"
                )
        fraction = self.ffn_min_fraction
        if not is_number(fraction) or not 0 < fraction <= 1:
            raise ConfigError(
                f"ffn_min_fraction must be a number in (0, 1]; got {fraction!r}, e.g. --set ffn_min_fraction=0.5"
            )
        layers = self.protect_layers
        if isinstance(layers, str) or not isinstance(layers, Sequence) or not all(is_int(i) for i in layers):
            raise ConfigError(
                f"protect_layers must be a list of layer indices; got {layers!r}, e.g. --set protect_layers=[0]"
            )
        object.__setattr__(self, "protect_layers", tuple(int(i) for i in layers))
        if self.homogeneous and self.protect_layers:
            raise ConfigError(
                f"protect_layers={list(self.protect_layers)} cannot be combined with homogeneous=true: a protected "
                "layer keeps its full width, which would force every kept layer to full width; drop protect_layers "
                "(with depth, layer 0 is never dropped) or homogeneous"
            )


# A layer's FFN widths at most: 70x a Llama-3-70B's at the default step; a config's 1e12-wide FFN (a typo) built a
# table until the machine ran out of memory.
MAX_FFN_WIDTHS = 4_096


def ffn_grid(full: int, step: int, min_fraction: float) -> list[int]:
    """Widths ``full, full - step, ...`` down to ``ceil(min_fraction * full)`` and at least 1 (a layer that keeps
    no FFN channel is a depth choice, which extraction refuses as a width), widest first; ConfigError above
    ``MAX_FFN_WIDTHS`` of them."""
    lowest = max(1, math.ceil(round(min_fraction * full, 9)))  # 0.56 * 12800 is 7168.000000000001, not above 7168
    count = max(0, (full - lowest) // step + 1)
    if count > MAX_FFN_WIDTHS:
        coarser = -(-(full - lowest) // (MAX_FFN_WIDTHS - 1))
        raise ConfigError(
            f"ffn_step={step} gives {count:,} FFN widths from {full:,} down to {lowest:,}, at most {MAX_FFN_WIDTHS:,} "
            f"a layer: pass --set ffn_step={coarser} or coarser (and check the config's intermediate_size)"
        )
    return list(range(full, lowest - 1, -step)) or [full]


def build_elastic_space(config: ElasticSpaceConfig, model_config: Mapping[str, Any] | None) -> SearchSpace:
    """The elastic space of a decoder (``ffn-grid``, ``ffn-heads``, ``ffn-heads-depth``): one option table per layer
    over its FFN widths, KV groups and (where the space allows) dropping it; protected layers keep their full size."""
    if model_config is None:
        raise ConfigError("elastic spaces need a model: pass --model")
    dims = decoder_dims(model_config)
    per_layer = layer_dims(model_config)  # a pruned checkpoint's per-layer widths and heads are each layer's full size
    bad = [i for i in config.protect_layers if not 0 <= i < dims.num_hidden_layers]
    if bad:
        raise ConfigError(f"protect_layers {bad} are outside 0..{dims.num_hidden_layers - 1}")
    if not config.kv_heads and config.kv_min != 1:
        raise ConfigError(
            f"kv_min={config.kv_min} applies only where a space chooses KV groups (kv_heads=true: ffn-heads, "
            "ffn-heads-depth); this one keeps every layer's"
        )
    protected = set(config.protect_layers)
    # a protected layer keeps every KV head: kv_min bounds the layers whose KV groups are chosen
    fewest_kv = min((d.num_key_value_heads for i, d in enumerate(per_layer) if i not in protected), default=None)
    if config.kv_heads and fewest_kv is not None and config.kv_min > fewest_kv:
        where = "" if fewest_kv == dims.num_key_value_heads else " in its narrowest unprotected layer"
        raise ConfigError(f"kv_min={config.kv_min} exceeds the model's {fewest_kv} KV heads{where}")
    # A plan keeps at least one layer: without a protected layer, layer 0 is never dropped (module docstring).
    never_dropped = protected or {0}

    def option(layer: DecoderDims, ffn: int, kv: int, keep: bool = True) -> LayerOption:
        plan = LayerPlan(ffn=ffn, kv_groups=kv, keep=keep)
        return decoder_layer_option(layer, DecoderLayerChoice(ffn=ffn, kv_heads=kv), config.init, plan)

    @functools.cache
    def table(layer: DecoderDims, kind: str) -> tuple[LayerOption, ...]:
        if kind == "full":
            return (option(layer, layer.intermediate_size, layer.num_key_value_heads),)
        widths = ffn_grid(layer.intermediate_size, config.ffn_step, config.ffn_min_fraction)
        kv_choices = (
            range(layer.num_key_value_heads, config.kv_min - 1, -1) if config.kv_heads else [layer.num_key_value_heads]
        )
        kept = tuple(option(layer, w, kv) for w in widths for kv in kv_choices)
        return kept + (option(layer, 0, 0, keep=False),) if kind == "droppable" else kept

    def kind(i: int) -> str:
        return "full" if i in protected else "kept" if i in never_dropped or not config.depth else "droppable"

    kept_kv = sorted({d.num_key_value_heads for i, d in enumerate(per_layer) if kind(i) != "droppable"})
    if config.homogeneous and not config.kv_heads and len(kept_kv) > 1:  # no label could be shared: say why
        raise ConfigError(
            f"homogeneous=true keeps each layer's KV heads (kv_heads=false), and the layers that cannot be dropped "
            f"have {', '.join(map(str, kept_kv))} of them: no option is shared; add kv_heads=true (as in space "
            "ffn-heads) to cut them to one count"
        )
    layers = tuple(table(layer, kind(i)) for i, layer in enumerate(per_layer))
    full_widths = sorted({d.intermediate_size for d in per_layer}, reverse=True)
    widths = ffn_grid(full_widths[0], config.ffn_step, config.ffn_min_fraction)
    axes = [
        f"FFN {widths[0]}..{widths[-1]} step {config.ffn_step}"
        if len(full_widths) == 1
        else f"FFN from each layer's width ({full_widths[-1]}..{full_widths[0]}) "
        f"down to {config.ffn_min_fraction:g} of it, "
        f"step {config.ffn_step}"
    ]
    if config.kv_heads:
        axes.append(
            f"KV groups {dims.num_key_value_heads}..{config.kv_min}"
            if len({d.num_key_value_heads for d in per_layer}) == 1
            else f"KV groups each layer's..{config.kv_min}"
        )
    if config.depth:
        axes.append("layer dropping" + ("" if protected else " (layer 0 never dropped)"))
    if protected:
        axes.append(f"layers {sorted(protected)} protected")
    if config.homogeneous:
        axes.append("homogeneous (one FFN width and KV-group count in every kept layer)")
    return SearchSpace(
        name="elastic",
        subspaces=(
            Subspace(choice={}, fixed=decoder_fixed_option(dims), layers=layers, homogeneous=config.homogeneous),
        ),
        description=", ".join(axes),
    )


register_space_kind("elastic", ElasticSpaceConfig, build_elastic_space)
