"""psi_MP vs psi_W consistency report, pinned to a two-layer case computed by hand."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("scipy")

from nsc_prune.core.front import SearchSpace, Subspace, search  # noqa: E402
from nsc_prune.core.spec import LayerOption  # noqa: E402
from nsc_prune.hf.score.psi_w import consistency_report  # noqa: E402

# Two layers, three options each, costing 2, 1 and 0 params. psi_MP is layer-symmetric; psi_W is not.
COSTS = (2, 1, 0)
MP = [[3.0, 2.0, 0.0], [3.0, 2.0, 0.0]]
W = [[3.0, 4.0, 0.0], [6.0, 2.0, 0.0]]


def tiny_space() -> SearchSpace:
    options = tuple(LayerOption(label={"option": j}, matrices=(), extra_params=c) for j, c in enumerate(COSTS))
    fixed = LayerOption(label={}, matrices=())  # costs nothing, scores 0
    return SearchSpace(name="tiny", subspaces=(Subspace(choice={}, fixed=fixed, layers=(options,) * 2),))


def test_report_of_a_hand_computed_case():
    # psi_MP front (ties: the lexicographically smallest plan), with each plan's psi_W:
    #   cost 0: (2,2) MP 0   W 0
    #   cost 1: (1,2) MP 2   W 4        (ties (2,1))
    #   cost 2: (1,1) MP 4   W 6        ((0,2) and (2,0) have MP 3)
    #   cost 3: (0,1) MP 5   W 5        (ties (1,0))
    #   cost 4: (0,0) MP 6   W 9
    # psi_W oracle, the best W plan costing at most the same:
    #   0: (2,2) 0;  1: (1,2) 4;  2: (1,1) 6 (ties (2,0));  3: (1,0) 10;  4: (1,0) 10 (beats (0,0) = 9)
    # option multisets match at costs 0, 1, 2 and 3 ((0,1) is (1,0) reordered), not at 4: 4/5.
    # regret (oracle - W) / oracle: 0 (oracle 0), 0, 0, 5/10, 1/10: mean 0.6/5 = 0.12, max 0.5.
    # W along the front 0, 4, 6, 5, 9 against MP 0, 2, 4, 5, 6: one discordant pair of 10,
    # tau = (9 - 1) / 10 = 0.8; rank differences 0, 0, 1, -1, 0: rho = 1 - 6 * 2 / (5 * 24) = 0.9.
    space = tiny_space()
    mp, svd = search(space, values=[MP]), search(space, values=[W])
    assert [(p.params, p.nsc, p.options) for p in mp.points] == [
        (0, 0.0, (2, 2)),
        (1, 2.0, (1, 2)),
        (2, 4.0, (1, 1)),
        (3, 5.0, (0, 1)),
        (4, 6.0, (0, 0)),
    ]
    oracle = [(0, 0.0, (2, 2)), (1, 4.0, (1, 2)), (2, 6.0, (1, 1)), (3, 10.0, (1, 0))]
    assert [(p.params, p.nsc, p.options) for p in svd.points] == oracle
    report = consistency_report(mp, svd, W)
    assert report == {
        "points": 5,
        "kendall_tau": pytest.approx(0.8, abs=1e-12),
        "spearman_rho": pytest.approx(0.9, abs=1e-12),
        "histogram_match": 0.8,
        "regret_mean": pytest.approx(0.12, abs=1e-12),
        "regret_max": 0.5,
    }


def test_identical_scores_agree_perfectly():
    # psi_W = psi_MP: every plan is its own oracle.
    space = tiny_space()
    mp = search(space, values=[MP])
    report = consistency_report(mp, mp, MP)
    perfect = pytest.approx(1.0, abs=1e-12)
    assert report == {
        "points": 5,
        "kendall_tau": perfect,
        "spearman_rho": perfect,
        "histogram_match": 1.0,
        "regret_mean": 0.0,
        "regret_max": 0.0,
    }


def test_a_score_constant_over_the_front_has_no_correlation():
    """psi_W equal for every option (channels it cannot tell apart): tau and rho are undefined, None, not the NaN
    that made pareto.json unwritable (a traceback after the search)."""
    space = tiny_space()
    mp = search(space, values=[MP])
    flat = [[1.0] * len(options) for options in MP]
    report = consistency_report(mp, search(space, values=[flat]), flat)
    assert report["kendall_tau"] is None and report["spearman_rho"] is None
    assert report["regret_max"] == 0.0  # every plan is as good as the oracle's


def test_a_front_of_one_point_ranks_nothing():
    """A space of one architecture (every layer protected): the report named it 1.0, then ranking's check refused
    it after psi_W was computed ("need at least 2 architectures to rank")."""
    space = tiny_space()
    mp = search(space, values=[MP])
    one = dataclasses.replace(mp, points=mp.points[-1:])
    report = consistency_report(one, mp, MP)
    assert report["points"] == 1 and report["kendall_tau"] is None and report["spearman_rho"] is None
