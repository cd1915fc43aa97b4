"""LLaMA-family specs: exact counts (against real HF modules), the LoNAS facts, preset contract."""

import json
import os
import re

import pytest

from nsc_prune.core.capacity import init_std, psi_mp
from nsc_prune.core.front import search
from nsc_prune.core.spec import (
    DecoderLayerChoice,
    decoder_dims,
    decoder_fixed_option,
    decoder_layer_option,
    layer_dims,
    layer_value,
    require_weights_support,
    score,
)
from nsc_prune.errors import ConfigError, UnsupportedArchitectureError
from nsc_prune.presets import presets, resolve_model
from nsc_prune.spaces.registry import build_space, bundled_spaces

TINY = {
    "llama-mha": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 100,
    },
    "llama-gqa-tied": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 120,
        "tie_word_embeddings": True,
    },
    "llama-biases": {
        "model_type": "llama",
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 50,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 90,
        "head_dim": 8,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 112,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 80,
        "tie_word_embeddings": False,
    },
    "qwen2-flag-off": {
        "model_type": "qwen2",
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,  # HF ignores the flag
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 40,
        "attention_bias": False,
    },
    "qwen3": {
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 112,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 80,
        "head_dim": 32,
        "tie_word_embeddings": False,
    },
}


def full_counts(config):
    dims = decoder_dims(config)
    choice = DecoderLayerChoice(ffn=dims.intermediate_size, kv_heads=dims.num_key_value_heads)
    block = decoder_layer_option(dims, choice, "xavier", {})
    fixed = decoder_fixed_option(dims)
    return dims.num_hidden_layers * block.params + fixed.params, dims.num_hidden_layers * block.macs + fixed.macs


@pytest.mark.parametrize("name", sorted(TINY))
def test_counts_equal_hugging_face_modules(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**TINY[name])
    model = transformers.AutoModelForCausalLM.from_config(config)
    params, macs = full_counts(TINY[name])
    assert params == sum(p.numel() for p in model.parameters())
    linear_macs = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert macs == linear_macs


def test_a_path_named_like_a_preset_is_read_as_the_path(tmp_path, monkeypatch):
    """./llama-7b, /p/llama-7b and /p/llama-7b.json joined onto the presets folder named the preset: a pruned
    checkpoint saved under a preset's name was searched as the unpruned preset. A bare name is the preset, with a
    warning when a folder of that name is here too."""
    folder = tmp_path / "llama-7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY["llama-mha"]))
    (tmp_path / "llama-7b.json").write_text(json.dumps(TINY["llama-mha"]))
    monkeypatch.chdir(tmp_path)
    for given in ("./llama-7b", str(folder), str(tmp_path / "llama-7b.json")):
        assert resolve_model(given).config["num_hidden_layers"] == 2, given
    with pytest.warns(UserWarning, match=r"llama-7b names a preset and a folder here; reading the preset"):
        assert resolve_model("llama-7b").config["num_hidden_layers"] == 32


def test_llama_7b_lonas_facts():
    model = resolve_model("llama-7b")
    result = search(build_space("lonas", model.config))
    assert len(result.points) == 129  # one per FFN-sum level: sums of 32 widths in 4..8 x 1376
    assert result.points[-1].params == 6_738_415_616
    assert result.points[0].params == 4_574_154_752
    assert round(result.points[-1].macs / 1e12, 2) == 1.71  # LoNAS "TFLOPs" at 256 tokens
    best = result.points[result.index_under(5_700_000_000)]
    assert [layer["ffn"] for layer in best.layers] == [9632] * 2 + [8256] * 30
    assert {layer["lora_rank"] for layer in best.layers} == {32}


def test_per_head_attention_structure():
    dims = decoder_dims(resolve_model("llama-3-8b").config)
    option = decoder_layer_option(dims, DecoderLayerChoice(ffn=14336, kv_heads=8, lora={"q_proj": 16}), "xavier", {})
    shapes = {m.name: (m.rows, m.cols, m.count) for m in option.matrices}
    assert shapes["q_proj"] == (128, 4096, 32) and shapes["k_proj"] == (128, 4096, 8)
    assert shapes["o_proj"] == (4096, 4096, 1) and shapes["down_proj"] == (4096, 14336, 1)  # one O (section 3.3)
    assert shapes["q_proj.lora_A"] == (16, 4096, 1) and shapes["q_proj.lora_B"] == (4096, 16, 1)
    expected = sum(m.count * psi_mp(m.rows, m.cols, init_std(m.rows, m.cols, "xavier")) for m in option.matrices)
    assert option.nsc == pytest.approx(expected, rel=1e-12)


def test_psi_mp_tells_apart_how_kv_groups_spread_over_layers():
    """Q, K and V per head make a layer's attention value linear in its heads; the one O over the kept heads is what
    makes it concave, so two layers with 2 + 2 KV groups score above 3 + 1 (with O per head both scored the same and
    the DP's tie-break chose the spread)."""
    dims = decoder_dims(resolve_model("llama-3-8b").config)

    def attention(kv_heads: int) -> float:
        return decoder_layer_option(dims, DecoderLayerChoice(ffn=0, kv_heads=kv_heads), "xavier", {}).nsc

    assert 2 * attention(2) > attention(3) + attention(1) + 1.0
    assert attention(3) - attention(2) < attention(2) - attention(1)


def test_the_lonas_space_puts_phi3s_lora_on_its_fused_projections():
    """Phi-4-mini's layers hold qkv_proj and gate_up_proj, where PEFT puts the LoRA of q/k/v and gate/up: one A over
    the input and one B over the stacked rows (q + 2 kv, 2 ffn), at the elastic rank; down_proj's at r_max."""
    config = resolve_model("phi-4-mini").config
    dims = decoder_dims(config)
    option = build_space("lonas", config).subspaces[0].layers[0][1]  # full width, the smaller rank
    shapes = {m.name: (m.rows, m.cols) for m in option.matrices if m.lora}
    q, kv, r = dims.num_attention_heads * dims.head_dim, dims.num_key_value_heads * dims.head_dim, 28
    assert shapes == {
        "qkv_proj.lora_A": (r, dims.hidden_size),
        "qkv_proj.lora_B": (q + 2 * kv, r),
        "gate_up_proj.lora_A": (r, dims.hidden_size),
        "gate_up_proj.lora_B": (2 * dims.intermediate_size, r),
        "down_proj.lora_A": (32, dims.intermediate_size),
        "down_proj.lora_B": (dims.hidden_size, 32),
    }


@pytest.mark.parametrize(
    ("model", "settings", "message"),
    [
        ("llama-7b", {"elastic_rank_modules": ["qkv_proj"]}, "LoRA modules ['qkv_proj'] do not exist in a llama layer"),
        (
            "phi-4-mini",
            {"fixed_rank_modules": ["v_proj"]},
            "['qkv_proj'] would have both an elastic and a fixed rank (a phi3 layer holds their parts in one module)",
        ),
        (
            "llama-7b",
            {"fixed_rank_modules": ["q_proj"]},
            "['q_proj'] would have both an elastic and a fixed rank: list",
        ),
    ],
)
def test_lonas_modules_a_layer_lacks_or_splits_are_refused(model, settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_space("lonas", resolve_model(model).config, **settings)


def test_score_is_sum_over_blocks():
    config = resolve_model("llama-2-7b").config
    deeper = {**config, "num_hidden_layers": 40}
    assert score(deeper) == pytest.approx(score(config) * 40 / 32, rel=1e-12)


@pytest.mark.parametrize("name", presets())
def test_every_preset_builds_the_lonas_space(name):
    model = resolve_model(name)
    result = search(build_space("lonas", model.config))
    dims = decoder_dims(model.config)
    assert len(result.points[-1].layers) == dims.num_hidden_layers
    assert result.points[-1].layers[0]["ffn"] == dims.intermediate_size
    assert all(a.params < b.params and a.nsc < b.nsc for a, b in zip(result.points, result.points[1:]))


@pytest.mark.parametrize("space", bundled_spaces())
def test_every_bundled_space_yaml_loads(space):
    model = resolve_model("smollm2-135m").config
    try:
        built = build_space(space, model)
    except ConfigError as err:  # NAS spaces define their whole network and refuse a model
        assert "it takes no model" in str(err)
        built = build_space(space)
    assert built.subspaces and all(sub.layers for sub in built.subspaces)


def test_a_model_type_or_layer_index_python_cannot_look_up_is_one_line():
    """A list as model_type was "unhashable type" in the search and every weights job; "²" passed isdigit() and
    failed int()."""
    config = resolve_model("smollm2-135m").config
    with pytest.raises(UnsupportedArchitectureError, match=r"model_type \['llama'\] is not supported"):
        decoder_dims({**config, "model_type": ["llama"]})
    with pytest.raises(UnsupportedArchitectureError, match=r"model_type must be a string such as 'llama'; got \["):
        require_weights_support({**config, "model_type": ["llama"]}, "extraction")
    with pytest.raises(ConfigError, match=r"'per_layer_config' must map layer indices \(0, 1, .*got '²'"):
        layer_value({**config, "per_layer_config": {"²": {"intermediate_size": 768}}}, 0, "intermediate_size")
    twice = {"1": {"intermediate_size": 768}, "01": {"intermediate_size": 512}}  # the later one won, unsaid
    with pytest.raises(ConfigError, match="no leading zeros.*got '01'"):
        layer_value({**config, "per_layer_config": twice}, 1, "intermediate_size")


@pytest.mark.parametrize("key", ["nsc_per_layer_attention", "per_layer_config"])
def test_a_layers_query_heads_without_its_kv_heads_are_refused_by_every_reader(key):
    """layer_dims took the layer's KV heads to be its query heads, layer_value (the weights' shapes) the family's
    default: 4 and 8 for a mistral layer of 4 heads; the pruned model's attention reads both keys."""
    config = {**resolve_model("smollm2-135m").config, "model_type": "mistral", "num_attention_heads": 8}
    config.pop("num_key_value_heads")
    config[key] = {"1": {"num_attention_heads": 4}}
    for read in (layer_dims, lambda c: layer_value(c, 1, "num_key_value_heads")):
        with pytest.raises(
            ConfigError, match=r"layer 1 of the per-layer config \(.*\) sets num_attention_heads but not num_k"
        ):
            read(config)
    config[key] = {"1": {"num_key_value_heads": 2}}  # the search read it; the pruned model's KeyError in profile
    with pytest.raises(ConfigError, match="sets num_key_value_heads but not num_attention_heads"):
        layer_dims(config)


def test_unknown_space_key_warns_and_missing_model_fails(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("kind: lonas\nffn_fractions: [1.0, 0.5]\nsurprise: 1\n")
    with pytest.warns(UserWarning, match="ignoring unknown keys \\['surprise'\\]"):
        space = build_space(str(path), resolve_model("smollm2-135m").config)
    assert len(space.subspaces[0].layers[0]) == 4
    with pytest.raises(ConfigError, match="needs a model"):
        build_space("lonas", None)
    path.write_text("kind: lonas\n1: 2\n")  # YAML's int key was a TypeError from difflib
    with pytest.warns(UserWarning, match="ignoring unknown keys \\['1'\\]"):
        build_space(str(path), resolve_model("smollm2-135m").config)
    path.write_text("kind: lonas\nffn_fractions: [1.5]\n")
    with pytest.raises(ConfigError, match="ffn_fractions must be"):
        build_space(str(path), resolve_model("smollm2-135m").config)
    upper = tmp_path / "Mine.YAML"  # was looked up as the bundled space 'Mine.YAML'
    upper.write_text("kind: lonas\nffn_fractions: [1.0, 0.5]\n")
    assert len(build_space(str(upper), resolve_model("smollm2-135m").config).subspaces[0].layers[0]) == 4
    with pytest.raises(ConfigError, match="space file .*Other.YML does not exist"):
        build_space(str(tmp_path / "Other.YML"), resolve_model("smollm2-135m").config)


def test_config_errors():
    with pytest.raises(
        UnsupportedArchitectureError,
        match="'gpt2' is not supported; supported LLaMA-family types: gemma2, gemma3_text, granite, llama, mistral, olmo2, phi3, qwen2, qwen3, smollm3",
    ):
        decoder_dims({"model_type": "gpt2"})
    dense = {
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,  # Qwen3's and Mistral's defaults (32, 8) are more than 2 heads can group
        "vocab_size": 5,
    }
    for model_type, key in (("qwen3", "num_experts"), ("mistral", "num_local_experts"), ("llama", "n_routed_experts")):
        with pytest.raises(
            UnsupportedArchitectureError, match=f"{model_type} config with mixture-of-experts layers \\({key}=8\\)"
        ):
            decoder_dims({"model_type": model_type, **dense, key: 8})
        assert decoder_dims({"model_type": model_type, **dense, key: 1}).intermediate_size == 16  # one expert: dense
        with pytest.raises(UnsupportedArchitectureError, match=f"\\({key}=2\\)"):  # the fewest experts routed
            decoder_dims({"model_type": model_type, **dense, key: 2})
    for written in (8.0, "8"):  # were priced as a dense model
        with pytest.raises(UnsupportedArchitectureError, match="mixture-of-experts layers"):
            decoder_dims({"model_type": "qwen3", **dense, "num_experts": written})
    with pytest.raises(ConfigError, match=r"sets no head_dim and num_attention_heads \(16\) is more than hidden_siz"):
        decoder_dims({"model_type": "llama", **dense, "num_attention_heads": 16, "num_key_value_heads": 16})
    with pytest.raises(ConfigError, match="missing required fields \\['intermediate_size'\\]"):
        decoder_dims(
            {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 5}
        )
    for field, value in [
        ("hidden_size", "4096"),
        ("num_attention_heads", None),
        ("vocab_size", 1.5),
        ("num_hidden_layers", True),
    ]:
        with pytest.raises(ConfigError, match=f"\\['{field}'\\] must be positive integers"):
            decoder_dims({**TINY["llama-mha"], field: value})
    bad_gqa = {**TINY["llama-mha"], "num_key_value_heads": 3}
    with pytest.raises(ConfigError, match="multiple of num_key_value_heads"):
        decoder_dims(bad_gqa)
    with pytest.raises(ConfigError, match="'num_hidden_layers' must be at most 1,000 .*; got 10,000,000"):
        decoder_dims({**TINY["llama-mha"], "num_hidden_layers": 10_000_000})  # a typo ran for minutes
    assert decoder_dims({**TINY["llama-mha"], "num_hidden_layers": 1_000}).num_hidden_layers == 1_000


def test_model_resolution(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text(json.dumps(TINY["qwen2"]))
    assert resolve_model(str(tmp_path / "mine")).config["model_type"] == "qwen2"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(
        ConfigError, match="not in the local Hugging Face cache.*`hf download org/never-downloaded config.json`"
    ):
        resolve_model("org/never-downloaded")
    with pytest.raises(ConfigError, match="./nothere does not exist"):
        resolve_model("./nothere")
    snap = tmp_path / "hub" / "models--org--cached" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(TINY["mistral"]))
    (tmp_path / "hub" / "models--org--cached" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--cached" / "refs" / "main").write_text("abc123")
    assert resolve_model("org/cached").config["model_type"] == "mistral"
    monkeypatch.delenv("HF_HUB_CACHE")  # HF_HOME='~/hf', quoted: huggingface_hub expands it, and so does nsc-prune
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HOME", "~")
    assert resolve_model("org/cached").config["model_type"] == "mistral"
    # huggingface_hub's other two: the old name of HF_HUB_CACHE, and XDG_CACHE_HOME where HF_HOME is unset
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_model("org/cached").config["model_type"] == "mistral"
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE")
    (tmp_path / "xdg" / "huggingface").mkdir(parents=True)
    (tmp_path / "hub").rename(tmp_path / "xdg" / "huggingface" / "hub")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_model("org/cached").config["model_type"] == "mistral"
    with pytest.raises(ConfigError, match="unknown model 'lama-7b'. Did you mean llama-7b"):
        resolve_model("lama-7b")
    with pytest.raises(ConfigError, match="my-model.json does not exist; --model takes"):
        resolve_model("my-model.json")


def test_a_cached_hub_id_reads_the_snapshot_refs_main_names_else_the_newest(tmp_path, monkeypatch):
    """huggingface_hub's own choice: the revision refs/main points to, not the newest or oldest download."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--m"
    for age, (snapshot, model_type) in enumerate([("old", "mistral"), ("new", "qwen2")]):
        (repo / "snapshots" / snapshot).mkdir(parents=True)
        config = repo / "snapshots" / snapshot / "config.json"
        config.write_text(json.dumps(TINY[model_type]))
        os.utime(config, (1_000_000 + age, 1_000_000 + age))
    assert resolve_model("org/m").config["model_type"] == "qwen2"  # no refs/main: the newest
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("old\n")
    assert resolve_model("org/m").config["model_type"] == "mistral"


_SMALL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "entry"),
    [
        ("intermediate_size", {"intermediate_size": 0}),
        ("num_key_value_heads", {"num_attention_heads": 4, "num_key_value_heads": 0}),
    ],
)
def test_a_zero_size_in_a_per_layer_entry_is_refused(key, entry):
    """A per-layer entry bypasses the global fields' parser: DecoderDims itself refuses the zero."""
    config = {**_SMALL, "per_layer_config": {"1": entry}}
    with pytest.raises(ConfigError, match=f"layer 1 of the per-layer config: config field '{key}' must be a posit"):
        layer_dims(config)


@pytest.mark.parametrize(("ffn", "kv", "message"), [(129, 2, "FFN width must be in 0..128; got 129"),
                                                    (-1, 2, "FFN width must be in 0..128; got -1"),
                                                    (128, 3, "kv_heads must be in 0..2; got 3")])  # fmt: skip
def test_a_layer_choice_wider_than_the_model_is_refused(ffn, kv, message):
    from nsc_prune.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=re.escape(message)):
        decoder_layer_option(decoder_dims(_SMALL), DecoderLayerChoice(ffn=ffn, kv_heads=kv), "xavier", {})


def test_lora_on_a_projection_cut_to_nothing_adds_no_factors():
    """A rank on gate_proj of a layer whose FFN is cut away: no zero-row factor (psi_MP refuses it), the option is
    the one without that adapter."""
    dims = decoder_dims(_SMALL)
    cut = decoder_layer_option(dims, DecoderLayerChoice(ffn=0, kv_heads=2, lora={"gate_proj": 8}), "xavier", {})
    plain = decoder_layer_option(dims, DecoderLayerChoice(ffn=0, kv_heads=2), "xavier", {})
    assert cut.matrices == plain.matrices and cut.nsc == plain.nsc and cut.params == plain.params
    kept = decoder_layer_option(dims, DecoderLayerChoice(ffn=128, kv_heads=2, lora={"gate_proj": 8}), "xavier", {})
    assert [m.name for m in kept.matrices if m.lora] == ["gate_proj.lora_A", "gate_proj.lora_B"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"initializer_range": -1}, "'initializer_range' must be a positive number; got -1"),
        ({"initializer_range": 0}, "'initializer_range' must be a positive number; got 0"),
        ({"per_layer_config": {"2": {"intermediate_size": 64}}}, "must name layers 0..1; got layers [2]"),
    ],
)
def test_an_init_range_or_a_layer_outside_the_model_is_refused(change, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        decoder_dims({**_SMALL, **change}) and layer_dims({**_SMALL, **change})
