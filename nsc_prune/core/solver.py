"""NSC-DP: exact multiple-choice knapsack over per-layer option tables (paper Algorithm 1).

Input: for each layer ``l`` a table of options, ``values[l][j]`` (float, the layer capacity
Psi_l) and ``costs[l][j]`` (non-negative int: parameters, MACs, ...). Output: the whole Pareto
front, i.e. for every budget ``b`` the plan maximising the summed value at cost ``<= b``.

The DP is sparse: after each layer it keeps only the non-dominated (cost, value) states, so it is
exact for arbitrary integer costs (billions of parameters need no budget grid) and runs in
``O(L * J * P log(J P))`` with ``P`` the front size. Network-level choices ``g`` (Algorithm 1's
outer loop) are separate groups whose fronts are merged by the same dominance rule.

Ties (documented contract, tested against brute force):

* Values are compared exactly on a binary grid: each option value is rounded to a multiple of
  ``2**-k`` with ``k`` chosen so the largest possible total is about ``2**40`` grid steps
  (relative resolution ~1e-12); sums of grid values are exact integers. So plans that differ
  only by permuting identical layers tie exactly instead of by floating-point noise.
  Integer-valued inputs up to 2**40 are represented exactly.
* Among plans of equal value, the cheaper one wins (the front is strictly increasing in both
  cost and value).
* Among plans of equal value and cost, the lexicographically smallest tuple of option indices
  wins: layer 0 takes the earliest option it can, then layer 1, and so on. With options listed
  widest first, wider layers go to the front of the network.
* Across network-level groups, the earlier group (in the space's order) wins a full tie.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nsc_prune.core.budget import index_under
from nsc_prune.errors import InvalidInputError

GRID_BITS = 40
MAX_TOTAL_COST = 2**62  # plan costs are summed in int64
MAX_ABS_VALUE = 1e300  # values are summed in float64 and scaled onto a binary grid
_CHUNK = 1 << 16  # candidates (state, option) scattered at a time
_PACKED_BITS = 62  # a (grid, index) key packed into one int64 for one scatter-max


@dataclass(frozen=True)
class Front:
    """A Pareto front: point ``p`` costs ``costs[p]``, scores ``values[p]``, picks option
    ``choices[p][l]`` in layer ``l`` of network-level group ``groups[p]``. Sorted by cost."""

    costs: np.ndarray
    values: np.ndarray
    choices: tuple[np.ndarray, ...]
    groups: np.ndarray

    def __len__(self) -> int:
        return len(self.costs)

    def index_under(self, budget: int) -> int:
        """Index of the best point with cost ``<= budget`` (``nsc_prune.core.budget.index_under``)."""
        return index_under(self.costs.tolist(), budget)


def _as_tables(
    values: Sequence[Sequence[float]], costs: Sequence[Sequence[int]]
) -> list[tuple[np.ndarray, np.ndarray]]:
    if not all(isinstance(t, Sequence) or isinstance(t, np.ndarray) for t in (values, costs)):
        raise InvalidInputError(
            f"values and costs must be lists of layers (values[l][j], costs[l][j]); got {type(values).__name__} "
            f"and {type(costs).__name__}"
        )
    if len(values) == 0:
        raise InvalidInputError("the search space has no layers: values and costs are empty")
    if len(values) != len(costs):
        raise InvalidInputError(f"values has {len(values)} layers but costs has {len(costs)}")
    tables = []
    for layer, (vals, csts) in enumerate(zip(values, costs)):
        vals, raw = np.asarray(vals), np.asarray(csts)
        if vals.ndim != 1 or raw.ndim != 1:
            raise InvalidInputError(
                f"layer {layer}'s values and costs must be flat lists, one number per option; got values of shape "
                f"{vals.shape} and costs of shape {raw.shape}"
            )
        if vals.dtype.kind not in "iuf":
            raise InvalidInputError(f"values must be numbers; layer {layer} has {vals.tolist()!r}")
        vals = vals.astype(np.float64)
        if vals.size == 0:
            raise InvalidInputError(f"layer {layer} has no options")
        if raw.shape != vals.shape:
            raise InvalidInputError(f"layer {layer} has {vals.size} values but {raw.size} costs")
        if not np.all(np.isfinite(vals)):
            raise InvalidInputError(f"layer {layer} has a NaN or infinite value: {vals.tolist()}")
        if np.any(np.abs(vals) > MAX_ABS_VALUE):
            raise InvalidInputError(
                f"values must be at most {MAX_ABS_VALUE:g} in size; layer {layer} has {vals.tolist()}"
            )
        if raw.dtype.kind == "O" and all(isinstance(c, int) for c in raw.ravel()):
            raise InvalidInputError(_too_costly(layer, max(raw.ravel())))
        if raw.dtype.kind not in "iuf" or (
            raw.dtype.kind == "f" and not np.all(np.isfinite(raw) & (raw == np.round(raw)))
        ):
            raise InvalidInputError(f"costs must be whole numbers; layer {layer} has {raw.tolist()}")
        if np.any(raw < 0):
            raise InvalidInputError(f"costs must be >= 0; layer {layer} has {raw.tolist()}")
        if np.any(raw >= MAX_TOTAL_COST):
            raise InvalidInputError(_too_costly(layer, raw.max()))
        tables.append((vals, raw.astype(np.int64)))
    total = sum(int(csts.max()) for _, csts in tables)
    if total >= MAX_TOTAL_COST:
        raise InvalidInputError(
            f"the most expensive plan would cost {total:,}, beyond the exact integer range of the solver (2**62); "
            "count in coarser units (fewer --macs-tokens for MACs; a parameter count this large is a typo in the "
            "config)"
        )
    return tables


def _grid_exponent(groups: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]]) -> int:
    """Power-of-two scale putting the largest possible |total| near 2**GRID_BITS."""
    span = max(sum(float(np.max(np.abs(vals))) for vals, _ in tables) for tables in groups)
    return GRID_BITS - (math.ceil(math.log2(span)) if span > 0 else 0)


def value_step(values: Sequence[Sequence[float]]) -> float:
    """The value resolution of the DP over one group's per-layer ``values``: plans whose totals differ by less may
    tie (a tie-break meant to separate two options must be worth a few steps)."""
    return math.ldexp(1.0, -_grid_exponent([[(np.asarray(row, dtype=float), np.zeros(0)) for row in values]]))


def _cost_unit(tables: Sequence[tuple[np.ndarray, np.ndarray]]) -> int:
    """The largest integer dividing every cost difference within every layer (the lattice step)."""
    return int(np.gcd.reduce(np.concatenate([csts - csts.min() for _, csts in tables]))) or 1


@dataclass(frozen=True)
class _States:
    """The partial plans NSC-DP keeps after one layer (non-dominated only), in lexicographic plan
    order: state ``s`` costs ``cost[s]``, scores ``grid[s]`` grid steps, and extends state
    ``parent[s]`` of the previous layer with option ``pick[s]`` of this one."""

    cost: np.ndarray
    grid: np.ndarray
    parent: np.ndarray
    pick: np.ndarray


def _forward(tables: Sequence[tuple[np.ndarray, np.ndarray]], exponent: int, unit: int) -> list[_States]:
    """Forward sparse DP over one group's layers: the kept states after each layer.

    States are kept in lexicographic order of their partial plans, and candidate ``(state p,
    option j)`` sits at flat index ``p * J + j``: so the flat index *is* the tie-break key (a
    smaller index is a lexicographically smaller plan) and never needs to be materialised.
    """
    cost = np.zeros(1, dtype=np.int64)
    grid = np.zeros(1, dtype=np.int64)
    states = []
    for vals, csts in tables:
        qvals = np.rint(np.ldexp(vals, exponent)).astype(np.int64)
        n_opt = len(qvals)
        winners = _cost_winners(cost, grid, csts, qvals, unit)
        parent, pick = winners // n_opt, winners % n_opt
        cand_grid = grid[parent] + qvals[pick]
        best_before = np.maximum.accumulate(cand_grid)
        keep = np.ones(winners.size, dtype=bool)
        keep[1:] = cand_grid[1:] > best_before[:-1]
        kept = np.sort(winners[keep])  # back to lexicographic order
        parent, pick = kept // n_opt, kept % n_opt
        cost, grid = cost[parent] + csts[pick], grid[parent] + qvals[pick]
        states.append(_States(cost=cost, grid=grid, parent=parent, pick=pick))
    return states


def _layer_front(tables: Sequence[tuple[np.ndarray, np.ndarray]], exponent: int, unit: int):
    """One group's front, sorted by cost: final costs, grid values, choices."""
    states = _forward(tables, exponent, unit)
    last = states[-1]
    by_cost = np.argsort(last.cost, kind="stable")
    choices = np.empty((by_cost.size, len(states)), dtype=np.int64)
    state = by_cost
    for layer in range(len(states) - 1, -1, -1):
        choices[:, layer] = states[layer].pick[state]
        state = states[layer].parent[state]
    return last.cost[by_cost], last.grid[by_cost], choices


def _kept_states(values: Sequence[Sequence[float]], costs: Sequence[Sequence[int]]) -> list[_States]:
    """The states ``pareto_front(values, costs)`` keeps after each layer (for tests and diagnostics)."""
    tables = _as_tables(values, costs)
    return _forward(tables, _grid_exponent([tables]), _cost_unit(tables))


def _cost_winners(
    cost: np.ndarray, grid: np.ndarray, opt_cost: np.ndarray, opt_grid: np.ndarray, unit: int
) -> np.ndarray:
    """For each distinct candidate cost, the flat index ``p * J + j`` of the candidate with the
    highest grid value, then the smallest index; returned in increasing cost order."""
    n = cost.size * opt_cost.size
    slots = (int(cost.max() - cost.min()) + int(opt_cost.max() - opt_cost.min())) // unit + 1
    if slots <= 4 * n + 1024:
        return _lattice_winners(cost, grid, opt_cost, opt_grid, unit, slots)
    # General integer costs: sort by (cost, -grid); lexsort is stable, so within a full tie the
    # smaller flat index (the lexicographically smaller plan) comes first.
    cand_cost = (cost[:, None] + opt_cost[None, :]).ravel()
    cand_grid = (grid[:, None] + opt_grid[None, :]).ravel()
    order = np.lexsort((-cand_grid, cand_cost))
    sorted_cost = cand_cost[order]
    first = np.concatenate(([True], sorted_cost[1:] != sorted_cost[:-1]))
    return order[first]


def _lattice_winners(
    cost: np.ndarray, grid: np.ndarray, opt_cost: np.ndarray, opt_grid: np.ndarray, unit: int, slots: int
) -> np.ndarray:
    """``_cost_winners`` where costs sit on a lattice of ``slots`` steps of ``unit``: a scatter-max per cost slot.

    Candidates are made a few states at a time (about ``_CHUNK`` of them), so they stay in cache: making all
    ``P * J`` at once (36 MB a layer for Llama-3-70B ``ffn-heads-depth``) spent more time faulting fresh pages in
    than scattering."""
    state_slot, option_slot = (cost - cost.min()) // unit, (opt_cost - opt_cost.min()) // unit
    rows = max(1, _CHUNK // opt_cost.size)
    chunks = [slice(start, start + rows) for start in range(0, cost.size, rows)]
    n = cost.size * opt_cost.size
    bits = max(int(n - 1).bit_length(), 1)
    state_grid, option_grid = grid - grid.min(), opt_grid - opt_grid.min()
    if (int(state_grid.max()) + int(option_grid.max())).bit_length() + bits <= _PACKED_BITS:
        # Pack (grid, low - index) into one int64, so one scatter-max applies both tie rules.
        low = (1 << bits) - 1
        state_key = (state_grid << bits) + low - np.arange(cost.size, dtype=np.int64) * opt_cost.size
        option_key = (option_grid << bits) - np.arange(opt_cost.size)
        best = np.full(slots, -1, dtype=np.int64)
        for chunk in chunks:
            np.maximum.at(
                best, (state_slot[chunk, None] + option_slot).ravel(), (state_key[chunk, None] + option_key).ravel()
            )
        return low - (best[best >= 0] & low)
    # Too many bits to pack: the highest grid value per slot first, then the smallest flat index that reaches it.
    top_grid = np.full(slots, np.iinfo(np.int64).min, dtype=np.int64)
    for chunk in chunks:
        np.maximum.at(top_grid, (state_slot[chunk, None] + option_slot).ravel(), (grid[chunk, None] + opt_grid).ravel())
    first = np.full(slots, n, dtype=np.int64)
    for chunk in chunks:
        slot = (state_slot[chunk, None] + option_slot).ravel()
        top = (grid[chunk, None] + opt_grid).ravel() == top_grid[slot]
        flat = np.arange(chunk.start, min(chunk.stop, cost.size))[:, None] * opt_cost.size + np.arange(opt_cost.size)
        np.minimum.at(first, slot[top], flat.ravel()[top])
    return first[first < n]


def solve(groups: Sequence[tuple[Sequence[Sequence[float]], Sequence[Sequence[int]]]]) -> Front:
    """Exact Pareto front over network-level groups, each a ``(values, costs)`` layer table.

    Groups may have different numbers of layers; ``Front.choices[p]`` has the length of its
    group. Fold parts fixed by a group (embeddings, attention fixed by ``g``) into a one-option
    layer.
    """
    if len(groups) == 0:
        raise InvalidInputError("the search space has no network-level choices")
    if not all(isinstance(group, (tuple, list)) and len(group) == 2 for group in groups):
        raise InvalidInputError("each group must be a (values, costs) pair of layer tables")
    checked = [_as_tables(values, costs) for values, costs in groups]
    exponent = _grid_exponent(checked)
    fronts = [_layer_front(tables, exponent, _cost_unit(tables)) for tables in checked]
    cost = np.concatenate([front[0] for front in fronts])
    grid = np.concatenate([front[1] for front in fronts])
    group = np.concatenate([np.full(len(front[0]), g, dtype=np.int64) for g, front in enumerate(fronts)])
    local = np.concatenate([np.arange(len(front[0])) for front in fronts])
    order = np.lexsort((group, -grid, cost))
    first = np.ones(order.size, dtype=bool)
    first[1:] = cost[order][1:] != cost[order][:-1]
    winners = order[first]
    best_before = np.maximum.accumulate(grid[winners])
    keep = np.ones(winners.size, dtype=bool)
    keep[1:] = grid[winners[1:]] > best_before[:-1]
    kept = winners[keep]
    values = np.concatenate([_sum_values(tables, front[2]) for tables, front in zip(checked, fronts)])
    choices = tuple(fronts[group[p]][2][local[p]] for p in kept)
    return Front(costs=cost[kept], values=values[kept], choices=choices, groups=group[kept])


def _sum_values(tables: Sequence[tuple[np.ndarray, np.ndarray]], choices: np.ndarray) -> np.ndarray:
    total = np.zeros(choices.shape[0])
    for layer, (vals, _) in enumerate(tables):
        total += vals[choices[:, layer]]
    return total


def pareto_front(
    values: Sequence[Sequence[float]] | np.ndarray, costs: Sequence[Sequence[int]] | np.ndarray
) -> list[tuple[int, float, tuple[int, ...]]]:
    """Every Pareto-optimal plan as ``(cost, value, choice)``, sorted by cost.

    ``values[l][j]``/``costs[l][j]`` describe option ``j`` of layer ``l``; ``choice`` is a tuple
    of option indices. Cost and value are both strictly increasing along the list on the DP's value
    grid (module docstring); the float sums returned may dip by less than a grid step. The plan at
    index ``p`` is the best (ties: module docstring) of all plans costing at most ``cost_p``.
    """
    front = solve([(values, costs)])
    return [(int(c), float(v), tuple(int(j) for j in ch)) for c, v, ch in zip(front.costs, front.values, front.choices)]


def best_under(
    values: Sequence[Sequence[float]] | np.ndarray,
    costs: Sequence[Sequence[int]] | np.ndarray,
    budget: int | np.integer,
) -> tuple[int, float, tuple[int, ...]]:
    """The highest-value plan (on the DP's value grid) with total cost ``<= budget`` as ``(cost, value, choice)``.

    Raises InfeasibleBudgetError (with ``min_cost``) when even the cheapest plan costs more.
    """
    front = solve([(values, costs)])
    index = front.index_under(budget)
    return int(front.costs[index]), float(front.values[index]), tuple(int(j) for j in front.choices[index])


def _too_costly(layer: int, cost: int | float) -> str:
    """The refusal of a cost beyond the solver's integers, its size in three digits (not all three hundred)."""
    try:
        size = f"{float(cost):.3g}"
    except OverflowError:
        size = f"a {len(str(cost))}-digit number"
    return (
        f"costs must be below 2**62 (4.61e+18); layer {layer} has {size}: count in coarser units (fewer "
        "--macs-tokens for MACs; a parameter count this large is a typo in the config)"
    )
