"""LLaMA with a per-layer FFN width, read from the config's ``per_layer_config``.

transformers >= 5.14 stores heterogeneous layers in ``LlamaConfig.per_layer_config``
(e.g. ``{"3": {"intermediate_size": 1152}}``) but stock ``LlamaForCausalLM`` builds every MLP from the
global ``intermediate_size``. This file differs from it only in that each decoder layer builds its MLP
from ``config.per_layer_config[i]``; forward passes are the stock ones.

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


class NscLlamaDecoderLayer(LlamaDecoderLayer):
    """A stock LLaMA decoder layer whose MLP width comes from ``config.per_layer_config[layer_idx]``."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        GradientCheckpointingLayer.__init__(self)
        self.hidden_size = config.hidden_size
        self.self_attn = LlamaAttention(config=config, layer_idx=layer_idx)
        # A homogeneous config returns itself here, so one class serves pruned and full checkpoints.
        self.mlp = LlamaMLP(config.per_layer_config[layer_idx])
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
