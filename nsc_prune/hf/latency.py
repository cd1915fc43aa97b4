"""Measured latency: the prefill and decode timers, and ``profile_latency``, which writes a latency table.

The timers are the ones ``scripts/bench_speed.py`` runs on whole checkpoints, so a table's prediction and a
measured model are timed the same way:

- prefill: one forward pass of ``batch x prefill_tokens`` random tokens, building the KV cache, logits of the last
  position only (what generation computes);
- decode: after a prefill of ``decode_context`` tokens, ``decode_tokens`` greedy steps at batch 1, timed per token.

A table entry is timed on a model built from the config alone (random weights: the time of a dense matmul does not
depend on the values), so profiling needs no checkpoint. The fixed part is a model with no decoder layer
(embeddings, final norm, lm_head and the per-call overhead of the framework). Option ``o`` of a layer is timed as a
stack of ``stack`` identical layers at ``o``: its cost is ``(t(stack) - t(fixed)) / stack``. The stack amortises the
timer's noise and, with weights far larger than the caches, reads them from memory as the whole model does.
Layers of the same shapes share one measurement; a dropped layer costs nothing (it is absent).
"""

from __future__ import annotations

import copy
import os
import platform
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from nsc_prune._io import provenance
from nsc_prune.core.latency import PHASES, LatencyTable, ProfileSettings, model_fingerprint, space_options
from nsc_prune.core.search import SearchSpace
from nsc_prune.core.spec import PER_LAYER_HEADS_KEY, DecoderDims, layer_dims
from nsc_prune.errors import ConfigError, require
from nsc_prune.hf.modeling import KEPT_LAYERS_KEY
from nsc_prune.hf.progress import progress

torch = require("torch", "hf")

_PER_LAYER_KEYS = ("per_layer_config", PER_LAYER_HEADS_KEY, KEPT_LAYERS_KEY, "layer_types", "mlp_layer_types")
_NOT_FOR_TIMING = ("quantization_config", "auto_map", "architectures")


def check_device(settings: ProfileSettings) -> None:
    """Refuse a GPU where none is present, before anything is built."""
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda asked for, but torch sees no CUDA GPU here; use --device cpu")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _random_ids(model: Any, batch: int, tokens: int, seed: int) -> Any:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens), generator=generator)
    return ids.to(model.device)


def prefill_seconds(model: Any, batch: int, tokens: int, repeats: int, seed: int = 0) -> list[float]:
    """Seconds of ``repeats`` prefill passes (``batch x tokens``, KV cache built, last logits), after a warm-up."""
    ids, device = _random_ids(model, batch, tokens, seed), model.device.type
    times = []
    with torch.inference_mode():
        for run in range(repeats + 1):
            _sync(device)
            start = time.perf_counter()
            model(ids, use_cache=True, logits_to_keep=1)
            _sync(device)
            if run:  # the first run warms up
                times.append(time.perf_counter() - start)
    return times


def decode_seconds(model: Any, context: int, new_tokens: int, repeats: int, seed: int = 0) -> list[float]:
    """Seconds per token of ``repeats`` greedy decodes of ``new_tokens`` at batch 1 after ``context`` tokens,
    after a warm-up."""
    ids, device = _random_ids(model, 1, context, seed), model.device.type
    times = []
    with torch.inference_mode():
        for run in range(repeats + 1):
            out = model(ids, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            _sync(device)
            start = time.perf_counter()
            for _ in range(new_tokens):
                out = model(token, cache=out.cache, use_cache=True, logits_to_keep=1)
                token = out.logits[:, -1].argmax(-1, keepdim=True)
            _sync(device)
            if run:
                times.append((time.perf_counter() - start) / new_tokens)
    return times


def time_model(model: Any, settings: ProfileSettings) -> dict[str, float]:
    """Median seconds of each phase (``PHASES``) of ``model`` under ``settings``."""
    prefill = prefill_seconds(model, settings.batch, settings.prefill_tokens, settings.repeats, settings.seed)
    decode = decode_seconds(
        model, settings.decode_context, settings.decode_tokens, settings.repeats, settings.seed
    )
    return {"prefill": statistics.median(prefill), "decode": statistics.median(decode)}


def option_config(config: Mapping[str, Any], dims: DecoderDims, label: Mapping[str, Any], layers: int) -> dict:
    """A homogeneous config of ``layers`` decoder layers, each with ``dims`` narrowed to option ``label``
    (``ffn`` channels, ``kv_groups`` KV groups with their query heads)."""
    out = {k: copy.deepcopy(v) for k, v in config.items() if k not in _PER_LAYER_KEYS + _NOT_FOR_TIMING}
    kv = label.get("kv_groups") or dims.num_key_value_heads
    out.update(
        num_hidden_layers=layers,
        intermediate_size=int(label.get("ffn") or dims.intermediate_size),
        num_key_value_heads=int(kv),
        num_attention_heads=int(kv) * dims.group_size,
        head_dim=dims.head_dim,
    )
    return out


def build_timed_model(config: Mapping[str, Any], settings: ProfileSettings) -> Any:
    """The stock causal LM of ``config`` with random weights, on ``settings.device`` in its dtype, in eval mode."""
    transformers = require("transformers", "hf")
    parsed = transformers.CONFIG_MAPPING[config["model_type"]].from_dict(dict(config))
    torch.manual_seed(settings.seed)
    with torch.device(settings.device):
        model = transformers.AutoModelForCausalLM.from_config(parsed, trust_remote_code=False)
    return model.to(getattr(torch, settings.torch_dtype)).eval()


def machine_record(settings: ProfileSettings) -> dict[str, Any]:
    """Where a table was measured: the machine, threads and (cuda) the GPU."""
    record = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if settings.device == "cuda":
        record["gpu"] = torch.cuda.get_device_name()
    return record


def profile_latency(
    space: SearchSpace, config: Mapping[str, Any], model_name: str, settings: ProfileSettings
) -> LatencyTable:
    """Time every option of every layer of ``space`` (a one-model per-layer space of ``config``) and the fixed
    part, under ``settings``; the table ``--cost latency`` reads (module docstring for the method)."""
    check_device(settings)
    transformers = require("transformers", "hf")
    options, dims = space_options(space), layer_dims(config)
    shapes = {
        (dims[l], label.get("ffn"), label.get("kv_groups"))
        for l, labels in enumerate(options)
        for label in labels
        if label.get("keep", True)
    }
    start = time.perf_counter()
    fixed = time_model(build_timed_model(option_config(config, dims[0], {}, 0), settings), settings)
    measured = {}
    for shape in progress(sorted(shapes, key=repr), desc="profiling layer options", unit="option"):
        layer, ffn, kv = shape
        label = {"ffn": ffn, "kv_groups": kv}
        model = build_timed_model(option_config(config, layer, label, settings.stack), settings)
        timed = time_model(model, settings)
        del model
        measured[shape] = {p: max(0.0, (timed[p] - fixed[p]) / settings.stack) for p in PHASES}
    zero = dict.fromkeys(PHASES, 0.0)
    layers = tuple(
        tuple(
            measured[(dims[l], label.get("ffn"), label.get("kv_groups"))] if label.get("keep", True) else zero
            for label in labels
        )
        for l, labels in enumerate(options)
    )
    backend = {
        "name": settings.backend,
        "device": settings.device,
        "dtype": settings.torch_dtype,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    return LatencyTable(
        model={"name": model_name, "fingerprint": model_fingerprint(config)},
        space={"name": space.name, "description": space.description, "options": options},
        fixed=fixed,
        layers=layers,
        backend=backend,
        settings={**asdict(settings), "dtype": settings.torch_dtype, "distinct_options": len(shapes)},
        machine=machine_record(settings),
        provenance=provenance(seconds=round(time.perf_counter() - start, 3)),
    )
