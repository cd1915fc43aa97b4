"""Modeling code shipped inside pruned checkpoints (see ``modeling_nsc_llama.py``)."""

from __future__ import annotations

from pathlib import Path

MODELING_FILE = Path(__file__).with_name("modeling_nsc_llama.py")
AUTO_MAP = {"AutoModelForCausalLM": "modeling_nsc_llama.NscLlamaForCausalLM"}
