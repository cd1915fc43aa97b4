"""The writer of every checkpoint format (``pruned``, ``padded``, ``nemotron-nas``): a Hugging Face folder with
safetensors shards, config.json, shipped files, tokenizer, ``nsc_prune_extract.json`` and a model card.

A format module supplies ``prepare(extraction, indexes) -> Export`` (``indexes``: each layer's kept index sets),
defines ``write = writer(prepare)`` and takes ``output_file`` and ``check_out`` from here
(``nsc_prune.hf.export.ExportFormat``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from nsc_prune._files import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_DIR,
    ADAPTER_WEIGHTS_NAME,
    CONFIG_NAME,
    RECORD_NAME,
    has_tokenizer,
)
from nsc_prune._io import WRITTEN_FILES_KEY, atomic_dir, atomic_write_text, check_out_dir, to_json, written_files
from nsc_prune._warn import warn
from nsc_prune.choices import OWN_FORMATS
from nsc_prune.errors import ConfigError
from nsc_prune.hf.cut.jobs import adapter_jobs, extract_record, kept_ranks, layer_indexes, run_jobs
from nsc_prune.hf.cut.keep import LayerIndex, check_plan_fits
from nsc_prune.hf.cut.request import Extraction, ExtractOptions
from nsc_prune.hf.export import Export
from nsc_prune.hf.model_card import base_license, base_model_id, copy_side_files, model_card
from nsc_prune.hf.weights.adapter import LoraAdapter, check_adapter_fits, sub_adapter_config
from nsc_prune.hf.weights.base import BaseModel
from nsc_prune.hf.weights.loading import check_loadable, meta_model
from nsc_prune.hf.weights.safetensors_io import TensorReader, write_safetensors, write_sharded
from nsc_prune.plan import LayerPlan

Prepare = Callable[[Extraction, list[LayerIndex | None]], Export]  # a checkpoint format's prepare


def check_out(out: Path, inputs: Iterable[str | os.PathLike | None], overwrite: bool, chosen: bool = False) -> None:
    """``ExportFormat.check_out`` of every checkpoint format: ``check_out_dir`` (the folder is the one --out names)."""
    check_out_dir(out, inputs, overwrite)


def output_file(out: str | os.PathLike, name: str, outtype: str | None) -> Path:
    """A checkpoint format writes the folder ``--out`` names (``ExportFormat.output_file``)."""
    return Path(out)


def check_extraction_inputs(
    plans: list[LayerPlan], base: BaseModel, adapter: LoraAdapter | None, options: ExtractOptions
) -> None:
    """ConfigError unless ``plans`` fit ``base`` and ``adapter`` and the adapter options can be honoured (extraction
    runs it before its slow calibration, the writer again)."""
    if options.keep_adapter and adapter is None:
        raise ConfigError("--keep-adapter needs an adapter (--adapter DIR)")
    if options.keep_adapter and options.format not in OWN_FORMATS:
        raise ConfigError(
            f"--keep-adapter writes nsc-prune's own format, not --format {options.format}; drop --keep-adapter "
            "(the LoRA is merged)"
        )
    if adapter is not None:
        check_adapter_fits(adapter, base.shapes(), base.num_layers)
    check_plan_fits(plans, base.widths, base.kv_heads, adapter)
    if options.keep_adapter and not all(plan.keep for plan in plans):
        raise ConfigError("--keep-adapter cannot renumber the adapter of a plan that drops layers; merge it instead")


def write_checkpoint(prepare: Prepare, extraction: Extraction) -> Path:
    """Write the checkpoint ``prepare`` decides for ``extraction`` into its folder atomically: every check first,
    then one streaming pass. The record goes into the model card and ``nsc_prune_extract.json``."""
    plans, base, out, adapter, options = (
        extraction.plans,
        extraction.base,
        Path(extraction.out),
        extraction.adapter,
        extraction.options,
    )
    check_out_dir(out, (base.folder, adapter.folder if adapter else None), options.overwrite)
    check_extraction_inputs(plans, base, adapter, options)
    if adapter is None and any(plan.lora_rank for plan in plans):
        warn(
            "the plan keeps LoRA ranks but no adapter was given: extracting the base weights only",
        )
    if not has_tokenizer(base.folder):
        warn(f"base {base.folder} has no tokenizer files; add them to {out} to use it")
    indexes = layer_indexes(plans, base, extraction.orders)
    written = prepare(extraction, indexes)
    config, jobs = written.config, written.jobs
    try:
        check_loadable(config, [job.spec for job in jobs])
    except ConfigError:
        meta_model(base.config, True, f"base {base.folder}")  # a fault of the base's own config.json, named so
        raise
    ranks = kept_ranks(plans, adapter) if options.keep_adapter else {}
    extra = adapter_jobs(adapter, ranks, options, indexes) if ranks else []
    reader = TensorReader()
    try:
        with atomic_dir(out, options.overwrite, replaceable=lambda found: check_out_dir(found, (), True)) as tmp:
            index = write_sharded(tmp, [job.spec for job in jobs], run_jobs(jobs, reader), options.max_shard_size)
            if extra:
                (tmp / ADAPTER_DIR).mkdir()
                write_safetensors(
                    tmp / ADAPTER_DIR / ADAPTER_WEIGHTS_NAME, [j.spec for j in extra], run_jobs(extra, reader)
                )
                atomic_write_text(tmp / ADAPTER_DIR / ADAPTER_CONFIG_NAME, to_json(sub_adapter_config(adapter, ranks)))
            atomic_write_text(tmp / CONFIG_NAME, to_json(config))
            for file in written.files:
                shutil.copyfile(file, tmp / file.name)
            copy_side_files(base.folder, tmp, config)
            summary = extract_record(plans, base, adapter, options, extraction.record, jobs, extra)
            summary.update(model_type=config["model_type"], total_size=index["metadata"]["total_size"])
            if written.report:
                summary["export"] = written.report
            if licence := base_license(base.folder):  # the card's header states it: a derivative of the base
                summary["license"] = licence
            if base_model := base_model_id(base.folder):
                summary["base_model"] = base_model
            atomic_write_text(tmp / "README.md", model_card(summary, out.name))
            # last, with what the folder holds: --overwrite replaces it only while it holds nothing else
            atomic_write_text(
                tmp / RECORD_NAME, to_json({**summary, WRITTEN_FILES_KEY: written_files(tmp, RECORD_NAME)})
            )
    finally:
        reader.close()
    return out


def writer(prepare: Prepare) -> Callable[[Extraction], Path]:
    """``ExportFormat.write`` of the checkpoint format whose tensors and config ``prepare`` decides."""

    def write(extraction: Extraction) -> Path:
        return write_checkpoint(prepare, extraction)

    write.__doc__ = f"Write an extraction as the checkpoint {prepare.__module__}.prepare decides."
    return write
