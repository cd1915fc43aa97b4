"""LLaMA with per-layer FFN widths and head counts, read from the config's ``per_layer_config``.

transformers >= 5.14 stores heterogeneous layers in ``LlamaConfig.per_layer_config``
(e.g. ``{"3": {"intermediate_size": 1152}}``) but stock ``LlamaForCausalLM`` builds every MLP from the
global ``intermediate_size``. Head counts cannot go there: ``LlamaConfig`` validation reads
``num_attention_heads`` globally, which a heterogeneous config refuses (transformers 5.23). So per-layer
heads live in ``nsc_per_layer_attention`` (sparse, same key format:
``{"3": {"num_attention_heads": 6, "num_key_value_heads": 2}}``); whole KV groups are kept with their
query heads, so ``num_attention_heads / num_key_value_heads`` and ``head_dim`` never change.
Dropped layers are simply absent: ``num_hidden_layers`` counts the kept ones, renumbered 0..n-1
(``nsc_kept_layers`` names each one's index in the base model, for provenance only).

This file differs from stock LLaMA only in that each decoder layer builds its MLP from
``config.per_layer_config[i]`` and narrows its q/k/v/o projections to its head count; forward passes are
the stock ones.

nsc-prune copies this file into every pruned checkpoint and points ``auto_map`` at it, so
``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` works; ``nsc_prune.load_pruned``
imports the same class from the installed package instead. Keep it self-contained: it may import
torch and transformers only.
"""

from __future__ import annotations

from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    LlamaPreTrainedModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)


def _narrow_attention(attn: LlamaAttention, config: LlamaConfig, heads: int, kv_heads: int) -> None:
    """Rebuild q/k/v/o for ``heads`` query and ``kv_heads`` KV heads (same GQA ratio, same head_dim)."""
    if heads * config.num_key_value_heads != kv_heads * config.num_attention_heads:
        raise ValueError(
            f"layer {attn.layer_idx}: {heads} query heads for {kv_heads} KV heads breaks the GQA ratio "
            f"{config.num_attention_heads}:{config.num_key_value_heads} of the config"
        )
    bias, hidden, dim = config.attention_bias, config.hidden_size, attn.head_dim
    attn.q_proj = nn.Linear(hidden, heads * dim, bias=bias)
    attn.k_proj = nn.Linear(hidden, kv_heads * dim, bias=bias)
    attn.v_proj = nn.Linear(hidden, kv_heads * dim, bias=bias)
    attn.o_proj = nn.Linear(heads * dim, hidden, bias=bias)


class NscLlamaDecoderLayer(LlamaDecoderLayer):
    """A stock LLaMA decoder layer whose heads and MLP width come from ``config.per_layer_config[layer_idx]``."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        GradientCheckpointingLayer.__init__(self)
        self.hidden_size = config.hidden_size
        # A homogeneous config returns itself here, so one class serves pruned and full checkpoints.
        layer_config = config.per_layer_config[layer_idx]
        self.self_attn = LlamaAttention(config=config, layer_idx=layer_idx)
        heads = (getattr(config, "nsc_per_layer_attention", None) or {}).get(str(layer_idx))
        if heads:
            _narrow_attention(self.self_attn, config, heads["num_attention_heads"], heads["num_key_value_heads"])
        self.mlp = LlamaMLP(layer_config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class NscLlamaPreTrainedModel(LlamaPreTrainedModel):
    _no_split_modules = ["NscLlamaDecoderLayer"]
    _can_record_outputs = {"hidden_states": NscLlamaDecoderLayer, "attentions": LlamaAttention}


class NscLlamaModel(NscLlamaPreTrainedModel, LlamaModel):
    def __init__(self, config: LlamaConfig):
        NscLlamaPreTrainedModel.__init__(self, config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [NscLlamaDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()


class NscLlamaForCausalLM(NscLlamaPreTrainedModel, LlamaForCausalLM):
    def __init__(self, config: LlamaConfig):
        NscLlamaPreTrainedModel.__init__(self, config)
        self.model = NscLlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


__all__ = ["NscLlamaForCausalLM", "NscLlamaModel", "NscLlamaPreTrainedModel"]
