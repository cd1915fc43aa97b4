"""The llama.cpp backend of ``nsc-prune profile`` (``--backend llama.cpp``), and the llama.cpp timers
``scripts/bench_speed.py`` times whole GGUF exports with.

Every timed model is a deci GGUF file, the architecture ``extract --format gguf`` writes for llama and mistral (the
only families this backend times: ``check_timed_family``), with random weights stored
in the table's type (``--dtype``: f16 by default, or q8_0, bf16, f32): llama.cpp's time does not depend on the
values, so profiling needs no checkpoint and no tokenizer (the file carries a placeholder vocabulary of the model's
size). llama.cpp cannot run a model without decoder layers, so the reference is one layer at layer 0's first
(widest) option, and option ``o`` is timed as that layer plus ``stack`` layers at ``o``: its cost is
``(t(reference + stack x o) - t(reference)) / stack``. The model without layers is then the reference less its one
layer. The dense model, when it fits, anchors the fixed part as with transformers (``nsc_prune.hf.latency.transformers_backend``); both
backends time and assemble the table with ``nsc_prune.hf.latency.profiling``.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from nsc_prune._validation import must_be
from nsc_prune.choices import GGUF_TYPE_OF, PHASES
from nsc_prune.core.front import SearchSpace
from nsc_prune.core.latency_table import LatencyTable, ProfileSettings, space_options, usable_cpus
from nsc_prune.core.spec import layer_dims
from nsc_prune.errors import UnsupportedArchitectureError, require
from nsc_prune.hf.export import gguf_deci, gguf_file, gguf_vocab
from nsc_prune.hf.export.gguf_deci import gates_with_silu
from nsc_prune.hf.latency import profiling
from nsc_prune.hf.latency.profiling import LayerShape

torch = require("torch", "hf")
gguf = require("gguf", "hf")


def write_random_gguf(
    path: str | Path, config: Mapping[str, Any], layers: Sequence[LayerShape], outtype: str, seed: int = 0
) -> Path:
    """A deci GGUF of ``config``'s embeddings and these decoder ``layers``, random weights (std 0.02) stored as
    ``outtype``, and a placeholder vocabulary of ``vocab_size`` tokens. Tensors are written one at a time."""
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    head_dim = layer_dims(config)[0].head_dim
    arrays = {
        "feed_forward_length": [int(layer.plan.ffn) for layer in layers],
        "head_count": [int(layer.heads) for layer in layers],
        "head_count_kv": [int(layer.plan.kv_groups) for layer in layers],
    }
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, hidden))]
    for i, (ffn, heads, kv) in enumerate(zip(*arrays.values())):
        shapes += [
            (f"blk.{i}.attn_norm.weight", (hidden,)),
            (f"blk.{i}.attn_q.weight", (heads * head_dim, hidden)),
            (f"blk.{i}.attn_k.weight", (kv * head_dim, hidden)),
            (f"blk.{i}.attn_v.weight", (kv * head_dim, hidden)),
            (f"blk.{i}.attn_output.weight", (hidden, heads * head_dim)),
            (f"blk.{i}.ffn_norm.weight", (hidden,)),
            (f"blk.{i}.ffn_gate.weight", (ffn, hidden)),
            (f"blk.{i}.ffn_up.weight", (ffn, hidden)),
            (f"blk.{i}.ffn_down.weight", (hidden, ffn)),
        ]
    shapes.append(("output_norm.weight", (hidden,)))
    if not config.get("tie_word_embeddings", False):
        shapes.append(("output.weight", (vocab, hidden)))
    vocabulary = gguf_vocab.GgufVocab(
        model="llama",
        pre="default",
        tokens=[f"<t{i}>" for i in range(vocab)],
        types=[int(gguf.TokenType.NORMAL)] * vocab,
        scores=[0.0] * vocab,
        special=None,
    )
    writer = gguf.GGUFWriter(Path(path), gguf_deci.ARCH)
    gguf_deci.add_hparams(writer, config, arrays, head_dim, "nsc-prune-latency-profile", outtype)
    gguf_vocab.add_vocab(writer, vocabulary)
    types = [gguf_file.stored_type(shape, outtype) for _, shape in shapes]
    for (name, shape), qtype in zip(shapes, types):
        gguf_file.add_tensor_info(writer, name, shape, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    generator = torch.Generator().manual_seed(seed)
    for (name, shape), qtype in zip(shapes, types):
        values = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=generator) * 0.02
        writer.write_tensor_data(gguf_file.gguf_array(values, qtype))
    writer.close()
    return Path(path)


def check_timed_family(config: Mapping[str, Any]) -> None:
    """Refuse a model that llama.cpp does not run as the deci graph timed here: ``extract --format gguf`` writes deci
    files for llama and mistral (SiLU) alone, the other families in llama.cpp's own architectures (other norms,
    activations, fused tensors), so a deci file's times are not theirs."""
    where = "the model's {} for profile --backend llama.cpp"
    fix = (
        "it times deci GGUF files, what extract --format gguf writes for llama and mistral; use --backend transformers"
    )
    if config.get("model_type") not in gguf_deci.MODEL_TYPES:
        expected = f"one of {list(gguf_deci.MODEL_TYPES)}"
        raise UnsupportedArchitectureError(must_be(where.format("model_type"), expected, config.get("model_type"), fix))
    if not gates_with_silu(config):
        expected = "'silu' or 'swish'"
        raise UnsupportedArchitectureError(must_be(where.format("hidden_act"), expected, config["hidden_act"], fix))


def load_gguf(path: str | Path, context: int, batch: int, threads: int | None) -> Any:
    """A ``llama_cpp.Llama`` over ``path`` with room for ``context`` tokens, ``batch`` tokens per forward, on
    ``threads`` threads for decode and prefill alike (None: half the CPUs this process may use, as llama-cpp-python's
    decode default; its prefill default was every core of the machine, quota or affinity aside, and went unrecorded)."""
    llama_cpp = require("llama_cpp", "llamacpp")
    threads = max(usable_cpus() // 2, 1) if threads is None else threads
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=context, n_batch=batch, n_ubatch=batch, verbose=False, n_threads=threads,
        n_threads_batch=threads,
    )  # fmt: skip


def prefill_seconds(llm: Any, tokens: Sequence[int]) -> float:
    """Seconds of one forward pass over ``tokens`` from an empty cache."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(list(tokens))
    return time.perf_counter() - start


def decode_seconds(llm: Any, prompt: Sequence[int], new_tokens: int) -> float:
    """Seconds per token of ``new_tokens`` greedy tokens after ``prompt`` (its pass not counted)."""
    generated = llm.generate(list(prompt), temp=0.0, top_k=1, reset=True)
    next(generated)  # the prompt's pass and the first token
    start = time.perf_counter()
    for _ in range(new_tokens):
        next(generated)
    return (time.perf_counter() - start) / new_tokens


def random_tokens(vocab_size: int, count: int, seed: int) -> list[int]:
    """``count`` token ids drawn uniformly from the vocabulary (speed does not depend on which)."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab_size, count)]


def timer(config: Mapping[str, Any], settings: ProfileSettings) -> profiling.Timer:
    """One run of both phases of a loaded model under ``settings`` (``hf.latency.profiling.time_rounds``'s ``once``)."""
    prefill_ids = random_tokens(int(config["vocab_size"]), settings.prefill_tokens, settings.seed)
    prompt = random_tokens(int(config["vocab_size"]), settings.decode_context, settings.seed + 1)

    def once(llm: Any, warmup: bool) -> dict[str, float]:
        if warmup:
            once(llm, False)
        return {
            "prefill": prefill_seconds(llm, prefill_ids),
            "decode": decode_seconds(llm, prompt, settings.decode_tokens),
        }

    return once


def build_gguf_model(
    path: str | Path, config: Mapping[str, Any], layers: Sequence[LayerShape], settings: ProfileSettings
) -> Any:
    """``write_random_gguf`` of ``layers`` in ``settings``' type, loaded with room for ``settings``' runs."""
    write_random_gguf(path, config, layers, GGUF_TYPE_OF[settings.timed_dtype], settings.seed)
    context = max(settings.prefill_tokens, settings.decode_context + settings.decode_tokens + 1)
    return load_gguf(path, context, settings.prefill_tokens, settings.threads)


def profile_llamacpp(
    space: SearchSpace, config: Mapping[str, Any], model_name: str, settings: ProfileSettings
) -> LatencyTable:
    """``profile_latency`` with llama.cpp (module docstring for the method)."""
    check_timed_family(config)
    llama_cpp = require("llama_cpp", "llamacpp")
    start = time.perf_counter()
    dims = layer_dims(config)
    first = LayerShape(dims[0], space_options(space)[0][0])
    with tempfile.TemporaryDirectory(prefix="nsc-prune-profile-") as folder:
        count = itertools.count()

        def load(layers: Sequence[LayerShape]) -> Any:
            return build_gguf_model(Path(folder) / f"{next(count)}.gguf", config, layers, settings)

        def build_stack(shape: LayerShape) -> Any:
            return load([first] + [shape] * settings.stack)

        reference_model = load([first])
        threads = int(reference_model.n_threads)
        itemsize = 4 if settings.timed_dtype == "float32" else 2
        dense = load([LayerShape.full(d) for d in dims]) if profiling.dense_fits(space, config, itemsize) else None
        measured, reference_time, dense_time = profiling.time_options(
            profiling.option_shapes(space, config),
            build_stack,
            lambda llm: Path(llm.model_path).stat().st_size,
            reference=reference_model,
            dense=dense,
            settings=settings,
            once=timer(config, settings),
        )
        del reference_model, dense
    one_layer = measured[first]
    record = profiling.Measured(
        options=measured,
        without_layers={p: max(0.0, reference_time[p] - one_layer[p]) for p in PHASES},
        without_layers_from="a one-layer model (layer 0 at its first option) less that layer's time",
        dense=dense_time,
        versions={"llama_cpp_python": llama_cpp.__version__, "gguf": version("gguf")},
        machine=profiling.machine_record(llama_cpp_threads=threads),
    )
    return profiling.assemble_table(space, config, model_name, settings, record, start)
