"""Batched architecture specs: the weight matrices of many architectures at once (paper Eq. 6).

A family turns parsed architecture fields into ``Role`` arrays: one role per kind of matrix
(``q_proj``, ``fc1``, ...), with ``rows``, ``cols``, ``std`` and ``count`` arrays that broadcast to
``(A, L)`` (architectures x layers; ``count == 0`` marks a matrix a layer does not have). Layer
capacities ``Psi_l = sum_j count_j psi_mp(m_j, n_j, s_j)`` (section 3.3) are then one vectorised
``psi_mp`` call over every matrix of every layer of every architecture.

The same role arrays with shape ``(K,)`` describe K layer options of a search space, so the
spec of one family is written once and serves both ranking and search (``options_from_roles``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nsc_prune.core.capacity import init_std, psi_mp
from nsc_prune.core.spec import LayerOption, Matrix
from nsc_prune.errors import InvalidInputError

AGGREGATIONS = ("sum", "min", "product")
ATTENTION_CONVENTIONS = ("per_head", "merged")  # Q/K/V as h matrices of d/h x d each, or one 3d x d


def config_object(arch_id: str, config: Any, family: str) -> Mapping[str, Any]:
    """``config`` when it is a JSON object; else one line naming the architecture (not Python's TypeError)."""
    if not isinstance(config, Mapping):
        raise InvalidInputError(f"architecture {arch_id!r}: a {family} config must be a JSON object; got {config!r}")
    return config


MAX_SIZE = 2**20  # a width, depth or head count beyond any network a benchmark holds; products stay in int64


def whole_number(value: Any) -> int:
    """A size read from a benchmark file: ``128``, ``128.0`` or ``"128"`` as 128; ValueError for ``128.5``, NaN,
    text that is not a number or a size above ``MAX_SIZE`` (its products would overflow), TypeError for a bool, a
    list or null (``int()`` would cut 128.5 to 128 silently)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
        raise TypeError(f"a size must be a whole number; got {value!r}")
    if isinstance(value, numbers.Integral):  # numpy's integers too
        number = int(value)
    else:
        try:
            as_float = float(value)
        except ValueError:
            as_float = float("nan")  # text that is no number: the same message
        if not as_float.is_integer():
            raise ValueError(f"a size must be a whole number; got {value!r}")
        number = int(as_float)
    if abs(number) > MAX_SIZE:
        raise ValueError(f"a size must be at most {MAX_SIZE:,}; got {value!r}")
    return number


def ratio_number(value: Any) -> float:
    """A ratio read from a benchmark file (an MLP or expand ratio): a number or numeric text as a float; TypeError
    for a bool (``float(True)`` is 1.0), a list or null; ValueError for text that is not a number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
        raise TypeError(f"a ratio must be a number; got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Role:
    """``count`` matrices of shape ``rows x cols`` (out x in) with init std ``std`` in each layer.

    Every field is an array broadcastable to the batch shape; ``count == 0`` means absent.
    ``positions`` is how many output positions (tokens, pixels) one forward pass applies the
    matrix at, for multiply-accumulate counts.
    """

    name: str
    rows: np.ndarray
    cols: np.ndarray
    std: np.ndarray
    count: np.ndarray
    positions: Any = 1


def check_init(init: Any) -> None:
    """Raise InvalidInputError unless ``init`` is ``"xavier"``, ``"kaiming"`` or a positive std."""
    init_std(1, 1, init)


def check_attention(family: str, attention: Any) -> None:
    """Options validation: ``attention`` must be one of ATTENTION_CONVENTIONS."""
    if attention not in ATTENTION_CONVENTIONS:
        raise InvalidInputError(f"{family} attention must be one of {ATTENTION_CONVENTIONS}; got {attention!r}")


def check_positive_fields(owner: Any, names: Sequence[str]) -> None:
    """Options validation: each named field must be a positive integer."""
    for name in names:
        value = getattr(owner, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise InvalidInputError(f"{type(owner).__name__}.{name} must be a positive integer; got {value!r}")


def make_role(name: str, rows: Any, cols: Any, count: Any, init: str | float, positions: Any = 1) -> Role:
    """A role whose std follows ``init`` (``"xavier"``, ``"kaiming"`` or a number, section 3.2)."""
    rows_a = np.asarray(rows, dtype=np.int64)
    cols_a = np.asarray(cols, dtype=np.int64)
    count_a = np.asarray(count, dtype=np.int64)
    safe_rows, safe_cols = np.maximum(rows_a, 1), np.maximum(cols_a, 1)
    std = np.broadcast_to(
        np.asarray(init_std(safe_rows, safe_cols, init), dtype=np.float64),
        np.broadcast_shapes(rows_a.shape, cols_a.shape),
    )
    return Role(name, rows_a, cols_a, std, count_a, np.asarray(positions, dtype=np.int64))


_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio); uint64 products wrap


def _distinct_layers(fields: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``first`` of distinct layers and ``inverse`` mapping every layer to its copy.

    Layers are compared on every role field. A 64-bit hash finds candidates in one sort; the
    result is verified field by field, so a hash collision only costs speed (no sharing), never
    a wrong score.
    """
    key = np.zeros(fields[0].shape, dtype=np.uint64)
    for values in fields:
        if values.dtype.kind == "i":  # floats (stds) are only verified: they follow the shapes
            key = key * _HASH_MULTIPLIER + values.view(np.uint64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if all(np.array_equal(values[first][inverse], values) for values in fields):
        return first, inverse.ravel()
    every = np.arange(fields[0].size)
    return every, every


def role_capacity(roles: Sequence[Role], shape: tuple[int, ...]) -> np.ndarray:
    """Summed capacity of ``roles`` per batch element (``Psi_l``, section 3.3).

    ``psi_mp`` runs once per distinct layer (benchmarks repeat a handful of layer shapes
    thousands of times), vectorised over those layers.
    """
    flat = [
        [
            np.ascontiguousarray(np.broadcast_to(a, shape), dtype=dt).ravel()
            for a, dt in ((r.rows, np.int64), (r.cols, np.int64), (r.std, np.float64), (r.count, np.int64))
        ]
        for r in roles
    ]
    first, inverse = _distinct_layers([v for role in flat for v in role])
    picked = [tuple(v[first] for v in role) for role in flat]
    present = [np.flatnonzero(count > 0) for *_, count in picked]
    layer = np.concatenate(present)
    if layer.size == 0:
        return np.zeros(shape, dtype=np.float64)
    rows, cols, std, count = (np.concatenate([role[k][idx] for role, idx in zip(picked, present)]) for k in range(4))
    total = np.bincount(layer, weights=count * psi_mp(rows, cols, std), minlength=first.size)
    return total[inverse].reshape(shape)


def role_params(roles: Sequence[Role], shape: tuple[int, ...]) -> np.ndarray:
    """Weight entries (= multiply-accumulates per token) of ``roles`` per batch element."""
    total = np.zeros(shape, dtype=np.int64)
    for role in roles:
        total += np.broadcast_to(role.rows * role.cols * role.count, shape)
    return total


@dataclass(frozen=True)
class ArchBatch:
    """The scored matrices of A architectures with up to L layers each.

    ``extra_params`` / ``extra_macs`` (shape ``(A,)``, per forward pass) are counted but not
    scored: biases, norms, embeddings, attention score products. ``reported`` holds baseline
    numbers a benchmark file ships (e.g. AutoFormer's ``flops``), used instead of our count.
    """

    family: str
    ids: tuple[str, ...]
    mask: np.ndarray
    roles: tuple[Role, ...]
    extra_params: np.ndarray
    extra_macs: np.ndarray
    reported: Mapping[str, np.ndarray]
    options: Mapping[str, Any]

    def __len__(self) -> int:
        return len(self.ids)

    def layer_capacity(self) -> np.ndarray:
        """``Psi_l`` per architecture and layer, shape ``(A, L)``; 0 where a layer is absent."""
        return np.where(self.mask, role_capacity(self.roles, self.mask.shape), 0.0)

    def params(self) -> np.ndarray:
        """Parameters per architecture (weights of every role + ``extra_params``)."""
        return np.where(self.mask, role_params(self.roles, self.mask.shape), 0).sum(axis=1) + self.extra_params

    def macs(self) -> np.ndarray:
        """Multiply-accumulates of one forward pass: each role's weights x its ``positions``,
        plus ``extra_macs``."""
        shape = self.mask.shape
        total, size = np.zeros(shape, dtype=np.int64), np.zeros(shape)
        for role in self.roles:
            total += np.broadcast_to(role.rows * role.cols * role.count * role.positions, shape)
            size += np.broadcast_to(np.float64(role.rows) * role.cols * role.count * role.positions, shape)
        size = np.where(self.mask, size, 0).sum(axis=1) + self.extra_macs
        if size.size and size.max() >= 2**62:  # int64 would wrap around silently
            worst = int(np.argmax(size))
            raise InvalidInputError(
                f"architecture {self.ids[worst]!r}: {size[worst]:.3g} multiply-accumulates, beyond the 64-bit integers "
                "the count is exact in; its sizes are larger than any network a benchmark holds"
            )
        return np.where(self.mask, total, 0).sum(axis=1) + self.extra_macs

    def flops(self) -> np.ndarray:
        """The #FLOPs baseline: the file's own figure when it ships one, else ``macs()``."""
        return (
            np.asarray(self.reported["flops"], dtype=np.float64)
            if "flops" in self.reported
            else self.macs().astype(np.float64)
        )

    def layer_options(self, index: int) -> tuple[LayerOption, ...]:
        """The single-architecture spec of row ``index``: one LayerOption per present layer."""
        shape = self.mask.shape
        fields = [
            (role.name, *(np.broadcast_to(a, shape)[index] for a in (role.rows, role.cols, role.std, role.count)))
            for role in self.roles
        ]
        options = []
        for layer in np.flatnonzero(self.mask[index]):
            matrices = tuple(
                Matrix(int(rows[layer]), int(cols[layer]), float(std[layer]), int(count[layer]), name)
                for name, rows, cols, std, count in fields
                if count[layer] > 0
            )
            options.append(LayerOption(label={"layer": int(layer)}, matrices=matrices))
        return tuple(options)


def aggregate(layer_psi: np.ndarray, mask: np.ndarray, how: str = "sum") -> np.ndarray:
    """Combine layer capacities into one score per architecture (paper Table 2, appendix C).

    ``sum`` is NSC (Eq. 6); ``min`` is the serial bottleneck; ``product`` multiplies them.
    """
    if how == "sum":
        return np.where(mask, layer_psi, 0.0).sum(axis=1)
    if how == "min":
        return np.where(mask, layer_psi, np.inf).min(axis=1)
    if how == "product":
        return np.where(mask, layer_psi, 1.0).prod(axis=1)
    raise InvalidInputError(f"aggregation must be one of {AGGREGATIONS}; got {how!r}")


def options_from_roles(
    roles: Sequence[Role], labels: Sequence[Mapping[str, Any]], extra_params: Any = 0, extra_macs: Any = 0
) -> tuple[LayerOption, ...]:
    """K LayerOptions from role arrays of shape ``(K,)`` (search-space tables)."""
    k = len(labels)
    extra_p = np.broadcast_to(np.asarray(extra_params, dtype=np.int64), (k,))
    extra_m = np.broadcast_to(np.asarray(extra_macs, dtype=np.int64), (k,))
    cols = [tuple(np.broadcast_to(a, (k,)) for a in (r.rows, r.cols, r.std, r.count)) for r in roles]
    values = role_capacity(roles, (k,))
    options = []
    for i, label in enumerate(labels):
        matrices = tuple(
            Matrix(int(rows[i]), int(c[i]), float(std[i]), int(count[i]), role.name)
            for role, (rows, c, std, count) in zip(roles, cols)
            if count[i] > 0
        )
        options.append(
            LayerOption(
                label=dict(label),
                matrices=matrices,
                extra_params=int(extra_p[i]),
                extra_macs=int(extra_m[i]),
                capacity=float(values[i]),
            )
        )  # one psi_mp call for all K
    return tuple(options)


def check_positive(ids: Sequence[str], name: str, values: np.ndarray, mask: np.ndarray | None = None) -> None:
    """Raise InvalidInputError naming the first row (and layer) where ``values`` is not > 0."""
    bad = values <= 0
    if mask is not None:
        bad &= mask
    if np.any(bad):
        where = np.argwhere(bad)[0]
        layer = f", layer {int(where[1])}" if bad.ndim == 2 else ""
        raise InvalidInputError(
            f"architecture {ids[int(where[0])]!r}{layer}: {name} must be a positive integer; "
            f"got {values[tuple(where)].item()!r}"
        )


def check_choices(
    ids: Sequence[str], name: str, values: np.ndarray, allowed: Sequence[Any], position: str = "layer"
) -> None:
    """Raise InvalidInputError naming the first row (and ``position``) where ``values`` is not in ``allowed``."""
    bad = ~np.isin(values, allowed)
    if np.any(bad):
        where = np.argwhere(bad)[0]
        at = f", {position} {int(where[1])}" if bad.ndim == 2 else ""
        raise InvalidInputError(
            f"architecture {ids[int(where[0])]!r}{at}: {name} must be one of {tuple(allowed)}; "
            f"got {values[tuple(where)].item()!r}"
        )


def check_divides(
    ids: Sequence[str], width_name: str, width: np.ndarray, heads_name: str, heads: np.ndarray, mask: np.ndarray
) -> None:
    """Raise InvalidInputError naming the first row/layer whose ``heads`` does not divide ``width``."""
    width_b = np.broadcast_to(width, mask.shape)
    bad = mask & ((heads <= 0) | (width_b % np.maximum(heads, 1) != 0))
    if np.any(bad):
        row, layer = (int(v) for v in np.argwhere(bad)[0])
        raise InvalidInputError(
            f"architecture {ids[row]!r}, layer {layer}: {heads_name}={int(heads[row, layer])} does not divide "
            f"{width_name}={int(width_b[row, layer])}; every head must get a whole number of channels"
        )


def pad_layers(
    ids: Sequence[str], rows: Sequence[Sequence[Any]], fill: Any = 0, dtype: Any = np.int64
) -> tuple[np.ndarray, np.ndarray]:
    """Pad ragged per-layer lists into an ``(A, L_max)`` array and a presence mask."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    width = int(lengths.max()) if len(rows) else 0
    if width == 0:
        raise InvalidInputError("every architecture has zero layers; nothing to score")
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise InvalidInputError(f"architecture {ids[int(empty[0])]!r} has no layers")
    out = np.full((len(rows), width), fill, dtype=dtype)
    mask = np.arange(width)[None, :] < lengths[:, None]
    try:
        out[mask] = np.concatenate([np.asarray(r, dtype=dtype) for r in rows])
    except (TypeError, ValueError) as err:
        raise InvalidInputError(f"per-layer values must be numbers: {err}") from err
    return out, mask
