"""Measured latency with transformers: the prefill and decode timers, and the backend that writes a latency table.

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
Every timed model shares the reference's embedding and LM head (``share_embeddings``): a stack holds its layers.
When the dense model fits (``MAX_TIMED_BYTES``) it is timed in the same rounds and sets the fixed part: its time less
its layers' (the intercept that makes the dense prediction exact; what a stack cannot see, such as the cache
behaviour of the whole depth, then cancels at the dense end). Otherwise the fixed part is the model without layers;
the table records which (``settings.fixed_from``).
Layers of the same shape (``profiling.LayerShape``: dims and the timed ``LayerPlan``) share one measurement; a dropped
layer costs nothing (it is absent).

A shared CPU is noisy: single timings of one model vary by tens of percent in slow spells lasting seconds. So the
stacks and the fixed model are built together (up to ``MAX_TIMED_BYTES`` of weights at a time), timed in turn for
``repeats`` rounds, and each keeps its fastest run (``nsc_prune.hf.latency.profiling.time_options``).

This module is the transformers backend; ``nsc_prune.hf.latency.llamacpp_backend`` is llama.cpp's
(``--backend llama.cpp``), on the same ``hf.latency.profiling``; ``hf.latency.profile.profile_latency`` picks one.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from nsc_prune.core.front import SearchSpace
from nsc_prune.core.latency_table import LatencyTable, ProfileSettings
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.core.spec import PER_LAYER_HEADS_KEY, DecoderDims, config_kv_heads, layer_dims
from nsc_prune.errors import ConfigError, require
from nsc_prune.hf.latency.profiling import (
    LayerShape,
    Measured,
    Timer,
    assemble_table,
    dense_fits,
    machine_record,
    option_shapes,
    time_options,
)
from nsc_prune.hf.modeling import KEPT_LAYERS_KEY, LAYER_LISTS, heads_stay_global
from nsc_prune.hf.progress import quiet_logger
from nsc_prune.hf.weights.compute import gpu_has_native_bf16, require_cuda
from nsc_prune.hf.weights.loading import meta_model, parse_config, pruned_classes

torch = require("torch", "hf")

_PER_LAYER_KEYS = ("per_layer_config", PER_LAYER_HEADS_KEY, KEPT_LAYERS_KEY, *LAYER_LISTS)
_NOT_FOR_TIMING = ("quantization_config", "auto_map", "architectures")


def check_device(settings: ProfileSettings) -> None:
    """Refuse a GPU where none is present, or bfloat16 on one that only emulates it, before anything is built."""
    if settings.device == "cuda":
        require_cuda()
    if settings.device == "cuda" and settings.timed_dtype == "bfloat16" and not gpu_has_native_bf16():
        raise ConfigError(
            "--device cuda times bfloat16 (the default there), but this GPU only emulates it (compute capability "
            "below 8.0), so the table would not be the speed you deploy; pass --dtype float16"
        )


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


def timer(settings: ProfileSettings) -> Timer:
    """One run of both phases of a torch model under ``settings`` (``hf.latency.profiling.time_rounds``'s ``once``)."""
    s = settings

    def once(model: Any, warmup: bool) -> dict[str, float]:
        prefill = prefill_seconds(model, s.batch, s.prefill_tokens, 1, s.seed, warmup)
        decode = decode_seconds(model, s.decode_context, s.decode_tokens, 1, s.seed, warmup)
        return {"prefill": prefill[0], "decode": decode[0]}

    return once


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


def option_config(config: Mapping[str, Any], dims: DecoderDims, plan: LayerPlan, layers: int) -> dict:
    """A homogeneous config of ``layers`` decoder layers, each a layer of ``dims`` narrowed to ``plan`` (its
    ``ffn`` channels and KV groups with their query heads; its LoRA rank is merged away)."""
    out = {k: copy.deepcopy(v) for k, v in config.items() if k not in _PER_LAYER_KEYS + _NOT_FOR_TIMING}
    shape = LayerShape(dims, plan)
    out.update(
        num_hidden_layers=layers,
        intermediate_size=int(shape.plan.ffn),
        num_key_value_heads=int(shape.plan.kv_groups),
        num_attention_heads=int(shape.heads),
        head_dim=dims.head_dim,
    )
    if heads_stay_global(config, int(shape.heads)):  # the config's own global heads, not this layer's (a pruned base)
        heads = {"num_attention_heads": int(shape.heads), "num_key_value_heads": int(shape.plan.kv_groups)}
        out.update(num_key_value_heads=config_kv_heads(config), num_attention_heads=config["num_attention_heads"])
        out[PER_LAYER_HEADS_KEY] = {str(i): dict(heads) for i in range(layers)}
    return out


def build_timed_model(config: Mapping[str, Any], settings: ProfileSettings) -> Any:
    """The stock causal LM of ``config`` with random weights, on ``settings.device`` in its dtype, in eval mode (the
    package's class when ``config`` gives heads per layer: ``heads_stay_global``)."""
    if PER_LAYER_HEADS_KEY in config:
        return build_dense_model(config, settings)
    transformers = require("transformers", "hf")
    parsed = parse_config(transformers.CONFIG_MAPPING[config["model_type"]], config)
    torch.manual_seed(settings.seed)
    with torch.device(settings.device):
        model = transformers.AutoModelForCausalLM.from_config(parsed, trust_remote_code=False)
    return model.to(getattr(torch, settings.timed_dtype)).eval()


def build_dense_model(config: Mapping[str, Any], settings: ProfileSettings) -> Any:
    """The model of ``config`` itself (per-layer widths included: the package's class), random weights."""
    config_class, model_class = pruned_classes()[config["model_type"]]
    torch.manual_seed(settings.seed)
    with torch.device(settings.device):
        model = model_class(parse_config(config_class, config))
    return model.to(getattr(torch, settings.timed_dtype)).eval()


def share_embeddings(model: Any, reference: Any) -> Any:
    """``model`` with ``reference``'s input embeddings and LM head (a timed model differs from the reference in its
    decoder layers only): a stack then holds its layers' weights, not another copy of a vocabulary-sized matrix
    or two (at Llama-3-8B shapes in float32, 4 GiB of each stack). Tied weights stay tied: both modules are the
    reference's."""
    model.set_input_embeddings(reference.get_input_embeddings())
    if model.get_output_embeddings() is not None:
        model.set_output_embeddings(reference.get_output_embeddings())
    model.config.vocab_size = reference.config.vocab_size  # the timed ids are drawn from it
    return model


def _few_ids(config: Mapping[str, Any]) -> int:
    """The smallest vocabulary ``config``'s special token ids fit in (an embedding's padding index must)."""
    ids = [config.get(key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")]
    flat = [i for item in ids for i in (item if isinstance(item, list) else [item]) if isinstance(i, int)]
    return 1 + max([0, *flat])


def _itemsize(settings: ProfileSettings) -> int:
    return getattr(torch, settings.timed_dtype).itemsize


def profile_transformers(
    space: SearchSpace, config: Mapping[str, Any], model_name: str, settings: ProfileSettings
) -> LatencyTable:
    """The transformers backend of ``nsc_prune.hf.latency.profile.profile_latency``, at ``settings.threads``."""
    check_device(settings)
    meta_model(config, True, f"model {model_name}")  # one line, not a traceback from the first timed model
    with torch_threads(settings.threads):
        return _profile(space, config, model_name, settings)


def _profile(space: SearchSpace, config: Mapping[str, Any], model_name: str, settings: ProfileSettings) -> LatencyTable:
    transformers = require("transformers", "hf")
    start = time.perf_counter()
    first = layer_dims(config)[0]
    with quiet_logger("transformers.modeling_rope_utils", logging.ERROR):  # Gemma 3's nested rope at 0 layers
        reference = build_timed_model(option_config(config, first, LayerPlan(ffn=first.intermediate_size), 0), settings)
    shared = {id(p) for p in reference.parameters()}

    def build_stack(shape: LayerShape) -> Any:
        # built with a placeholder vocabulary, its matrices the reference's: initialising a vocabulary-sized
        # embedding and head per stack, to drop them, was 15 % of a SmolLM2 profile
        stack_config = {**option_config(config, shape.dims, shape.plan, settings.stack), "vocab_size": _few_ids(config)}
        return share_embeddings(build_timed_model(stack_config, settings), reference)

    def own_bytes(model: Any) -> int:  # what the reference holds is counted once, with it
        return sum(
            p.numel() * p.element_size() for p in model.parameters() if model is reference or id(p) not in shared
        )

    fits = dense_fits(space, config, _itemsize(settings))
    measured, without_layers, dense_time = time_options(
        option_shapes(space, config),
        build_stack,
        own_bytes,
        reference=reference,
        dense=share_embeddings(build_dense_model(config, settings), reference) if fits else None,
        settings=settings,
        once=timer(settings),
    )
    record = Measured(
        options=measured,
        without_layers=without_layers,
        without_layers_from="a model without decoder layers",
        dense=dense_time,
        versions={"torch": torch.__version__, "transformers": transformers.__version__},
        machine=machine_record(
            torch_threads=torch.get_num_threads(),
            **({"gpu": torch.cuda.get_device_name()} if settings.device == "cuda" else {}),
        ),
    )
    return assemble_table(space, config, model_name, settings, record, start)
