"""How a latency profile times its models and costs an option, with fake clocks and a fake llama.cpp: round order
and warm-up, the fastest run, the stack's division, the dense anchor across batches, and the timers' units."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nsc_prune.core.latency_table import ProfileSettings

torch = pytest.importorskip("torch")


def test_each_model_is_warmed_up_once_then_timed_in_turn_and_keeps_its_fastest_run():
    from nsc_prune.hf.latency.profiling import fastest, time_rounds

    calls, runs = [], iter([(5.0, 9.0), (1.0, 1.0), (2.0, 6.0), (3.0, 1.0), (4.0, 7.0), (1.5, 1.0)])

    def once(model, warmup):
        calls.append((model, warmup))
        prefill, decode = next(runs)
        return {"prefill": prefill, "decode": decode}

    rounds = time_rounds({"a": "A", "b": "B"}, ProfileSettings(repeats=3), once)
    assert calls == [("A", True), ("B", True), ("A", False), ("B", False), ("A", False), ("B", False)]
    assert fastest(rounds) == {"a": {"prefill": 2.0, "decode": 6.0}, "b": {"prefill": 1.0, "decode": 1.0}}


def test_an_options_cost_is_its_stacks_time_less_the_references_per_layer(monkeypatch):
    """(t(stack) - t(reference)) / stack; the dense model's time from the first batch survives the later ones; the
    reference's time is its fastest over every batch."""
    from nsc_prune.choices import PHASES
    from nsc_prune.hf.latency import profiling

    reference = iter([2.0, 3.0])  # the reference is slower in the second batch

    def time_models(models, settings, once):
        times = {"reference": next(reference), "dense": 10.0, "s0": 5.0, "s1": 7.0}
        return {name: dict.fromkeys(PHASES, times[name]) for name in models}

    monkeypatch.setattr(profiling, "time_models", time_models)
    monkeypatch.setattr(profiling, "MAX_TIMED_BYTES", 100)
    sizes = {"reference": 10, "dense": 30, "s0": 60, "s1": 60}  # one stack a batch
    measured, without_layers, dense = profiling.time_options(
        {"s0", "s1"}, lambda shape: shape, sizes.__getitem__, "reference", "dense", ProfileSettings(stack=4), None
    )
    assert measured == {"s0": dict.fromkeys(PHASES, 0.75), "s1": dict.fromkeys(PHASES, 1.0)}  # each its own batch
    assert without_layers == dict.fromkeys(PHASES, 2.0)
    assert dense == dict.fromkeys(PHASES, 10.0)


def test_prefill_is_seconds_a_pass_and_decode_seconds_a_token_after_their_warm_up(monkeypatch):
    """A fake model whose every forward takes one second of a fake clock."""
    from nsc_prune.hf.latency import transformers_backend as backend

    clock, calls = [0.0], []

    class OneSecond:
        config, device = SimpleNamespace(vocab_size=10), torch.device("cpu")

        def __call__(self, ids, **kwargs):
            clock[0] += 1.0
            calls.append(tuple(ids.shape))
            return SimpleNamespace(logits=torch.zeros(ids.shape[0], ids.shape[1], 10), cache=None)

    monkeypatch.setattr(backend, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    assert backend.prefill_seconds(OneSecond(), batch=2, tokens=8, repeats=3) == [1.0] * 3
    assert len(calls) == 4 and calls[0] == (2, 8)  # one warm-up pass, not timed
    calls.clear()
    assert backend.prefill_seconds(OneSecond(), batch=2, tokens=8, repeats=3, warmup=False) == [1.0] * 3
    assert len(calls) == 3
    calls.clear()
    assert backend.decode_seconds(OneSecond(), context=4, new_tokens=5, repeats=2) == [1.0, 1.0]  # per token
    assert calls.count((1, 4)) == 3 and calls.count((1, 1)) == 15  # a warm-up decode, then two timed


def test_the_transformers_timer_reads_each_phase_from_its_own_timer(monkeypatch):
    from nsc_prune.hf.latency import transformers_backend as backend

    monkeypatch.setattr(backend, "prefill_seconds", lambda model, *args: [("prefill", *args)])
    monkeypatch.setattr(backend, "decode_seconds", lambda model, *args: [("decode", *args)])
    s = ProfileSettings(batch=2, prefill_tokens=8, decode_context=4, decode_tokens=3, seed=5)
    assert backend.timer(s)(None, True) == {
        "prefill": ("prefill", 2, 8, 1, 5, True),
        "decode": ("decode", 4, 3, 1, 5, True),
    }


def test_the_llamacpp_timer_warms_up_with_one_untimed_run(monkeypatch):
    from nsc_prune.hf.latency import llamacpp_backend as backend

    runs = []
    monkeypatch.setattr(backend, "prefill_seconds", lambda llm, ids: runs.append(("prefill", len(ids))) or len(runs))
    monkeypatch.setattr(
        backend, "decode_seconds", lambda llm, ids, n: runs.append(("decode", len(ids), n)) or len(runs)
    )
    once = backend.timer({"vocab_size": 128}, ProfileSettings(prefill_tokens=8, decode_context=4, decode_tokens=3))
    assert once(None, True) == {"prefill": 3, "decode": 4}  # the warm-up's times (1, 2) are not returned
    assert runs == [("prefill", 8), ("decode", 4, 3)] * 2
    assert once(None, False) == {"prefill": 5, "decode": 6}


def test_llamacpp_costs_an_option_as_its_stack_above_the_one_layer_reference(monkeypatch, tmp_path):
    """A fake llama_cpp whose model takes 1 s plus 1 s per 64 FFN channels of its file: an option of width f costs
    f / 64, the model without layers 1 s (the one-layer reference less its layer), whatever the stack."""
    import json
    import sys
    import types
    from pathlib import Path

    gguf = pytest.importorskip("gguf")
    from nsc_prune.choices import PHASES
    from nsc_prune.core.latency_table import space_options
    from nsc_prune.hf.latency import profiling
    from nsc_prune.hf.latency.llamacpp_backend import profile_llamacpp
    from nsc_prune.spaces.registry import build_space

    config = {**json.loads((Path(__file__).parents[1] / "fixtures" / "tiny_llama_config.json").read_text()),
              "max_position_embeddings": 64}  # fmt: skip

    class Llama:
        def __init__(self, model_path, n_threads, **kwargs):
            field = gguf.GGUFReader(model_path).get_field("deci.feed_forward_length")
            self.model_path, self.n_threads = model_path, n_threads
            self.seconds = 1.0 + sum(int(field.parts[i][0]) for i in field.data) / 64

    fake = types.ModuleType("llama_cpp")
    fake.Llama, fake.__version__ = Llama, "fake"
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    monkeypatch.setattr(
        profiling,
        "time_models",
        lambda models, s, once: {k: dict.fromkeys(PHASES, m.seconds) for k, m in models.items()},
    )
    space = build_space("ffn-grid", config, ffn_step=32)
    settings = ProfileSettings(backend="llama.cpp", stack=3, threads=1)
    table = profile_llamacpp(space, config, "tiny", settings)
    for labels, row in zip(space_options(space), table.layers):
        assert [timed["prefill"] for timed in row] == [plan.ffn / 64 for plan in labels]
    assert table.settings["fixed_without_layers"] == dict.fromkeys(PHASES, 1.0)
    assert table.fixed == dict.fromkeys(PHASES, 1.0)  # the dense model (7 s) less its three layers (2 s each)
