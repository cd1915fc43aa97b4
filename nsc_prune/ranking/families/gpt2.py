"""GPT-2 / Transformer-XL decoders of LiteTransformerSearch (Javaheripi et al. 2022; paper
sections 4.1-4.2, appendix F.2).

Per layer: attention over ``d_model`` D with ``n_head`` h heads, then an FFN pair of width
``d_inner`` f. Scored matrices (paper section 3.3): Q, K, V per head (D/h x D each, ``attention=
"per_head"``, the paper's convention) or one merged 3D x D QKV (``"merged"``); the output D x D;
the FFN f x D and D x f. Init std 0.02 (the models' own ``weight_init_std``, appendix H).

Non-embedding parameters per layer are ``4 D^2 + 9 D + f (2 D + 1)`` (weights; QKV and output
biases 4D; FFN biases f + D; two LayerNorms 4D) plus one final LayerNorm (2D): exactly the
``nonembedding`` count LTS logs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nsc_prune.errors import InvalidInputError
from nsc_prune.ranking.families.base import (
    ArchBatch,
    Role,
    check_attention,
    check_divides,
    check_init,
    check_positive,
    config_object,
    make_role,
    pad_layers,
    whole_number,
)


@dataclass(frozen=True)
class GPT2Options:
    """How an LTS GPT-2 / Transformer-XL spec becomes matrices."""

    init: str | float = 0.02  # paper: normal(0.02), the models' weight_init_std
    attention: str = "per_head"  # "per_head" (paper) or "merged" QKV
    seq_len: int = 192  # tgt_len of the LTS runs, for #FLOPs
    mem_len: int = 192  # Transformer-XL memory attended to, for #FLOPs

    def __post_init__(self) -> None:
        check_attention("GPT-2", self.attention)
        check_init(self.init)
        if self.seq_len <= 0 or self.mem_len < 0:
            raise InvalidInputError(f"seq_len must be > 0 and mem_len >= 0; got {self.seq_len}, {self.mem_len}")


def _check_head_size(arch_id: str, d_head: Any, d_model: int, heads: list[int]) -> None:
    """Refuse an LTS ``d_head`` (one number or per layer) other than -1 or ``d_model / n_head``: the matrices here are
    d_model / n_head wide per head, and another head size was scored as if it were that one."""
    sizes = list(d_head) if isinstance(d_head, (list, tuple)) else [d_head] * len(heads)
    try:
        if len(sizes) != len(heads):
            raise ValueError("one per layer")
        sizes = [size if size in (-1, None) else whole_number(size) for size in sizes]  # 64.0 and "64" as n_head's
    except (TypeError, ValueError) as err:
        raise InvalidInputError(
            f"architecture {arch_id!r}: d_head must be -1, d_model / n_head, or one of them per layer "
            f"({len(heads)}); got {d_head!r}"
        ) from err
    for layer, (size, n_head) in enumerate(zip(sizes, heads)):
        if size not in (-1, None) and size * n_head != d_model:
            raise InvalidInputError(
                f"architecture {arch_id!r}: layer {layer}'s d_head {size!r} is not d_model / n_head "
                f"({d_model} / {n_head}); the GPT-2 family scores heads of d_model / n_head (LTS's d_head: -1)"
            )


@dataclass(frozen=True)
class GPT2Archs:
    """Parsed architectures padded to ``(A, L)``: ``d_model`` (A,), per-layer ``n_head``, ``d_inner``."""

    ids: tuple[str, ...]
    d_model: np.ndarray
    n_head: np.ndarray
    d_inner: np.ndarray
    mask: np.ndarray


def parse(ids: Sequence[str], configs: Sequence[Mapping[str, Any]]) -> GPT2Archs:
    """Read ``{"d_model", "n_layer", "n_head", "d_inner"}`` per architecture (``n_head`` and
    ``d_inner`` may be one number or a per-layer list)."""
    d_model, heads, inner = [], [], []
    for arch_id, config in zip(ids, configs):
        config = config_object(arch_id, config, "GPT-2")
        try:
            n_layer = whole_number(config["n_layer"])
            per_layer = [config["n_head"], config["d_inner"]]
            per_layer = [
                [whole_number(x) for x in v] if isinstance(v, (list, tuple)) else [whole_number(v)] * n_layer
                for v in per_layer
            ]
            d_model.append(whole_number(config["d_model"]))
        except KeyError as err:
            raise InvalidInputError(f"architecture {arch_id!r}: missing GPT-2 field {err}") from err
        except (TypeError, ValueError) as err:
            raise InvalidInputError(f"architecture {arch_id!r}: malformed GPT-2 config ({err})") from err
        if n_layer < 1:
            raise InvalidInputError(f"architecture {arch_id!r}: n_layer must be a positive integer; got {n_layer}")
        if any(len(v) != n_layer for v in per_layer):
            raise InvalidInputError(
                f"architecture {arch_id!r}: n_layer={n_layer} but n_head has {len(per_layer[0])} "
                f"and d_inner {len(per_layer[1])} entries"
            )
        _check_head_size(arch_id, config.get("d_head", -1), d_model[-1], per_layer[0])
        heads.append(per_layer[0])
        inner.append(per_layer[1])
    ids = tuple(ids)
    n_head, mask = pad_layers(ids, heads, fill=1)
    return GPT2Archs(ids, np.array(d_model, dtype=np.int64), n_head, pad_layers(ids, inner, fill=1)[0], mask)


def attention_roles(d_model: Any, n_head: Any, opts: GPT2Options) -> list[Role]:
    """Q/K/V (per head or merged) and output projection; arrays broadcast together."""
    d = np.asarray(d_model, dtype=np.int64)
    h = np.asarray(n_head, dtype=np.int64)
    if opts.attention == "per_head":
        qkv = make_role("qkv_proj_per_head", d // h, d, 3 * h, opts.init)
    else:
        qkv = make_role("qkv_proj", 3 * d, d, np.ones_like(h), opts.init)
    return [qkv, make_role("o_proj", d, d, np.ones_like(h), opts.init)]


def ffn_roles(d_model: Any, d_inner: Any, opts: GPT2Options) -> list[Role]:
    """The FFN pair (f x D up, D x f down)."""
    d = np.asarray(d_model, dtype=np.int64)
    f = np.asarray(d_inner, dtype=np.int64)
    return [
        make_role("ff_up", f, d, np.ones_like(f), opts.init),
        make_role("ff_down", d, f, np.ones_like(f), opts.init),
    ]


def layer_extra_params(d_model: Any, d_inner: Any) -> np.ndarray:
    """Biases and norms of one layer, ``9 D + f`` (the non-weight part of ``4D^2 + 9D + f(2D+1)``)."""
    return 9 * np.asarray(d_model, dtype=np.int64) + np.asarray(d_inner, dtype=np.int64)


def build(archs: GPT2Archs, opts: GPT2Options | None = None) -> ArchBatch:
    """Vectorised spec of every architecture."""
    opts = opts or GPT2Options()
    ids, mask = archs.ids, archs.mask
    check_positive(ids, "d_model", archs.d_model)
    check_positive(ids, "d_inner", archs.d_inner, mask)
    check_positive(ids, "n_head", archs.n_head, mask)  # before: n_head=0 "does not divide" d_model
    check_divides(ids, "d_model", archs.d_model[:, None], "n_head", archs.n_head, mask)
    d = archs.d_model[:, None]
    roles = tuple(
        dataclasses.replace(r, positions=opts.seq_len)
        for r in attention_roles(d, archs.n_head, opts) + ffn_roles(d, archs.d_inner, opts)
    )
    layers = mask.sum(axis=1)
    extra = np.where(mask, layer_extra_params(d, archs.d_inner), 0).sum(axis=1) + 2 * archs.d_model
    keys = opts.seq_len + opts.mem_len
    return ArchBatch(
        family="gpt2",
        ids=ids,
        mask=mask,
        roles=roles,
        extra_params=extra,
        extra_macs=2 * opts.seq_len * keys * archs.d_model * layers,  # QK^T and AV over memory + segment
        reported={},
        options=dataclasses.asdict(opts),
    )
