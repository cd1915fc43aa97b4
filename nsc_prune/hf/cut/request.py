"""The extraction request: how to write a pruned model (``ExtractOptions``) and one output to write (``Extraction``).

Torch-free: the CLI builds and checks a request before anything heavy is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsc_prune._validation import is_int, must_be
from nsc_prune.choices import CHECKPOINT_DTYPES, FORMATS, GGUF_TYPES
from nsc_prune.errors import InvalidInputError
from nsc_prune.plan import LayerPlan, plan_name
from nsc_prune.presets import folder_model_name

if TYPE_CHECKING:
    from nsc_prune.hf.cut.keep import LayerOrder
    from nsc_prune.hf.weights.adapter import LoraAdapter
    from nsc_prune.hf.weights.base import BaseModel


MAX_SHARD_SIZE = 5 * 2**30  # bytes per safetensors shard extract and heal write (extract --max-shard-size)


@dataclass(frozen=True)
class ExtractOptions:
    """How to write the checkpoint (defaults are the CLI's defaults)."""

    keep_adapter: bool = False  # write the pruned base plus a sliced PEFT adapter instead of merging
    dtype: str | None = None  # output float dtype; None keeps each tensor's own
    format: str = "pruned"  # "padded": zero-padded full-width weights stock transformers loads (saves nothing);
    # "nemotron-nas", "gguf": the other formats of nsc_prune.hf.export
    pad: bool = True  # a format that cannot express the plan exactly zero-pads it; False refuses such a plan
    max_shard_size: int = MAX_SHARD_SIZE  # bytes per output shard
    overwrite: bool = False  # replace an earlier output of extract (docs/outputs.md)
    outtype: str | None = None  # format "gguf": tensor type of the 2-D weights (default "f16"; norms stay f32;
    # "q8_0" falls back to f16 for a matrix whose rows are not whole 32-value blocks)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise InvalidInputError(must_be("format", f"one of {FORMATS}", self.format))
        if self.dtype is not None and self.dtype not in CHECKPOINT_DTYPES:
            raise InvalidInputError(must_be("dtype", f"one of {CHECKPOINT_DTYPES}", self.dtype))
        if self.outtype is not None and self.outtype not in GGUF_TYPES:
            raise InvalidInputError(must_be("outtype", f"one of {GGUF_TYPES}", self.outtype))
        if self.outtype is not None and self.format != "gguf":
            raise InvalidInputError(must_be("outtype", "unset unless format is 'gguf'", self.outtype, "Use --dtype"))
        if self.format == "gguf" and (self.dtype is not None or self.keep_adapter):
            given = f"dtype={self.dtype!r}" if self.dtype is not None else "keep_adapter=True"
            raise InvalidInputError(
                must_be("the options of format 'gguf'", "outtype only (LoRA merged)", given, "Use --outtype")
            )
        if not self.pad and self.format != "nemotron-nas":  # the only format that zero-pads a plan
            raise InvalidInputError(
                must_be("--no-pad (pad=False)", "used with format 'nemotron-nas', the one that pads", self.format)
            )
        if not is_int(self.max_shard_size) or self.max_shard_size < 1:
            raise InvalidInputError(
                must_be("max_shard_size", "a positive whole number of bytes (5 * 2**30 for 5 GiB)", self.max_shard_size)
            )
        for name in ("keep_adapter", "pad", "overwrite"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInputError(must_be(name, "True or False", getattr(self, name)))


@dataclass(frozen=True)
class Extraction:
    """One output to write (what ``ExportFormat.write`` takes): the plan of each layer, the opened base and adapter,
    how to write it, the record for ``nsc_prune_extract.json``, the channel orders (None: the first ones) and the
    refit blocks of ``nsc_prune.hf.cut.reconstruct`` by (base layer, module) (None: the plain cut)."""

    plans: list[LayerPlan]
    base: BaseModel
    out: Path
    adapter: LoraAdapter | None = None
    options: ExtractOptions = field(default_factory=ExtractOptions)
    record: Mapping[str, Any] | None = None
    orders: list[LayerOrder] | None = None
    reconstructed: Mapping[tuple[int, str], Any] | None = None

    @property
    def name(self) -> str:
        """The plan's name for a file (``plan_name``): ``record_name`` of the base folder and the record."""
        return record_name(self.base.folder, self.record)


def record_name(base_folder: str | Path, record: Mapping[str, Any] | None) -> str:
    """``plan_name`` of an extraction: the model's own name (``folder_model_name`` of the base, else the pareto
    document's model name from ``record``, else the base folder's name), the point's params and index."""
    record = record or {}
    model = folder_model_name(base_folder) or record.get("model_name") or Path(base_folder).resolve().name
    return plan_name(model, (record.get("point") or {}).get("params"), record.get("point_index"))
