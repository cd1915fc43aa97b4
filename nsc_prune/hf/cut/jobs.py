"""The tensor engine every export format writes from: the output tensors as streaming jobs, and the record.

A plan says how many FFN channels and KV groups each layer keeps (or that it is dropped); a channel order
(``nsc_prune.hf.cut.selection``) says which. Every output weight is then a block ``W[R, C]`` of the base weight
(``R``/``C`` the kept row/column index sets of ``nsc_prune.hf.cut.keep``, prefixes under ``first``), and a LoRA rank
``r`` keeps the first ``r`` ranks with scaling ``s = alpha / r_max``, so merging gives
``W[R, C] + s * B[R, :r] @ A[:r, C]``:

- gate/up: rows = kept channels; down: columns = kept channels;
- q: rows of the kept query heads; k/v: rows of the kept KV groups; o: columns of the kept query heads;
- Phi-3's fused qkv_proj / gate_up_proj: each part's kept rows, offset by the parts before it (``keep.fused_rows``).

One ``Job`` per output tensor says which block of which base tensor (with which LoRA pair) it is; ``run_jobs``
computes them one at a time (peak memory: a few tensors). ``extract_record`` is ``nsc_prune_extract.json``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nsc_prune._files import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, CONFIG_NAME
from nsc_prune._io import checkpoint_record, provenance, sha256_file
from nsc_prune._validation import is_int
from nsc_prune.core.spec import FUSED
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.cut.keep import (
    Index,
    LayerIndex,
    LayerOrder,
    fused_rows,
    identity_orders,
    kept_block,
    layer_index,
    plan_rank,
)
from nsc_prune.hf.cut.request import ExtractOptions
from nsc_prune.hf.progress import progress
from nsc_prune.hf.weights.adapter import LoraAdapter, LoraModule
from nsc_prune.hf.weights.base import BaseModel, stores_own_head
from nsc_prune.hf.weights.fingerprint import weights_fingerprint
from nsc_prune.hf.weights.safetensors_io import (
    DTYPE_NAMES,
    DTYPES,
    TensorInfo,
    TensorReader,
    TensorSpec,
    with_stored_dtype,
)
from nsc_prune.hf.weights.values import all_finite
from nsc_prune.plan import LayerPlan
from nsc_prune.presets import folder_model_name

torch = require("torch", "hf")
LAYER_TENSOR = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


@dataclass(frozen=True)
class Job:
    """One output tensor: the ``rows`` x ``cols`` block of ``source`` (``nsc_prune.hf.cut.keep.Index`` sets), with an
    optional LoRA pair merged in, cast to ``spec.dtype`` and zero-padded to ``spec.shape``: along each axis of
    ``at`` that is not None, the block's rows (columns) go to those positions, else to the leading ones."""

    spec: TensorSpec
    source: TensorInfo
    rows: Index
    cols: Index
    lora: tuple[LoraModule, int] | None = None  # (module, kept rank)
    at: tuple[tuple[int, ...] | None, ...] = ()
    block: Any = None  # the block itself, computed before writing (``reconstruct``): written instead of reading it


def _out_dtype(source_dtype: str, options: ExtractOptions) -> str:
    if options.dtype is None or not DTYPES[source_dtype].is_floating_point:
        return source_dtype
    return DTYPE_NAMES[getattr(torch, options.dtype)]


def _count(index: Index, full: int) -> int:
    return full if index is None else index if isinstance(index, int) else len(index)


def make_job(
    name: str,
    source: TensorInfo,
    rows: Index,
    cols: Index,
    options: ExtractOptions,
    full: tuple[int, ...] | None = None,
    lora: tuple[LoraModule, int] | None = None,
) -> Job:
    """The job writing ``name``: the ``rows`` x ``cols`` block of ``source`` (with ``lora``'s kept rank merged in),
    in the output dtype, shaped as the format keeps it (the block's own size, or ``full`` when padded)."""
    shape = full or source.shape  # the padded format keeps this shape
    if options.format == "pruned":
        shape = (_count(rows, shape[0]), *((_count(cols, shape[1]), *shape[2:]) if len(shape) > 1 else ()))
    return Job(TensorSpec(name, _out_dtype(source.dtype, options), shape), source, rows, cols, lora)


def kept_ranks(plans: list[LayerPlan], adapter: LoraAdapter | None) -> dict[tuple[int, str], int]:
    """The LoRA rank kept for each (layer, module) of the adapter; modules cut to rank 0 are left out."""
    ranks = {}
    for (layer, module), lora in adapter.modules.items() if adapter else ():
        if not plans[layer].keep:
            continue
        rank = plan_rank(plans[layer], lora.rank, module, adapter.fixed_ranks)
        if rank > 0:
            ranks[(layer, module)] = rank
    return ranks


def layer_indexes(plans: list[LayerPlan], base: BaseModel, orders: list[LayerOrder] | None) -> list[LayerIndex | None]:
    """Per layer the kept index sets (None for a dropped layer); ``orders`` None is the identity (LoNAS)."""
    orders = orders or identity_orders(base.widths, base.kv_heads)
    if len(orders) != len(plans):
        raise ConfigError(f"the channel selection has {len(orders)} layers but the plan has {len(plans)}")
    return [
        layer_index(plan, order, base.group_size, base.head_dim) if plan.keep else None
        for plan, order in zip(plans, orders, strict=True)
    ]


def renumber(plans: list[LayerPlan], options: ExtractOptions) -> dict[int, int]:
    """Base layer index -> output index (the padded format keeps every layer, zeroed when dropped)."""
    kept = [i for i, plan in enumerate(plans) if plan.keep or options.format == "padded"]
    return {old: new for new, old in enumerate(kept)}


def model_jobs(
    plans: list[LayerPlan],
    base: BaseModel,
    adapter: LoraAdapter | None,
    options: ExtractOptions,
    indexes: list[LayerIndex | None] | None = None,
    reconstructed: Mapping[tuple[int, str], Any] | None = None,
) -> list[Job]:
    """Every output tensor of the model, in the base's file order (sequential reads). ``reconstructed``: refit
    blocks by (base layer, module) (``nsc_prune.hf.cut.reconstruct``), written instead of the plain cut's."""
    indexes = indexes if indexes is not None else layer_indexes(plans, base, None)
    ranks = {} if options.keep_adapter else kept_ranks(plans, adapter)
    number = renumber(plans, options)
    jobs = []
    for info in sorted(base.tensors.values(), key=lambda t: (str(t.file), t.start)):
        if not base.is_model_tensor(info.name):
            continue
        name, rows, cols, lora, at, block = info.name, None, None, None, (), None
        if match := LAYER_TENSOR.match(info.name):
            layer, module, kind = int(match[1]), match[2], match[3]
            if layer not in number:
                continue  # a dropped layer
            name = f"model.layers.{number[layer]}.{module}.{kind}"
            if indexes[layer] is None:  # padded format: a zeroed layer is the identity (residual only)
                rows = 0 if module.endswith("_proj") else None
            else:
                rows, cols = kept_block(module, indexes[layer])
                if module in FUSED and options.format == "padded":  # each part's rows in its own block
                    at = (fused_rows(module, indexes[layer])[1],)
            cols = None if kind == "bias" else cols
            if kind == "weight" and (layer, module) in ranks:
                lora = (adapter.modules[(layer, module)], ranks[(layer, module)])
            if kind == "weight" and reconstructed and (layer, module) in reconstructed:
                block = reconstructed[(layer, module)]
        jobs.append(dataclasses.replace(make_job(name, info, rows, cols, options, lora=lora), at=at, block=block))
    return jobs


def adapter_jobs(
    adapter: LoraAdapter,
    ranks: dict[tuple[int, str], int],
    options: ExtractOptions,
    indexes: list[LayerIndex | None],
) -> list[Job]:
    """The sliced adapter's tensors: A[:r, C] and B[R, :r] for a weight that keeps W[R, C]."""
    jobs = []
    for key, rank in sorted(ranks.items()):
        lora = adapter.modules[key]
        rows, cols = kept_block(lora.module, indexes[lora.layer])
        prefix = f"base_model.model.{lora.path}"
        # Ranks are cut in both formats; only the FFN axis is zero-padded back in the padded one.
        jobs.append(make_job(f"{prefix}.lora_A.weight", lora.a, rank, cols, options, full=(rank, lora.a.shape[1])))
        b = make_job(f"{prefix}.lora_B.weight", lora.b, rows, rank, options, full=(lora.b.shape[0], rank))
        if lora.module in FUSED and options.format == "padded":  # each part's rows in its own block, as the base's
            b = dataclasses.replace(b, at=(fused_rows(lora.module, indexes[lora.layer])[1],))
        jobs.append(b)
    return jobs


def _block(reader: TensorReader, info: TensorInfo, rows: Index, cols: Index) -> torch.Tensor:
    # A prefix of rows is read alone; an index set reads the whole tensor once and gathers.
    tensor = reader.read(info, rows=rows if isinstance(rows, int) else None)
    if isinstance(rows, tuple):
        tensor = tensor[list(rows)]
    if isinstance(cols, int):
        return tensor[:, :cols]
    return tensor[:, list(cols)] if cols is not None else tensor


def _pad(tensor: torch.Tensor, shape: tuple[int, ...], at: tuple[tuple[int, ...] | None, ...] = ()) -> torch.Tensor:
    for axis, positions in enumerate(at):
        if positions is not None:
            placed = tensor.new_zeros((*tensor.shape[:axis], shape[axis], *tensor.shape[axis + 1 :]))
            tensor = placed.index_copy_(axis, torch.tensor(positions, dtype=torch.long), tensor)
    if tuple(tensor.shape) == shape:
        return tensor
    full = torch.zeros(shape, dtype=tensor.dtype)
    full[tuple(slice(0, n) for n in tensor.shape)] = tensor
    return full


def run_jobs(jobs: list[Job], reader: TensorReader) -> Iterator[torch.Tensor]:
    """Compute the output tensors one at a time (LoRA merged in float32: W[:m,:n] + s B[:m,:r] A[:r,:n])."""
    for job in progress(jobs, "extract", "tensor"):
        tensor = job.block if job.block is not None else _block(reader, job.source, job.rows, job.cols)
        if job.lora is not None:
            lora, rank = job.lora
            a = _block(reader, lora.a, rank, job.cols)
            b = _block(reader, lora.b, job.rows, rank)
            tensor = tensor.float().addmm_(b.float(), a.float(), alpha=lora.scaling)
        tensor = tensor.to(DTYPES[job.spec.dtype])
        if not all_finite(tensor):
            raise InvalidInputError(_not_finite(job))
        yield _pad(tensor, job.spec.shape, job.at)


def _not_finite(job: Job) -> str:
    """Why output tensor ``job`` holds NaN or inf: its inputs (a base or adapter tensor, a LoRA pair), or a narrower
    output dtype than they have."""
    inputs = [job.source.name] + ([job.lora[0].a.name, job.lora[0].b.name] if job.lora else [])
    narrower = f", or its values overflow {job.spec.dtype} (--dtype)" if job.spec.dtype != job.source.dtype else ""
    return f"{job.spec.name} would hold NaN or inf: {' or '.join(inputs)} holds one{narrower}; nothing was written"


_ORIGINAL_CONTEXT = "original_max_position_embeddings"


def tie_as_loaded(
    config: Mapping[str, Any], tensors: Mapping[str, Any], copies_embedding: bool | None = None
) -> dict[str, Any]:
    """``{"tie_word_embeddings": False}`` where ``config`` ties the embeddings but ``tensors`` store a head of its
    own, which transformers 5 loads untied and extraction and heal keep (an output that still said tied would be
    served with the embedding as its head by a loader that honours the tie, such as vLLM's); else nothing.
    ``copies_embedding`` as ``stores_own_head``."""
    return {"tie_word_embeddings": False} if stores_own_head(config, tensors, copies_embedding) else {}


def legacy_rope_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level rope keys transformers 4.x reads, from a transformers 5 config's ``rope_parameters``, for the
    keys ``config`` lacks: ``rope_theta``, ``rope_scaling`` (a rope type other than default; LongRoPE as Phi-3 reads
    it), ``partial_rotary_factor``, a LongRoPE's original context and Gemma 3's ``rope_local_base_freq``.
    transformers 4.x ignores ``rope_parameters`` and runs at its default theta (10000) without a word, and vLLM
    before 0.19.1 loads configs with it; transformers 5 rebuilds ``rope_parameters`` from ``rope_scaling`` where
    both are there, so ``rope_scaling`` keeps everything but in Phi-3's three-key form."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        return {}
    nested = isinstance(params.get("full_attention"), dict)  # Gemma 3: one rope per attention type
    full = params["full_attention"] if nested else params
    local = params.get("sliding_attention") if nested and isinstance(params.get("sliding_attention"), dict) else {}
    legacy: dict[str, Any] = {
        "rope_theta": full.get("rope_theta"),
        "rope_local_base_freq": local.get("rope_theta"),
        "partial_rotary_factor": full.get("partial_rotary_factor"),  # 4.x reads it at the top level only
    }
    kind = full.get("rope_type", "default")
    scaling = {k: v for k, v in full.items() if k not in ("rope_theta", "partial_rotary_factor")}
    # transformers 5 rebuilds rope_parameters from rope_scaling when both are there: it must lose nothing ("type" is
    # 4.x's name of rope_type, which transformers 5 keeps beside it when it re-saves a hub config)
    three_keys = {"rope_type", "short_factor", "long_factor", _ORIGINAL_CONTEXT}
    if kind == "longrope" and set(scaling) - {"type"} <= three_keys:  # 4.x's Phi-3 takes exactly these three keys
        legacy["rope_scaling"] = {
            "type": kind,
            "short_factor": full["short_factor"],
            "long_factor": full["long_factor"],
        }
    elif kind != "default":  # (a LongRoPE with attention_factor or factor: 4.x's Phi-3 cannot say it, and refuses)
        legacy["rope_scaling"] = scaling
    if kind == "longrope":  # 4.x reads the original context at the top level only
        legacy[_ORIGINAL_CONTEXT] = full.get(_ORIGINAL_CONTEXT)
    return {k: v for k, v in legacy.items() if v is not None and config.get(k) is None}  # null counts as absent


def carried_config(base: BaseModel, options: ExtractOptions) -> dict[str, Any]:
    """The base's config.json as every output format starts from it: no ``_name_or_path``/``auto_map``, the
    dtype set (``--dtype``, else the base's stored one: its key may be absent or wrong), and the rope keys
    transformers 4.x reads (``legacy_rope_keys``) and the tie as loaded (``tie_as_loaded``)."""
    config = {k: v for k, v in base.config.items() if k not in ("_name_or_path", "auto_map")}
    config.update(legacy_rope_keys(config), **tie_as_loaded(config, base.tensors, base.head_is_embedding))
    if options.dtype:
        config["dtype"] = options.dtype
        config.pop("torch_dtype", None)
        return config
    return with_stored_dtype(config, base.tensors)


def extract_record(
    plans: list[LayerPlan],
    base: BaseModel,
    adapter: LoraAdapter | None,
    options: ExtractOptions,
    record: Mapping[str, Any] | None,
    jobs: list[Job],
    extra: Sequence[Job] = (),
) -> dict[str, Any]:
    """What ``nsc_prune_extract.json`` records (every output format): point, plan, options, params, provenance."""
    base_name = folder_model_name(base.folder)
    base_params = sum(math.prod(t.shape) for t in base.tensors.values() if base.is_model_tensor(t.name))
    return {
        "selection": {"method": "first"},
        "model_type": base.config["model_type"],
        **({"base_name": base_name} if base_name else {}),  # the model's name through pruning again (file names)
        **dict(record or {}),
        "plan": [asdict(plan) for plan in plans],
        "options": asdict(options),
        "params": {
            "base": base_params,
            "model": sum(math.prod(job.spec.shape) for job in jobs),
            "adapter": sum(math.prod(job.spec.shape) for job in extra),
            **original_params(base.folder),
        },
        "provenance": provenance(**_input_hashes(base, adapter)),
    }


def original_params(folder: Path) -> dict[str, int]:
    """``{"original": n}``: the parameters of the model a pruned (or healed) base was first cut from, from its record
    (a share of the base alone hides that it is a cut of a cut); empty for any other base."""
    try:
        params = checkpoint_record(folder).get("params")
    except ConfigError:  # a record that does not read: the base's own count is all there is
        return {}
    if not isinstance(params, dict):
        return {}
    original = params.get("original", params.get("base"))
    return {"original": original} if is_int(original) and original > 0 else {}


def _input_hashes(base: BaseModel, adapter: LoraAdapter | None) -> dict[str, Any]:
    # Shards are identified by name and size (hashing 13 GB would double the run time); small files by sha256.
    small = [base.folder / CONFIG_NAME, *base.folder.glob("*.index.json")]
    hashes = {
        "base": str(base.folder.resolve()),
        "base_sha256": {p.name: sha256_file(p) for p in small},
        "base_shards": {f.name: f.stat().st_size for f in sorted({t.file for t in base.tensors.values()})},
        "base_weights": weights_fingerprint(base.folder, base.tensors),  # sampled bytes: other weights, other value
    }
    if adapter is not None:
        hashes["adapter"] = str(adapter.folder.resolve())
        hashes["adapter_sha256"] = {
            p.name: sha256_file(p)
            for p in (adapter.folder / ADAPTER_CONFIG_NAME, adapter.folder / ADAPTER_WEIGHTS_NAME)
        }
    return hashes
