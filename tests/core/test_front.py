"""The search's arguments from Python: each bad one is refused naming it, never read as something else."""

from __future__ import annotations

import re

import pytest

from nsc_prune.core import solver
from nsc_prune.core.budget import index_under
from nsc_prune.core.front import LayerCosts, search
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.spaces.registry import build_space

CONFIG = dict(
    model_type="llama",
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
)


@pytest.fixture(scope="module")
def space():
    return build_space("ffn-grid", CONFIG, ffn_step=48)  # two options a layer: FFN 96 and 48


@pytest.mark.parametrize("seq_len", [0, -1, 0.5, float("nan"), True, "256"])
def test_seq_len_must_be_a_positive_integer(space, seq_len):
    with pytest.raises(InvalidInputError, match="seq_len must be a positive integer"):
        search(space, cost="macs", seq_len=seq_len)


def test_macs_follow_the_space_s_own_tokens_when_none_are_given():
    vit = build_space("autoformer-tiny", embed_dim=[192], depth=[12])
    assert vit.default_seq_len == 197  # 14 x 14 patches and the class token
    assert search(vit, cost="macs").points[-1].macs == search(vit, cost="macs", seq_len=197).points[-1].macs
    assert search(vit, cost="macs").seq_len == 197


@pytest.mark.parametrize("values", [[], [[1.0, 2.0]] * 3, [[[1.0, 2.0]] * 2], [[1.0, 2.0, 3.0]]])
def test_values_of_another_nesting_are_refused(space, values):
    with pytest.raises(InvalidInputError, match="values must"):
        search(space, values=values)


@pytest.mark.parametrize("fixed, row", [(-100, (5, 3)), (10.7, (5, 3)), (float("nan"), (5, 3)), (10, (5, -3))])
def test_a_latency_table_is_checked_under_every_cost(space, fixed, row):
    table = LayerCosts(fixed=fixed, layers=(row,) * 3)
    for cost in ("params", "latency"):
        with pytest.raises(InvalidInputError, match="whole microseconds >= 0"):
            search(space, cost=cost, latency=table)


def test_a_latency_table_is_reported_under_params(space):
    table = LayerCosts(fixed=10, layers=((5, 3),) * 3)
    assert [p.latency_us for p in search(space, latency=table).points][-1] == 10 + 3 * 5
    free = LayerCosts(fixed=0, layers=((5, 0),) * 3)  # an option timed at 0 us (a dropped layer) is a cost
    assert [p.latency_us for p in search(space, cost="latency", latency=free).points][0] == 0


def test_a_spaces_own_macs_wording_is_for_its_own_tokens_only():
    space = build_space("autoformer-tiny")
    assert space.macs_note(space.default_seq_len).startswith("per 224x224 image")
    assert space.macs_note(100) == "@ 100 tokens"


@pytest.mark.parametrize("budget", [float("nan"), "10", None, 2.5, True])
def test_index_under_needs_an_integer_budget(budget):
    front = solver.solve([([[1.0, 2.0], [1.0, 3.0]], [[1, 2], [1, 3]])])  # costs 2..5
    with pytest.raises(InvalidInputError, match="budget must be an integer"):
        front.index_under(budget)
    with pytest.raises(InvalidInputError, match="budget must be an integer"):
        index_under([2, 3, 4, 5], budget)
    assert front.index_under(4) == 2 and index_under([2, 3, 4, 5], 4) == 2


def test_a_name_where_an_object_is_due_is_refused_naming_what_to_pass():
    from nsc_prune import score

    with pytest.raises(InvalidInputError, match="space must be a SearchSpace"):
        search("ffn-grid")
    with pytest.raises(ConfigError, match="a model config must be config.json's dict; got 'llama-7b'"):
        score("llama-7b")  # was AttributeError: 'str' object has no attribute 'get'


def test_a_latency_front_keeps_no_plan_that_only_rearranges_a_cheaper_one():
    """Two plans that swap KV groups between layers hold the same matrices: one NSC, but not one latency. Each
    layer's value was rounded to the DP's grid on its own, so the slower one could score a step higher and stay on
    the front (with a lower printed NSC), and a budget above it chose it over the faster one."""
    config = dict(CONFIG, model_type="qwen2", intermediate_size=128)
    space = build_space("ffn-heads-depth", config, ffn_step=32)
    us = ((4, 9, 4, 24, 3, 19), (25, 8, 29, 17, 22, 25, 19), (28, 4, 9, 3, 23, 2, 28))
    points = search(space, cost="latency", latency=LayerCosts(fixed=32, layers=us)).points
    assert all(later.nsc > earlier.nsc for earlier, later in zip(points, points[1:]))
    labels = [[dict(label) for label in point.layers] for point in points]
    slower = [{"ffn": 128, "kv_groups": 2}, {"ffn": 128, "kv_groups": 2}, {"ffn": 96, "kv_groups": 1}]
    assert [{"ffn": 128, "kv_groups": 2}, {"ffn": 128, "kv_groups": 1}, {"ffn": 96, "kv_groups": 2}] in labels
    assert slower not in labels  # 64 us for the NSC of the plan above at 53 us
    # 3 + 3 KV groups against 2 + 4: the same matrices in other counts (each term rounded whole, they were apart)
    config = dict(CONFIG, model_type="qwen2", num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4)
    space = build_space("ffn-heads", dict(config, intermediate_size=192), ffn_step=96)
    us = ((21, 13, 8, 16, 23, 26, 7, 18), (25, 36, 23, 3, 22, 15, 26, 3))
    points = search(space, cost="latency", latency=LayerCosts(fixed=10, layers=us)).points
    plans = [[(label["ffn"], label["kv_groups"]) for label in point.layers] for point in points]
    assert [(192, 3), (96, 3)] in plans and [(192, 2), (96, 4)] not in plans  # 38 us against 40 us for one NSC


def test_the_front_s_nsc_rises_even_where_the_dp_s_grid_ranks_otherwise():
    """The DP compares totals on a grid (step s = 2**-39 here); the NSC it reports is the float sum. A plan it keeps
    by a grid step (1.0 + 2.55 s rounds up) can sum below a cheaper one (two options at 1.45 s, each rounded down):
    that costlier, lower point is no Pareto point."""
    from nsc_prune.core.front import SearchSpace, Subspace
    from nsc_prune.core.spec import LayerOption

    s = 2.0**-39

    def layer(costs):
        return tuple(LayerOption(label={"option": j}, matrices=(), extra_params=c) for j, c in enumerate(costs))

    space = SearchSpace(
        name="grid", subspaces=(Subspace({}, LayerOption(label={}, matrices=()), (layer((0, 1, 3)), layer((0, 1)))),)
    )
    values = [[[1.0, 1.0 + 1.45 * s, 1.0 + 2.55 * s], [0.5, 0.5 + 1.45 * s]]]
    points = search(space, values=values).points
    assert [p.params for p in points] == [0, 1, 2, 4]  # not 3: option 2 and option 0 sum to 1.5 + 2.55 s < 1.5 + 2.9 s
    assert all(later.nsc > earlier.nsc for earlier, later in zip(points, points[1:]))


def test_a_point_s_network_choice_is_its_own():
    """Every point of a NAS subspace held the subspace's own dict: editing one point's choice rewrote its siblings
    and the space, and a later search of the space returned points whose choice contradicted their layers."""
    space = build_space("txl-wt103")
    first = search(space)
    layers = first.points[0].choice["n_layer"]
    first.points[0].choice["n_layer"] = 99
    assert sum(p.choice.get("n_layer") == 99 for p in first.points) == 1
    assert search(space).points[0].choice["n_layer"] == layers


def test_a_percentage_is_of_the_full_model_given_not_of_the_front_s_costliest_point():
    """A score can cut the full model from the front: 50 % of a 600 model is 300, the last point, not 150."""
    from nsc_prune.core.budget import select

    assert select([100, 200, 300], "50%", full=600) == (2, 300)
    assert select([100, 200, 300], "50%") == (0, 150)


def test_a_costlier_plan_that_sums_level_with_a_cheaper_one_is_no_pareto_point():
    """Multiples of 0.3 (found by a seeded search) whose float sums tie for two plans of different costs: the
    costlier plan, level with the cheaper one, is no Pareto point (``_rising`` keeps only a strictly higher NSC)."""
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 256, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 3, "vocab_size": 256}  # fmt: skip
    space = build_space("ffn-grid", config, ffn_step=64)
    values = [
        [[3.3, 2.4, 1.2], [2.6999999999999997, 1.7999999999999998, 0.8999999999999999], [0.8999999999999999, 0, 0]]
    ]
    points = search(space, values=values).points
    assert all(later.nsc > earlier.nsc for earlier, later in zip(points, points[1:])) and len(points) == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [  # the boundaries and hints mutants of budget.py changed unseen
        (("150%", 1000, 20000, "latency"), "got '150% = 30 ms (30,000 us) latency'. A percentage of the full model is"),
        (("1000", 1, 100, "params"), "got '1000 = 10x the full model'"),
        (("1001", 1, 100, "params"), "got '1001 = 10x the full model'"),
        (("999", 1, 100, "params"), "got '999 = 999.0% of the full model'"),
        (("100", 100_000_000, 135_000_000, "params"), "got '100 = 100 params'. Did you mean 100M or 100%?"),
    ],
)
def test_budget_limits_and_their_hints(args, message):
    from nsc_prune.core.budget import check_budget

    with pytest.raises(InvalidInputError, match=re.escape(message)):
        check_budget(*args)


def test_a_params_budget_near_the_models_macs_asks_about_cost_macs_up_to_half_again():
    from nsc_prune.core.budget import check_budget

    for budget in ("5B", "6B", "7.5B"):  # MACs of 5.000B: 1.5x still reads as a MACs budget
        with pytest.raises(InvalidInputError, match=r"Did you mean --cost macs \(the full model is 5.000B MACs\)"):
            check_budget(budget, 1000, 135_000_000, "params", other_full=5_000_000_000)
    with pytest.raises(InvalidInputError, match="Pass --allow-above-full") as refused:
        check_budget("7.6B", 1000, 135_000_000, "params", other_full=5_000_000_000)
    assert "--cost macs" not in str(refused.value)


def test_budget_parsing_at_its_edges():
    from nsc_prune.core.budget import MAX_BUDGET, format_count, parse_budget

    assert parse_budget(f"{MAX_BUDGET}") == MAX_BUDGET  # the limit itself is a budget
    with pytest.raises(InvalidInputError, match="past any model's cost"):
        parse_budget(f"{MAX_BUDGET + 1}")
    with pytest.raises(InvalidInputError, match="is a percentage but there is no full model to take it of"):
        parse_budget("50%")
    assert format_count(999_999_500_000_000) == "1000.000T"  # the largest unit holds what is past it
