"""What a subnet keeps (nsc_prune.plan): point selection by the front's cost kind, strict plan types.

Pure Python: no torch needed."""

from __future__ import annotations

import pytest

from nsc_prune.errors import ConfigError, InfeasibleBudgetError, InvalidInputError
from nsc_prune.hf.cut.keep import LayerOrder, identity_orders
from nsc_prune.plan import layer_plans, score_reading, select_point


def front(kind: str) -> dict:
    # params and macs rank the points differently: the cheapest in MACs is the costliest in params. A front is
    # sorted by its own kind.
    points = [
        {"params": 300, "macs": 1000, "nsc": 1.0, "layers": [{"ffn": 8}]},
        {"params": 100, "macs": 1500, "nsc": 2.0, "layers": [{"ffn": 16}]},
        {"params": 200, "macs": 3000, "nsc": 3.0, "layers": [{"ffn": 32}]},
    ]
    if kind == "params":
        points.sort(key=lambda p: p["params"])
    return {"cost": {"kind": kind, "seq_len": 256}, "points": points}


@pytest.mark.parametrize(
    "kind, budget, expected",
    [
        ("macs", "1600", 1),  # params would pick point 2 (every point has params <= 1600)
        ("macs", "50%", 1),  # 1500 of the full model's 3000 MACs
        ("macs", "34%", 0),  # 1020 MACs; 34 % of the 300 params (102) would pick point 1
        ("macs", 1000, 0),
        ("params", "150", 0),
        ("params", "70%", 1),  # 210 params
    ],
)
def test_budget_uses_the_front_cost_kind(kind, budget, expected):
    assert select_point(front(kind), budget=budget) == expected


def test_budget_below_the_front_names_the_cost_kind():
    with pytest.raises(InfeasibleBudgetError, match=r"smallest plan's 1\.000K \(1,000\) macs; got '999 = 999 macs'"):
        select_point(front("macs"), budget="999")
    with pytest.raises(ConfigError, match="cost kind must be one of .*; got 'flops'"):
        select_point(front("flops"), budget="1B")
    legacy = front("params")
    del legacy["cost"]  # files without a cost record count params
    assert select_point(legacy, budget="150") == 0


@pytest.mark.parametrize(
    "layer, got",
    [
        ({"ffn": True}, "ffn=True \\(bool\\)"),
        ({"ffn": 8, "kv_heads": False}, "kv_groups=False \\(bool\\)"),
        ({"ffn": 8, "lora_rank": True}, "lora_rank=True \\(bool\\)"),
        ({"ffn": 8.0}, "ffn=8.0 \\(float\\)"),
        ({"ffn": None}, "ffn=None"),
        ({"ffn": 8, "keep": 1}, "keep=1 \\(int\\)"),
        ({"ffn": -5}, "ffn=-5 \\(int\\)"),
        ({"ffn": 8, "kv_groups": -1}, "kv_groups=-1 \\(int\\)"),
        ({"ffn": 8, "lora_rank": -1}, "lora_rank=-1 \\(int\\)"),
    ],
)
def test_plan_values_must_have_their_types(layer, got):
    with pytest.raises(ConfigError, match=f"plan layer 0: .* must be integers >= 0 and 'keep' a bool; got {got}"):
        layer_plans({"layers": [layer]})
    assert layer_plans({"layers": [{"ffn": 8, "kv_heads": 2, "lora_rank": None, "keep": True}]})[0].ffn == 8


@pytest.mark.parametrize(
    "layers, message",
    [
        ("ffn", "'layers' must be a list of objects"),
        ([5], "plan layer 0 must be an object"),
        ([("ffn", 5)], "plan layer 0 must be an object"),
        ([{"ffn": 8, "kv_heads": 1, "kv_groups": 2}], "both 'kv_heads' and its new name 'kv_groups'"),
    ],
)
def test_layers_of_another_shape_are_refused_naming_it(layers, message):
    with pytest.raises(ConfigError, match=message):
        layer_plans(layers)


def test_identity_orders_are_the_first_channels():
    assert identity_orders((3, 2), (2, 1)) == [LayerOrder((0, 1, 2), (0, 1)), LayerOrder((0, 1), (0,))]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"params": float("nan")}, "'params' must be a whole number >= 0; got nan"),  # failed after the extraction
        ({"params": "x"}, "'params' must be a whole number >= 0; got 'x'"),  # a TypeError in the plan's name
        ({"macs": -1}, "'macs' must be a whole number >= 0; got -1"),
        ({"nsc": float("inf")}, "'nsc' must be a finite number; got inf"),
        ({"latency_us": 1.5}, "'latency_us' must be a whole number >= 0; got 1.5"),
        ({"params": None}, "'params' must be a whole number >= 0; got None"),  # a TypeError only latency may be null
    ],
)
def test_a_point_s_costs_and_score_are_checked_when_the_file_is_read(change, message):
    from nsc_prune.plan import PlanPoint

    point = {"params": 300, "macs": 1000, "nsc": 1.0, "layers": [{"ffn": 8}]}
    assert PlanPoint.from_dict(point, "point 0").params == 300
    assert PlanPoint.from_dict({**point, "macs": 0, "latency_us": None}, "point 0").macs == 0  # zero is a cost
    with pytest.raises(ConfigError, match=f"point 0: {message}$"):
        PlanPoint.from_dict({**point, **change}, "point 0")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"schema_version": 99}, "schema_version 99 is not one this nsc-prune reads \\(1 to 2\\)"),  # read silently
        ({"schema_version": 0}, "schema_version 0 is not one this nsc-prune reads \\(1 to 2\\)"),
        ({"selected": "0"}, "'selected' must be a point index \\(0 to 2\\) or null; got '0'"),
        ({"selected": -1}, "'selected' must be a point index \\(0 to 2\\) or null; got -1"),  # was the last point
        ({"selected": 3}, "'selected' must be a point index \\(0 to 2\\) or null; got 3"),
        ({"cost": {"kind": "bogus"}}, "the cost kind must be one of .*; got 'bogus'"),  # unchecked with --point
        ({"model": ["llama"]}, "'model' must be an object or null"),  # an AttributeError when its name was read
        ({"budget": [1, 2]}, "'budget' must be an object or null"),
        ({"search_seconds": "x"}, "'search_seconds' must be a number >= 0 or null"),
        ({"model": {"config": "x"}}, "'model.config' must be an object; got 'x'"),  # a ValueError in extract
        ({"model": {"name": 5}}, "'model.name' must be a string; got 5"),  # a TypeError naming the output
    ],
)
def test_a_pareto_file_s_header_is_checked_when_read(change, message):
    from nsc_prune.plan import ParetoDocument

    doc = front("params")
    assert ParetoDocument.from_dict({**doc, "schema_version": 1, "selected": 0}).selected == 0
    with pytest.raises(ConfigError, match=f"the pareto file: {message}"):
        ParetoDocument.from_dict({**doc, **change})


def test_a_pareto_file_reads_back_as_written_and_says_what_it_drops():
    """An unknown top-level key was dropped without a word when the document was written again, and an empty model
    object came back as null."""
    from nsc_prune.plan import ParetoDocument

    doc = {**front("params"), "model": {}}
    assert ParetoDocument.from_dict(ParetoDocument.from_dict(doc).to_dict()) == ParetoDocument.from_dict(doc)
    assert ParetoDocument.from_dict(doc).to_dict()["model"] == {}
    with pytest.warns(UserWarning, match=r"the pareto file: ignoring unknown keys \['notes'\]"):
        ParetoDocument.from_dict({**doc, "notes": "mine"})


def test_a_document_shares_no_dict_with_its_caller():
    """to_dict() handed out the document's own nested dicts, and from_dict kept the caller's: editing either copy
    edited the frozen document (a later write, or extract, read the edit)."""
    from nsc_prune.plan import ParetoDocument
    from nsc_prune.planning import search_plan

    found = search_plan("smollm2-135m", "80%", space="ffn-grid")
    text = found.document.to_json()
    handed = found.document.to_dict()
    handed["model"]["config"]["hidden_size"] = 128
    handed["space"]["name"] = "edited"
    found.model.config["hidden_size"] = 256  # the resolved model of the same search
    assert found.document.to_json() == text
    data = handed | {"space": {"name": "mine"}}
    read = ParetoDocument.from_dict(data)
    data["model"]["config"]["hidden_size"], data["space"]["name"] = 512, "edited"
    assert read.model["config"]["hidden_size"] == 128 and read.space["name"] == "mine"


def test_a_point_layer_with_a_key_and_its_new_name_is_refused():
    from nsc_prune.plan import PlanPoint

    point = {"params": 300, "macs": 1000, "nsc": 1.0, "layers": [{"ffn": 8, "kv_groups": 2, "kv_heads": 1}]}
    with pytest.raises(ConfigError, match="point 0: layer 0 has both 'kv_heads' and its new name 'kv_groups'"):
        PlanPoint.from_dict(point, "point 0")  # kv_heads won silently


def test_a_point_s_cost_of_an_unknown_kind_is_refused():
    from nsc_prune.plan import ParetoDocument

    point = ParetoDocument.from_dict(front("params")).points[0]
    assert (point.cost("params"), point.cost("macs")) == (point.params, point.macs)
    with pytest.raises(InvalidInputError, match="cost kind must be one of params, macs, latency; got 'flops'"):
        point.cost("flops")  # was the MACs


def test_no_measured_damage_reads_zero_not_minus_zero():
    reading = score_reading("measured")  # the full model at 100 %: "predicted damage -0 nats"
    assert f"{reading.shown(0.0):.4g}" == "0" and reading.shown(-0.25) == 0.25


def test_a_plan_for_a_model_whose_layers_differ_is_refused_naming_the_layer():
    """A front searched on a pruned checkpoint (per-layer widths) was extracted from the unpruned base with exit 0,
    its percentage read against the other model: only the global keys were compared."""
    from nsc_prune.plan import check_same_model
    from nsc_prune.presets import resolve_model

    base = resolve_model("smollm2-135m").config
    pruned = {**base, "per_layer_config": {"3": {"intermediate_size": 768}}}
    with pytest.raises(ConfigError, match="layer 3 has FFN 768, 9 heads, 3 KV heads but the base's has FFN 1536"):
        check_same_model(pruned, base)
    with pytest.raises(ConfigError, match="layer 3 has FFN 1536, 9 heads, 3 KV heads but the base's has FFN 768"):
        check_same_model(base, pruned)
    check_same_model(pruned, {**pruned, "per_layer_config": {3: {"intermediate_size": 768}}})  # the same layers
    check_same_model({"model_type": "llama", "hidden_size": 576}, base)  # a partial record: its keys are compared


def test_the_same_model_is_judged_by_its_sizes_as_read_not_as_written():
    """A plan for a Gemma 2 whose head_dim was left out (256) was extracted from a base with head_dim 16, its
    percentage read against the other model; a base with head_dim null (hidden / heads) was refused against the
    same value written out."""
    from nsc_prune.plan import check_same_model

    gemma = {"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300}  # fmt: skip
    with pytest.raises(ConfigError, match="the plan was made for head_dim=256 but the base has head_dim=16"):
        check_same_model(gemma, {**gemma, "head_dim": 16})
    mistral = {**gemma, "model_type": "mistral"}
    check_same_model({**mistral, "head_dim": 16}, {**mistral, "head_dim": None})
    with pytest.raises(ConfigError, match="tie_word_embeddings=True but the base has tie_word_embeddings=False"):
        check_same_model(gemma, {**gemma, "tie_word_embeddings": False})


def test_a_selected_point_above_its_budget_is_refused_as_an_edited_file():
    import dataclasses

    from nsc_prune.planning import search_plan

    document = search_plan("llama-7b", "5.7B").document
    assert document.select() == document.selected  # what the search wrote reads back
    edited = dataclasses.replace(document, points=document.points[1:])  # every later index shifts by one
    with pytest.raises(InvalidInputError, match="'selected' point 66 costs .* above the budget .* was edited"):
        edited.select()
    assert edited.select(point=65) == 65  # a point asked for by index is the user's choice


@pytest.mark.parametrize(
    "change, message",
    [
        ({"points": ()}, "needs at least one point"),
        ({"selected": 999}, "'selected' must be a point index .0 to 128. or None; got 999"),
    ],
)
def test_a_document_read_would_refuse_is_not_written(tmp_path, change, message):
    import dataclasses

    from nsc_prune.planning import search_plan

    document = dataclasses.replace(search_plan("llama-7b", "5.7B").document, **change)
    with pytest.raises(ConfigError, match=message):
        document.write(tmp_path)
    assert not (tmp_path / "pareto.json").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nsc": float("nan")}, "point 3: 'nsc' must be a finite number; got nan"),  # was a JSON error
        ({"params": -5}, "point 3: 'params' must be a whole number >= 0; got -5"),  # written, then refused by read
        ({"params": 1}, "the points must be sorted by their params, each costing more than the one before"),
    ],
)
def test_a_point_read_would_refuse_is_not_written(tmp_path, change, message):
    import dataclasses

    from nsc_prune.planning import search_plan

    document = search_plan("llama-7b", "5.7B").document
    points = list(document.points)
    points[3] = dataclasses.replace(points[3], **change)
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(document, points=tuple(points)).write(tmp_path)
    assert not (tmp_path / "pareto.json").exists()


def test_a_point_read_with_numpy_numbers_is_written_as_read(tmp_path):
    """``from_dict`` accepts np.int64 as an int; ``write`` then failed on it (the header was written with numpy's
    numbers turned to Python's, the points were not)."""
    import json

    import numpy as np

    from nsc_prune.plan import ParetoDocument
    from nsc_prune.planning import search_plan

    search_plan("llama-7b", "5.7B").document.write(tmp_path / "a")
    data = json.loads((tmp_path / "a" / "pareto.json").read_text())
    data["points"][0]["params"] = np.int64(data["points"][0]["params"])
    ParetoDocument.from_dict(data).write(tmp_path / "b")
    assert (tmp_path / "b" / "pareto.json").read_text() == (tmp_path / "a" / "pareto.json").read_text()


@pytest.mark.parametrize(("model", "space"), [("llama-7b", "lonas"), ("smollm2-135m", "ffn-heads-depth")])
def test_a_point_s_line_is_its_whole_dict_s_json_with_each_layer_s_json_made_once(model, space):
    """pareto.json writes each distinct layer's JSON once and splices it into the points' lines: the lines are those
    of json.dumps over each point's whole dict, and the file reads back to the same front."""
    import json

    from nsc_prune.plan import ParetoDocument
    from nsc_prune.planning import search_plan

    doc = search_plan(model, "70%", space=space).document
    text = doc.to_json()
    start = text.index('"points": [\n') + len('"points": [\n')
    lines = [line.strip().rstrip(",") for line in text[start:].splitlines()[: len(doc.points)]]
    plain = [json.dumps(p.to_dict(), sort_keys=True, separators=(", ", ": ")) for p in doc.points]
    assert lines == plain and len({layer for p in doc.points for layer in p.layers}) < len(doc.points)
    assert ParetoDocument.from_dict(json.loads(text)).to_json() == text


def test_an_unknown_key_in_a_decoder_point_warns():
    from nsc_prune.plan import ParetoDocument
    from nsc_prune.planning import search_plan

    document = search_plan("llama-7b", "5.7B").document.to_dict()
    document["points"][11]["latency"] = 5  # read silently as a NAS space's network-level choice
    with pytest.warns(
        UserWarning, match=r"point 11 has keys a decoder's point does not have, \['latency'\]; they are kept as written"
    ):
        ParetoDocument.from_dict(document)


def test_a_front_whose_costs_do_not_rise_is_refused():
    """extract --budget picks the costliest point under the budget: a point's cost edited below its neighbour's
    (the full model's params made 75,000) made a 60 % budget extract the full model, exit 0."""
    from nsc_prune.plan import ParetoDocument

    doc = front("macs")
    doc["points"][2]["macs"] = 1200
    with pytest.raises(
        ConfigError, match="sorted by their macs, each costing more .*; point 2 costs 1,200 after 1,500"
    ):
        ParetoDocument.from_dict(doc)
    doc["points"][2]["macs"] = 1500  # a tie is no front either
    with pytest.raises(ConfigError, match="point 2 costs 1,500 after 1,500"):
        ParetoDocument.from_dict(doc)


def test_a_budget_that_reads_as_macs_names_the_full_models_macs():
    """The hint compares against the costliest point's MACs, not the cheapest's."""
    doc = {"cost": {"kind": "params", "seq_len": 256}, "points": [
        {"params": 100, "macs": 5000, "nsc": 1.0, "layers": [{"ffn": 8}]},
        {"params": 200, "macs": 60000, "nsc": 2.0, "layers": [{"ffn": 16}]},
    ]}  # fmt: skip
    with pytest.raises(InvalidInputError, match=r"The front counts params \(the full model is 60.000K MACs\)"):
        select_point(doc, budget="7000")
