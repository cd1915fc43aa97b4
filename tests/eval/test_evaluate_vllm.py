"""``nsc-prune eval --backend vllm`` (issue 14): argument plumbing into lm-eval's VLLM, and refusals.

vLLM is not installed here (it needs a CUDA GPU), so the tests put a fake ``vllm`` module in ``sys.modules`` and
replace ``lm_eval.models.vllm_causallms.VLLM`` (``nsc_prune.eval.runner.vllm_class``) with a fake that records its
arguments and evaluates with lm-eval's HFLM on the same folder, so the results must equal ``--backend hf``'s.
"""

from __future__ import annotations

import importlib.machinery
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
lm_eval = pytest.importorskip("lm_eval")

from test_evaluate import char_tokenizer, run_cli

from nsc_prune.errors import InvalidInputError
from nsc_prune.eval import runner
from nsc_prune.eval.runner import EvalConfig
from nsc_prune.hf.extract import ExtractOptions, extract_subnet
from nsc_prune.hf.weights.loading import load_pruned

PLAN = [{"ffn": 96, "kv_groups": 2}, {"ffn": 0, "kv_groups": 0, "keep": False}, {"ffn": 40, "kv_groups": 1}]


@pytest.fixture
def folders(tmp_path, tiny_llama, write_plan):
    """base (stock llama), nas (--format nemotron-nas) and pruned (default format, per-layer widths and heads)."""
    tiny = tiny_llama(gqa=True, lora=False)
    char_tokenizer().save_pretrained(tiny.base)
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    out = {"base": tiny.base}
    for fmt in ("nemotron-nas", "pruned"):
        out[fmt] = extract_subnet(
            plan, tiny.base, tmp_path / fmt, point=0, options=ExtractOptions(dtype="float32", format=fmt)
        )
    return out


@pytest.fixture
def fake_vllm(monkeypatch):
    """A fake vllm package (found by find_spec) and a fake VLLM class; returns the list of its calls' kwargs."""
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setitem(sys.modules, "vllm", module)
    calls = []

    class FakeVLLM(HFLM):
        def __init__(self, pretrained, **kwargs):
            calls.append({"pretrained": pretrained, **kwargs})
            super().__init__(
                pretrained=load_pruned(pretrained),
                tokenizer=AutoTokenizer.from_pretrained(pretrained),
                batch_size=kwargs["batch_size"],
            )

    monkeypatch.setattr(runner, "vllm_class", lambda: FakeVLLM)
    return calls


def test_without_vllm_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # find_spec("vllm") is None, installed or not
    code, out, err = run_cli(
        ["eval", str(tmp_path / "nowhere"), "--backend", "vllm", "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and out == ""
    assert err == (
        "nsc-prune: error: --backend vllm needs vllm, which is not installed: pip install 'nsc-prune[vllm]' (or pip "
        "install vllm; vLLM runs on CUDA GPUs), or use the default --backend hf\n"
    )  # the missing checkpoint folder is not even looked at
    assert not (tmp_path / "o").exists()


def test_a_vllm_too_old_for_nemotron_nas_widths_is_one_line(tmp_path, fake_vllm, capsys, monkeypatch):
    """vLLM before 0.14 reads a nemotron-nas block's FFN width only from ``ffn_mult`` and fails on the checkpoints
    extract writes (``intermediate_size``): refused in one line, before any work; 0.14 passes the check."""
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.13.0" if name == "vllm" else "1")
    code, out, err = run_cli(["eval", str(tmp_path / "nowhere"), "--backend", "vllm"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "needs vllm >= 0.14" in err and "found 0.13.0" in err and "pip install -U 'vllm>=0.14'" in err
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.14.0")
    runner.require_vllm()


def test_flags_reach_vllm_and_results_equal_hf(tmp_path, folders, fake_vllm, capsys):
    args = ["--tasks", "boolq_offline", "--limit", "4", "--batch-size", "2", "--seed", "7"]  # vLLM: its own GPUs
    vllm_flags = [
        "--backend",
        "vllm",
        "--tensor-parallel-size",
        "2",
        "--data-parallel-size",
        "3",
        "--gpu-memory-utilization",
        "0.5",
        "--max-model-len",
        "128",
    ]
    paths = [str(folders["base"]), str(folders["nemotron-nas"])]
    code, _, err = run_cli(["eval", *paths, *args, *vllm_flags, "--out", str(tmp_path / "v")], capsys)
    assert code == 0, err
    assert [call["pretrained"] for call in fake_vllm] == paths
    for call, trusted in zip(fake_vllm, (False, True)):  # remote code only for nsc-prune's own nemotron-nas files
        assert call["trust_remote_code"] is trusted
        assert {
            k: call[k]
            for k in (
                "tensor_parallel_size",
                "data_parallel_size",
                "gpu_memory_utilization",
                "max_model_len",
                "seed",
                "batch_size",
            )
        } == {
            "tensor_parallel_size": 2,
            "data_parallel_size": 3,
            "gpu_memory_utilization": 0.5,
            "max_model_len": 128,
            "seed": 7,
            "batch_size": 2,
        }
    vllm_doc = json.loads((tmp_path / "v" / "results.json").read_text())
    assert vllm_doc["config"]["backend"] == "vllm" and vllm_doc["device"] == "vllm"
    assert run_cli(["eval", *paths, *args, "--device", "cpu", "--out", str(tmp_path / "h")], capsys)[0] == 0
    hf_doc = json.loads((tmp_path / "h" / "results.json").read_text())
    assert hf_doc["config"]["backend"] == "hf" and len(fake_vllm) == 2  # the default backend never calls vLLM
    for v, h in zip(vllm_doc["checkpoints"], hf_doc["checkpoints"]):
        assert v["params"] == h["params"]
        drop = ("wall_s",)
        assert {t: {k: x for k, x in r.items() if k not in drop} for t, r in v["results"].items()} == {
            t: {k: x for k, x in r.items() if k not in drop} for t, r in h["results"].items()
        }
        assert v["results"]["boolq_offline"]["acc"] is not None


def test_what_vllm_cannot_load_is_refused_before_any_model(tmp_path, folders, fake_vllm, capsys):
    base = str(folders["base"])
    code, _, err = run_cli(
        [
            "eval",
            base,
            str(folders["pruned"]),
            "--backend",
            "vllm",
            "--tasks",
            "boolq_offline",
            "--out",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    assert code == 2 and err.count("\n") == 1 and "re-extract it with nsc-prune extract --format nemotron-nas" in err
    nas = folders["nemotron-nas"]
    (nas / "modeling_nsc_decilm.py").write_text((nas / "modeling_nsc_decilm.py").read_text() + "\nimport os\n")
    code, _, err = run_cli(
        ["eval", base, str(nas), "--backend", "vllm", "--tasks", "boolq_offline", "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "modeling_nsc_decilm.py is missing or not nsc-prune's" in err
    assert fake_vllm == [] and not (tmp_path / "o").exists()


def test_a_modeling_file_an_earlier_release_shipped_is_still_nsc_prunes(folders, tmp_path):
    """A fix to the DeciLM class (its cache, 2026-12-06) refused every nemotron-nas checkpoint written before it."""
    from nsc_prune.eval.checkpoints import vllm_remote_code

    nas = folders["nemotron-nas"]
    modeling = "nsc_prune/hf/modeling/modeling_nsc_decilm.py"
    for commit in ("673e7bd", "89fd330", "38bbf27", "19503b1"):  # the files earlier commits shipped, from the history
        try:
            earlier = subprocess.run(
                ["git", "-C", str(Path(__file__).parents[2]), "show", f"{commit}:{modeling}"],
                capture_output=True,
                check=True,
            )
        except (OSError, subprocess.CalledProcessError):
            pytest.skip("no git history here")
        (nas / "modeling_nsc_decilm.py").write_bytes(earlier.stdout)
        assert vllm_remote_code(nas) is True


@pytest.mark.parametrize("tamper", ["auto_map", "tokenizer auto_map", "other code"])
def test_remote_code_is_trusted_only_when_it_is_nsc_prunes_alone(folders, tamper):
    """The shipped files were compared, but config.json's auto_map could name another module beside them (it ran,
    under trust_remote_code), and vLLM passes the flag to the tokenizer too."""
    from nsc_prune.eval.checkpoints import vllm_remote_code

    nas = folders["nemotron-nas"]
    assert vllm_remote_code(nas) is True
    (nas / "other.py").write_text("print('not nsc-prune')\n")
    if tamper == "auto_map":
        config = json.loads((nas / "config.json").read_text())
        config["auto_map"]["AutoConfig"] = "other.DeciLMConfig"
        (nas / "config.json").write_text(json.dumps(config))
        message = "config.json's auto_map is .*other.DeciLMConfig.*, not the shipped DeciLM classes"
    elif tamper == "tokenizer auto_map":
        (nas / "other.py").unlink()
        tokenizer = json.loads((nas / "tokenizer_config.json").read_text())
        (nas / "tokenizer_config.json").write_text(
            json.dumps({**tokenizer, "auto_map": {"AutoTokenizer": ["other.T", None]}})
        )
        message = "tokenizer_config.json has an auto_map"
    else:
        message = r"it holds other Python files \(other.py\)"
    with pytest.raises(InvalidInputError, match=message + ".*trusts only nsc-prune's own remote code"):
        vllm_remote_code(nas)


def test_a_tensor_parallel_size_the_layers_do_not_divide_is_one_line(tmp_path, folders, fake_vllm, capsys):
    """vLLM splits heads and FFN channels over the GPUs and asserts deep inside its loader when they do not divide;
    the check names the layers first (the nemotron-nas checkpoint: 4 query heads; KV heads 2 and 1, FFN widths 96 and
    40)."""
    from nsc_prune.eval.checkpoints import check_tensor_parallel

    nas = folders["nemotron-nas"]
    argv = ["eval", str(nas), "--backend", "vllm", "--tasks", "boolq_offline", "--tensor-parallel-size", "3"]
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.count("\n") == 1 and "cannot be split over --tensor-parallel-size 3" in err
    assert (
        "3: 4 query heads, layer 0's 2 KV heads, layer 2's FFN width 40 (" in err
        and fake_vllm == []
        and not (tmp_path / "o").exists()
    )
    for size in (1, 2, 4):  # 4 heads; KV heads 2 and 1 divide 2 and 4
        check_tensor_parallel(nas, size)
    check_tensor_parallel(folders["base"], 3)  # a stock checkpoint is vLLM's own to check


def test_vllm_flags_without_the_backend_are_refused(tmp_path, capsys):
    code, _, err = run_cli(["eval", str(tmp_path), "--tensor-parallel-size", "2"], capsys)
    assert code == 2 and "backend (for tensor_parallel_size) must be 'vllm'; got 'hf'" in err
    with pytest.raises(InvalidInputError, match="gpu_memory_utilization must be a fraction"):
        EvalConfig(backend="vllm", gpu_memory_utilization=1.5)
    with pytest.raises(InvalidInputError, match="device_map with backend 'vllm' must be None"):
        EvalConfig(backend="vllm", device_map="auto")
    for device in ("cpu", "cuda:3"):  # was accepted, ignored, and results.json said device "vllm"
        with pytest.raises(InvalidInputError, match=f"device with backend 'vllm' must be auto or cuda; got '{device}'"):
            EvalConfig(backend="vllm", device=device)
    assert EvalConfig(backend="vllm", device="cuda").device == "cuda"
