"""nsc_prune.hf.export.pruned.global_width: the width a pruned config.json states globally."""

from __future__ import annotations

import pytest

from nsc_prune.hf.export.pruned import global_width


@pytest.mark.parametrize(
    ("widths", "expected"),
    [
        ([64, 64, 64], 64),  # uniform: no per-layer override, stock LLaMA loads it
        ([96, 64, 64], 64),  # the most common
        ([64, 96, 96, 64, 32], 96),  # a tie: the widest of the most common
        ([32, 64], 64),
        ([48], 48),
    ],
)
def test_most_common_width_widest_on_ties(widths, expected):
    assert global_width(widths) == expected
    assert global_width(widths[::-1]) == expected  # the layer order does not matter


def test_the_families_whose_configs_refuse_heads_that_do_not_divide_the_width_are_those_named():
    """HEADS_DIVIDE_WIDTH against the installed transformers: 6 heads at width 64 (head_dim 8 given) is refused by
    exactly those model types' configs, so a stock checkpoint is written wherever transformers accepts it."""
    transformers = pytest.importorskip("transformers")
    from nsc_prune.hf.modeling import ARCHITECTURES, HEADS_DIVIDE_WIDTH

    refused = set()
    for model_type in ARCHITECTURES:
        sizes = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "head_dim": 8}
        config = {"model_type": model_type, **sizes, "num_attention_heads": 6, "num_key_value_heads": 3}
        try:
            transformers.CONFIG_MAPPING[model_type].from_dict({**config, "vocab_size": 128, "pad_token_id": 0})
        except Exception:  # transformers' strict-dataclass validation error
            refused.add(model_type)
        transformers.CONFIG_MAPPING[model_type].from_dict({**config, "num_attention_heads": 8, "vocab_size": 128,
                                                           "pad_token_id": 0})  # fmt: skip
    assert refused == HEADS_DIVIDE_WIDTH


@pytest.mark.parametrize(
    ("model_type", "rope", "legacy"),
    [
        ("llama", {"rope_type": "default", "rope_theta": 1e5}, {"rope_theta": 1e5}),
        (
            "llama",
            {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 64},
            {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
        ),
        (
            "phi3",
            {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0, 1.1, 1.2, 1.3],
             "long_factor": [2.0, 2.3, 2.6, 2.9], "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5},
            {"rope_theta": 1e4, "partial_rotary_factor": 0.5,
             "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],
                              "long_factor": [2.0, 2.3, 2.6, 2.9]}},  # as 4.x's Phi3Config asks for them
        ),
        (
            "llama",  # LongRoPE with what 4.x's three keys cannot say: all of it, or transformers 5 would lose it
            {"rope_type": "longrope", "rope_theta": 1e4, "factor": 4.0, "attention_factor": 1.7,
             "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7], "long_factor": [2.0] * 8},
            {"rope_theta": 1e4, "rope_scaling": {"rope_type": "longrope", "factor": 4.0, "attention_factor": 1.7,
             "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7], "long_factor": [2.0] * 8,
             "original_max_position_embeddings": 512},  # transformers 5 fills it in from the model's context
             "original_max_position_embeddings": 512},  # 4.x reads it at the top level only
        ),
        (
            "phi3",  # a hub config as transformers 5 re-saves it: 4.x's "type" kept beside "rope_type"
            {"rope_type": "longrope", "type": "longrope", "rope_theta": 1e4, "short_factor": [1.0, 1.1, 1.2, 1.3],
             "long_factor": [2.0, 2.3, 2.6, 2.9], "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5},
            {"rope_theta": 1e4, "partial_rotary_factor": 0.5,
             "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],
                              "long_factor": [2.0, 2.3, 2.6, 2.9]}},
        ),
        (
            "gemma3_text",
            {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
            {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
        ),
    ],
)  # fmt: skip
def test_an_outputs_config_states_its_rope_as_transformers_4_reads_it(model_type, rope, legacy):
    """transformers 5 saves rope as ``rope_parameters`` alone; 4.x (and vLLM before 0.19.1) ignore it and ran a
    pruned SmolLM2 at theta 10000 instead of 100000, silently. The output states the 4.x keys too, and transformers 5
    reads the same rope from it."""
    transformers = pytest.importorskip("transformers")
    from nsc_prune.hf.cut.jobs import legacy_rope_keys

    sizes = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 512}  # fmt: skip
    config = transformers.CONFIG_MAPPING[model_type](**sizes, rope_parameters=rope).to_dict()
    assert "rope_theta" not in config and "rope_scaling" not in config  # as transformers 5 saves it
    assert legacy_rope_keys(config) == legacy
    both = transformers.CONFIG_MAPPING[model_type].from_dict({**config, **legacy_rope_keys(config)})
    alone = transformers.CONFIG_MAPPING[model_type].from_dict(config).rope_parameters

    def without_type(rope):  # 4.x's name of rope_type, which transformers 5 may keep beside it
        return {k: v for k, v in rope.items() if k != "type"}

    assert without_type(both.rope_parameters) == without_type(alone)
    assert legacy_rope_keys({**config, "rope_theta": 7.0}).get("rope_theta") is None  # a key it has is kept
    assert legacy_rope_keys({**config, "rope_theta": None}) == legacy  # a null one is filled


def test_parsing_a_config_leaves_its_nested_dicts_as_they_were():
    """transformers adds rope_theta into a config's rope_scaling in place: parsed for the load check before writing,
    the output's rope_scaling held it, and transformers 4.x warned of an unknown key at every load."""
    import copy

    transformers = pytest.importorskip("transformers")
    from nsc_prune.hf.weights.loading import parse_config

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # fmt: skip
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 128, "rope_theta": 5e5, "rope_scaling": scaling}  # fmt: skip
    before = copy.deepcopy(config)
    parse_config(transformers.LlamaConfig, config)
    assert config == before
