"""The real pipeline on SmolLM2-135M (slow; runs in CI): search -> extract -> eval on the offline tasks.

Kept short with ``limit``: two checkpoints x eight tasks x 8 documents, plus one reference run of
lm-eval loading each folder itself.
"""

from __future__ import annotations

import json
import tempfile

import pytest

torch = pytest.importorskip("torch")
lm_eval = pytest.importorskip("lm_eval")

from nsc_prune.cli import main  # noqa: E402
from nsc_prune.eval.tasks import ALIASES, render_offline_tasks  # noqa: E402
from nsc_prune.hf.extract import ExtractOptions, extract_subnet  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:the plan keeps LoRA ranks")]
LIMIT = 8


def test_dense_vs_pruned_on_offline_tasks(tmp_path, smollm2_dir, capsys):
    assert main(["--model", "smollm2-135m", "--budget", "85%", "--out", str(tmp_path / "search"), "--no-plot"]) == 0
    pruned = extract_subnet(
        tmp_path / "search", smollm2_dir, tmp_path / "smollm2-85", budget="85%", options=ExtractOptions(dtype="float32")
    )
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            str(smollm2_dir),
            str(pruned),
            "--tasks",
            "commonsense8_offline",
            "--limit",
            str(LIMIT),
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    stdout = capsys.readouterr().out
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    dense, small = doc["checkpoints"]
    assert doc["base"] == dense["label"] and doc["avg_label"] == "Avg8" and doc["dtype"] == "float32"
    assert small["params"] < 0.86 * dense["params"] and dense["params"] == 134_515_008
    assert small["recovery"] == pytest.approx(small["avg"] / dense["avg"]) and dense["recovery"] == pytest.approx(1.0)
    assert all(r["n"] == LIMIT for c in doc["checkpoints"] for r in c["results"].values())
    assert "| Model | Params | BoolQ | PIQA | SIQA | HSwag | WGrnd | ARC-e | ARC-c | OBQA | Avg8 | Recovery |" in stdout
    assert (out / "results.md").read_text().startswith("| Model | Params | BoolQ |")

    # The real tokenizer (BOS handling, whitespace) and the pruned model's remote-code route agree with
    # lm-eval loading the folders itself (one task per call, so batches are composed the same way).
    with tempfile.TemporaryDirectory() as tasks_dir:
        render_offline_tasks(tasks_dir)
        manager = lm_eval.tasks.TaskManager(include_path=tasks_dir, include_defaults=False)
        for record, path in ((dense, smollm2_dir), (small, pruned)):
            ref = lm_eval.simple_evaluate(
                model="hf",
                model_args={"pretrained": str(path), "dtype": "float32", "trust_remote_code": True},
                tasks=["arc_easy_offline"],
                task_manager=manager,
                limit=LIMIT,
                batch_size=8,
                device="cpu",
            )
            for metric in ("acc", "acc_norm"):
                assert (
                    record["results"]["arc_easy_offline"][metric]
                    == ref["results"]["arc_easy_offline"][f"{metric},none"]
                )
    assert set(doc["tasks"]) == set(ALIASES["commonsense8_offline"])
