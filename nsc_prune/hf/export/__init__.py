"""Export formats other than nsc-prune's own (``--format pruned|padded``): one module per format, registered here.

A format module has ``check(plans, base, options)``, which raises unless the base and plan can be written in the
format (run before any slow step), and ``prepare(plans, base, adapter, options, keeps) -> Export``, which checks
again and returns the output config.json, the output tensors as extraction jobs (``nsc_prune.hf.extract.model_jobs``,
renamed / zero-padded; they stream like the default format's), the code files to ship, and a report (padding
overhead) for ``nsc_prune_extract.json`` and stdout.
Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

EXPORTS = {"nemotron-nas": "nsc_prune.hf.export.nemotron_nas"}
"""``--format`` name -> the module that writes it."""


@dataclass(frozen=True)
class Export:
    """What a format module decided: config.json, output tensor jobs, shipped files, and its report."""

    config: dict[str, Any]
    jobs: list[Any]  # nsc_prune.hf.extract._Job
    files: tuple[Path, ...] = ()
    report: dict[str, Any] = field(default_factory=dict)


def export_module(name: str) -> ModuleType | None:
    """The module writing ``--format name``, or None for nsc-prune's own formats."""
    return importlib.import_module(EXPORTS[name]) if name in EXPORTS else None
