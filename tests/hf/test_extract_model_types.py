"""Extraction beyond LLaMA (issue 6): Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k norms), Granite (embedding, residual
and attention multipliers, logits_scaling), SmolLM3 (layers without RoPE), and output-folder safety.

Each family gets a tiny random model built here (4 layers, GQA 4:2, head_dim 16) with random biases and
norm weights, so a bias or norm that is dropped, mis-sliced or left at its init shows in the logits, and
(for Mistral and Qwen) a 4-token sliding window, so a layer that changes attention type when layers are
dropped shows too; SmolLM3 skips RoPE in every other layer, so a ``no_rope_layers`` list not sliced with the
kept layers shows, and Granite's multipliers are far from 1, so one the pruned model ignores shows. The reference
is ``masked_reference`` of tests/hf/test_extract_heads_depth.py: the stock model (+ unmerged LoRA) with the dropped
channels and heads zeroed and dropped layers made identities.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from safetensors.torch import load_file, save_file  # noqa: E402
from test_extract_heads_depth import ATOL, logits, masked_reference  # noqa: E402

from nsc_prune._files import RECORD_NAME  # noqa: E402
from nsc_prune.cli import main  # noqa: E402
from nsc_prune.core.spec import NO_KV_CUTS, model_params  # noqa: E402
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError  # noqa: E402
from nsc_prune.hf.cut.keep import LayerOrder  # noqa: E402
from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders  # noqa: E402
from nsc_prune.hf.extract import ExtractOptions, extract_plan, extract_subnet  # noqa: E402
from nsc_prune.hf.modeling import ARCHITECTURES, STOCK_ARCHITECTURES  # noqa: E402
from nsc_prune.hf.weights.adapter import open_adapter  # noqa: E402
from nsc_prune.hf.weights.base import open_base  # noqa: E402
from nsc_prune.hf.weights.loading import load_pruned  # noqa: E402
from nsc_prune.hf.weights.safetensors_io import index_model_dir  # noqa: E402
from nsc_prune.plan import layer_plans  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:base .* has no tokenizer files")  # the tiny models have none

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GRANITE = {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.2, "logits_scaling": 4.0}
GEMMA = {"attention_bias": True, "sliding_window": 4, "query_pre_attn_scalar": 9, "pad_token_id": 0}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "granite": ("GraniteConfig", {"mlp_bias": True, "attention_bias": True, **GRANITE}),
    "llama": ("LlamaConfig", {"mlp_bias": True, "attention_bias": True}),
    "mistral": ("MistralConfig", {"sliding_window": 4}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2}),  # q/k/v biases
    "qwen3": (
        "Qwen3Config",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2, "attention_bias": True},
    ),
    # no RoPE in layers 1 and 3 ([1, 0, 1, 0]); without layer 1, base layer 3 is output layer 2: [1, 1, 0]
    "smollm3": ("SmolLM3Config", {"no_rope_layer_interval": 2, "attention_bias": True, "pad_token_id": 0}),
    # norms after attention and the MLP, q/k norms over the whole projection: no KV-group cut (NO_KV_CUTS)
    "olmo2": ("Olmo2Config", {"attention_bias": True}),
    # four norms per block, RMSNorm(1 + w), scaled embeddings, query_pre_attn_scalar, sliding and global layers
    # alternating (base layer 2 slides: output layer 1 after layer 1 is dropped), attention and logit soft-capping
    "gemma2": ("Gemma2Config", {**GEMMA, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}),
    # Gemma 2's block with per-head q/k norms, a sliding window every other layer, a local RoPE base
    "gemma3_text": ("Gemma3TextConfig", {**GEMMA, "sliding_window_pattern": 2, "rope_local_base_freq": 100.0}),
}
# Which projections carry a bias: (q/k/v, o, gate/up/down).
BIASES = {"granite": (True, True, True), "llama": (True, True, True), "mistral": (False, False, False),
          "qwen2": (True, False, False), "qwen3": (True, True, False), "smollm3": (True, True, False),
          "olmo2": (True, True, False), "gemma2": (True, True, False), "gemma3_text": (True, True, False)}  # fmt: skip
DROP = {"ffn": 0, "kv_groups": 0, "keep": False}
# Varied widths, one and two KV groups, layer 1 dropped: under Qwen's max_window_layers=2, base layer 2 slides
# and becomes layer 1 of the output, so a config that is not renumbered makes it full attention.
PLAN = [{"ffn": 96, "kv_groups": 2}, DROP, {"ffn": 40, "kv_groups": 1}, {"ffn": 17, "kv_groups": 1}]


def family_plan(family: str, layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``layers`` with every KV group kept for the families that cannot cut them (``NO_KV_CUTS``: olmo2)."""
    if family not in NO_KV_CUTS:
        return layers
    return [{**layer, "kv_groups": 2} if layer.get("keep", True) else layer for layer in layers]


@dataclass(frozen=True)
class TinyModel:
    """A tiny checkpoint on disk (the fields ``masked_reference`` reads)."""

    base: Path
    adapter: Path | None
    config: dict[str, Any]


def build_tiny(
    root: Path, family: str, lora: bool = True, max_shard_size: str = "40KB", options: dict | None = None, **sizes
) -> TinyModel:
    """A random 4-layer ``family`` model saved as safetensors shards (+ a random LoRA on every projection).

    ``options`` replaces the family's config options (``FAMILIES``), ``sizes`` the default dimensions."""
    config_class, family_options = FAMILIES[family]
    sizes = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, **sizes}  # fmt: skip
    config = getattr(transformers, config_class)(
        **sizes,
        max_position_embeddings=128,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        **{"tie_word_embeddings": False, **(family_options if options is None else options)},
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    unit = 0.0 if family.startswith("gemma") else 1.0  # Gemma's RMSNorm scales by 1 + w: w = 0 is the unit norm
    with torch.no_grad():  # HF inits biases to 0 and norms to 1: make them count
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.normal_(unit if "norm" in name else 0.0, 0.3)
    model.save_pretrained(root / "base", max_shard_size=max_shard_size)
    adapter = None
    if lora:
        lora_config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, init_lora_weights=False)
        peft.get_peft_model(model, lora_config).save_pretrained(root / "adapter")
        adapter = root / "adapter"
    return TinyModel(root / "base", adapter, json.loads((root / "base" / "config.json").read_text()))


@pytest.fixture
def tiny(tmp_path_factory):
    return lambda family, **kwargs: build_tiny(tmp_path_factory.mktemp(family), family, **kwargs)


@pytest.fixture
def ids():
    return torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))


def extract(tmp_path, model, layers, write_plan, name="out", selection=None, **options):
    plan = write_plan(tmp_path / f"{name}.json", layers, model.config)
    return extract_subnet(
        plan,
        model.base,
        tmp_path / name,
        point=0,
        adapter=model.adapter,
        selection=selection,
        options=ExtractOptions(dtype="float32", max_shard_size=30_000, **options),
    )


def diff(a, b, ids) -> float:
    return (logits(a, ids) - logits(b, ids)).abs().max().item()


# ------------------------------------------------------------------------------ logits equality per family


def reversed_orders(base) -> list[LayerOrder]:
    """Every layer keeps its LAST channels and KV groups: no kept index set is a prefix, every row is gathered."""
    return [
        LayerOrder(tuple(reversed(range(w))), tuple(reversed(range(kv)))) for w, kv in zip(base.widths, base.kv_heads)
    ]


@pytest.mark.parametrize("method", ["first", "magnitude", "reversed"])  # prefixes; index sets gathering rows and biases
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_pruned_family_equals_masked_reference(tmp_path, tiny, write_plan, ids, family, method):
    model, plan = tiny(family), family_plan(family, PLAN)
    base = open_base(model.base)
    if method == "reversed":
        orders = reversed_orders(base)
        plans = layer_plans({"layers": plan})
        out = extract_plan(
            plans, base, tmp_path / "out", open_adapter(model.adapter), ExtractOptions(dtype="float32"), orders=orders
        )
    else:
        out = extract(tmp_path, model, plan, write_plan, selection=SelectionConfig(method))
        orders, _ = channel_orders(base, SelectionConfig(method))
    reference = masked_reference(model, plan, [(order.ffn, order.kv_groups) for order in orders])
    pruned = load_pruned(out)
    assert type(pruned).__name__ == ARCHITECTURES[family]
    assert diff(pruned, reference, ids) <= ATOL
    # The check can fail: the pruning moves the logits far more than the tolerance.
    full = masked_reference(model, [{"ffn": 96, "kv_groups": 2}] * 4)
    assert diff(full, reference, ids) > 1e-2
    layers = pruned.model.layers
    assert [layer.mlp.down_proj.in_features for layer in layers] == [96, 40, 17]
    kv = [plan[i]["kv_groups"] for i in (0, 2, 3)]
    assert [layer.self_attn.k_proj.out_features for layer in layers] == [16 * g for g in kv]
    assert [layer.self_attn.o_proj.in_features for layer in layers] == [32 * g for g in kv]
    for layer in layers:  # each projection keeps the stock bias layout
        attn = layer.self_attn
        biases = (attn.q_proj.bias, attn.o_proj.bias, layer.mlp.gate_proj.bias)
        assert tuple(bias is not None for bias in biases) == BIASES[family]
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == f"modeling_nsc_llama.{ARCHITECTURES[family]}"
    assert config["nsc_kept_layers"] == [0, 2, 3]
    if family.startswith("qwen"):
        assert config["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
        assert config["max_window_layers"] == 1
    if family == "smollm3":
        assert config["no_rope_layers"] == [1, 1, 0] and [layer.self_attn.use_rope for layer in layers] == [1, 1, 0]
    if family == "granite":
        assert {
            key: config[key] for key in GRANITE
        } == GRANITE  # The auto_map route (the shipped file, remote code) builds the same model; both generate.
    remote = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32).eval()
    assert type(remote).__name__ == ARCHITECTURES[family]
    assert torch.equal(logits(remote, ids), logits(pruned, ids))
    for loaded in (pruned, remote):
        generated = loaded.generate(torch.tensor([[1, 5, 9]]), max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert generated.shape == (1, 9)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2", "gemma3_text"])
def test_a_static_cache_set_up_before_the_first_step_generates_as_uncached(tmp_path, tiny, write_plan, family):
    """generate(cache_implementation="static", prefill_chunk_size=...) set every layer's cache up with the global KV
    heads: with heads per layer, a narrower layer's first write failed (index_copy_)."""
    model, plan = tiny(family), family_plan(family, PLAN)
    pruned = load_pruned(extract(tmp_path, model, plan, write_plan))
    ids, settings = torch.tensor([[1, 5, 9, 4, 7, 3, 8]]), {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    chunked = pruned.generate(ids, cache_implementation="static", prefill_chunk_size=3, **settings)
    assert torch.equal(chunked, pruned.generate(ids, use_cache=False, **settings))


def test_sliding_layers_renumbered_without_layer_types(tmp_path, tiny, write_plan, ids):
    """A Qwen2 config.json without ``layer_types`` (derived from ``max_window_layers``) stays consistent too."""
    model = tiny("qwen2", lora=False)
    config = {k: v for k, v in model.config.items() if k != "layer_types"}
    (model.base / "config.json").write_text(json.dumps(config))
    model = TinyModel(model.base, None, config)
    out = extract(tmp_path, model, PLAN, write_plan)
    written = json.loads((out / "config.json").read_text())
    assert "layer_types" not in written and written["max_window_layers"] == 1
    reference = masked_reference(model, PLAN)
    assert diff(load_pruned(out), reference, ids) <= ATOL
    # The check can fail: the old threshold makes output layer 1 full attention, which changes the logits.
    (out / "config.json").write_text(json.dumps({**written, "max_window_layers": 2}))
    assert diff(load_pruned(out), reference, ids) > 1e-3


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_keep_adapter_and_padded_per_family(tmp_path, tiny, write_plan, ids, family):
    model = tiny(family)
    kept = [
        {"ffn": 60, "kv_groups": 1},
        {"ffn": 96, "kv_groups": 2},
        {"ffn": 30, "kv_groups": 1},
        {"ffn": 17, "kv_groups": 2},
    ]
    kept, plan = family_plan(family, kept), family_plan(family, PLAN)
    out = extract(tmp_path, model, kept, write_plan, keep_adapter=True)
    pruned = load_pruned(out)
    assert isinstance(pruned, peft.PeftModel)
    assert diff(pruned, masked_reference(model, kept), ids) <= ATOL
    # Padded: full shapes, zeros for what the plan drops (a dropped layer included); stock transformers loads it.
    padded = extract(tmp_path, model, plan, write_plan, name="padded", format="padded")
    assert not (padded / "modeling_nsc_llama.py").exists()
    stock = transformers.AutoModelForCausalLM.from_pretrained(padded, dtype=torch.float32).eval()
    assert type(stock).__name__ == model.config["architectures"][0]  # e.g. Qwen2ForCausalLM: no remote code
    assert diff(stock, masked_reference(model, plan), ids) <= ATOL


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_uniform_plan_is_a_stock_checkpoint_per_family(tmp_path, tiny, write_plan, ids, family):
    """Equal kept layers (a layer dropped): the stock class loads it without remote code, biases, q/k norms and
    Qwen's renumbered sliding layers included."""
    model = tiny(family)
    layers = [{"ffn": 40, "kv_groups": 1}, DROP, {"ffn": 40, "kv_groups": 1}, {"ffn": 40, "kv_groups": 1}]
    layers = family_plan(family, layers)
    out = extract(tmp_path, model, layers, write_plan)
    config = json.loads((out / "config.json").read_text())
    assert "auto_map" not in config and not (out / "modeling_nsc_llama.py").exists()
    assert config["architectures"] == [STOCK_ARCHITECTURES[family]] == model.config["architectures"]
    stock, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, trust_remote_code=False, output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert type(stock).__name__ == STOCK_ARCHITECTURES[family]
    assert torch.equal(logits(stock.eval(), ids), logits(load_pruned(out), ids))
    assert diff(stock, masked_reference(model, layers), ids) <= ATOL


def test_no_rope_layers_follow_the_kept_layers(tmp_path, tiny, write_plan, ids):
    """A SmolLM3 config.json that leaves ``no_rope_layers`` to ``no_rope_layer_interval``: the output states the
    kept layers' own list, and a list not sliced with them (the interval's, renumbered) changes the logits."""
    model = tiny("smollm3", lora=False)
    config = {k: v for k, v in model.config.items() if k not in ("no_rope_layers", "layer_types")}
    (model.base / "config.json").write_text(json.dumps(config))
    model = TinyModel(model.base, None, config)
    out = extract(tmp_path, model, PLAN, write_plan)
    written = json.loads((out / "config.json").read_text())
    assert written["no_rope_layers"] == [1, 1, 0] and "layer_types" not in written
    reference = masked_reference(model, PLAN)
    assert diff(load_pruned(out), reference, ids) <= ATOL
    (out / "config.json").write_text(json.dumps({**written, "no_rope_layers": [1, 0, 1]}))
    assert diff(load_pruned(out), reference, ids) > 1e-3


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_gemma_layer_types_follow_the_kept_layers(tmp_path, tiny, write_plan, ids, family):
    """A Gemma config.json that leaves ``layer_types`` to its rule (Gemma 2: every 2nd layer global; Gemma 3: every
    ``sliding_window_pattern``-th): the output states the kept layers' own kinds (base layers 0, 2, 3 of sliding,
    global, sliding, global), and a list not sliced with them (the rule's, renumbered) changes the logits."""
    model = tiny(family, lora=False)
    config = {k: v for k, v in model.config.items() if k != "layer_types"}
    (model.base / "config.json").write_text(json.dumps(config))
    model = TinyModel(model.base, None, config)
    out = extract(tmp_path, model, PLAN, write_plan)
    written = json.loads((out / "config.json").read_text())
    assert written["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention"]
    reference = masked_reference(model, PLAN)
    assert diff(load_pruned(out), reference, ids) <= ATOL
    renumbered = ["sliding_attention", "full_attention", "sliding_attention"]
    (out / "config.json").write_text(json.dumps({**written, "layer_types": renumbered}))
    assert diff(load_pruned(out), reference, ids) > 1e-3


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_tied_gemma_equals_masked_reference(tmp_path, tiny, write_plan, ids, family):
    """Gemma as released: the LM head is the (unscaled) embedding matrix, saved once; the pruned model ties it too."""
    model = tiny(family, lora=False, options={**FAMILIES[family][1], "tie_word_embeddings": True})
    assert "lm_head.weight" not in index_model_dir(model.base)
    out = extract(tmp_path, model, PLAN, write_plan)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert diff(load_pruned(out), masked_reference(model, PLAN), ids) <= ATOL


@pytest.mark.parametrize(("family", "copy"), [("llama", True), ("gemma2", True), ("llama", False)])
def test_a_tied_base_that_also_stores_lm_head_is_the_model_transformers_loads(
    tmp_path, tiny, write_plan, ids, family, copy
):
    """Some tied checkpoints store lm_head.weight too (saved after a fine-tune). A copy of the embedding is not the
    model's: extract counted it in the base and the output (twice the embedding) and wrote it again. A head that
    differs is loaded untied by transformers 5, so it is the model's and stays. Gemma 2's config is silent on tying
    (its default: tied)."""
    model = tiny(
        family, lora=False, max_shard_size="10MB", options={**FAMILIES[family][1], "tie_word_embeddings": True}
    )
    if family == "gemma2":
        config = {k: v for k, v in model.config.items() if k != "tie_word_embeddings"}
        (model.base / "config.json").write_text(json.dumps(config))
        model = dataclasses.replace(model, config=config)
    tensors = load_file(model.base / "model.safetensors")
    embedding = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = embedding.clone() if copy else torch.randn_like(embedding)
    save_file(tensors, model.base / "model.safetensors", metadata={"format": "pt"})
    plan = family_plan(family, PLAN)
    out = extract(tmp_path, model, plan, write_plan)
    assert ("lm_head.weight" in index_model_dir(out)) is not copy
    pruned = load_pruned(out)
    assert diff(pruned, masked_reference(model, plan), ids) <= ATOL
    params = json.loads((out / RECORD_NAME).read_text())["params"]
    head = 0 if copy else embedding.numel()
    assert (params["base"], params["model"]) == (model_params(model.config) + head, pruned.num_parameters())


@pytest.mark.parametrize("key", ["final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar"])
def test_gemma2_scalars_are_kept(tmp_path, tiny, write_plan, ids, key):
    """Each of Gemma 2's soft-capping values and its query scale reaches the pruned model: changed in the output,
    the logits move."""
    model = tiny("gemma2", lora=False)
    out = extract(tmp_path, model, PLAN, write_plan)
    reference = masked_reference(model, PLAN)
    assert diff(load_pruned(out), reference, ids) <= ATOL
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, key: 2 * config[key]}))
    assert diff(load_pruned(out), reference, ids) > 1e-3


def test_olmo2_refuses_kv_group_cuts_in_one_line(tmp_path, tiny, write_plan, ids):
    """OLMo 2 normalises q and k over every head's features: in the masked original (the removed groups' o_proj
    columns zeroed) the kept heads still depend on the removed heads' q/k rows, which no smaller model has. So a
    plan that cuts a KV group is refused in one line with nothing written."""
    model = tiny("olmo2", lora=False)
    cut = [{"ffn": 96, "kv_groups": 2}, DROP, {"ffn": 40, "kv_groups": 1}, {"ffn": 17, "kv_groups": 2}]
    reference = masked_reference(model, cut)
    layer = reference.model.layers[2].self_attn
    with torch.no_grad():  # perturb only what the cut removes: group 1's query and key rows of layer 2
        before = logits(reference, ids)
        layer.q_proj.weight[32:] *= 3.0
        layer.k_proj.weight[16:] *= 3.0
    assert (logits(reference, ids) - before).abs().max().item() > 1e-3  # the kept heads moved
    with pytest.raises(
        UnsupportedArchitectureError,
        match=r"^extraction of olmo2 cannot cut KV groups: its q_norm and k_norm .*ffn-grid",
    ) as caught:
        extract(tmp_path, model, cut, write_plan)
    assert "\n" not in str(caught.value) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", sorted(GRANITE))
def test_granite_multipliers_are_kept(tmp_path, tiny, write_plan, ids, key):
    """Each of Granite's multipliers reaches the pruned model: set to 1 in the output, the logits move."""
    model = tiny("granite", lora=False)
    out = extract(tmp_path, model, PLAN, write_plan)
    reference = masked_reference(model, PLAN)
    assert diff(load_pruned(out), reference, ids) <= ATOL
    written = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**written, key: 1.0}))
    assert diff(load_pruned(out), reference, ids) > 1e-3


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
def test_reextract_a_pruned_checkpoint(tmp_path, tiny, write_plan, ids, family):
    """A pruned checkpoint (per-layer widths and heads, dropped layer, sliced layer_types or no_rope_layers) is a
    valid base."""
    model = tiny(family, lora=False)
    first = extract(tmp_path, model, PLAN, write_plan)
    config = json.loads((first / "config.json").read_text())
    again = write_plan(
        tmp_path / "again.json", [{"ffn": 50, "kv_groups": 2}, DROP, {"ffn": 17, "kv_groups": 1}], config
    )
    out = extract_subnet(again, first, tmp_path / "again", point=0, options=ExtractOptions(dtype="float32"))
    written = json.loads((out / "config.json").read_text())
    assert written["nsc_kept_layers"] == [0, 3]
    if family == "qwen3":
        assert written["layer_types"] == ["full_attention", "sliding_attention"]
    else:
        assert written["no_rope_layers"] == [1, 0]
    both = [{"ffn": 50, "kv_groups": 2}, DROP, DROP, {"ffn": 17, "kv_groups": 1}]
    assert diff(load_pruned(out), masked_reference(model, both), ids) <= ATOL


# ------------------------------------------------------------------------------ what is refused


def test_model_classes_match_the_registry():
    from nsc_prune.hf.modeling.modeling_nsc_llama import MODEL_CLASSES

    assert {key: cls.__name__ for key, cls in MODEL_CLASSES.items()} == ARCHITECTURES
    # Each class is its stock class narrowed; a homogeneous checkpoint names that stock class.
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert {key: cls.__bases__[-1].__name__ for key, cls in MODEL_CLASSES.items()} == STOCK_ARCHITECTURES
    assert {key: MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[key] for key in MODEL_CLASSES} == STOCK_ARCHITECTURES


def test_unsupported_model_type_is_refused(tmp_path, tiny):
    model = tiny("qwen2", lora=False)
    (model.base / "config.json").write_text(json.dumps({**model.config, "model_type": "gpt2"}))
    with pytest.raises(
        UnsupportedArchitectureError,
        match=r"must be one of \['gemma2', 'gemma3_text', 'granite', 'llama', 'mistral', 'olmo2', 'phi3', 'qwen2', 'qwen3', 'smollm3'\].*'gpt2'",
    ):
        open_base(model.base)
    with pytest.raises(UnsupportedArchitectureError, match="got 'gpt2'.*AutoModelForCausalLM instead"):
        load_pruned(model.base)
    # a type the search supports but extraction does not yet: the one line names what is missing
    (model.base / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": model.config}))
    with pytest.raises(
        UnsupportedArchitectureError,
        match=r"^extraction of gemma3 is not supported yet: the multimodal wrapper .*; supported: gemma2, gemma3_text, "
        "granite, llama, mistral",
    ):
        open_base(model.base)


def test_tensors_the_model_would_not_load_are_refused_before_writing(tmp_path, tiny, write_plan):
    """A Qwen2 base saved without its q_proj bias: caught before a single shard is written."""
    from safetensors.torch import load_file, save_file

    model = tiny("qwen2", lora=False, max_shard_size="10MB")
    weights = model.base / "model.safetensors"
    tensors = load_file(weights)
    del tensors["model.layers.3.self_attn.q_proj.bias"]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"would not load: \{'missing': \['model.layers.2.self_attn.q_proj.bias'\]"):
        extract(tmp_path, model, PLAN, write_plan)
    assert not (tmp_path / "out").exists()


def test_shards_without_index_say_so(tmp_path, tiny):
    model = tiny("llama", lora=False)
    (model.base / "model.safetensors.index.json").unlink()
    with pytest.raises(
        InvalidInputError, match=r"has safetensors shards \(model-00001-of-.*but no model.safetensors.index.json"
    ):
        index_model_dir(model.base)


def test_a_folder_with_both_weight_layouts_is_read_as_transformers_reads_it(tmp_path, tiny):
    """A model saved again into its own folder as one file kept its old index: nsc-prune read the index (and refused
    the folder once the old shards were gone), transformers read model.safetensors."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = tiny("llama", lora=False)
    shards = sorted(model.base.glob("model-*.safetensors"))
    tensors = {name: value for shard in shards for name, value in load_file(shard).items()}
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2  # the single file is the newer model
    save_file(tensors, model.base / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="holds both model.safetensors and model.safetensors.index.json; reading"):
        infos = index_model_dir(model.base)
    assert {info.file.name for info in infos.values()} == {"model.safetensors"} and set(infos) == set(tensors)
    loaded = AutoModelForCausalLM.from_pretrained(model.base, dtype=torch.float32).state_dict()["model.norm.weight"]
    assert torch.equal(loaded, tensors["model.norm.weight"].float())
    for shard in shards:  # the old shards gone: still the single file, not "shards are missing"
        shard.unlink()
    with pytest.warns(UserWarning, match="holds both"):
        assert set(index_model_dir(model.base)) == set(tensors)


def test_an_index_naming_a_shard_outside_its_folder_or_nested_deeply_is_refused(tmp_path, tiny):
    """A shard named '../x' or by an absolute path was read from outside the folder (transformers refuses it; a
    subfolder it reads); an index nested 200,000 deep was a RecursionError traceback."""
    model = tiny("llama", lora=False)
    index_file = model.base / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    name = next(iter(index["weight_map"].values()))
    for outside in (str(model.base / name), f"../{model.base.name}/{name}"):
        index_file.write_text(json.dumps({**index, "weight_map": dict.fromkeys(index["weight_map"], outside)}))
        with pytest.raises(InvalidInputError, match=r"names the shard .*, which is not a file of"):
            index_model_dir(model.base)
    (model.base / "sub").mkdir()  # a subfolder is inside: transformers loads it, and so does nsc-prune
    for shard in sorted(set(index["weight_map"].values())):
        (model.base / shard).rename(model.base / "sub" / shard)
    index_file.write_text(json.dumps({**index, "weight_map": {k: f"sub/{v}" for k, v in index["weight_map"].items()}}))
    assert set(index_model_dir(model.base)) == set(index["weight_map"])
    index_file.write_text('{"weight_map": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(InvalidInputError, match=r"not a valid safetensors index: .*nested too deeply"):
        index_model_dir(model.base)


# ------------------------------------------------------------------------------ --out safety (inputs, --overwrite)


def _cli(plan: Path, model: TinyModel, out: Path, *extra: str) -> list[str]:
    return [
        "extract",
        "--pareto",
        str(plan),
        "--point",
        "0",
        "--base",
        str(model.base),
        "--adapter",
        str(model.adapter),
        "--out",
        str(out),
        *extra,
    ]


def _snapshot(*folders: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["base", "base-parent", "adapter", "pareto-folder", "symlink-to-parent"])
def test_out_that_is_or_contains_an_input_is_refused(tmp_path, tiny, write_plan, capsys, where):
    model = tiny("llama")
    root = model.base.parent  # holds base/ and adapter/
    (tmp_path / "pareto").mkdir()
    plan = write_plan(tmp_path / "pareto" / "pareto.json", PLAN, model.config)
    out = {
        "base": model.base,
        "base-parent": root,
        "adapter": model.adapter,
        "pareto-folder": plan.parent,
        "symlink-to-parent": tmp_path / "link",
    }[where]
    if where == "symlink-to-parent":
        os.symlink(root, out)
    before = _snapshot(root, plan.parent)
    capsys.readouterr()
    assert main(_cli(plan, model, out, "--overwrite")) == 2
    err = capsys.readouterr().err
    assert "must not be or contain an input" in err and "Choose an --out outside the inputs" in err
    if where == "base":  # the library entry point that takes built objects checks too
        with pytest.raises(InvalidInputError, match="must not be or contain an input"):
            extract_plan(
                layer_plans({"layers": PLAN}), open_base(model.base), out, options=ExtractOptions(overwrite=True)
            )
    assert _snapshot(root, plan.parent) == before  # nothing deleted, nothing written


def test_overwrite_replaces_only_an_nsc_prune_checkpoint(tmp_path, tiny, write_plan, capsys):
    model = tiny("llama")
    plan = write_plan(tmp_path / "pareto.json", PLAN, model.config)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(_cli(plan, model, out, "--overwrite")) == 2
    assert "replaces only a checkpoint written by nsc-prune extract" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()  # an empty folder holds nothing to lose
    assert main(_cli(plan, model, out, "--overwrite")) == 0
    assert main(_cli(plan, model, out, "--overwrite")) == 0  # our own checkpoint is replaced
    assert (out / "nsc_prune_extract.json").is_file()
    listed = json.loads((out / "nsc_prune_extract.json").read_text())["files"]
    assert listed == sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    (out / "later.gguf").write_text("a GGUF extracted into the folder since")
    capsys.readouterr()
    assert main(_cli(plan, model, out, "--overwrite")) == 2  # it deleted it, and any file of yours there
    assert "also holds later.gguf, which it would delete" in capsys.readouterr().err
    assert (out / "later.gguf").is_file()
    (tmp_path / "file").write_text("x")
    capsys.readouterr()
    assert main(_cli(plan, model, tmp_path / "file", "--overwrite")) == 2
    assert "is a file" in capsys.readouterr().err and (tmp_path / "file").read_text() == "x"
