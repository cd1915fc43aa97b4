"""Subnet extraction, the top of the weights flow: a Pareto point + base weights (+ LoRA super-adapter) -> a
runnable checkpoint in one of the formats of ``nsc_prune.hf.export``.

``extract_subnet`` reads the plan document and picks the point (``nsc_prune.plan``), opens the base
(``nsc_prune.hf.weights.base``) and adapter, checks that the plan fits, ranks the channels (``nsc_prune.hf.cut.selection``:
``first`` = LoNAS supernet order, ``magnitude``, ``activation``, or the order a ``train-supernet`` adapter
carries), and hands the plan to the format's writer. What a layer keeps is decided in ``nsc_prune.hf.cut.keep``;
the output tensors stream as jobs of ``nsc_prune.hf.cut.jobs`` (peak memory: a few tensors).

Model types: those of ``nsc_prune.hf.modeling.ARCHITECTURES`` (gemma2, gemma3_text, granite, llama, mistral, olmo2,
phi3, qwen2, qwen3, smollm3).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nsc_prune._files import RECORD_NAME
from nsc_prune._io import check_outside, sha256_file
from nsc_prune._validation import check_settings
from nsc_prune._warn import warn
from nsc_prune.core.spec import refuse_kv_cuts
from nsc_prune.errors import ConfigError
from nsc_prune.hf.cut.keep import LayerOrder
from nsc_prune.hf.cut.reconstruct import ReconstructConfig, check_reconstruct
from nsc_prune.hf.cut.request import Extraction, ExtractOptions, record_name
from nsc_prune.hf.cut.selection import SelectionConfig, adapter_channel_orders, channel_orders
from nsc_prune.hf.export import export_format
from nsc_prune.hf.export.checkpoint import check_extraction_inputs
from nsc_prune.hf.weights.adapter import LoraAdapter, open_adapter
from nsc_prune.hf.weights.base import BaseModel, open_base
from nsc_prune.plan import LayerPlan, ParetoDocument, as_document, check_same_model, pareto_path
from nsc_prune.spaces.lonas import fixed_rank_modules

__all__ = ["ExtractOptions", "ReconstructConfig", "extract_plan", "extract_subnet"]


def extract_plan(
    plans: list[LayerPlan],
    base: BaseModel,
    out: str | os.PathLike,
    adapter: LoraAdapter | None = None,
    options: ExtractOptions | None = None,
    record: Mapping[str, Any] | None = None,
    orders: list[LayerOrder] | None = None,
) -> Path:
    """Write ``plans`` of ``base`` in ``options.format`` into ``out`` atomically: every check first, then one
    streaming pass (``ExportFormat.write`` of an ``Extraction``). ``orders`` (``nsc_prune.hf.cut.selection``) rank
    each layer's FFN channels and KV groups; None keeps the first ones (LoNAS). ``record`` (point, pareto source,
    selection, ...) goes into the model card and ``nsc_prune_extract.json``. ``adapter.fixed_ranks`` holds the
    projections a lonas front keeps at its rank (``extract_subnet`` sets them from the front's space). Returns what
    was written (a folder, or the GGUF file)."""
    options = options or ExtractOptions()
    export = export_format(options.format)
    out = export.output_file(out, record_name(base.folder, record), options.outtype)
    return export.write(Extraction(plans, base, out, adapter, options, record, orders))


def _check_base_of_plan(model_config: dict[str, Any], base: BaseModel) -> None:
    """``check_same_model``, whose refusal of a base that nsc-prune wrote (a pruned or healed checkpoint, whose
    widths are not its base's) says how to export such a checkpoint as it is."""
    try:
        check_same_model(model_config, base.config)
    except ConfigError as err:
        if not (base.folder / RECORD_NAME).is_file():
            raise
        raise ConfigError(
            f"{err}. {base.folder} is nsc-prune's output (pruned or healed): to export it as it is (as GGUF, say), "
            f"search it at 100 % (nsc-prune --model {base.folder} --space ffn-grid --budget 100% --out FRONT) and "
            "extract that point from it (docs/extract.md, 'A pruned or healed checkpoint as GGUF')"
        ) from None


def extract_subnet(
    pareto: str | os.PathLike | ParetoDocument | Mapping[str, Any],
    base: str | os.PathLike,
    out: str | os.PathLike,
    *,
    point: int | None = None,
    budget: str | int | None = None,
    adapter: str | os.PathLike | None = None,
    options: ExtractOptions | None = None,
    selection: SelectionConfig | None = None,
    reconstruct: ReconstructConfig | None = None,
    allow_above_full: bool = False,
) -> Path:
    """Extract one Pareto point (``point`` index, or the largest under ``budget``) into ``out``.

    ``budget`` is read as the search reads it (``nsc_prune.core.budget.select``): above the front's largest
    point (the full model, or the space's widest plan: pareto.json's ``cost.full_is_model``) it raises unless
    ``allow_above_full``.

    ``pareto`` is a pareto.json path (or its loaded dict, or a ``ParetoDocument``); ``base`` a safetensors
    folder of a model type in ``nsc_prune.hf.modeling.ARCHITECTURES`` (the module docstring lists
    them); ``adapter`` an optional PEFT LoRA super-adapter folder; ``selection`` which channels to keep (default ``first``,
    the supernet order: an adapter written by ``nsc-prune train-supernet`` carries its channel order,
    ``CHANNEL_ORDER_NAME``, which is then applied to base and LoRA alike); ``reconstruct`` refits the matrices whose
    input channels are cut on ``selection``'s calibration text (``nsc_prune.hf.cut.reconstruct``; needs the
    ``activation`` selection and no adapter). Returns what it wrote: ``out``, or the file a one-file format (GGUF)
    names in the folder ``out``. See ``ExtractOptions`` for the rest.
    """
    selection, options = _settings(selection, options, reconstruct, adapter)
    target, out = out, Path(out)  # Path drops a trailing '/', which a file format reads as "a folder"
    source = None if isinstance(pareto, (Mapping, ParetoDocument)) else pareto_path(pareto)
    inputs = (base, adapter, source, selection.calib, selection.tokenizer)
    export = export_format(options.format)
    document = _decoder_front(as_document(source if source is not None else pareto))
    index = document.select(point=point, budget=budget, allow_above_full=allow_above_full)
    chosen = document.points[index]
    record = {
        "point_index": index,
        "point_count": len(document.points),
        "point": {k: v for k, v in chosen.to_dict().items() if k != "layers"},
        "model_name": document.model_name,
        "model_config": document.model_config,
        "space": dict(document.space) or None,
        "cost": dict(document.cost) or None,
        "score": (document.score or {}).get("backend", "psi_mp"),  # what the point's 'nsc' value is (model card)
        "pareto": {"path": str(source.resolve()), "sha256": sha256_file(source)} if source else None,
    }
    named = export.output_file(target, record_name(base, record), options.outtype)
    export.check_out(named, inputs, options.overwrite, chosen=named != out)  # before any slow step
    check_outside(named, (base, adapter))  # written beside a model, never into it (docs/outputs.md)
    out = named
    base_model = open_base(base, adapter=adapter)
    _check_base_of_plan(record["model_config"], base_model)
    lora = open_adapter(adapter) if adapter is not None else None
    if lora is not None:  # a lonas front scored these projections at its lora_rank, whatever the plan's
        fixed = fixed_rank_modules(document.space, base_model.config.get("model_type"))
        lora = dataclasses.replace(lora, fixed_ranks=fixed)
    plans = chosen.layer_plans()
    check_extraction_inputs(plans, base_model, lora, options)  # the plan and the adapter: before a slow calibration
    refuse_kv_cuts(base_model.config.get("model_type"), [[p] for p in plans], base_model.kv_heads, "extraction")
    export.check(plans, base_model, options)  # what the format can express: before a slow calibration
    _warn_other_weights(document, base_model)
    stored = adapter_channel_orders(lora.folder, base_model) if lora is not None else None
    if stored is not None:  # a super-adapter trained by train-supernet: its channel order, always
        if selection.method != "first":
            raise ConfigError(
                f"adapter {lora.folder} was trained with its own channel order (nsc-prune train-supernet), which "
                f"extraction applies; --selection {selection.method} would cut other channels. Drop --selection"
            )
        orders, record["selection"] = stored
    else:
        _warn_other_channels(document, selection)
        orders, record["selection"] = channel_orders(base_model, selection)
    reconstructed = None
    if reconstruct is not None:
        reconstructed, record["reconstruction"] = _reconstruct(plans, base_model, orders, selection, reconstruct)
    return export.write(Extraction(plans, base_model, out, lora, options, record, orders, reconstructed))


def _settings(
    selection: SelectionConfig | None,
    options: ExtractOptions | None,
    reconstruct: ReconstructConfig | None,
    adapter: Any,
) -> tuple[SelectionConfig, ExtractOptions]:
    """The selection and options with their defaults, after checking every setting's type and that a refit can run
    (a dict or a string failed deep inside, after a calibration)."""
    check_settings(
        options=(options, ExtractOptions),
        selection=(selection, SelectionConfig),
        reconstruct=(reconstruct, ReconstructConfig),
    )
    selection = selection or SelectionConfig()
    unused = [name for name in ("calib", "tokenizer") if getattr(selection, name) is not None]
    if unused and selection.method != "activation":  # as the CLI: a text given and silently not read
        raise ConfigError(
            f"SelectionConfig {' and '.join(unused)} would be ignored: only method 'activation' reads a "
            f"calibration text, and this one is {selection.method!r}; drop {' and '.join(unused)} or use 'activation'"
        )
    check_reconstruct(reconstruct, selection.method, adapter)
    return selection, options or ExtractOptions()


def _decoder_front(document: ParetoDocument) -> ParetoDocument:
    """``document``, unless it is a NAS space's front: its layers are no decoder's plans ("ffn=None" said nothing
    of why)."""
    if document.model is None:
        raise ConfigError(
            f"the front of space {document.space.get('name')!r} defines its own network (no --model); extract cuts "
            "a plan of a Hugging Face decoder: search one with --model M and an elastic or lonas space"
        )
    return document


def _warn_other_channels(document: ParetoDocument, selection: SelectionConfig) -> None:
    """A measured front rated each cut on the channels its ``--selection`` keeps: another selection deploys other
    channels than the plan was chosen for (docs/sensitivity.md: "use the same for extract")."""
    score = document.score or {}
    scored = score.get("selection")
    if score.get("backend") == "measured" and scored and scored != selection.method:
        warn(
            f"the front's damage was measured on the channels --selection {scored} keeps; extraction keeps the "
            f"{selection.method} ones, so the plan was chosen for other channels: pass --selection {scored}",
            UserWarning,
        )


def _warn_other_weights(document: ParetoDocument, base: BaseModel) -> None:
    """A front scored from weights (``measured``, ``psi_w``) rated the cuts of those weights: a base of the same
    shapes with other weights (the unhealed sibling of a healed checkpoint, say) deploys a plan chosen for others."""
    from nsc_prune.hf.weights.fingerprint import weights_fingerprint

    scored = (document.score or {}).get("weights_fingerprint")
    if scored is not None and scored != weights_fingerprint(base.folder, base.tensors):
        warn(
            f"the front was scored on the weights of {document.score.get('weights')}, and {base.folder} holds other "
            "weights of the same shapes (or stores them in another dtype or shard layout): the plan was chosen for "
            f"those; search again with --weights {base.folder}",
            UserWarning,
        )


def _reconstruct(
    plans: list[LayerPlan],
    base: BaseModel,
    orders: list[LayerOrder],
    selection: SelectionConfig,
    reconstruct: ReconstructConfig,
) -> tuple[dict[tuple[int, str], Any], dict[str, Any]]:
    """The refit blocks of ``plans`` on the calibration text of ``selection``, and their record."""
    from nsc_prune.hf.cut.jobs import layer_indexes
    from nsc_prune.hf.cut.reconstruct import reconstructed_blocks
    from nsc_prune.hf.cut.selection import calibration_seq_len, calibration_tokens

    ids, _ = calibration_tokens(base, selection)
    seq_len = calibration_seq_len(base, selection.seq_len)
    indexes = layer_indexes(plans, base, orders)
    blocks = reconstructed_blocks(indexes, base, ids, seq_len, reconstruct, selection.compute)
    record = {"ridge": reconstruct.ridge, "calib_tokens": len(ids), "matrices": [f"{i}.{m}" for i, m in sorted(blocks)]}
    return blocks, record
