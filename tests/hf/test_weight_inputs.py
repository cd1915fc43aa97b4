"""A LoRA adapter and a base folder are checked against what PEFT and transformers would read, before any weight
is read: their refusals, and the pattern and module names matched at a dot boundary as PEFT matches them."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from nsc_prune.errors import ConfigError  # noqa: E402
from nsc_prune.hf.weights.adapter import _pattern_value, check_adapter_fits, open_adapter  # noqa: E402
from nsc_prune.hf.weights.base import open_base, stores_own_head  # noqa: E402
from nsc_prune.hf.weights.safetensors_io import index_model_dir, write_safetensors  # noqa: E402
from nsc_prune.hf.weights.synthetic import (  # noqa: E402
    base_specs,
    llama_config,
    lora_specs,
    random_tensors,
    write_random_base,
    write_random_lora,
)

CONFIG = llama_config(2, 32, 48, 2, 50)


def _adapter(tmp_path, specs, **config):
    folder = tmp_path / "adapter"
    folder.mkdir(parents=True)
    write_safetensors(folder / "adapter_model.safetensors", specs, random_tensors(specs))
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "up_proj"], **config})
    )
    return folder


def test_a_pattern_key_matches_a_module_at_a_dot_boundary_only():
    assert _pattern_value({"up_proj": 2}, "model.layers.0.mlp.gate_up_proj", 8) == 8  # Phi-3's fused module
    assert _pattern_value({"up_proj": 2}, "model.layers.0.mlp.up_proj", 8) == 2


def test_a_lora_a_without_its_b_or_of_another_rank_is_refused(tmp_path):
    specs = lora_specs(CONFIG, 4, ("mlp.up_proj",))
    with pytest.raises(ConfigError, match="has lora_A but not its partner"):
        open_adapter(_adapter(tmp_path / "one", [s for s in specs if "lora_B" not in s.name]))
    b_rank_3 = [s if "lora_A" in s.name else type(s)(s.name, s.dtype, (s.shape[0], 3)) for s in specs]
    with pytest.raises(ConfigError, match=r"lora_B \[48, 3\]; expected rank 4"):
        open_adapter(_adapter(tmp_path / "two", b_rank_3))
    with pytest.raises(ConfigError, match="holds no LoRA weights"):  # write_safetensors of no tensors
        open_adapter(_adapter(tmp_path / "three", []))


def test_target_modules_name_modules_at_a_dot_boundary(tmp_path):
    specs = lora_specs(CONFIG, 4, ("self_attn.q_proj",))
    with pytest.raises(ConfigError, match="which its adapter_config.json's target_modules"):
        open_adapter(_adapter(tmp_path, specs, target_modules=["proj"]))  # PEFT adapts no module named "proj"


def test_an_adapter_whose_lora_b_has_another_width_does_not_fit(tmp_path):
    other = {**CONFIG, "intermediate_size": 64}
    write_random_lora(tmp_path / "a", other, rank=4, alpha=8, modules=("mlp.up_proj",))  # only B is [ffn, r]
    shapes = {s.name: s.shape for s in base_specs(CONFIG)}
    with pytest.raises(ConfigError, match="mlp.up_proj is 48x32 but its LoRA is 64x4"):
        check_adapter_fits(open_adapter(tmp_path / "a"), shapes, CONFIG["num_hidden_layers"])


def _rewrite(folder, edit):
    for shard in folder.glob("*.safetensors"):
        tensors = load_file(shard)
        edit(tensors)
        save_file(tensors, shard, metadata={"format": "pt"})


def test_a_bias_of_another_width_than_its_weight_is_refused(tmp_path):
    write_random_base(tmp_path / "b", CONFIG, shard_bytes=1 << 30)
    _rewrite(
        tmp_path / "b", lambda t: t.update({"model.layers.1.mlp.up_proj.bias": torch.zeros(47, dtype=torch.bfloat16)})
    )
    with pytest.raises(
        ConfigError, match=r"tensor model.layers.1.mlp.up_proj.bias is \[47\], its weight implies \[48\]"
    ):
        open_base(tmp_path / "b")


def test_a_quantized_base_is_refused(tmp_path):
    write_random_base(tmp_path / "b", CONFIG, shard_bytes=1 << 30)
    (tmp_path / "b" / "config.json").write_text(
        json.dumps({**CONFIG, "quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}})
    )
    with pytest.raises(ConfigError, match="is quantized; extract from float weights"):
        open_base(tmp_path / "b")


def test_a_tied_head_stored_in_another_float_type_is_the_embedding_unless_its_values_differ(tmp_path):
    tied = {**CONFIG, "tie_word_embeddings": True}
    write_random_base(tmp_path / "b", tied, shard_bytes=1 << 30)
    _rewrite(tmp_path / "b", lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].float()}))
    assert not stores_own_head(tied, index_model_dir(tmp_path / "b"))
    _rewrite(tmp_path / "b", lambda t: t.update({"lm_head.weight": t["lm_head.weight"] * 2}))
    assert stores_own_head(tied, index_model_dir(tmp_path / "b"))
    _rewrite(tmp_path / "b", lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    assert not stores_own_head(tied, index_model_dir(tmp_path / "b"))  # the same bytes
    _rewrite(tmp_path / "b", lambda t: t["lm_head.weight"][-1].add_(1))  # the last row alone differs
    assert stores_own_head(tied, index_model_dir(tmp_path / "b"))


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_a_stored_head_equal_to_the_embedding_is_left_out_only_when_the_config_ties_them(tmp_path, tie):
    """An untied model whose head happens to hold the embedding's bytes still has a head of its own: treating it as
    the tied copy would leave lm_head.weight out of what extraction reads and writes."""
    config = llama_config(2, 32, 48, 2, 50, tie_word_embeddings=tie)
    write_random_base(tmp_path / "b", config, shard_bytes=1 << 30)
    shard = next((tmp_path / "b").glob("*.safetensors"))
    tensors = load_file(shard)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, shard, metadata={"format": "pt"})
    base = open_base(tmp_path / "b")
    assert base.head_is_embedding == tie
    assert base.is_model_tensor("lm_head.weight") == (not tie)
    assert base.is_model_tensor("model.embed_tokens.weight")


def test_a_nemotron_nas_config_ties_its_head_only_where_it_says_so(tmp_path):
    """heal reads nemotron-nas checkpoints: their config is LlamaConfig's, untied unless tie_word_embeddings is true
    (the LLaMA-family defaults do not know the type, and refused it)."""
    write_random_base(tmp_path / "b", llama_config(1, 32, 48, 2, 50), shard_bytes=1 << 30)  # a head of its own
    deci = {"model_type": "nemotron-nas", "hidden_size": 32, "num_hidden_layers": 1, "vocab_size": 50}
    tensors = index_model_dir(tmp_path / "b")
    assert not stores_own_head(deci, tensors)
    assert stores_own_head({**deci, "tie_word_embeddings": True}, tensors)
    shard = next((tmp_path / "b").glob("*.safetensors"))
    stored = load_file(shard)
    stored["lm_head.weight"] = stored["model.embed_tokens.weight"].clone()
    save_file(stored, shard, metadata={"format": "pt"})
    assert not stores_own_head({**deci, "tie_word_embeddings": True}, index_model_dir(tmp_path / "b"))


def test_weights_whose_config_json_does_not_parse_are_judged_by_their_tensors(tmp_path):
    """``--weights`` whose own config.json is unreadable (or of another family) is checked by its tensor shapes alone:
    matching tensors pass, mis-shaped ones are named."""
    from nsc_prune.hf.weights.base import check_weights_match

    config = llama_config(2, 32, 48, 2, 50)
    write_random_base(tmp_path / "w", config, shard_bytes=1 << 30)
    (tmp_path / "w" / "config.json").write_text("{not json")
    tensors = index_model_dir(tmp_path / "w")
    check_weights_match(tmp_path / "w", tensors, config)
    with pytest.raises(ConfigError, match=r"tensor model\.layers\.0\.mlp\.gate_proj\.weight is \[48, 32\] but"):
        check_weights_match(tmp_path / "w", tensors, {**config, "intermediate_size": 64})
