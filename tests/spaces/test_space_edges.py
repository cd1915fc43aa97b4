"""Edges of the space builders that mutation testing found unpinned: each input below told a mutant of
``spaces/elastic.py``, ``spaces/registry.py`` or ``spaces/lonas.py`` from the code."""

from __future__ import annotations

import json
import re

import pytest

from nsc_prune.errors import ConfigError
from nsc_prune.presets import resolve_model
from nsc_prune.spaces.elastic import ElasticSpaceConfig, ffn_grid
from nsc_prune.spaces.lonas import LonasSpaceConfig, fixed_rank_modules, read_lora_config, trained_space_settings
from nsc_prune.spaces.registry import build_space

SMOLLM2 = resolve_model("smollm2-135m").config  # 30 layers, FFN 1536, 9 heads, 3 KV heads
# layer 3 keeps one KV group of three query heads (a pruned checkpoint's per-layer entry)
ONE_KV_LAYER = {**SMOLLM2, "per_layer_config": {"3": {"num_key_value_heads": 1, "num_attention_heads": 3}}}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: build_space("ffn-grid", SMOLLM2, ffn_min_fraction=0), "ffn_min_fraction must be a number in (0, 1]"),
        (lambda: ElasticSpaceConfig(protect_layers=""), "protect_layers must be a list of layer indices; got ''"),
        (lambda: build_space("ffn-heads", ONE_KV_LAYER, kv_min=2), "exceeds the model's 1 KV heads in its narrowest"),
        (lambda: LonasSpaceConfig(rank_deltas=[4, 0]), "rank_deltas must be non-empty, each <= 0"),  # no weights
        (lambda: LonasSpaceConfig(lora_rank=4, rank_deltas=[0, -4]), "lora_rank + each of rank_deltas must be > 0"),
    ],
)
def test_settings_that_make_no_valid_space_are_refused(build, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build()


def test_a_layer_with_its_own_kv_count_keeps_its_own_options():
    """ffn-grid keeps each layer's KV groups (1 in layer 3); a depth space may drop such a layer alongside the
    others under homogeneous=true, since a dropped layer has no KV count to match."""
    layer3 = build_space("ffn-grid", ONE_KV_LAYER).subspaces[0].layers[3]
    assert {option.label.kv_groups for option in layer3} == {1}
    assert build_space("ffn-grid", ONE_KV_LAYER, depth=True, homogeneous=True).size > 1


def test_the_step_a_grid_error_suggests_is_accepted():
    with pytest.raises(ConfigError, match=r"pass --set ffn_step=(\d+) or coarser") as refused:
        ffn_grid(81920, 1, 0.5)
    step = int(re.search(r"ffn_step=(\d+) or coarser", str(refused.value)).group(1))
    assert ffn_grid(81920, step, 0.5)[0] == 81920


def test_a_null_override_keeps_the_spaces_own_setting():
    """The registry drops None overrides (its docstring): kv_heads stays the ffn-heads YAML's true."""
    assert build_space("ffn-heads", SMOLLM2, kv_heads=None).settings["kv_heads"] is True


def test_lonas_widths_round_to_the_nearest_channel():
    widths = {o.label.ffn for o in build_space("lonas", SMOLLM2, ffn_fractions=[1.0, 0.6]).subspaces[0].layers[0]}
    assert widths == {1536, 922}  # 0.6 x 1536 = 921.6


def test_a_rank_as_wide_as_the_narrowest_matrix_is_a_fraction_problem_not_another_model():
    with pytest.raises(ConfigError, match="raise the smallest fraction to at least 0.375"):
        build_space("lonas", SMOLLM2, lora_rank=576, ffn_fractions=[1.0, 0.25],
                    elastic_rank_modules=["gate_proj", "up_proj"], fixed_rank_modules=["down_proj"])  # fmt: skip


def test_adapter_settings_that_would_train_or_read_wrong(tmp_path):
    assert fixed_rank_modules({"kind": "lonas", "lora_rank": 0}, "llama") == {"down_proj": 0}  # rank 0: no adapter
    biased = tmp_path / "biased"
    biased.mkdir()
    (biased / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "all"})
    )
    with pytest.raises(ConfigError, match="bias='all' is not supported; only bias='none'"):
        read_lora_config(biased)
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})
    )
    record = {"space": {"settings": {"kind": "lonas", "lora_rank": 0, "rank_deltas": [0]}}}
    (trained / "nsc_prune_supernet.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="must hold the lonas settings it was trained on; got lora_rank 0"):
        trained_space_settings(trained, 8)
