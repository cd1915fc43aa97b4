"""``--format gguf``: one llama.cpp GGUF file of architecture ``deci``, tokenizer included.

llama.cpp's ``deci`` architecture (DeciLM / Llama-Nemotron-NAS) is LLaMA with per-layer arrays for
``deci.feed_forward_length``, ``deci.attention.head_count`` and ``deci.attention.head_count_kv``, which is
what a pruned plan needs. A dropped layer keeps its index with all three at 0 and no tensors (llama.cpp
passes the residual stream through: no attention when ``n_head == 0``, no FFN when ``n_ff == 0``), so
``blk.N`` is the base's layer ``N``. Layer 0 cannot be dropped: llama.cpp reads the head size only when
layer 0 has heads. Tensors use the llama names (``token_embd``, ``blk.N.attn_q``, ...);
q/k rows are permuted per layer with that layer's head counts, as llama.cpp's HF converter does for
llama-style rope (pairs ``(i, i + d/2)`` of each head become ``(2i, 2i + 1)``).

The weights are the same blocks the HF extraction writes (its plan checks and streaming jobs, LoRA merged
in float32), cast to ``outtype`` (norms stay f32, as in llama.cpp's converter), streamed into a temporary
file and renamed. ``q8_0`` quantises every 2-D weight, ``token_embd`` and ``output`` included, with the ``gguf``
package's own quantiser (``gguf.quants.quantize``, bit-exact with ggml's reference), as llama.cpp's converter
does for ``--outtype q8_0``; a matrix whose rows are not whole 32-value blocks falls back to f16 as there.
The extraction record (plan, options, provenance) is stored as the string key ``nsc_prune.extract``. Only
``llama`` and ``mistral`` bases without biases and with default, linear or llama3 rope are accepted (llama3 as
the ``rope_freqs`` tensor); the tokenizer comes from the base's ``tokenizer.json`` (byte-level BPE: ``gpt2``,
or SentencePiece-style BPE with byte fallback: ``llama``).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nsc_prune._files import CONFIG_NAME
from nsc_prune._io import atomic_file, check_not_input, check_output, sha256_file, to_json
from nsc_prune._validation import must_be
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError, require
from nsc_prune.hf.cut.jobs import Job, extract_record, layer_indexes, model_jobs, run_jobs
from nsc_prune.hf.cut.keep import LayerOrder, check_plan_fits
from nsc_prune.hf.cut.request import Extraction, ExtractOptions
from nsc_prune.hf.weights.adapter import LoraAdapter, check_adapter_fits
from nsc_prune.hf.weights.base import BaseModel
from nsc_prune.hf.weights.safetensors_io import TensorReader
from nsc_prune.plan import LayerPlan

gguf = require("gguf", "hf")
torch = require("torch", "hf")

__all__ = ["check", "check_out", "output_file", "write"]  # nsc_prune.hf.export.ExportFormat
ARCH = "deci"
MODEL_TYPES = ("llama", "mistral")
_MISSING = {  # what llama.cpp's deci graph (src/models/deci.cpp) lacks; it does read {arch}.attention.scale
    "qwen2": "q/k/v-only biases (qwen2)",
    "qwen3": "q/k norms (qwen3)",
    "granite": "embedding and residual multipliers nor logits_scaling (granite)",
    "smollm3": "layers without rotary embedding: it rotates q/k in every layer (smollm3's no_rope_layers)",
    "olmo2": "norms after attention and the MLP nor q/k norms over the whole projection (olmo2)",
    "gemma2": "norms after attention and the MLP, attention and logit soft-capping nor scaled embeddings (gemma2)",
    "gemma3_text": "norms after attention and the MLP, q/k norms nor scaled embeddings (gemma3_text)",
    "phi3": "partial rotary embedding nor LongRoPE as this writer exports it (phi3: RoPE over the whole head, no rope factor tensors; the fused qkv_proj "
    "and gate_up_proj are not split)",
}
DEFAULT_OUTTYPE = "f16"
RECORD_KEY = "nsc_prune.extract"  # the extraction record, as JSON, inside the GGUF file
SUFFIX = ".gguf"
_OUTTYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
_ROPE_TYPES = ("default", "linear", "llama3")
# Byte-level BPE pre-tokenizers llama.cpp knows, told apart by their structure (llama.cpp itself hashes a
# tokenization of a test text). Anything else gets "default" with a warning.
_LLAMA3_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"


# ---------------------------------------------------------------------------------------------- checks


def output_file(out: str | os.PathLike, name: str, outtype: str | None) -> Path:
    """The GGUF file ``--out`` names: ``out`` itself (a ``.gguf`` file name), or, for an existing folder,
    ``out/<name>.<outtype>.gguf`` with ``name`` the plan's (``nsc_prune.plan.plan_name``: model, params, point), so
    two budgets of one model get two files."""
    out = Path(out)
    if out.is_dir():
        return out / f"{name}.{outtype or DEFAULT_OUTTYPE}{SUFFIX}"
    if out.suffix != SUFFIX:
        raise InvalidInputError(
            must_be(
                "--out with --format gguf",
                f"a file name ending in {SUFFIX} or an existing folder",
                str(out),
                f"Type --out {out.with_name(out.name + SUFFIX)}, or create the folder {out} first",
            )
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
            f"folder, or name the file: --out {out.parent / ('NAME' + SUFFIX)}"
        )
    check_output(out, inputs, overwrite, marker=None)


def check_base(base: BaseModel) -> None:
    """Raise unless the base is something a deci GGUF can hold: llama/mistral, no biases, default or linear
    rope, and a tokenizer llama.cpp can use (``tokenizer.json``)."""
    config = base.config
    where = f"the base's model_type ({base.folder / CONFIG_NAME})"
    if config.get("model_type") not in MODEL_TYPES:
        raise UnsupportedArchitectureError(
            must_be(
                where,
                f"one of {list(MODEL_TYPES)} for --format gguf",
                config.get("model_type"),
                f"llama.cpp's deci graph has no {_MISSING.get(config.get('model_type'), 'layers of this type')}; "
                "write a Hugging Face checkpoint instead (--format pruned)",
            )
        )
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise ConfigError(must_be(f"{key} of {base.folder / CONFIG_NAME} for --format gguf", "false", config[key]))
    rope_type = _rope(config)[1]
    if rope_type not in _ROPE_TYPES:
        raise ConfigError(
            must_be(
                f"the base's rope type ({base.folder / CONFIG_NAME}) for --format gguf",
                f"one of {list(_ROPE_TYPES)}",
                rope_type,
                "Other rope scalings (yarn, dynamic, ...) are not exported yet; use --format pruned",
            )
        )
    tokenizer_vocab(base.folder, int(config["vocab_size"]))


ALIGNMENT = 32  # llama.cpp's Q8_0 block and the row multiple its fast matmul paths want


def warn_widths(plans: list[LayerPlan]) -> None:
    """Warn once about FFN widths llama.cpp runs slowly (not multiples of ``ALIGNMENT``); ``write`` calls it, and
    ``check`` (which an extraction runs twice: early, then inside ``write``) does not."""
    odd = sorted({plan.ffn for plan in plans if plan.keep and plan.ffn % ALIGNMENT})
    if odd:
        warnings.warn(
            f"FFN widths {odd} are not multiples of {ALIGNMENT}: llama.cpp runs them on slower kernels (prefill "
            "0.67-0.81x the dense model for such uniform plans of SmolLM2, docs/speed.md) and q8_0 keeps their "
            f"ffn_down in f16; a width grid whose step is a multiple of {ALIGNMENT} avoids it",
            UserWarning,
            stacklevel=3,
        )


def check(plans: list[LayerPlan], base: BaseModel, options: ExtractOptions) -> None:
    """Raise unless the base (``check_base``) and the plan can be written as a deci GGUF: layer 0 must be kept.
    (``write`` warns about slow FFN widths: ``warn_widths``.)"""
    check_base(base)
    if not plans[0].keep:  # llama.cpp reads key_length/rope dims only when head_count[0] > 0
        raise ConfigError(
            must_be(
                "plan layer 0 for --format gguf",
                "kept (llama.cpp sizes every head by layer 0's)",
                "dropped",
                "Keep layer 0 (the elastic search never drops it) or use --format pruned",
            )
        )


def _rope_params(config: Mapping[str, Any]) -> dict[str, Any]:
    return dict(config.get("rope_parameters") or config.get("rope_scaling") or {})


def _rope(config: Mapping[str, Any]) -> tuple[float, str, float | None]:
    """(theta, rope type, linear factor) from ``rope_parameters`` (transformers 5) or ``rope_scaling``."""
    params = _rope_params(config)
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    return theta, kind, params.get("factor")


def llama3_rope_factors(config: Mapping[str, Any], head_dim: int) -> torch.Tensor:
    """LLaMA-3.1's rope scaling as llama.cpp's ``rope_freqs`` tensor: per frequency, the divisor of its angle
    (1 for short wavelengths, ``factor`` for long ones, interpolated in between)."""
    params = _rope_params(config)
    try:
        factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
        context = float(params["original_max_position_embeddings"])
    except (KeyError, TypeError, ValueError) as err:
        message = must_be("the base's llama3 rope parameters", "numbers", params, f"missing or bad {err}")
        raise ConfigError(message) from err
    theta = _rope(config)[0]
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = ((context / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    factors = 1.0 / ((1 - smooth) / factor + smooth)  # 1 above high_freq_wavelen, factor below low_freq_wavelen
    return factors.float()


# ---------------------------------------------------------------------------------------------- tokenizer


@dataclass
class GgufVocab:
    """A tokenizer as GGUF keys: model (``gpt2`` / ``llama``), pre-tokenizer, tokens, types, scores, specials."""

    model: str
    pre: str | None
    tokens: list[str | bytes]
    types: list[int]
    scores: list[float] | None
    special: Any  # gguf.SpecialVocab: merges, special token ids, add_bos/eos, chat template; or None


def _bad_tokenizer(folder: Path, got: Any, why: str) -> InvalidInputError:
    return InvalidInputError(
        must_be(
            f"the base's tokenizer ({folder / 'tokenizer.json'}) for --format gguf",
            "a BPE tokenizer.json (byte-level, or with byte fallback)",
            got,
            why,
        )
    )


def _pre_tokenizer(tokenizer: Mapping[str, Any]) -> str:
    """llama.cpp's name for a byte-level BPE pre-tokenizer, from the structure of ``pre_tokenizer``."""
    pre = tokenizer.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [part.get("type") for part in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and str(parts[0].get("pattern", {}).get("Regex", "")).startswith(_LLAMA3_SPLIT):
        return "llama-bpe"
    warnings.warn(
        f"unknown byte-level BPE pre-tokenizer {kinds}: the GGUF says 'default', so llama.cpp may split text "
        "differently from transformers (the weights are unaffected)",
        stacklevel=3,
    )
    return "default"


def tokenizer_vocab(folder: Path, vocab_size: int) -> GgufVocab:
    """The base's tokenizer as GGUF tokens; InvalidInputError when llama.cpp could not use it.

    Byte-level BPE (GPT-2, LLaMA-3, SmolLM) is read from ``tokenizer.json`` the way llama.cpp's converter
    does (ids without a token become ``[PADi]``, unused); BPE with byte fallback (LLaMA-2, Mistral) goes
    through ``gguf.LlamaHfVocab``. Merges, special ids and the chat template come from ``gguf.SpecialVocab``.
    """
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise _bad_tokenizer(folder, "no tokenizer.json", "Add the original model's tokenizer.json to the base folder")
    try:
        tokenizer = json.loads(path.read_text(encoding="utf-8"))
        model = tokenizer["model"]
        kind, byte_fallback = model.get("type"), bool(model.get("byte_fallback"))
        decoder = (tokenizer.get("decoder") or {}).get("type")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise _bad_tokenizer(folder, f"an unreadable file ({err})", "Re-download it") from err
    if kind != "BPE":
        raise _bad_tokenizer(folder, f"a {kind} model", "llama.cpp needs BPE or SentencePiece; use --format pruned")
    if byte_fallback:
        return _spm_vocab(folder, vocab_size)
    if decoder != "ByteLevel":
        raise _bad_tokenizer(folder, f"a BPE model with a {decoder} decoder", "Use --format pruned")
    vocab: dict[str, int] = model["vocab"]
    added = {item["id"]: item for item in tokenizer.get("added_tokens") or []}
    reverse = {i: text for text, i in vocab.items()} | {i: item["content"] for i, item in added.items()}
    if max(reverse) >= vocab_size:
        raise _bad_tokenizer(
            folder, f"token id {max(reverse)}", f"The model has only vocab_size={vocab_size} embeddings"
        )
    tokens: list[str | bytes] = []
    types: list[int] = []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    special = _special_vocab(folder, vocab_size, load_merges=True)
    if not special.merges:
        raise _bad_tokenizer(folder, "a BPE model without merges", "Re-download tokenizer.json")
    return GgufVocab("gpt2", _pre_tokenizer(tokenizer), tokens, types, None, special)


def _special_vocab(folder: Path, vocab_size: int, load_merges: bool) -> Any:
    """``gguf.SpecialVocab``, with ``add_bos``/``add_eos`` always set: when neither tokenizer_config.json nor the
    post-processor template says, they are what the tokenizer does when encoding (llama.cpp's own default
    for a missing key may differ, e.g. a BOS that transformers never adds)."""
    special = gguf.SpecialVocab(folder, load_merges=load_merges, n_vocab=vocab_size)
    if "bos" not in special.add_special_token or "eos" not in special.add_special_token:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        plain = backend.encode("a", add_special_tokens=False).ids
        full = backend.encode("a", add_special_tokens=True).ids
        special.add_special_token.setdefault("bos", len(full) > len(plain) and full[0] != plain[0])
        special.add_special_token.setdefault("eos", len(full) > len(plain) and full[-1] != plain[-1])
    return special


def _spm_vocab(folder: Path, vocab_size: int) -> GgufVocab:
    try:
        vocab = gguf.LlamaHfVocab(folder)
    except (FileNotFoundError, TypeError, ValueError, OSError) as err:
        raise _bad_tokenizer(folder, f"a byte-fallback BPE gguf cannot read ({err})", "Use --format pruned") from err
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(kind)
    if len(tokens) > vocab_size:
        raise _bad_tokenizer(folder, f"{len(tokens)} tokens", f"The model has only vocab_size={vocab_size} embeddings")
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    special = _special_vocab(folder, vocab_size, load_merges=False)
    return GgufVocab("llama", "default", tokens, types, scores, special)


def add_vocab(writer: Any, vocab: GgufVocab) -> None:
    """The tokenizer keys (``special``, when there is one: merges, special ids, chat template)."""
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.special is not None:
        vocab.special.add_to_gguf(writer, quiet=True)


# ---------------------------------------------------------------------------------------------- tensors


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


_HALF = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16}
_NUMPY_TYPES = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16}
"""Types ``GGUFWriter`` infers from a numpy dtype; the others (bf16, q8_0) go in as raw bytes with ``raw_dtype``."""


@dataclass(frozen=True)
class _Tensor:
    """One GGUF tensor: its name, the HF job computing it, q/k heads to permute by, and the stored type."""

    name: str
    job: Job
    heads: int | None
    qtype: Any  # gguf.GGMLQuantizationType


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


def gguf_tensors(
    plans: list[LayerPlan], base: BaseModel, adapter: LoraAdapter | None, outtype: str, orders: list[LayerOrder] | None
) -> list[_Tensor]:
    """Every GGUF tensor with its HF extraction job (``blk.N`` numbered as the base; dropped layers have none)."""
    options = ExtractOptions(format="pruned", dtype="float32")
    jobs = model_jobs(plans, base, adapter, options, layer_indexes(plans, base, orders))
    kept = [i for i, plan in enumerate(plans) if plan.keep]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DECI, len(plans))
    tied = bool(base.config.get("tie_word_embeddings", False))
    tensors = []
    for job in jobs:
        hf_name = job.spec.name
        if hf_name == "lm_head.weight" and tied:
            continue  # llama.cpp uses token_embd when there is no output tensor
        layer, heads = None, None
        if hf_name.startswith("model.layers."):
            new = int(hf_name.split(".")[2])
            layer = kept[new]
            hf_name = hf_name.replace(f"model.layers.{new}.", f"model.layers.{layer}.", 1)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None or not hf_name.endswith(".weight"):
            expected = "a llama weight llama.cpp's deci loader reads"
            name_of = "every base tensor for --format gguf"
            raise ConfigError(must_be(name_of, expected, job.spec.name, "Use --format pruned"))
        if layer is not None and hf_name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            heads = job.spec.shape[0] // base.head_dim
        tensors.append(_Tensor(name, job, heads, stored_type(tuple(job.spec.shape), outtype)))
    if not tied and not any(t.name == "output.weight" for t in tensors):
        raise ConfigError(
            must_be(f"base {base.folder}", "a checkpoint with lm_head.weight (tie_word_embeddings is false)", None)
        )
    return tensors


def layer_arrays(plans: list[LayerPlan], base: BaseModel) -> dict[str, list[int]]:
    """Per base layer: FFN width, query heads and KV heads (all 0 for a dropped layer)."""
    ffn, heads, kv_heads = [], [], []
    for plan, kv in zip(plans, base.kv_heads, strict=True):
        kv = plan.groups_of(kv) if plan.keep else 0
        ffn.append(plan.ffn if plan.keep else 0)
        heads.append(kv * base.group_size)
        kv_heads.append(kv)
    return {"feed_forward_length": ffn, "head_count": heads, "head_count_kv": kv_heads}


# ---------------------------------------------------------------------------------------------- writing


def _add_hparams(writer: Any, plans: list[LayerPlan], base: BaseModel, outtype: str, name: str) -> None:
    """The header of ``write``: ``general.name`` is the plan's name (``Extraction.name``), as the file's."""
    add_hparams(writer, base.config, layer_arrays(plans, base), base.head_dim, f"{name}-nsc-pruned", outtype)


def add_hparams(
    writer: Any, config: Mapping[str, Any], arrays: Mapping[str, list[int]], head_dim: int, name: str, outtype: str
) -> None:
    """The deci header: the model's hyperparameters with per-layer ``arrays`` (``layer_arrays``)."""
    writer.add_name(name)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_block_count(len(arrays["feed_forward_length"]))
    writer.add_context_length(int(config.get("max_position_embeddings") or 2048))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(arrays["feed_forward_length"])
    writer.add_head_count(arrays["head_count"])
    writer.add_head_count_kv(arrays["head_count_kv"])
    # Written explicitly: llama.cpp would otherwise divide by head_count[0], which is 0 for a dropped layer 0.
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    theta, kind, factor = _rope(config)
    writer.add_rope_freq_base(theta)
    if kind == "linear":  # llama3 scaling is the rope_freqs tensor instead
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(factor))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_file_type(_OUTTYPES[outtype])


def write(extraction: Extraction) -> Path:
    """Write ``extraction`` (its plans of the base, + merged adapter) as one deci GGUF file (``--out`` a ``.gguf``
    file name or an existing folder: ``output_file``), atomically: every check first (plan, base, tokenizer, output
    path), then the header, then the tensors streamed one at a time. Returns the file written."""
    plans, base, adapter, options, orders = (
        extraction.plans,
        extraction.base,
        extraction.adapter,
        extraction.options,
        extraction.orders,
    )
    outtype = options.outtype or DEFAULT_OUTTYPE
    out = output_file(extraction.out, extraction.name, outtype)
    check_out(out, (base.folder, adapter.folder if adapter else None), options.overwrite)
    if adapter is not None:
        check_adapter_fits(adapter, base.shapes(), base.num_layers)
    check_plan_fits(plans, base.widths, base.kv_heads, adapter)
    check(plans, base, options)
    warn_widths(plans)
    if adapter is None and any(plan.lora_rank for plan in plans):
        warnings.warn(
            "the plan keeps LoRA ranks but no adapter was given: extracting the base weights only", stacklevel=2
        )
    vocab = tokenizer_vocab(base.folder, int(base.config["vocab_size"]))
    tensors = gguf_tensors(plans, base, adapter, outtype, orders)
    summary = extract_record(plans, base, adapter, options, extraction.record, [t.job for t in tensors])
    summary["format"] = {
        "file": "gguf",
        "architecture": ARCH,
        "outtype": outtype,
        "tokenizer": vocab.model,
        "pre": vocab.pre,
    }
    summary["provenance"]["tokenizer_sha256"] = sha256_file(base.folder / "tokenizer.json")
    reader = TensorReader()
    try:
        with atomic_file(out, overwrite=options.overwrite) as tmp:
            writer = gguf.GGUFWriter(tmp, ARCH)
            _add_hparams(writer, plans, base, outtype, extraction.name)
            add_vocab(writer, vocab)
            writer.add_string(RECORD_KEY, to_json(summary))
            rope_freqs = llama3_rope_factors(base.config, base.head_dim) if _rope(base.config)[1] == "llama3" else None
            if rope_freqs is not None:
                nbytes = rope_freqs.numel() * 4
                writer.add_tensor_info("rope_freqs.weight", rope_freqs.shape, np.dtype(np.float32), nbytes)
            for tensor in tensors:
                add_tensor_info(writer, tensor.name, tuple(tensor.job.spec.shape), tensor.qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            if rope_freqs is not None:
                writer.write_tensor_data(rope_freqs.numpy())
            for tensor, data in zip(tensors, run_jobs([t.job for t in tensors], reader), strict=True):
                if tensor.heads is not None:
                    data = permute_rows(data, tensor.heads)
                writer.write_tensor_data(gguf_array(data, tensor.qtype))
            writer.close()
    finally:
        reader.close()
    return out


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """The extraction record stored in a GGUF file this module wrote."""
    field = gguf.GGUFReader(path).get_field(RECORD_KEY)
    if field is None:
        raise InvalidInputError(
            must_be(f"{path}", f"a GGUF file written by nsc-prune extract (with {RECORD_KEY})", None)
        )
    return json.loads(field.contents())
