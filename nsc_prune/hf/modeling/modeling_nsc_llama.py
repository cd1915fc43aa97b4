"""LLaMA-family models (Llama, Mistral, Qwen2, Qwen3, Granite, SmolLM3, OLMo 2, Phi-3, Gemma 2, Gemma 3) with per-layer FFN widths
and head counts.

transformers >= 5.14 stores heterogeneous layers in ``config.per_layer_config``
(e.g. ``{"3": {"intermediate_size": 1152}}``) but the stock models build every MLP from the global
``intermediate_size``. Head counts cannot go there: config validation reads ``num_attention_heads``
globally, which a heterogeneous config refuses (transformers 5.23). So per-layer heads live in
``nsc_per_layer_attention`` (sparse, same key format: ``{"3": {"num_attention_heads": 6,
"num_key_value_heads": 2}}``); whole KV groups are kept with their query heads, so
``num_attention_heads / num_key_value_heads`` and ``head_dim`` never change (nor do Qwen3's and Gemma 3's q/k
norms, which act on one head; nor Granite's multipliers nor Gemma's soft-capping, which are scalars of the config). OLMo 2 (norms after attention
and the MLP, the stock layer's) keeps every KV group: its q/k norms span the whole projection, so no cut of them
equals the masked original (``nsc_prune.core.spec.NO_KV_CUTS``). Dropped layers are simply absent:
``num_hidden_layers`` counts the kept ones, renumbered 0..n-1, with per-layer lists such as ``layer_types`` and
SmolLM3's ``no_rope_layers`` sliced to match (``nsc_kept_layers`` names each one's index in the base model, for
provenance only).

Each class here is the stock ``...ForCausalLM``: its ``__init__`` builds the stock model (reading the
global values of per-layer attributes), then narrows each decoder layer's projections in place to the
layer's width and heads, keeping each projection's bias (Qwen2: q/k/v only); Phi-3's fused qkv_proj and
gate_up_proj keep their layout (q, k, v rows; gate, up rows), its attention splits them at its own head counts. Forward passes, weight
names and initialisation are the stock ones. A homogeneous config builds the stock model unchanged.

nsc-prune copies this file into every pruned checkpoint whose layers differ (per-layer widths or heads) and
points ``auto_map`` at the class of its ``model_type``, so
``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` works; ``nsc_prune.load_pruned`` imports
the same class from the installed package instead. A homogeneous checkpoint (every kept layer the same width
and KV groups, layers dropped or not) is stock: global sizes, the stock class in ``architectures``, no
``auto_map`` and no copy of this file, so plain ``AutoModelForCausalLM.from_pretrained(dir)`` loads it (and
``load_pruned`` through these classes, which build it unchanged). Keep this file self-contained: it may import
torch and transformers only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from transformers import PreTrainedConfig
from transformers.models.gemma2.modeling_gemma2 import Gemma2ForCausalLM
from transformers.models.gemma3.modeling_gemma3 import Gemma3ForCausalLM
from transformers.models.granite.modeling_granite import GraniteForCausalLM
from transformers.models.llama.modeling_llama import LlamaForCausalLM
from transformers.models.mistral.modeling_mistral import MistralForCausalLM
from transformers.models.olmo2.modeling_olmo2 import Olmo2ForCausalLM
from transformers.models.phi3.modeling_phi3 import Phi3ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3ForCausalLM
from transformers.models.smollm3.modeling_smollm3 import SmolLM3ForCausalLM

HEADS_KEY = "nsc_per_layer_attention"


def _linear(old: nn.Linear, out_features: int, in_features: int) -> nn.Linear:
    """``old`` itself if it already has this shape, else a new Linear on its device and dtype, with a bias iff it has
    one."""
    if (old.out_features, old.in_features) == (out_features, in_features):
        return old
    weight = old.weight
    return nn.Linear(in_features, out_features, bias=old.bias is not None, device=weight.device, dtype=weight.dtype)


def _narrow_mlp(mlp: nn.Module, width: int) -> None:
    """Give a SwiGLU MLP ``width`` channels: gate/up keep ``width`` rows (Phi-3's fused gate_up_proj ``2 width``:
    gate then up), down ``width`` columns."""
    hidden = mlp.down_proj.out_features
    if hasattr(mlp, "gate_up_proj"):
        mlp.gate_up_proj = _linear(mlp.gate_up_proj, 2 * width, hidden)
    else:
        mlp.gate_proj = _linear(mlp.gate_proj, width, hidden)
        mlp.up_proj = _linear(mlp.up_proj, width, hidden)
    mlp.down_proj = _linear(mlp.down_proj, hidden, width)
    mlp.intermediate_size = width


class _LayerConfig:
    """A layer's view of the model config with its own head counts (Phi-3's attention splits its fused qkv_proj
    at ``config.num_attention_heads * head_dim``); every other attribute is the model config's, read live."""

    def __init__(self, config: PreTrainedConfig, **own: int):
        self._config, self._own = config, own

    def __getattr__(self, name: str):
        # copy and pickle look up __setstate__ and the like before __init__ ran: no fields to read yet
        if name.startswith("__") or "_own" not in self.__dict__:
            raise AttributeError(name)
        own = self.__dict__["_own"]
        return own[name] if name in own else getattr(self.__dict__["_config"], name)


def _narrow_attention(attn: nn.Module, config: PreTrainedConfig, heads: int, kv_heads: int) -> None:
    """Give an attention block ``heads`` query and ``kv_heads`` KV heads (same GQA ratio, same head_dim)."""
    if heads * config.num_key_value_heads != kv_heads * config.num_attention_heads:
        raise ValueError(
            f"layer {attn.layer_idx}: {HEADS_KEY} gives {heads} query heads for {kv_heads} KV heads, which breaks "
            f"the GQA ratio {config.num_attention_heads}:{config.num_key_value_heads} of the config; "
            "keep whole KV groups with their query heads"
        )
    hidden, dim = attn.o_proj.out_features, attn.head_dim
    if hasattr(attn, "qkv_proj"):
        attn.qkv_proj = _linear(attn.qkv_proj, (heads + 2 * kv_heads) * dim, hidden)
        attn.config = _LayerConfig(config, num_attention_heads=heads, num_key_value_heads=kv_heads)
        attn.num_key_value_heads = kv_heads
    else:
        attn.q_proj = _linear(attn.q_proj, heads * dim, hidden)
        attn.k_proj = _linear(attn.k_proj, kv_heads * dim, hidden)
        attn.v_proj = _linear(attn.v_proj, kv_heads * dim, hidden)
    attn.o_proj = _linear(attn.o_proj, attn.o_proj.out_features, heads * dim)


def narrow_layers(layers: nn.ModuleList, config: PreTrainedConfig) -> None:
    """Narrow each decoder layer to its width (``config.per_layer_config[i]``) and heads (``HEADS_KEY``)."""
    heads = getattr(config, HEADS_KEY, None) or {}
    for i, layer in enumerate(layers):
        # A homogeneous config returns itself here, so one class serves pruned and full checkpoints.
        _narrow_mlp(layer.mlp, config.per_layer_config[i].intermediate_size)
        if str(i) in heads:
            _narrow_attention(
                layer.self_attn, config, heads[str(i)]["num_attention_heads"], heads[str(i)]["num_key_value_heads"]
            )


class _QuietGlobalReads(logging.Filter):
    """Drops transformers' warning about reading a per-layer attribute globally: we narrow the layers right after."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "per-layer attribute" not in record.getMessage()


@contextmanager
def _global_values(config: PreTrainedConfig) -> Iterator[None]:
    """Let the stock constructors read the global value of per-layer attributes (the layers are narrowed after)."""
    if not getattr(config, "is_heterogeneous", False):
        yield
        return
    flag = "allow_global_per_layer_attribute_access"
    before = vars(config).get(flag)  # the flag lives in __dict__; leave no trace, or save_pretrained writes it
    quiet = _QuietGlobalReads()
    logger = logging.getLogger("transformers")
    setattr(config, flag, True)
    for handler in logger.handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in logger.handlers:
            handler.removeFilter(quiet)
        if before is None:
            vars(config).pop(flag, None)
        else:
            setattr(config, flag, before)


class _Narrowed:
    """Mixin for a stock ``...ForCausalLM``: build it, then narrow its layers (first in the MRO, before the stock
    class).

    ``from_pretrained`` builds on the meta device, so the full-width projections replaced here never take
    memory; only a direct ``Nsc...ForCausalLM(config)`` allocates them for a moment.
    """

    def __init__(self, config: PreTrainedConfig):
        with _global_values(config):
            super().__init__(config)
        narrow_layers(self.model.layers, config)
        self.init_weights()  # initialises only the new projections (the rest is flagged); a no-op on meta

    def _get_static_cache_init_shape(self) -> tuple | None:
        # generate()'s static cache, set up before the first step (prefill_chunk_size), would take every layer's KV
        # heads from the global count: with heads per layer, a narrower layer's first write failed. None: the
        # cache takes each layer's shape from its first keys, as it does without chunking.
        if getattr(self.config, HEADS_KEY, None):
            return None
        return super()._get_static_cache_init_shape()


class NscLlamaForCausalLM(_Narrowed, LlamaForCausalLM):
    pass


class NscMistralForCausalLM(_Narrowed, MistralForCausalLM):
    pass


class NscQwen2ForCausalLM(_Narrowed, Qwen2ForCausalLM):
    pass


class NscQwen3ForCausalLM(_Narrowed, Qwen3ForCausalLM):
    pass


class NscGraniteForCausalLM(_Narrowed, GraniteForCausalLM):
    pass


class NscSmolLM3ForCausalLM(_Narrowed, SmolLM3ForCausalLM):
    pass


class NscOlmo2ForCausalLM(_Narrowed, Olmo2ForCausalLM):
    pass


class NscPhi3ForCausalLM(_Narrowed, Phi3ForCausalLM):
    pass


class NscGemma2ForCausalLM(_Narrowed, Gemma2ForCausalLM):
    pass


class NscGemma3ForCausalLM(_Narrowed, Gemma3ForCausalLM):
    pass


MODEL_CLASSES = {
    "granite": NscGraniteForCausalLM,
    "llama": NscLlamaForCausalLM,
    "mistral": NscMistralForCausalLM,
    "qwen2": NscQwen2ForCausalLM,
    "qwen3": NscQwen3ForCausalLM,
    "smollm3": NscSmolLM3ForCausalLM,
    "olmo2": NscOlmo2ForCausalLM,
    "phi3": NscPhi3ForCausalLM,
    "gemma2": NscGemma2ForCausalLM,
    "gemma3_text": NscGemma3ForCausalLM,
}

__all__ = [
    "MODEL_CLASSES",
    "NscGemma2ForCausalLM",
    "NscGemma3ForCausalLM",
    "NscGraniteForCausalLM",
    "NscLlamaForCausalLM",
    "NscMistralForCausalLM",
    "NscOlmo2ForCausalLM",
    "NscPhi3ForCausalLM",
    "NscQwen2ForCausalLM",
    "NscQwen3ForCausalLM",
    "NscSmolLM3ForCausalLM",
]
