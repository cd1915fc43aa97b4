"""Modeling code shipped inside pruned checkpoints (see ``modeling_nsc_llama.py``).

Importing this package imports neither torch nor transformers; ``modeling_nsc_llama`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

MODELING_FILE = Path(__file__).with_name("modeling_nsc_llama.py")
# config.json keys of pruned checkpoints; the per-layer heads key is core.spec.PER_LAYER_HEADS_KEY (the shipped
# modeling file cannot import the package and repeats it as HEADS_KEY; a test checks that they agree).
KEPT_LAYERS_KEY = "nsc_kept_layers"  # base index of each kept layer when layers were dropped
DECILM_TYPE = "nemotron-nas"  # model_type of --format nemotron-nas checkpoints (vLLM's DeciLMForCausalLM)
DECILM_FILES = (
    Path(__file__).with_name("configuration_nsc_decilm.py"),
    Path(__file__).with_name("modeling_nsc_decilm.py"),
)
# sha256 of the modeling_nsc_decilm.py that earlier nsc-prune releases shipped: nsc-prune's own code still (vLLM
# imports the configuration file alone and runs its own DeciLM model), so --backend vllm keeps reading them
EARLIER_DECILM_MODELING_SHA256 = frozenset(
    {
        "f267a22367a8cf47459c0f3abe7819d136b59ab73ea0b4dc72a26f63636bc8c9",
        "527013dcc80698ae4646bedd7d48ce14a29146a222cc6642ac8fcc04c9220d3b",
        "35846436f6b889a3415c4f7ccfdbbf3f8d54b690927eaee16d069bf4441e14f0",
        "1a7106f6454fd30e886897744b86620e28ed956fda5140801e8c731bee8e6ec3",
    }
)
DECILM_AUTO_MAP = {
    "AutoConfig": "configuration_nsc_decilm.DeciLMConfig",
    "AutoModelForCausalLM": "modeling_nsc_decilm.DeciLMForCausalLM",
}
ARCHITECTURES = {
    "granite": "NscGraniteForCausalLM",
    "llama": "NscLlamaForCausalLM",
    "mistral": "NscMistralForCausalLM",
    "qwen2": "NscQwen2ForCausalLM",
    "qwen3": "NscQwen3ForCausalLM",
    "smollm3": "NscSmolLM3ForCausalLM",
    "olmo2": "NscOlmo2ForCausalLM",
    "phi3": "NscPhi3ForCausalLM",
    "gemma2": "NscGemma2ForCausalLM",
    "gemma3_text": "NscGemma3ForCausalLM",
}
"""``model_type`` -> the class in ``MODELING_FILE`` that builds it with per-layer widths and heads."""
STOCK_ARCHITECTURES = {
    "granite": "GraniteForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
"""``model_type`` -> the stock transformers class a homogeneous pruned checkpoint names (no ``auto_map``)."""
LAYER_LISTS = ("layer_types", "mlp_layer_types", "no_rope_layers")
"""config.json lists with one entry per decoder layer (SmolLM3's ``no_rope_layers``: 1 where the layer rotates q/k),
sliced with the kept layers by extraction and left out of the one-layer-kind configs profiling times."""


HEADS_DIVIDE_WIDTH = frozenset({"llama", "gemma2", "gemma3_text"})
"""Model types whose transformers config refuses a ``hidden_size`` that ``num_attention_heads`` does not divide, even
with ``head_dim`` given (the others accept it; a test checks both against the installed transformers)."""


def heads_stay_global(config: Mapping[str, Any], heads: int) -> bool:
    """Whether layers that all keep ``heads`` query heads must still state the base's global heads, giving theirs per
    layer (``nsc_per_layer_attention``, the shipped class), in pruned checkpoints and in the configs profiling times:
    a stock config of ``config``'s type would refuse ``heads`` (``HEADS_DIVIDE_WIDTH``), or Phi3Config would check
    LongRoPE's factor lists against ``hidden_size // num_attention_heads``."""
    if heads == config.get("num_attention_heads"):
        return False
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    long_rope = config.get("model_type") == "phi3" and bool(rope.get("short_factor") or rope.get("long_factor"))
    return long_rope or config.get("model_type") in HEADS_DIVIDE_WIDTH and config["hidden_size"] % heads != 0


def auto_map(model_type: str) -> dict[str, str]:
    """The config.json ``auto_map`` that points ``AutoModelForCausalLM`` at the shipped class for ``model_type``."""
    return {"AutoModelForCausalLM": f"{MODELING_FILE.stem}.{ARCHITECTURES[model_type]}"}
