"""The search's arguments from Python: each bad one is refused naming it, never read as something else."""

from __future__ import annotations

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
