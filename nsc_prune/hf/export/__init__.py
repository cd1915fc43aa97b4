"""Export formats other than nsc-prune's own (``--format pruned|padded``): one module per format, registered here.

Two kinds of format, told apart by the module's ``FILE_FORMAT`` flag:

- checkpoint formats (``nemotron-nas``) are Hugging Face checkpoint folders written by extraction's own writer.
  The module has ``check(plans, base, options)``, which raises unless the base and plan can be written in the
  format (run before any slow step), and ``prepare(plans, base, adapter, options, keeps) -> Export``: the output
  config.json, the output tensors as extraction jobs (renamed / zero-padded; they stream like the default
  format's), the code files to ship, and a report (padding overhead) for ``nsc_prune_extract.json`` and stdout.
- file formats (``gguf``, ``FILE_FORMAT = True``) write one file with their own writer, from the same plan
  checks and streaming jobs: ``check_out(out, inputs, overwrite)`` (the output path, before any slow step),
  ``check_base(base)`` (what the format can express, before calibration) and
  ``export(plans, base, out, adapter, options, record, orders) -> Path``.

Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

EXPORTS = {
    "nemotron-nas": "nsc_prune.hf.export.nemotron_nas",  # vLLM's DeciLMForCausalLM checkpoint (block_configs)
    "gguf": "nsc_prune.hf.export.gguf_deci",  # llama.cpp GGUF, architecture "deci" (per-layer widths and heads)
}
"""``--format`` name -> the module that writes it."""


@dataclass(frozen=True)
class Export:
    """What a checkpoint format module decided: config.json, output tensor jobs, shipped files, and its report."""

    config: dict[str, Any]
    jobs: list[Any]  # nsc_prune.hf.extract._Job
    files: tuple[Path, ...] = ()
    report: dict[str, Any] = field(default_factory=dict)


def _module(name: str) -> ModuleType | None:
    return importlib.import_module(EXPORTS[name]) if name in EXPORTS else None


def checkpoint_export(name: str) -> ModuleType | None:
    """The module writing checkpoint format ``name``; None for nsc-prune's own formats and for file formats."""
    module = _module(name)
    return module if module is not None and not getattr(module, "FILE_FORMAT", False) else None


def file_export(name: str) -> ModuleType | None:
    """The module writing file format ``name`` (its own writer); None otherwise."""
    module = _module(name)
    return module if module is not None and getattr(module, "FILE_FORMAT", False) else None
