"""The search-only families (gemma2, gemma3_text, gemma3, phi3, granite, olmo2, smollm3): exact counts against
tiny Hugging Face models built with each family's quirks on, cut options against models built at the cut widths,
and the psi_MP matrices of a LLaMA of the same shapes."""

import dataclasses

import pytest

from nsc_prune.core.front import search
from nsc_prune.core.spec import (
    DecoderLayerChoice,
    config_head_dim,
    config_kv_heads,
    decoder_dims,
    decoder_fixed_option,
    decoder_layer_option,
    layer_value,
    require_weights_support,
    search_only_reason,
    supported_model_types,
    weights_model_types,
)
from nsc_prune.errors import ConfigError, UnsupportedArchitectureError
from nsc_prune.presets import presets, resolve_model
from nsc_prune.spaces.registry import build_space

SEQ_LEN = 256  # the decoder spaces' default_seq_len: MACs of a search are per-token MACs x this

# Each family with its quirks on: explicit head_dim != hidden / heads, tied embeddings, soft-capping, sliding
# windows, fused projections (phi3 always), multipliers, q/k norms, no_rope_layers, biases where the family has them.
FAMILIES = {
    "gemma2": {
        "model_type": "gemma2",
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,  # 4 x 16 = 64 != 48
        "vocab_size": 70,
        "tie_word_embeddings": True,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "sliding_window": 8,
        "query_pre_attn_scalar": 16,
    },
    "gemma2-bias-untied": {
        "model_type": "gemma2",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 24,
        "vocab_size": 50,
        "tie_word_embeddings": False,
        "attention_bias": True,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "vocab_size": 60,
        "tie_word_embeddings": True,
        "sliding_window": 8,
        "query_pre_attn_scalar": 32,
    },
    "phi3": {
        "model_type": "phi3",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 80,
        "partial_rotary_factor": 0.75,
        "tie_word_embeddings": True,  # Phi-4-mini ties them
        "pad_token_id": 0,
    },
    "granite": {
        "model_type": "granite",
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 90,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125,
        "logits_scaling": 8.0,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    },
    "olmo2": {
        "model_type": "olmo2",
        "hidden_size": 64,
        "intermediate_size": 112,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "tie_word_embeddings": False,
    },
    "olmo2-bias": {
        "model_type": "olmo2",
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 40,
        "attention_bias": True,
    },
    "mistral-bias-flags": {  # MistralAttention and MistralMLP hard-code bias=False: the flags change nothing
        "model_type": "mistral",
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 40,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "qwen3-bias-flags": {  # attention_bias puts biases on q/k/v/o; Qwen3MLP hard-codes bias=False
        "model_type": "qwen3",
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "vocab_size": 40,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "smollm3": {
        "model_type": "smollm3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 90,
        "no_rope_layers": [1, 1, 1, 0],
        "tie_word_embeddings": True,
        "pad_token_id": 0,
    },
}


def hf_model(config):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))


def hf_counts(model):
    """Parameters (a tied weight once) and the Linear layers' MACs at SEQ_LEN tokens (lm_head included)."""
    import torch

    params = sum(p.numel() for p in model.parameters())  # parameters() yields a shared tensor once
    linear = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    return params, linear * SEQ_LEN


def spec_counts(config, ffn=None, kv=None):
    dims = decoder_dims(config)
    choice = DecoderLayerChoice(
        ffn=dims.intermediate_size if ffn is None else ffn, kv_heads=dims.num_key_value_heads if kv is None else kv
    )
    block = decoder_layer_option(dims, choice, "xavier", {})
    fixed = decoder_fixed_option(dims)
    layers = dims.num_hidden_layers
    return layers * block.params + fixed.params, (layers * block.macs + fixed.macs) * SEQ_LEN


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_counts_equal_hugging_face_modules(name):
    model = hf_model(FAMILIES[name])
    assert spec_counts(FAMILIES[name]) == hf_counts(model)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_searchs_full_point_is_the_hugging_face_model(name):
    """The front's largest point (every layer full) of ffn-heads-depth, at the search's own default seq_len."""
    space = build_space("ffn-heads-depth", FAMILIES[name], ffn_step=16)
    assert space.default_seq_len == SEQ_LEN
    full = search(space, cost="params").points[-1]
    assert (full.params, full.macs) == hf_counts(hf_model(FAMILIES[name]))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_cut_options_equal_a_model_built_at_the_cut_widths(name):
    """An FFN cut and a KV-group cut (each kept group with its query heads), uniform over the layers, against
    the model transformers builds with the smaller intermediate_size / heads (head_dim held)."""
    config = FAMILIES[name]
    dims = decoder_dims(config)
    ffn = dims.intermediate_size // 2
    narrower = {**config, "intermediate_size": ffn}
    assert spec_counts(config, ffn=ffn) == hf_counts(hf_model(narrower))
    if dims.num_key_value_heads > 1:
        kv = dims.num_key_value_heads // 2
        fewer = {
            **config,
            "num_key_value_heads": kv,
            "num_attention_heads": kv * dims.group_size,
            "head_dim": dims.head_dim,
        }
        assert spec_counts(config, kv=kv) == hf_counts(hf_model(fewer))


def test_gemma3_multimodal_config_counts_its_language_model():
    """gemma3's text model is nested under text_config; the search counts the language model (Gemma3ForCausalLM
    of that text config), not the vision tower, and fills Gemma3TextConfig's defaults as transformers does."""
    text = {k: v for k, v in FAMILIES["gemma3_text"].items() if k != "model_type"}
    nested = {"model_type": "gemma3", "text_config": {**text, "model_type": "gemma3_text"}, "vision_config": {}}
    dims = decoder_dims(nested)
    assert dims.model_type == "gemma3"
    assert dataclasses.replace(dims, model_type="gemma3_text") == decoder_dims(FAMILIES["gemma3_text"])
    assert spec_counts(nested) == hf_counts(hf_model(FAMILIES["gemma3_text"]))
    sparse = decoder_dims({"model_type": "gemma3", "text_config": {"hidden_size": 2560, "num_hidden_layers": 34}})
    assert (sparse.head_dim, sparse.num_attention_heads, sparse.num_key_value_heads) == (256, 8, 4)
    assert (sparse.vocab_size, sparse.intermediate_size, sparse.tie_word_embeddings) == (262_208, 9216, True)
    with pytest.raises(ConfigError, match="under 'text_config'"):
        decoder_dims({"model_type": "gemma3"})


@pytest.mark.parametrize(("top", "inner"), [(None, False), (False, None), (False, True), (True, False)])
def test_gemma3_multimodal_ties_its_head_by_the_wrappers_flag(top, inner):
    """Gemma3ForConditionalGeneration ties lm_head by the top-level tie_word_embeddings (default true), not
    text_config's: the search counted the head by text_config's, off by vocab x hidden either way."""
    transformers = pytest.importorskip("transformers")
    text = {k: v for k, v in FAMILIES["gemma3_text"].items() if k != "model_type"}
    text |= {} if inner is None else {"tie_word_embeddings": inner}
    flag = {} if top is None else {"tie_word_embeddings": top}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 28, "patch_size": 14}  # fmt: skip
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, **flag)
    model = transformers.Gemma3ForConditionalGeneration(config)
    tied = model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    language = sum(p.numel() for name, p in model.named_parameters() if ".language_model." in name or "lm_head" in name)
    nested = {"model_type": "gemma3", "text_config": text, **flag}
    assert decoder_dims(nested).tie_word_embeddings is tied is (top is not False)
    assert spec_counts(nested)[0] == language  # named_parameters() yields a tied weight once


@pytest.mark.parametrize("name", ["granite", "gemma2", "smollm3"])
def test_a_null_tie_is_refused_not_read_as_untied(name):
    """null read as false (untied) where leaving it out means the family's default, and transformers refuses it."""
    with pytest.raises(ConfigError, match="'tie_word_embeddings' must be true or false .*got None, which transformers"):
        decoder_dims({**FAMILIES[name], "tie_word_embeddings": None})


@pytest.mark.parametrize("name", ["gemma2", "phi3", "olmo2"])
def test_psi_mp_scores_the_matrices_of_a_llama_of_the_same_shapes(name):
    """Fused qkv/gate_up (phi3), post-norms (gemma2) and q/k norms (olmo2) change counts, never the scored
    matrices: the capacity equals a llama's with the same head_dim, heads and widths."""
    config = FAMILIES[name]
    dims = decoder_dims(config)
    llama = decoder_dims({**config, "model_type": "llama", "head_dim": dims.head_dim})
    choice = DecoderLayerChoice(ffn=dims.intermediate_size, kv_heads=dims.num_key_value_heads)
    ours, theirs = (decoder_layer_option(d, choice, "xavier", {}) for d in (dims, llama))
    assert [(m.name, m.rows, m.cols, m.count) for m in ours.matrices] == [
        (m.name, m.rows, m.cols, m.count) for m in theirs.matrices
    ]
    assert ours.nsc == theirs.nsc and ours.macs == theirs.macs


@pytest.mark.parametrize("model_type", [t for t in supported_model_types() if t != "gemma3"])
def test_a_config_that_leaves_out_optional_fields_reads_as_transformers_fills_them(model_type):
    """Mistral's missing num_key_value_heads is 8 and Qwen3's head_dim 128 in transformers, not heads and hidden /
    heads: the search counted a config.json that left them out as another model (gemma3 nests: its own test)."""
    transformers = pytest.importorskip("transformers")
    given = {"model_type": model_type, "hidden_size": 128, "intermediate_size": 96, "num_hidden_layers": 2}
    given |= {"num_attention_heads": 32, "vocab_size": 100}
    filled = {**transformers.AutoConfig.for_model(**given).to_dict(), "model_type": model_type}
    assert decoder_dims(given) == decoder_dims(filled)
    # the weights jobs' readers of the same config (checkpoint shapes, permutations, exports) agree
    per_layer = lambda c: layer_value(c, 1, "num_key_value_heads") or c["num_attention_heads"]  # noqa: E731
    for read in (config_kv_heads, config_head_dim, per_layer):
        assert read(given) == read(filled), model_type


def test_gemma_head_dim_default_is_not_hidden_over_heads():
    config = {k: v for k, v in FAMILIES["gemma2"].items() if k != "head_dim"}
    assert decoder_dims(config).head_dim == 256  # Gemma2Config's default, as transformers builds it


FAMILY_PRESETS = ("gemma-2-9b", "gemma-3-1b", "phi-4-mini", "granite-3.3-8b", "olmo-2-7b", "smollm3-3b")


@pytest.mark.parametrize("name", [p for p in FAMILY_PRESETS if p in presets()])
@pytest.mark.parametrize("space", ["ffn-grid", "ffn-heads", "ffn-heads-depth"])
def test_family_presets_search_the_elastic_spaces(name, space):
    config = resolve_model(name).config
    result = search(build_space(space, config))
    full, dims = result.points[-1], decoder_dims(config)
    assert len(full.layers) == dims.num_hidden_layers
    layers = dims.num_hidden_layers
    block = decoder_layer_option(
        dims, DecoderLayerChoice(dims.intermediate_size, dims.num_key_value_heads), "xavier", {}
    )
    assert full.params == layers * block.params + decoder_fixed_option(dims).params
    assert all(a.params < b.params and a.nsc < b.nsc for a, b in zip(result.points, result.points[1:]))


def test_every_family_preset_is_bundled():
    assert set(FAMILY_PRESETS) <= set(presets())


def test_weights_jobs_refuse_search_only_types_in_one_line():
    for config in FAMILIES.values():
        reason = search_only_reason(config["model_type"])
        if config["model_type"] in (
            "gemma2",
            "gemma3_text",
            "granite",
            "mistral",
            "olmo2",
            "phi3",
            "qwen3",
            "smollm3",
        ):  # full weights support: tests/hf/test_extract_*.py
            assert not reason
            continue
        assert reason
        with pytest.raises(UnsupportedArchitectureError) as caught:
            require_weights_support(config, "extraction")
        message = str(caught.value)
        assert message.startswith(f"extraction of {config['model_type']} is not supported yet: {reason}; ")
        assert (
            "supported: gemma2, gemma3_text, granite, llama, mistral, olmo2, phi3, qwen2, qwen3, smollm3." in message
            and "\n" not in message
        )
    text = {k: v for k, v in FAMILIES["gemma3_text"].items() if k != "model_type"}
    with pytest.raises(
        UnsupportedArchitectureError, match="^extraction of gemma3 is not supported yet: the multimodal"
    ):
        require_weights_support({"model_type": "gemma3", "text_config": text}, "extraction")  # its vision tower
    require_weights_support({"model_type": "llama"}, "extraction")  # supported: passes
    require_weights_support({"model_type": "gpt2"}, "extraction")  # unknown: the job's own check names it


def test_weights_model_types_are_the_shipped_modeling_classes():
    from nsc_prune.hf.modeling import ARCHITECTURES, STOCK_ARCHITECTURES

    assert set(weights_model_types()) == set(ARCHITECTURES) == set(STOCK_ARCHITECTURES)


# The model cards' sizes (Hugging Face "Model size", billions, 2 decimals): an independent check of each preset.
PUBLISHED_BILLIONS = {
    "gemma-2-9b": 9.24,
    "gemma-3-1b": 1.00,
    "phi-4-mini": 3.84,
    "granite-3.3-8b": 8.17,
    "olmo-2-7b": 7.30,
    "smollm3-3b": 3.08,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_family_presets_have_their_published_size(name):
    params, _ = spec_counts(resolve_model(name).config)
    assert round(params / 1e9, 2) == PUBLISHED_BILLIONS[name]


@pytest.mark.parametrize("key", ["head_dim", "num_key_value_heads"])
@pytest.mark.parametrize("model_type", sorted(set(supported_model_types()) - {"gemma3"}))
def test_a_null_size_is_refused_where_transformers_refuses_it_and_counted_as_transformers_builds_it(model_type, key):
    """A null head_dim or num_key_value_heads was counted as hidden / heads (or the query heads) where transformers
    refuses the config or cannot build its model (a null head_dim outside llama and mistral; a null KV count in
    gemma2/3 and mistral): Gemma 2's was counted as hidden / heads, where leaving it out means 256."""
    errors = pytest.importorskip("huggingface_hub.errors")
    # head_dim 8 is not hidden / heads (4), and 8 heads are no family's default KV count: each reading differs
    config = {"model_type": model_type, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 40, "pad_token_id": 0,
              key: None}  # fmt: skip
    try:
        model = hf_model(config)
    except (errors.StrictDataclassError, TypeError):  # a config field refused, or a model that cannot be built
        with pytest.raises(ConfigError, match=f"'{key}' must be a positive integer or absent .*got None"):
            decoder_dims(config)
    else:
        assert spec_counts(config) == hf_counts(model)


def test_a_defaulted_kv_count_that_does_not_divide_the_heads_is_named_as_the_default():
    """Qwen2 without num_key_value_heads takes 32: the message named 32 as if config.json had set it."""
    config = {"model_type": "qwen2", "hidden_size": 56, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 14, "vocab_size": 40}  # fmt: skip
    with pytest.raises(ConfigError, match=r"sets no num_key_value_heads, so model_type 'qwen2' takes its default, 32"):
        decoder_dims(config)
    with pytest.raises(ConfigError, match=r"fields \['num_attention_heads'\] must be positive integers"):
        decoder_dims({**config, "num_attention_heads": "14"})  # a TypeError in the default's message
    wrapper = {"model_type": "gemma3", "num_key_value_heads": 2, "text_config": {**config, "model_type": "gemma3_text"}}
    with pytest.raises(
        ConfigError, match=r"takes its default, 4, .*\(model_type 'gemma3' reads these fields under 'text_config'\)"
    ):
        decoder_dims(wrapper)
