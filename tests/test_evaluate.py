"""Zero-shot evaluation (issue 5): numbers equal lm-eval's own, Avg8/recovery, offline tasks, bad input.

Models are tiny random LLaMAs (tests/conftest.py) with a character-level tokenizer, so prompts map to
distinct tokens; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
lm_eval = pytest.importorskip("lm_eval")

from nsc_prune.cli import main  # noqa: E402
from nsc_prune.errors import ConfigError, InvalidInputError  # noqa: E402
from nsc_prune.evaluate import (  # noqa: E402
    EvalConfig, checkpoint_labels, evaluate_checkpoints, find_base, render_markdown, summarise, task_record,
)  # fmt: skip
from nsc_prune.extract import ExtractOptions, extract_subnet  # noqa: E402
from nsc_prune.tasks import (  # noqa: E402
    ALIASES, COMMONSENSE8, average, avg_label, evals_dir, headline_metric, render_offline_tasks, resolve_tasks,
)  # fmt: skip

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = ALIASES["commonsense8_offline"]
PRUNED_PLAN = [{"ffn": 96}, {"ffn": 40}, {"ffn": 64}]


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
                model="hf", model_args={"pretrained": str(path), "dtype": "float32", "trust_remote_code": True},
                tasks=["commonsense8_offline"], task_manager=manager, limit=6, batch_size=1, device="cpu",
                num_fewshot=0,
            )
            for label, path in (("base", base), ("pruned", pruned))
        }  # fmt: skip
    assert doc["tasks"] == list(OFFLINE) and doc["base"] == "base" and doc["avg_label"] == "Avg8"
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
    avgs = [sum(reference[k]["results"][t][f"{headline_metric(t)},none"] for t in OFFLINE) / 8 for k in ("base", "pruned")]
    assert [c["avg"] for c in doc["checkpoints"]] == pytest.approx(avgs, rel=1e-12)
    assert doc["checkpoints"][1]["recovery"] == pytest.approx(avgs[1] / avgs[0], rel=1e-12)
    assert doc["checkpoints"][0]["recovery"] == pytest.approx(1.0)
    written = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert written == json.loads(json.dumps(doc))
    assert (tmp_path / "eval" / "results.md").read_text() == render_markdown(doc)


def test_results_schema_is_stable(tmp_path, checkpoints):
    base, _ = checkpoints
    doc = evaluate_checkpoints([base], EvalConfig(tasks=("piqa_offline",), limit=2, device="cpu"), progress=False)
    assert set(doc) == {"schema", "provenance", "config", "device", "dtype", "tasks", "task_info", "avg_label", "base", "checkpoints"}
    assert doc["schema"] == "nsc-prune/eval-results/1" and doc["base"] is None
    assert {"lm_eval_version", "transformers_version", "torch_version", "nsc_prune_version", "command"} <= set(doc["provenance"])
    ckpt = doc["checkpoints"][0]
    assert set(ckpt) == {"label", "path", "params", "load_s", "wall_s", "results", "avg", "recovery"}
    assert set(ckpt["results"]["piqa_offline"]) == {
        "acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "metric", "n", "n_total", "version", "wall_s", "requests",
    }  # fmt: skip
    assert ckpt["results"]["piqa_offline"]["requests"] == 4 and ckpt["recovery"] is None
    info = doc["task_info"]["piqa_offline"]
    assert info["canonical"] == "piqa" and info["source"] == str(evals_dir() / "tasks" / "piqa_offline.yaml")
    assert set(info["data_sha256"]) == {"piqa.jsonl"}


# ------------------------------------------------------------------------------ Avg8 and recovery


def _ckpt(label, values):
    """A checkpoint record with acc = values[t], acc_norm = values[t] + 0.1 (so the pick is visible)."""
    return {"label": label, "params": 1, "results": {
        t: {"acc": v, "acc_norm": v + 0.1, "metric": headline_metric(t)} for t, v in values.items()}}  # fmt: skip


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
    [("boolq", "acc"), ("piqa", "acc"), ("social_iqa", "acc"), ("hellaswag", "acc_norm"), ("winogrande", "acc"),
     ("arc_easy", "acc"), ("arc_challenge", "acc_norm"), ("openbookqa", "acc_norm"), ("hellaswag_offline", "acc_norm"),
     ("social_iqa_bigbench", "acc"), ("arc_challenge_offline", "acc_norm"), ("mmlu", "acc")],
)  # fmt: skip
def test_headline_metric_convention(task, metric):
    assert headline_metric(task) == metric
    assert headline_metric(task, ["exact_match"]) == "exact_match"  # a task without acc falls back


def test_avg_label_and_average():
    assert avg_label(list(COMMONSENSE8)) == "Avg8" and avg_label(list(OFFLINE)) == "Avg8"
    assert avg_label(list(COMMONSENSE8[:7])) == "Avg" and avg_label([*COMMONSENSE8[:7], "mmlu"]) == "Avg"
    assert average({"a": {"acc": None, "metric": "acc"}, "b": {"acc": 0.5, "metric": "acc"}}) is None


def test_task_record_reads_lm_eval_output():
    raw = {  # the shape simple_evaluate returns
        "results": {"boolq": {"alias": "boolq", "acc,none": 0.75, "acc_stderr,none": "N/A", "sample_len": 4}},
        "n-samples": {"boolq": {"original": 3270, "effective": 4}},
        "versions": {"boolq": 2.0},
    }
    assert task_record(raw, "boolq") == {
        "acc": 0.75, "acc_stderr": None, "metric": "acc", "n": 4, "n_total": 3270, "version": 2.0,
    }  # fmt: skip


def test_markdown_table_shape():
    doc = {
        "tasks": ["boolq", "hellaswag"], "avg_label": "Avg", "base": "base",
        "task_info": {"boolq": {"metric": "acc"}, "hellaswag": {"metric": "acc_norm"}},
        "provenance": {"lm_eval_version": "0.4.x"}, "device": "cpu", "dtype": "float32",
        "config": {"limit": None, "batch_size": 8, "seed": 1234},
        "checkpoints": summarise([
            {"label": "base", "params": 134_515_008, "results": {
                "boolq": {"acc": 0.6, "acc_stderr": 0.01, "metric": "acc", "n": 10, "wall_s": 1.0},
                "hellaswag": {"acc": 0.3, "acc_norm": 0.4, "metric": "acc_norm", "n": 10, "wall_s": 2.0}}},
            {"label": "small", "params": 100_000_000, "results": {
                "boolq": {"acc": 0.5, "metric": "acc", "n": 10, "wall_s": 1.0},
                "hellaswag": {"acc": 0.3, "acc_norm": 0.3, "metric": "acc_norm", "n": 10, "wall_s": 2.0}}},
        ], base=0),
    }  # fmt: skip
    text = render_markdown(doc)
    assert "| Model | Params | BoolQ | HSwag | Avg | Recovery |" in text
    assert "| base (base) | 134.515M | 60.00 | 40.00 | 50.00 | 100.00% |" in text
    assert "| small | 100.000M | 50.00 | 30.00 | 40.00 | 80.00% |" in text
    assert "| base | boolq | 60.00 ± 1.00 | - | 10 | 1.0 |" in text


# ------------------------------------------------------------------------------------ offline tasks

_FIELDS = {
    "boolq": {"question", "passage", "idx", "label"},
    "piqa": {"goal", "sol1", "sol2", "label"},
    "social_iqa": {"context", "question", "answerA", "answerB", "answerC", "label"},
    "hellaswag": {"ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split", "split_type", "label"},
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
    yamls = {"boolq": "super_glue/boolq/default.yaml", "piqa": "piqa/piqa.yaml", "social_iqa": "siqa/siqa.yaml",
             "arc_easy": "arc/arc_easy.yaml", "arc_challenge": "arc/arc_easy.yaml", "openbookqa": "openbookqa/openbookqa.yaml"}  # fmt: skip
    for task, rel in yamls.items():
        ref = load_yaml(real / rel, resolve_func=False)
        ours = load_yaml(evals_dir() / "tasks" / f"{task}_offline.yaml", resolve_func=False)
        for key in ("doc_to_text", "doc_to_target", "doc_to_choice", "target_delimiter", "output_type"):
            assert ours.get(key) == ref.get(key), (task, key)
    with resolve_tasks("hellaswag_offline,winogrande_offline") as tasks:
        hs = tasks.tasks["hellaswag_offline"]
        rows = datasets.Dataset.from_list([json.loads(x) for x in (evals_dir() / "data/hellaswag.jsonl").read_text().splitlines()])
        for doc, processed in zip(hs.eval_docs, hellaswag.process_docs(rows)):
            assert hs.doc_to_text(doc) == processed["query"]
            assert hs.doc_to_choice(doc) == processed["choices"]
            assert hs.doc_to_target(doc) == processed["gold"]
        wg = tasks.tasks["winogrande_offline"]
        for doc in wg.eval_docs:
            assert wg.doc_to_text(doc) == winogrande.doc_to_text(doc)
            assert wg.doc_to_target(doc) == winogrande.doc_to_target(doc)
            assert wg.doc_to_choice(doc) == winogrande.doc_to_choice(doc)


def test_task_yaml_file_and_folder(tmp_path, checkpoints):
    base, _ = checkpoints
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"q": f"Is {i} even?", "label": int(i % 2 == 0)}) for i in range(6)) + "\n")
    folder = tmp_path / "mytasks"
    folder.mkdir()
    for name in ("parity_a", "parity_b"):
        (folder / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\noutput_type: multiple_choice\n"
            "test_split: test\ndoc_to_text: '{{q}}'\ndoc_to_target: label\ndoc_to_choice: ['no', 'yes']\n"
            "metric_list:\n  - metric: acc\nmetadata:\n  version: 3.0\n"
        )
    one = evaluate_checkpoints([base], EvalConfig(tasks=(str(folder / "parity_a.yaml"),), device="cpu"), progress=False)
    both = evaluate_checkpoints([base], EvalConfig(tasks=(str(folder),), device="cpu"), progress=False)
    assert one["tasks"] == ["parity_a"] and both["tasks"] == ["parity_a", "parity_b"]
    assert both["checkpoints"][0]["results"]["parity_b"]["n"] == 6 and both["avg_label"] == "Avg"
    assert one["checkpoints"][0]["results"]["parity_a"]["version"] == 3.0


# ----------------------------------------------------------------------------- routes for big models


def test_batch_auto_and_device_map_auto_give_the_same_numbers(checkpoints):
    base, pruned = checkpoints
    plain = EvalConfig(tasks=("piqa_offline", "arc_easy_offline"), limit=5, device="cpu", batch_size=1)
    ref = evaluate_checkpoints([base, pruned], plain, progress=False)
    big = EvalConfig(tasks=plain.tasks, limit=5, device="cpu", batch_size="auto", max_batch_size=8, device_map="auto")
    doc = evaluate_checkpoints([base, pruned], big, progress=False)
    strip = lambda d: [{t: {k: v for k, v in r.items() if k != "wall_s"} for t, r in c["results"].items()} for c in d["checkpoints"]]  # noqa: E731
    assert strip(doc) == strip(ref)


def test_data_parallel_processes_give_the_same_numbers(tmp_path, checkpoints):
    """Two processes under torchrun (what ``accelerate launch`` sets up), on CPU with gloo."""
    base, _ = checkpoints
    args = [str(base), "--tasks", "piqa_offline,winogrande_offline", "--limit", "7", "--device", "cpu", "--batch-size", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533"]
    proc = subprocess.run([*launch, "-m", "nsc_prune", "eval", *args, "--out", str(tmp_path / "dp")],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = evaluate_checkpoints([base], EvalConfig(tasks=("piqa_offline", "winogrande_offline"), limit=7, device="cpu", batch_size=1), progress=False)
    dp = json.loads((tmp_path / "dp" / "results.json").read_text())
    for task in single["tasks"]:
        ours, ref = dp["checkpoints"][0]["results"][task], single["checkpoints"][0]["results"][task]
        assert {k: ours[k] for k in ("acc", "acc_norm", "n", "requests")} == {k: ref[k] for k in ("acc", "acc_norm", "n", "requests")}


# -------------------------------------------------------------------------------------- bad input


def test_unknown_task_lists_close_matches(checkpoints, capsys):
    base, _ = checkpoints
    code, _, err = run_cli(["eval", str(base), "--tasks", "piqa_ofline", "--out", "unused"], capsys)
    assert code == 2 and "unknown task 'piqa_ofline'" in err and "piqa_offline" in err and "Traceback" not in err
    assert not Path("unused").exists()


def test_unavailable_dataset_names_task_and_how_to_predownload(tmp_path, checkpoints):
    base, _ = checkpoints
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "empty-cache")}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "nsc_prune", "eval", str(base), "--tasks", "boolq,piqa_offline",
                           "--out", str(tmp_path / "o")], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "'boolq'" in proc.stderr and "load_dataset('aps/super_glue', 'boolq')" in proc.stderr
    assert "HF_DATASETS_OFFLINE=1" in proc.stderr and "datasets cache" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message when CUDA is absent")
def test_cuda_asked_for_but_absent(checkpoints, capsys):
    base, _ = checkpoints
    code, _, err = run_cli(["eval", str(base), "--tasks", "piqa_offline", "--device", "cuda"], capsys)
    assert code == 2 and "--device cuda was asked for but CUDA is not available" in err and "--device cpu" in err


def test_checkpoint_that_does_not_load(tmp_path, checkpoints, capsys):
    base, _ = checkpoints
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in base.iterdir():
        broken.joinpath(f.name).write_bytes(f.read_bytes()[: 100 if f.suffix == ".safetensors" else None])
    for path, message in ((broken, "truncated"), (tmp_path / "missing", "does not exist"), (tmp_path, "no config.json")):
        code, _, err = run_cli(["eval", str(base), str(path), "--tasks", "piqa_offline"], capsys)
        assert code == 2 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"tasks": ()}, "'tasks' parameter"), ({"limit": 0}, "'limit' parameter"), ({"limit": 2.5}, "'limit' parameter"),
     ({"device": "gpu"}, "'device' parameter"), ({"dtype": "int8"}, "'dtype' parameter"),
     ({"batch_size": 0}, "'batch_size' parameter"), ({"batch_size": "big"}, "'batch_size' parameter"),
     ({"device_map": "balanced"}, "'device_map' parameter"), ({"num_fewshot": -1}, "'num_fewshot' parameter")],
)  # fmt: skip
def test_eval_config_rejects_bad_values(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        EvalConfig(**kwargs)


def test_config_yaml_unknown_keys_and_flag_precedence(tmp_path, checkpoints, capsys):
    base, _ = checkpoints
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: [piqa_offline]\nbatchsize: 4\n")
    code, _, err = run_cli(["eval", str(base), "--config", str(bad)], capsys)
    assert code == 2 and "unknown eval config keys ['batchsize']" in err
    with pytest.raises(ConfigError, match="unknown eval config keys"):
        EvalConfig.from_dict({"limits": 3})
    good = tmp_path / "good.yaml"
    good.write_text("tasks: [boolq_offline]\nlimit: 3\ndevice: cpu\n")
    out = tmp_path / "o"
    code, stdout, _ = run_cli(["eval", str(base), "--config", str(good), "--limit", "2", "--out", str(out)], capsys)
    doc = json.loads((out / "results.json").read_text())
    assert code == 0 and doc["config"]["limit"] == 2 and doc["tasks"] == ["boolq_offline"] and "| BoolQ |" in stdout
    code, _, err = run_cli(["eval", str(base), "--config", str(good), "--out", str(out)], capsys)
    assert code == 2 and "already exists" in err


def test_base_detection_and_labels(checkpoints, tmp_path):
    base, pruned = checkpoints
    assert find_base([pruned, base], ["pruned", "base"]) == 1  # named in nsc_prune_extract.json
    assert find_base([pruned], ["pruned"]) is None
    assert find_base([pruned, base], ["pruned", "base"], explicit="pruned") == 0
    assert find_base([pruned, base], ["pruned", "base"], explicit=str(base)) == 1
    with pytest.raises(InvalidInputError, match="must be one of the checkpoints"):
        find_base([pruned, base], ["pruned", "base"], explicit="nope")
    assert checkpoint_labels([Path("a/x"), Path("b/x"), Path("c/y")]) == ["a/x", "b/x", "y"]
    assert checkpoint_labels([Path("a/x"), Path("a/x")]) == ["a/x#0", "a/x#1"]
