"""The shipped modeling code of a pruned checkpoint: NscLlama's per-layer heads and widths, and DeciLM
(nemotron-nas) blocks as vLLM builds them, with their refusals."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from nsc_prune.hf.modeling.configuration_nsc_decilm import BlockPart  # noqa: E402
from nsc_prune.hf.modeling.modeling_nsc_decilm import DeciLMConfig, DeciLMForCausalLM, ffn_width  # noqa: E402
from nsc_prune.hf.modeling.modeling_nsc_llama import NscLlamaForCausalLM  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128)  # fmt: skip


def test_per_layer_heads_that_break_the_gqa_ratio_are_refused():
    config = transformers.LlamaConfig(**TINY, nsc_per_layer_attention={"1": {"num_attention_heads": 3,
                                                                             "num_key_value_heads": 1}})  # fmt: skip
    with pytest.raises(ValueError, match="layer 1: nsc_per_layer_attention gives 3 query heads for 1 KV heads"):
        NscLlamaForCausalLM(config)


def test_a_heterogeneous_model_saves_no_trace_of_its_global_reads(tmp_path):
    config = transformers.LlamaConfig(**TINY, per_layer_config={"1": {"intermediate_size": 32}})
    model = NscLlamaForCausalLM(config)
    assert model.model.layers[1].mlp.down_proj.in_features == 32
    model.config.save_pretrained(tmp_path)
    assert "allow_global_per_layer_attribute_access" not in json.loads((tmp_path / "config.json").read_text())


def test_a_static_cache_set_up_before_the_first_step_generates_as_uncached_with_per_layer_heads():
    import torch

    config = transformers.LlamaConfig(**TINY, nsc_per_layer_attention={"1": {"num_attention_heads": 2,
                                                                             "num_key_value_heads": 1}})  # fmt: skip
    torch.manual_seed(0)
    model = NscLlamaForCausalLM(config).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    settings = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    chunked = model.generate(ids, cache_implementation="static", prefill_chunk_size=3, **settings)
    assert torch.equal(chunked, model.generate(ids, use_cache=False, **settings))


SIZES = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128}  # fmt: skip
PLAIN = {"attention": {"no_op": False, "n_heads_in_group": 2}, "ffn": {"no_op": False, "intermediate_size": 40}}


def test_an_ffn_mult_block_is_as_wide_as_vllm_makes_it():
    assert ffn_width(BlockPart({"ffn_mult": 2.0}), 200) == 512  # int(2 * 2.0 * 200 / 3) = 266, up to 256's multiple
    assert ffn_width(BlockPart({"ffn_mult": 1.92}), 400) == 512  # 512 exactly: kept
    assert ffn_width(BlockPart({"ffn_mult": 2.0, "intermediate_size": 40}), 200) == 512  # ffn_mult wins, as in vLLM
    assert ffn_width(BlockPart({"intermediate_size": 40}), 200) == 40


@pytest.mark.parametrize(
    "blocks, message",
    [
        (
            [PLAIN, {**PLAIN, "attention": {"no_op": False, "n_heads_in_group": 3}}],
            "layer 1: n_heads_in_group=3 does not divide",
        ),
        ([PLAIN, {**PLAIN, "ffn": {"no_op": False, "replace_with_linear": True}}], "layer 1: ffn replace_with_linear"),
        ([PLAIN], r"block_configs must have one entry per layer \(2\)"),
    ],
)
def test_blocks_this_model_cannot_build_are_refused(blocks, message):
    with pytest.raises(ValueError, match=message):
        DeciLMForCausalLM(DeciLMConfig.from_dict({**SIZES, "block_configs": blocks}))
