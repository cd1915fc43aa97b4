"""The GGUF file every ``--format gguf`` architecture writes: output naming, stored types, the shared header keys,
and the one write pipeline (checks, tokenizer, extraction record, atomic streaming).

An architecture module (``gguf_deci``, ``gguf_native``) decides only what differs: its checks, its header keys
and its tensors (``Layout``: names, HF extraction jobs, a transform such as llama.cpp's q/k row order). The
weights are the same blocks the HF extraction writes (its plan checks and streaming jobs, LoRA merged in
float32), cast to ``outtype`` (norms stay f32, as in llama.cpp's converter), streamed into a temporary file and
renamed. ``q8_0`` quantises every 2-D weight, ``token_embd`` and ``output`` included, with the ``gguf`` package's
own quantiser (``gguf.quants.quantize``, bit-exact with ggml's reference), as llama.cpp's converter does for
``--outtype q8_0``; a matrix whose rows are not whole 32-value blocks falls back to f16 as there. The extraction
record (plan, options, provenance) is stored as the string key ``nsc_prune.extract``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nsc_prune._io import atomic_file, check_not_input, check_output, sha256_file, to_json
from nsc_prune._validation import is_number, must_be
from nsc_prune._warn import warn
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.cut.jobs import Job, extract_record, run_jobs
from nsc_prune.hf.cut.keep import check_plan_fits
from nsc_prune.hf.cut.request import Extraction, ExtractOptions
from nsc_prune.hf.export.gguf_vocab import add_vocab, tokenizer_vocab
from nsc_prune.hf.model_card import base_license, base_model_id
from nsc_prune.hf.weights.adapter import check_adapter_fits
from nsc_prune.hf.weights.base import BaseModel
from nsc_prune.hf.weights.safetensors_io import TensorReader
from nsc_prune.hf.weights.values import largest_magnitude
from nsc_prune.plan import LayerPlan

gguf = require("gguf", "hf")
torch = require("torch", "hf")

DEFAULT_OUTTYPE = "f16"
RECORD_KEY = "nsc_prune.extract"  # the extraction record, as JSON, inside the GGUF file
SUFFIX = ".gguf"
ALIGNMENT = 32  # llama.cpp's Q8_0 block and the row multiple its fast matmul paths want
OUTTYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}


# ---------------------------------------------------------------------------------------------- output


F16_MAX = 65504.0  # the largest finite float16


def output_file(out: str | os.PathLike, name: str, outtype: str | None) -> Path:
    """The GGUF file ``--out`` names: ``out`` itself (a ``.gguf`` file name), or, for an existing folder,
    ``out/<name>.<outtype>.gguf`` with ``name`` the plan's (``nsc_prune.plan.plan_name``: model, params, point), so
    two budgets of one model get two files. A name ending in '/' is a folder, which must exist."""
    given, out = str(out), Path(out)
    if out.is_dir():
        return out / f"{name}.{outtype or DEFAULT_OUTTYPE}{SUFFIX}"
    if given.endswith(("/", os.sep)):
        fix = f"Create the folder {out} first, or drop the '/' to name the file"
        raise InvalidInputError(must_be("--out with --format gguf", "an existing folder", given, fix))
    if out.name.lower() == SUFFIX:  # ".gguf" alone names no file (Path(".gguf").suffix is "")
        raise InvalidInputError(must_be("--out with --format gguf", f"a file name such as model{SUFFIX}", given))
    if out.suffix.lower() != SUFFIX:
        fix = f"Type --out {shlex.quote(str(out.with_name(out.name + SUFFIX)))}, or create the folder {out} first"
        if out.exists():  # a file already there: creating the folder is no way out
            fix = f"{out} is {'a file' if out.is_file() else 'not a regular file'}; choose another --out"
        raise InvalidInputError(
            must_be("--out with --format gguf", f"a file name ending in {SUFFIX} or an existing folder", str(out), fix)
        )
    return out


def check_out(
    out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None], overwrite: bool, chosen: bool = False
) -> None:
    """Refuse an output file (``output_file``) that is an input, or exists (without ``overwrite``: ``check_output``).
    ``chosen``: the file name is ours (``--out`` a folder), so an existing file is another extraction's result, and
    the error says to choose another --out or name the file, never to pass --overwrite (which would delete it)."""
    out = Path(out)
    if out.is_dir():
        raise InvalidInputError(must_be("--out with --format gguf", "a file, not a folder", str(out)))
    if chosen and not overwrite and (out.exists() or out.is_symlink()):
        check_not_input(out, inputs)
        raise InvalidInputError(
            f"{out} already exists (an earlier extraction of the same plan and outtype); choose another --out "
            f"folder, or name the file: --out {shlex.quote(str(out.parent / ('NAME' + SUFFIX)))}"
        )
    check_output(out, inputs, overwrite, marker=None)


def warn_widths(plans: list[LayerPlan]) -> None:
    """Warn once about FFN widths llama.cpp runs slowly (not multiples of ``ALIGNMENT``); ``write_gguf`` calls it,
    and the formats' ``check`` (which an extraction runs twice: early, then inside ``write``) does not."""
    odd = sorted({plan.ffn for plan in plans if plan.keep and plan.ffn % ALIGNMENT})
    if odd:
        warn(
            f"FFN widths {odd} are not multiples of {ALIGNMENT}: llama.cpp runs them on slower kernels (prefill "
            "0.67-0.81x the dense model for such uniform plans of SmolLM2, docs/speed.md) and q8_0 keeps their "
            f"ffn_down in f16; a width grid whose step is a multiple of {ALIGNMENT} avoids it",
            UserWarning,
        )


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """The extraction record stored in a GGUF file ``write_gguf`` wrote."""
    field = gguf.GGUFReader(path).get_field(RECORD_KEY)
    if field is None:
        raise InvalidInputError(
            must_be(f"{path}", f"a GGUF file written by nsc-prune extract (with {RECORD_KEY})", None)
        )
    return json.loads(field.contents())


# ---------------------------------------------------------------------------------------------- rope


def rope_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """The rope settings of a config: ``rope_parameters`` (transformers 5) or ``rope_scaling``; for a config with
    one entry per attention kind (Gemma 3), the full-attention one."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    return dict(params.get("full_attention") or params)


def rope(config: Mapping[str, Any]) -> tuple[float, str, float | None]:
    """(theta, rope type, linear factor) from ``rope_params``; ConfigError (one line) where the theta, or a linear
    rope's factor, is not a positive number."""
    params = rope_params(config)
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    factor = params.get("factor")
    for name, value in (("rope_theta", theta), ("linear rope factor", factor if kind == "linear" else 1.0)):
        if not (is_number(value) and 0 < value <= sys.float_info.max):  # not isfinite: it overflows on a huge int
            raise ConfigError(must_be(f"the base's {name}", "a positive number for --format gguf", value))
    return float(theta), kind, factor


# ---------------------------------------------------------------------------------------------- tensors


_HALF = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16}
_NUMPY_TYPES = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16}
"""Types ``GGUFWriter`` infers from a numpy dtype; the others (bf16, q8_0) go in as raw bytes with ``raw_dtype``."""


def stored_type(shape: tuple[int, ...], outtype: str) -> Any:
    """The stored type of a tensor of ``shape`` in a file of ``outtype`` (llama.cpp's converter's choice)."""
    if len(shape) <= 1 or outtype == "f32":  # norms stay f32, as in llama.cpp's converter
        return gguf.GGMLQuantizationType.F32
    if outtype != "q8_0":
        return _HALF[outtype]
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
    # Q8_0 quantises each row in blocks of 32 values; a row length that is not a multiple of 32 (a pruned FFN
    # width such as 40 in ffn_down) cannot be, and falls back to f16 as llama.cpp's converter does on QuantError.
    return gguf.GGMLQuantizationType.Q8_0 if shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16


def add_tensor_info(writer: Any, name: str, shape: tuple[int, ...], qtype: Any) -> None:
    """Declare a tensor of ``shape`` stored as ``qtype``: f32/f16 as numpy data, the others (bf16: 2 bytes per
    value; q8_0: 34 per block of 32 values, an f16 scale and 32 int8) as raw bytes along the last axis."""
    if qtype in _NUMPY_TYPES:
        dtype, byte_shape, raw = np.dtype(_NUMPY_TYPES[qtype]), shape, None
    else:
        dtype, byte_shape, raw = np.dtype(np.uint8), gguf.quants.quant_shape_to_byte_shape(shape, qtype), qtype
    writer.add_tensor_info(name, byte_shape, dtype, int(np.prod(byte_shape)) * dtype.itemsize, raw_dtype=raw)


def gguf_array(tensor: torch.Tensor, qtype: Any) -> np.ndarray:
    """``tensor``'s data as stored: ``qtype`` (``stored_type``)."""
    if qtype == gguf.GGMLQuantizationType.F32:
        return tensor.float().contiguous().numpy()
    if qtype == gguf.GGMLQuantizationType.F16:
        return tensor.to(torch.float16).contiguous().numpy()
    if qtype == gguf.GGMLQuantizationType.Q8_0:  # from float32, as llama.cpp's converter quantises
        return gguf.quants.quantize(tensor.float().contiguous().numpy(), qtype)
    # bf16: numpy has no such dtype; torch rounds to nearest even, the bytes go in as raw BF16 data
    return tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint8)


def check_storable(name: str, tensor: torch.Tensor, qtype: Any, outtype: str) -> None:
    """InvalidInputError when ``tensor`` overflows its stored type: f16 holds at most 65504, and q8_0 keeps each
    block's scale (its largest value / 127) in f16; bf16 and f32 hold any finite float32."""
    if qtype == gguf.GGMLQuantizationType.F16:
        largest = F16_MAX
    elif qtype == gguf.GGMLQuantizationType.Q8_0:
        largest = F16_MAX * 127
    else:
        return
    found = largest_magnitude(tensor)
    if found > largest:
        raise InvalidInputError(
            f"{name} holds {found:g}, beyond what --outtype {outtype} can store ({largest:g}); "
            "pass --outtype bf16 or f32; nothing was written"
        )


def permute_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """q/k rows from HF's rope layout (halves of each head) to llama.cpp's (interleaved pairs)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
    )


def unpermute_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``permute_rows`` (GGUF q/k rows back to HF's layout)."""
    return (
        weight.reshape(heads, weight.shape[0] // heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
    )


@dataclass(frozen=True)
class GgufTensor:
    """One GGUF tensor: its name, the HF job computing it, a transform of the job's result (llama.cpp's q/k row
    order, Gemma's 1 + w norms; ``None``: as computed), and the stored type."""

    name: str
    job: Job
    qtype: Any  # gguf.GGMLQuantizationType
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class Layout:
    """What an architecture module decides for one extraction: the architecture name, its header keys
    (``add_hparams(writer)``), tensors computed in float32 and stored as they are (``constants``: name -> value,
    such as ``rope_freqs``), and the extracted tensors."""

    arch: str
    add_hparams: Callable[[Any], None]
    constants: dict[str, torch.Tensor]
    tensors: list[GgufTensor]


def add_model_card_keys(writer: Any, summary: Mapping[str, Any]) -> None:
    """What the Hub and llama.cpp read of a model card: the model's own name (``general.basename``) and the base's
    licence, which its weights carry (``base_license``), and the base's Hub repository where known."""
    basename = summary.get("base_name") or summary.get("model_name")
    if basename:
        writer.add_basename(str(basename))
    for key, value in (summary.get("license") or {}).items():
        getattr(writer, f"add_{key}")(value)  # add_license, add_license_name, add_license_link
    if base_model := summary.get("base_model"):  # the card's base_model, as convert_hf_to_gguf.py writes it
        organization, _, name = str(base_model).rpartition("/")
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, name)
        if organization:
            writer.add_base_model_organization(0, organization)
        writer.add_base_model_repo_url(0, f"https://huggingface.co/{base_model}")


def add_common_hparams(
    writer: Any, config: Mapping[str, Any], sizes: Mapping[str, Any], name: str, outtype: str
) -> None:
    """The keys every architecture reads: ``sizes`` holds ``block_count``, ``feed_forward_length``, ``head_count``,
    ``head_count_kv`` (one number, or one per layer) and ``head_dim``/``rope_dims``. Key and value lengths are
    written explicitly: llama.cpp would otherwise derive them from the hidden size and layer 0's head count."""
    writer.add_name(name)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_block_count(sizes["block_count"])
    writer.add_context_length(int(config.get("max_position_embeddings") or 2048))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(sizes["feed_forward_length"])
    writer.add_head_count(sizes["head_count"])
    writer.add_head_count_kv(sizes["head_count_kv"])
    writer.add_key_length(sizes["head_dim"])
    writer.add_value_length(sizes["head_dim"])
    writer.add_rope_dimension_count(sizes["rope_dims"])
    theta, kind, factor = rope(config)
    writer.add_rope_freq_base(theta)
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(factor))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_file_type(OUTTYPES[outtype])


# ---------------------------------------------------------------------------------------------- writing


def _check_all(extraction: Extraction, out: Path, check: Callable[..., None]) -> None:
    """Every check of ``write_gguf`` before the tokenizer is read: output path, adapter, plan, the format's own."""
    plans, base, adapter, options = extraction.plans, extraction.base, extraction.adapter, extraction.options
    check_out(out, (base.folder, adapter.folder if adapter else None), options.overwrite)
    if adapter is not None:
        check_adapter_fits(adapter, base.shapes(), base.num_layers)
    check_plan_fits(plans, base.widths, base.kv_heads, adapter)
    check(plans, base, options)
    warn_widths(plans)
    if adapter is None and any(plan.lora_rank for plan in plans):
        warn(
            "the plan keeps LoRA ranks but no adapter was given: extracting the base weights only",
        )


LayoutOf = Callable[[Extraction, str], Layout]
"""An architecture module's ``layout(extraction, outtype)``."""


def write_gguf(
    extraction: Extraction, check: Callable[[list[LayerPlan], BaseModel, ExtractOptions], None], layout: LayoutOf
) -> Path:
    """Write ``extraction`` as one GGUF file (``--out`` a ``.gguf`` file name or an existing folder: ``output_file``),
    atomically: every check first (``check``: the architecture's; tokenizer, output path), then the header
    (``layout``), then the tensors streamed one at a time. Returns the file written."""
    base, options = extraction.base, extraction.options
    outtype = options.outtype or DEFAULT_OUTTYPE
    out = output_file(extraction.out, extraction.name, outtype)
    _check_all(extraction, out, check)
    vocab = tokenizer_vocab(base.folder, int(base.config["vocab_size"]))
    plan = layout(extraction, outtype)
    jobs = [t.job for t in plan.tensors]
    summary = extract_record(extraction.plans, base, extraction.adapter, options, extraction.record, jobs)
    summary["options"] = {**summary["options"], "outtype": outtype}  # the default resolved, as format says
    summary["format"] = {"file": "gguf", "architecture": plan.arch, "outtype": outtype}
    licence = base_license(base.folder)
    if licence:
        summary["license"] = licence
    if base_model := base_model_id(base.folder):
        summary["base_model"] = base_model
    summary["format"] |= {"tokenizer": vocab.model, "pre": vocab.pre}
    summary["provenance"]["tokenizer_sha256"] = sha256_file(base.folder / "tokenizer.json")
    reader = TensorReader()
    try:
        with atomic_file(out, overwrite=options.overwrite) as tmp:
            writer = gguf.GGUFWriter(tmp, plan.arch)
            plan.add_hparams(writer)
            add_model_card_keys(writer, summary)
            add_vocab(writer, vocab)
            writer.add_string(RECORD_KEY, to_json(summary))
            for name, value in plan.constants.items():
                writer.add_tensor_info(name, tuple(value.shape), np.dtype(np.float32), value.numel() * 4)
            for tensor in plan.tensors:
                add_tensor_info(writer, tensor.name, tuple(tensor.job.spec.shape), tensor.qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for value in plan.constants.values():
                writer.write_tensor_data(value.float().contiguous().numpy())
            for tensor, data in zip(plan.tensors, run_jobs(jobs, reader), strict=True):
                if tensor.transform is not None:
                    data = tensor.transform(data)
                check_storable(tensor.name, data, tensor.qtype, outtype)
                writer.write_tensor_data(gguf_array(data, tensor.qtype))
            writer.close()
    finally:
        reader.close()
    return out
