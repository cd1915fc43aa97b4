"""nsc_prune.hf.weights.synthetic: random LLaMA-shaped checkpoints load in transformers and as a base."""

from __future__ import annotations

import json

import pytest

from nsc_prune.hf.weights.synthetic import base_specs, llama_config, lora_specs, write_random_base, write_random_lora

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_specs_follow_the_config():
    config = llama_config(3, 64, 96, 4, 100, kv_heads=2, rms_norm_eps=1e-5)
    assert config["num_key_value_heads"] == 2 and config["rms_norm_eps"] == 1e-5
    specs = {s.name: s.shape for s in base_specs(config)}
    assert len(specs) == 3 + 3 * 9
    assert specs["model.layers.2.self_attn.k_proj.weight"] == (2 * 16, 64)
    assert specs["model.layers.0.mlp.down_proj.weight"] == (64, 96)
    lora = {s.name: s.shape for s in lora_specs(config, 8)}
    assert len(lora) == 3 * 6 * 2
    assert lora["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"] == (32, 8)
    assert lora["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"] == (8, 96)


def test_written_base_and_adapter_load(tmp_path):
    from safetensors.torch import load_file

    from nsc_prune.hf.weights.base import open_base

    config = llama_config(2, 64, 96, 4, 100, kv_heads=2)
    specs = write_random_base(tmp_path / "base", config, shard_bytes=40_000)
    shards = sorted((tmp_path / "base").glob("*.safetensors"))
    assert len(shards) > 1 and sum(s.nbytes for s in specs) == sum(
        t.numel() * 2 for shard in shards for t in load_file(shard).values()
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
    norm = model.model.layers[1].input_layernorm.weight
    assert torch.equal(norm, torch.ones_like(norm))
    q = model.model.layers[0].self_attn.q_proj.weight
    assert 0.01 < q.std().item() < 0.03 and not torch.equal(q, model.model.layers[1].self_attn.q_proj.weight)
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()
    assert list(open_base(tmp_path / "base").widths) == [96, 96]

    write_random_lora(tmp_path / "adapter", config, rank=4, alpha=8)
    adapter = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8 and "o_proj" not in adapter["target_modules"]
    weights = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert weights["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"].shape == (32, 4)


def test_same_seed_same_weights(tmp_path):
    from safetensors.torch import load_file

    config = llama_config(1, 32, 48, 2, 50)
    for name in ("a", "b"):
        write_random_base(tmp_path / name, config, shard_bytes=1 << 30)
    a, b = (load_file(next((tmp_path / n).glob("*.safetensors"))) for n in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_llama_config_defaults_are_the_documented_ones():
    """The benchmarks' inputs: a bf16, untied, MHA LLaMA unless told otherwise (a tied or GQA default would change
    every benchmark's parameter count and its numbers)."""
    config = llama_config(2, 32, 48, 4, 50)
    assert config["num_key_value_heads"] == 4 and config["tie_word_embeddings"] is False
    assert config["dtype"] == "bfloat16" and config["rms_norm_eps"] == 1e-6
    assert config["max_position_embeddings"] == 2048 and config["rope_theta"] == 1e4
    assert llama_config(2, 32, 48, 4, 50, kv_heads=2, tie_word_embeddings=True)["tie_word_embeddings"] is True


def test_another_seed_writes_other_weights(tmp_path):
    """``seed`` is the benchmarks' knob for another random model: it was not checked to change anything."""
    from safetensors.torch import load_file

    config = llama_config(1, 32, 48, 2, 50)
    for seed in (0, 1):
        write_random_base(tmp_path / str(seed), config, shard_bytes=1 << 30, seed=seed)
    a, b = (load_file(next((tmp_path / str(s)).glob("*.safetensors"))) for s in (0, 1))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(a[name], b[name])
    assert torch.equal(a["model.norm.weight"], b["model.norm.weight"])  # ones whatever the seed
