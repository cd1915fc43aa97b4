"""``--format gguf``: one llama.cpp GGUF file, tokenizer included, in the architecture llama.cpp has for the base.

``llama`` and ``mistral`` bases become architecture ``deci`` (per-layer FFN widths and heads: any plan;
``gguf_deci``); ``gemma2``, ``gemma3_text``, ``granite``, ``olmo2``, ``phi3`` and ``smollm3`` become llama.cpp's own
architecture for the family (a homogeneous plan only; ``gguf_native``). Other model types are refused naming what
llama.cpp's deci graph lacks for them. The file (naming, tokenizer, stored types, record) is ``gguf_file``'s.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from nsc_prune._files import CONFIG_NAME
from nsc_prune._validation import must_be
from nsc_prune.errors import UnsupportedArchitectureError
from nsc_prune.hf.cut.request import Extraction, ExtractOptions
from nsc_prune.hf.export import gguf_deci, gguf_native
from nsc_prune.hf.export.gguf_file import check_out, output_file
from nsc_prune.hf.weights.base import BaseModel
from nsc_prune.plan import LayerPlan

__all__ = ["check", "check_out", "output_file", "write"]  # nsc_prune.hf.export.ExportFormat
MODEL_TYPES = tuple(sorted(gguf_deci.MODEL_TYPES + gguf_native.MODEL_TYPES))
_MISSING = {  # what llama.cpp's deci graph (src/models/deci.cpp) lacks for these; it does read {arch}.attention.scale
    "qwen2": "q/k/v-only biases (qwen2)",
    "qwen3": "q/k norms (qwen3)",
}


def writer_of(base: BaseModel) -> ModuleType:
    """The module writing ``base``'s GGUF: ``gguf_native`` for its families, ``gguf_deci`` for llama/mistral."""
    model_type = base.config.get("model_type")
    if model_type in gguf_native.MODEL_TYPES:
        return gguf_native
    if model_type in gguf_deci.MODEL_TYPES:
        return gguf_deci
    raise UnsupportedArchitectureError(
        must_be(
            f"the base's model_type ({base.folder / CONFIG_NAME})",
            f"one of {list(MODEL_TYPES)} for --format gguf",
            model_type,
            f"llama.cpp's deci graph has no {_MISSING.get(model_type, 'layers of this type')}; "
            "write a Hugging Face checkpoint instead (--format pruned)",
        )
    )


def check(plans: list[LayerPlan], base: BaseModel, options: ExtractOptions) -> None:
    """Raise unless ``base`` and the plan can be written in the base's GGUF architecture (``writer_of``)."""
    writer_of(base).check(plans, base, options)


def write(extraction: Extraction) -> Path:
    """Write ``extraction`` as one GGUF file in the base's architecture; returns the file written."""
    return writer_of(extraction.base).write(extraction)
