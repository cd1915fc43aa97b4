"""AutoFormer vision Transformers (Chen et al. 2021; paper sections 4.1-4.2, appendices F.2-F.3).

Network level: embedding dim e and depth; per layer: heads h and MLP ratio r. Heads have a
fixed dimension 64 in the supernet (Q/K/V project e -> 64 h; ``head_dim=64``, the default), or,
with ``head_dim="embed"``, the ViT convention e // h (Q/K/V project e -> e when h divides e).
With per-head dim k, scored per layer: Q, K, V per head (k x e each, ``attention="per_head"``, the
paper's convention; or one 3kh x e matrix, ``"merged"``), the output projection e x kh, and the
MLP pair int(r e) x e, e x int(r e).
Xavier init. Patch embedding, tokens, norms, relative-position tables and the classifier are
counted as parameters but not scored; the count equals AutoFormer's own ``params``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nsc_prune._validation import is_int
from nsc_prune.errors import InvalidInputError

HEAD_DIM_EMBED = "embed"  # head dim = embed_dim // num_heads (ViT convention) instead of a fixed number
MAX_HEAD_DIM = 1 << 16  # beyond any model's; the int64 sizes built from it stay exact
from nsc_prune.ranking.families.base import (
    MAX_SIZE,
    ArchBatch,
    Role,
    check_attention,
    check_init,
    check_positive,
    check_positive_fields,
    config_object,
    make_role,
    pad_layers,
    ratio_number,
    whole_number,
)


@dataclass(frozen=True)
class AutoFormerOptions:
    """How an AutoFormer spec becomes matrices and parameter counts."""

    init: str | float = "xavier"  # paper: Xavier
    attention: str = "per_head"  # "per_head" (paper) or "merged" QKV
    head_dim: int | str = 64  # fixed in the AutoFormer supernet; "embed": embed_dim // num_heads per layer
    image_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    max_relative_position: int = 14  # relative-position tables for K and V (2 x 2 x (2p+2) x head_dim)

    def __post_init__(self) -> None:
        check_attention("AutoFormer", self.attention)
        check_init(self.init)
        hd = self.head_dim
        if hd != HEAD_DIM_EMBED and not (is_int(hd) and 0 < hd <= MAX_HEAD_DIM):
            raise InvalidInputError(
                f"AutoFormerOptions.head_dim must be an integer in [1, {MAX_HEAD_DIM}] such as 64, or "
                f"{HEAD_DIM_EMBED!r}; got {hd!r}"
            )
        check_positive_fields(self, ("image_size", "patch_size", "in_chans", "num_classes"))
        if not is_int(self.max_relative_position):
            raise InvalidInputError(
                "AutoFormerOptions.max_relative_position must be a whole number (0 or less: no relative positions); "
                f"got {self.max_relative_position!r}"
            )
        if self.image_size % self.patch_size:
            raise InvalidInputError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")

    @property
    def tokens(self) -> int:
        """Patches + the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1

    def rel_pos_params(self, head_width: Any) -> Any:
        """Relative-position tables of one block for per-head dim ``head_width``."""
        return 0 if self.max_relative_position <= 0 else 4 * (2 * self.max_relative_position + 2) * head_width


def parse_head_dim(text: str) -> int | str:
    """Read ``--head-dim``: a positive whole number (64, the supernet's) or ``"embed"`` (embed_dim // heads)."""
    if text == HEAD_DIM_EMBED:
        return HEAD_DIM_EMBED
    digits = text.lstrip("0")  # '²' is a digit int() refuses, and it refuses 4301 digits or more, zeros included
    if (
        text.isascii()
        and text.isdigit()
        and len(digits) <= len(str(MAX_HEAD_DIM))
        and 0 < int(digits or "0") <= MAX_HEAD_DIM
    ):
        return int(digits)
    raise InvalidInputError(
        f"head_dim must be a whole number in [1, {MAX_HEAD_DIM}] such as 64, or {HEAD_DIM_EMBED!r}; got {text!r}"
    )


def head_width(embed_dim: Any, num_heads: Any, opts: AutoFormerOptions) -> np.ndarray:
    """Per-head Q/K/V dimension: ``opts.head_dim``, or ``embed_dim // num_heads`` when it is ``"embed"``."""
    h = np.asarray(num_heads, dtype=np.int64)
    if opts.head_dim == HEAD_DIM_EMBED:
        return np.asarray(embed_dim, dtype=np.int64) // np.maximum(h, 1)
    return np.full(h.shape, opts.head_dim, dtype=np.int64)


@dataclass(frozen=True)
class AutoFormerArchs:
    """Parsed architectures padded to ``(A, L)``; ``reported`` carries a file's own figures."""

    ids: tuple[str, ...]
    embed_dim: np.ndarray
    num_heads: np.ndarray
    mlp_ratio: np.ndarray
    mask: np.ndarray
    reported: Mapping[str, np.ndarray] = field(default_factory=dict)


def parse(ids: Sequence[str], configs: Sequence[Mapping[str, Any]]) -> AutoFormerArchs:
    """Read ``{"layer_num", "embed_dim", "num_heads", "mlp_ratio"}`` per architecture
    (``embed_dim`` one number or a per-layer list; the others per-layer lists or one number)."""
    embed, heads, ratios = [], [], []
    for arch_id, config in zip(ids, configs):
        config = config_object(arch_id, config, "AutoFormer")
        try:
            depth = whole_number(config["layer_num"])
            values = [config["embed_dim"], config["num_heads"], config["mlp_ratio"]]
            cast = (whole_number, whole_number, ratio_number)
            values = [
                [c(x) for x in v] if isinstance(v, (list, tuple)) else [c(v)] * depth for v, c in zip(values, cast)
            ]
        except KeyError as err:
            raise InvalidInputError(f"architecture {arch_id!r}: missing AutoFormer field {err}") from err
        except (TypeError, ValueError) as err:
            raise InvalidInputError(f"architecture {arch_id!r}: malformed AutoFormer net_setting ({err})") from err
        if depth < 1:
            raise InvalidInputError(f"architecture {arch_id!r}: layer_num must be a positive integer; got {depth}")
        if not all(math.isfinite(r) and r > 0 for r in values[2]):
            raise InvalidInputError(f"architecture {arch_id!r}: mlp_ratio must be positive numbers; got {values[2]}")
        if any(len(v) != depth for v in values):
            raise InvalidInputError(
                f"architecture {arch_id!r}: layer_num={depth} but per-layer lists have lengths "
                f"{[len(v) for v in values]}"
            )
        if len(set(values[0])) > 1:
            raise InvalidInputError(
                f"architecture {arch_id!r}: embed_dim differs across layers {sorted(set(values[0]))}; "
                "AutoFormer uses one per network"
            )
        if max(values[2]) * values[0][0] > MAX_SIZE:  # the MLP width is a size: its products must stay in int64
            raise InvalidInputError(
                f"architecture {arch_id!r}: mlp_ratio * embed_dim (the MLP width) must be at most {MAX_SIZE:,}; "
                f"got {max(values[2])} * {values[0][0]}"
            )
        embed.append(values[0])
        heads.append(values[1])
        ratios.append(values[2])
    ids = tuple(ids)
    embed_a, mask = pad_layers(ids, embed, fill=1)
    return AutoFormerArchs(
        ids, embed_a, pad_layers(ids, heads, fill=1)[0], pad_layers(ids, ratios, fill=1.0, dtype=np.float64)[0], mask
    )


def mlp_hidden(embed_dim: Any, mlp_ratio: Any) -> np.ndarray:
    """AutoFormer's MLP width ``int(ratio * embed_dim)``."""
    return (np.asarray(mlp_ratio, dtype=np.float64) * np.asarray(embed_dim, dtype=np.int64)).astype(np.int64)


def layer_roles(embed_dim: Any, num_heads: Any, mlp_ratio: Any, opts: AutoFormerOptions) -> list[Role]:
    """Scored matrices of one block; arrays broadcast together."""
    e = np.asarray(embed_dim, dtype=np.int64)
    h = np.asarray(num_heads, dtype=np.int64)
    hidden = mlp_hidden(e, mlp_ratio)
    one = np.ones(np.broadcast_shapes(e.shape, h.shape, hidden.shape), dtype=np.int64)
    hd = head_width(e, h, opts) * one
    if opts.attention == "per_head":
        qkv = make_role("qkv_proj_per_head", hd, e, 3 * h, opts.init)
    else:
        qkv = make_role("qkv_proj", 3 * hd * h, e, one, opts.init)
    return [
        qkv,
        make_role("proj", e, hd * h, one, opts.init),
        make_role("fc1", hidden, e, one, opts.init),
        make_role("fc2", e, hidden, one, opts.init),
    ]


def layer_extra_params(embed_dim: Any, num_heads: Any, mlp_ratio: Any, opts: AutoFormerOptions) -> np.ndarray:
    """Norms, biases and relative-position tables of one block."""
    e = np.asarray(embed_dim, dtype=np.int64)
    hd = head_width(e, num_heads, opts)
    q = hd * np.asarray(num_heads, dtype=np.int64)
    return 4 * e + 3 * q + e + mlp_hidden(e, mlp_ratio) + e + opts.rel_pos_params(hd)


def network_extra_params(embed_dim: Any, opts: AutoFormerOptions) -> np.ndarray:
    """Patch embedding, class token, position embedding, final norm and classifier."""
    e = np.asarray(embed_dim, dtype=np.int64)
    patch = e * opts.in_chans * opts.patch_size**2 + e
    return patch + e + opts.tokens * e + 2 * e + opts.num_classes * e + opts.num_classes


def network_extra_macs(embed_dim: Any, opts: AutoFormerOptions) -> np.ndarray:
    """Patch embedding and classifier multiply-accumulates per image."""
    e = np.asarray(embed_dim, dtype=np.int64)
    return (opts.tokens - 1) * e * opts.in_chans * opts.patch_size**2 + e * opts.num_classes


def build(archs: AutoFormerArchs, opts: AutoFormerOptions | None = None) -> ArchBatch:
    """Vectorised spec of every architecture."""
    opts = opts or AutoFormerOptions()
    ids, mask = archs.ids, archs.mask
    hidden = mlp_hidden(archs.embed_dim, archs.mlp_ratio)
    for name, values in (
        ("embed_dim", archs.embed_dim),
        ("num_heads", archs.num_heads),
        ("mlp_ratio * embed_dim", hidden),
    ):
        check_positive(ids, name, values, mask)
    e, h, r = archs.embed_dim, archs.num_heads, archs.mlp_ratio
    if opts.head_dim == HEAD_DIM_EMBED:
        check_positive(ids, "embed_dim // num_heads (head_dim=embed)", head_width(e, h, opts), mask)
    t = opts.tokens
    roles = tuple(dataclasses.replace(role, positions=t) for role in layer_roles(e, h, r, opts))
    e0 = e[:, 0]
    attention_macs = np.where(mask, 2 * t * t * head_width(e, h, opts) * h, 0).sum(axis=1)
    return ArchBatch(
        family="autoformer",
        ids=ids,
        mask=mask,
        roles=roles,
        extra_params=np.where(mask, layer_extra_params(e, h, r, opts), 0).sum(axis=1) + network_extra_params(e0, opts),
        extra_macs=attention_macs + network_extra_macs(e0, opts),
        reported=dict(archs.reported),
        options=dataclasses.asdict(opts),
    )
