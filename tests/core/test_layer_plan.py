"""``LayerPlan`` is the one layer-option type: every decoder space's options carry it, it reads as the label
pareto.json writes (so a front written from plans and one read back from dicts are the same bytes), and
``nsc_prune.plan`` re-exports it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nsc_prune import plan as plan_module
from nsc_prune.core.front import option_plans, search
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.errors import ConfigError
from nsc_prune.plan import ParetoDocument
from nsc_prune.spaces.registry import build_space

# the tiny LLaMA of tests/fixtures/tiny_llama_config.json
CONFIG = json.loads((Path(__file__).parents[1] / "fixtures" / "tiny_llama_config.json").read_text())
DECODER_SPACES = {
    "ffn-grid": {"ffn_step": 32},
    "ffn-heads-depth": {"ffn_step": 32},
    "lonas": {"lora_rank": 8},
}


def test_a_plan_reads_as_the_label_it_is_written_as():
    assert dict(LayerPlan(ffn=96, kv_groups=2)) == {"ffn": 96, "kv_groups": 2} == LayerPlan(ffn=96, kv_groups=2)
    assert LayerPlan(ffn=96, kv_groups=2) != LayerPlan(ffn=96) != {"ffn": 96, "kv_groups": 1}
    assert list(LayerPlan(ffn=0, kv_groups=0, keep=False)) == ["ffn", "kv_groups", "keep"]
    assert LayerPlan(ffn=96, lora_rank=0).to_dict() == {"ffn": 96, "lora_rank": 0}  # 0 is set, None is not
    plan = LayerPlan(ffn=8)
    assert len(plan) == 1 and "keep" not in plan and plan.get("kv_groups") is None
    with pytest.raises(KeyError):
        plan["lora_rank"]
    assert hash(plan) == hash(LayerPlan(ffn=8)) and {plan: 1}[LayerPlan(ffn=8)] == 1


@pytest.mark.parametrize("name", sorted(DECODER_SPACES))
def test_every_decoder_space_option_is_a_layer_plan_that_round_trips(name):
    space = build_space(name, CONFIG, **DECODER_SPACES[name])
    plans = option_plans(space, "test")
    expected = {"lonas": {"ffn", "lora_rank"}}.get(name, {"ffn", "kv_groups"})
    for row, options in zip(plans, space.subspaces[0].layers):
        for plan, option in zip(row, options):
            assert plan is option.label and isinstance(plan, LayerPlan)
            assert set(plan) - {"keep"} == expected and plan.keep == ("keep" not in plan)
            assert LayerPlan.from_dict(json.loads(json.dumps(dict(plan)))) == plan


def test_a_front_writes_the_same_bytes_from_plans_as_from_dicts_read_back():
    space = build_space("ffn-heads-depth", CONFIG, ffn_step=32)
    doc = ParetoDocument.from_result(search(space), 0, {"name": "tiny", "config": CONFIG}, {"requested": "80%"})
    text = doc.to_json()
    read = ParetoDocument.from_dict(json.loads(text))
    assert isinstance(doc.points[-1].layers[0], LayerPlan) and type(read.points[-1].layers[0]) is dict
    assert read.to_json() == text
    assert [p.layer_plans() for p in read.points] == [list(p.layers) for p in doc.points]
    assert any(not plan.keep for p in doc.points for plan in p.layers)  # a dropped layer is among them


def test_a_space_without_layer_plans_is_refused_by_name():
    with pytest.raises(ConfigError, match="--space must be a per-layer space of one model .* got 'txl-wt103'"):
        option_plans(build_space("txl-wt103"), "--space")


def test_the_plan_module_re_exports_the_one_type():
    assert plan_module.LayerPlan is LayerPlan
