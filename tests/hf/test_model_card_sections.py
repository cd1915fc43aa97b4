"""The model card's plan, size and introduction sections, from an extraction's summary."""

from __future__ import annotations

from nsc_prune.hf.model_card import _intro, _of_original, _plan_table, _size_table
from nsc_prune.plan import LayerPlan


def test_the_plan_table_shows_kv_groups_when_any_layer_cuts_them():
    plan = [LayerPlan(ffn=64), LayerPlan(ffn=32, kv_groups=1), LayerPlan(ffn=0, kv_groups=0, keep=False)]
    assert _plan_table(plan, False) == [
        "| base layer | FFN channels | KV groups |",
        "|---|---|---|",
        "| 0 | 64 | all |",
        "| 1 | 32 | 1 |",
        "| 2 | dropped | dropped |",
    ]
    assert _plan_table(plan, False, [0, 1])[0] == "| base layer | FFN channels | KV groups |"  # not one per layer


def test_the_size_table_gives_the_share_of_the_base_and_how_macs_count_lora():
    summary = {
        "params": {"model": 50, "base": 200, "adapter": 0},
        "options": {"format": "pruned"},
        "plan": [{"ffn": 8, "lora_rank": 4}],
        "point": {"params": 50, "macs": 10},
        "cost": {"seq_len": 16},
    }
    rows = [row for row in _size_table(summary, "none") if row]
    assert "(25.0 % of the base's 200) |" in rows[2]
    assert "| MACs at 16 tokens (plan, LoRA paths counted unmerged, as the search counts them) | 10 |" in rows
    assert _of_original({"model": 50, "original": 0}) == ""  # no original count: no share of it (nor a division)


def test_a_cut_with_a_super_adapter_is_not_called_untrained():
    summary = {"point_index": 0, "point_count": 2, "provenance": {"adapter": "sa/"}, "selection": {"method": "first"}}
    assert "Not trained after the cut" not in _intro(summary)
    assert "Not trained after the cut" in _intro({**summary, "provenance": {}})
