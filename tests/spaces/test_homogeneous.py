"""``homogeneous=true`` elastic spaces: the front is exactly the brute-force front of the homogeneous plans.

The reference enumerates every plan of the same space searched per layer (``itertools.product`` over each layer's
whole option table), keeps those whose kept layers share one label, and takes for each cost the best value: it
never sees ``homogeneous_tables``. Cases: params, MACs and latency costs; with and without depth and KV heads;
closed-form values and external ``values=`` (what --score psi_w / measured pass); a model whose layer 2 is
narrower (a pruned checkpoint's ``per_layer_config``), where some labels need layer 2 dropped.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from nsc_prune.cli import main
from nsc_prune.core.front import LayerCosts, SearchSpace, Subspace, search
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.presets import resolve_model
from nsc_prune.spaces.elastic import ElasticSpaceConfig
from nsc_prune.spaces.registry import build_space

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}  # fmt: skip
NARROW_LAYER_2 = {**TINY, "per_layer_config": {"2": {"intermediate_size": 64}}}  # grid [64, 32]; the others [96, 64]
SPACES = {(False, False): "ffn-grid", (True, False): "ffn-heads", (True, True): "ffn-heads-depth"}


def _space(config, kv_heads: bool, depth: bool, homogeneous: bool) -> SearchSpace:
    settings = {"ffn_step": 32, "kv_heads": kv_heads, "depth": depth, "homogeneous": homogeneous}
    return build_space("ffn-heads-depth", config, **settings)


def _tables(space: SearchSpace, cost: str, seq_len: int, values, latency):
    """Per layer (the fixed parts first): each option's value and cost, as the search sees them."""
    (sub,) = space.subspaces
    layer_values = [[sub.fixed.nsc], *(values[0] if values is not None else [[o.nsc for o in t] for t in sub.layers])]
    if cost == "latency":
        return layer_values, [[latency.fixed], *latency.layers]
    key = (lambda o: o.params) if cost == "params" else (lambda o: o.macs * seq_len)
    return layer_values, [[key(sub.fixed)], *([key(o) for o in t] for t in sub.layers)]


def brute_force_front(space: SearchSpace, cost: str, seq_len: int, values=None, latency=None):
    """``(cost, value)`` of the best homogeneous plan at each cost where the best value rises."""
    (sub,) = space.subspaces
    layer_values, layer_costs = _tables(space, cost, seq_len, values, latency)
    best: dict[int, float] = {}
    for choice in itertools.product(*(range(len(t)) for t in sub.layers)):
        labels = [sub.layers[l][j].label for l, j in enumerate(choice)]
        kept = {tuple(sorted(dict(label).items())) for label in labels if label.keep}
        if len(kept) != 1:
            continue
        total = layer_costs[0][0] + sum(layer_costs[l + 1][j] for l, j in enumerate(choice))
        value = layer_values[0][0] + sum(layer_values[l + 1][j] for l, j in enumerate(choice))
        best[total] = max(best.get(total, -math.inf), value)
    front, top = [], -math.inf
    for total in sorted(best):
        if not front or best[total] > top + 1e-9 * max(1.0, abs(top)):
            front.append((total, best[total]))
            top = best[total]
    return front


def _external_values(space: SearchSpace, seed: int):
    rng = np.random.default_rng(seed)
    (sub,) = space.subspaces
    return [[rng.normal(size=len(t)).tolist() for t in sub.layers]]


def _latency(space: SearchSpace, seed: int) -> LayerCosts:
    rng = np.random.default_rng(seed + 100)
    (sub,) = space.subspaces
    return LayerCosts(fixed=50, layers=tuple(tuple(int(c) for c in rng.integers(1, 40, len(t))) for t in sub.layers))


def _check_points(result, space: SearchSpace, cost: str, seq_len: int, values, latency) -> None:
    """One kept label per point; its options index the space's own tables (value and costs recomputed)."""
    (sub,) = space.subspaces
    layer_values, layer_costs = _tables(space, cost, seq_len, values, latency)
    for point in result.points:
        kept = {tuple(sorted(dict(layer).items())) for layer in point.layers if layer.keep}
        assert len(kept) == 1, point.layers
        assert point.layers == tuple(sub.layers[l][j].label for l, j in enumerate(point.options))
        value = layer_values[0][0] + sum(layer_values[l + 1][j] for l, j in enumerate(point.options))
        assert point.nsc == pytest.approx(value, rel=1e-9, abs=1e-9)
        assert result.cost_of(point) == layer_costs[0][0] + sum(
            layer_costs[l + 1][j] for l, j in enumerate(point.options)
        )
        assert point.params == sub.fixed.params + sum(sub.layers[l][j].params for l, j in enumerate(point.options))


@pytest.mark.parametrize("config", [TINY, NARROW_LAYER_2], ids=["uniform", "narrow-layer-2"])
@pytest.mark.parametrize("axes", sorted(SPACES), ids=lambda axes: SPACES[axes])
@pytest.mark.parametrize("cost", ["params", "macs", "latency"])
@pytest.mark.parametrize("seed", [None, 0, 1], ids=["closed-form", "values-0", "values-1"])
def test_homogeneous_front_equals_brute_force(config, axes, cost, seed):
    kv_heads, depth = axes
    space = _space(config, kv_heads, depth, homogeneous=True)
    values = None if seed is None else _external_values(space, seed)
    latency = _latency(space, seed or 0) if cost == "latency" else None
    result = search(space, cost=cost, seq_len=16, values=values, latency=latency)
    expected = brute_force_front(space, cost, 16, values, latency)
    assert [result.cost_of(p) for p in result.points] == [c for c, _ in expected]
    assert [p.nsc for p in result.points] == pytest.approx([v for _, v in expected], rel=1e-9, abs=1e-9)
    _check_points(result, space, cost, 16, values, latency)


def test_homogeneous_is_a_restriction_of_the_per_layer_front():
    """Same tables, fewer plans: never better than per-layer at any budget; some point is strictly worse; the
    full model (one label: the widest) is on both fronts."""
    free = search(_space(NARROW_LAYER_2, True, True, homogeneous=False), values=None)
    homog = search(_space(NARROW_LAYER_2, True, True, homogeneous=True))
    for point in homog.points:
        assert point.nsc <= free.points[free.index_under(point.params)].nsc + 1e-12
    assert any(p.nsc < free.points[free.index_under(p.params)].nsc - 1e-9 for p in homog.points)
    assert homog.space.size < free.space.size
    uniform_free, uniform_homog = (search(_space(TINY, True, True, h)) for h in (False, True))
    assert uniform_homog.points[-1].params == uniform_free.points[-1].params


def test_no_shared_kept_label_is_refused():
    space = _space(TINY, True, False, homogeneous=True)
    (sub,) = space.subspaces
    disjoint = (sub.layers[0][:1], sub.layers[1][1:2], *sub.layers[2:])  # layer 0: (96, 2) only; layer 1: (96, 1)
    bare = SearchSpace("x", (Subspace({}, sub.fixed, disjoint, homogeneous=True),))
    with pytest.raises(InvalidInputError, match="homogeneous but no kept option .* is shared by every layer"):
        search(bare)
    droppable = _space(TINY, True, True, homogeneous=True).subspaces[0].layers[1]
    layers = (sub.layers[0][:1], (droppable[1], droppable[-1]), *sub.layers[2:])  # layer 1 may be dropped instead
    result = search(SearchSpace("x", (Subspace({}, sub.fixed, layers, homogeneous=True),)))
    assert {dict(p.layers[1]).get("keep") for p in result.points} == {False}
    assert all(p.layers[0] == {"ffn": 96, "kv_groups": 2} for p in result.points)


def test_settings_and_refusals():
    space = _space(TINY, True, True, homogeneous=True)
    assert space.settings["homogeneous"] is True and "homogeneous" in space.description
    assert "homogeneous" not in _space(TINY, True, True, homogeneous=False).description
    with pytest.raises(ConfigError, match=r"protect_layers=\[0\] cannot be combined with homogeneous=true"):
        ElasticSpaceConfig(homogeneous=True, protect_layers=[0])
    with pytest.raises(ConfigError, match="homogeneous must be true or false; got 'yes'"):
        ElasticSpaceConfig(homogeneous="yes")


def test_cli_writes_a_homogeneous_plan(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--model", "gemma-2-9b", "--budget", "80%", "--space", "ffn-heads-depth", "--set", "homogeneous=true"]
    assert main([*argv, "--out", str(out), "--no-plot"]) == 0
    assert "homogeneous" in capsys.readouterr().out
    doc = json.loads((out / "pareto.json").read_text())
    assert doc["space"]["homogeneous"] is True and "homogeneous" in doc["space"]["description"]
    layers = doc["points"][doc["selected"]]["layers"]
    kept = {(layer["ffn"], layer["kv_groups"]) for layer in layers if layer.get("keep", True)}
    assert len(kept) == 1 and len(layers) == resolve_model("gemma-2-9b").config["num_hidden_layers"]
    for point in doc["points"]:
        assert len({(x["ffn"], x["kv_groups"]) for x in point["layers"] if x.get("keep", True)}) == 1
    refused = tmp_path / "refused"
    assert main([*argv, "--set", "protect_layers=[0]", "--out", str(refused), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot be combined with homogeneous=true" in err, err
    assert not refused.exists()


def test_train_supernet_refuses_a_homogeneous_space():
    from nsc_prune.hf.train.subnets import space_choices

    assert len(space_choices(_space(TINY, True, True, homogeneous=False))) == 4
    with pytest.raises(ConfigError, match="homogeneous=true restricts the search, not the subnets train-supernet"):
        space_choices(_space(TINY, True, True, homogeneous=True))
