"""Subnet extraction: a Pareto point + base weights (+ LoRA super-adapter) -> a runnable HF checkpoint.

A plan says how many FFN channels and KV groups each layer keeps (or that it is dropped); a channel
order (``nsc_prune.hf.selection``: ``first`` = LoNAS supernet order, ``magnitude``, ``activation``) says
which. Every weight is then a block ``W[R, C]`` of the base weight (``R``/``C`` the kept row/column index
sets, prefixes under ``first``), and a LoRA rank ``r`` keeps the first ``r`` ranks with scaling
``s = alpha / r_max``, so merging gives ``W[R, C] + s * B[R, :r] @ A[:r, C]``:

- gate/up: rows = kept channels; down: columns = kept channels;
- q: rows of the kept query heads; k/v: rows of the kept KV groups; o: columns of the kept query heads.

Dropped layers are left out and the rest renumbered (see ``hf/modeling/modeling_nsc_llama.py`` for the config);
per-layer config lists (``layer_types``) are sliced and ``max_window_layers`` renumbered to match.
Biases (Qwen2's q/k/v, ``attention_bias``, ``mlp_bias``) follow their weight's kept rows.

Model types: those of ``nsc_prune.hf.modeling.ARCHITECTURES`` (llama, mistral, qwen2, qwen3).

Tensors stream through one at a time (``nsc_prune.hf.safetensors_io``): peak memory is a few tensors.
What a layer keeps is decided in ``nsc_prune.hf.keep`` (``layer_keep``, ``kept_block``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nsc_prune._files import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_DIR,
    ADAPTER_WEIGHTS_NAME,
    CONFIG_NAME,
    RECORD_NAME,
    has_tokenizer,
)
from nsc_prune._io import atomic_dir, atomic_write_text, provenance, sha256_file, to_json
from nsc_prune._validation import must_be
from nsc_prune.core.spec import PER_LAYER_HEADS_KEY
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.adapter import LoraAdapter, LoraModule, check_adapter_fits, open_adapter, sub_adapter_config
from nsc_prune.hf.base import BaseModel, open_base
from nsc_prune.hf.export import EXPORTS, checkpoint_export, file_export
from nsc_prune.hf.keep import (
    Index,
    LayerKeep,
    LayerOrder,
    check_plan_fits,
    identity_orders,
    kept_block,
    layer_keep,
    plan_rank,
)
from nsc_prune.hf.loading import check_loadable
from nsc_prune.hf.model_card import copy_side_files, model_card
from nsc_prune.hf.modeling import ARCHITECTURES, KEPT_LAYERS_KEY, MODELING_FILE, auto_map
from nsc_prune.hf.safetensors_io import (
    DTYPE_NAMES,
    DTYPES,
    TensorInfo,
    TensorReader,
    TensorSpec,
    write_safetensors,
    write_sharded,
)
from nsc_prune.hf.selection import SelectionConfig, adapter_channel_orders, channel_orders
from nsc_prune.plan import LayerPlan, ParetoDocument, as_document, check_same_model, pareto_path

torch = require("torch", "hf")
FORMATS = ("pruned", "padded", *EXPORTS)  # EXPORTS: the formats written by a module of nsc_prune.hf.export
OUT_DTYPES = ("float32", "float16", "bfloat16")
OUT_TYPES = ("f16", "bf16", "f32")  # GGUF tensor types (--outtype)
LAYER_LISTS = ("layer_types", "mlp_layer_types")  # config lists with one entry per layer, sliced with the layers
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


@dataclass(frozen=True)
class ExtractOptions:
    """How to write the checkpoint (defaults are the CLI's defaults)."""

    keep_adapter: bool = False  # write the pruned base plus a sliced PEFT adapter instead of merging
    dtype: str | None = None  # output float dtype; None keeps each tensor's own
    format: str = "pruned"  # "padded": zero-padded full-width weights stock transformers loads (saves nothing);
    # "nemotron-nas": vLLM's DeciLMForCausalLM (nsc_prune.hf.export.nemotron_nas)
    pad: bool = True  # a format that cannot express the plan exactly zero-pads it; False refuses such a plan
    max_shard_size: int = 5 * 2**30  # bytes per output shard
    overwrite: bool = False  # replace an existing output folder
    outtype: str | None = None  # format "gguf": tensor type of the 2-D weights (default "f16"; norms stay f32)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise InvalidInputError(must_be("format", f"one of {FORMATS}", self.format))
        if self.dtype is not None and self.dtype not in OUT_DTYPES:
            raise InvalidInputError(must_be("dtype", f"one of {OUT_DTYPES}", self.dtype))
        if self.outtype is not None and self.outtype not in OUT_TYPES:
            raise InvalidInputError(must_be("outtype", f"one of {OUT_TYPES}", self.outtype))
        if self.outtype is not None and self.format != "gguf":
            raise InvalidInputError(must_be("outtype", "unset unless format is 'gguf'", self.outtype, "Use --dtype"))
        if self.format == "gguf" and (self.dtype is not None or self.keep_adapter):
            given = f"dtype={self.dtype!r}" if self.dtype is not None else "keep_adapter=True"
            raise InvalidInputError(
                must_be("the options of format 'gguf'", "outtype only (LoRA merged)", given, "Use --outtype")
            )
        if self.max_shard_size < 1:
            raise InvalidInputError(must_be("max_shard_size", "a positive number of bytes", self.max_shard_size))


# ---------------------------------------------------------------------------------------------- base


# ---------------------------------------------------------------------------------------------- slicing


@dataclass(frozen=True)
class _Job:
    """One output tensor: the ``rows`` x ``cols`` block of ``source`` (``nsc_prune.hf.keep.Index`` sets), with an
    optional LoRA pair merged in, cast to ``spec.dtype`` and zero-padded to ``spec.shape``: along each axis of
    ``at`` that is not None, the block's rows (columns) go to those positions, else to the leading ones."""

    spec: TensorSpec
    source: TensorInfo
    rows: Index
    cols: Index
    lora: tuple[LoraModule, int] | None = None  # (module, kept rank)
    at: tuple[tuple[int, ...] | None, ...] = ()


def _out_dtype(source_dtype: str, options: ExtractOptions) -> str:
    if options.dtype is None or not DTYPES[source_dtype].is_floating_point:
        return source_dtype
    return DTYPE_NAMES[getattr(torch, options.dtype)]


def _count(index: Index, full: int) -> int:
    return full if index is None else index if isinstance(index, int) else len(index)


def _job(
    name: str,
    source: TensorInfo,
    rows: Index,
    cols: Index,
    options: ExtractOptions,
    full: tuple[int, ...] | None = None,
    lora: tuple[LoraModule, int] | None = None,
) -> _Job:
    shape = full or source.shape  # the padded format keeps this shape
    if options.format == "pruned":
        shape = (_count(rows, shape[0]), *((_count(cols, shape[1]), *shape[2:]) if len(shape) > 1 else ()))
    return _Job(TensorSpec(name, _out_dtype(source.dtype, options), shape), source, rows, cols, lora)


def kept_ranks(plans: list[LayerPlan], adapter: LoraAdapter | None) -> dict[tuple[int, str], int]:
    """The LoRA rank kept for each (layer, module) of the adapter; modules cut to rank 0 are left out."""
    ranks = {}
    for (layer, module), lora in adapter.modules.items() if adapter else ():
        if not plans[layer].keep:
            continue
        rank = plan_rank(plans[layer], lora.rank)
        if rank > 0:
            ranks[(layer, module)] = rank
    return ranks


def layer_keeps(plans: list[LayerPlan], base: BaseModel, orders: list[LayerOrder] | None) -> list[LayerKeep | None]:
    """Per layer the kept index sets (None for a dropped layer); ``orders`` None is the identity (LoNAS)."""
    orders = orders or identity_orders(base.widths, base.kv_heads)
    if len(orders) != len(plans):
        raise ConfigError(f"the channel selection has {len(orders)} layers but the plan has {len(plans)}")
    return [
        layer_keep(plan, order, base.group_size, base.head_dim) if plan.keep else None
        for plan, order in zip(plans, orders, strict=True)
    ]


def _renumber(plans: list[LayerPlan], options: ExtractOptions) -> dict[int, int]:
    """Base layer index -> output index (the padded format keeps every layer, zeroed when dropped)."""
    kept = [i for i, plan in enumerate(plans) if plan.keep or options.format == "padded"]
    return {old: new for new, old in enumerate(kept)}


def model_jobs(
    plans: list[LayerPlan],
    base: BaseModel,
    adapter: LoraAdapter | None,
    options: ExtractOptions,
    keeps: list[LayerKeep | None] | None = None,
) -> list[_Job]:
    """Every output tensor of the model, in the base's file order (sequential reads)."""
    keeps = keeps if keeps is not None else layer_keeps(plans, base, None)
    ranks = {} if options.keep_adapter else kept_ranks(plans, adapter)
    number = _renumber(plans, options)
    jobs = []
    for info in sorted(base.tensors.values(), key=lambda t: (str(t.file), t.start)):
        if info.name.endswith("rotary_emb.inv_freq"):
            continue  # a non-persistent buffer some old checkpoints carry; transformers recomputes it
        name, rows, cols, lora = info.name, None, None, None
        if match := _LAYER.match(info.name):
            layer, module, kind = int(match[1]), match[2], match[3]
            if layer not in number:
                continue  # a dropped layer
            name = f"model.layers.{number[layer]}.{module}.{kind}"
            if keeps[layer] is None:  # padded format: a zeroed layer is the identity (residual only)
                rows = 0 if module.endswith("_proj") else None
            else:
                rows, cols = kept_block(module, keeps[layer])
            cols = None if kind == "bias" else cols
            if kind == "weight" and (layer, module) in ranks:
                lora = (adapter.modules[(layer, module)], ranks[(layer, module)])
        jobs.append(_job(name, info, rows, cols, options, lora=lora))
    return jobs


def adapter_jobs(
    plans: list[LayerPlan],
    adapter: LoraAdapter,
    ranks: dict[tuple[int, str], int],
    options: ExtractOptions,
    keeps: list[LayerKeep | None],
) -> list[_Job]:
    """The sliced adapter's tensors: A[:r, C] and B[R, :r] for a weight that keeps W[R, C]."""
    jobs = []
    for key, rank in sorted(ranks.items()):
        lora = adapter.modules[key]
        rows, cols = kept_block(lora.module, keeps[lora.layer])
        prefix = f"base_model.model.{lora.path}"
        # Ranks are cut in both formats; only the FFN axis is zero-padded back in the padded one.
        jobs.append(_job(f"{prefix}.lora_A.weight", lora.a, rank, cols, options, full=(rank, lora.a.shape[1])))
        jobs.append(_job(f"{prefix}.lora_B.weight", lora.b, rows, rank, options, full=(lora.b.shape[0], rank)))
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


def run_jobs(jobs: list[_Job], reader: TensorReader) -> Iterator[torch.Tensor]:
    """Compute the output tensors one at a time (LoRA merged in float32: W[:m,:n] + s B[:m,:r] A[:r,:n])."""
    for job in jobs:
        tensor = _block(reader, job.source, job.rows, job.cols)
        if job.lora is not None:
            lora, rank = job.lora
            a = _block(reader, lora.a, rank, job.cols)
            b = _block(reader, lora.b, job.rows, rank)
            tensor = tensor.float().addmm_(b.float(), a.float(), alpha=lora.scaling)
        yield _pad(tensor.to(DTYPES[job.spec.dtype]), job.spec.shape, job.at)


# ---------------------------------------------------------------------------------------------- writing


def _drop_layers(config: dict[str, Any], kept: list[int], base_layers: int) -> None:
    """Slice the per-layer lists of ``config`` to the ``kept`` base layers and renumber ``max_window_layers``
    (Qwen2/3: layer i slides iff i >= max_window_layers; the kept layers keep their order, so counting the
    kept layers below the old threshold keeps every layer's attention type)."""
    for key in LAYER_LISTS:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or len(value) != base_layers:
            raise ConfigError(
                must_be(
                    f"base config.json field {key!r}",
                    f"a list of one entry per layer ({base_layers})",
                    value,
                    "Fix the base's config.json",
                )
            )
        config[key] = [value[i] for i in kept]
    if isinstance(config.get("max_window_layers"), int):
        config["max_window_layers"] = sum(1 for i in kept if i < config["max_window_layers"])


def carried_config(base: BaseModel, options: ExtractOptions) -> dict[str, Any]:
    """The base's config.json as every output format starts from it: no ``_name_or_path``/``auto_map``, the
    dtype set."""
    config = {k: v for k, v in base.config.items() if k not in ("_name_or_path", "auto_map")}
    if options.dtype:
        config["dtype"] = options.dtype
        config.pop("torch_dtype", None)
    return config


def output_config(plans: list[LayerPlan], base: BaseModel, options: ExtractOptions) -> dict[str, Any]:
    """config.json of the output: per-layer FFN widths in ``per_layer_config``, heads in ``PER_LAYER_HEADS_KEY``,
    per-layer
    lists sliced to the kept layers, and ``auto_map`` to the shipped class of the model type (pruned format)."""
    config = carried_config(base, options)
    if options.format == "padded":
        return config
    kept = [i for i, plan in enumerate(plans) if plan.keep]
    widths = [plans[i].ffn for i in kept]
    # The most common width is global, so a uniform plan needs no override and stock LLaMA loads it.
    common = max(sorted(set(widths), reverse=True), key=widths.count)
    old = {int(k): dict(v) for k, v in (base.config.get("per_layer_config") or {}).items()}
    overrides, heads = {}, {}
    global_kv = int(base.config.get("num_key_value_heads") or base.config["num_attention_heads"])
    for new, i in enumerate(kept):
        layer = {k: v for k, v in old.get(i, {}).items() if k != "intermediate_size"}
        if widths[new] != common:
            layer["intermediate_size"] = widths[new]
        if layer:
            overrides[str(new)] = layer
        kv = base.kv_heads[i] if plans[i].kv_heads is None else plans[i].kv_heads
        if kv != global_kv:
            heads[str(new)] = {"num_attention_heads": kv * base.group_size, "num_key_value_heads": kv}
    config["intermediate_size"] = common
    config["num_hidden_layers"] = len(kept)
    config["head_dim"] = base.head_dim
    for key, value in (("per_layer_config", overrides), (PER_LAYER_HEADS_KEY, heads)):
        config.pop(key, None)
        if value:
            config[key] = value
    _drop_layers(config, kept, len(plans))
    config.pop(KEPT_LAYERS_KEY, None)
    if len(kept) < len(plans) or base.config.get(KEPT_LAYERS_KEY):
        previous = base.config.get(KEPT_LAYERS_KEY) or list(range(len(plans)))
        config[KEPT_LAYERS_KEY] = [previous[i] for i in kept]
    config["architectures"] = [ARCHITECTURES[config["model_type"]]]
    config["auto_map"] = auto_map(config["model_type"])
    return config


def check_not_input(out: Path, inputs: Iterable[str | os.PathLike | None]) -> None:
    """Refuse an ``out`` that is or contains one of ``inputs`` (symlinks resolved): replacing it would delete them."""
    target = out.resolve()
    for given in filter(None, inputs):
        source = Path(given).resolve()
        if source == target or target in source.parents:
            raise InvalidInputError(
                "The output folder must not be or contain an input: "
                f"--out {out} {'is' if source == target else 'contains'} "
                f"{given}, which writing the checkpoint would delete. Choose an --out outside the inputs."
            )


def check_out_dir(out: Path, inputs: Iterable[str | os.PathLike | None], overwrite: bool) -> None:
    """Refuse an output folder whose (atomic) replacement could destroy data.

    ``out`` must not be, nor contain, any of ``inputs`` (symlinks resolved), or the final rename would
    delete them. An existing ``out`` is replaced only with ``overwrite``, and only when it is empty or a
    checkpoint nsc-prune wrote (it holds ``nsc_prune_extract.json``).
    """
    check_not_input(out, inputs)
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise InvalidInputError(f"output directory {out} already exists; pass --overwrite to replace it")
    if not out.is_dir():
        raise InvalidInputError(
            f"--overwrite replaces a checkpoint folder, but {out} is a file; remove it or choose another --out"
        )
    if any(out.iterdir()) and not (out / RECORD_NAME).is_file():
        raise InvalidInputError(
            f"--overwrite replaces only a checkpoint written by nsc-prune extract (one with {RECORD_NAME}); {out} has "
            "other files, which it would delete. Remove the folder yourself or choose another --out."
        )


def extract_plan(
    plans: list[LayerPlan],
    base: BaseModel,
    out: str | os.PathLike,
    adapter: LoraAdapter | None = None,
    options: ExtractOptions | None = None,
    record: Mapping[str, Any] | None = None,
    orders: list[LayerOrder] | None = None,
) -> Path:
    """Write the checkpoint for ``plans`` into ``out`` atomically: every check first, then one streaming pass.

    ``orders`` (``nsc_prune.hf.selection``) rank each layer's FFN channels and KV groups; None keeps the
    first ones (LoNAS). ``record`` (point, pareto source, selection, ...) goes into the model card and
    ``nsc_prune_extract.json``.
    """
    options = options or ExtractOptions()
    if (export := file_export(options.format)) is not None:  # another file layout (GGUF): its own writer
        return export.export(plans, base, out, adapter, options, record, orders)
    out = Path(out)
    check_out_dir(out, (base.folder, adapter.folder if adapter else None), options.overwrite)
    if options.keep_adapter and adapter is None:
        raise ConfigError("--keep-adapter needs an adapter (--adapter DIR)")
    if options.keep_adapter and options.format in EXPORTS:
        raise ConfigError(
            f"--keep-adapter writes nsc-prune's own format, not --format {options.format}; drop --keep-adapter "
            "(the LoRA is merged)"
        )
    if adapter is not None:
        check_adapter_fits(adapter, base.shapes(), base.num_layers)
    check_plan_fits(plans, base.widths, base.kv_heads, adapter)
    if options.keep_adapter and not all(plan.keep for plan in plans):
        raise ConfigError("--keep-adapter cannot renumber the adapter of a plan that drops layers; merge it instead")
    if adapter is None and any(plan.lora_rank for plan in plans):
        warnings.warn(
            "the plan keeps LoRA ranks but no adapter was given: extracting the base weights only", stacklevel=2
        )
    if not has_tokenizer(base.folder):
        warnings.warn(f"base {base.folder} has no tokenizer files; add them to {out} to use it", stacklevel=2)
    keeps = layer_keeps(plans, base, orders)
    export, files = checkpoint_export(options.format), (MODELING_FILE,) if options.format == "pruned" else ()
    if export is not None:
        written = export.prepare(plans, base, adapter, options, keeps)
        config, jobs, files = written.config, written.jobs, written.files
    else:
        config = output_config(plans, base, options)
        jobs = model_jobs(plans, base, adapter, options, keeps)
    check_loadable(config, [job.spec for job in jobs])
    ranks = kept_ranks(plans, adapter) if options.keep_adapter else {}
    extra = adapter_jobs(plans, adapter, ranks, options, keeps) if ranks else []
    reader = TensorReader()
    try:
        with atomic_dir(out, overwrite=options.overwrite) as tmp:
            index = write_sharded(tmp, [job.spec for job in jobs], run_jobs(jobs, reader), options.max_shard_size)
            if extra:
                (tmp / ADAPTER_DIR).mkdir()
                write_safetensors(
                    tmp / ADAPTER_DIR / ADAPTER_WEIGHTS_NAME, [j.spec for j in extra], run_jobs(extra, reader)
                )
                atomic_write_text(tmp / ADAPTER_DIR / ADAPTER_CONFIG_NAME, to_json(sub_adapter_config(adapter, ranks)))
            atomic_write_text(tmp / CONFIG_NAME, to_json(config))
            for file in files:
                shutil.copyfile(file, tmp / file.name)
            copy_side_files(base.folder, tmp, config)
            summary = extract_record(plans, base, adapter, options, record, jobs, extra)
            summary.update(model_type=config["model_type"], total_size=index["metadata"]["total_size"])
            if export is not None:
                summary["export"] = written.report
            atomic_write_text(tmp / RECORD_NAME, to_json(summary))
            atomic_write_text(tmp / "README.md", model_card(summary, out.name))
    finally:
        reader.close()
    return out


def extract_record(
    plans: list[LayerPlan],
    base: BaseModel,
    adapter: LoraAdapter | None,
    options: ExtractOptions,
    record: Mapping[str, Any] | None,
    jobs: list[_Job],
    extra: list[_Job] = (),
) -> dict[str, Any]:
    """What ``nsc_prune_extract.json`` records (every output format): point, plan, options, params, provenance."""
    return {
        "selection": {"method": "first"},
        "model_type": base.config["model_type"],
        **dict(record or {}),
        "plan": [asdict(plan) for plan in plans],
        "options": asdict(options),
        "params": {
            "base": sum(math.prod(t.shape) for t in base.tensors.values()),
            "model": sum(math.prod(job.spec.shape) for job in jobs),
            "adapter": sum(math.prod(job.spec.shape) for job in extra),
        },
        "provenance": provenance(**_input_hashes(base, adapter)),
    }


def _input_hashes(base: BaseModel, adapter: LoraAdapter | None) -> dict[str, Any]:
    # Shards are identified by name and size (hashing 13 GB would double the run time); small files by sha256.
    small = [base.folder / CONFIG_NAME, *base.folder.glob("*.index.json")]
    hashes = {
        "base": str(base.folder.resolve()),
        "base_sha256": {p.name: sha256_file(p) for p in small},
        "base_shards": {f.name: f.stat().st_size for f in sorted({t.file for t in base.tensors.values()})},
    }
    if adapter is not None:
        hashes["adapter"] = str(adapter.folder.resolve())
        hashes["adapter_sha256"] = {
            p.name: sha256_file(p)
            for p in (adapter.folder / ADAPTER_CONFIG_NAME, adapter.folder / ADAPTER_WEIGHTS_NAME)
        }
    return hashes


# ---------------------------------------------------------------------------------------------- entry points


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
    allow_above_full: bool = False,
) -> Path:
    """Extract one Pareto point (``point`` index, or the largest under ``budget``) into ``out``.

    ``budget`` is read as the search reads it (``nsc_prune.core.budget.select``): above the front's largest
    point (the full model) it raises unless ``allow_above_full``.

    ``pareto`` is a pareto.json path (or its loaded dict, or a ``ParetoDocument``); ``base`` a safetensors
    folder of a model type in ``nsc_prune.hf.modeling.ARCHITECTURES`` (llama, mistral, qwen2, qwen3); ``adapter``
    an optional PEFT LoRA super-adapter folder; ``selection`` which channels to keep (default ``first``,
    the supernet order: an adapter written by ``nsc-prune train-supernet`` carries its channel order,
    ``CHANNEL_ORDER_NAME``, which is then applied to base and LoRA alike). Returns ``out``. See ``ExtractOptions``
    for the rest.
    """
    selection = selection or SelectionConfig()
    options = options or ExtractOptions()
    out = Path(out)
    source = None if isinstance(pareto, (Mapping, ParetoDocument)) else pareto_path(pareto)
    inputs = (base, adapter, source, selection.calib, selection.tokenizer)
    export = file_export(options.format)
    if export is not None:
        out = export.output_file(out, base, options.outtype)
        export.check_out(out, inputs, options.overwrite)  # before any slow step
    else:
        check_out_dir(out, inputs, options.overwrite)  # before any slow step
    document = as_document(source if source is not None else pareto)
    index = document.select(point=point, budget=budget, allow_above_full=allow_above_full)
    chosen = document.points[index]
    base_model = open_base(base)
    if export is not None:
        export.check_base(base_model)  # model type, tokenizer: before a slow calibration
    record = {
        "point_index": index,
        "point_count": len(document.points),
        "point": {k: v for k, v in chosen.to_dict().items() if k != "layers"},
        "model_name": document.model_name,
        "model_config": document.model_config,
        "space": dict(document.space) or None,
        "cost": dict(document.cost) or None,
        "pareto": {"path": str(source.resolve()), "sha256": sha256_file(source)} if source else None,
    }
    check_same_model(record["model_config"], base_model.config)
    lora = open_adapter(adapter) if adapter is not None else None
    plans = chosen.layer_plans()
    check_plan_fits(plans, base_model.widths, base_model.kv_heads, lora)  # before a slow calibration
    if (checkpoint_format := checkpoint_export(options.format)) is not None:
        checkpoint_format.check(plans, base_model, options)
    stored = adapter_channel_orders(lora.folder, base_model) if lora is not None else None
    if stored is not None:  # a super-adapter trained by train-supernet: its channel order, always
        if selection.method != "first":
            raise ConfigError(
                f"adapter {lora.folder} was trained with its own channel order (nsc-prune train-supernet), which "
                f"extraction applies; --selection {selection.method} would cut other channels. Drop --selection"
            )
        orders, record["selection"] = stored
    else:
        orders, record["selection"] = channel_orders(base_model, selection)
    return extract_plan(plans, base_model, out, lora, options, record, orders)
