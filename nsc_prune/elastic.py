"""Elastic spaces for plain pretrained LLaMA-family models (no supernet needed).

Per layer: FFN width on a grid (``ffn_step``, down to ``ffn_min_fraction`` of the base width),
optionally the number of kept KV groups (each with its query heads, so GQA stays valid), and
optionally dropping the whole block. Protected layers keep their full width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nsc_prune.errors import ConfigError
from nsc_prune.space import SearchSpace, Subspace, register_space_kind
from nsc_prune.spec import DecoderLayerChoice, decoder_dims, decoder_fixed_option, decoder_layer_option


@dataclass(frozen=True)
class ElasticSpaceConfig:
    """Per-layer elastic axes of a plain model. YAML keys equal these field names."""

    ffn_step: int = 256  # FFN grid step (channels)
    ffn_min_fraction: float = 0.5  # narrowest FFN width, as a fraction of the base width
    kv_heads: bool = False  # also choose how many KV groups (with their query heads) to keep
    kv_min: int = 1  # fewest KV groups a kept layer may have
    depth: bool = False  # allow dropping whole layers
    protect_layers: tuple[int, ...] = ()  # layers kept at full width, all heads, never dropped
    init: str | float = "xavier"

    def __post_init__(self) -> None:
        object.__setattr__(self, "protect_layers", tuple(int(i) for i in self.protect_layers))
        if not isinstance(self.ffn_step, int) or self.ffn_step <= 0:
            raise ValueError(f"ffn_step must be a positive integer; got {self.ffn_step!r}")
        if not 0 < float(self.ffn_min_fraction) <= 1:
            raise ValueError(f"ffn_min_fraction must be in (0, 1]; got {self.ffn_min_fraction!r}")
        if not isinstance(self.kv_min, int) or self.kv_min < 1:
            raise ValueError(f"kv_min must be an integer >= 1; got {self.kv_min!r}")


def ffn_grid(full: int, step: int, min_fraction: float) -> list[int]:
    """Widths ``full, full - step, ...`` down to ``ceil(min_fraction * full)``, widest first."""
    lowest = math.ceil(min_fraction * full)
    return list(range(full, lowest - 1, -step)) or [full]


def build_elastic_space(config: ElasticSpaceConfig, model_config: Mapping[str, Any] | None) -> SearchSpace:
    if model_config is None:
        raise ConfigError("elastic spaces need a model: pass --model")
    dims = decoder_dims(model_config)
    bad = [i for i in config.protect_layers if not 0 <= i < dims.num_hidden_layers]
    if bad:
        raise ConfigError(f"protect_layers {bad} are outside 0..{dims.num_hidden_layers - 1}")
    if config.kv_heads and config.kv_min > dims.num_key_value_heads:
        raise ConfigError(f"kv_min={config.kv_min} exceeds the model's {dims.num_key_value_heads} KV heads")
    widths = ffn_grid(dims.intermediate_size, config.ffn_step, config.ffn_min_fraction)
    kv_choices = range(dims.num_key_value_heads, config.kv_min - 1, -1) if config.kv_heads else [dims.num_key_value_heads]

    def option(ffn: int, kv: int, keep: bool = True):
        label = {"ffn": ffn, "kv_heads": kv} | ({} if keep else {"keep": False})
        return decoder_layer_option(dims, DecoderLayerChoice(ffn=ffn, kv_heads=kv), config.init, label)

    elastic = tuple(option(w, kv) for w in widths for kv in kv_choices)
    if config.depth:
        elastic += (option(0, 0, keep=False),)
    full = (option(dims.intermediate_size, dims.num_key_value_heads),)
    protected = set(config.protect_layers)
    layers = tuple(full if i in protected else elastic for i in range(dims.num_hidden_layers))
    axes = [f"FFN {widths[0]}..{widths[-1]} step {config.ffn_step}"]
    if config.kv_heads:
        axes.append(f"KV groups {dims.num_key_value_heads}..{config.kv_min}")
    if config.depth:
        axes.append("layer dropping")
    if protected:
        axes.append(f"layers {sorted(protected)} protected")
    return SearchSpace(
        name="elastic",
        subspaces=(Subspace(choice={}, fixed=decoder_fixed_option(dims), layers=layers),),
        description=", ".join(axes),
    )


register_space_kind("elastic", ElasticSpaceConfig, build_elastic_space)
