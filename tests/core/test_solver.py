"""NSC-DP against brute-force enumeration, with the documented tie rules."""

import itertools

import numpy as np
import pytest

from nsc_prune.core import solver
from nsc_prune.errors import InfeasibleBudgetError, InvalidInputError


def brute_front(groups):
    """Every plan of every group, then the documented rule: sort by (cost, -value, group, choice)
    and keep a plan iff its value beats every cheaper-or-earlier kept plan."""
    plans = []
    for g, (values, costs) in enumerate(groups):
        for choice in itertools.product(*[range(len(v)) for v in values]):
            cost = sum(costs[l][j] for l, j in enumerate(choice))
            value = sum(values[l][j] for l, j in enumerate(choice))
            plans.append((cost, -value, g, choice))
    plans.sort()
    front, best = [], -np.inf
    for cost, neg_value, g, choice in plans:
        if -neg_value > best:
            front.append((cost, -neg_value, g, choice))
            best = -neg_value
    return front


def random_groups(rng, integer_values, sparse_costs=False):
    groups = []
    for _ in range(rng.integers(1, 4)):
        n_layers = rng.integers(1, 5)
        values, costs = [], []
        for _ in range(n_layers):
            n_opt = rng.integers(1, 5)
            vals = rng.integers(-3, 8, n_opt).astype(float) if integer_values else rng.normal(size=n_opt)
            values.append(vals.tolist())
            small = rng.integers(0, 6, n_opt)  # zero-cost and equal-cost options
            # sparse: costs far apart with gcd 1, so the solver takes its general (sorting) path
            costs.append((small * 10**9 + rng.integers(0, 2, n_opt) if sparse_costs else small).tolist())
        groups.append((values, costs))
    return groups


@pytest.fixture(params=["packed", "unpacked"])
def lattice_route(request, monkeypatch):
    """Both routes of costs on a lattice: (grid, index) packed into one key, or too wide to pack (Llama-3-70B
    ``ffn-heads-depth``'s later layers); candidates made two or three at a time, as large fronts are in chunks."""
    monkeypatch.setattr(solver, "_CHUNK", 5)
    if request.param == "unpacked":
        monkeypatch.setattr(solver, "_PACKED_BITS", 0)


@pytest.mark.parametrize("seed", range(300))
def test_front_equals_brute_force(seed, lattice_route):
    rng = np.random.default_rng(seed)
    # even seeds: many exact ties; every third seed: costs off any small lattice
    groups = random_groups(rng, integer_values=seed % 2 == 0, sparse_costs=seed % 3 == 0)
    expected = brute_front(groups)
    front = solver.solve(groups)
    assert [int(c) for c in front.costs] == [c for c, _, _, _ in expected]
    assert [int(g) for g in front.groups] == [g for _, _, g, _ in expected]
    assert [tuple(int(j) for j in ch) for ch in front.choices] == [ch for _, _, _, ch in expected]
    np.testing.assert_allclose(front.values, [v for _, v, _, _ in expected], rtol=1e-12, atol=1e-12)
    assert np.all(np.diff(front.costs) > 0) and np.all(np.diff(front.values) > 0)


@pytest.mark.parametrize("seed", range(100))
def test_best_under_equals_brute_force(seed):
    rng = np.random.default_rng(1000 + seed)
    values, costs = random_groups(rng, integer_values=seed % 2 == 0)[0]
    plans = brute_front([(values, costs)])
    for budget in range(-1, 25):
        fitting = [p for p in plans if p[0] <= budget]
        if not fitting:
            with pytest.raises(InfeasibleBudgetError, match="below the smallest plan") as info:
                solver.best_under(values, costs, budget)
            assert info.value.min_cost == plans[0][0]
            continue
        cost, value, _, choice = fitting[-1]
        got = solver.best_under(values, costs, budget)
        assert (got[0], got[2]) == (cost, choice) and got[1] == pytest.approx(value)


def test_pareto_front_api_shape():
    front = solver.pareto_front([[3.0, 1.0], [2.0, 2.0, 0.0]], [[2, 1], [1, 1, 0]])
    # cost 2 ties in value (3.0) between (0, 2) and (1, 0): the lexicographically smallest wins.
    assert front == [(1, 1.0, (1, 2)), (2, 3.0, (0, 2)), (3, 5.0, (0, 0))]


def test_permuting_identical_layers_ties_exactly():
    # Layer-symmetric values that float addition would break ties on: wider options go first.
    vals = [0.1 + 1e-3 * np.sqrt(k) for k in range(5)][::-1]
    costs = [5, 4, 3, 2, 1]
    values = [vals] * 7
    front = solver.pareto_front(values, [costs] * 7)
    for _, _, choice in front:
        assert list(choice) == sorted(choice), choice  # non-decreasing: earlier layers wider


def test_large_integer_costs_need_no_grid():
    values = [[1.0, 2.0], [1.0, 2.5]]
    costs = [[10**12, 3 * 10**12], [10**12, 2 * 10**12 + 7]]
    assert solver.best_under(values, costs, 3 * 10**12 + 7) == (3 * 10**12 + 7, 3.5, (0, 1))


@pytest.mark.parametrize(
    "values, costs, match",
    [
        ([], [], "no layers"),
        ([[1.0], []], [[1], []], "layer 1 has no options"),
        ([[1.0]], [[1.5]], "whole numbers"),
        ([[1.0]], [[-1]], ">= 0"),
        ([[float("nan")]], [[1]], "NaN or infinite"),
        ([[1.0, 2.0]], [[1]], "2 values but 1 costs"),
        ([[1.0]], [[1], [2]], "1 layers but costs has 2"),
        ([[1.0]], [["a"]], "whole numbers"),
        ([["a"]], [[1]], "values must be numbers"),
        ([[1.0, 2.0]], [[2**70, 1]], "below 2\\*\\*62"),
        ([[1e308]], [[1]], "at most 1e\\+300"),
        ([[1.0, 2.0]] * 2, [[1, 2**61]] * 2, "would cost 4,611,686,018,427,387,904, beyond the exact integer range"),
        ([[1.0, 2.0]], [[[1], [2]]], "flat lists, one number per option; got values of shape \\(2,\\) and costs of "),
        ([1.0, 2.0], [1, 2], "flat lists, one number per option"),  # was "layer 0 has 1 values but 1 costs"
        (None, None, "values and costs must be lists of layers"),
        ([["1", "2"]], [[1, 2]], "values must be numbers"),
        ([[True, False]], [[1, 2]], "values must be numbers"),
    ],
)
def test_bad_tables_raise(values, costs, match):
    with pytest.raises(InvalidInputError, match=match):
        solver.pareto_front(values, costs)


def test_the_costliest_plan_may_reach_one_below_the_limit():
    """2**62 is refused (above), 2**62 - 1 is solved exactly."""
    assert solver.pareto_front([[1.0], [2.0]], [[2**61], [2**61 - 1]]) == [(2**62 - 1, 3.0, (0, 0))]


def test_a_group_is_a_values_and_costs_pair():
    with pytest.raises(InvalidInputError, match="each group must be a \\(values, costs\\) pair"):
        solver.solve([([[1.0]],)])


@pytest.mark.parametrize("budget", [float("nan"), "5", 3.5, None, True])
def test_budget_must_be_an_integer(budget):
    with pytest.raises(InvalidInputError, match="budget must be an integer"):
        solver.best_under([[1.0, 2.0]], [[1, 2]], budget)
