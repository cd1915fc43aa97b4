"""``--format gguf`` for the families llama.cpp has its own architecture for: ``gemma2``, ``gemma3`` (from
``gemma3_text``), ``granite``, ``olmo2``, ``phi3`` and ``smollm3``, written as llama.cpp's converter would write the
pruned checkpoint.

These architectures create every layer's tensors at layer 0's FFN width and head counts (``load_arch_tensors`` in
llama.cpp's ``src/models/<arch>.cpp``), so only a homogeneous plan can be written: every kept layer with the same
FFN width and the same KV groups. Dropped layers are left out (``blk.N`` is kept layer ``N``), with the per-layer
kinds sliced as the pruned checkpoint's config.json slices them (``nsc_prune.hf.export.pruned.output_config``):
Gemma's sliding/global layers as the ``sliding_window_pattern`` bool array; SmolLM3's layers without RoPE must
match the rule llama.cpp hard-codes (every 4th layer). Tensor names come from ``gguf.get_tensor_name_map``;
granite and smollm3 use llama's interleaved rope (q/k rows permuted, ``permute_rows``), the others NEOX rope (rows
as they are); Gemma's norms scale by ``1 + w`` in transformers and by the stored weight in llama.cpp, so
``1 + w`` is stored. Refused, in one line naming what the architecture lacks: per-layer widths or heads, head
cuts where the query projection is sized by the hidden size (phi3, olmo2), biases, rope scalings other than
linear, and settings llama.cpp computes differently (Gemma's attention scale, soft-capping).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from nsc_prune._files import CONFIG_NAME
from nsc_prune._validation import must_be
from nsc_prune.core.spec import config_biases, config_kv_heads
from nsc_prune.errors import ConfigError, require
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
from nsc_prune.hf.export.pruned import output_config
from nsc_prune.hf.weights.base import BaseModel
from nsc_prune.hf.weights.loading import filled_config
from nsc_prune.plan import LayerPlan

gguf = require("gguf", "hf")

__all__ = ["check", "check_out", "output_file", "write"]  # nsc_prune.hf.export.ExportFormat
ARCHS = {
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
    "granite": gguf.MODEL_ARCH.GRANITE,
    "olmo2": gguf.MODEL_ARCH.OLMO2,
    "phi3": gguf.MODEL_ARCH.PHI3,
    "smollm3": gguf.MODEL_ARCH.SMOLLM3,
}
"""HF ``model_type`` -> llama.cpp's architecture for it."""
MODEL_TYPES = tuple(ARCHS)
_NORM_ROPE = ("granite", "smollm3")  # llama_model_rope_type: LLAMA_ROPE_TYPE_NORM (interleaved pairs)
_ONE_PLUS_NORMS = ("gemma2", "gemma3_text")
_FIXED_HEADS = {  # why the query projection cannot lose heads
    "phi3": "creates the fused attn_qkv with a query part of the hidden size",
    "olmo2": "sizes the query projection and q_norm by the hidden size",
}
_ROPE_TYPES = ("default", "linear")
_NO_ROPE_STEP = 4  # smollm3: llama.cpp's n_no_rope_layer_step (every 4th layer, counted from 1, has no RoPE)


def arch_name(model_type: str) -> str:
    """llama.cpp's name of the architecture a ``model_type`` is written as (``gemma3_text`` -> ``gemma3``)."""
    return gguf.MODEL_ARCH_NAMES[ARCHS[model_type]]


def _engine(model_type: str) -> str:
    arch = arch_name(model_type)
    return f"llama.cpp's {arch} architecture (src/models/{arch}.cpp)"


# ---------------------------------------------------------------------------------------------- checks


def _refuse(what: str, expected: str, got: Any, model_type: str, lacks: str) -> ConfigError:
    return ConfigError(must_be(what, expected, got, f"{_engine(model_type)} {lacks}; or use --format pruned"))


def _check_plan(plans: list[LayerPlan], base: BaseModel) -> None:
    """Homogeneous FFN widths and KV groups over the kept layers; no head cut where the queries are fixed."""
    model_type = base.config["model_type"]
    kept = [i for i, plan in enumerate(plans) if plan.keep]
    widths = sorted({plans[i].ffn for i in kept})
    groups = sorted({plans[i].groups_of(base.kv_heads[i]) for i in kept})
    if len(widths) > 1 or len(groups) > 1:
        raise _refuse(
            f"the plan for --format gguf of {model_type}",
            "homogeneous (one FFN width and one KV-group count in every kept layer)",
            f"FFN widths {widths}, KV groups {groups}",
            model_type,
            "creates every layer at layer 0's FFN width and head counts, so per-layer widths cannot be written; "
            "search with --set homogeneous=true (one FFN width and KV-group count for every kept layer)",
        )
    if model_type in _FIXED_HEADS and groups[0] != config_kv_heads(base.config):
        raise _refuse(
            f"the plan's KV groups for --format gguf of {model_type}",
            f"all {config_kv_heads(base.config)} kept",
            groups[0],
            model_type,
            f"{_FIXED_HEADS[model_type]}, so heads cannot be cut (search with --set kv_heads=false)",
        )


def _gemma_scale(config: Mapping[str, Any], plans: list[LayerPlan], base: BaseModel) -> float:
    """The attention scale llama.cpp computes for Gemma 2/3: 1/sqrt(head_dim), except for the 27B sizes (46 / 62
    layers) where it is 1/sqrt(hidden / heads)."""
    kept = [i for i, plan in enumerate(plans) if plan.keep]
    layers_27b = 46 if config["model_type"] == "gemma2" else 62
    if len(kept) != layers_27b:
        return 1.0 / math.sqrt(base.head_dim)
    heads = plans[kept[0]].groups_of(base.kv_heads[kept[0]]) * base.group_size
    return 1.0 / math.sqrt(int(config["hidden_size"]) // heads)


def _check_gemma(config: Mapping[str, Any], plans: list[LayerPlan], base: BaseModel) -> None:
    model_type = config["model_type"]
    where = f"{base.folder / CONFIG_NAME}"
    scalar = config.get("query_pre_attn_scalar") or base.head_dim
    expected = _gemma_scale(config, plans, base)
    if not math.isclose(float(scalar) ** -0.5, expected, rel_tol=1e-6):
        raise _refuse(
            f"query_pre_attn_scalar of {where} for --format gguf",
            f"{round(expected**-2)} (the attention scale llama.cpp computes)",
            scalar,
            model_type,
            "scales queries by 1/sqrt(head_dim) (1/sqrt(hidden/heads) at 27B size) and reads no scale",
        )
    softcaps = ("attn_logit_softcapping", "final_logit_softcapping")
    if model_type == "gemma2" and any(config.get(key) is None for key in softcaps):
        raise _refuse(f"{softcaps} of {where}", "set", None, model_type, "always soft-caps attention and logits")
    if model_type == "gemma3_text" and config.get("attn_logit_softcapping") is not None:
        attn_cap = config["attn_logit_softcapping"]
        raise _refuse(f"attn_logit_softcapping of {where}", "null", attn_cap, model_type, "has no attention soft-cap")
    if model_type == "gemma3_text" and config.get("final_logit_softcapping") is not None:  # transformers caps
        final_cap = config["final_logit_softcapping"]
        why = "soft-caps the logits only without a sliding window, which every Gemma 3 file has"
        raise _refuse(f"final_logit_softcapping of {where}", "null", final_cap, model_type, why)
    if model_type == "gemma2" and not config.get("tie_word_embeddings", True):
        raise _refuse(f"tie_word_embeddings of {where}", "true", False, model_type, "reads no output tensor")


def _check_no_rope(plans: list[LayerPlan], base: BaseModel) -> None:
    """SmolLM3: the kept layers without RoPE must be llama.cpp's fixed every-4th ones for their new indexes."""
    flags = list(output_config(plans, base, ExtractOptions(format="pruned"))["no_rope_layers"])
    rule = [int((i + 1) % _NO_ROPE_STEP != 0) for i in range(len(flags))]
    if flags != rule:
        raise _refuse(
            "the kept layers' no_rope_layers for --format gguf of smollm3",
            f"{rule} (RoPE in every layer but every {_NO_ROPE_STEP}th)",
            flags,
            "smollm3",
            f"hard-codes the layers without RoPE (n_no_rope_layer_step = {_NO_ROPE_STEP}); keep or drop layers so "
            "the pattern holds",
        )


def check(plans: list[LayerPlan], base: BaseModel, options: ExtractOptions) -> None:
    """Raise unless the plan and base can be written in llama.cpp's own architecture of the family (module
    docstring); checks the tokenizer too."""
    config = filled_config(base.config)
    model_type = config["model_type"]
    where = f"{base.folder / CONFIG_NAME}"
    for key, has_biases in zip(("attention_bias", "mlp_bias"), config_biases(config), strict=True):
        if has_biases:
            raise _refuse(
                f"{key} of {where} for --format gguf", "false", config[key], model_type, "is written without biases"
            )
    rope_type = rope(config)[1]
    if rope_type not in _ROPE_TYPES:
        raise _refuse(
            f"the base's rope type ({where}) for --format gguf",
            f"one of {list(_ROPE_TYPES)}",
            rope_type,
            model_type,
            "is written here with default or linear rope only (longrope, yarn, ... are not exported yet)",
        )
    _check_plan(plans, base)
    if model_type in _ONE_PLUS_NORMS:
        _check_gemma(config, plans, base)
    if model_type == "olmo2" and config.get("tie_word_embeddings"):
        raise _refuse(f"tie_word_embeddings of {where}", "false", True, model_type, "requires an output tensor")
    if model_type == "smollm3":
        _check_no_rope(plans, base)
    tokenizer_vocab(base.folder, int(config["vocab_size"]))


# ---------------------------------------------------------------------------------------------- tensors


def _one_plus(weight: Any) -> Any:
    """Gemma's RMSNorm weight as llama.cpp multiplies by it: transformers scales by ``1 + w``."""
    return weight + 1.0


def native_tensors(extraction: Extraction, outtype: str) -> list[GgufTensor]:
    """Every GGUF tensor with its HF extraction job (``blk.N``: kept layer ``N``)."""
    plans, base = extraction.plans, extraction.base
    options = ExtractOptions(format="pruned", dtype="float32")
    indexes = layer_indexes(plans, base, extraction.orders)
    jobs = model_jobs(plans, base, extraction.adapter, options, indexes, extraction.reconstructed)
    model_type = base.config["model_type"]
    names = gguf.get_tensor_name_map(ARCHS[model_type], sum(plan.keep for plan in plans))
    tensors = []
    for job in jobs:
        hf_name = job.spec.name
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None and hf_name == "lm_head.weight":  # a tied base whose stored head is not its embedding
            raise _refuse(
                "the base's lm_head.weight for --format gguf", "the input embedding (tied)", "another matrix",
                model_type, "always reads the embedding as its head",
            )  # fmt: skip
        if name is None or not hf_name.endswith(".weight"):
            raise _refuse("every base tensor for --format gguf", "one llama.cpp reads", hf_name, model_type, "has none")
        transform = None
        if model_type in _NORM_ROPE and hf_name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            transform = partial(permute_rows, heads=job.spec.shape[0] // base.head_dim)
        elif model_type in _ONE_PLUS_NORMS and hf_name.endswith("norm.weight"):
            transform = _one_plus
        tensors.append(GgufTensor(name, job, stored_type(tuple(job.spec.shape), outtype), transform))
    return tensors


# ---------------------------------------------------------------------------------------------- writing


def _sliding(config: Mapping[str, Any]) -> list[bool]:
    """Per kept layer: whether it attends in a sliding window (``layer_types`` of the pruned config)."""
    return [kind == "sliding_attention" for kind in config["layer_types"]]


def add_family_hparams(writer: Any, config: Mapping[str, Any]) -> None:
    """The keys one family's ``load_arch_hparams`` reads beyond the common ones, from the pruned ``config``."""
    model_type = config["model_type"]
    if model_type == "granite":
        writer.add_logit_scale(float(config["logits_scaling"]))
        writer.add_residual_scale(float(config["residual_multiplier"]))
        writer.add_embedding_scale(float(config["embedding_multiplier"]))
        writer.add_attention_scale(float(config["attention_multiplier"]))
    if model_type in _ONE_PLUS_NORMS:
        writer.add_sliding_window(int(config["sliding_window"]))
        writer.add_sliding_window_pattern(_sliding(config))
        if config.get("attn_logit_softcapping") is not None:
            writer.add_attn_logit_softcapping(float(config["attn_logit_softcapping"]))
        if config.get("final_logit_softcapping") is not None:
            writer.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
    if model_type == "gemma3_text":
        local = dict(config.get("rope_parameters") or {}).get("sliding_attention") or {}
        writer.add_rope_freq_base_swa(float(local.get("rope_theta", config.get("rope_local_base_freq", 10000.0))))


def add_hparams(
    writer: Any, config: Mapping[str, Any], kv_groups: int, group_size: int, head_dim: int, name: str, outtype: str
) -> None:
    """The header of a homogeneous pruned ``config`` (``output_config``) whose layers keep ``kv_groups`` KV groups:
    global sizes, then the family's keys. (The heads come from the plan: a config may keep the base's global heads
    and give the cut ones per layer, ``heads_stay_global``.)"""
    rotary = float(rope_params(config).get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)))
    sizes = {
        "block_count": int(config["num_hidden_layers"]),
        "feed_forward_length": int(config["intermediate_size"]),
        "head_count": kv_groups * group_size,
        "head_count_kv": kv_groups,
        "head_dim": head_dim,
        "rope_dims": int(head_dim * rotary),
    }
    add_common_hparams(writer, config, sizes, name, outtype)
    add_family_hparams(writer, config)


def layout(extraction: Extraction, outtype: str) -> Layout:
    """The native file of ``extraction``: the pruned checkpoint's config as keys, its tensors renamed."""
    base = extraction.base
    config = filled_config(output_config(extraction.plans, base, ExtractOptions(format="pruned")))
    name = f"{extraction.name}-nsc-pruned"  # the plan's name, as the file's
    kv_groups = next(
        plan.groups_of(kv) for plan, kv in zip(extraction.plans, base.kv_heads, strict=True) if plan.keep
    )  # all alike
    header = partial(
        add_hparams,
        config=config,
        kv_groups=kv_groups,
        group_size=base.group_size,
        head_dim=base.head_dim,
        name=name,
        outtype=outtype,
    )
    return Layout(arch_name(config["model_type"]), header, {}, native_tensors(extraction, outtype))


def write(extraction: Extraction) -> Path:
    """Write ``extraction`` as one GGUF file of llama.cpp's architecture for the family (``gguf_file.write_gguf``)."""
    return write_gguf(extraction, check, layout)
