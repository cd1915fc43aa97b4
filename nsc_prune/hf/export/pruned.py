"""nsc-prune's own checkpoint formats: ``pruned`` (the default) and ``padded``.

``pruned``: every tensor has its kept shape; config.json carries per-layer FFN widths (``per_layer_config``),
per-layer heads (``PER_LAYER_HEADS_KEY``) and the kept base layers (``KEPT_LAYERS_KEY``, dropped layers are left
out and the rest renumbered; per-layer config lists such as ``layer_types`` are sliced and ``max_window_layers``
renumbered to match), and the shipped modeling file with ``auto_map`` (see ``hf/modeling/modeling_nsc_llama.py``).
A homogeneous plan (every kept layer the same FFN width and the same number of KV groups, whether or not layers
were dropped, and heads a stock config accepts: ``heads_stay_global``) is written as a stock checkpoint instead:
global ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads`` and ``head_dim``, the stock class
in ``architectures`` (``STOCK_ARCHITECTURES``), no ``auto_map`` and no modeling file, so
``AutoModelForCausalLM.from_pretrained(dir)`` loads it without remote code (``KEPT_LAYERS_KEY`` stays, for
provenance: transformers keeps unknown config keys); the record's ``export.stock`` names that class.
``padded``: zero-padded full-width weights in the base's own config, which stock transformers loads (it saves no
memory). Both are written by ``nsc_prune.hf.export.checkpoint``.
"""

from __future__ import annotations

from typing import Any

from nsc_prune._validation import must_be
from nsc_prune.core.spec import PER_LAYER_HEADS_KEY, config_kv_heads
from nsc_prune.errors import ConfigError
from nsc_prune.hf.cut.jobs import carried_config, model_jobs
from nsc_prune.hf.cut.keep import LayerIndex
from nsc_prune.hf.cut.request import Extraction, ExtractOptions
from nsc_prune.hf.export import Export
from nsc_prune.hf.export.checkpoint import check_out, output_file, writer
from nsc_prune.hf.modeling import (
    ARCHITECTURES,
    KEPT_LAYERS_KEY,
    LAYER_LISTS,
    MODELING_FILE,
    STOCK_ARCHITECTURES,
    auto_map,
    heads_stay_global,
)
from nsc_prune.hf.weights.base import BaseModel
from nsc_prune.plan import LayerPlan

__all__ = ["check", "check_out", "output_file", "prepare", "write"]  # nsc_prune.hf.export.ExportFormat


def _derived_layer_lists(config: dict[str, Any], base_layers: int) -> None:
    """Write out the per-layer lists a config.json may leave to a rule, as the config classes derive them, so slicing
    keeps each kept layer's own kind: SmolLM3's ``no_rope_layers`` (every ``no_rope_layer_interval``-th layer
    without RoPE, counted from 1), Gemma 2's and Gemma 3's ``layer_types`` (every 2nd, or every
    ``sliding_window_pattern``-th, layer global, the others sliding)."""
    model_type = config.get("model_type")
    if model_type == "smollm3" and config.get("no_rope_layers") is None:
        interval = config.get("no_rope_layer_interval", 4)
        config["no_rope_layers"] = [int((i + 1) % interval != 0) for i in range(base_layers)]
    if model_type in ("gemma2", "gemma3_text") and config.get("layer_types") is None:
        period = 2 if model_type == "gemma2" else config.get("sliding_window_pattern", 6)
        kinds = ("full_attention", "sliding_attention")
        config["layer_types"] = [kinds[bool((i + 1) % period)] for i in range(base_layers)]


def _drop_layers(config: dict[str, Any], kept: list[int], base_layers: int) -> None:
    """Slice the per-layer lists of ``config`` (``LAYER_LISTS``) to the ``kept`` base layers and renumber
    ``max_window_layers`` (Qwen2/3: layer i slides iff i >= max_window_layers; the kept layers keep their order, so
    counting the kept layers below the old threshold keeps every layer's attention type)."""
    if len(kept) < base_layers:
        _derived_layer_lists(config, base_layers)
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


def global_width(widths: list[int]) -> int:
    """The FFN width a pruned config.json states globally: the most common one (the widest among equally common),
    so a uniform plan needs no per-layer override and stock LLaMA loads it."""
    return max(sorted(set(widths), reverse=True), key=widths.count)


def output_config(plans: list[LayerPlan], base: BaseModel, options: ExtractOptions) -> dict[str, Any]:
    """config.json of the output: per-layer FFN widths in ``per_layer_config``, heads in ``PER_LAYER_HEADS_KEY``,
    per-layer lists sliced to the kept layers, and ``auto_map`` to the shipped class of the model type (pruned
    format; the padded one keeps the base's config). A homogeneous plan gets a stock config (``is_stock``): global
    widths and heads, the stock class, no ``auto_map``."""
    config = carried_config(base, options)
    if options.format == "padded":
        return config
    kept = [i for i, plan in enumerate(plans) if plan.keep]
    widths = [plans[i].ffn for i in kept]
    kv_groups = [plans[i].groups_of(base.kv_heads[i]) for i in kept]
    common = global_width(widths)
    old = {int(k): dict(v) for k, v in (base.config.get("per_layer_config") or {}).items()}
    overrides = {}
    for new, i in enumerate(kept):
        layer = {k: v for k, v in old.get(i, {}).items() if k != "intermediate_size"}
        if widths[new] != common:
            layer["intermediate_size"] = widths[new]
        if layer:
            overrides[str(new)] = layer
    global_kv = config_kv_heads(base.config)
    stock = not overrides and len(set(kv_groups)) == 1 and not heads_stay_global(config, kv_groups[0] * base.group_size)
    heads = {}
    if stock:  # every kept layer has the same heads: they are the global ones
        config["num_attention_heads"] = kv_groups[0] * base.group_size
        config["num_key_value_heads"] = kv_groups[0]
    else:
        for new, kv in enumerate(kv_groups):
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
        config[KEPT_LAYERS_KEY] = [previous[i] for i in kept]  # provenance; stock transformers keeps the key
    if stock:
        config["architectures"] = [STOCK_ARCHITECTURES[config["model_type"]]]
    else:
        config["architectures"] = [ARCHITECTURES[config["model_type"]]]
        config["auto_map"] = auto_map(config["model_type"])
    return config


def is_stock(config: dict[str, Any]) -> bool:
    """Whether a ``pruned`` output config (``output_config``) is a stock one: no ``auto_map``, no modeling file."""
    return "auto_map" not in config


def check(plans: list[LayerPlan], base: BaseModel, options: ExtractOptions) -> None:
    """Every plan that fits the base (``check_plan_fits``) can be written as ``pruned``; ``padded`` keeps the base's
    config, which stock transformers loads only for a base of one shape in every layer (not a pruned checkpoint)."""
    per_layer = [key for key in ("per_layer_config", PER_LAYER_HEADS_KEY) if base.config.get(key)]
    if options.format == "padded" and per_layer:
        raise ConfigError(
            f"--format padded keeps the base's config.json, and {base.folder}'s has per-layer shapes "
            f"({', '.join(per_layer)}), which stock transformers does not load; pass --format pruned, or extract "
            "from an unpruned base"
        )


def prepare(extraction: Extraction, indexes: list[LayerIndex | None]) -> Export:
    """The config, the output tensors and (pruned, unless the config is stock) the shipped modeling file."""
    plans, base, options = extraction.plans, extraction.base, extraction.options
    config = output_config(plans, base, options)
    jobs = model_jobs(plans, base, extraction.adapter, options, indexes, extraction.reconstructed)
    if options.format != "pruned":
        return Export(config, jobs)
    if is_stock(config):
        return Export(config, jobs, report={"stock": config["architectures"][0]})
    return Export(config, jobs, (MODELING_FILE,))


write = writer(prepare)
