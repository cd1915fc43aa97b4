"""``DeciLMForCausalLM`` for ``nemotron-nas`` checkpoints: LLaMA with per-layer KV heads, FFN widths and no-op parts.

Weight names are LLaMA's (``model.layers.i.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``input_layernorm``, ``post_attention_layernorm``); a ``no_op`` attention has no q/k/v/o and no
``input_layernorm``, a ``no_op`` FFN no MLP and no ``post_attention_layernorm``: that part returns the residual
stream unchanged. Every layer has ``num_attention_heads`` query heads and ``num_attention_heads /
n_heads_in_group`` KV heads; the FFN width is ``ffn.intermediate_size``, or, when the block has ``ffn_mult``,
``_find_multiple(int(2 * ffn_mult * hidden_size / 3), 256)`` (vLLM's ``nemotron_nas.py`` definition).

The class is the stock ``LlamaForCausalLM`` whose decoder layers are replaced by ``DeciLMDecoderLayer`` (stock
layer, narrowed in place; built on the meta device by ``from_pretrained``). nsc-prune copies this file and
``configuration_nsc_decilm.py`` into the checkpoint; ``nsc_prune.load_pruned`` imports the same class from the
installed package. Keep it self-contained: torch, transformers and the configuration file only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaForCausalLM

from .configuration_nsc_decilm import DeciLMConfig


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


def ffn_width(ffn: Any, hidden_size: int) -> int:
    """The FFN width a (not no_op) block's ``ffn`` entry gives, as vLLM computes it."""
    if hasattr(ffn, "ffn_mult"):
        return _find_multiple(int(2 * ffn.ffn_mult * hidden_size / 3), 256)
    return int(ffn.intermediate_size)


def _linear(old: nn.Linear, out_features: int, in_features: int) -> nn.Linear:
    if (old.out_features, old.in_features) == (out_features, in_features):
        return old
    weight = old.weight
    return nn.Linear(in_features, out_features, bias=old.bias is not None, device=weight.device, dtype=weight.dtype)


class DeciLMDecoderLayer(LlamaDecoderLayer):
    """A LLaMA decoder layer narrowed to its block: KV heads, FFN width, or no attention / no FFN at all."""

    def __init__(self, config: DeciLMConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.layer_idx = layer_idx
        block = config.block_configs[layer_idx]
        linear = [part for part in ("attention", "ffn") if getattr(getattr(block, part), "replace_with_linear", False)]
        if linear:
            raise ValueError(
                f"layer {layer_idx}: {' and '.join(linear)} replace_with_linear (a block of NVIDIA's own Nemotron NAS "
                "models) is not supported; nsc-prune reads the nemotron-nas checkpoints it writes"
            )
        self.attention_no_op = bool(block.attention.no_op)
        self.ffn_no_op = bool(block.ffn.no_op)
        if self.attention_no_op:
            del self.self_attn, self.input_layernorm
        else:
            group = int(block.attention.n_heads_in_group)
            if config.num_attention_heads % group:
                raise ValueError(
                    f"layer {layer_idx}: n_heads_in_group={group} does not divide num_attention_heads="
                    f"{config.num_attention_heads}"
                )
            attn, hidden = self.self_attn, config.hidden_size
            kv = config.num_attention_heads // group
            attn.k_proj = _linear(attn.k_proj, kv * attn.head_dim, hidden)
            attn.v_proj = _linear(attn.v_proj, kv * attn.head_dim, hidden)
            attn.num_key_value_groups = group
        if self.ffn_no_op:
            del self.mlp, self.post_attention_layernorm
        else:
            width, mlp = ffn_width(block.ffn, config.hidden_size), self.mlp
            mlp.gate_proj = _linear(mlp.gate_proj, width, config.hidden_size)
            mlp.up_proj = _linear(mlp.up_proj, width, config.hidden_size)
            mlp.down_proj = _linear(mlp.down_proj, config.hidden_size, width)
            mlp.intermediate_size = width

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.attention_no_op:
            self._count_tokens(hidden_states, kwargs.get("cache", kwargs.get("past_key_values")))
        else:
            attended, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
            hidden_states = hidden_states + attended
        if not self.ffn_no_op:
            hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states

    def _count_tokens(self, hidden_states: torch.Tensor, cache: Any) -> None:
        """Store one number per token in this layer's cache: LlamaModel reads how many tokens the cache has seen,
        for positions and the attention mask, from layer 0's cache, which a no-op attention left empty (a cached step
        restarted at position 0, and a left-padded batch attended to its padding). An empty tensor counts as none."""
        if cache is not None:
            counted = hidden_states.new_zeros(hidden_states.shape[0], 1, hidden_states.shape[1], 1)
            cache.update(counted, counted, self.layer_idx)


class DeciLMForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` with one ``DeciLMDecoderLayer`` per ``block_configs`` entry."""

    config_class = DeciLMConfig
    _no_split_modules = ["DeciLMDecoderLayer"]  # device_map="auto" keeps each layer (its residual adds) on one GPU

    def __init__(self, config: DeciLMConfig):
        super().__init__(config)
        if not config.block_configs or len(config.block_configs) != config.num_hidden_layers:
            raise ValueError(f"block_configs must have one entry per layer ({config.num_hidden_layers})")
        self.model.layers = nn.ModuleList(DeciLMDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.init_weights()  # initialises only the new modules; a no-op on the meta device

    def _get_static_cache_init_shape(self) -> None:
        # generate()'s static cache, set up before the first step (prefill_chunk_size), would give every layer the
        # global KV heads: a layer of other heads (or a no-op's placeholder) failed its first write. None: each
        # layer's cache takes its shape from its first keys, as it does without chunking.
        return None


__all__ = ["DeciLMConfig", "DeciLMForCausalLM", "ffn_width"]
