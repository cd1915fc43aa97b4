"""Measured latency: the prefill and decode timers, and ``profile_latency``, which writes a latency table.

The timers are the ones ``scripts/bench_speed.py`` runs on whole checkpoints, so a table's prediction and a
measured model are timed the same way:

- prefill: one forward pass of ``batch x prefill_tokens`` random tokens, building the KV cache, logits of the last
  position only (what generation computes);
- decode: after a prefill of ``decode_context`` tokens, ``decode_tokens`` greedy steps at batch 1, timed per token.

A table entry is timed on a model built from the config alone (random weights: the time of a dense matmul does not
depend on the values), so profiling needs no checkpoint. The fixed part is a model with no decoder layer
(embeddings, final norm, lm_head and the per-call overhead of the framework). Option ``o`` of a layer is timed as a
stack of ``stack`` identical layers at ``o``: its cost is ``(t(stack) - t(no layers)) / stack``. The stack amortises
the timer's noise and, with weights far larger than the caches, reads them from memory as the whole model does.
When the dense model fits (``MAX_TIMED_BYTES``) it is timed in the same rounds and sets the fixed part: its time less
its layers' (the intercept that makes the dense prediction exact; what a stack cannot see, such as the cache
behaviour of the whole depth, then cancels at the dense end). Otherwise the fixed part is the model without layers;
the table records which (``settings.fixed_from``).
Layers of the same shapes share one measurement; a dropped layer costs nothing (it is absent).

A shared CPU is noisy: single timings of one model vary by tens of percent in slow spells lasting seconds. So the
stacks and the fixed model are built together (up to ``MAX_TIMED_BYTES`` of weights at a time), timed in turn for
``repeats`` rounds, and each keeps its fastest run (``time_options``, over ``time_rounds``).

This module is the transformers backend; ``nsc_prune.hf.latency_llamacpp`` is llama.cpp's (``--backend
llama.cpp``), on the same ``time_options`` and ``assemble_table``.
"""

from __future__ import annotations

import copy
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from nsc_prune._io import provenance
from nsc_prune.core.latency import PHASES, LatencyTable, ProfileSettings, model_fingerprint, space_options
from nsc_prune.core.search import SearchSpace
from nsc_prune.core.spec import PER_LAYER_HEADS_KEY, DecoderDims, layer_dims
from nsc_prune.errors import ConfigError, require
from nsc_prune.hf.modeling import KEPT_LAYERS_KEY
from nsc_prune.hf.progress import progress

torch = require("torch", "hf")

K = TypeVar("K")
MAX_TIMED_BYTES = 2 * 2**30  # weights of the models timed in turn at once (profile_latency's rounds)
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


def prefill_seconds(
    model: Any, batch: int, tokens: int, repeats: int, seed: int = 0, warmup: bool = True
) -> list[float]:
    """Seconds of ``repeats`` prefill passes (``batch x tokens``, KV cache built, last logits), after a warm-up."""
    ids, device = _random_ids(model, batch, tokens, seed), model.device.type
    times = []
    with torch.inference_mode():
        for run in range(repeats + warmup):
            _sync(device)
            start = time.perf_counter()
            model(ids, use_cache=True, logits_to_keep=1)
            _sync(device)
            if run >= warmup:
                times.append(time.perf_counter() - start)
    return times


def decode_seconds(
    model: Any, context: int, new_tokens: int, repeats: int, seed: int = 0, warmup: bool = True
) -> list[float]:
    """Seconds per token of ``repeats`` greedy decodes of ``new_tokens`` at batch 1 after ``context`` tokens,
    after a warm-up."""
    ids, device = _random_ids(model, 1, context, seed), model.device.type
    times = []
    with torch.inference_mode():
        for run in range(repeats + warmup):
            out = model(ids, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            _sync(device)
            start = time.perf_counter()
            for _ in range(new_tokens):
                out = model(token, cache=out.cache, use_cache=True, logits_to_keep=1)
                token = out.logits[:, -1].argmax(-1, keepdim=True)
            _sync(device)
            if run >= warmup:
                times.append((time.perf_counter() - start) / new_tokens)
    return times


def time_rounds(
    models: Mapping[K, Any], settings: ProfileSettings, once: Callable[[Any, bool], dict[str, float]] | None = None
) -> dict[K, list[dict[str, float]]]:
    """Each model's time per phase (``PHASES``) in each of ``settings.repeats`` rounds. After one warm-up each,
    the models are timed in turn in every round, so a slow spell of a shared machine hits them alike. ``once(model,
    warmup)`` times one run of both phases (default: the torch timers above)."""
    s = settings

    def torch_once(model: Any, warmup: bool) -> dict[str, float]:
        prefill = prefill_seconds(model, s.batch, s.prefill_tokens, 1, s.seed, warmup)
        decode = decode_seconds(model, s.decode_context, s.decode_tokens, 1, s.seed, warmup)
        return {"prefill": prefill[0], "decode": decode[0]}

    once = once or torch_once
    rounds = {key: [once(model, True)] for key, model in models.items()}
    for _ in range(s.repeats - 1):
        for key, model in models.items():
            rounds[key].append(once(model, False))
    return rounds


def time_models(
    models: Mapping[K, Any], settings: ProfileSettings, once: Callable[[Any, bool], dict[str, float]] | None = None
) -> dict[K, dict[str, float]]:
    """The fastest run of each phase of each model over ``time_rounds``: the estimate least affected by
    interference (as ``timeit`` advises)."""
    return {
        key: {phase: min(run[phase] for run in runs) for phase in PHASES}
        for key, runs in time_rounds(models, settings, once).items()
    }


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU thread count set to ``threads`` inside the block (None: left as it is), restored after."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    return model.to(getattr(torch, settings.timed_dtype)).eval()


def build_dense_model(config: Mapping[str, Any], settings: ProfileSettings) -> Any:
    """The model of ``config`` itself (per-layer widths included: the package's class), random weights."""
    from nsc_prune.hf.loading import pruned_classes

    config_class, model_class = pruned_classes()[config["model_type"]]
    torch.manual_seed(settings.seed)
    with torch.device(settings.device):
        model = model_class(config_class.from_dict(dict(config)))
    return model.to(getattr(torch, settings.timed_dtype)).eval()


def _itemsize(settings: ProfileSettings) -> int:
    return getattr(torch, settings.timed_dtype).itemsize


def machine_record(settings: ProfileSettings, **threads: int) -> dict[str, Any]:
    """Where a table was measured: the machine, the threads timed with (default: torch's) and (cuda) the GPU."""
    record = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        **(threads or {"torch_threads": torch.get_num_threads()}),
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
    if settings.backend == "llama.cpp":
        from nsc_prune.hf.latency_llamacpp import profile_llamacpp

        return profile_llamacpp(space, config, model_name, settings)
    with torch_threads(settings.threads):
        return _profile(space, config, model_name, settings)


def option_shapes(space: SearchSpace, config: Mapping[str, Any]) -> set[tuple[DecoderDims, Any, Any]]:
    """The distinct kept options of ``space``: (layer dims, ffn, kv_groups); layers of one shape share a timing."""
    options, dims = space_options(space), layer_dims(config)
    return {
        (dims[l], label.get("ffn"), label.get("kv_groups"))
        for l, labels in enumerate(options)
        for label in labels
        if label.get("keep", True)
    }


def dense_fits(space: SearchSpace, itemsize: float) -> bool:
    """Whether the dense model's weights fit ``MAX_TIMED_BYTES`` (then it is timed, and anchors the fixed part)."""
    sub = space.subspaces[0]
    return (sub.fixed.params + sum(row[0].params for row in sub.layers)) * itemsize <= MAX_TIMED_BYTES


def time_options(
    shapes: set[tuple],
    build_stack: Callable[[tuple], Any],
    nbytes: Callable[[Any], int],
    reference: Any,
    dense: Any | None,
    settings: ProfileSettings,
    once: Callable[[Any, bool], dict[str, float]] | None = None,
) -> tuple[dict[tuple, dict[str, float]], dict[str, float], dict[str, float] | None]:
    """Each option's cost per phase, ``(t(build_stack(shape)) - t(reference)) / settings.stack``: the stacks are
    built up to ``MAX_TIMED_BYTES`` at a time and timed in turn with ``reference`` (and ``dense``, in the first
    batch), the fastest run of each. Returns the costs, the reference's time and the dense model's (or None)."""
    reference_runs, measured, batch, held, dense_time = [], {}, {}, 0, None
    anchor = {} if dense is None else {"dense": dense}

    def time_batch() -> None:
        nonlocal dense_time
        timed = time_models({"reference": reference, **anchor, **batch}, settings, once)
        reference_runs.append(timed["reference"])
        dense_time = dense_time or timed.get("dense")
        anchor.clear()
        for shape in batch:
            measured[shape] = {p: max(0.0, (timed[shape][p] - timed["reference"][p]) / settings.stack) for p in PHASES}
        batch.clear()

    for shape in progress(
        sorted(shapes, key=repr), desc=f"profiling layer options ({settings.backend})", unit="option"
    ):
        batch[shape] = build_stack(shape)
        held += nbytes(batch[shape])
        if held >= MAX_TIMED_BYTES:
            time_batch()
            held = 0
    if batch:
        time_batch()
    return measured, {p: min(run[p] for run in reference_runs) for p in PHASES}, dense_time


def _profile(space: SearchSpace, config: Mapping[str, Any], model_name: str, settings: ProfileSettings) -> LatencyTable:
    transformers = require("transformers", "hf")
    start = time.perf_counter()
    dims = layer_dims(config)

    def build_stack(shape: tuple) -> Any:
        layer, ffn, kv = shape
        return build_timed_model(option_config(config, layer, {"ffn": ffn, "kv_groups": kv}, settings.stack), settings)

    dense = build_dense_model(config, settings) if dense_fits(space, _itemsize(settings)) else None
    measured, without_layers, dense_time = time_options(
        option_shapes(space, config),
        build_stack,
        lambda model: sum(p.numel() * p.element_size() for p in model.parameters()),
        reference=build_timed_model(option_config(config, dims[0], {}, 0), settings),
        dense=dense,
        settings=settings,
    )
    record = Measured(
        options=measured,
        without_layers=without_layers,
        without_layers_from="a model without decoder layers",
        dense=dense_time,
        versions={"torch": torch.__version__, "transformers": transformers.__version__},
        machine=machine_record(settings),
    )
    return assemble_table(space, config, model_name, settings, record, start)


@dataclass(frozen=True)
class Measured:
    """What a backend measured: each option's cost (keyed by (layer dims, ffn, kv_groups)), the model without
    layers (and how it was had), the dense model's time (None when it was not timed), and with what, where."""

    options: Mapping[tuple, Mapping[str, float]]
    without_layers: Mapping[str, float]
    without_layers_from: str
    dense: Mapping[str, float] | None
    versions: Mapping[str, str]
    machine: Mapping[str, Any]


def assemble_table(
    space: SearchSpace,
    config: Mapping[str, Any],
    model_name: str,
    settings: ProfileSettings,
    measured: Measured,
    start: float,
) -> LatencyTable:
    """The table of a profile: each option's measured cost, nothing for a dropped layer, and the fixed part: the
    dense model's time less its layers' when it was timed (the intercept that makes the dense prediction its
    measured time), else the model without layers."""
    options, dims = space_options(space), layer_dims(config)
    zero = dict.fromkeys(PHASES, 0.0)
    layers = tuple(
        tuple(
            measured.options[(dims[l], label.get("ffn"), label.get("kv_groups"))] if label.get("keep", True) else zero
            for label in labels
        )
        for l, labels in enumerate(options)
    )
    fixed, fixed_from, dense = dict(measured.without_layers), measured.without_layers_from, measured.dense
    if dense is not None:
        fixed = {p: max(0.0, dense[p] - sum(row[0][p] for row in layers)) for p in PHASES}
        fixed_from = "the dense model's time less its layers' (timed in the same rounds)"
    backend = {
        "name": settings.backend,
        "device": settings.device,
        "dtype": settings.timed_dtype,
        "versions": dict(measured.versions),
    }
    return LatencyTable(
        model={"name": model_name, "fingerprint": model_fingerprint(config)},
        space={"name": space.name, "description": space.description, "options": options},
        fixed=fixed,
        layers=layers,
        backend=backend,
        settings={
            **asdict(settings),
            "dtype": settings.timed_dtype,
            "distinct_options": len(measured.options),
            "fixed_from": fixed_from,
            "fixed_without_layers": dict(measured.without_layers),
            "dense_measured": None if dense is None else dict(dense),
        },
        machine=dict(measured.machine),
        provenance=provenance(seconds=round(time.perf_counter() - start, 3)),
    )
