"""``--format gguf`` for ``llama`` and ``mistral`` bases: llama.cpp's architecture ``deci``.

llama.cpp's ``deci`` architecture (DeciLM / Llama-Nemotron-NAS) is LLaMA with per-layer arrays for
``deci.feed_forward_length``, ``deci.attention.head_count`` and ``deci.attention.head_count_kv``, which is
what a pruned plan needs. A dropped layer keeps its index with all three at 0 and no tensors (llama.cpp
passes the residual stream through: no attention when ``n_head == 0``, no FFN when ``n_ff == 0``), so
``blk.N`` is the base's layer ``N``. Layer 0 cannot be dropped: llama.cpp reads the head size only when
layer 0 has heads. Tensors use the llama names (``token_embd``, ``blk.N.attn_q``, ...);
q/k rows are permuted per layer with that layer's head counts, as llama.cpp's HF converter does for
llama-style rope (pairs ``(i, i + d/2)`` of each head become ``(2i, 2i + 1)``).

Only bases without biases and with default, linear or llama3 rope are accepted (llama3 as the ``rope_freqs``
tensor). The file itself (naming, tokenizer, stored types, record, atomic streaming) is ``gguf_file``'s; the
other families get llama.cpp's own architecture (``gguf_native``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from nsc_prune._files import CONFIG_NAME
from nsc_prune._validation import must_be
from nsc_prune._warn import warn
from nsc_prune.core.spec import config_biases, config_tied
from nsc_prune.errors import ConfigError, UnsupportedArchitectureError, require
from nsc_prune.hf.cut.jobs import layer_indexes, model_jobs
from nsc_prune.hf.cut.request import Extraction, ExtractOptions
from nsc_prune.hf.export.gguf_file import (
    GgufTensor,
    Layout,
    add_common_hparams,
    check_out,
    output_file,
    permute_rows,
    rope,
    rope_params,
    stored_type,
    write_gguf,
)
from nsc_prune.hf.export.gguf_vocab import tokenizer_vocab
from nsc_prune.hf.weights.base import BaseModel
from nsc_prune.hf.weights.loading import filled_config
from nsc_prune.plan import LayerPlan

gguf = require("gguf", "hf")
torch = require("torch", "hf")

__all__ = ["check", "check_out", "output_file", "write"]  # nsc_prune.hf.export.ExportFormat
ARCH = "deci"
MODEL_TYPES = ("llama", "mistral")
SILU = ("silu", "swish")  # transformers' two names of the one activation llama.cpp's deci graph has


def gates_with_silu(config: Mapping[str, Any]) -> bool:
    """Whether the FFN of ``config`` gates with SiLU, the only activation llama.cpp's deci graph has."""
    return config.get("hidden_act", "silu") in SILU


_ROPE_TYPES = ("default", "linear", "llama3")


# ---------------------------------------------------------------------------------------------- checks


def check_base(base: BaseModel) -> None:
    """Raise unless the base is something a deci GGUF can hold: llama/mistral, no biases, SiLU, default, linear or
    llama3 rope, and a tokenizer llama.cpp can use (``tokenizer.json``)."""
    config = filled_config(base.config)
    where = f"the base's model_type ({base.folder / CONFIG_NAME})"
    if config.get("model_type") not in MODEL_TYPES:
        raise UnsupportedArchitectureError(
            must_be(
                where,
                f"one of {list(MODEL_TYPES)} for --format gguf",
                config.get("model_type"),
                "write a Hugging Face checkpoint instead (--format pruned)",
            )
        )
    for key, has_biases in zip(("attention_bias", "mlp_bias"), config_biases(config), strict=True):
        if has_biases:
            raise ConfigError(must_be(f"{key} of {base.folder / CONFIG_NAME} for --format gguf", "false", config[key]))
    if not gates_with_silu(config):
        raise ConfigError(
            must_be(
                f"hidden_act of {base.folder / CONFIG_NAME} for --format gguf",
                "'silu' or 'swish'",
                config["hidden_act"],
                "llama.cpp's deci graph has no other; use --format pruned",
            )
        )
    rope_type = rope(config)[1]
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
    window = config.get("sliding_window")
    if window is not None and window < int(config.get("max_position_embeddings") or 0):
        warn(  # as llama.cpp's own converter writes such a Mistral: a warning, not a refusal
            f"the base attends in a sliding window of {window} tokens, which a deci GGUF cannot hold: llama.cpp will "
            f"attend to every position, so beyond {window} tokens of context its outputs differ from the "
            "checkpoint's (--format pruned keeps the window)",
            UserWarning,
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
                "The elastic search drops it only when protect_layers leaves it out: search with layer 0 in "
                "protect_layers, or extract --format pruned and write that checkpoint as GGUF through its own 100 % "
                "front (docs/extract.md)",
            )
        )


def llama3_rope_factors(config: Mapping[str, Any], head_dim: int) -> torch.Tensor:
    """LLaMA-3.1's rope scaling as llama.cpp's ``rope_freqs`` tensor: per frequency, the divisor of its angle
    (1 for short wavelengths, ``factor`` for long ones, interpolated in between)."""
    params = rope_params(config)
    try:
        factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
        context = float(params["original_max_position_embeddings"])
    except (KeyError, TypeError, ValueError) as err:
        message = must_be("the base's llama3 rope parameters", "numbers", params, f"missing or bad {err}")
        raise ConfigError(message) from err
    theta = rope(config)[0]
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = ((context / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    factors = 1.0 / ((1 - smooth) / factor + smooth)  # 1 above high_freq_wavelen, factor below low_freq_wavelen
    return factors.float()


# ---------------------------------------------------------------------------------------------- tensors


def gguf_tensors(extraction: Extraction, outtype: str) -> list[GgufTensor]:
    """Every GGUF tensor with its HF extraction job (``blk.N`` numbered as the base; dropped layers have none)."""
    plans, base = extraction.plans, extraction.base
    options = ExtractOptions(format="pruned", dtype="float32")
    indexes = layer_indexes(plans, base, extraction.orders)
    jobs = model_jobs(plans, base, extraction.adapter, options, indexes, extraction.reconstructed)
    kept = [i for i, plan in enumerate(plans) if plan.keep]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DECI, len(plans))
    tensors = []
    for job in jobs:
        hf_name = job.spec.name
        layer, transform = None, None
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
            transform = partial(permute_rows, heads=job.spec.shape[0] // base.head_dim)
        tensors.append(GgufTensor(name, job, stored_type(tuple(job.spec.shape), outtype), transform))
    if not config_tied(base.config) and not any(t.name == "output.weight" for t in tensors):
        raise ConfigError(
            must_be(f"base {base.folder}", "a checkpoint with lm_head.weight (tie_word_embeddings is false)", None)
        )
    return tensors


def layer_arrays(plans: list[LayerPlan], base: BaseModel) -> dict[str, list[int]]:
    """Per base layer up to the last kept one: FFN width, query heads and KV heads (all 0 for a dropped layer).
    Dropped layers after it are left out: they are identities, and llama.cpp's deci graph keeps only the positions
    whose logits are asked for in its last layer, a step it skips for a layer without an FFN (with a dropped last
    layer llama-cpp-python 0.3.36 aborted when asked for the last position's logits only)."""
    last = max(i for i, plan in enumerate(plans) if plan.keep)
    ffn, heads, kv_heads = [], [], []
    for plan, kv in zip(plans[: last + 1], base.kv_heads[: last + 1], strict=True):
        kv = plan.groups_of(kv) if plan.keep else 0
        ffn.append(plan.ffn if plan.keep else 0)
        heads.append(kv * base.group_size)
        kv_heads.append(kv)
    return {"feed_forward_length": ffn, "head_count": heads, "head_count_kv": kv_heads}


# ---------------------------------------------------------------------------------------------- writing


def add_hparams(
    writer: Any, config: Mapping[str, Any], arrays: Mapping[str, list[int]], head_dim: int, name: str, outtype: str
) -> None:
    """The deci header: the model's hyperparameters with per-layer ``arrays`` (``layer_arrays``). Key and value
    lengths are explicit: llama.cpp would otherwise divide by head_count[0], which is 0 for a dropped layer 0."""
    sizes = {"block_count": len(arrays["feed_forward_length"]), "head_dim": head_dim, "rope_dims": head_dim}
    add_common_hparams(writer, config, {**sizes, **arrays}, name, outtype)  # llama3 scaling is rope_freqs


def layout(extraction: Extraction, outtype: str) -> Layout:
    """The deci file of ``extraction``: per-layer arrays, ``rope_freqs`` for llama3 rope, the llama tensors."""
    plans, base, config = extraction.plans, extraction.base, filled_config(extraction.base.config)
    tensors = gguf_tensors(extraction, outtype)
    constants = {}
    if rope(config)[1] == "llama3":
        constants["rope_freqs.weight"] = llama3_rope_factors(config, base.head_dim)
    header = partial(
        add_hparams,
        config=config,
        arrays=layer_arrays(plans, base),
        head_dim=base.head_dim,
        name=f"{extraction.name}-nsc-pruned",  # the plan's name, as the file's
        outtype=outtype,
    )
    return Layout(ARCH, header, constants, tensors)


def write(extraction: Extraction) -> Path:
    """Write ``extraction`` as one deci GGUF file (``gguf_file.write_gguf``); returns the file written."""
    return write_gguf(extraction, check, layout)
