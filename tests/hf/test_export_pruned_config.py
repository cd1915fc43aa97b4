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
