"""Elastic spaces for plain models: grid, GQA-valid KV groups, depth, protected layers."""

import json
import re

import pytest

from nsc_prune.cli import main
from nsc_prune.core.front import search
from nsc_prune.core.spec import decoder_dims
from nsc_prune.errors import ConfigError
from nsc_prune.presets import resolve_model
from nsc_prune.spaces.elastic import MAX_FFN_WIDTHS, ffn_grid
from nsc_prune.spaces.registry import build_space

SMOLLM2 = resolve_model("smollm2-135m").config  # 30 layers, FFN 1536, 9 heads, 3 KV heads


def test_grid_widths():
    assert ffn_grid(1536, 256, 0.5) == [1536, 1280, 1024, 768]
    assert len(ffn_grid(28672, 256, 0.5)) == 57
    # the narrowest width on the grid is kept though the fraction's float product lands a hair above it
    assert ffn_grid(12800, 256, 0.56)[-1] == 7168 and ffn_grid(12800, 256, 0.28)[-1] == 3584
    assert ffn_grid(10000, 100, 0.07)[-1] == 700
    # a fraction of a channel kept no FFN at all: a width extraction refuses (dropping a layer is a depth choice)
    assert ffn_grid(96, 96, 1e-12) == [96] and ffn_grid(96, 32, 1e-12) == [96, 64, 32]


def test_a_grid_of_more_widths_than_a_layer_may_hold_is_refused_before_it_is_built(tmp_path, capsys):
    """A config.json whose intermediate_size is 1e12 (a typo) built its grid until the machine ran out of memory."""
    assert len(ffn_grid(4096 * 256, 256, 0.0)) == MAX_FFN_WIDTHS == 4096  # the largest grid still built
    with pytest.raises(ConfigError, match=r"ffn_step=256 gives 4,097 FFN widths .*--set ffn_step=257 or coarser"):
        ffn_grid(4097 * 256, 256, 0.0)
    config = {**resolve_model("llama-7b").config, "intermediate_size": 10**12}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["--model", str(tmp_path), "--space", "ffn-grid", "--budget", "80%", "--out", str(tmp_path / "o")]) == 2
    assert "gives 1,953,125,001 FFN widths from 1,000,000,000,000" in capsys.readouterr().err


@pytest.mark.parametrize("space", ["ffn-grid", "ffn-heads", "ffn-heads-depth"])
def test_plans_respect_grid_gqa_and_protection(space):
    config = resolve_model("smollm2-135m").config
    dims = decoder_dims(config)
    result = search(build_space(space, config, ffn_step=64, protect_layers=[0, 29]))
    widths = set(ffn_grid(dims.intermediate_size, 64, 0.5)) | {0}
    for point in result.points:
        assert len(point.layers) == dims.num_hidden_layers
        for index, layer in enumerate(point.layers):
            assert layer["ffn"] in widths
            assert 0 <= layer["kv_groups"] <= dims.num_key_value_heads  # whole KV groups
            if index in (0, 29):
                assert layer == {"ffn": dims.intermediate_size, "kv_groups": dims.num_key_value_heads}
            if layer.get("keep") is False:
                assert layer["ffn"] == 0 and layer["kv_groups"] == 0 and space == "ffn-heads-depth"
    assert all(a.params < b.params and a.nsc < b.nsc for a, b in zip(result.points, result.points[1:]))


def test_depth_space_reaches_below_half_width():
    config = resolve_model("smollm2-135m").config
    grid_only = search(build_space("ffn-grid", config)).points[0].params
    with_depth = search(build_space("ffn-heads-depth", config)).points[0]
    assert with_depth.params < grid_only
    assert any(layer.get("keep") is False for layer in with_depth.layers)


def test_elastic_bad_input():
    config = resolve_model("smollm2-135m").config
    with pytest.raises(ConfigError, match="protect_layers \\[30\\] are outside 0..29"):
        build_space("ffn-grid", config, protect_layers=[30])
    with pytest.raises(ConfigError, match="kv_min=4 exceeds the model's 3 KV heads"):
        build_space("ffn-heads", config, kv_min=4)
    with pytest.raises(ConfigError, match="kv_min=2 applies only where a space chooses KV groups"):
        build_space("ffn-grid", config, kv_min=2)  # was ignored: every plan kept all 3
    with pytest.raises(ConfigError, match="ffn_step must be a positive integer"):
        build_space("ffn-grid", config, ffn_step=0)


def test_cli_set_overrides_and_grid_budget_error(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert (
        main(
            [
                "--model",
                "smollm2-135m",
                "--space",
                "ffn-grid",
                "--budget",
                "80%",
                "--set",
                "ffn_step=64",
                "--set",
                "protect_layers=[0]",
                "--out",
                out,
            ]
        )
        == 0
    )
    assert "1 x (ffn 1536) [layer 0]" in capsys.readouterr().out
    assert main(["--model", "smollm2-135m", "--space", "ffn-grid", "--budget", "50M", "--out", out + "2"]) == 2
    assert "at least the smallest plan's 94.702M (94,701,888) params in space 'ffn-grid'" in capsys.readouterr().err
    assert main(["--model", "smollm2-135m", "--space", "ffn-grid", "--budget", "50M", "--set", "oops"]) == 2
    assert "--set takes KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, message",
    [
        ({"kv_heads": 3}, "kv_heads must be true or false; got 3 \\(int\\)"),
        ({"depth": 1}, "depth must be true or false; got 1 \\(int\\)"),
        ({"ffn_step": True}, "ffn_step must be a positive integer; got True \\(bool\\)"),
        ({"kv_min": False}, "kv_min must be a positive integer; got False \\(bool\\)"),
        ({"ffn_min_fraction": True}, "ffn_min_fraction must be a number in \\(0, 1\\]; got True"),
        ({"protect_layers": [True]}, "protect_layers must be a list of layer indices; got \\[True\\]"),
        ({"protect_layers": 0}, "protect_layers must be a list of layer indices; got 0"),
    ],
)
def test_bool_and_int_settings_are_not_interchangeable(override, message):
    config = resolve_model("smollm2-135m").config
    with pytest.raises(ConfigError, match=message):
        build_space("ffn-heads", config, **override)


def test_cli_set_kv_heads_number_is_refused(capsys):
    assert main(["--model", "smollm2-135m", "--space", "ffn-heads", "--set", "kv_heads=3", "--budget", "80%"]) == 2
    err = capsys.readouterr().err
    assert "kv_heads must be true or false; got 3" in err and len(err.strip().splitlines()) == 1


def test_depth_without_protected_layers_never_drops_every_layer():
    """With protect_layers=[] layer 0 is never dropped; by layer symmetry under psi_MP the front equals the
    unrestricted front minus its all-dropped point (which extraction would refuse)."""
    import dataclasses

    config = resolve_model("smollm2-135m").config
    space = build_space("ffn-heads-depth", config, protect_layers=[])
    result = search(space)
    assert all(any(layer.get("keep", True) for layer in point.layers) for point in result.points)
    cheapest = result.points[0].layers
    assert sum(layer.get("keep", True) for layer in cheapest) == 1 and cheapest[0].get("keep", True)
    assert "layer 0 never dropped" in space.description
    sub = space.subspaces[0]
    unrestricted = dataclasses.replace(
        space, subspaces=(dataclasses.replace(sub, layers=(sub.layers[1], *sub.layers[1:])),)
    )
    free = [p for p in search(unrestricted).points if any(layer.get("keep", True) for layer in p.layers)]
    assert len(free) == len(search(unrestricted).points) - 1
    assert [(p.params, p.macs) for p in result.points] == [(p.params, p.macs) for p in free]
    assert [p.nsc for p in result.points] == pytest.approx([p.nsc for p in free], rel=1e-12)
    # a protected layer already guarantees a kept layer: every other layer may then be dropped
    protected = search(build_space("ffn-heads-depth", config, protect_layers=[5])).points[0].layers
    assert [i for i, layer in enumerate(protected) if layer.get("keep", True)] == [5]


def test_an_ffn_min_fraction_above_one_is_refused():
    """1.5 of the width is wider than the layer: it was taken as 'the full width only'."""
    with pytest.raises(ConfigError, match=re.escape("ffn_min_fraction must be a number in (0, 1]; got 1.5")):
        build_space("ffn-heads", SMOLLM2, ffn_min_fraction=1.5)


def test_kv_min_must_be_a_positive_integer():
    """kv_min=0 would offer a kept layer with no KV group (no attention), a shape extraction cannot build."""
    with pytest.raises(ConfigError, match=r"kv_min must be a positive integer; got 0 \(int\), e\.g\. --set kv_min=1"):
        build_space("ffn-heads", SMOLLM2, kv_min=0)


def test_a_kv_heads_typo_points_at_kv_min():
    with pytest.raises(ConfigError, match=r"Use --set kv_heads=true or false \(the fewest KV groups a layer may"):
        build_space("ffn-heads", SMOLLM2, kv_heads="2")


def test_the_elastic_init_setting_reaches_the_option_values():
    """--set init=... scored every option with the default xavier init if the builder dropped it."""
    xavier = build_space("ffn-grid", SMOLLM2).subspaces[0].layers[0]
    normal = build_space("ffn-grid", SMOLLM2, init=0.02).subspaces[0].layers[0]
    assert [o.params for o in xavier] == [o.params for o in normal]
    assert all(a.nsc != pytest.approx(b.nsc) for a, b in zip(xavier, normal))
