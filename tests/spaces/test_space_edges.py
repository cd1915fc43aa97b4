"""Edges of the space builders that mutation testing found unpinned: each input below told a mutant of
``spaces/elastic.py``, ``spaces/registry.py`` or ``spaces/lonas.py`` from the code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.presets import resolve_model
from nsc_prune.spaces.elastic import ElasticSpaceConfig, ffn_grid
from nsc_prune.spaces.lonas import (
    LonasSpaceConfig,
    comparable,
    fixed_rank_modules,
    read_adapter_config,
    read_lora_config,
    trained_space_settings,
)
from nsc_prune.spaces.registry import build_space

SMOLLM2 = resolve_model("smollm2-135m").config  # 30 layers, FFN 1536, 9 heads, 3 KV heads
ROOT = Path(__file__).resolve().parents[2]
# layer 3 keeps one KV group of three query heads (a pruned checkpoint's per-layer entry)
ONE_KV_LAYER = {**SMOLLM2, "per_layer_config": {"3": {"num_key_value_heads": 1, "num_attention_heads": 3}}}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: build_space("ffn-grid", SMOLLM2, ffn_min_fraction=0), "ffn_min_fraction must be a number in (0, 1]"),
        (lambda: ElasticSpaceConfig(protect_layers=""), "protect_layers must be a list of layer indices; got ''"),
        (lambda: build_space("ffn-heads", ONE_KV_LAYER, kv_min=2), "exceeds the model's 1 KV heads in its narrowest"),
        (lambda: LonasSpaceConfig(rank_deltas=[4, 0]), "rank_deltas must be non-empty, each <= 0"),  # no weights
        (lambda: LonasSpaceConfig(lora_rank=4, rank_deltas=[0, -4]), "lora_rank + each of rank_deltas must be > 0"),
    ],
)
def test_settings_that_make_no_valid_space_are_refused(build, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build()


def test_kv_min_bounds_the_layers_whose_kv_groups_are_chosen_not_a_protected_one():
    """A protected layer keeps every KV head, so a narrower one there is no reason to refuse kv_min: the space was
    refused ("exceeds the model's 1 KV heads in its narrowest layer") though no layer would be offered fewer."""
    layers = build_space("ffn-heads", ONE_KV_LAYER, kv_min=2, protect_layers=[3]).subspaces[0].layers
    assert {(o.label.ffn, o.label.kv_groups) for o in layers[3]} == {(1536, 1)}  # the protected layer whole
    assert {o.label.kv_groups for layer in layers[:3] + layers[4:] for o in layer} == {2, 3}
    with pytest.raises(ConfigError, match=r"exceeds the model's 1 KV heads in its narrowest unprotected layer$"):
        build_space("ffn-heads", ONE_KV_LAYER, kv_min=2, protect_layers=[0])


def test_a_layer_with_its_own_kv_count_keeps_its_own_options():
    """ffn-grid keeps each layer's KV groups (1 in layer 3); a depth space may drop such a layer alongside the
    others under homogeneous=true, since a dropped layer has no KV count to match."""
    layer3 = build_space("ffn-grid", ONE_KV_LAYER).subspaces[0].layers[3]
    assert {option.label.kv_groups for option in layer3} == {1}
    assert build_space("ffn-grid", ONE_KV_LAYER, depth=True, homogeneous=True).size > 1


def test_the_step_a_grid_error_suggests_is_accepted():
    with pytest.raises(ConfigError, match=r"pass --set ffn_step=(\d+) or coarser") as refused:
        ffn_grid(81920, 1, 0.5)
    step = int(re.search(r"ffn_step=(\d+) or coarser", str(refused.value)).group(1))
    assert ffn_grid(81920, step, 0.5)[0] == 81920


def test_a_null_override_keeps_the_spaces_own_setting():
    """The registry drops None overrides (its docstring): kv_heads stays the ffn-heads YAML's true."""
    assert build_space("ffn-heads", SMOLLM2, kv_heads=None).settings["kv_heads"] is True


def test_lonas_widths_round_to_the_nearest_channel():
    widths = {o.label.ffn for o in build_space("lonas", SMOLLM2, ffn_fractions=[1.0, 0.6]).subspaces[0].layers[0]}
    assert widths == {1536, 922}  # 0.6 x 1536 = 921.6


def test_a_rank_as_wide_as_the_narrowest_matrix_is_a_fraction_problem_not_another_model():
    with pytest.raises(ConfigError, match="raise the smallest fraction to at least 0.375"):
        build_space("lonas", SMOLLM2, lora_rank=576, ffn_fractions=[1.0, 0.25],
                    elastic_rank_modules=["gate_proj", "up_proj"], fixed_rank_modules=["down_proj"])  # fmt: skip


def test_adapter_settings_that_would_train_or_read_wrong(tmp_path):
    assert fixed_rank_modules({"kind": "lonas", "lora_rank": 0}, "llama") == {"down_proj": 0}  # rank 0: no adapter
    biased = tmp_path / "biased"
    biased.mkdir()
    (biased / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "all"})
    )
    with pytest.raises(ConfigError, match="bias='all' is not supported; only bias='none'"):
        read_lora_config(biased)
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})
    )
    record = {"space": {"settings": {"kind": "lonas", "lora_rank": 0, "rank_deltas": [0]}}}
    (trained / "nsc_prune_supernet.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="must hold the lonas settings it was trained on; got lora_rank 0"):
        trained_space_settings(trained, 8)


NARROW_LAYER_2 = {**SMOLLM2, "per_layer_config": {"2": {"intermediate_size": 1024, "num_key_value_heads": 1,
                                                       "num_attention_heads": 3}}}  # fmt: skip


def test_a_negative_protected_layer_is_refused():
    """-1 protected no layer, and under depth left layer 0 droppable: a plan could keep no layer."""
    with pytest.raises(ConfigError, match=r"protect_layers \[-1\] are outside 0..29"):
        build_space("ffn-heads-depth", SMOLLM2, protect_layers=[-1])


def test_a_min_fraction_of_one_keeps_only_the_full_width():
    space = build_space("ffn-heads", SMOLLM2, ffn_min_fraction=1)
    assert {o.label.ffn for o in space.subspaces[0].layers[0]} == {1536}
    assert space.description.startswith("FFN 1536..1536 step 256")


def test_a_kv_min_equal_to_the_kv_heads_keeps_them_all():
    space = build_space("ffn-heads", SMOLLM2, kv_min=3)
    assert {o.label.kv_groups for o in space.subspaces[0].layers[0]} == {3}
    assert "KV groups 3..3" in space.description


def test_the_description_names_each_axis():
    protected = build_space("ffn-heads-depth", SMOLLM2, protect_layers=[0, 29], kv_min=2)
    assert protected.description == ("FFN 1536..768 step 256, KV groups 3..2, layer dropping, layers [0, 29] protected")
    mixed = build_space("ffn-heads", NARROW_LAYER_2)
    assert mixed.description == (
        "FFN from each layer's width (1024..1536) down to 0.5 of it, step 256, KV groups each layer's..1"
    )


def test_kv_min_bounds_the_kv_groups_each_layer_may_keep():
    """--set kv_min=2 was accepted and ignored by the option tables: every plan could still keep 1 KV group."""
    space = build_space("ffn-heads", SMOLLM2, kv_min=2)
    assert {o.label.kv_groups for o in space.subspaces[0].layers[0]} == {3, 2}


def test_the_narrowest_width_is_not_below_the_fraction():
    assert ffn_grid(1000, 1, 0.5555)[-1] == 556  # 555.5 rounds up: 555 would be below the fraction


def test_a_kind_registered_twice_is_refused():
    from nsc_prune.spaces.elastic import ElasticSpaceConfig, build_elastic_space
    from nsc_prune.spaces.registry import register_space_kind

    with pytest.raises(ValueError, match="space kind 'elastic' is already registered"):
        register_space_kind("elastic", ElasticSpaceConfig, build_elastic_space)


def test_a_space_yaml_without_a_kind_is_refused(tmp_path):
    (tmp_path / "mine.yaml").write_text("ffn_step: 128\n")
    with pytest.raises(ConfigError, match="a space YAML must be a mapping with a 'kind' key"):
        build_space(str(tmp_path / "mine.yaml"), SMOLLM2)


def test_lonas_without_lora_keeps_rank_0_in_every_option():
    space = build_space("lonas", SMOLLM2, lora_rank=0)
    assert [dict(o.label) for o in space.subspaces[0].layers[0]] == [
        {"ffn": w, "lora_rank": 0} for w in (1536, 1344, 1152, 960, 768)
    ]


def test_a_zero_lora_alpha_is_refused():
    with pytest.raises(ConfigError, match="lora_alpha must be a positive finite number; got 0"):
        LonasSpaceConfig(lora_alpha=0)


def test_an_adapter_of_another_peft_type_is_refused(tmp_path):
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "ADALORA", "r": 8, "target_modules": ["q_proj"]})
    )
    with pytest.raises(ConfigError, match="is not a LoRA adapter config \\(peft_type='ADALORA'\\)"):
        read_lora_config(tmp_path)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"r": 0}, "r must be a positive integer; got 0"),
        ({"target_modules": []}, "names no target_modules"),
        ({"rank_pattern": {"q_proj": 4}}, "per-module ranks \\(rank_pattern\\) do not fit the lonas space"),
    ],
)
def test_adapter_configs_the_lonas_space_cannot_hold_are_refused(tmp_path, extra, message):
    from nsc_prune.spaces.lonas import read_adapter_config

    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], **extra})
    )
    with pytest.raises(ConfigError, match=message):
        read_adapter_config(tmp_path, "llama")


def test_a_phi3_adapter_puts_its_fused_modules_at_the_elastic_rank(tmp_path):
    from nsc_prune.spaces.lonas import read_adapter_config

    targets = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": targets})
    )
    config = read_adapter_config(tmp_path, "phi3")
    assert config["elastic_rank_modules"] == ("qkv_proj", "gate_up_proj")
    assert config["fixed_rank_modules"] == ("o_proj", "down_proj")


def test_the_txl_space_holds_the_papers_d_ff_widest_first():
    from nsc_prune.spaces.nas import TxlSpaceConfig

    space = build_space("txl-wt103")
    d_ff = [o.label["d_ff"] for o in space.subspaces[0].layers[0]]
    assert d_ff == [*range(4096, 2304 - 1, -256), *range(2048, 512 - 1, -128)] and len(d_ff) == 21
    assert TxlSpaceConfig().d_ff == tuple(sorted(d_ff))  # the dataclass defaults are the YAML's grid
    with pytest.raises(ValueError, match=r"d_model has repeated values: \[128, 128\]"):
        TxlSpaceConfig(d_model=[128, 128])


def test_an_unknown_kind_lists_every_builtin_kind_in_a_fresh_process(tmp_path):
    """The built-in kinds register on first use: a fresh process has none registered yet, and the refusal listed
    only the registered ones (an empty list) if it forgot the built-ins it has not imported."""
    (tmp_path / "mine.yaml").write_text("kind: elastc\n")
    code = f"from nsc_prune.spaces.registry import build_space\nbuild_space({str(tmp_path / 'mine.yaml')!r})\n"
    run = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode != 0
    assert "unknown space kind 'elastc'; known kinds: autoformer, elastic, lonas, txl" in run.stderr, run.stderr


def test_a_space_path_that_is_a_folder_says_so_and_names_the_bundled_space(tmp_path):
    """``--space ./ffn-grid.yaml`` naming a folder: the refusal says what the path is and hints at the bundled
    space of that name (a user who meant ``--space ffn-grid``)."""
    (tmp_path / "mine.yaml").mkdir()
    with pytest.raises(ConfigError, match=r"mine\.yaml is a folder$"):
        build_space(str(tmp_path / "mine.yaml"), SMOLLM2)
    (tmp_path / "ffn-grid.yaml").mkdir()
    with pytest.raises(ConfigError, match=r"ffn-grid\.yaml is a folder; did you mean --space ffn-grid \(bundled\)\?$"):
        build_space(str(tmp_path / "ffn-grid.yaml"), SMOLLM2)


def test_an_unknown_bundled_name_lists_the_close_ones_and_every_bundled_space():
    with pytest.raises(ConfigError) as refused:
        build_space("ffn-head", SMOLLM2)
    message = str(refused.value)
    assert "Did you mean ffn-heads, ffn-heads-depth, ffn-grid?" in message  # up to three close names
    assert "Bundled spaces: autoformer-base, autoformer-small, autoformer-tiny, ffn-grid, ffn-heads, " in message
    assert message.endswith("or pass a path to a .yaml file")


def test_a_relative_path_without_a_yaml_suffix_is_refused_as_a_file(tmp_path, monkeypatch):
    """``--space spaces/mine`` (a relative path, no suffix) is a file the user meant, not an unknown bundled name."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"space file spaces/mine must end in \.yaml or \.yml; a bundled space"):
        build_space("spaces/mine", SMOLLM2)


def test_a_space_yaml_that_is_a_list_is_refused_naming_the_file(tmp_path):
    (tmp_path / "listed.yaml").write_text("- kind\n- elastic\n")
    with pytest.raises(ConfigError, match=r"listed\.yaml: a space YAML must be a mapping with a 'kind' key"):
        build_space(str(tmp_path / "listed.yaml"), SMOLLM2)


def test_the_space_builders_name_the_missing_model():
    with pytest.raises(ConfigError, match="^elastic spaces need a model: pass --model$"):
        build_space("ffn-grid")
    with pytest.raises(ConfigError, match="^the lonas space needs a model: pass --model$"):
        build_space("lonas")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rank_deltas": [0, -4.5]}, "rank_deltas must be whole numbers; got [0, -4.5]"),
        ({"ffn_fractions": [True, 0.5]}, "ffn_fractions must be numbers in (0, 1]; got [True, 0.5]"),
        ({"ffn_fractions": []}, "ffn_fractions must be non-empty, each in (0, 1]; got []"),
        ({"ffn_fractions": [1.5, 0.5]}, "ffn_fractions must be non-empty, each in (0, 1]; got [1.5, 0.5]"),
        ({"ffn_fractions": [1.0, 0.0]}, "ffn_fractions must be non-empty, each in (0, 1]; got [1.0, 0.0]"),
    ],
)
def test_lonas_settings_outside_the_space_are_refused(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        LonasSpaceConfig(**settings)


def test_repeated_lonas_fractions_and_deltas_give_each_option_once():
    """A fraction or delta listed twice (or two fractions rounding to one width) must not repeat an option:
    the solver's tables would hold a duplicate label."""
    space = build_space("lonas", SMOLLM2, ffn_fractions=[1.0, 0.9999, 0.5], rank_deltas=[0, 0, -4])
    layer = [dict(o.label) for o in space.subspaces[0].layers[0]]
    assert layer == [{"ffn": w, "lora_rank": r} for w in (1536, 768) for r in (32, 28)]


def test_the_lonas_description_of_a_model_with_several_widths():
    space = build_space("lonas", NARROW_LAYER_2, ffn_fractions=[0.5, 1.0, 0.75])
    assert space.description == (
        "LoNAS: FFN ['1', '0.75', '0.5'] of each layer's width (1024..1536) x LoRA rank [32, 28] per block"
    )


def test_module_lists_compare_in_any_order():
    """An adapter's and a --set's module lists are one setting whatever their order (else a false conflict)."""
    assert comparable("elastic_rank_modules", ["v_proj", "q_proj"]) == comparable(
        "elastic_rank_modules", ("q_proj", "v_proj")
    )


def _adapter(folder: Path, **settings) -> Path:
    folder.mkdir(exist_ok=True)
    base = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps({**base, **settings}))
    return folder


def test_an_adapter_path_that_is_no_adapter_folder_is_named(tmp_path):
    with pytest.raises(InvalidInputError, match="adapter must be a PEFT adapter folder; got"):
        read_lora_config(tmp_path / "missing")
    with pytest.raises(InvalidInputError, match=r"has no adapter_config\.json; --adapter takes a PEFT LoRA adapter"):
        read_lora_config(tmp_path)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"modules_to_save": ["lm_head"]}, "uses fully trained extra modules (modules_to_save), which nsc-prune"),
        ({"rank_pattern": {"q_proj": 0}}, "rank_pattern['q_proj'] must be a positive integer; got 0"),
    ],
)
def test_adapter_configs_that_slicing_cannot_reproduce_are_refused(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_lora_config(_adapter(tmp_path / "a", **settings))


def test_a_regex_target_modules_is_named_as_a_regex(tmp_path):
    with pytest.raises(ConfigError, match=re.escape("target_modules is a regex ('.*proj'); list the module names")):
        read_adapter_config(_adapter(tmp_path / "a", target_modules=".*proj"), "llama")


def test_an_adapter_without_lora_alpha_takes_peft_s_default(tmp_path):
    folder = _adapter(tmp_path / "a", target_modules=["v_proj", "down_proj", "q_proj"])
    data = json.loads((folder / "adapter_config.json").read_text())
    del data["lora_alpha"]
    (folder / "adapter_config.json").write_text(json.dumps(data))
    config = read_adapter_config(folder, "llama")
    assert config["lora_alpha"] == 8.0  # peft.LoraConfig's default: the scaling alpha / r
    assert config["elastic_rank_modules"] == ("q_proj", "v_proj") and config["fixed_rank_modules"] == ("down_proj",)


def test_the_adapter_type_is_read_in_any_case_and_needs_an_r(tmp_path):
    assert read_lora_config(_adapter(tmp_path / "lower", peft_type="lora"))["r"] == 8  # PEFT's enum, any case
    folder = _adapter(tmp_path / "no-r")
    data = json.loads((folder / "adapter_config.json").read_text())
    del data["r"]
    (folder / "adapter_config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"is not a LoRA adapter config \(peft_type='LORA'\)"):
        read_lora_config(folder)
