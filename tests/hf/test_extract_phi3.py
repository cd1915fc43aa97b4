"""Phi-3 / Phi-4-mini extraction: fused qkv_proj (q, k, v rows) and gate_up_proj (gate, up rows) cut in step.

A tiny random Phi-3 (4 layers, GQA 4:2, head_dim 16, partial rotary 0.5, LongRoPE) is pruned and its logits compared
with the stock model whose dropped FFN channels (down_proj columns) and KV groups (their query heads' o_proj columns)
are zeroed, dropped layers made identities: the masked original, built here without nsc-prune's cut rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_extract_heads_depth import ATOL, Identity, logits

from nsc_prune.hf.cut.keep import LayerOrder
from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders
from nsc_prune.hf.extract import ExtractOptions, extract_plan
from nsc_prune.hf.weights.base import open_base
from nsc_prune.hf.weights.loading import load_pruned
from nsc_prune.plan import layer_plans

pytestmark = pytest.mark.filterwarnings("ignore:base .* has no tokenizer files")
DROP = {"ffn": 0, "kv_groups": 0, "keep": False}
ROPE = {  # Phi-4-mini's kind of rope: partial rotary and LongRoPE factors (rotary dim 8: 4 factors)
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.5,
    "short_factor": [1.0, 1.5, 2.0, 3.0],
    "long_factor": [2.0, 3.0, 5.0, 8.0],
    "original_max_position_embeddings": 64,
}


def build_phi3(root: Path, rope: dict | None = ROPE, vocab_size: int = 128) -> Path:
    config = transformers.Phi3Config(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=128,
        original_max_position_embeddings=64,
        rope_parameters=rope,
        initializer_range=0.1,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.3)
    model.save_pretrained(root / "base", max_shard_size="40KB")
    return root / "base"


def masked_phi3(base: Path, layers: list[dict], orders: list[LayerOrder]):
    """The stock Phi-3 with the plan's dropped channels, KV groups and layers switched off."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    group, head_dim = 2, 16
    with torch.no_grad():
        for i, plan in enumerate(layers):
            if not plan.get("keep", True):
                model.model.layers[i] = Identity()
                continue
            layer = model.model.layers[i]
            layer.mlp.down_proj.weight[:, list(orders[i].ffn[plan["ffn"] :])] = 0
            for g in orders[i].kv_groups[plan["kv_groups"] :]:
                layer.self_attn.o_proj.weight[:, g * group * head_dim : (g + 1) * group * head_dim] = 0
    return model.eval()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_phi3(tmp_path_factory.mktemp("phi3"))


@pytest.fixture
def ids():
    return torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(1))  # past 32: LongRoPE's long


def reversed_orders(opened) -> list[LayerOrder]:
    return [
        LayerOrder(tuple(reversed(range(w))), tuple(reversed(range(kv))))
        for w, kv in zip(opened.widths, opened.kv_heads)
    ]


PLANS = {
    "ffn": [{"ffn": 40, "kv_groups": 2}, {"ffn": 96, "kv_groups": 2}, {"ffn": 17, "kv_groups": 2}, {"ffn": 96, "kv_groups": 2}],
    "kv": [{"ffn": 96, "kv_groups": 1}, {"ffn": 96, "kv_groups": 2}, {"ffn": 96, "kv_groups": 1}, {"ffn": 96, "kv_groups": 2}],
    "depth": [{"ffn": 96, "kv_groups": 2}, DROP, {"ffn": 96, "kv_groups": 2}, {"ffn": 96, "kv_groups": 2}],
    "mixed": [{"ffn": 50, "kv_groups": 1}, DROP, {"ffn": 96, "kv_groups": 2}, {"ffn": 17, "kv_groups": 1}],
}  # fmt: skip


@pytest.mark.parametrize("method", ["first", "magnitude", "reversed"])
@pytest.mark.parametrize("kind", sorted(PLANS))
def test_pruned_phi3_equals_masked_original(tmp_path, base, ids, kind, method):
    opened = open_base(base)
    orders = reversed_orders(opened) if method == "reversed" else channel_orders(opened, SelectionConfig(method))[0]
    layers = PLANS[kind]
    out = extract_plan(layer_plans({"layers": layers}), opened, tmp_path / "out", None,
                       ExtractOptions(dtype="float32"), orders=orders)  # fmt: skip
    pruned = load_pruned(out)
    reference = masked_phi3(base, layers, orders)
    assert (logits(pruned, ids) - logits(reference, ids)).abs().max().item() <= ATOL
    full = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    assert (logits(full, ids) - logits(reference, ids)).abs().max().item() > 1e-2  # the cut matters
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"] == json.loads((base / "config.json").read_text())["rope_parameters"]


@pytest.mark.parametrize("fmt", ["pruned", "padded"])
def test_uniform_plan_and_padded_load_in_stock_transformers(tmp_path, base, ids, fmt):
    """A homogeneous plan is a stock Phi3ForCausalLM checkpoint; the padded format (each fused part's kept rows
    first in its own block) is the base's shape: both load without trust_remote_code and equal the masked model."""
    opened = open_base(base)
    orders = reversed_orders(opened)
    layers = (
        PLANS["mixed"] if fmt == "padded" else [{"ffn": 40, "kv_groups": 2}, DROP, *[{"ffn": 40, "kv_groups": 2}] * 2]
    )
    out = extract_plan(layer_plans({"layers": layers}), opened, tmp_path / "out", None,
                       ExtractOptions(dtype="float32", format=fmt), orders=orders)  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    assert "auto_map" not in config and config["architectures"] == ["Phi3ForCausalLM"]
    assert not (out / "modeling_nsc_llama.py").exists()
    stock = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(stock).__name__ == "Phi3ForCausalLM"
    assert (logits(stock, ids) - logits(masked_phi3(base, layers, orders), ids)).abs().max().item() <= ATOL


def test_uniform_kv_cut_with_longrope_keeps_global_heads(tmp_path, base, ids):
    """Phi3Config checks LongRoPE's factor lists against hidden_size // num_attention_heads: a uniform KV-group cut
    keeps the base's global heads and gives each layer its heads (the shipped class), which loads and is exact."""
    opened = open_base(base)
    layers = [{"ffn": 40, "kv_groups": 1}] * 4
    out = extract_plan(layer_plans({"layers": layers}), opened, tmp_path / "out", None, ExtractOptions(dtype="float32"))
    config = json.loads((out / "config.json").read_text())
    assert config["num_attention_heads"] == 4 and config["architectures"] == ["NscPhi3ForCausalLM"]
    remote = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    orders = [LayerOrder(tuple(range(96)), (0, 1))] * 4
    assert (logits(remote.eval(), ids) - logits(masked_phi3(base, layers, orders), ids)).abs().max().item() <= ATOL


def test_supernet_subnet_equals_extraction(tmp_path, base, ids):
    """train-supernet's subnet forward (the fused gate_up_proj's kept gate rows and the same channels' up rows) is
    the extracted checkpoint's arithmetic."""
    from nsc_prune.hf.train.subnets import subnet_context

    opened = open_base(base)
    orders, layers = reversed_orders(opened), PLANS["mixed"]
    out = extract_plan(layer_plans({"layers": layers}), opened, tmp_path / "out", None,
                       ExtractOptions(dtype="float32"), orders=orders)  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    with subnet_context(model, layer_plans({"layers": layers}), orders):
        got = logits(model, ids)
    assert (got - logits(load_pruned(out), ids)).abs().max().item() <= ATOL
    assert (got - logits(model, ids)).abs().max().item() > 1e-2  # the context cut something


def test_psi_w_reads_the_fused_parts(tmp_path, base):
    """psi_W of a Phi-3 equals psi_W of the LLaMA holding the same q/k/v and gate/up matrices unfused."""
    from safetensors.torch import load_file, save_file

    from nsc_prune.hf.score.psi_w import layer_weight_tables

    config = json.loads((base / "config.json").read_text())
    tensors = {}
    for path in sorted(base.glob("*.safetensors")):
        tensors.update(load_file(path))
    unfused = {}
    for name, tensor in tensors.items():
        if "qkv_proj" in name:
            for part, rows in zip(("q", "k", "v"), tensor.split([64, 32, 32])):
                unfused[name.replace("qkv_proj", f"{part}_proj")] = rows.contiguous()
        elif "gate_up_proj" in name:
            for part, rows in zip(("gate", "up"), tensor.chunk(2)):
                unfused[name.replace("gate_up_proj", f"{part}_proj")] = rows.contiguous()
        else:
            unfused[name] = tensor
    llama = {**config, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "head_dim": 16}
    llama.pop("rope_parameters")
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(llama))
    save_file(unfused, tmp_path / "llama" / "model.safetensors")
    fused = layer_weight_tables(base, config, cache_dir=tmp_path / "c1")
    plain = layer_weight_tables(tmp_path / "llama", llama, cache_dir=tmp_path / "c2")
    for (attn, ffn), (attn_ref, ffn_ref) in zip(fused, plain, strict=True):
        assert attn.tolist() == attn_ref.tolist() and ffn.tolist() == ffn_ref.tolist()


@pytest.mark.parametrize("fmt", ["pruned", "padded"])
@pytest.mark.parametrize("keep_adapter", [False, True])
def test_lora_on_the_fused_projections_is_cut_with_them(tmp_path, base, ids, keep_adapter, fmt):
    """A LoRA on qkv_proj / gate_up_proj (B's rows cut like the fused weight's) merged or kept: the masked PEFT model.
    Padded and kept, B's rows of each part were packed at the top, off the base's (logits 2.6-4.0 away)."""
    peft = pytest.importorskip("peft")
    from nsc_prune.hf.weights.adapter import open_adapter

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                           target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])  # fmt: skip
    torch.manual_seed(3)
    peft.get_peft_model(model, lora).save_pretrained(tmp_path / "adapter")
    opened, layers = open_base(base), [{**plan, "ffn": 50} if plan.get("keep", True) else plan for plan in PLANS["kv"]]
    if not keep_adapter:  # --keep-adapter does not renumber an adapter's layers: drops are tested merged
        layers = PLANS["mixed"]
    orders = reversed_orders(opened)
    out = extract_plan(layer_plans({"layers": layers}), opened, tmp_path / "out", open_adapter(tmp_path / "adapter"),
                       ExtractOptions(dtype="float32", keep_adapter=keep_adapter, format=fmt), orders=orders)  # fmt: skip
    pruned = load_pruned(out)
    assert isinstance(pruned, peft.PeftModel) == keep_adapter
    reference = peft.PeftModel.from_pretrained(masked_phi3(base, layers, orders), tmp_path / "adapter").eval()
    with torch.no_grad():  # the dropped units' LoRA inputs to down_proj / o_proj are zeroed with the weights' columns
        for i, plan in enumerate(layers):
            if plan.get("keep", True):
                layer = reference.get_base_model().model.layers[i]
                layer.mlp.down_proj.lora_A["default"].weight[:, list(orders[i].ffn[plan["ffn"] :])] = 0
                for g in orders[i].kv_groups[plan["kv_groups"] :]:
                    layer.self_attn.o_proj.lora_A["default"].weight[:, g * 32 : (g + 1) * 32] = 0
    assert (logits(pruned, ids) - logits(reference, ids)).abs().max().item() <= ATOL
    plain = masked_phi3(base, layers, orders)
    assert (logits(plain, ids) - logits(reference, ids)).abs().max().item() > 1e-3  # the adapter matters


def test_a_phi3_super_adapter_adapts_the_fused_projections_searches_and_extracts(tmp_path, ids, capsys, write_plan):
    """train-supernet puts the super-adapter's LoRA where PEFT finds q/k/v and gate/up on Phi-3 (qkv_proj,
    gate_up_proj); the lonas search reads that adapter, and the checkpoint extract writes for a plan of widths and
    both ranks is the supernet's subnet forward of that plan."""
    peft = pytest.importorskip("peft")
    from nsc_prune._files import ADAPTER_CONFIG_NAME
    from nsc_prune.cli import main
    from nsc_prune.hf.cut.selection import adapter_channel_orders
    from nsc_prune.hf.train.subnets import subnet_context
    from nsc_prune.plan import ParetoDocument
    from tests.eval.test_evaluate import char_tokenizer

    base = build_phi3(tmp_path / "m")
    char_tokenizer().save_pretrained(base)
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 60)
    (tmp_path / "lonas8.yaml").write_text("kind: lonas\nlora_rank: 8\nlora_alpha: 16\nrank_deltas: [0, -4]\n")
    sa, search, ckpt = tmp_path / "sa", tmp_path / "search", tmp_path / "ckpt"
    train = f"train-supernet --base {base} --space {tmp_path / 'lonas8.yaml'} --data {tmp_path / 'text.txt'} --out {sa}"
    assert main([*train.split(), "--max-steps", "2", "--seq-len", "32", "--quiet", "--set", "batch_size=2"]) == 0
    targets = json.loads((sa / ADAPTER_CONFIG_NAME).read_text())["target_modules"]
    assert targets == ["down_proj", "gate_up_proj", "qkv_proj"]  # the lonas default: q/k/v, gate/up elastic; down
    assert main(["--model", str(base / "config.json"), "--space", "lonas", "--adapter", str(sa), "--budget", "80%",
                 "--out", str(search), "--quiet"]) == 0  # fmt: skip
    assert ParetoDocument.read(search).to_dict()["space"]["lora_alpha"] == 16.0
    layers = [{"ffn": 60, "lora_rank": 4}, {"ffn": 96, "lora_rank": 8}, {"ffn": 48, "lora_rank": 4},
              {"ffn": 72, "lora_rank": 8}]  # fmt: skip
    plan = write_plan(tmp_path / "plan.json", layers, json.loads((base / "config.json").read_text()))
    assert main(["extract", "--pareto", str(plan), "--base", str(base), "--adapter", str(sa), "--out", str(ckpt),
                 "--dtype", "float32"]) == 0  # fmt: skip
    capsys.readouterr()
    model = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), sa
    ).eval()
    orders = adapter_channel_orders(sa, open_base(base))[0]
    with subnet_context(model, layer_plans({"layers": layers}), orders):
        got = logits(model, ids)
        with model.disable_adapter():
            assert (got - logits(model, ids)).abs().max().item() > 1e-3  # two steps trained it: the LoRA counts
    assert (got - logits(load_pruned(ckpt), ids)).abs().max().item() <= ATOL


def test_a_phi3_with_per_layer_heads_can_be_deep_copied(ids):
    """Its layers' config views raised KeyError where copy (and pickle, by the same protocol) expect AttributeError:
    a teacher copy or an EMA model of it failed."""
    import copy

    from nsc_prune.hf.modeling.modeling_nsc_llama import NscPhi3ForCausalLM

    config = transformers.Phi3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2).to_dict()  # fmt: skip
    config["nsc_per_layer_attention"] = {"1": {"num_attention_heads": 2, "num_key_value_heads": 1}}
    model = NscPhi3ForCausalLM(transformers.Phi3Config.from_dict(config)).eval()
    ids = ids[:, :8] % 128
    with torch.no_grad():
        assert torch.equal(copy.deepcopy(model)(ids).logits, model(ids).logits)


def test_reextract_a_pruned_phi3(tmp_path, base, ids):
    """A pruned Phi-3 with per-layer heads (LongRoPE keeps the global ones) is a base again: its fused rows are
    split at each layer's own heads and width, so cutting its layer 1 further equals masking that layer."""
    opened = open_base(base)
    first = extract_plan(layer_plans({"layers": PLANS["mixed"]}), opened, tmp_path / "first", None,
                         ExtractOptions(dtype="float32"), orders=reversed_orders(opened))  # fmt: skip
    again = open_base(first)
    assert (again.widths, again.kv_heads) == ((50, 96, 17), (1, 2, 1))
    layers = [{"ffn": 50, "kv_groups": 1}, {"ffn": 40, "kv_groups": 1}, {"ffn": 17, "kv_groups": 1}]
    second = extract_plan(layer_plans({"layers": layers}), again, tmp_path / "second", None,
                          ExtractOptions(dtype="float32"))  # fmt: skip
    reference = load_pruned(first)
    with torch.no_grad():  # layer 1 keeps its first 40 channels and its first KV group (2 query heads of 16)
        reference.model.layers[1].mlp.down_proj.weight[:, 40:] = 0
        reference.model.layers[1].self_attn.o_proj.weight[:, 32:] = 0
    assert (logits(load_pruned(second), ids) - logits(reference, ids)).abs().max().item() <= ATOL
    assert (logits(load_pruned(second), ids) - logits(load_pruned(first), ids)).abs().max().item() > 1e-2


def test_uniform_kv_cut_without_longrope_is_stock(tmp_path, ids):
    """Without LongRoPE (Phi-3-mini-4k) nothing checks hidden / heads: a uniform KV-group cut is a stock checkpoint."""
    base = build_phi3(tmp_path, rope=None)
    layers = [{"ffn": 40, "kv_groups": 1}] * 4
    out = extract_plan(layer_plans({"layers": layers}), open_base(base), tmp_path / "out", None,
                       ExtractOptions(dtype="float32"))  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    assert config["num_attention_heads"] == 2 and config["architectures"] == ["Phi3ForCausalLM"]
    stock = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    orders = [LayerOrder(tuple(range(96)), (0, 1))] * 4
    assert (logits(stock, ids) - logits(masked_phi3(base, layers, orders), ids)).abs().max().item() <= ATOL
