"""FlexiBERT encoders (Tuli et al. 2022; paper section 4.1, appendix F.1).

Each architecture has one hidden size H and 2-4 heterogeneous layers: an operation (SA
self-attention, LT linear transform DFT/DCT, DSC dynamic separable convolution) with a head
count, then a feed-forward block of ``feed_forward_dimension`` F and ``num_feed_forward`` k.

Two conventions for the FFN (``ffn`` option):

* ``"declared"`` (paper Table 5, "spec-faithful", the default): k parallel branches of width
  ``F // k``, each an up (F//k x H) and a down (H x F//k) matrix. The floor is part of the
  convention, not an accident: the benchmark itself declares F = 512 or 1024 with k = 3 in half
  of its layers (512 // 3 = 170), and the paper's tau 0.695 is computed that way (rounding up
  or to nearest gives 0.695 too). F < k (a zero-width branch) is refused.
* ``"trained"``: the structure the released TensorFlow model actually builds: H -> rH
  (``trained_intermediate_ratio`` r = 4), then k - 1 dense layers of width F, then back to H.
  It ranks worse (tau 0.635 vs 0.695); reported as the lower number.

Attention (``attention`` option): ``"merged"`` (paper default for FlexiBERT: one 3H x H QKV
matrix + H x H output for SA), or ``"per_head"`` (Q/K/V as H/h x H per head). LT scores two
H x H matrices, DSC one H x H. Init: Xavier (appendix H).
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
    check_positive_fields,
    config_object,
    make_role,
    pad_layers,
    whole_number,
)

OPERATIONS = ("SA", "LT", "DSC")
SA, LT, DSC = range(3)


@dataclass(frozen=True)
class FlexiBERTOptions:
    """How a FlexiBERT spec becomes matrices."""

    init: str | float = "xavier"  # paper: Xavier
    attention: str = "merged"  # "merged" QKV (paper) or "per_head"
    ffn: str = "declared"  # "declared" branches (paper, spec-faithful) or "trained" structure
    trained_intermediate_ratio: int = 4  # H -> rH first FFN layer of the trained structure
    seq_len: int = 128  # tokens per forward pass, for #FLOPs

    def __post_init__(self) -> None:
        check_attention("FlexiBERT", self.attention)
        if self.ffn not in ("declared", "trained"):
            raise InvalidInputError(f"FlexiBERT ffn must be 'declared' (spec-faithful) or 'trained'; got {self.ffn!r}")
        check_init(self.init)
        check_positive_fields(self, ("trained_intermediate_ratio", "seq_len"))


@dataclass(frozen=True)
class FlexiBERTArchs:
    """Parsed FlexiBERT architectures, padded to ``(A, L)``."""

    ids: tuple[str, ...]
    hidden_size: np.ndarray  # (A,)
    operation: np.ndarray  # (A, L) codes into OPERATIONS
    heads: np.ndarray
    ffn_dim: np.ndarray
    num_ffn: np.ndarray
    mask: np.ndarray


def _operation_code(arch_id: str, layer: int, operation: Any) -> int:
    if operation not in OPERATIONS:
        raise InvalidInputError(
            f"architecture {arch_id!r}, layer {layer}: operation_type must be one of {OPERATIONS}; got {operation!r}"
        )
    return OPERATIONS.index(operation)


def parse(ids: Sequence[str], configs: Sequence[Mapping[str, Any]]) -> FlexiBERTArchs:
    """Read ``{"hidden_size": H, "encoder_layers": [{operation_type, num_operation_heads,
    feed_forward_dimension, num_feed_forward}, ...]}`` per architecture."""
    hidden, ops, heads, dims, counts = [], [], [], [], []
    for arch_id, config in zip(ids, configs):
        config = config_object(arch_id, config, "FlexiBERT")
        try:
            layers = config["encoder_layers"]
            hidden.append(whole_number(config["hidden_size"]))
            ops.append([_operation_code(arch_id, i, layer["operation_type"]) for i, layer in enumerate(layers)])
            heads.append([whole_number(layer["num_operation_heads"]) for layer in layers])
            dims.append([whole_number(layer["feed_forward_dimension"]) for layer in layers])
            counts.append([whole_number(layer["num_feed_forward"]) for layer in layers])
        except KeyError as err:
            raise InvalidInputError(f"architecture {arch_id!r}: missing FlexiBERT field {err}") from err
        except InvalidInputError:  # already names the architecture and layer (an unknown operation_type)
            raise
        except (TypeError, ValueError) as err:
            raise InvalidInputError(
                f"architecture {arch_id!r}: malformed FlexiBERT spec ({err}); sizes must be integers"
            ) from err
    ids = tuple(ids)
    operation, mask = pad_layers(ids, ops)
    return FlexiBERTArchs(
        ids,
        np.array(hidden, dtype=np.int64),
        operation,
        pad_layers(ids, heads, fill=1)[0],
        pad_layers(ids, dims, fill=1)[0],
        pad_layers(ids, counts, fill=1)[0],
        mask,
    )


def _attention_roles(archs: FlexiBERTArchs, opts: FlexiBERTOptions) -> list[Role]:
    h = archs.hidden_size[:, None]
    op = archs.operation
    is_sa = (op == SA).astype(np.int64)
    if opts.attention == "merged":
        qkv = [make_role("qkv_proj", 3 * h, h, is_sa, opts.init)]
    else:
        qkv = [make_role("qkv_proj_per_head", h // archs.heads, h, 3 * archs.heads * is_sa, opts.init)]
    return qkv + [
        make_role("o_proj", h, h, is_sa, opts.init),
        make_role("lt_dense", h, h, 2 * (op == LT), opts.init),
        make_role("dsc_dense", h, h, (op == DSC).astype(np.int64), opts.init),
    ]


def _ffn_roles(archs: FlexiBERTArchs, opts: FlexiBERTOptions) -> list[Role]:
    h = archs.hidden_size[:, None]
    f, k = archs.ffn_dim, archs.num_ffn
    if opts.ffn == "declared":
        width = f // k
        return [make_role("ffn_up", width, h, k, opts.init), make_role("ffn_down", h, width, k, opts.init)]
    inter = opts.trained_intermediate_ratio * h
    deep = (k > 1).astype(np.int64)
    last_in = np.where(k > 1, f, inter)
    return [
        make_role("intermediate", inter, h, 1, opts.init),
        make_role("intermediate_1", f, inter, deep, opts.init),
        make_role("intermediate_n", f, f, np.maximum(k - 2, 0), opts.init),
        make_role("ffn_output", h, last_in, 1, opts.init),
    ]


def build(archs: FlexiBERTArchs, opts: FlexiBERTOptions | None = None) -> ArchBatch:
    """Vectorised spec of every architecture (no per-architecture Python loop)."""
    opts = opts or FlexiBERTOptions()
    ids, mask = archs.ids, archs.mask
    check_positive(ids, "hidden_size", archs.hidden_size)
    for name, values in (
        ("feed_forward_dimension", archs.ffn_dim),
        ("num_feed_forward", archs.num_ffn),
        ("num_operation_heads", archs.heads),  # 0 heads was reported as "does not divide hidden_size"
    ):
        check_positive(ids, name, values, mask)
    check_divides(ids, "hidden_size", archs.hidden_size[:, None], "num_operation_heads", archs.heads, mask)
    if opts.ffn == "declared":
        check_positive(
            ids,
            "feed_forward_dimension // num_feed_forward (the declared branch width)",
            archs.ffn_dim // archs.num_ffn,
            mask,
        )
    roles = tuple(
        dataclasses.replace(r, positions=opts.seq_len) for r in _attention_roles(archs, opts) + _ffn_roles(archs, opts)
    )
    h = archs.hidden_size
    shape = mask.shape
    biases = sum(np.where(mask, np.broadcast_to(r.rows * r.count, shape), 0).sum(axis=1) for r in roles)
    layers = mask.sum(axis=1)
    sa_layers = (mask & (archs.operation == SA)).sum(axis=1)
    t = opts.seq_len
    return ArchBatch(
        family="flexibert",
        ids=ids,
        mask=mask,
        roles=roles,
        extra_params=biases + 4 * h * layers,  # biases + two LayerNorms per layer; no embeddings
        extra_macs=2 * t * t * h * sa_layers,  # QK^T and AV products of SA layers
        reported={},
        options=dataclasses.asdict(opts),
    )
