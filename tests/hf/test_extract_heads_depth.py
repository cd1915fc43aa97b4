"""Extraction of head-pruned and layer-dropped plans (issue 6): logits equal the masked original.

The masked original is built independently of the extractor, from the full-size base (+ unmerged LoRA):
- a dropped FFN channel j: zero row j of gate/up and column j of down (and the LoRA B rows / A columns);
- a dropped KV group g: zero the o_proj columns of its query heads (and the LoRA A columns of o_proj). A
  head's output reaches the residual stream only through those columns, so this removes its contribution
  exactly (q/k/v and their biases are left alone);
- a dropped layer: replaced by ``Identity``, which returns the residual stream unchanged.
``masked_reference(..., orders=...)`` masks the units a channel order does not keep (used by
tests/hf/test_selection.py and tests/hf/test_extract_model_types.py too: the stock class of any model_type).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from nsc_prune.cli import main  # noqa: E402
from nsc_prune.errors import ConfigError  # noqa: E402
from nsc_prune.hf.extract import ExtractOptions, extract_subnet  # noqa: E402
from nsc_prune.hf.weights.loading import load_pruned  # noqa: E402

ATOL = 1e-5
HEAD_DIM = 16  # tiny_llama: hidden 64, 4 query heads


class Identity(torch.nn.Module):
    """A decoder layer that does nothing: the reference for a dropped layer."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


def masked_reference(tiny, layers, orders=None):
    """Full-size base (+ LoRA) with every unit the plan drops zeroed, dropped layers made identities.

    ``orders``: per layer ``(ffn_order, kv_group_order)``; the plan keeps the first k of each (default:
    identity, the LoNAS convention)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float32)  # stock, by model_type
    if tiny.adapter is not None:
        model = peft.PeftModel.from_pretrained(model, tiny.adapter)
    decoder = model.get_base_model().model if tiny.adapter is not None else model.model
    config = tiny.config
    kv_total = config["num_key_value_heads"]
    group = config["num_attention_heads"] // kv_total
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    with torch.no_grad():
        for i, plan in enumerate(layers):
            if not plan.get("keep", True):
                decoder.layers[i] = Identity()
                continue
            layer = decoder.layers[i]
            ffn_order, kv_order = orders[i] if orders else (range(config["intermediate_size"]), range(kv_total))
            dropped = torch.tensor(list(ffn_order)[plan["ffn"] :], dtype=torch.long)
            mlp = layer.mlp
            for linear, rows in ((mlp.gate_proj, True), (mlp.up_proj, True), (mlp.down_proj, False)):
                base = getattr(linear, "base_layer", linear)
                (base.weight.index_fill_(0, dropped, 0) if rows else base.weight.index_fill_(1, dropped, 0))
                if hasattr(linear, "lora_A"):
                    if rows:
                        linear.lora_B["default"].weight.index_fill_(0, dropped, 0)
                    else:
                        linear.lora_A["default"].weight.index_fill_(1, dropped, 0)
            kv = plan.get("kv_groups") or kv_total
            o_proj = layer.self_attn.o_proj
            for g in list(kv_order)[kv:]:
                columns = slice(g * group * head_dim, (g + 1) * group * head_dim)  # the group's query heads
                getattr(o_proj, "base_layer", o_proj).weight[:, columns] = 0
                if hasattr(o_proj, "lora_A") and "default" in o_proj.lora_A:
                    o_proj.lora_A["default"].weight[:, columns] = 0
    return model.eval()


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits.float()


@pytest.fixture
def ids():
    return torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))


def plans_for(kind, kv):
    """Plans on a 3-layer tiny model with ``kv`` KV groups per layer."""
    drop = {"ffn": 0, "kv_groups": 0, "keep": False}
    return {
        "heads": [{"ffn": 96, "kv_groups": kv}, {"ffn": 40, "kv_groups": 1}, {"ffn": 17, "kv_groups": kv - 1}],
        "depth": [{"ffn": 96, "kv_groups": kv}, drop, {"ffn": 40, "kv_groups": kv}],
        "mixed": [drop, {"ffn": 50, "kv_groups": 1}, {"ffn": 96, "kv_groups": kv}],
    }[kind]


def extract(tmp_path, tiny, layers, write_plan, name="out", **options):
    plan = write_plan(tmp_path / f"{name}.json", layers, tiny.config)
    return extract_subnet(
        plan,
        tiny.base,
        tmp_path / name,
        point=0,
        adapter=tiny.adapter,
        options=ExtractOptions(dtype="float32", max_shard_size=30_000, **options),
    )


@pytest.mark.parametrize("kind", ["heads", "depth", "mixed"])
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_logits_equal_masked_reference(tmp_path, tiny_llama, write_plan, ids, gqa, kind):
    tiny = tiny_llama(gqa=gqa, lora=False)
    kv = tiny.config["num_key_value_heads"]
    layers = plans_for(kind, kv)
    out = extract(tmp_path, tiny, layers, write_plan)
    reference = masked_reference(tiny, layers)
    pruned = load_pruned(out)
    assert (logits(pruned, ids) - logits(reference, ids)).abs().max().item() <= ATOL
    # The check can fail: the pruning moves the logits far more than the tolerance.
    full = transformers.LlamaForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval()
    assert (logits(full, ids) - logits(reference, ids)).abs().max().item() > 1e-2
    kept = [layer for layer in layers if layer.get("keep", True)]
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == len(kept) == len(pruned.model.layers)
    assert [layer.self_attn.k_proj.weight.shape[0] for layer in pruned.model.layers] == [
        l["kv_groups"] * HEAD_DIM for l in kept
    ]
    group = tiny.config["num_attention_heads"] // kv
    assert [layer.self_attn.q_proj.weight.shape[0] for layer in pruned.model.layers] == [
        l["kv_groups"] * group * HEAD_DIM for l in kept
    ]
    if kind != "heads":
        assert config["nsc_kept_layers"] == [i for i, layer in enumerate(layers) if layer.get("keep", True)]
    # The auto_map route (shipped modeling file, remote code) loads the same model.
    auto = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32).eval()
    assert torch.equal(logits(auto, ids), logits(pruned, ids))


def test_merged_lora_with_heads_and_depth(tmp_path, tiny_llama, write_plan, ids):
    tiny = tiny_llama(gqa=True)  # LoRA on q, k, v, gate, up, down: B rows of q/k/v follow the kept heads
    layers = [
        {"ffn": 60, "kv_groups": 1, "lora_rank": 5},
        {"ffn": 0, "kv_groups": 0, "keep": False},
        {"ffn": 96, "kv_groups": 2, "lora_rank": 8},
    ]
    out = extract(tmp_path, tiny, layers, write_plan)
    masked = [{**layer, "lora_rank": None} for layer in layers]  # ranks kept whole except layer 0
    reference = masked_reference(tiny, masked)
    with torch.no_grad():  # rank 5 of 8 in layer 0: zero A rows 5.. (B[:, j] A[j] = 0)
        for linear in reference.get_base_model().model.layers[0].modules():
            if hasattr(linear, "lora_A") and "default" in getattr(linear, "lora_A", {}):
                linear.lora_A["default"].weight[5:].zero_()
    assert (logits(load_pruned(out), ids) - logits(reference, ids)).abs().max().item() <= ATOL


def test_keep_adapter_with_heads(tmp_path, tiny_llama, write_plan, ids):
    tiny = tiny_llama(gqa=True)
    layers = [{"ffn": 60, "kv_groups": 1}, {"ffn": 96, "kv_groups": 2}, {"ffn": 30, "kv_groups": 1}]
    out = extract(tmp_path, tiny, layers, write_plan, keep_adapter=True)
    assert (logits(load_pruned(out), ids) - logits(masked_reference(tiny, layers), ids)).abs().max().item() <= ATOL
    drop = [{"ffn": 60, "kv_groups": 0, "keep": False}, *layers[1:]]
    with pytest.raises(ConfigError, match="--keep-adapter cannot renumber"):
        extract(tmp_path, tiny, drop, write_plan, name="drop", keep_adapter=True)


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_padded_format_with_heads_and_depth(tmp_path, tiny_llama, write_plan, ids, gqa):
    """Padded: full shapes, dropped heads' q/k/v/o zeroed, dropped layers all-zero (an identity block)."""
    tiny = tiny_llama(gqa=gqa, lora=False)
    layers = plans_for("mixed", tiny.config["num_key_value_heads"])
    out = extract(tmp_path, tiny, layers, write_plan, format="padded")
    stock = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert (logits(stock, ids) - logits(masked_reference(tiny, layers), ids)).abs().max().item() <= ATOL


def test_generate_and_bad_kv_heads_exit_2(tmp_path, tiny_llama, write_plan, capsys):
    tiny = tiny_llama(gqa=True, lora=False)
    layers = plans_for("mixed", 2)
    out = extract(tmp_path, tiny, layers, write_plan)
    model = load_pruned(out)
    generated = model.generate(torch.tensor([[1, 5, 9]]), max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, 8)
    bad = write_plan(tmp_path / "bad.json", [{"ffn": 96, "kv_groups": 3}, *layers[1:]], tiny.config)
    argv = ["extract", "--pareto", str(bad), "--point", "0", "--base", str(tiny.base), "--out", str(tmp_path / "bad")]
    assert main(argv) == 2
    assert "kv_groups=3 KV groups; the base layer has 2" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_reextract_a_pruned_checkpoint(tmp_path, tiny_llama, write_plan, ids):
    """A head-pruned, layer-dropped checkpoint is a valid base for a second extraction."""
    tiny = tiny_llama(gqa=True, lora=False)
    first = extract(tmp_path, tiny, plans_for("mixed", 2), write_plan)
    config = json.loads((first / "config.json").read_text())
    again = write_plan(tmp_path / "again.json", [{"ffn": 50, "kv_groups": 1}, {"ffn": 80, "kv_groups": 1}], config)
    out = extract_subnet(again, first, tmp_path / "again", point=0, options=ExtractOptions(dtype="float32"))
    layers = [{"ffn": 0, "kv_groups": 0, "keep": False}, {"ffn": 50, "kv_groups": 1}, {"ffn": 80, "kv_groups": 1}]
    assert (logits(load_pruned(out), ids) - logits(masked_reference(tiny, layers), ids)).abs().max().item() <= ATOL
    assert json.loads((out / "config.json").read_text())["nsc_kept_layers"] == [1, 2]


# ------------------------------------------------------------------------------ homogeneous plans: stock checkpoints


def stock_load(out):
    """``AutoModelForCausalLM`` without remote code, failing on any missing, unexpected or mis-shaped tensor."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, trust_remote_code=False, output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    return model.eval()


@pytest.mark.parametrize(("drop", "head_dim_said"), [(False, True), (True, True), (False, False)],
                         ids=["all-layers", "depth", "no-head-dim"])  # fmt: skip
def test_uniform_plan_is_a_stock_checkpoint(tmp_path, tiny_llama, write_plan, ids, drop, head_dim_said):
    """Same FFN width and KV groups in every kept layer: plain config, no modeling file, stock class loads it. A
    base whose config.json leaves head_dim to hidden / heads (older LLaMA-2 and Mistral files) gets it written:
    the cut heads no longer give it."""
    tiny = tiny_llama(gqa=True)  # 4 query heads in 2 KV groups, FFN 96; LoRA merged
    if not head_dim_said:
        config = {key: value for key, value in tiny.config.items() if key != "head_dim"}
        (tiny.base / "config.json").write_text(json.dumps(config))
        tiny = dataclasses.replace(tiny, config=config)
    layers = [{"ffn": 48, "kv_groups": 1}] * 3
    if drop:
        layers = [layers[0], {"ffn": 0, "kv_groups": 0, "keep": False}, layers[2]]
    out = extract(tmp_path, tiny, layers, write_plan)
    assert not (out / "modeling_nsc_llama.py").exists()
    config = json.loads((out / "config.json").read_text())
    assert "auto_map" not in config and "per_layer_config" not in config and "nsc_per_layer_attention" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    sizes = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "num_hidden_layers")
    assert [config[k] for k in sizes] == [2, 1, HEAD_DIM, 48, 2 if drop else 3]
    assert config.get("nsc_kept_layers") == ([0, 2] if drop else None)
    record = json.loads((out / "nsc_prune_extract.json").read_text())
    assert record["export"] == {"stock": "LlamaForCausalLM"}
    assert "trust_remote_code" not in (out / "README.md").read_text()
    stock = stock_load(out)
    assert type(stock) is transformers.LlamaForCausalLM
    assert getattr(stock.config, "nsc_kept_layers", None) == config.get("nsc_kept_layers")  # kept as provenance
    pruned = load_pruned(out)
    assert torch.equal(logits(stock, ids), logits(pruned, ids))
    assert (logits(stock, ids) - logits(masked_reference(tiny, layers), ids)).abs().max().item() <= ATOL


def test_uniform_heads_that_do_not_divide_the_width_are_given_per_layer(tmp_path, tiny_llama, write_plan, ids):
    """3 of 4 KV groups (6 of 8 query heads, hidden 64): the stock config refused 64 % 6, after the slow work (and
    after train-supernet --pareto trained such a point); per-layer heads under the base's global ones load."""
    tiny = tiny_llama(gqa=True, heads=8, lora=False)
    layers = [{"ffn": 48, "kv_groups": 3}] * 3
    out = extract(tmp_path, tiny, layers, write_plan)
    config = json.loads((out / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (8, 4, 8)
    heads = {"num_attention_heads": 6, "num_key_value_heads": 3}
    assert config["nsc_per_layer_attention"] == {str(i): heads for i in range(3)} and "auto_map" in config
    assert (logits(load_pruned(out), ids) - logits(masked_reference(tiny, layers), ids)).abs().max().item() <= ATOL


def test_one_layer_with_other_heads_is_not_stock(tmp_path, tiny_llama, write_plan, ids):
    """One FFN width but one layer with fewer KV groups: per-layer heads, shipped modeling file and auto_map."""
    tiny = tiny_llama(gqa=True, lora=False)
    layers = [{"ffn": 48, "kv_groups": 2}, {"ffn": 48, "kv_groups": 1}, {"ffn": 48, "kv_groups": 2}]
    out = extract(tmp_path, tiny, layers, write_plan)
    assert (out / "modeling_nsc_llama.py").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_nsc_llama.NscLlamaForCausalLM"
    assert config["architectures"] == ["NscLlamaForCausalLM"] and "per_layer_config" not in config
    assert config["nsc_per_layer_attention"] == {"1": {"num_attention_heads": 2, "num_key_value_heads": 1}}
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert "export" not in json.loads((out / "nsc_prune_extract.json").read_text())
    assert (logits(load_pruned(out), ids) - logits(masked_reference(tiny, layers), ids)).abs().max().item() <= ATOL


def test_reextract_to_a_uniform_plan_is_stock(tmp_path, tiny_llama, write_plan, ids):
    """A per-layer checkpoint (dropped layer, per-layer heads) re-extracted to equal layers becomes stock."""
    tiny = tiny_llama(gqa=True, lora=False)
    first = extract(tmp_path, tiny, plans_for("mixed", 2), write_plan)  # base layers 1 (1 group), 2 (2 groups)
    config = json.loads((first / "config.json").read_text())
    again = write_plan(tmp_path / "again.json", [{"ffn": 40, "kv_groups": 1}] * 2, config)
    out = extract_subnet(again, first, tmp_path / "again", point=0, options=ExtractOptions(dtype="float32"))
    written = json.loads((out / "config.json").read_text())
    assert "auto_map" not in written and not (out / "modeling_nsc_llama.py").exists()
    assert (written["num_key_value_heads"], written["nsc_kept_layers"]) == (1, [1, 2])
    layers = [{"ffn": 0, "kv_groups": 0, "keep": False}, {"ffn": 40, "kv_groups": 1}, {"ffn": 40, "kv_groups": 1}]
    assert (logits(stock_load(out), ids) - logits(masked_reference(tiny, layers), ids)).abs().max().item() <= ATOL
