"""Random-weight LLaMA-shaped checkpoints at any size, written one tensor at a time (never the whole model in
memory): the inputs of the scale, extraction and sensitivity benchmarks (scripts/bench_*.py).

Each tensor is a slice of one random pool at a moving offset: drawing billions of fresh normals would dominate
the run. RMSNorm weights are 1, as trained models' roughly are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nsc_prune.core.spec import config_head_dim, config_kv_heads, projection_shapes
from nsc_prune.hf.weights.safetensors_io import TensorSpec, write_safetensors, write_sharded

LORA_MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)  # LoNAS's LLaMA-7B super-adapter targets
POOL_STRIDE = 4099  # the pool offset moves by this many values per tensor


def llama_config(
    layers: int, hidden: int, ffn: int, heads: int, vocab: int, kv_heads: int | None = None, **extra: Any
) -> dict[str, Any]:
    """A bf16 ``LlamaForCausalLM`` config.json of these shapes (``kv_heads`` default: ``heads``, MHA); ``extra``
    keys override the defaults (``rms_norm_eps`` 1e-6, ``max_position_embeddings`` 2048, ``rope_theta`` 1e4)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads if kv_heads is None else kv_heads,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "rope_theta": 10000.0,
        **extra,
    }


def layer_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``(out, in)`` of each projection of one decoder layer of ``config``."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    return projection_shapes(
        hidden, config_head_dim(config), heads, config_kv_heads(config), config["intermediate_size"]
    )


def base_specs(config: dict[str, Any]) -> list[TensorSpec]:
    """Every bf16 tensor of the checkpoint of ``config``, in file order."""
    hidden, vocab, shapes = config["hidden_size"], config["vocab_size"], layer_shapes(config)
    specs = [TensorSpec("model.embed_tokens.weight", "BF16", (vocab, hidden))]
    for i in range(config["num_hidden_layers"]):
        specs += [TensorSpec(f"model.layers.{i}.{m}.weight", "BF16", s) for m, s in shapes.items()]
        specs += [
            TensorSpec(f"model.layers.{i}.{n}.weight", "BF16", (hidden,))
            for n in ("input_layernorm", "post_attention_layernorm")
        ]
    return [
        *specs,
        TensorSpec("model.norm.weight", "BF16", (hidden,)),
        TensorSpec("lm_head.weight", "BF16", (vocab, hidden)),
    ]


def lora_specs(config: dict[str, Any], rank: int, modules: Sequence[str] = LORA_MODULES) -> list[TensorSpec]:
    """The PEFT LoRA tensors (``lora_A`` [rank, in], ``lora_B`` [out, rank]) of ``modules`` in every layer."""
    shapes, specs = layer_shapes(config), []
    for i in range(config["num_hidden_layers"]):
        for m in modules:
            out_f, in_f = shapes[m]
            prefix = f"base_model.model.model.layers.{i}.{m}"
            specs += [
                TensorSpec(f"{prefix}.lora_A.weight", "BF16", (rank, in_f)),
                TensorSpec(f"{prefix}.lora_B.weight", "BF16", (out_f, rank)),
            ]
    return specs


def random_tensors(specs: Sequence[TensorSpec], seed: int = 0) -> Iterator[Any]:
    """A bf16 tensor per spec, in order, each made only when asked for: a slice of one pool of N(0, 0.02^2) values
    (as large as the largest spec) at a moving offset; 1-D tensors (RMSNorm weights) are ones."""
    import torch

    largest = max(math.prod(s.shape) for s in specs)
    generator = torch.Generator().manual_seed(seed)
    pool = (torch.randn(largest + POOL_STRIDE, generator=generator) * 0.02).to(torch.bfloat16)
    for k, spec in enumerate(specs):
        numel = math.prod(spec.shape)
        start = (k * POOL_STRIDE) % (pool.numel() - numel + 1)
        tensor = pool[start : start + numel].reshape(spec.shape).clone()
        yield tensor.fill_(1.0) if len(spec.shape) == 1 else tensor


def write_random_base(folder: Path, config: dict[str, Any], shard_bytes: int, seed: int = 0) -> list[TensorSpec]:
    """``folder``: ``random_tensors`` of ``base_specs(config)`` in safetensors shards of at most ``shard_bytes``
    (whole tensors never split), its index and config.json. Returns the specs."""
    specs = base_specs(config)
    folder.mkdir(parents=True)
    write_sharded(folder, specs, random_tensors(specs, seed), max_shard_bytes=shard_bytes)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return specs


def write_random_lora(
    folder: Path,
    config: dict[str, Any],
    rank: int,
    alpha: int,
    modules: Sequence[str] = LORA_MODULES,
    seed: int = 0,
) -> list[TensorSpec]:
    """``folder``: a PEFT LoRA adapter on ``config``'s ``modules`` with random bf16 weights (adapter_model.safetensors
    and adapter_config.json). Returns the specs."""
    specs = lora_specs(config, rank, modules)
    folder.mkdir(parents=True)
    write_safetensors(folder / "adapter_model.safetensors", specs, random_tensors(specs, seed))
    adapter_config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "bias": "none",
        "task_type": "CAUSAL_LM",
        "target_modules": sorted({m.split(".")[-1] for m in modules}),
    }
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return specs
