"""NSC-DP keeps only non-dominated partial plans after every layer: the state count is the front size.

A weakly dominated state (same value, higher cost) changes no front, since the final merge drops it, but
it is carried into every later layer; so these tests count the kept states instead of timing the solver.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nsc_prune.core import solver


def brute_front_costs(values: list[list[float]], costs: list[list[int]]) -> list[int]:
    """Costs of the Pareto front of every plan over these layers: a plan counts iff it beats all cheaper ones."""
    best: dict[int, float] = {}
    for choice in itertools.product(*[range(len(v)) for v in values]):
        cost = sum(costs[l][j] for l, j in enumerate(choice))
        value = sum(values[l][j] for l, j in enumerate(choice))
        best[cost] = max(best.get(cost, -np.inf), value)
    front, top = [], -np.inf
    for cost in sorted(best):
        if best[cost] > top:
            front.append(cost)
            top = best[cost]
    return front


def by_cost(states: solver._States) -> tuple[list[int], list[int]]:
    order = np.argsort(states.cost, kind="stable")
    return states.cost[order].tolist(), states.grid[order].tolist()


@pytest.mark.parametrize("seed", range(60))
def test_kept_states_are_the_front_of_each_prefix(seed):
    rng = np.random.default_rng(seed)
    n_layers = int(rng.integers(2, 6))
    # small integer values and costs: many exact ties in value at different costs, and in cost
    values = [rng.integers(0, 4, rng.integers(1, 5)).astype(float).tolist() for _ in range(n_layers)]
    costs = [rng.integers(0, 4, len(v)).tolist() for v in values]
    states = solver._kept_states(values, costs)
    assert len(states) == n_layers
    for layer, kept in enumerate(states):
        cost, grid = by_cost(kept)
        assert np.all(np.diff(cost) > 0) and np.all(np.diff(grid) > 0)  # strictly better for every extra cost
        assert cost == brute_front_costs(values[: layer + 1], costs[: layer + 1])


def test_tie_heavy_64_layers_keep_one_state_per_reachable_value():
    # Option j costs j and options 1..3 all score 1: after l layers the best value at cost c is min(c, l),
    # so the non-dominated states are costs 0..l (values 0..l), l + 1 of them; costs l+1..3l tie at value l.
    layers = 64
    states = solver._kept_states([[0.0, 1.0, 1.0, 1.0]] * layers, [[0, 1, 2, 3]] * layers)
    for layer, kept in enumerate(states, start=1):
        cost, grid = by_cost(kept)
        assert cost == list(range(layer + 1))
        assert np.all(np.diff(grid) > 0)
    assert sum(len(kept.cost) for kept in states) == sum(range(2, layers + 2)) == 2144
    # each state picks the cheapest option of its value: option 1 (never 2 or 3) wherever a layer adds 1
    assert set(np.concatenate([kept.pick for kept in states]).tolist()) == {0, 1}


def test_states_rebuild_the_public_front():
    values, costs = [[3.0, 1.0], [2.0, 2.0, 0.0]], [[2, 1], [1, 1, 0]]
    last = solver._kept_states(values, costs)[-1]
    assert sorted(last.cost.tolist()) == [c for c, _, _ in solver.pareto_front(values, costs)] == [1, 2, 3]
