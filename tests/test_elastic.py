"""Elastic spaces for plain models: grid, GQA-valid KV groups, depth, protected layers."""

import pytest

from nsc_prune.cli import main
from nsc_prune.elastic import ffn_grid
from nsc_prune.errors import ConfigError
from nsc_prune.models import resolve_model
from nsc_prune.space import build_space, search
from nsc_prune.spec import decoder_dims


def test_grid_widths():
    assert ffn_grid(1536, 256, 0.5) == [1536, 1280, 1024, 768]
    assert len(ffn_grid(28672, 256, 0.5)) == 57


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
            assert 0 <= layer["kv_heads"] <= dims.num_key_value_heads  # whole KV groups
            if index in (0, 29):
                assert layer == {"ffn": dims.intermediate_size, "kv_heads": dims.num_key_value_heads}
            if layer.get("keep") is False:
                assert layer["ffn"] == 0 and layer["kv_heads"] == 0 and space == "ffn-heads-depth"
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
    with pytest.raises(ConfigError, match="ffn_step must be a positive integer"):
        build_space("ffn-grid", config, ffn_step=0)


def test_cli_set_overrides_and_grid_budget_error(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert main(["--model", "smollm2-135m", "--space", "ffn-grid", "--budget", "80%", "--set", "ffn_step=64", "--set", "protect_layers=[0]", "--out", out]) == 0
    assert "1 x (ffn 1536, kv 3) [layers 0]" in capsys.readouterr().out
    assert main(["--model", "smollm2-135m", "--space", "ffn-grid", "--budget", "50M", "--out", out + "2"]) == 2
    assert "below the smallest plan in space 'ffn-grid'" in capsys.readouterr().err
    assert main(["--model", "smollm2-135m", "--space", "ffn-grid", "--budget", "50M", "--set", "oops"]) == 2
    assert "--set takes KEY=VALUE" in capsys.readouterr().err
