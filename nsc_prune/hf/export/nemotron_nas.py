"""``--format nemotron-nas``: a checkpoint vLLM serves natively (``DeciLMForCausalLM``, model_type ``nemotron-nas``).

config.json is the base's LLaMA config plus ``block_configs``, one per base layer:
``{"attention": {"no_op": false, "n_heads_in_group": H / kv}, "ffn": {"no_op": false, "intermediate_size": w}}``,
or both parts ``{"no_op": true}`` for a dropped layer (which keeps its index and has no tensors). What the format
cannot say, and how a plan is made exact:

- the number of query heads ``H`` is global: a layer that keeps ``c`` of its KV groups (``c * G`` query heads)
  gets ``H - c * G`` zero query heads (zero q rows, zero o_proj columns: they add exactly nothing);
- a layer has ``H / n_heads_in_group`` KV heads, and vLLM's KV-cache pages must divide each other, so every
  layer's KV head count is padded up to a divisor of the largest (itself a divisor of ``H``) with zero k/v rows;
  the real heads of KV group ``j`` are query heads ``j * n .. j * n + G - 1`` (``n = H / kv``, GQA order);
- FFN widths are written exactly as ``ffn.intermediate_size`` (vLLM >= 0.14 reads it when a block has no ``ffn_mult``;
  ``ffn_mult`` would round widths up to a multiple of 256), so FFN cuts need no padding.

With ``ExtractOptions.pad=False`` (``--no-pad``) a plan that needs padding is refused. The padding overhead (params
and MACs) goes into ``nsc_prune_extract.json`` (``export.padding``). Bases: llama, and mistral without a sliding
window (the same network); qwen2/qwen3 are refused (q/k/v-only biases and q/k norms are not in this DeciLM code).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from nsc_prune._validation import must_be
from nsc_prune.core.spec import PER_LAYER_HEADS_KEY, config_biases
from nsc_prune.errors import ConfigError, UnsupportedArchitectureError
from nsc_prune.hf.cut.jobs import LAYER_TENSOR, Job, carried_config, model_jobs
from nsc_prune.hf.cut.keep import LayerIndex
from nsc_prune.hf.cut.request import Extraction, ExtractOptions
from nsc_prune.hf.export import Export
from nsc_prune.hf.export.checkpoint import check_out, output_file, writer
from nsc_prune.hf.modeling import DECILM_AUTO_MAP, DECILM_FILES, DECILM_TYPE, KEPT_LAYERS_KEY
from nsc_prune.hf.weights.base import BaseModel
from nsc_prune.hf.weights.loading import filled_config
from nsc_prune.hf.weights.safetensors_io import TensorSpec
from nsc_prune.plan import LayerPlan

__all__ = ["check", "check_out", "output_file", "prepare", "write"]  # nsc_prune.hf.export.ExportFormat
SUPPORTED = ("llama", "mistral")
_MISSING = {  # what vLLM's DeciLM lacks: LLaMA layers (RoPE in every layer, 1/sqrt(head_dim) attention scale, plain
    # residuals, unscaled embeddings); it reads a logit_scale, which alone is not enough for Granite
    "qwen2": "q/k/v-only biases (qwen2)",
    "qwen3": "q/k norms (qwen3)",
    "granite": "embedding, residual and attention multipliers (granite)",
    "smollm3": "layers without rotary embedding (smollm3's no_rope_layers)",
    "olmo2": "norms after attention and the MLP nor q/k norms over the whole projection (olmo2)",
    "gemma2": "norms after attention and the MLP, attention and logit soft-capping nor scaled embeddings (gemma2)",
    "gemma3_text": "norms after attention and the MLP, q/k norms nor scaled embeddings (gemma3_text)",
    "phi3": "partial rotary embedding nor LongRoPE as this writer exports it (phi3: RoPE over the whole head, no LongRoPE factors; the fused qkv_proj "
    "and gate_up_proj are not split)",
}
# Keys of the base config that describe what this format says otherwise (or a sliding window it cannot have).
_DROPPED_KEYS = (
    "per_layer_config",
    PER_LAYER_HEADS_KEY,
    KEPT_LAYERS_KEY,
    "layer_types",
    "mlp_layer_types",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
)


@dataclasses.dataclass(frozen=True)
class Block:
    """One kept layer as written: ``kv_kept`` real KV groups in ``kv_heads`` KV heads, ``width`` FFN channels."""

    kv_kept: int
    kv_heads: int
    width: int


def check_base(base: BaseModel) -> None:
    """Refuse a base this format cannot express (model type, sliding window)."""
    model_type = base.config.get("model_type")
    if model_type not in SUPPORTED:
        raise UnsupportedArchitectureError(
            must_be(
                "the base model_type for --format nemotron-nas",
                f"one of {list(SUPPORTED)}",
                model_type,
                f"vLLM's DeciLM has no {_MISSING.get(model_type, 'layers of this type')}; use --format pruned",
            )
        )
    config = filled_config(base.config)  # a Mistral config.json without sliding_window attends in 4096 tokens
    window = config.get("sliding_window")
    if window is not None and window < int(config.get("max_position_embeddings") or 0):
        raise UnsupportedArchitectureError(
            must_be(
                "the base's sliding_window for --format nemotron-nas",
                "null (DeciLM attends to every position)",
                window,
                "use --format pruned for a sliding-window model",
            )
        )


def _smallest_divisor_at_least(n: int, low: int) -> int:
    return next(d for d in range(low, n + 1) if n % d == 0)


def kv_layout(kept: list[int], heads: int) -> list[int]:
    """KV heads to write per kept layer: ``kept`` rounded up to divisors of the largest, which divides ``heads``."""
    largest = _smallest_divisor_at_least(heads, max(kept))
    return [_smallest_divisor_at_least(largest, c) for c in kept]


def blocks(plans: list[LayerPlan], base: BaseModel, pad: bool) -> dict[int, Block]:
    """Base layer index -> the Block written for each kept layer; refuses a plan that needs padding unless ``pad``."""
    heads, group = int(base.config["num_attention_heads"]), base.group_size
    kept = [i for i, plan in enumerate(plans) if plan.keep]
    real = [plans[i].groups_of(base.kv_heads[i]) for i in kept]
    written = kv_layout(real, heads)
    fix = "drop --no-pad to zero-pad the plan (the overhead is reported), or use --format pruned"
    for i, c in zip(kept, real, strict=True):  # all query heads kept means all KV heads: no KV padding either
        if not pad and c * group != heads:
            name = f"plan layer {i}'s query heads for --format nemotron-nas --no-pad"
            raise ConfigError(must_be(name, f"all {heads} (the format's query-head count is global)", c * group, fix))
    return {i: Block(c, kv, plans[i].ffn) for i, c, kv in zip(kept, real, written, strict=True)}


def block_config(block: Block | None, heads: int) -> dict[str, Any]:
    """The ``block_configs`` entry of a kept layer (``block``) or of a dropped one (None)."""
    if block is None:
        return {"attention": {"no_op": True}, "ffn": {"no_op": True}}
    return {
        "attention": {"no_op": False, "n_heads_in_group": heads // block.kv_heads},
        "ffn": {"no_op": False, "intermediate_size": block.width},
    }


def _query_positions(block: Block, heads: int, group: int, head_dim: int) -> tuple[int, ...] | None:
    """Output rows of q (columns of o) of the real query heads: KV group j's heads go to j * n .. j * n + G - 1."""
    if block.kv_kept * group == heads:
        return None
    per_kv = heads // block.kv_heads
    return tuple(
        (j * per_kv + t) * head_dim + e for j in range(block.kv_kept) for t in range(group) for e in range(head_dim)
    )


def _padded(job: Job, layer: int, block: Block, base: BaseModel) -> Job:
    """``job`` (the default format's tensor of base layer ``layer``) renamed to the base index and padded."""
    match = LAYER_TENSOR.match(job.spec.name)
    module, kind = match[2], match[3]
    heads, dim = int(base.config["num_attention_heads"]), base.head_dim
    shape, at = job.spec.shape, ()
    if module == "self_attn.q_proj":
        shape, at = (heads * dim, *shape[1:]), (_query_positions(block, heads, base.group_size, dim),)
    elif module in ("self_attn.k_proj", "self_attn.v_proj"):
        shape = (block.kv_heads * dim, *shape[1:])  # the real heads first, zero heads after
    elif module == "self_attn.o_proj" and kind == "weight":
        shape, at = (shape[0], heads * dim), (None, _query_positions(block, heads, base.group_size, dim))
    spec = TensorSpec(f"model.layers.{layer}.{module}.{kind}", job.spec.dtype, shape)
    return dataclasses.replace(job, spec=spec, at=at)


def padding_report(jobs: list[Job], padded: list[Job], blocks_: dict[int, Block], base: BaseModel) -> dict[str, Any]:
    """Params and MACs the zero padding adds (per token: linear layers; attention scores per context position)."""
    written = sum(math.prod(job.spec.shape) for job in padded)
    extra = written - sum(math.prod(job.spec.shape) for job in jobs)
    extra_matrices = sum(
        math.prod(p.spec.shape) - math.prod(j.spec.shape) for j, p in zip(jobs, padded) if len(p.spec.shape) == 2
    )
    heads = int(base.config["num_attention_heads"])
    zero_q = sum(heads - b.kv_kept * base.group_size for b in blocks_.values())
    zero_kv = sum(b.kv_heads - b.kv_kept for b in blocks_.values())
    return {
        "params": extra,
        "params_fraction": extra / written,
        "linear_macs_per_token": extra_matrices,
        "attention_macs_per_token_per_position": 2 * base.head_dim * zero_q,  # q.k and p.v of the zero query heads
        "zero_query_heads": zero_q,
        "zero_kv_heads": zero_kv,
        "kv_cache_fraction": zero_kv / max(1, sum(b.kv_heads for b in blocks_.values())),
    }


def check(plans: list[LayerPlan], base: BaseModel, options: ExtractOptions) -> None:
    """Raise unless ``base`` and ``plans`` can be written in this format (with ``options.pad``)."""
    check_base(base)
    blocks(plans, base, options.pad)


def prepare(extraction: Extraction, indexes: list[LayerIndex | None]) -> Export:
    """Check the base and plan, then the config, the output tensors (streamed by extraction) and the report."""
    plans, base, adapter, options = extraction.plans, extraction.base, extraction.adapter, extraction.options
    check(plans, base, options)
    blocks_ = blocks(plans, base, options.pad)
    kept = sorted(blocks_)
    pruned = dataclasses.replace(options, format="pruned", pad=True)  # the jobs cut as the pruned format does
    jobs = model_jobs(plans, base, adapter, pruned, indexes, extraction.reconstructed)
    padded = []
    for job in jobs:
        match = LAYER_TENSOR.match(job.spec.name)
        if match:
            layer = kept[int(match[1])]  # the default format renumbers the kept layers 0..n-1
            job = _padded(job, layer, blocks_[layer], base)
        padded.append(job)
    heads = int(base.config["num_attention_heads"])
    attention_bias, mlp_bias = config_biases(base.config)
    config = {k: v for k, v in carried_config(base, options).items() if k not in _DROPPED_KEYS}
    config.update(
        model_type=DECILM_TYPE,
        architectures=["DeciLMForCausalLM"],
        auto_map=dict(DECILM_AUTO_MAP),
        num_hidden_layers=len(plans),
        head_dim=base.head_dim,
        attention_bias=attention_bias,  # DeciLM reads the flags: Mistral's, which build nothing, must not carry over
        mlp_bias=mlp_bias,
        num_key_value_heads=max(b.kv_heads for b in blocks_.values()),
        intermediate_size=max(b.width for b in blocks_.values()),
        block_configs=[block_config(blocks_.get(i), heads) for i in range(len(plans))],
    )
    report = {"format": DECILM_TYPE, "padding": padding_report(jobs, padded, blocks_, base)}
    return Export(config, padded, DECILM_FILES, report)


write = writer(prepare)
