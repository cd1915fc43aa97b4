"""``nsc-prune profile`` on a tiny model: the table covers every option of every layer, the timed models have the
option's exact shapes, a latency budget returns a plan within it, and bad input is one line with nothing written.

With ``--backend llama.cpp``: the random-weight deci GGUF each option is timed as has the option's exact shapes and
types (read back with gguf; runs in CI), bad llama.cpp settings are refused like any bad input, and, marked ``llamacpp`` (skipped without ``llama_cpp``), llama.cpp times
every option of every layer and a latency budget over that table returns a plan within it."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import torch

from nsc_prune.choices import PHASES
from nsc_prune.cli import main
from nsc_prune.core.latency_table import (
    LatencyTable,
    ProfileSettings,
    predicted_seconds,
    space_options,
    usable_cpus,
)
from nsc_prune.core.spec import layer_dims
from nsc_prune.errors import InvalidInputError
from nsc_prune.hf.latency.llamacpp_backend import write_random_gguf
from nsc_prune.hf.latency.profiling import LayerShape, time_rounds
from nsc_prune.hf.latency.transformers_backend import (
    build_timed_model,
    decode_seconds,
    option_config,
    prefill_seconds,
    share_embeddings,
    timer,
)
from nsc_prune.plan import LayerPlan, ParetoDocument
from nsc_prune.planning import resolve_space
from tests.conftest import as_launched_rank

# the tiny LLaMA of tests/fixtures/tiny_llama_config.json, plus "max_position_embeddings"
TINY = {
    **json.loads((Path(__file__).parents[1] / "fixtures" / "tiny_llama_config.json").read_text()),
    "max_position_embeddings": 64,
}
FAST = ["--prefill-tokens", "8", "--decode-context", "4", "--decode-tokens", "2", "--repeats", "1", "--stack", "2"]
SPACE = ["--space", "ffn-heads-depth", "--set", "ffn_step=32"]  # 3 widths x 2 KV groups, + drop (not layer 0)
needs_llamacpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama_cpp is not installed: pip install 'nsc-prune[llamacpp]' (builds llama.cpp, 10-20 min)",
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


@pytest.fixture(scope="module")
def table(tiny_dir, tmp_path_factory):
    """One profile for the module (the tests only read it)."""
    path = tmp_path_factory.mktemp("lut") / "lut.json"
    assert main(["profile", "--model", str(tiny_dir), *SPACE, "--out", str(path), "--quiet", *FAST]) == 0
    return path


def test_the_table_covers_every_option_of_every_layer(tiny_dir, table):
    _, space = resolve_space(str(tiny_dir), "ffn-heads-depth", {"ffn_step": 32})
    read = LatencyTable.read(table)
    assert read.space["options"] == space_options(space)
    assert [len(row) for row in read.layers] == [6, 7, 7]  # 3 widths x 2 KV groups, + drop (never layer 0)
    for labels, row in zip(read.space["options"], read.layers):
        for label, timed in zip(labels, row):
            assert set(timed) == set(PHASES)
            if label.get("keep", True):
                assert all(timed[p] >= 0 for p in PHASES)
            else:
                assert timed == dict.fromkeys(PHASES, 0.0)  # a dropped layer is absent
    # a model without layers takes time; the dense anchor may clamp the fixed part to 0 on a tiny noisy model
    assert all(read.settings["fixed_without_layers"][p] > 0 and read.fixed[p] >= 0 for p in PHASES)
    assert read.backend["device"] == "cpu" and read.backend["versions"]["torch"] == torch.__version__
    assert read.settings["stack"] == 2 and read.settings["distinct_options"] == 6
    assert read.machine["torch_threads"] == torch.get_num_threads()
    # the dense model was timed in the same rounds and anchors the fixed part: its prediction is its time
    assert read.settings["fixed_from"].startswith("the dense model")
    for phase in PHASES:
        if read.fixed[phase] > 0:  # (0 only if the layers' sum alone exceeds the dense time: clamped)
            widest = [0] * len(read.layers)
            assert predicted_seconds(read, widest, phase) == pytest.approx(read.settings["dense_measured"][phase])


def feasible_percentages(table: LatencyTable, phase: str = "decode") -> list[int]:
    """Two budgets (percent of the full model) between the fastest plan and the full model in the DP's integer
    microseconds (a fixed share of a tiny model's timings is noise: fixed percentages could be infeasible)."""
    costs = table.costs(phase)
    fastest = costs.fixed + sum(min(row) for row in costs.layers)
    full = costs.fixed + sum(row[0] for row in costs.layers)
    return sorted({min(100, math.ceil(100 * (fastest + share * (full - fastest)) / full)) for share in (0.4, 0.8)})


def test_a_latency_budget_returns_a_plan_within_it(tiny_dir, table, tmp_path):
    for percent in feasible_percentages(LatencyTable.read(table)):
        out = tmp_path / f"plan-{percent}"
        assert main([
            "--model", str(tiny_dir), *SPACE, "--cost", "latency", "--latency-table", str(table),
            "--budget", f"{percent}%", "--out", str(out), "--no-plot",
        ]) == 0  # fmt: skip
        doc = ParetoDocument.read(out)
        point = doc.points[doc.selected]
        assert point.latency_us <= doc.budget["resolved"] == percent * doc.points[-1].latency_us // 100  # rounded down
        assert doc.cost["latency_table"]["sha256"]


def test_a_space_below_the_model_names_its_widest_plan_in_the_latency_line(tiny_dir, tmp_path, capsys):
    """lonas with ffn_fractions [0.75, 0.5] never holds the model: its latency percentages are of the widest plan,
    which the search's line and profile's called "the full model"."""
    lonas = ["--space", "lonas", "--set", "ffn_fractions=[0.75,0.5]"]
    lut = tmp_path / "lut.json"
    assert main(["profile", "--model", str(tiny_dir), *lonas, "--out", str(lut), "--quiet", *FAST]) == 0
    assert "\nwidest plan predicted: decode " in capsys.readouterr().out
    args = ["--model", str(tiny_dir), *lonas, "--cost", "latency", "--latency-table", str(lut), "--no-plot"]
    assert main([*args, "--budget", "100%", "--out", str(tmp_path / "plan")]) == 0
    out = capsys.readouterr().out
    assert "% of the widest plan's " in out and "the full model" not in out, out


def test_profile_under_a_launcher_is_refused_on_every_rank(tiny_dir, tmp_path, capsys, monkeypatch):
    """Under torchrun every rank timed the whole table on the same device at once, and the others exited 2 leaving
    ``lut.json.kept-N``: one line on rank 0, nothing written."""
    as_launched_rank(monkeypatch, 0)
    args = ["profile", "--model", str(tiny_dir), *SPACE, "--out", str(tmp_path / "lut.json"), *FAST]
    assert main(args) == 2
    assert "profile runs in one process" in capsys.readouterr().err
    as_launched_rank(monkeypatch, 1)
    assert main(args) == 2 and capsys.readouterr().err == ""
    assert list(tmp_path.iterdir()) == []


def test_a_table_for_another_model_or_space_is_refused(tiny_dir, table, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(dict(TINY, hidden_size=96)))
    for model, space in ((other, SPACE), (tiny_dir, ["--space", "ffn-grid", "--set", "ffn_step=32"])):
        out = tmp_path / "out"
        code = main([
            "--model", str(model), *space, "--cost", "latency", "--latency-table", str(table), "--budget", "80%",
            "--out", str(out),
        ])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2 and "was profiled for" in err and len(err.strip().splitlines()) == 1
        assert not out.exists()


def test_the_timed_model_has_the_option_shapes(tiny_dir):
    """What a table entry times is the option the space prices: the stack's parameters equal ``stack`` layers of
    the option's parameter count plus the fixed part."""
    _, space = resolve_space(str(tiny_dir), "ffn-heads", {"ffn_step": 32})
    dims = layer_dims(TINY)[0]
    settings = ProfileSettings(stack=3)
    empty = build_timed_model(option_config(TINY, dims, LayerPlan(ffn=dims.intermediate_size), 0), settings)
    fixed = sum(p.numel() for p in empty.parameters())
    assert fixed == space.subspaces[0].fixed.params
    for option in space.subspaces[0].layers[0]:
        model = build_timed_model(option_config(TINY, dims, option.label, settings.stack), settings)
        assert sum(p.numel() for p in model.parameters()) == fixed + settings.stack * option.params
        assert model.dtype == torch.float32 and not model.training


@pytest.mark.parametrize("tied", [False, True])
def test_a_stack_shares_the_references_embeddings_and_computes_as_with_its_own(tied):
    """Each stack held its own embedding and LM head (at Llama-3-8B shapes 4 GiB of a stack in float32): it now
    holds the reference's, tied ones still tied, and its logits are those of a stack with a copy of them."""
    config = {**TINY, "tie_word_embeddings": tied}
    dims, settings = layer_dims(config)[0], ProfileSettings(stack=2)
    reference = build_timed_model(option_config(config, dims, LayerPlan(ffn=dims.intermediate_size), 0), settings)
    own = build_timed_model(option_config(config, dims, LayerPlan(ffn=64), 2), settings)
    shared = share_embeddings(build_timed_model(option_config(config, dims, LayerPlan(ffn=64), 2), settings), reference)
    assert shared.get_input_embeddings() is reference.get_input_embeddings()
    assert shared.get_output_embeddings() is reference.get_output_embeddings()
    assert (shared.lm_head.weight is shared.model.embed_tokens.weight) == tied
    held = {id(p) for p in reference.parameters()}
    layer = sum(p.numel() for p in shared.model.layers[0].parameters())
    assert sum(p.numel() for p in shared.parameters() if id(p) not in held) == 2 * layer + config["hidden_size"]  # norm
    with torch.no_grad():
        own.model.embed_tokens.weight.copy_(reference.model.embed_tokens.weight)
        own.lm_head.weight.copy_(reference.lm_head.weight)
        ids = torch.randint(0, config["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
        assert torch.equal(shared(ids).logits, own(ids).logits)


def test_profiling_leaves_the_callers_torch_generator_as_it_was(tiny_dir):
    """The timed models' random weights are seeded (``settings.seed``): the caller's generator was reset to it."""
    from nsc_prune.hf.latency.profile import profile_latency

    _, space = resolve_space(str(tiny_dir), "ffn-grid", {"ffn_step": 64})
    settings = ProfileSettings(prefill_tokens=8, decode_context=4, decode_tokens=2, repeats=1, stack=1, threads=1)
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    profile_latency(space, TINY, "tiny", settings)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", ["threads", "repeats"])
def test_a_bool_is_not_a_count_of_threads_or_repeats(name):
    """The library's threads=True was taken as one thread (every other count refused a bool already)."""
    with pytest.raises(InvalidInputError, match=f"--{name} must be a positive integer; got True"):
        ProfileSettings(**{name: True})


def test_an_option_whose_heads_do_not_divide_the_width_is_timed_with_per_layer_heads():
    """6 of 8 query heads at hidden 64: the stock config refused it (64 % 6), so profiling such a space failed."""
    config = {**TINY, "num_attention_heads": 8, "num_key_value_heads": 4}
    dims = layer_dims(config)[0]
    for groups in (1, 2, 3, 4):
        model = build_timed_model(
            option_config(config, dims, LayerPlan(ffn=128, kv_groups=groups), 2), ProfileSettings()
        )
        attention = model.model.layers[1].self_attn
        assert (attention.q_proj.out_features, attention.k_proj.out_features) == (16 * groups, 8 * groups)


def test_a_pruned_base_whose_layers_keep_heads_that_do_not_divide_the_width_is_timed():
    """The global heads of the timed config were the layer's own (6 of 8): LlamaConfig refused 64 % 6."""
    heads = {"num_attention_heads": 6, "num_key_value_heads": 3}
    config = {**TINY, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
              "nsc_per_layer_attention": {str(i): heads for i in range(3)}}  # fmt: skip
    dims = layer_dims(config)[0]
    model = build_timed_model(option_config(config, dims, LayerPlan(ffn=128), 2), ProfileSettings())
    assert model.model.layers[0].self_attn.q_proj.out_features == 48


def test_the_timers_return_one_time_per_run(tiny_dir):
    model = build_timed_model(option_config(TINY, layer_dims(TINY)[0], LayerPlan(ffn=128), 2), ProfileSettings())
    assert len(prefill_seconds(model, batch=2, tokens=8, repeats=3)) == 3
    per_token = decode_seconds(model, context=4, new_tokens=3, repeats=2)
    assert len(per_token) == 2 and all(t > 0 for t in per_token)
    settings = ProfileSettings(prefill_tokens=8, decode_context=4, decode_tokens=2, repeats=3)
    rounds = time_rounds({"a": model, "b": model}, settings, timer(settings))
    assert {key: len(runs) for key, runs in rounds.items()} == {"a": 3, "b": 3}
    assert all(set(run) == set(PHASES) and min(run.values()) > 0 for runs in rounds.values() for run in runs)


def test_a_thread_count_is_timed_with_and_recorded_then_restored(tiny_dir, tmp_path):
    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    if other > usable_cpus():
        pytest.skip("one CPU: no other thread count to time with")
    out = tmp_path / "lut.json"
    assert (
        main(["profile", "--model", str(tiny_dir), "--out", str(out), "--quiet", "--threads", str(other), *FAST]) == 0
    )
    read = LatencyTable.read(out)
    assert read.machine["torch_threads"] == read.settings["threads"] == other
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--device", "tpu"], "invalid choice: 'tpu'"),
        (["--backend", "onnx"], "invalid choice: 'onnx'"),
        (["--repeats", "0"], "--repeats must be a positive integer"),
        (["--threads", "0"], "--threads must be a positive integer"),
        (["--threads", "100000"], "CPUs this process may use; got 100000"),  # was a segfault in OpenBLAS
        (["--space", ""], "unknown space ''"),  # was the lonas space, timed
        (["--space", "no/such.yaml"], "space file no/such.yaml does not exist"),
        (["--space", "ffn-grid.yaml"], "does not exist; did you mean --space ffn-grid (bundled)?"),
        (
            ["--space", "{tmp}/binary.yaml"],
            "binary.yaml is binary or UTF-16 (it has NUL bytes), not UTF-8 text",
        ),  # was a UnicodeDecodeError traceback
        (["--model", "{tmp}/string-context"], "max_position_embeddings must be a positive integer; got '64'"),
        (  # were tracebacks from the first timed model
            ["--model", "{tmp}/pad-past-vocab", *FAST],
            "pad-past-vocab: transformers cannot build a model from config.json: AssertionError: Padding_idx must be",
        ),
        (
            ["--model", "{tmp}/unknown-act", *FAST],
            "unknown-act: transformers cannot build a model from config.json: Key",
        ),
        (["--space", "txl-wt103"], "it takes no model"),
        (["--backend", "llama.cpp", "--device", "cuda"], "--device must be cpu with --backend llama.cpp"),
        (["--backend", "llama.cpp", "--batch-size", "8"], "--batch-size must be 1 with --backend llama.cpp"),
        (  # a deci file was timed as a Gemma 3, whose GGUF is llama.cpp's gemma3 graph
            ["--model", "gemma-3-1b", "--backend", "llama.cpp"],
            "the model's model_type for profile --backend llama.cpp must be one of ['llama', 'mistral']; got "
            "'gemma3_text'. it times deci GGUF files",
        ),
        (["--dtype", "q8_0"], "q8_0 is a GGUF tensor type, not a torch dtype; use --outtype q8_0"),
        (["--outtype", "q8_0"], "--outtype q8_0 is a GGUF tensor type for --backend llama.cpp; use --dtype"),
        (["--backend", "llama.cpp", "--dtype", "float16"], "llama.cpp times GGUF tensor types: use --outtype f16"),
        (["--backend", "llama.cpp", "--dtype", "bfloat16"], "llama.cpp times GGUF tensor types: use --outtype bf16"),
        (["--prefill-tokens", "65"], "--prefill-tokens must be at most the model's max_position_embeddings (64)"),
        (
            ["--prefill-tokens", "8", "--decode-context", "60", "--decode-tokens", "8"],
            "--decode-tokens must be at most",
        ),
    ],
)
def test_bad_profile_input_is_one_line_and_nothing_is_written(tiny_dir, tmp_path, capsys, flags, message):
    out = tmp_path / "lut.json"
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    (tmp_path / "string-context").mkdir()
    config = json.loads((tiny_dir / "config.json").read_text())
    (tmp_path / "string-context" / "config.json").write_text(json.dumps({**config, "max_position_embeddings": "64"}))
    for name, changed in (
        ("pad-past-vocab", {"pad_token_id": config["vocab_size"]}),
        ("unknown-act", {"hidden_act": "x"}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**config, **changed}))
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in flags]
    code = main(["profile", "--model", str(tiny_dir), "--out", str(out), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_quoted_tilde_names_the_same_files_for_the_model_and_the_output(tmp_path, capsys, monkeypatch):
    """--model '~/m/config.json' was read from the home folder while the guard looked for a file named '~': with
    --out '~/m/config.json' --overwrite the table replaced the model's config.json."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home" / "m").mkdir(parents=True)
    (tmp_path / "home" / "m" / "config.json").write_text(json.dumps(TINY))
    argv = ["profile", "--model", "~/m/config.json", "--out", "~/m/config.json", "--overwrite", *FAST]
    assert main(argv) == 2
    assert "--out must not be or contain an input" in capsys.readouterr().err
    assert json.loads((tmp_path / "home" / "m" / "config.json").read_text()) == TINY and not (tmp_path / "~").exists()
    (tmp_path / "home" / "s.yaml").write_text("kind: elastic\nffn_step: 64\n")  # its table was written over it
    argv = ["profile", "--model", "~/m", "--space", "~/s.yaml", "--out", "~/s.yaml", "--overwrite", *FAST]
    assert main(argv) == 2 and "--out must not be or contain an input" in capsys.readouterr().err
    assert (tmp_path / "home" / "s.yaml").read_text() == "kind: elastic\nffn_step: 64\n"


@pytest.mark.parametrize(
    ("widths", "depth"),
    [({"1": 64}, []), ({"0": 1024, "1": 64, "2": 64}, ["--set", "depth=true", "--set", "ffn_min_fraction=0.03"])],
)
def test_the_printed_full_latency_is_what_the_searchs_100_percent_is(tmp_path, capsys, widths, depth):
    """A homogeneous space over layers of other widths: profile printed the model's time as "widest plan", while
    the search's 100 % is the front's widest plan (with depth, not the plan of most parameters, which drops the
    layers that cannot take layer 0's width)."""
    from nsc_prune.core.budget import format_cost

    model = tmp_path / "het"
    model.mkdir()
    per_layer = {layer: {"intermediate_size": width} for layer, width in widths.items()}
    (model / "config.json").write_text(json.dumps({**TINY, "per_layer_config": per_layer}))
    space = ["--space", "ffn-grid", "--set", "homogeneous=true", "--set", "ffn_step=32", *depth]
    lut = tmp_path / "lut.json"
    assert main(["profile", "--model", str(model), *space, "--out", str(lut), "--quiet", "--threads", "1", *FAST]) == 0
    printed = capsys.readouterr().out
    search = ["--model", str(model), *space, "--cost", "latency", "--latency-table", str(lut), "--budget", "100%"]
    assert main([*search, "--json"]) == 0
    full = json.loads(capsys.readouterr().out)["cost"]["full"]
    assert f"widest plan predicted: decode {format_cost(full, 'latency')} per token" in printed, printed


def test_the_space_file_is_an_input_the_table_never_replaces(tiny_dir, tmp_path, capsys):
    """profile --space my.yaml --out my.yaml --overwrite replaced the space YAML with the table."""
    space = tmp_path / "my.yaml"
    space.write_text("space: ffn-grid\nffn_step: 64\n")
    argv = ["profile", "--model", str(tiny_dir), "--space", str(space), "--out", str(space), "--overwrite"]
    assert main(argv) == 2 and "must not be or contain an input" in capsys.readouterr().err
    assert space.read_text() == "space: ffn-grid\nffn_step: 64\n"


def test_an_existing_table_is_replaced_only_with_overwrite(tiny_dir, tmp_path, capsys):
    """docs/outputs.md: the existing table is refused in one line before any timing and left unchanged;
    --overwrite replaces it."""
    out = tmp_path / "lut.json"
    out.write_text("mine")
    argv = ["profile", "--model", str(tiny_dir), "--space", "ffn-grid", "--set", "ffn_step=64", "--out", str(out)]
    capsys.readouterr()
    assert main([*argv, "--quiet", *FAST]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "lut.json already exists; pass --overwrite" in err, err
    assert out.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["lut.json"]
    assert main([*argv, "--quiet", *FAST, "--overwrite"]) == 0
    assert LatencyTable.read(out).layers  # a table now


def test_the_models_own_config_is_never_the_output(tiny_dir, tmp_path, capsys):
    """An --out that is the config.json the command reads is refused even with --overwrite (docs/outputs.md)."""
    model = tmp_path / "model"  # a copy: the module's tiny_dir is shared
    model.mkdir()
    config = model / "config.json"
    config.write_text(before := (tiny_dir / "config.json").read_text())
    argv = ["profile", "--model", str(model), "--space", "ffn-grid", "--set", "ffn_step=64", "--out", str(config)]
    capsys.readouterr()
    assert main([*argv, "--quiet", *FAST, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "must not be or contain an input" in err, err
    assert config.read_text() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present here")
def test_a_gpu_asked_for_where_none_is_present(tiny_dir, tmp_path, capsys):
    out = tmp_path / "lut.json"
    assert main(["profile", "--model", str(tiny_dir), "--device", "cuda", "--out", str(out), *FAST]) == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err and not out.exists()


def test_bfloat16_on_a_gpu_that_only_emulates_it_is_refused_in_one_line(tiny_dir, tmp_path, capsys, monkeypatch):
    """bfloat16, the CUDA default, timed on a GPU below compute capability 8.0 would time an emulation; one line,
    exit 2, nothing written, before any model is built. ``--dtype float16`` gets past the check."""
    import contextlib

    from nsc_prune.hf.latency import transformers_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    out = tmp_path / "lut.json"
    assert main(["profile", "--model", str(tiny_dir), "--device", "cuda", "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "only emulates it" in err and "--dtype float16" in err and not out.exists()
    transformers_backend.check_device(ProfileSettings(device="cuda", dtype="float16"))


# ---------------------------------------------------------------------------------------------- llama.cpp


def _field(reader, key):
    field = reader.get_field(key)
    return [int(field.parts[i][0]) for i in field.data]


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_the_timed_gguf_has_the_option_shapes_and_types(tmp_path, outtype):
    dims = layer_dims(TINY)[0]
    layers = [LayerShape.full(dims), *[LayerShape(dims, LayerPlan(ffn=96, kv_groups=1))] * 2]
    assert [layer.heads for layer in layers] == [4, 2, 2]  # kv groups keep their query heads
    path = write_random_gguf(tmp_path / "m.gguf", TINY, layers, outtype)
    reader = gguf.GGUFReader(path)
    assert _field(reader, "deci.feed_forward_length") == [128, 96, 96]
    assert _field(reader, "deci.attention.head_count") == [4, 2, 2]
    assert _field(reader, "deci.attention.head_count_kv") == [2, 1, 1]
    tensors = {t.name: t for t in reader.tensors}
    shape = {name: tuple(int(d) for d in reversed(t.shape)) for name, t in tensors.items()}  # gguf lists ne0 first
    assert shape["blk.1.attn_q.weight"] == (2 * 16, 64) and shape["blk.1.attn_k.weight"] == (16, 64)
    assert shape["blk.1.ffn_down.weight"] == (64, 96) and shape["blk.0.ffn_up.weight"] == (128, 64)
    assert shape["token_embd.weight"] == (128, 64) and "output.weight" in shape
    assert len(tensors) == 1 + 3 * 9 + 2
    half = gguf.GGMLQuantizationType.F16 if outtype == "f16" else gguf.GGMLQuantizationType.Q8_0
    assert tensors["blk.2.ffn_gate.weight"].tensor_type == half
    assert tensors["blk.2.ffn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    weights = gguf.quants.dequantize(
        tensors["blk.0.ffn_gate.weight"].data, tensors["blk.0.ffn_gate.weight"].tensor_type
    )
    assert 0.015 < float(np.std(weights)) < 0.025  # random, std 0.02: not zeros, not unscaled
    vocab = reader.get_field("tokenizer.ggml.tokens")
    assert len(vocab.data) == TINY["vocab_size"]


def test_llamacpp_missing_names_the_extra(tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if it were not installed
    out = tmp_path / "lut.json"
    assert main(["profile", "--model", str(tiny_dir), "--backend", "llama.cpp", "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err
    assert "nsc-prune[llamacpp]" in err and len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.llamacpp
@needs_llamacpp
def test_llamacpp_times_every_option_and_a_budget_returns_a_plan_within_it(tiny_dir, tmp_path):
    table_path = tmp_path / "lut.json"
    code = main(["profile", "--model", str(tiny_dir), *SPACE, "--backend", "llama.cpp", "--outtype", "q8_0",
                 "--threads", "1", "--out", str(table_path), "--quiet", *FAST])  # fmt: skip
    assert code == 0
    table = LatencyTable.read(table_path)
    _, space = resolve_space(str(tiny_dir), "ffn-heads-depth", {"ffn_step": 32})
    assert table.space["options"] == space_options(space)
    assert [len(row) for row in table.layers] == [6, 7, 7]
    for labels, row in zip(table.space["options"], table.layers):
        for label, timed in zip(labels, row):
            assert set(timed) == set(PHASES) and all(timed[p] >= 0 for p in PHASES)
            if not label.get("keep", True):
                assert timed == dict.fromkeys(PHASES, 0.0)
    assert table.backend["name"] == "llama.cpp" and table.backend["dtype"] == "q8_0"
    assert table.backend["versions"]["llama_cpp_python"] and table.machine["llama_cpp_threads"] == 1
    assert all(table.settings["fixed_without_layers"][p] >= 0 for p in PHASES)
    percent = feasible_percentages(table)[0]
    out = tmp_path / "plan"
    assert main(["--model", str(tiny_dir), *SPACE, "--cost", "latency", "--latency-table", str(table_path),
                 "--budget", f"{percent}%", "--out", str(out), "--no-plot"]) == 0  # fmt: skip
    doc = ParetoDocument.read(out)
    assert doc.points[doc.selected].latency_us <= doc.budget["resolved"]
    assert doc.cost["latency_table"]["backend"]["name"] == "llama.cpp"


@pytest.mark.parametrize("threads", [None, 1])
def test_llama_cpp_prefills_on_the_threads_it_decodes_on_and_records(monkeypatch, tmp_path, threads):
    """Without --threads, llama-cpp-python decoded on half the cores but prefilled on every core of the machine
    (quota and affinity aside), and the table recorded the decode count for both."""
    import types

    from nsc_prune.hf.latency.llamacpp_backend import load_gguf

    made = []
    fake = types.ModuleType("llama_cpp")
    fake.Llama = lambda **kwargs: made.append(kwargs) or types.SimpleNamespace(**kwargs)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    load_gguf(tmp_path / "m.gguf", 64, 16, threads)
    expected = max(usable_cpus() // 2, 1) if threads is None else threads
    assert made[0]["n_threads"] == made[0]["n_threads_batch"] == expected


def test_dtype_and_outtype_together_are_refused(tmp_path, capsys):
    """--outtype won silently."""
    argv = ["profile", "--model", "smollm2-135m", "--space", "ffn-grid", "--backend", "llama.cpp",
            "--dtype", "float16", "--outtype", "q8_0", "--out", str(tmp_path / "t.json")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--dtype and --outtype both given; --backend llama.cpp takes --outtype only" in err and err.count("\n") == 1
    assert not (tmp_path / "t.json").exists()


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
    import types

    gguf = pytest.importorskip("gguf")
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
