"""Export formats of ``nsc-prune extract --format F``: other file layouts than a Hugging Face checkpoint.

Each format is one module exposing ``check_out(out, inputs, overwrite)`` (the output path, before any slow
step), ``check_base(base)`` (what the format can express, before calibration) and ``export(plans, base, out,
adapter, options, record, orders) -> Path``. They reuse extraction's plan checks and streaming jobs
(``nsc_prune.hf.extract``) and differ only in how the tensors are named, laid out and written.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXPORTERS: dict[str, str] = {
    "gguf": "nsc_prune.hf.export.gguf_deci",  # llama.cpp GGUF, architecture "deci" (per-layer widths and heads)
}
EXPORT_FORMATS = tuple(EXPORTERS)


def exporter(format: str) -> ModuleType | None:
    """The module writing ``format``, or None for the Hugging Face layouts (``pruned``, ``padded``)."""
    return importlib.import_module(EXPORTERS[format]) if format in EXPORTERS else None
