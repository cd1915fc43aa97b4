"""Output formats of extraction, one module per format, registered here by ``--format`` name.

Every format module provides the same four functions (``ExportFormat``):

- ``output_file(out, name, outtype) -> Path``: the path ``--out`` names (a folder for checkpoint formats;
  ``gguf`` also accepts a folder and names the file in it after the plan: ``name``, ``nsc_prune.plan.plan_name``);
- ``check_out(out, inputs, overwrite, chosen=False)``: refuse an output that exists (without ``overwrite``) or is
  an input, before any slow step (``nsc_prune._io.check_output``, docs/outputs.md); ``chosen``: the format chose
  the file name, so a collision is another extraction and the error must not suggest ``--overwrite``;
- ``check(plans, base, options)``: raise unless the base and plan can be written in the format, before calibration;
- ``write(extraction) -> Path``: every check, then the output (``nsc_prune.hf.cut.jobs.Extraction``), atomically.

Checkpoint formats (``pruned`` and ``padded``: nsc-prune's own, ``nsc_prune.hf.export.pruned``; ``nemotron-nas``)
are Hugging Face checkpoint folders written by one writer (``nsc_prune.hf.export.checkpoint``) from what the
format's ``prepare(extraction, indexes)`` decides (an ``Export``: config.json, the output tensors as jobs, files
to ship, a report).
``gguf`` writes one file with its own writer from the same jobs. A new format is one module and one entry in
``EXPORTS``. Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nsc_prune.hf.cut.jobs import Job
    from nsc_prune.hf.cut.request import Extraction, ExtractOptions
    from nsc_prune.hf.weights.base import BaseModel
    from nsc_prune.plan import LayerPlan

EXPORTS = {
    "pruned": "nsc_prune.hf.export.pruned",  # nsc-prune's own: per-layer shapes, shipped modeling file (default)
    "padded": "nsc_prune.hf.export.pruned",  # zero-padded full-width weights stock transformers loads
    "nemotron-nas": "nsc_prune.hf.export.nemotron_nas",  # vLLM's DeciLMForCausalLM checkpoint (block_configs)
    "gguf": "nsc_prune.hf.export.gguf_format",  # llama.cpp GGUF: "deci" (per-layer) or the family's own (homogeneous)
}
"""``--format`` name (``nsc_prune.choices.FORMATS``, in that order) -> the module that writes it."""


class ExportFormat(Protocol):
    """The functions every format module provides (module docstring)."""

    def output_file(self, out: str | os.PathLike, name: str, outtype: str | None) -> Path: ...

    def check_out(
        self, out: Path, inputs: Iterable[str | os.PathLike | None], overwrite: bool, chosen: bool = False
    ) -> None: ...

    def check(self, plans: list[LayerPlan], base: BaseModel, options: ExtractOptions) -> None: ...

    def write(self, extraction: Extraction) -> Path: ...


@dataclass(frozen=True)
class Export:
    """What a checkpoint format decided: config.json, output tensor jobs, shipped files, and its report."""

    config: dict[str, Any]
    jobs: list[Job]
    files: tuple[Path, ...] = ()
    report: dict[str, Any] = field(default_factory=dict)


def export_format(name: str) -> ExportFormat:
    """The module writing format ``name`` (a key of ``EXPORTS``)."""
    return importlib.import_module(EXPORTS[name])
