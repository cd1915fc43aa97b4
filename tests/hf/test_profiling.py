"""The profile's backend-neutral part without torch: a ``LayerShape`` is the timed part of a ``LayerPlan`` (layers of
one shape share a timing; a LoRA rank does not make a new one), and the table assembled from fixed measurements is,
byte for byte, the one nsc-prune wrote before the option labels were typed (``tests/fixtures/latency_table_v1.json``,
written by that code from the same measurements)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from nsc_prune._io import to_json
from nsc_prune.core.latency_table import LatencyTable, ProfileSettings
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.core.spec import layer_dims
from nsc_prune.errors import InvalidInputError
from nsc_prune.hf.latency.profiling import LayerShape, Measured, assemble_table, dense_fits, option_shapes
from nsc_prune.spaces.registry import build_space

FIXTURE = Path(__file__).parents[1] / "fixtures" / "latency_table_v1.json"
# the tiny LLaMA of tests/fixtures/tiny_llama_config.json, plus "per_layer_config"
CONFIG = {
    **json.loads((Path(__file__).parents[1] / "fixtures" / "tiny_llama_config.json").read_text()),
    "per_layer_config": {"2": {"intermediate_size": 96}},
}


def test_a_layer_shape_is_the_timed_part_of_a_plan():
    dims = layer_dims(CONFIG)[0]
    assert LayerShape(dims, LayerPlan(ffn=96, lora_rank=4)) == LayerShape(dims, LayerPlan(ffn=96, kv_groups=2))
    assert LayerShape(dims, LayerPlan(ffn=96, kv_groups=1)).heads == 2  # a KV group keeps its query heads
    assert LayerShape.full(dims).plan == LayerPlan(ffn=128, kv_groups=2)
    with pytest.raises(InvalidInputError, match="a dropped layer has no shape to time"):
        LayerShape(dims, LayerPlan(ffn=0, kv_groups=0, keep=False))
    lonas = build_space("lonas", CONFIG, lora_rank=8)  # 5 widths x 2 ranks a layer; layers 0 and 1 alike
    assert len(option_shapes(lonas, CONFIG)) == 2 * 5


def test_a_table_assembled_from_fixed_measurements_is_the_one_written_before():
    space = build_space("ffn-heads-depth", CONFIG, ffn_step=32)
    shapes = option_shapes(space, CONFIG)
    assert len(shapes) == 3 * 2 + 2 * 2  # layers 0 and 1 share their 6 shapes; layer 2 (FFN 96) has 2 widths
    measured = {
        shape: {
            "prefill": (shape.plan.ffn + 64 * shape.plan.kv_groups) / 2**16,
            "decode": (shape.plan.ffn + 32 * shape.plan.kv_groups + shape.dims.intermediate_size) / 2**20,
        }
        for shape in shapes
    }
    record = Measured(
        options=measured,
        without_layers={"prefill": 0.125, "decode": 0.0078125},
        without_layers_from="a model without decoder layers",
        dense={"prefill": 0.5, "decode": 0.03125},
        versions={"torch": "x"},
        machine={"platform": "fixture"},
    )
    table = assemble_table(space, CONFIG, "tiny", ProfileSettings(stack=2), record, 0.0)
    table = dataclasses.replace(table, provenance={"nsc_prune_version": "fixture", "seconds": 0.0})
    read = LatencyTable.read(FIXTURE)
    assert table == read
    read.check_fits(space, CONFIG, "fixture")
    assert to_json(table.to_dict()) == FIXTURE.read_text()


def test_the_dense_model_anchors_the_fixed_part_only_when_it_is_the_widest_plan():
    """A space whose widths stop below the model's: the dense time less the widest options' put the missing width
    into the fixed part, so every plan was predicted slower by it (0.106 s against 0.010 s on synthetic times)."""
    assert dense_fits(build_space("lonas", CONFIG, lora_rank=8), CONFIG, 4)
    assert dense_fits(build_space("ffn-heads-depth", CONFIG, ffn_step=32), CONFIG, 4)
    narrower = build_space("lonas", CONFIG, lora_rank=8, ffn_fractions=[0.75, 0.5])
    assert not dense_fits(narrower, CONFIG, 4)


def test_the_models_timed_at_once_stay_under_the_cap(monkeypatch):
    """A batch was timed only once it had passed MAX_TIMED_BYTES, the reference and dense models not counted: a
    7B-wide profile held several GiB more than the documented 2 GiB."""
    from nsc_prune.choices import PHASES
    from nsc_prune.hf.latency import profiling

    batches = []

    def time_models(models, settings, once):
        batches.append(sorted(models.values()))
        return {name: dict.fromkeys(PHASES, 1.0) for name in models}

    monkeypatch.setattr(profiling, "time_models", time_models)
    monkeypatch.setattr(profiling, "MAX_TIMED_BYTES", 100)
    sizes = {"ref": 10, "dense": 30, **{f"s{i}": 25 for i in range(7)}}  # stand-ins for the models, by their size
    shapes = {f"s{i}" for i in range(7)}
    measured, _, _ = profiling.time_options(
        shapes, lambda shape: shape, sizes.__getitem__, "ref", "dense", ProfileSettings(), once=None
    )
    assert set(measured) == shapes
    assert batches == [["dense", "ref", "s0", "s1"], ["ref", "s2", "s3"], ["ref", "s4", "s5"], ["ref", "s6"]]
    held = [40 + sum(sizes[m] for m in batch if m.startswith("s")) for batch in batches]  # dense lives throughout
    assert max(held) <= 100
