"""Convolutional networks (paper section 3.3, appendices F.2, F.4).

A convolution ``c_out x c_in x k x k`` is scored as the ``c_out x (c_in k^2)`` matrix it applies to
im2col patches; a depthwise convolution as one ``c x k^2`` matrix (c x (1 . k^2)); Kaiming
fan-in init (std sqrt(2 / (c_in k^2))). Two layouts:

* NATS-Bench size space (Dong et al. 2021): 5 channel counts from {8, 16, ..., 64}; stem 3x3 conv,
  then cell, residual block (stride 2), cell, residual block (stride 2), cell. Every cell is the
  size space's fixed topology (the best topology-space cell): node1 = conv3(x0); node2 =
  conv3(x0) + conv3(node1); out = skip(x0) + conv3(node1) + conv3(node2), the skip being a 1x1
  conv when the cell changes width.
* Once-for-All MobileNetV3 (Cai et al. 2020, width 1.0): per-stage depth ``d`` in {2, 3, 4} (5
  stages) and per-block kernel ``ks`` in {3, 5, 7} and expand ratio ``e`` in {3, 4, 6} (20 slots,
  inactive ones included, as OFA encodes them); blocks are inverted
  bottlenecks (1x1 expand, depthwise k x k, squeeze-excite in stages 2, 4, 5, 1x1 project).

Classifiers are counted but not scored (like embeddings and lm_head).
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
    check_choices,
    check_init,
    check_positive,
    check_positive_fields,
    config_object,
    make_role,
    ratio_number,
    whole_number,
)


def conv_role(name: str, c_out: Any, c_in: Any, kernel: Any, count: Any, init: str | float, positions: Any = 1) -> Role:
    """``count`` convolutions ``c_out x c_in x k x k`` as ``c_out x (c_in k^2)`` matrices."""
    k = np.asarray(kernel, dtype=np.int64)
    return make_role(name, c_out, np.asarray(c_in, dtype=np.int64) * k * k, count, init, positions)


def depthwise_role(name: str, channels: Any, kernel: Any, count: Any, init: str | float, positions: Any = 1) -> Role:
    """``count`` depthwise convolutions on ``channels`` as one ``c x k^2`` matrix each."""
    k = np.asarray(kernel, dtype=np.int64)
    return make_role(name, channels, k * k, count, init, positions)


def make_divisible(value: Any, divisor: int = 8) -> np.ndarray:
    """Round channels to a multiple of ``divisor``, never below 90% of ``value`` (MobileNet rule)."""
    v = np.asarray(value, dtype=np.float64)
    out = np.maximum(divisor, (v + divisor / 2).astype(np.int64) // divisor * divisor)
    return np.where(out < 0.9 * v, out + divisor, out).astype(np.int64)


# --------------------------------------------------------------------------------------------
# NATS-Bench size search space

NATS_CHANNELS = (8, 16, 24, 32, 40, 48, 56, 64)
STEM, CELL, RESBLOCK = range(3)
NATS_KINDS = np.array([STEM, CELL, RESBLOCK, CELL, RESBLOCK, CELL])


@dataclass(frozen=True)
class NatsOptions:
    """How a NATS-Bench size-space network becomes matrices."""

    init: str | float = "kaiming"  # fan-in sqrt(2 / (c_in k^2))
    image_size: int = 32  # CIFAR; ImageNet16-120 uses 16
    num_classes: int = 100

    def __post_init__(self) -> None:
        check_init(self.init)
        check_positive_fields(self, ("image_size", "num_classes"))
        # each residual block halves it with a pool that rounds down (and a conv that rounds up)
        if self.image_size % 4:
            raise InvalidInputError(f"NatsOptions.image_size must be a multiple of 4; got {self.image_size!r}")


@dataclass(frozen=True)
class NatsArchs:
    """Parsed channel counts, one row of 5 per architecture."""

    ids: tuple[str, ...]
    channels: np.ndarray  # (A, 5)


def parse_nats(ids: Sequence[str], configs: Sequence[Any]) -> NatsArchs:
    """Read ``"8:16:32:48:64"`` strings, 5-lists, or ``{"channels": ...}`` per architecture."""
    rows = []
    for arch_id, config in zip(ids, configs):
        value = config.get("channels") if isinstance(config, Mapping) else config
        try:
            channels = [whole_number(c) for c in (value.split(":") if isinstance(value, str) else value)]
        except (TypeError, ValueError, AttributeError) as err:
            raise InvalidInputError(
                f"architecture {arch_id!r}: NATS-Bench channels must look like '8:16:32:48:64'; got {value!r}"
            ) from err
        if len(channels) != 5:
            raise InvalidInputError(
                f"architecture {arch_id!r}: NATS-Bench size space has 5 channel counts; got {len(channels)}"
            )
        rows.append(channels)
    return NatsArchs(tuple(ids), np.array(rows, dtype=np.int64).reshape(len(rows), 5))


def build_nats(archs: NatsArchs, opts: NatsOptions | None = None) -> ArchBatch:
    """Six scored layers per network: stem, cell, resblock, cell, resblock, cell."""
    opts = opts or NatsOptions()
    c = archs.channels
    check_choices(archs.ids, "channels", c, NATS_CHANNELS, position="stage")
    n = len(archs.ids)
    c_out = np.concatenate([c[:, :1], c], axis=1)  # stem writes C0
    c_in = np.concatenate([np.full((n, 1), 3), c[:, :1], c[:, :-1]], axis=1)
    kind = np.broadcast_to(NATS_KINDS, c_out.shape)
    side = opts.image_size // np.array([1, 1, 2, 2, 4, 4])
    pos = side * side
    cell, res = (kind == CELL).astype(np.int64), (kind == RESBLOCK).astype(np.int64)
    init = opts.init
    roles = (
        conv_role("stem", c_out, c_in, 3, (kind == STEM).astype(np.int64), init, pos),
        conv_role("cell_conv_from_input", c_out, c_in, 3, 2 * cell, init, pos),
        conv_role("cell_skip_1x1", c_out, c_in, 1, cell * (c_in != c_out), init, pos),
        conv_role("cell_conv", c_out, c_out, 3, 3 * cell, init, pos),
        conv_role("res_conv_a", c_out, c_in, 3, res, init, pos),
        conv_role("res_conv_b", c_out, c_out, 3, res, init, pos),
        conv_role("res_downsample_1x1", c_out, c_in, 1, res, init, pos),
    )
    bn_layers = (kind == STEM) + cell * (5 + (c_in != c_out)) + 2 * res  # BatchNorms (the downsample has none)
    bn = 2 * (c_out * bn_layers).sum(axis=1) + 2 * c[:, -1]  # + the final BatchNorm
    head = c[:, -1] * opts.num_classes + opts.num_classes
    return ArchBatch(
        family="nats-sss",
        ids=archs.ids,
        mask=np.ones(c_out.shape, dtype=bool),
        roles=roles,
        extra_params=bn + head,
        extra_macs=c[:, -1] * opts.num_classes,
        reported={},
        options=dataclasses.asdict(opts),
    )


# --------------------------------------------------------------------------------------------
# Once-for-All MobileNetV3

OFA_STAGE_WIDTHS = (24, 40, 80, 112, 160)
OFA_STAGE_STRIDES = (2, 2, 2, 1, 2)
OFA_STAGE_SE = (False, True, False, True, True)
OFA_KERNELS = (3, 5, 7)
OFA_EXPANDS = (3, 4, 6)
OFA_DEPTHS = (2, 3, 4)
OFA_MAX_DEPTH = max(OFA_DEPTHS)
OFA_FIRST, OFA_FINAL_EXPAND, OFA_FEATURE_MIX = 16, 960, 1280


@dataclass(frozen=True)
class OfaOptions:
    """How a Once-for-All MobileNetV3 subnet becomes matrices."""

    init: str | float = "kaiming"  # fan-in sqrt(2 / (c_in k^2))
    num_classes: int = 1000

    def __post_init__(self) -> None:
        check_init(self.init)
        check_positive_fields(self, ("num_classes",))


@dataclass(frozen=True)
class OfaArchs:
    """Parsed OFA encodings: kernel and expand ratio per block slot, depth per stage, resolution."""

    ids: tuple[str, ...]
    kernel: np.ndarray  # (A, 20)
    expand: np.ndarray  # (A, 20)
    depth: np.ndarray  # (A, 5)
    resolution: np.ndarray  # (A,)


def parse_ofa(ids: Sequence[str], configs: Sequence[Mapping[str, Any]]) -> OfaArchs:
    """Read OFA's ``{"ks": [20], "e": [20], "d": [5], "r": 224 or [224]}`` per architecture."""
    ks, es, ds, rs = [], [], [], []
    slots = len(OFA_STAGE_WIDTHS) * OFA_MAX_DEPTH
    for arch_id, config in zip(ids, configs):
        config = config_object(arch_id, config, "OFA")
        try:
            k, e, d = (
                [whole_number(v) for v in _listed(config, "ks")],
                [ratio_number(v) for v in _listed(config, "e")],
                [whole_number(v) for v in _listed(config, "d")],
            )
            r = config.get("r", 224)
            if isinstance(r, (list, tuple)):  # OFA's own encoding holds the resolution in a one-item list
                if len(r) != 1:
                    raise ValueError(f"r must be one resolution; got {r!r}")
                r = r[0]
            r = whole_number(r)
        except KeyError as err:
            raise InvalidInputError(f"architecture {arch_id!r}: missing OFA field {err} (expected ks, e, d)") from err
        except (TypeError, ValueError) as err:
            raise InvalidInputError(f"architecture {arch_id!r}: malformed OFA arch ({err})") from err
        if len(k) != slots or len(e) != slots or len(d) != len(OFA_STAGE_WIDTHS):
            raise InvalidInputError(
                f"architecture {arch_id!r}: OFA MobileNetV3 needs 20 ks, 20 e and 5 d; got {len(k)}, {len(e)}, {len(d)}"
            )
        ks.append(k), es.append(e), ds.append(d), rs.append(r)
    return OfaArchs(
        tuple(ids),
        np.array(ks, dtype=np.int64).reshape(-1, slots),
        np.array(es, dtype=np.float64).reshape(-1, slots),
        np.array(ds, dtype=np.int64).reshape(-1, len(OFA_STAGE_WIDTHS)),
        np.array(rs, dtype=np.int64),
    )


def _listed(config: Mapping[str, Any], key: str) -> list:
    """``config[key]`` when it is a JSON list (a string of 20 digits would be read as 20 values)."""
    value = config[key]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{key} must be a list; got {value!r}")
    return list(value)


@dataclass(frozen=True)
class _OfaSlots:
    """Per-slot shapes of a batch of OFA architectures: ``width``, ``block_in``, ``kernel`` and ``se`` per block
    slot; ``mid``, ``se_mid``, ``pos_in``, ``pos_out`` and ``active`` (A, 20); ``first_pos`` (A, 1) and
    ``final_pos`` (A,) the spatial positions of the first conv and the final expand."""

    width: np.ndarray
    block_in: np.ndarray
    kernel: np.ndarray
    se: np.ndarray
    mid: np.ndarray
    se_mid: np.ndarray
    pos_in: np.ndarray
    pos_out: np.ndarray
    active: np.ndarray
    first_pos: np.ndarray
    final_pos: np.ndarray


def _ofa_slots(archs: OfaArchs) -> _OfaSlots:
    """The 20 MBConv block slots' widths, expansions and spatial sizes (the first conv halves the input)."""
    slot = np.arange(len(OFA_STAGE_WIDTHS) * OFA_MAX_DEPTH)
    stage, j = slot // OFA_MAX_DEPTH, slot % OFA_MAX_DEPTH
    width = np.array(OFA_STAGE_WIDTHS)[stage]
    prev = np.array((OFA_FIRST,) + OFA_STAGE_WIDTHS[:-1])[stage]
    block_in = np.where(j == 0, prev, width)
    # downsampling before each block and after it; the first conv halves the input
    strides = np.cumprod(np.array(OFA_STAGE_STRIDES))
    stride_in = np.where(j == 0, np.concatenate([[1], strides[:-1]])[stage], strides[stage])[None, :]
    stride_out = strides[stage][None, :]

    def side(stride: Any) -> np.ndarray:
        """The feature map's side after ``2 * stride`` of downsampling: each stride-2 conv (padding k // 2) has
        ceil(side / 2) positions a side, and nested ceilings of halves are one ceiling."""
        return -(-archs.resolution[:, None] // (2 * stride))

    mid = make_divisible(np.round(block_in[None, :] * archs.expand))
    return _OfaSlots(
        width=width,
        block_in=block_in,
        kernel=archs.kernel,
        se=np.array(OFA_STAGE_SE)[stage][None, :].astype(np.int64),
        mid=mid,
        se_mid=make_divisible(mid // 4),
        pos_in=side(stride_in) ** 2,
        pos_out=side(stride_out) ** 2,
        active=j[None, :] < archs.depth[:, stage],
        first_pos=side(1) ** 2,
        final_pos=side(strides[-1])[:, 0] ** 2,
    )


def _ofa_placer(n: int) -> Any:
    """``place(block, first, first_block, final, mix)``: per-slot values laid out as (A, 24): [first conv, first
    block, 20 blocks, final expand, feature mix]."""
    blocks = len(OFA_STAGE_WIDTHS) * OFA_MAX_DEPTH

    def place(block: Any, first: Any, first_block: Any, final: Any, mix: Any) -> np.ndarray:
        head = [np.broadcast_to(v, (n, 1)) for v in (first, first_block)]
        tail = [np.broadcast_to(v, (n, 1)) for v in (final, mix)]
        return np.concatenate(head + [np.broadcast_to(block, (n, blocks))] + tail, axis=1)

    return place


def _ofa_roles(s: _OfaSlots, place: Any, init: str) -> tuple:
    """The layer roles of every slot: first conv and block, the MBConv parts (with SE), final expand, feature mix."""
    first_pos, mid, se, se_mid = s.first_pos, s.mid, s.se, s.se_mid
    return (
        conv_role(
            "first_conv",
            place(1, OFA_FIRST, 1, 1, 1),
            place(1, 3, 1, 1, 1),
            3,
            place(0, 1, 0, 0, 0),
            init,
            place(1, first_pos, 1, 1, 1),
        ),
        depthwise_role(
            "first_block_dw", place(1, 1, OFA_FIRST, 1, 1), 3, place(0, 0, 1, 0, 0), init, place(1, 1, first_pos, 1, 1)
        ),
        conv_role(
            "first_block_pw",
            place(1, 1, OFA_FIRST, 1, 1),
            place(1, 1, OFA_FIRST, 1, 1),
            1,
            place(0, 0, 1, 0, 0),
            init,
            place(1, 1, first_pos, 1, 1),
        ),
        conv_role(
            "inverted_bottleneck",
            place(mid, 1, 1, 1, 1),
            place(s.block_in, 1, 1, 1, 1),
            1,
            place(1, 0, 0, 0, 0),
            init,
            place(s.pos_in, 1, 1, 1, 1),
        ),
        depthwise_role(
            "depthwise",
            place(mid, 1, 1, 1, 1),
            place(s.kernel, 1, 1, 1, 1),
            place(1, 0, 0, 0, 0),
            init,
            place(s.pos_out, 1, 1, 1, 1),
        ),
        conv_role("se_reduce", place(se_mid, 1, 1, 1, 1), place(mid, 1, 1, 1, 1), 1, place(se, 0, 0, 0, 0), init),
        conv_role("se_expand", place(mid, 1, 1, 1, 1), place(se_mid, 1, 1, 1, 1), 1, place(se, 0, 0, 0, 0), init),
        conv_role(
            "point_linear",
            place(s.width, 1, 1, 1, 1),
            place(mid, 1, 1, 1, 1),
            1,
            place(1, 0, 0, 0, 0),
            init,
            place(s.pos_out, 1, 1, 1, 1),
        ),
        conv_role(
            "final_expand",
            place(1, 1, 1, OFA_FINAL_EXPAND, 1),
            place(1, 1, 1, OFA_STAGE_WIDTHS[-1], 1),
            1,
            place(0, 0, 0, 1, 0),
            init,
            place(1, 1, 1, s.final_pos[:, None], 1),
        ),
        conv_role(
            "feature_mix",
            place(1, 1, 1, 1, OFA_FEATURE_MIX),
            place(1, 1, 1, 1, OFA_FINAL_EXPAND),
            1,
            place(0, 0, 0, 0, 1),
            init,
        ),
    )


def build_ofa(archs: OfaArchs, opts: OfaOptions | None = None) -> ArchBatch:
    """24 layer slots: first conv, first block, 20 MBConv blocks (masked by ``d``), final expand, feature mix."""
    opts = opts or OfaOptions()
    ids = archs.ids
    n = len(ids)
    check_choices(ids, "ks", archs.kernel, OFA_KERNELS, position="block slot")
    check_choices(ids, "e", archs.expand, OFA_EXPANDS, position="block slot")
    check_choices(ids, "d", archs.depth, OFA_DEPTHS, position="stage")
    check_positive(ids, "r", archs.resolution)
    slots, place = _ofa_slots(archs), _ofa_placer(n)
    roles = _ofa_roles(slots, place, opts.init)
    active, mid, width, se, se_mid = slots.active, slots.mid, slots.width, slots.se, slots.se_mid
    mask = place(active, True, True, True, True).astype(bool)
    bn = 2 * np.where(mask, place(2 * mid + width, OFA_FIRST, 2 * OFA_FIRST, OFA_FINAL_EXPAND, 0), 0).sum(axis=1)
    se_bias = np.where(active, se * (se_mid + mid), 0).sum(axis=1)
    head = OFA_FEATURE_MIX * opts.num_classes + opts.num_classes
    return ArchBatch(
        family="ofa-mbv3",
        ids=ids,
        mask=mask,
        roles=roles,
        extra_params=bn + se_bias + head,
        extra_macs=np.full(n, OFA_FEATURE_MIX * opts.num_classes, dtype=np.int64),
        reported={},
        options=dataclasses.asdict(opts),
    )
