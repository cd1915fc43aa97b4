"""Searching a checkpoint written by ``nsc-prune extract`` (issue 15, item 6): its per-layer FFN widths, per-layer
heads and dropped layers are the new full model, so the full point's params equal the checkpoint's real tensor count."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nsc_prune.cli import main  # noqa: E402
from nsc_prune.core.front import search  # noqa: E402
from nsc_prune.core.spec import layer_dims, score  # noqa: E402
from nsc_prune.errors import ConfigError  # noqa: E402
from nsc_prune.hf.extract import ExtractOptions, extract_subnet  # noqa: E402
from nsc_prune.spaces.registry import build_space  # noqa: E402

# layer 0 keeps 96 channels and both KV groups, layer 1 narrows to 40 channels and 1 group, layer 2 keeps 72,
# layer 3 is dropped
PLAN = [
    {"ffn": 96, "kv_groups": 2},
    {"ffn": 40, "kv_groups": 1},
    {"ffn": 72, "kv_groups": 2},
    {"ffn": 96, "keep": False},
]


@pytest.fixture
def pruned(tmp_path, tiny_llama, write_plan):
    tiny = tiny_llama(gqa=True, lora=False, layers=4)
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    out = extract_subnet(plan, tiny.base, tmp_path / "pruned", point=0, options=ExtractOptions(dtype="float32"))
    return out


def true_params(folder) -> int:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=True)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("space", ["lonas", "ffn-grid", "ffn-heads", "ffn-heads-depth"])
def test_full_point_of_a_pruned_checkpoint_is_its_true_size(pruned, space):
    config = json.loads((pruned / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and config.get("per_layer_config") and config.get("nsc_per_layer_attention")
    overrides = {"lora_rank": 0} if space == "lonas" else {"ffn_step": 8}
    result = search(build_space(space, config, **overrides))
    full = result.points[-1]
    assert full.params == true_params(pruned)
    assert [lay["ffn"] for lay in full.layers] == [96, 40, 72]
    assert [lay.get("kv_groups", d.num_key_value_heads) for lay, d in zip(full.layers, layer_dims(config))] == [2, 1, 2]
    assert full.nsc == pytest.approx(score(config), rel=1e-12)
    # every point fits under the checkpoint's own widths: nothing wider than the layer it came from
    assert all(lay["ffn"] <= width for point in result.points for lay, width in zip(point.layers, (96, 40, 72)))


def test_search_cli_on_pruned_checkpoint(pruned, tmp_path, capsys):
    params = true_params(pruned)
    assert (
        main(
            [
                "--model",
                str(pruned),
                "--space",
                "ffn-grid",
                "--set",
                "ffn_step=8",
                "--budget",
                str(params),
                "--out",
                str(tmp_path / "search"),
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "search" / "pareto.json").read_text())
    assert doc["points"][-1]["params"] == params
    assert doc["points"][doc["selected"]]["params"] == params


def test_bad_per_layer_config_is_refused(pruned):
    config = json.loads((pruned / "config.json").read_text())
    with pytest.raises(ConfigError, match=r"per-layer config entries must name layers 0..2; got layers \[5\]"):
        layer_dims({**config, "per_layer_config": {"5": {"intermediate_size": 8}}})
    with pytest.raises(ConfigError, match="'per_layer_config' must be an object keyed by layer index"):
        layer_dims({**config, "per_layer_config": [96, 40, 72]})
