"""scripts/compare_peers_smollm2.py: the Torch-Pruning peer wrapper on a tiny Llama, and the generated doc table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def _script():
    return load_script("compare_peers_smollm2")


@pytest.mark.peers
@pytest.mark.parametrize("method", ["magnitude", "taylor"])
def test_torch_pruning_hits_budget_and_loads(tiny_llama, tmp_path, method):
    pytest.importorskip("torch_pruning")
    import torch
    from transformers import AutoModelForCausalLM

    script = _script()
    tiny = tiny_llama(gqa=True, lora=False, layers=2, ffn=96)
    dense = AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float32)
    full = script.count_params(dense)
    target = int(full * 0.9)
    ids = torch.randint(3, tiny.config["vocab_size"], (64,), generator=torch.Generator().manual_seed(0))
    info = script.tp_prune_to_budget(
        tiny.base, target, method, tmp_path / "pruned", calib_ids=ids, seq_len=32, tolerance=0.02
    )
    assert abs(info["params"] - target) <= 0.02 * target
    assert info["ffn_width"] < 96
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "pruned", dtype=torch.float32).eval()
    assert script.count_params(model) == info["params"]
    assert model.config.intermediate_size == info["ffn_width"]
    assert all(layer.mlp.up_proj.out_features == info["ffn_width"] for layer in model.model.layers)
    with torch.no_grad():
        logits = model(ids[None, :16]).logits
    assert logits.shape == (1, 16, tiny.config["vocab_size"]) and torch.isfinite(logits).all()


def test_doc_table_is_rendered_from_committed_results():
    script = _script()
    results = json.loads((ROOT / "docs" / "compare_results.json").read_text())
    assert script.doc_table(ROOT / "docs" / "compare.md") == script.render_table(results)
