"""The bundled LLM spaces resolve to the option tables they document (labels, FFN widths, KV groups, LoRA ranks).

Every expected table is written out from the known facts, not from the code: LoNAS on LLaMA-7B keeps FFN
{100, 87.5, 75, 62.5, 50}% of 11008 = {11008, 9632, 8256, 6880, 5504} and LoRA rank {r, r-4} = {32, 28}; the
elastic spaces step the FFN by 256 channels down to half width (ffn-grid.yaml, ffn-heads.yaml, ffn-heads-depth.yaml).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from nsc_prune.core.front import SearchSpace, search
from nsc_prune.core.spec import LayerOption
from nsc_prune.errors import ConfigError
from nsc_prune.presets import resolve_model
from nsc_prune.spaces.elastic import ElasticSpaceConfig
from nsc_prune.spaces.lonas import LonasSpaceConfig, build_lonas_space
from nsc_prune.spaces.registry import build_space

ELASTIC_LORA = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # rank r or r-4; down_proj stays at r = 32


def lonas_table(widths: list[int], ranks: list[int]) -> list[dict[str, int]]:
    """Widest first, then the larger rank: the order the solver's tie rule relies on."""
    return [{"ffn": w, "lora_rank": r} for w in widths for r in ranks]


def elastic_table(widths: list[int], kv_groups: list[int], drop: bool = False) -> list[dict[str, Any]]:
    kept = [{"ffn": w, "kv_groups": kv} for w in widths for kv in kv_groups]
    return kept + [{"ffn": 0, "kv_groups": 0, "keep": False}] if drop else kept


def labels(space: SearchSpace) -> list[list[dict[str, Any]]]:
    (sub,) = space.subspaces
    return [[dict(option.label) for option in options] for options in sub.layers]


def shape_of(option: LayerOption) -> dict[str, Any]:
    """What the matrices really hold: FFN rows, kept KV groups, and the rank of each LoRA factor pair."""
    by_name = {m.name: m for m in option.matrices}
    ranks = {m.name.split(".")[0]: m.rows for m in option.matrices if m.name.endswith(".lora_A")}
    assert all(by_name[f"{name}.lora_B"].cols == rank for name, rank in ranks.items())
    ffn = by_name["gate_proj"].rows if "gate_proj" in by_name else 0
    kv = by_name["k_proj"].count if "k_proj" in by_name else 0
    return {"ffn": ffn, "kv_heads": kv, "lora": ranks}


LLAMA_7B_WIDTHS = [11008, 9632, 8256, 6880, 5504]
SMOLLM2_WIDTHS = [1536, 1344, 1152, 960, 768]  # 1536 x {1, .875, .75, .625, .5}
SMOLLM2_GRID = [1536, 1280, 1024, 768]  # step 256 down to 768 = 1536 / 2
LLAMA_7B_GRID = list(range(11008, 5632 - 1, -256))  # 11008 - 256 k >= 5504 for k <= 21: 22 widths, last 5632
LLAMA_3_8B_GRID = list(range(14336, 7168 - 1, -256))  # 14336 - 256 k >= 7168 for k <= 28: 29 widths, last 7168


@pytest.mark.parametrize(
    "preset, layers, widths",
    [("llama-7b", 32, LLAMA_7B_WIDTHS), ("smollm2-135m", 30, SMOLLM2_WIDTHS)],
)
def test_lonas_table(preset, layers, widths):
    config = resolve_model(preset).config
    space = build_space("lonas", config)
    assert labels(space) == [lonas_table(widths, [32, 28])] * layers
    for option in space.subspaces[0].layers[0]:
        rank = option.label["lora_rank"]
        expected = {"ffn": option.label["ffn"], "lora": {**{m: rank for m in ELASTIC_LORA}, "down_proj": 32}}
        assert {k: v for k, v in shape_of(option).items() if k != "kv_heads"} == expected
    assert space.description == f"LoNAS: FFN {widths} x LoRA rank [32, 28] per block"
    # the dataclass defaults are the same space as the YAML
    assert space.settings == {"kind": "lonas", **dataclasses.asdict(LonasSpaceConfig())}
    assert labels(build_lonas_space(LonasSpaceConfig(), config)) == labels(space)


def test_ffn_grid_table():
    smollm2 = build_space("ffn-grid", resolve_model("smollm2-135m").config)
    assert labels(smollm2) == [elastic_table(SMOLLM2_GRID, [3])] * 30
    shapes = [shape_of(o) for o in smollm2.subspaces[0].layers[0]]
    assert shapes == [{"ffn": w, "kv_heads": 3, "lora": {}} for w in SMOLLM2_GRID]
    llama = build_space("ffn-grid", resolve_model("llama-7b").config)
    assert len(LLAMA_7B_GRID) == 22 and labels(llama) == [elastic_table(LLAMA_7B_GRID, [32])] * 32
    # ffn-grid.yaml holds exactly the dataclass defaults
    assert smollm2.settings == {"kind": "elastic", **dataclasses.asdict(ElasticSpaceConfig())}


def test_ffn_heads_table():
    smollm2 = build_space("ffn-heads", resolve_model("smollm2-135m").config)  # 3 KV groups of 3 query heads
    assert labels(smollm2) == [elastic_table(SMOLLM2_GRID, [3, 2, 1])] * 30
    shapes = [shape_of(o) for o in smollm2.subspaces[0].layers[0]]
    assert shapes == [{"ffn": w, "kv_heads": kv, "lora": {}} for w in SMOLLM2_GRID for kv in (3, 2, 1)]
    llama3 = build_space("ffn-heads", resolve_model("llama-3-8b").config)  # GQA: 8 KV groups
    assert len(LLAMA_3_8B_GRID) == 29
    assert labels(llama3) == [elastic_table(LLAMA_3_8B_GRID, [8, 7, 6, 5, 4, 3, 2, 1])] * 32


def test_ffn_heads_depth_table():
    space = build_space("ffn-heads-depth", resolve_model("smollm2-135m").config)
    # nothing protected: layer 0 may shrink but is never dropped (a plan keeps a layer); every other may be
    assert (
        labels(space)
        == [elastic_table(SMOLLM2_GRID, [3, 2, 1])] + [elastic_table(SMOLLM2_GRID, [3, 2, 1], drop=True)] * 29
    )
    dropped = space.subspaces[0].layers[1][-1]
    assert dropped.matrices == () and dropped.params == 0 and dropped.nsc == 0.0
    assert space.settings["protect_layers"] == () and space.settings["depth"] is True
    protected = build_space("ffn-heads-depth", resolve_model("smollm2-135m").config, protect_layers=[0])
    assert labels(protected)[0] == [{"ffn": 1536, "kv_groups": 3}]  # the manual override


def test_lonas_macs_plan_uses_the_smaller_rank():
    """Under params merged LoRA is free, so every plan keeps r = 32; under MACs (LoNAS's TFLOPs, 256 tokens)
    the adapters are multiplied, so a rank-28 layer trims the last few MACs below the 1.4T budget."""
    space = build_space("lonas", resolve_model("llama-7b").config)
    result = search(space, cost="macs")
    assert {layer["lora_rank"] for point in result.points for layer in point.layers} == {32, 28}
    plan = result.points[result.index_under(1_400_000_000_000)]
    chosen = Counter((layer["ffn"], layer["lora_rank"]) for layer in plan.layers)
    assert chosen == {(8256, 32): 25, (6880, 32): 6, (6880, 28): 1}

    def macs(ffn: int, rank: int) -> int:
        """Per token: attention 4 d^2, SwiGLU 3 d ffn, LoRA r (in + out) on q/k/v/gate/up, 32 (ffn + d) on down."""
        d = 4096
        return 4 * d * d + 3 * d * ffn + rank * (3 * 2 * d + 2 * (d + ffn)) + 32 * (ffn + d)

    lm_head = 32000 * 4096
    expected = 256 * (lm_head + 25 * macs(8256, 32) + 6 * macs(6880, 32) + macs(6880, 28))
    assert plan.macs == expected == 1_399_958_863_872


def test_a_lonas_fraction_that_keeps_no_ffn_channel_is_refused_naming_it():
    from tests.core.test_front import CONFIG  # FFN 96

    for rank in (0, 8):  # rank 8 blamed the adapter ("larger than the narrowest adapted matrix (0)")
        with pytest.raises(
            ConfigError, match=r"ffn_fractions \[1.0, 0.004\]: 0.004 of an FFN of 96 channels keeps none"
        ):
            build_space("lonas", CONFIG, lora_rank=rank, ffn_fractions=[1.0, 0.004])


def test_the_lora_rank_is_checked_against_the_matrices_it_adapts():
    """A q/o adapter of rank 48 was refused on a GQA model whose k/v are 32 wide: the check took every projection."""
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}  # fmt: skip
    qo = {"lora_rank": 48, "elastic_rank_modules": ["q_proj", "o_proj"], "fixed_rank_modules": []}
    assert build_space("lonas", config, **qo).subspaces
    with pytest.raises(ConfigError, match=r"LoRA rank 48 is larger than the narrowest adapted matrix .*\(32\)"):
        build_space("lonas", config, **{**qo, "elastic_rank_modules": ["q_proj", "k_proj"]})
    # half of FFN 96, the narrowest fraction's gate_proj: the fraction is the cause, not the adapter (was blamed)
    with pytest.raises(
        ConfigError,
        match=r"0.5 leaves an adapted matrix 48 wide, narrower than the adapter's LoRA rank 49; raise the smallest fraction to at least 0.511$",
    ):
        build_space("lonas", config, **{**qo, "lora_rank": 49, "elastic_rank_modules": ["gate_proj"]})
    assert build_space(
        "lonas", config, **{**qo, "lora_rank": 49, "elastic_rank_modules": ["gate_proj"], "ffn_fractions": [1.0, 0.511]}
    ).subspaces
