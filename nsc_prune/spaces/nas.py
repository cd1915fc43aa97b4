"""The paper's NAS spaces as search-space kinds (section 4.2, appendices D.4, F.3, F.5).

* ``txl``: Transformer-XL on WikiText-103 (LiteTransformerSearch). Network level g =
  (d_model, n_layer); per layer the FFN width d_ff. Value per layer ``2 psi_MP(d_ff, d_model,
  s)`` (the FFN pair, s = 0.02); the attention of all n_layer layers is fixed by g and scored once per g
  under the ``attention`` convention. Non-embedding cost per layer ``4 d^2 + 9 d + d_ff (2 d + 1)``.
* ``autoformer``: AutoFormer Tiny/Small/Base. g = (embed_dim, depth); per layer heads x MLP
  ratio. Cost: all parameters (patch embedding, tokens, classifier included), as AutoFormer
  counts them.

Each Pareto point's ``choice`` holds the network-level keys (``d_model``, ``n_layer``,
``n_head`` / ``embed_dim``, ``depth``) beside its per-layer ``layers``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from nsc_prune._validation import is_int, is_number
from nsc_prune.core.budget import parse_budget
from nsc_prune.core.front import SearchSpace, Subspace
from nsc_prune.core.spec import LayerOption
from nsc_prune.ranking.families import autoformer, gpt2
from nsc_prune.ranking.families.base import options_from_roles
from nsc_prune.spaces.registry import register_space_kind


def _ints(name: str, values: Any) -> tuple[int, ...]:
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list of integers; got {values!r}")
    values = list(values)
    if not values or not all(is_int(v) and v > 0 for v in values):
        raise ValueError(f"{name} must be a non-empty list of positive integers; got {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} has repeated values: {values}")
    return tuple(int(v) for v in values)


def _ratios(name: str, values: Any, smallest_width: int) -> tuple[float, ...]:
    """A list of positive finite ratios, each giving at least one channel at the smallest width."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list of numbers; got {values!r}")
    values = list(values)
    if not values or not all(is_number(r) and math.isfinite(r) and int(smallest_width * r) >= 1 for r in values):
        raise ValueError(
            f"{name} must be a non-empty list of finite numbers, each giving at least one channel at embed_dim "
            f"{smallest_width}; got {values!r}"
        )
    ratios = tuple(float(r) for r in values)
    if len(set(ratios)) != len(ratios):  # 4 and 4.0 are one ratio: each layer's options held it twice
        raise ValueError(f"{name} has repeated values: {list(ratios)}")
    return ratios


def _check_budget(budget: str | None) -> None:
    if budget is not None:
        parse_budget(budget)


# --------------------------------------------------------------------------------------------
# Transformer-XL

TXL_D_FF = tuple(range(512, 2049, 128)) + tuple(range(2304, 4097, 256))


@dataclass(frozen=True)
class TxlSpaceConfig:
    """Transformer-XL space of LiteTransformerSearch. YAML keys equal these field names."""

    d_model: tuple[int, ...] = (128, 256, 384, 512, 640, 768, 1024)
    n_layer: tuple[int, ...] = (12, 14, 16, 18)
    d_ff: tuple[int, ...] = TXL_D_FF
    d_head: int = 64  # n_head = d_model / d_head (per-head attention convention)
    init: str | float = 0.02  # normal(0.02) for every matrix (paper); or xavier, kaiming
    attention: str = "per_head"  # "per_head" (paper section 3.3) or "merged" QKV
    paper_budget: str | None = "40.32M"  # 38.4M (TXL Base) + 5%; informational, pass --budget

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layer", "d_ff"):
            object.__setattr__(self, name, _ints(name, getattr(self, name)))
        if not (is_int(self.d_head) and self.d_head > 0):
            raise ValueError(f"d_head must be a positive integer; got {self.d_head!r}")
        bad = [d for d in self.d_model if d % self.d_head]
        if bad:
            raise ValueError(f"d_model {bad} not divisible by d_head={self.d_head}: heads must not split a channel")
        self.options()  # validates init and attention
        _check_budget(self.paper_budget)

    def options(self) -> gpt2.GPT2Options:
        return gpt2.GPT2Options(init=self.init, attention=self.attention)


def txl_layer_params(d_model: Any, d_ff: Any) -> Any:
    """Non-embedding parameters of one Transformer-XL layer, ``4d^2 + 9d + d_ff(2d + 1)``
    (numbers or integer arrays that broadcast)."""
    return 4 * d_model * d_model + 9 * d_model + d_ff * (2 * d_model + 1)


def _txl_subspace(config: TxlSpaceConfig, d: int, layers: int) -> Subspace:
    opts = config.options()
    heads = d // config.d_head
    attention = [
        dataclasses.replace(r, count=r.count * layers) for r in gpt2.attention_roles(d, np.array([heads]), opts)
    ]
    (fixed,) = options_from_roles(attention, [{"part": f"attention x {layers}"}], extra_params=9 * d * layers)
    widths = np.array(sorted(config.d_ff, reverse=True), dtype=np.int64)  # widest first (solver tie rule)
    ffn = options_from_roles(gpt2.ffn_roles(d, widths, opts), [{"d_ff": int(w)} for w in widths], extra_params=widths)
    return Subspace(choice={"d_model": d, "n_layer": layers, "n_head": heads}, fixed=fixed, layers=(ffn,) * layers)


def build_txl_space(config: TxlSpaceConfig, model_config: Mapping[str, Any] | None = None) -> SearchSpace:
    """One subspace per (d_model, n_layer); every layer shares one FFN option table."""
    subspaces = tuple(_txl_subspace(config, d, layers) for d in config.d_model for layers in config.n_layer)
    return SearchSpace(
        name="txl",
        subspaces=subspaces,
        description=f"Transformer-XL: d_model {list(config.d_model)} x n_layer {list(config.n_layer)}, per-layer d_ff "
        f"({len(config.d_ff)} widths), init {config.init}, {config.attention} attention",
        params_convention="non-embedding parameters: 4d^2 + 9d + d_ff(2d + 1) per layer (LiteTransformerSearch)",
        macs_convention="multiply-accumulates of the layers' Linear weights at seq_len tokens (no embedding or "
        "softmax layer, as the params)",
    )


# --------------------------------------------------------------------------------------------
# AutoFormer


@dataclass(frozen=True)
class AutoFormerSpaceConfig:
    """An AutoFormer supernet's space (Tiny, Small or Base). YAML keys equal these field names."""

    embed_dim: tuple[int, ...] = (192, 216, 240)
    depth: tuple[int, ...] = (12, 13, 14)
    num_heads: tuple[int, ...] = (3, 4)
    mlp_ratio: tuple[float, ...] = (3.5, 4.0)
    init: str | float = "xavier"
    attention: str = "per_head"
    head_dim: int | str = 64  # or "embed": embed_dim // num_heads per layer (reproduces the paper's Small/Base figures)
    image_size: int = 224
    patch_size: int = 16
    num_classes: int = 1000
    max_relative_position: int = 14
    paper_budget: str | None = "5.7M"  # informational, pass --budget

    def __post_init__(self) -> None:
        for name in ("embed_dim", "depth", "num_heads"):
            object.__setattr__(self, name, _ints(name, getattr(self, name)))
        object.__setattr__(self, "mlp_ratio", _ratios("mlp_ratio", self.mlp_ratio, min(self.embed_dim)))
        _check_budget(self.paper_budget)
        if self.head_dim == autoformer.HEAD_DIM_EMBED and min(self.embed_dim) < max(self.num_heads):
            raise ValueError(
                f"head_dim=embed needs embed_dim >= num_heads; got embed_dim {min(self.embed_dim)} with "
                f"num_heads {max(self.num_heads)}. Use larger embed_dim values or head_dim: 64"
            )
        self.options()  # validates init, attention and the remaining fields

    def options(self) -> autoformer.AutoFormerOptions:
        return autoformer.AutoFormerOptions(
            init=self.init,
            attention=self.attention,
            head_dim=self.head_dim,
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_classes=self.num_classes,
            max_relative_position=self.max_relative_position,
        )


def build_autoformer_space(config: AutoFormerSpaceConfig, model_config: Mapping[str, Any] | None = None) -> SearchSpace:
    """One subspace per (embed_dim, depth); per layer every (heads, MLP ratio), widest first."""
    opts = config.options()
    patches = (config.image_size // config.patch_size) ** 2
    pairs = sorted(((h, r) for h in config.num_heads for r in config.mlp_ratio), reverse=True)
    heads = np.array([h for h, _ in pairs], dtype=np.int64)
    ratios = np.array([r for _, r in pairs], dtype=np.float64)
    labels = [{"num_heads": int(h), "mlp_ratio": float(r)} for h, r in pairs]
    subspaces = []
    for e in config.embed_dim:
        table = options_from_roles(
            autoformer.layer_roles(e, heads, ratios, opts),
            labels,
            extra_params=autoformer.layer_extra_params(e, heads, ratios, opts),
        )
        fixed = LayerOption(
            label={"part": "patch embedding + tokens + head"},
            matrices=(),
            extra_params=int(autoformer.network_extra_params(e, opts)),
            extra_macs=0,
        )
        subspaces += [
            Subspace(choice={"embed_dim": e, "depth": depth}, fixed=fixed, layers=(table,) * depth)
            for depth in config.depth
        ]
    return SearchSpace(
        name="autoformer",
        subspaces=tuple(subspaces),
        description=f"AutoFormer: embed_dim {list(config.embed_dim)} x depth {list(config.depth)}, per layer heads "
        f"{list(config.num_heads)} x MLP ratio {list(config.mlp_ratio)} (head dim {config.head_dim})",
        params_convention="all parameters of the ViT subnet "
        "(patch and position embeddings, norms, classifier included; "
        + (
            "equals AutoFormer's own count)"
            if config.head_dim == 64
            else f"with head dim {config.head_dim}, not AutoFormer's 64)"
        ),
        macs_convention="multiply-accumulates of the blocks' Linear layers at seq_len tokens; the patch embedding "
        "and the classifier are not counted (a constant per embed_dim: about 2 % of a tiny subnet's)",
        macs_per=f"per {config.image_size}x{config.image_size} image ({{seq_len}} tokens: {patches} patches of "
        f"{config.patch_size}x{config.patch_size} px + the class token)",
        default_seq_len=patches + 1,
    )


register_space_kind("txl", TxlSpaceConfig, build_txl_space, takes_model=False)
register_space_kind("autoformer", AutoFormerSpaceConfig, build_autoformer_space, takes_model=False)
