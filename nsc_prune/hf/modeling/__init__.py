"""Modeling code shipped inside pruned checkpoints (see ``modeling_nsc_llama.py``).

Importing this package imports neither torch nor transformers; ``modeling_nsc_llama`` does.
"""

from __future__ import annotations

from pathlib import Path

from nsc_prune.core.spec import PER_LAYER_HEADS_KEY

MODELING_FILE = Path(__file__).with_name("modeling_nsc_llama.py")
# config.json keys of pruned checkpoints. The shipped modeling file cannot import this package and repeats
# HEADS_KEY (a test checks that they agree).
HEADS_KEY = PER_LAYER_HEADS_KEY  # sparse per-layer head counts: {"3": {"num_attention_heads": 6, ...}}
KEPT_LAYERS_KEY = "nsc_kept_layers"  # base index of each kept layer when layers were dropped
DECILM_TYPE = "nemotron-nas"  # model_type of --format nemotron-nas checkpoints (vLLM's DeciLMForCausalLM)
DECILM_FILES = (
    Path(__file__).with_name("configuration_nsc_decilm.py"),
    Path(__file__).with_name("modeling_nsc_decilm.py"),
)
DECILM_AUTO_MAP = {
    "AutoConfig": "configuration_nsc_decilm.DeciLMConfig",
    "AutoModelForCausalLM": "modeling_nsc_decilm.DeciLMForCausalLM",
}
ARCHITECTURES = {
    "llama": "NscLlamaForCausalLM",
    "mistral": "NscMistralForCausalLM",
    "qwen2": "NscQwen2ForCausalLM",
    "qwen3": "NscQwen3ForCausalLM",
}
"""``model_type`` -> the class in ``MODELING_FILE`` that builds it with per-layer widths and heads."""


def auto_map(model_type: str) -> dict[str, str]:
    """The config.json ``auto_map`` that points ``AutoModelForCausalLM`` at the shipped class for ``model_type``."""
    return {"AutoModelForCausalLM": f"{MODELING_FILE.stem}.{ARCHITECTURES[model_type]}"}
