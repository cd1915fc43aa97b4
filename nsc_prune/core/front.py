"""A search space (network-level choices ``g`` x per-layer option tables) and ``search()``, which runs
NSC-DP over it and returns the whole Pareto front. Spaces are built from YAML in ``nsc_prune.spaces``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nsc_prune._validation import is_int, must_be
from nsc_prune.choices import COST_KINDS
from nsc_prune.core import solver
from nsc_prune.core.budget import index_under as budget_index_under
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.core.spec import LayerOption
from nsc_prune.errors import ConfigError, InvalidInputError


@dataclass(frozen=True)
class Subspace:
    """One network-level choice ``g``: its keys (e.g. ``{"d_model": 512, "n_layer": 16}``,
    empty when there is none), the parts it fixes, and one option table per layer.

    ``homogeneous``: its plans keep every kept layer at one shared option label (a dropped layer, label with
    ``keep: false``, is free); ``search`` runs it as one solver group per kept label (``homogeneous_tables``)."""

    choice: Mapping[str, Any]
    fixed: LayerOption
    layers: tuple[tuple[LayerOption, ...], ...]
    homogeneous: bool = False


def _is_drop(label: Any) -> bool:
    return isinstance(label, Mapping) and label.get("keep", True) is False


def _label_key(label: Any) -> Any:
    return tuple(sorted(dict(label).items())) if isinstance(label, Mapping) else label


def homogeneous_tables(sub: Subspace) -> list[list[list[int]]]:
    """The option tables a homogeneous ``sub`` is searched as: for each distinct kept label ``L`` (in order of first
    appearance, so widest first), each layer's indices of its options labelled ``L`` followed by its drop options.
    A label that some layer can neither take nor drop gives no table; ``[]`` when no label is left."""
    kept: dict[Any, None] = {}  # the distinct kept labels, in order
    by_label, drops = [], []
    for options in sub.layers:
        index: dict[Any, list[int]] = {}
        drops.append([])
        for j, option in enumerate(options):
            if _is_drop(option.label):
                drops[-1].append(j)
            else:
                key = _label_key(option.label)
                index.setdefault(key, []).append(j)
                kept.setdefault(key)
        by_label.append(index)
    tables = []
    for key in kept:
        table = [index.get(key, []) + drop for index, drop in zip(by_label, drops)]
        if all(table):
            tables.append(table)
    return tables


DECODER_PARAMS = "deployed parameters; embeddings, lm_head, norms and biases included"
LORA_PARAMS = "deployed parameters after LoRA is merged; embeddings, lm_head, norms and biases included"
DECODER_MACS = (
    "multiply-accumulates of the Linear layers (LoRA and lm_head included) at seq_len tokens (LoNAS convention)"
)


@dataclass(frozen=True)
class SearchSpace:
    """What the search chooses from: one or more ``Subspace`` (network-level choices, each with per-layer option
    tables), with the words every result shows for its cost. Built from a space YAML by ``spaces.registry``."""

    name: str
    subspaces: tuple[Subspace, ...]
    description: str = ""
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # What "params" counts in this space, in words (shown with every result and in pareto.json).
    params_convention: str = DECODER_PARAMS
    macs_convention: str = DECODER_MACS  # what "macs" counts in this space, in words (pareto.json)
    # What MACs are counted per, given the sequence length: a language model's tokens, an image's patches.
    macs_per: str = "@ {seq_len} tokens"
    default_seq_len: int = 256  # the sequence length MACs use when none is given (LoNAS: 256 tokens)

    def __repr__(self) -> str:  # the generated one printed every option of every layer (29 MB for a 70B space)
        layers = max((len(sub.layers) for sub in self.subspaces), default=0)
        return f"SearchSpace({self.name!r}, {len(self.subspaces)} subspaces, up to {layers} layers)"

    def macs_note(self, seq_len: int) -> str:
        """``"@ 256 tokens"`` (decoders) or the space's own wording (``"per 224x224 image ..."``)."""
        return self.macs_per.format(seq_len=seq_len) if seq_len == self.default_seq_len else f"@ {seq_len} tokens"

    @property
    def size(self) -> int:
        """Number of architectures in the space."""
        total = 0
        for sub in self.subspaces:
            for table in homogeneous_tables(sub) if sub.homogeneous else [[list(o) for o in sub.layers]]:
                count = 1
                for options in table:
                    count *= len(options)
                total += count
        return total


def option_plans(space: SearchSpace, what: str) -> list[list[LayerPlan]]:
    """Every layer's options as ``LayerPlan``s, in table order, of a space over one model's decoder layers (the
    elastic and lonas kinds label their options with them); ConfigError naming ``what`` for any other space."""
    layers = space.subspaces[0].layers if len(space.subspaces) == 1 else ()
    if not layers or not all(isinstance(option.label, LayerPlan) for options in layers for option in options):
        raise ConfigError(must_be(what, "a per-layer space of one model (elastic, lonas)", space.name))
    return [[option.label for option in options] for options in layers]


@dataclass(frozen=True)
class LayerCosts:
    """Measured integer costs of a one-subspace space (a latency table in microseconds): ``fixed`` for the parts
    every plan has, ``layers[l][j]`` for option ``j`` of layer ``l``."""

    fixed: int
    layers: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Point:
    """One Pareto-optimal architecture."""

    params: int
    macs: int
    nsc: float
    choice: Mapping[str, Any]
    layers: tuple[Mapping[str, Any], ...]  # each layer's option label: a LayerPlan in a decoder space
    options: tuple[int, ...] = ()  # index of the chosen option in each layer's table
    latency_us: int | None = None  # predicted latency (microseconds) when the search had a latency table


@dataclass(frozen=True)
class ParetoResult:
    """The whole front of ``space`` under ``cost`` (``"params"`` or ``"macs"`` at ``seq_len``)."""

    space: SearchSpace
    cost: str
    seq_len: int
    points: tuple[Point, ...]
    seconds: float

    def __repr__(self) -> str:  # the generated one printed the space and every point (63 MB for a 70B front)
        return (
            f"ParetoResult(space={self.space.name!r}, cost={self.cost!r}, {len(self.points)} points, "
            f"seconds={self.seconds:.3g})"
        )

    def cost_of(self, point: Point) -> int:
        if self.cost == "latency":
            return int(point.latency_us)
        return point.params if self.cost == "params" else point.macs

    def index_under(self, budget: int) -> int:
        """Index of the best point whose cost is ``<= budget`` (raises InfeasibleBudgetError)."""
        return budget_index_under([self.cost_of(p) for p in self.points], budget)


def _option_cost(option: LayerOption, cost: str, seq_len: int) -> int:
    return option.params if cost == "params" else option.macs * seq_len


def _layer_costs(space: SearchSpace, latency: LayerCosts) -> list[list[int]]:
    """``latency`` as the solver's cost table ``[fixed, *layers]``, checked against ``space``'s option tables."""
    shape = [len(options) for sub in space.subspaces for options in sub.layers]
    if len(space.subspaces) != 1 or [len(row) for row in latency.layers] != shape:
        raise InvalidInputError("a latency table must have one cost per option of every layer of a one-subspace space")
    table = [[latency.fixed], *[list(row) for row in latency.layers]]
    if not all(is_int(c) and c >= 0 for row in table for c in row):
        raise InvalidInputError("a latency table's costs must be whole microseconds >= 0 (integers)")
    return table


def _solver_groups(space: SearchSpace) -> list[tuple[int, list[np.ndarray] | None]]:
    """The solver's groups: ``(subspace index, index map)``, the map (one array per layer, the fixed parts first)
    taking a group option to the subspace's option; ``None`` for a subspace searched whole."""
    groups = []
    for g, sub in enumerate(space.subspaces):
        if not sub.homogeneous:
            groups.append((g, None))
            continue
        tables = homogeneous_tables(sub)
        if not tables:
            raise InvalidInputError(
                f"space {space.name!r} is homogeneous but no kept option (label) is shared by every layer that "
                "cannot be dropped; allow depth or pick a grid the layers share"
            )
        groups.extend((g, [np.zeros(1, dtype=np.int64), *map(np.asarray, table)]) for table in tables)
    return groups


def _length(rows: Any) -> int | None:
    """``len(rows)``; None for what has no length (a number where a row was due)."""
    try:
        return len(rows)
    except TypeError:
        return None


def _restrict(table: Sequence[Sequence[Any]], index: list[np.ndarray] | None) -> list[list[Any]]:
    """Each layer's entries at ``index``'s option indices (the whole table for ``None``)."""
    if index is None:
        return [list(row) for row in table]
    return [[row[j] for j in rows] for row, rows in zip(table, index)]


def _checked_arguments(space: Any, cost: Any, seq_len: Any, values: Any, latency: LayerCosts | None) -> int:
    """``search``'s arguments checked (InvalidInputError naming the bad one); returns the tokens MACs count."""
    if not isinstance(space, SearchSpace):
        raise InvalidInputError(f"space must be a SearchSpace (nsc_prune.build_space); got {space!r}")
    if cost not in COST_KINDS:
        raise InvalidInputError(f"cost must be one of {COST_KINDS}; got {cost!r}")
    seq_len = space.default_seq_len if seq_len is None else seq_len
    if not is_int(seq_len) or seq_len <= 0:
        raise InvalidInputError(f"seq_len must be a positive integer; got {seq_len!r}")
    if values is not None and _length(values) != len(space.subspaces):
        raise InvalidInputError(
            f"values must hold one table per subspace of the space ({len(space.subspaces)}), each one row per layer"
        )
    if cost == "latency" and latency is None:
        raise InvalidInputError("cost 'latency' needs a latency table (nsc-prune profile; --latency-table FILE)")
    return int(seq_len)  # np.int64 passes is_int, and would make every point's MACs one


def search(
    space: SearchSpace,
    cost: str = "params",
    seq_len: int | None = None,
    values: Sequence[Sequence[Sequence[float]]] | None = None,
    latency: LayerCosts | None = None,
) -> ParetoResult:
    """Run NSC-DP over every network-level choice of ``space`` and return the whole front.

    ``seq_len``: the tokens MACs are counted over (None: the space's ``default_seq_len``, 256 for decoders).
    ``values[g][l][j]`` replaces the closed-form NSC of option ``j`` of layer ``l`` in subspace
    ``g`` (e.g. psi_W from real weights); by default each option's ``psi_mp`` sum is used.
    ``latency`` (a measured table, ``nsc_prune.core.latency_table``) is the cost under ``cost="latency"`` and is
    reported as each point's ``latency_us`` under any cost.

    A homogeneous subspace is searched as one group per shared kept label (``homogeneous_tables``), its tables,
    values and costs restricted to that label's options and the drop options; the solver merges the groups' fronts
    exactly, and each point's options are mapped back to the subspace's own option indices.
    """
    seq_len = _checked_arguments(space, cost, seq_len, values, latency)
    latency_table = _layer_costs(space, latency) if latency is not None else None
    start = time.perf_counter()
    tables = []
    for g, sub in enumerate(space.subspaces):
        layer_tables = [(sub.fixed,), *sub.layers]
        if values is None:
            layer_values = [[option.nsc for option in options] for options in layer_tables]
        else:
            layer_values = [[sub.fixed.nsc], *values[g]]
            if [_length(v) for v in layer_values] != [len(options) for options in layer_tables]:
                raise InvalidInputError("values must have one entry per option of every layer of the space")
        if cost == "latency":
            costs = latency_table
        else:
            costs = [[_option_cost(option, cost, seq_len) for option in options] for options in layer_tables]
        tables.append((layer_tables, layer_values, costs))
    solved = _closed_form_on_grid(tables) if values is None else [layer_values for _, layer_values, _ in tables]
    solver_groups = _solver_groups(space)
    front = solver.solve([(_restrict(solved[g], index), _restrict(tables[g][2], index)) for g, index in solver_groups])
    points: list[Point | None] = [None] * len(front)
    for group, (g, index) in enumerate(solver_groups):
        members = np.flatnonzero(front.groups == group)
        if members.size == 0:
            continue
        sub, layer_tables = space.subspaces[g], tables[g][0]
        choices = np.stack([front.choices[i] for i in members])
        if index is not None:  # back to the subspace's option indices
            choices = np.stack([rows[choices[:, l]] for l, rows in enumerate(index)], axis=1)
        params = sum(
            np.array([o.params for o in options], dtype=np.int64)[choices[:, l]]
            for l, options in enumerate(layer_tables)
        )
        macs = sum(
            np.array([o.macs for o in options], dtype=np.int64)[choices[:, l]] for l, options in enumerate(layer_tables)
        )
        latency_us = (
            sum(np.array(row, dtype=np.int64)[choices[:, l]] for l, row in enumerate(latency_table))
            if latency_table is not None
            else None
        )
        nsc = sum(np.asarray(row, dtype=np.float64)[choices[:, l]] for l, row in enumerate(tables[g][1]))
        for row, p in enumerate(members):
            points[p] = Point(
                params=int(params[row]),
                macs=int(macs[row]) * seq_len,
                nsc=float(nsc[row]),
                choice=dict(sub.choice),  # its own: a caller editing one point changes no other, nor the space
                layers=tuple(options[j].label for options, j in zip(sub.layers, choices[row, 1:])),
                options=tuple(int(j) for j in choices[row, 1:]),
                latency_us=int(latency_us[row]) if latency_us is not None else None,
            )
    return ParetoResult(
        space=space, cost=cost, seq_len=seq_len, points=_rising(points), seconds=time.perf_counter() - start
    )


def _closed_form_on_grid(tables: list) -> list[list[list[float]]]:
    """Each option's NSC with every matrix's term on a grid twice the DP's step (``LayerOption.nsc_on_grid``), so
    that plans holding the same matrices in another arrangement tie exactly in the DP."""
    step = 2 * max(solver.value_step(layer_values) for _, layer_values, _ in tables)
    return [
        [[option.nsc_on_grid(step) for option in options] for options in layer_tables] for layer_tables, _, _ in tables
    ]


def _rising(points: Sequence[Point]) -> tuple[Point, ...]:
    """The points (by cost) whose NSC, summed from the unrounded values, is above every cheaper point's: the DP
    compares totals on a grid, so a costlier plan it kept by a grid step can sum lower (or level) in floats."""
    kept: list[Point] = []
    for point in points:
        if not kept or point.nsc > kept[-1].nsc:
            kept.append(point)
    return tuple(kept)
