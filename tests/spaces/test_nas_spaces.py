"""The paper's NAS spaces (Transformer-XL, AutoFormer): exactness against brute force on shrunken
copies, the paper's plans, YAML contract, and the search CLI."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter

import numpy as np
import pytest

from nsc_prune._files import SPACES_DIR
from nsc_prune.cli import main
from nsc_prune.core.budget import parse_budget
from nsc_prune.core.capacity import init_std, psi_mp
from nsc_prune.core.front import search
from nsc_prune.errors import ConfigError, InfeasibleBudgetError
from nsc_prune.ranking import families
from nsc_prune.spaces.nas import txl_layer_params
from nsc_prune.spaces.registry import build_space

MY_SPACES = ("txl-wt103", "autoformer-tiny", "autoformer-small", "autoformer-base")
ATTENTION = ("merged", "per_head")


def psi(m, n, init):
    return float(psi_mp(m, n, init_std(m, n, init)))


def brute_front(archs):
    """Pareto front ``[(cost, value)]`` of ``(cost, value)`` pairs, by enumeration."""
    front, best = [], -np.inf
    for cost, value in sorted(archs, key=lambda a: (a[0], -a[1])):
        if value > best * (1 + 1e-12) + 1e-9:
            if front and front[-1][0] == cost:
                continue
            front.append((cost, value))
            best = value
    return front


# ---------------------------------------------------------------------------------------------
# exactness on shrunken spaces (independent value and cost formulas)


def txl_archs(d_models, n_layers, d_ffs, attention, d_head=64):
    for d, layers in itertools.product(d_models, n_layers):
        h = d // d_head
        attn = (3 * h * psi(d_head, d, 0.02) if attention == "per_head" else psi(3 * d, d, 0.02)) + psi(d, d, 0.02)
        for plan in itertools.product(d_ffs, repeat=layers):
            value = layers * attn + sum(2 * psi(f, d, 0.02) for f in plan)
            cost = sum(4 * d * d + 9 * d + f * (2 * d + 1) for f in plan)
            yield cost, value


@pytest.mark.parametrize("attention", ATTENTION)
def test_txl_search_equals_brute_force(attention):
    shrunk = {"d_model": [128, 256], "n_layer": [2, 3], "d_ff": [512, 640, 1024], "attention": attention}
    result = search(build_space("txl-wt103", **shrunk))
    expected = brute_front(txl_archs([128, 256], [2, 3], [512, 640, 1024], attention))
    assert [p.params for p in result.points] == [c for c, _ in expected]
    np.testing.assert_allclose([p.nsc for p in result.points], [v for _, v in expected], rtol=1e-12)
    for budget in (expected[0][0] - 1, expected[0][0], 700_000, 1_000_000, 10**9):
        feasible = [v for c, v in expected if c <= budget]
        if not feasible:
            with pytest.raises(InfeasibleBudgetError):
                result.index_under(budget)
            continue
        assert result.points[result.index_under(budget)].nsc == pytest.approx(max(feasible), rel=1e-12)


def autoformer_archs(embeds, depths, heads, ratios):
    rel = 4 * (2 * 14 + 2) * 64
    for e, depth in itertools.product(embeds, depths):
        fixed = e * 768 + e + e + 197 * e + 2 * e + 1000 * e + 1000
        layer = {}
        for h, r in itertools.product(heads, ratios):
            hid, q = int(e * r), 64 * h
            value = 3 * h * psi(64, e, "xavier") + psi(e, q, "xavier") + psi(hid, e, "xavier") + psi(e, hid, "xavier")
            cost = 4 * e + 3 * q + e + hid + e + rel + 3 * q * e + q * e + 2 * e * hid
            layer[(h, r)] = (cost, value)
        for plan in itertools.product(layer.values(), repeat=depth):
            yield fixed + sum(c for c, _ in plan), sum(v for _, v in plan)


def test_autoformer_search_equals_brute_force():
    shrunk = {"embed_dim": [192, 216], "depth": [2, 3], "num_heads": [3, 4], "mlp_ratio": [3.5, 4.0]}
    result = search(build_space("autoformer-tiny", **shrunk))
    expected = brute_front(autoformer_archs([192, 216], [2, 3], [3, 4], [3.5, 4.0]))
    assert [p.params for p in result.points] == [c for c, _ in expected]
    np.testing.assert_allclose([p.nsc for p in result.points], [v for _, v in expected], rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# the paper's Transformer-XL plan under both attention conventions


@pytest.fixture(scope="module")
def txl_plans():
    budget = parse_budget("40.32M")
    plans = {}
    for attention in ATTENTION:
        result = search(build_space("txl-wt103", attention=attention))
        plans[attention] = result.points[result.index_under(budget)]
    return plans


def test_txl_merged_qkv_reproduces_paper_plan(txl_plans):
    point = txl_plans["merged"]
    assert dict(point.choice) == {"d_model": 512, "n_layer": 18, "n_head": 8}
    assert [layer["d_ff"] for layer in point.layers] == [1152] * 18  # uniform (appendix D.4 / F.7)
    assert point.params == 18 * (4 * 512**2 + 9 * 512 + 1152 * 1025) == 40_211_712
    assert 38.4e6 * 0.95 <= point.params <= 38.4e6 * 1.05


def test_txl_per_head_plan_differs(txl_plans):
    point = txl_plans["per_head"]
    assert dict(point.choice) == {"d_model": 640, "n_layer": 16, "n_head": 10}
    assert Counter(layer["d_ff"] for layer in point.layers) == {640: 11, 768: 5}  # the rounding of a uniform optimum
    assert 38.4e6 * 0.95 <= point.params <= 38.4e6 * 1.05
    # why: per-head Q/K/V gives attention more capacity per parameter, and more so at larger d_model
    gain = {d: 3 * (d // 64) * psi(64, d, 0.02) - psi(3 * d, d, 0.02) for d in (512, 640)}
    assert gain[640] > gain[512] > 0


def test_uniform_ffn_is_optimal_per_subspace():
    """Jensen (appendix D.4): on the evenly spaced part of the grid (d_ff <= 2048, step 128), every
    front point mixes at most two adjacent widths; any wider spread could be evened out at equal
    cost for more NSC. (Across the step change 2048 -> 2304 that evening-out is not always possible.)"""
    result = search(build_space("txl-wt103"))
    even = [p for p in result.points if max(lay["d_ff"] for lay in p.layers) <= 2048]
    assert len(even) > 500
    assert all(max(lay["d_ff"] for lay in p.layers) - min(lay["d_ff"] for lay in p.layers) <= 128 for p in even)


# ---------------------------------------------------------------------------------------------
# AutoFormer spaces


@pytest.mark.parametrize("name", ["autoformer-tiny", "autoformer-small", "autoformer-base"])
def test_autoformer_plan_matches_family_spec(name):
    space = build_space(name)
    result = search(space)
    point = result.points[result.index_under(parse_budget(space.settings["paper_budget"]))]
    assert set(point.choice) == {"embed_dim", "depth"} and len(point.layers) == point.choice["depth"]
    config = {
        "layer_num": point.choice["depth"],
        "embed_dim": point.choice["embed_dim"],
        "num_heads": [lay["num_heads"] for lay in point.layers],
        "mlp_ratio": [lay["mlp_ratio"] for lay in point.layers],
    }
    batch = families.build_batch("autoformer", [config])
    assert batch.params()[0] == point.params  # the count checked against AutoFormer's own in test_families
    assert families.score("autoformer", [config])[0] == pytest.approx(point.nsc, rel=1e-12)


def test_autoformer_macs_are_the_blocks_linear_layers_as_pareto_json_says():
    """The search counts the blocks' Linear layers; pareto.json said "lm_head included (LoNAS convention)" for every
    space. The family's count less its attention scores and its patch embedding and classifier is the search's."""
    from nsc_prune.ranking.families import autoformer

    space = build_space("autoformer-tiny")
    assert "patch embedding and the classifier are not counted" in space.macs_convention
    point = search(space, cost="macs").points[-1]
    config = {
        "layer_num": point.choice["depth"],
        "embed_dim": point.choice["embed_dim"],
        "num_heads": [lay["num_heads"] for lay in point.layers],
        "mlp_ratio": [lay["mlp_ratio"] for lay in point.layers],
    }
    opts = autoformer.AutoFormerOptions()
    scores = sum(2 * opts.tokens**2 * 64 * lay["num_heads"] for lay in point.layers)  # q k^T and attn v
    extra = int(autoformer.network_extra_macs(point.choice["embed_dim"], opts))
    assert int(families.build_batch("autoformer", [config]).macs()[0]) - scores - extra == point.macs


def test_autoformer_tiny_plan():
    result = search(build_space("autoformer-tiny"))
    point = result.points[result.index_under(parse_budget("5.7M"))]
    assert dict(point.choice) == {"embed_dim": 192, "depth": 12} and point.params <= 5_700_000


# ---------------------------------------------------------------------------------------------
# YAML contract


@pytest.mark.parametrize("name", MY_SPACES)
def test_bundled_yaml_builds_and_fits_its_budget(name):
    assert (SPACES_DIR / f"{name}.yaml").exists()
    space = build_space(name)
    assert space.name == name and space.settings["kind"] in ("txl", "autoformer")
    result = search(space)
    point = result.points[result.index_under(parse_budget(space.settings["paper_budget"]))]
    assert point.params <= parse_budget(space.settings["paper_budget"])


def test_yaml_unknown_key_warns_and_bad_values_fail(tmp_path):
    yaml_path = tmp_path / "mine.yaml"
    yaml_path.write_text((SPACES_DIR / "autoformer-tiny.yaml").read_text() + "bogus: 1\n")
    with pytest.warns(UserWarning, match=r"ignoring unknown keys \['bogus'\]"):
        build_space(str(yaml_path))
    with pytest.raises(ConfigError, match="has no setting bogus; its settings: attention"):
        build_space("autoformer-tiny", bogus=1)  # an override (a flag) is explicit: a typo fails
    with pytest.raises(ConfigError, match=r"d_model \[100\] not divisible by d_head=64"):
        build_space("txl-wt103", d_model=[100])
    with pytest.raises(ConfigError, match="attention must be one of"):
        build_space("txl-wt103", attention="grouped")
    with pytest.raises(ConfigError, match="attention must be one of"):
        build_space("autoformer-tiny", attention="grouped")
    with pytest.raises(ConfigError, match="init must be one of .* or a positive number; got 'glorot'"):
        build_space("txl-wt103", init="glorot")
    with pytest.raises(ConfigError, match="init std must be a positive finite number; got -0.02"):
        build_space("txl-wt103", init=-0.02)
    for ratios in ([-1], [float("nan")], [0.001]):  # 0.001 gives no channel at embed_dim 320
        with pytest.raises(ConfigError, match="mlp_ratio must be a non-empty list of finite numbers, each giving"):
            build_space("autoformer-small", mlp_ratio=ratios)
    with pytest.raises(ConfigError, match=r"mlp_ratio has repeated values: \[3.5, 4.0, 4.0\]"):
        build_space("autoformer-tiny", mlp_ratio=[3.5, 4.0, 4])
    with pytest.raises(ConfigError, match="n_layer must be a non-empty list of positive integers"):
        build_space("txl-wt103", n_layer=[0, 12])
    yaml_path.write_text("kind: [1]\n")  # was TypeError: unhashable type: 'list'
    with pytest.raises(ConfigError, match=r"mine.yaml: its 'kind' must be the name of a space kind; got \[1\]$"):
        build_space(str(yaml_path))


@pytest.mark.parametrize(
    "space, settings, message",
    [
        ("txl-wt103", {"n_layer": "12"}, "n_layer must be a list of integers; got '12'"),  # not n_layer 1 and 2
        ("txl-wt103", {"n_layer": [True]}, "n_layer must be a non-empty list of positive integers"),
        ("txl-wt103", {"d_head": True}, "d_head must be a positive integer"),
        ("autoformer-tiny", {"depth": "12"}, "depth must be a list of integers"),
        ("autoformer-tiny", {"mlp_ratio": "3.5"}, "mlp_ratio must be a list of numbers"),
        ("autoformer-tiny", {"max_relative_position": 1.5}, "max_relative_position must be a whole number"),
    ],
)
def test_a_nas_setting_of_another_type_is_refused_not_iterated(space, settings, message):
    with pytest.raises(ConfigError, match=message):
        build_space(space, **settings)
    with pytest.raises(ConfigError, match="cannot read budget"):
        build_space("txl-wt103", paper_budget="lots")


# ---------------------------------------------------------------------------------------------
# through the search CLI


def test_search_cli_txl(tmp_path, capsys):
    assert main(["--space", "txl-wt103", "--budget", "40.32M", "--json", "--out", str(tmp_path / "txl")]) == 0
    doc = json.loads(capsys.readouterr().out)
    chosen = doc["points"][doc["selected"]]
    assert (chosen["d_model"], chosen["n_layer"], chosen["params"]) == (512, 18, 40_211_712)
    assert chosen["params"] == 18 * txl_layer_params(512, 1152)  # the library formula, as scripts/bench_core.py uses it
    assert chosen["layers"] == [{"d_ff": 1152}] * 18
    assert (
        main(
            ["--space", "txl-wt103", "--budget", "40.32M", "--set", "attention=per_head", "--out", str(tmp_path / "ph")]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "network: d_model 640, n_layer 16" in out


def test_autoformer_space_head_dim_embed_matches_family_spec():
    # head_dim: embed in the space config scores and counts every point as the family does with --head-dim embed.
    space = build_space("autoformer-small", head_dim="embed", embed_dim=[320, 448], depth=[2, 3])
    assert "head dim embed" in space.description
    opts = families.make_options("autoformer", head_dim="embed")
    default = search(build_space("autoformer-small", embed_dim=[320, 448], depth=[2, 3]))
    result = search(space)
    assert [p.nsc for p in result.points] != [p.nsc for p in default.points]
    for point in result.points[:: max(1, len(result.points) // 20)]:
        config = {
            "layer_num": point.choice["depth"],
            "embed_dim": point.choice["embed_dim"],
            "num_heads": [lay["num_heads"] for lay in point.layers],
            "mlp_ratio": [lay["mlp_ratio"] for lay in point.layers],
        }
        assert families.build_batch("autoformer", [config], options=opts).params()[0] == point.params
        assert families.score("autoformer", [config], opts)[0] == pytest.approx(point.nsc, rel=1e-12)
    with pytest.raises(ConfigError, match="head_dim=embed needs embed_dim >= num_heads"):
        build_space("autoformer-small", head_dim="embed", embed_dim=[4])


def test_nas_sizes_of_zero_are_refused():
    from nsc_prune.spaces.nas import AutoFormerSpaceConfig, TxlSpaceConfig

    with pytest.raises(ConfigError, match="d_head must be a positive integer; got 0"):
        build_space("txl-wt103", d_head=0)
    with pytest.raises(
        ValueError, match=re.escape("n_layer must be a non-empty list of positive integers; got [0, 12]")
    ):
        TxlSpaceConfig(n_layer=[0, 12])
    # 0.004 x 192 is 0.77 channels: no hidden unit at the smallest embed_dim
    with pytest.raises(ValueError, match="mlp_ratio must be a non-empty list of finite numbers, each giving"):
        AutoFormerSpaceConfig(mlp_ratio=[0.004, 4.0])


def test_autoformer_params_convention_names_a_head_dim_other_than_64():
    space = build_space("autoformer-tiny", head_dim="embed")
    assert "with head dim embed, not AutoFormer's 64)" in space.params_convention
    assert "equals AutoFormer's own count" in build_space("autoformer-tiny").params_convention


def test_head_dim_embed_needs_every_embed_dim_to_hold_the_most_heads():
    """embed_dim 3 holds 3 heads of one channel but not 4: a (3, 4-head) layer would have heads of 0 channels."""
    from nsc_prune.spaces.nas import AutoFormerSpaceConfig

    with pytest.raises(ValueError, match="got embed_dim 3 with num_heads 4"):
        AutoFormerSpaceConfig(embed_dim=[3, 192], num_heads=[3, 4], head_dim="embed")
