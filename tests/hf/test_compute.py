"""Where a streamed base runs (--device) and in which float type (--calib-dtype): the activation scores and the
measured table on the CPU in bfloat16 agree with float32 within bfloat16's round-off; explicit float32 is the
default to the bit; a device or dtype this machine cannot run is refused in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from nsc_prune.errors import ConfigError
from nsc_prune.hf.cut.selection import activation_scores, calibration_ids
from nsc_prune.hf.score.sensitivity import SensitivityConfig, sensitivity_table
from nsc_prune.hf.weights.base import open_base
from nsc_prune.hf.weights.compute import Compute
from nsc_prune.spaces.registry import build_space
from tests.conftest import as_launched_rank


@pytest.mark.parametrize(
    ("device", "dtype", "match"),
    [("tpu", "float32", "--device must be one of"), ("cpu", "float64", "--calib-dtype must be one of")],
)
def test_unknown_device_or_dtype_is_one_line(device, dtype, match):
    with pytest.raises(ConfigError, match=match):
        Compute(device, dtype)


def test_a_device_or_dtype_this_machine_cannot_run_is_refused():
    with pytest.raises(ConfigError, match="float16 is a GPU type"):
        Compute("cpu", "float16").check()
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="--device cuda: torch sees no CUDA GPU"):
            Compute("cuda").check()


@pytest.mark.parametrize("native", [True, False])
def test_bfloat16_on_a_gpu_means_in_hardware(monkeypatch, native):
    """A GPU that only emulates bf16 (V100, T4: torch's ``is_bf16_supported()`` says yes by default) counts as
    having none: the measured table refuses ``--calib-dtype bfloat16`` there, ``eval --dtype auto`` and the heal
    recipe's ``bf16="auto"`` pick float32."""
    import contextlib

    from nsc_prune.eval.runner import resolve_dtype
    from nsc_prune.hf.train.precision import uses_bf16
    from nsc_prune.hf.train.recipe import TrainConfig

    asked = []

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        asked.append(including_emulation)
        return native or including_emulation

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert resolve_dtype("auto", "cuda:1") == ("bfloat16" if native else "float32")
    assert uses_bf16(TrainConfig()) is native
    if native:
        Compute("cuda", "bfloat16").check()
    else:
        with pytest.raises(ConfigError, match="no native bfloat16"):
            Compute("cuda", "bfloat16").check()
    assert asked and not any(asked)


@pytest.fixture
def tiny_with_text(tiny_llama, tmp_path):
    tiny = tiny_llama(lora=False, layers=3, gqa=True)
    rng = random.Random(0)
    calib = tmp_path / "calib.txt"
    calib.write_text(" ".join(f"w{rng.randrange(100)}" for _ in range(1500)))
    return tiny, calib


def test_activation_scores_in_bfloat16_follow_float32(tiny_with_text):
    tiny, calib = tiny_with_text
    base = open_base(tiny.base)
    ids = calibration_ids(tiny.base, calib.read_text(), 512)
    default = activation_scores(base, ids, 64)
    explicit = activation_scores(base, ids, 64, Compute("cpu", "float32"))
    half = activation_scores(base, ids, 64, Compute("cpu", "bfloat16"))
    for (ffn, heads), (ffn32, heads32), (ffn16, heads16) in zip(default, explicit, half, strict=True):
        assert torch.equal(ffn, ffn32) and torch.equal(heads, heads32)
        assert ffn16.dtype == torch.float64 and ffn16.device.type == "cpu"
        assert not torch.equal(ffn16, ffn)  # the layers really ran in bfloat16
        torch.testing.assert_close(ffn16, ffn, rtol=5e-2, atol=1e-3)
        torch.testing.assert_close(heads16, heads, rtol=5e-2, atol=1e-3)


def test_the_measured_table_in_bfloat16_follows_float32(tiny_with_text, tmp_path):
    tiny, calib = tiny_with_text
    base = open_base(tiny.base)
    space = build_space("ffn-heads-depth", base.config, ffn_step=32, protect_layers=[])

    def table(compute: Compute | None, name: str):
        config = SensitivityConfig(str(calib), calib_tokens=512, seq_len=64, probe_tokens=128)
        if compute is not None:
            config = SensitivityConfig(str(calib), calib_tokens=512, seq_len=64, probe_tokens=128, compute=compute)
        return sensitivity_table(space, tiny.base, base.config, config, tmp_path / name, progress=False)

    default, half = table(None, "f32.json"), table(Compute("cpu", "bfloat16"), "bf16.json")
    assert table(Compute("cpu", "float32"), "f32.json").record["cache_hit"]  # float32 is the default's key
    assert half.record["compute"] == {"device": "cpu", "dtype": "bfloat16"} and not half.record["cache_hit"]
    worst = max(max(row) for row in default.errors)
    for row, row16 in zip(default.errors, half.errors, strict=True):
        assert row16 == pytest.approx(row, rel=0.1, abs=0.05 * worst)
    assert half.errors != default.errors  # the probes really ran in bfloat16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_table_and_scores_equal_the_cpu_ones(tiny_with_text, tmp_path):
    from nsc_prune.hf.score.psi_w import layer_weight_tables

    tiny, calib = tiny_with_text
    base = open_base(tiny.base)
    ids = calibration_ids(tiny.base, calib.read_text(), 512)
    for (ffn, heads), (ffn_gpu, heads_gpu) in zip(
        activation_scores(base, ids, 64), activation_scores(base, ids, 64, Compute("cuda")), strict=True
    ):
        torch.testing.assert_close(ffn_gpu, ffn, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(heads_gpu, heads, rtol=1e-4, atol=1e-6)
    cpu = layer_weight_tables(tiny.base, base.config, tmp_path / "cpu")
    gpu = layer_weight_tables(tiny.base, base.config, tmp_path / "gpu", device="cuda")
    for (attn, ffn), (attn_gpu, ffn_gpu) in zip(cpu, gpu, strict=True):
        assert attn_gpu == pytest.approx(attn, rel=1e-9) and ffn_gpu == pytest.approx(ffn, rel=1e-9)


_RANK_SCRIPT = """
import json, sys
from nsc_prune.cli import close_process_group
from nsc_prune.hf.score.sensitivity import SensitivityConfig, sensitivity_table
from nsc_prune.hf.weights.base import open_base
from nsc_prune.spaces.registry import build_space

weights, calib, table, out = sys.argv[1:5]
config = open_base(weights).config
space = build_space("ffn-heads-depth", config, ffn_step=32, protect_layers=[])
result = sensitivity_table(space, weights, config, SensitivityConfig(calib, calib_tokens=512, seq_len=64,
                           probe_tokens=128), table, progress=False)
json.dump({"errors": result.errors, "processes": result.record["processes"]}, open(out, "w"))
close_process_group()  # as the CLI does: a group left to interpreter exit can abort it
"""


def _two_processes(*arguments, timeout: int = 600, **env_vars: str):
    """``torchrun --standalone --nproc_per_node 2 ARGUMENTS`` (gloo, one thread a process), run to its end."""
    import os
    import sys

    from tests.conftest import run_launched

    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_vars}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *map(str, arguments),
    ]
    return run_launched(command, env, timeout)


def _torchrun(tmp_path, script: str, weights, calib, table, out, timeout: int = 600):
    path = tmp_path / "rank.py"
    path.write_text(script)
    return _two_processes(path, weights, calib, table, out, timeout=timeout)


def _one_process_table(tiny, calib, path):
    base = open_base(tiny.base)
    space = build_space("ffn-heads-depth", base.config, ffn_step=32, protect_layers=[])
    config = SensitivityConfig(str(calib), calib_tokens=512, seq_len=64, probe_tokens=128)
    return sensitivity_table(space, tiny.base, base.config, config, path, progress=False)


def _assert_two_processes_built(done, out, single) -> None:
    """The torchrun ``done`` exited 0 and its table (``_RANK_SCRIPT``'s ``out``) is ``single`` within 1e-4."""
    import json

    assert done.returncode == 0, done.stderr[-2000:]
    two = json.loads(out.read_text())
    assert two["processes"] == 2
    worst = max(max(row) for row in single.errors)
    for row, row2 in zip(single.errors, two["errors"], strict=True):
        assert row2 == pytest.approx(row, rel=1e-4, abs=1e-6 * worst)


def test_two_processes_build_the_one_process_table(tiny_with_text, tmp_path):
    """torchrun with 2 gloo processes: each takes every other chunk, the sums are reduced; the table equals the
    one-process table within 1e-4 relative and records how many processes built it."""
    import json

    tiny, calib = tiny_with_text
    single = _one_process_table(tiny, calib, tmp_path / "one.json")
    assert single.record["processes"] == 1
    done = _torchrun(tmp_path, _RANK_SCRIPT, tiny.base, calib, tmp_path / "two.json", tmp_path / "two-out.json")
    _assert_two_processes_built(done, tmp_path / "two-out.json", single)
    assert json.loads((tmp_path / "two.json").read_text())["record"]["processes"] == 2  # rank 0 wrote it, whole


def test_a_table_only_one_rank_has_cached_is_measured_by_all(tiny_with_text, tmp_path):
    """Caches can be per node: when rank 0 finds the table and rank 1 does not, both measure it again (rank 0
    alone returning would leave rank 1 waiting in its first reduction); the table is the one-process table."""
    tiny, calib = tiny_with_text
    single = _one_process_table(tiny, calib, tmp_path / "one.json")
    per_rank = _RANK_SCRIPT.replace(
        "weights, calib, table, out = sys.argv[1:5]",
        "import os\nweights, calib, table, out = sys.argv[1:5]\n"
        "table = table if os.environ['RANK'] == '0' else table + '.absent'",
    )
    done = _torchrun(tmp_path, per_rank, tiny.base, calib, tmp_path / "one.json", tmp_path / "out.json", timeout=240)
    _assert_two_processes_built(done, tmp_path / "out.json", single)


def test_ranks_that_disagree_on_the_inputs_write_nothing(tiny_with_text, tmp_path):
    """Rank 1 reads another calibration text: every rank refuses in one line before measuring; no table."""
    tiny, calib = tiny_with_text
    other = tmp_path / "other.txt"
    other.write_text(calib.read_text()[::-1])
    swap = f"\nimport os\nif os.environ['RANK'] == '1':\n    calib = {str(other)!r}\n"
    script = _RANK_SCRIPT.replace("out = sys.argv[1:5]\n", "out = sys.argv[1:5]\n" + swap)
    done = _torchrun(tmp_path, script, tiny.base, calib, tmp_path / "mixed.json", tmp_path / "out.json")
    assert done.returncode != 0
    assert "the 2 processes disagree on the inputs of the sensitivity table" in done.stderr, done.stderr[-3000:]
    assert "(rank 1 differs from rank 0)" in done.stderr
    assert not (tmp_path / "mixed.json").exists() and not (tmp_path / "out.json").exists()


def test_a_rank_that_dies_leaves_no_table(tiny_with_text, tmp_path):
    """Rank 1 dies in the middle of the measurement (after the block errors, at the first loss probe): torchrun
    stops rank 0, the run fails, and neither the --table file nor any partial file is left behind."""
    tiny, calib = tiny_with_text
    die = (
        "\nimport os\nimport nsc_prune.hf.score.probes as probes\n"
        "if os.environ['RANK'] == '1':\n"
        "    probes._clean_references = lambda *args, **kwargs: os._exit(3)\n"
    )
    script = _RANK_SCRIPT.replace("out = sys.argv[1:5]\n", "out = sys.argv[1:5]\n" + die)
    done = _torchrun(tmp_path, script, tiny.base, calib, tmp_path / "dead.json", tmp_path / "out.json")
    assert done.returncode != 0
    assert "exitcode  : 3" in done.stderr, done.stderr[-3000:]  # torchrun names the rank that died
    assert sorted(path.name for path in tmp_path.iterdir()) == ["calib.txt", "rank.py"]


def test_cli_refuses_a_device_it_cannot_run_and_extract_in_several_processes(
    tiny_with_text, tmp_path, capsys, monkeypatch
):
    from nsc_prune.cli import main

    tiny, calib = tiny_with_text
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    search = ["--model", str(tiny.base), "--space", "ffn-grid", "--budget", "80%", "--set", "ffn_step=16", "--score", "measured",
              "--weights", str(tiny.base), "--calib", str(calib), "--out", str(tmp_path / "plan"), "--no-plot"]  # fmt: skip
    bad = [(["--calib-dtype", "float16"], "float16 is a GPU type")]
    if not torch.cuda.is_available():
        bad.append((["--device", "cuda"], "--device cuda: torch sees no CUDA GPU"))
    for extra, message in bad:
        assert main([*search, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "plan").exists() and not (tmp_path / "cache").exists()
    assert main([*search[:8], "--score", "psi_w", "--weights", str(tiny.base), "--calib-dtype", "bfloat16"]) == 2
    assert "--calib-dtype applies to --score measured" in capsys.readouterr().err

    assert main([*search, "--calib-dtype", "bfloat16", "--quiet"]) == 0
    doc = json.loads((tmp_path / "plan" / "pareto.json").read_text())
    assert doc["score"]["compute"] == {"device": "cpu", "dtype": "bfloat16"} and doc["score"]["processes"] == 1

    as_launched_rank(monkeypatch, 0)
    extract = ["extract", "--pareto", str(tmp_path / "plan"), "--base", str(tiny.base), "--out", str(tmp_path / "c")]
    assert main(extract) == 2
    assert "extract runs in one process" in capsys.readouterr().err and not (tmp_path / "c").exists()
    as_launched_rank(monkeypatch, 1)  # every rank refuses alike: rank 0 alone prints it
    assert main(extract) == 2
    assert capsys.readouterr().err == "" and not (tmp_path / "c").exists()


def test_a_two_process_search_writes_one_pareto_json_that_says_so(tiny_with_text, tmp_path):
    tiny, calib = tiny_with_text
    out = tmp_path / "plan"
    done = _two_processes("-m", "nsc_prune", "--model", tiny.base, "--space", "ffn-grid", "--budget", "80%",
                          "--set", "ffn_step=16", "--score", "measured", "--weights", tiny.base, "--calib", calib,
                          "--calib-tokens", "512", "--calib-seq-len", "64", "--out", out, "--no-plot", "--quiet",
                          NSC_PRUNE_CACHE=str(tmp_path / "cache"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote ") == 1 and "2 processes" in done.stdout  # one rank prints and writes
    doc = json.loads((out / "pareto.json").read_text())
    assert doc["score"]["processes"] == 2 and sorted(p.name for p in out.iterdir()) == ["pareto.json"]


_SPLIT_FLAGS_SCRIPT = """
import os, sys
from nsc_prune.cli import main

flags = sys.argv[1:]
if os.environ["RANK"] == "1":  # a flag lost on one node: rank 1 searches psi_MP, or does not refine
    flags = flags[:-2]
sys.exit(main(flags))
"""


@pytest.mark.parametrize("rank_0_only", [["--score", "measured"], ["--refine", "2"]])
def test_ranks_launched_with_other_flags_stop_in_one_line(tiny_with_text, tmp_path, rank_0_only):
    """Rank 1 without ``--score measured`` never joined the group and left rank 0 waiting in it for good; without
    ``--refine`` it left rank 0 to die in a gloo traceback. Every rank now compares its flags first."""
    tiny, calib = tiny_with_text
    script = tmp_path / "rank.py"
    script.write_text(_SPLIT_FLAGS_SCRIPT)
    measured = ["--weights", tiny.base, "--calib", calib, "--calib-tokens", "512", "--calib-seq-len", "64"]
    if rank_0_only[0] == "--refine":
        measured = ["--score", "measured", *measured]
    done = _two_processes(script, "--model", tiny.base, "--space", "ffn-grid", "--budget", "80%", "--set",
                          "ffn_step=16", "--out", tmp_path / "plan", "--no-plot", "--quiet", *measured, *rank_0_only,
                          timeout=180, NSC_PRUNE_CACHE=str(tmp_path / "cache"))  # fmt: skip
    assert done.returncode != 0
    line = "nsc-prune: error: the 2 processes disagree on the flags of the search (rank 1 differs from rank 0) in "
    line += rank_0_only[0]
    assert done.stderr.count(line) == 1 and "RuntimeError" not in done.stderr, done.stderr[-3000:]  # not gloo's
    assert not (tmp_path / "plan").exists() and not (tmp_path / "cache").exists()


_GROUP_SCRIPT = """
import os, sys
from transformers import AutoTokenizer
from nsc_prune.cli import close_process_group
from nsc_prune.hf.ranks import current_ranks
from nsc_prune.hf.train.launch import trainer_ranks
ranks = current_ranks() if sys.argv[1] == "ours" else trainer_ranks()
AutoTokenizer.from_pretrained(sys.argv[2])  # imports torch.distributed.nn, whose defaults name the group
ranks.sum_floats([1.0])
close_process_group()
threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
assert not [name for name in threads if "gloo" in name], threads
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="lists a process's threads from Linux's /proc")
@pytest.mark.parametrize("joined_by", ["ours", "accelerate"])
def test_a_closed_process_group_leaves_no_gloo_thread_to_abort_the_exit(tiny_with_text, tmp_path, joined_by):
    """A group that outlives ``close_process_group`` keeps gloo's worker threads to interpreter shutdown, where
    one still freeing a collective's tensors aborts a finished rank (1 two-process search in 6 to 50 failed so)."""
    tiny, _ = tiny_with_text
    script = tmp_path / "group.py"
    script.write_text(_GROUP_SCRIPT)
    done = _two_processes(script, joined_by, tiny.base, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


_PSI_W_SCRIPT = """
import json, os, sys
import nsc_prune.hf.score.psi_w as psi_w
from nsc_prune.cli import main
layers, compute = set(), psi_w._CachedReader.compute
def counted(self, config, layer, *args):
    layers.add(layer)
    return compute(self, config, layer, *args)
psi_w._CachedReader.compute = counted
if os.environ.get("OTHER_WEIGHTS_ON_RANK") == os.environ["RANK"]:  # as if this rank read another folder
    import nsc_prune.hf.weights.fingerprint as fingerprint
    fingerprint.weights_fingerprint = lambda *args: "other weights"
code = main(sys.argv[1:])
json.dump({"code": code, "layers": sorted(layers)}, open(sys.argv[-1] + ".rank%s.json" % os.environ["RANK"], "w"))
"""


def test_psi_w_in_two_processes_shares_the_layers_and_equals_one_process(tiny_with_text, tmp_path, monkeypatch):
    """torchrun with 2 gloo processes, ``--score psi_w``: each rank reads and factorises every other layer's
    weights, both get every layer, and the front rank 0 writes is the one-process front."""
    from nsc_prune.cli import main

    tiny, _ = tiny_with_text
    search = ["--model", str(tiny.base), "--space", "ffn-grid", "--budget", "80%", "--set", "ffn_step=16",
              "--score", "psi_w", "--weights", str(tiny.base), "--no-plot", "--quiet", "--out"]  # fmt: skip
    script = tmp_path / "psi_w.py"
    script.write_text(_PSI_W_SCRIPT)
    done = _two_processes(script, *search, tmp_path / "two", timeout=300, NSC_PRUNE_CACHE=str(tmp_path / "two-cache"))
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"two.rank{rank}.json").read_text()) for rank in (0, 1)]
    layers = open_base(tiny.base).config["num_hidden_layers"]
    assert layers >= 2 and [r["code"] for r in ranks] == [0, 0]
    assert [r["layers"] for r in ranks] == [list(range(0, layers, 2)), list(range(1, layers, 2))]
    two = json.loads((tmp_path / "two" / "pareto.json").read_text())
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "one-cache"))
    assert main([*search, str(tmp_path / "one")]) == 0
    one = json.loads((tmp_path / "one" / "pareto.json").read_text())
    assert (two["score"]["processes"], one["score"]["processes"]) == (2, 1)
    assert [p["layers"] for p in two["points"]] == [p["layers"] for p in one["points"]]
    assert [p["nsc"] for p in two["points"]] == pytest.approx([p["nsc"] for p in one["points"]], rel=1e-12)


def test_psi_w_ranks_with_other_weights_stop_in_one_line_before_any_compute(tiny_with_text, tmp_path):
    tiny, _ = tiny_with_text
    script = tmp_path / "psi_w.py"
    script.write_text(_PSI_W_SCRIPT)
    done = _two_processes(script, "--model", tiny.base, "--space", "ffn-grid", "--budget", "80%", "--set", "ffn_step=16",
                          "--score", "psi_w", "--weights", tiny.base, "--no-plot", "--quiet", "--out", tmp_path / "two", timeout=300,
                          NSC_PRUNE_CACHE=str(tmp_path / "cache"), OTHER_WEIGHTS_ON_RANK="1")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]  # (the script itself exits 0 whatever main returned)
    ranks = [json.loads((tmp_path / f"two.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["code"] for r in ranks] == [2, 2] and [r["layers"] for r in ranks] == [[], []]
    assert "the 2 processes disagree on the weights of --score psi_w (rank 1 differs from rank 0)" in done.stderr
    assert not (tmp_path / "two").exists() and not (tmp_path / "cache" / "psi_w").exists()
