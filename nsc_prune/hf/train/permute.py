"""Reorder a model's FFN channels and KV groups in memory (function-preserving).

train-supernet does not need this: it stores the channel order beside the adapter and extraction applies it
(``nsc_prune.hf.train.supernet``). ``permute_model_`` shows what that order means: the permuted model computes
the same function, and "keep the first ``k``" of it is "keep ``order[:k]``" of the original.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nsc_prune.core.spec import config_head_dim, config_kv_heads
from nsc_prune.errors import ConfigError, require
from nsc_prune.hf.cut.keep import LayerOrder

torch = require("torch", "hf")


def _take(linear: Any, index: torch.Tensor, dim: int) -> None:
    linear.weight.data = linear.weight.data.index_select(dim, index)
    if dim == 0 and getattr(linear, "bias", None) is not None:
        linear.bias.data = linear.bias.data.index_select(0, index)


def permute_model_(model: Any, orders: Sequence[LayerOrder]) -> Any:
    """Permute, in place, every layer's FFN channels (gate/up rows, down columns) and KV groups (their k/v rows,
    their query heads' q rows and o columns) so that unit ``order[j]`` becomes unit ``j``. Returns ``model``."""
    from nsc_prune.hf.train.subnets import decoder_of

    layers, config = decoder_of(model)
    if len(orders) != len(layers):
        raise ConfigError(f"the channel order has {len(orders)} layers but the model has {len(layers)}")
    heads, kv, head_dim = int(config["num_attention_heads"]), config_kv_heads(config), config_head_dim(config)
    group = heads // kv
    with torch.no_grad():
        for layer, order in zip(layers, orders, strict=True):
            device = layer.mlp.gate_proj.weight.device  # index_select wants its index where the weight is
            ffn = torch.tensor(order.ffn, dtype=torch.long, device=device)
            _take(layer.mlp.gate_proj, ffn, 0)
            _take(layer.mlp.up_proj, ffn, 0)
            _take(layer.mlp.down_proj, ffn, 1)
            kv_rows = torch.tensor(
                [g * head_dim + d for g in order.kv_groups for d in range(head_dim)], dtype=torch.long, device=device
            )
            q_rows = torch.tensor(
                [
                    (g * group + j) * head_dim + d
                    for g in order.kv_groups
                    for j in range(group)
                    for d in range(head_dim)
                ],
                dtype=torch.long,
                device=device,
            )
            attention = layer.self_attn
            _take(attention.q_proj, q_rows, 0)
            _take(attention.k_proj, kv_rows, 0)
            _take(attention.v_proj, kv_rows, 0)
            _take(attention.o_proj, q_rows, 1)
    return model
