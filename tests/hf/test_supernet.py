"""train-supernet (issue 13): masks equal extraction, the order is a function-preserving permutation, training
helps the smallest and the largest subnet, and bad input is one line, exit 2, nothing written.

The reference for "what extraction keeps" is the checkpoint ``extract --adapter`` writes, loaded with
``load_pruned``; the supernet side is the full-size PEFT model under ``subnet_context``.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from test_extract_heads_depth import ATOL, logits
from test_extract_model_types import build_tiny, family_plan

from nsc_prune._files import CHANNEL_ORDER_NAME, SUPERNET_RECORD_NAME
from nsc_prune._io import to_json
from nsc_prune.cli import main
from nsc_prune.errors import ConfigError
from nsc_prune.hf.cut.keep import LayerOrder
from nsc_prune.hf.cut.selection import channel_order_document
from nsc_prune.hf.extract import ExtractOptions, extract_subnet
from nsc_prune.hf.train.precision import uses_bf16
from nsc_prune.hf.train.recipe import TrainConfig
from nsc_prune.hf.train.subnets import SubnetSampler, space_choices, subnet_context
from nsc_prune.hf.weights.base import open_base
from nsc_prune.hf.weights.loading import load_pruned
from nsc_prune.plan import LayerPlan, layer_plans
from nsc_prune.spaces.lonas import fixed_rank_modules
from nsc_prune.spaces.registry import build_space
from tests.conftest import as_rank_alone, run_two_processes, spoil_weight

pytestmark = pytest.mark.filterwarnings("ignore:base .* has no tokenizer files")
DROP = {"ffn": 0, "kv_groups": 0, "keep": False}


def random_orders(base, seed=0):
    rng = random.Random(seed)
    return [
        LayerOrder(tuple(rng.sample(range(w), w)), tuple(rng.sample(range(kv), kv)))
        for w, kv in zip(base.widths, base.kv_heads)
    ]


def store_orders(adapter, base_dir, orders):
    document = channel_order_document(orders, open_base(base_dir), {"method": "test"})
    (adapter / CHANNEL_ORDER_NAME).write_text(to_json(document))


def supernet(base_dir, adapter):
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return peft.PeftModel.from_pretrained(model, adapter).eval()


def extracted_logits(tmp_path, tiny_dir, adapter, layers, config, write_plan, ids, name):
    plan = write_plan(tmp_path / f"{name}.json", layers, config)
    out = extract_subnet(
        plan,
        tiny_dir,
        tmp_path / name,
        point=0,
        adapter=adapter,
        options=ExtractOptions(dtype="float32", max_shard_size=30_000),
    )
    return logits(load_pruned(out, dtype="float32"), ids)


def masked_logits(model, layers, orders, ids, fixed_ranks=None):
    with subnet_context(model, layer_plans(layers), orders, fixed_ranks):
        return logits(model, ids)


@pytest.fixture
def ids():
    return torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))


PLANS = {
    "ranks": [
        {"ffn": 96, "lora_rank": 8, "kv_groups": 2},
        {"ffn": 40, "lora_rank": 4, "kv_groups": 1},
        {"ffn": 17, "lora_rank": 0, "kv_groups": 2},
        {"ffn": 64, "lora_rank": 5, "kv_groups": 1},
    ],
    "depth": [
        {"ffn": 50, "lora_rank": 6, "kv_groups": 1},
        DROP,
        {"ffn": 96, "kv_groups": 2},
        {"ffn": 33, "kv_groups": 2},
    ],
}


@pytest.mark.parametrize("kind", sorted(PLANS))
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma2", "gemma3_text"])
def test_masked_supernet_equals_extraction(tmp_path, write_plan, ids, family, kind):
    """The training forward of a plan == the checkpoint extract --adapter writes for it (adapter's own order;
    olmo2, whose post-norms follow the masked MLP, keeps every KV group)."""
    tiny = build_tiny(tmp_path / "m", family)
    orders = random_orders(open_base(tiny.base))
    store_orders(tiny.adapter, tiny.base, orders)
    layers = family_plan(family, PLANS[kind])
    expected = extracted_logits(tmp_path, tiny.base, tiny.adapter, layers, tiny.config, write_plan, ids, "out")
    got = masked_logits(supernet(tiny.base, tiny.adapter), layers, orders, ids)
    assert (got - expected).abs().max() <= ATOL
    record = json.loads((tmp_path / "out" / "nsc_prune_extract.json").read_text())
    assert record["selection"]["method"] == "adapter"


@pytest.mark.parametrize("front_rank", [8, 6], ids=["adapter-rank", "lower"])
def test_a_lonas_fronts_fixed_rank_modules_keep_its_rank_in_training_and_extraction(
    tmp_path, write_plan, ids, front_rank
):
    """The lonas space scores down_proj's LoRA at its lora_rank (fixed_rank_modules); extraction and the training
    masks cut it to the plan's rank like the elastic modules: the checkpoint was not the plan the search chose. A
    front searched at a lower rank than the adapter's keeps that rank there."""
    tiny = build_tiny(tmp_path / "m", "llama")  # LoRA rank 8
    fixed = fixed_rank_modules(build_space("lonas", tiny.config, lora_rank=front_rank).settings, "llama")
    assert fixed == {"down_proj": front_rank}
    layers = PLANS["ranks"]
    plan = write_plan(tmp_path / "p.json", layers, tiny.config)
    document = json.loads(plan.read_text())
    document["space"] = {"name": "lonas", "kind": "lonas", "fixed_rank_modules": ["down_proj"], "lora_rank": front_rank}
    plan.write_text(json.dumps(document))
    options = ExtractOptions(dtype="float32", keep_adapter=True)
    out = extract_subnet(plan, tiny.base, tmp_path / "o", point=0, adapter=tiny.adapter, options=options)
    model = supernet(tiny.base, tiny.adapter)
    kept = masked_logits(model, layers, None, ids, fixed_ranks=fixed)
    assert (logits(load_pruned(out, dtype="float32"), ids) - kept).abs().max() <= ATOL
    assert (masked_logits(model, layers, None, ids) - kept).abs().max() > 1e-3  # a cut down_proj is another model
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    ranks = {key: r for key, r in config["rank_pattern"].items() if key.startswith("model.layers.3.")}
    assert ranks["model.layers.3.mlp.down_proj"] == front_rank and ranks["model.layers.3.mlp.up_proj"] == 5, ranks


def test_a_fixed_module_with_a_lower_rank_does_not_bound_the_plans_rank(tmp_path, write_plan, ids):
    """Only the elastic modules bound a plan's lora_rank: a super-adapter whose fixed down_proj has rank 4 (the
    front's lora_rank) and the rest rank 8 extracts a rank-8 plan, down_proj at its 4 (was refused: "rank 4")."""
    tiny = build_tiny(tmp_path / "m", "llama", lora=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
    config = peft.LoraConfig(r=8, target_modules=targets, rank_pattern={"down_proj": 4}, init_lora_weights=False)
    peft.get_peft_model(model, config).save_pretrained(tmp_path / "a")
    layers = PLANS["ranks"]
    plan = write_plan(tmp_path / "p.json", layers, tiny.config)
    document = json.loads(plan.read_text())
    document["space"] = {"name": "lonas", "kind": "lonas", "fixed_rank_modules": ["down_proj"], "lora_rank": 4}
    plan.write_text(json.dumps(document))
    options = ExtractOptions(dtype="float32", keep_adapter=True)
    out = extract_subnet(plan, tiny.base, tmp_path / "o", point=0, adapter=tmp_path / "a", options=options)
    kept = masked_logits(supernet(tiny.base, tmp_path / "a"), layers, None, ids, fixed_ranks={"down_proj": 4})
    assert (logits(load_pruned(out, dtype="float32"), ids) - kept).abs().max() <= ATOL
    ranks = json.loads((out / "adapter" / "adapter_config.json").read_text())["rank_pattern"]
    assert ranks["model.layers.0.mlp.down_proj"] == 4 and ranks["model.layers.0.mlp.up_proj"] == 8, ranks


def test_fixed_ranks_name_fused_projections_and_never_exceed_the_adapters():
    from nsc_prune.hf.cut.keep import plan_rank

    space = {"kind": "lonas", "fixed_rank_modules": ["gate_proj", "up_proj", "down_proj"], "lora_rank": 8}
    assert fixed_rank_modules(space, "phi3")["gate_up_proj"] == 8  # Phi-3's LoRA sits on the fused module
    assert fixed_rank_modules({**space, "kind": "elastic"}, "phi3") == {}
    assert fixed_rank_modules({"kind": "lonas", "lora_rank": 8}, "llama") == {"down_proj": 8}  # the space's default
    assert fixed_rank_modules({"kind": "lonas", "fixed_rank_modules": []}, "llama") == {}  # no rank needed then
    plan = LayerPlan(ffn=16, lora_rank=4)
    assert [plan_rank(plan, full, "mlp.down_proj", {"down_proj": 8}) for full in (16, 6)] == [8, 6]
    assert plan_rank(plan, 16, "mlp.up_proj", {"down_proj": 8}) == 4 and plan_rank(plan, 16) == 4
    with pytest.raises(ConfigError, match="lora_rank must be an integer >= 0; got None"):
        fixed_rank_modules({**space, "lora_rank": None}, "llama")
    with pytest.raises(ConfigError, match=r"LoRA modules \['down_prj'\] are not decoder projections"):
        fixed_rank_modules({**space, "fixed_rank_modules": ["down_prj"]}, "llama")  # a hand-edited pareto.json


def permute_model_(model, orders: list[LayerOrder]):
    """Permute, in place, a stock model's FFN channels (gate/up rows, down columns) and KV groups (their k/v rows,
    their query heads' q rows and o columns) so that unit ``order[j]`` becomes unit ``j``: what the super-adapter's
    channel order means. Separate projections, no PEFT wrapper and no norm over a whole projection (OLMo 2)."""
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    group = heads // kv

    def take(linear, index, dim):
        linear.weight.data = linear.weight.data.index_select(dim, index)
        if dim == 0 and linear.bias is not None:
            linear.bias.data = linear.bias.data.index_select(0, index)

    with torch.no_grad():
        for layer, order in zip(model.model.layers, orders, strict=True):
            ffn = torch.tensor(order.ffn)
            take(layer.mlp.gate_proj, ffn, 0)
            take(layer.mlp.up_proj, ffn, 0)
            take(layer.mlp.down_proj, ffn, 1)
            kv_rows = torch.tensor([g * head_dim + d for g in order.kv_groups for d in range(head_dim)])
            q_rows = torch.tensor(
                [(g * group + j) * head_dim + d for g in order.kv_groups for j in range(group) for d in range(head_dim)]
            )
            attention = layer.self_attn
            take(attention.q_proj, q_rows, 0)
            take(attention.k_proj, kv_rows, 0)
            take(attention.v_proj, kv_rows, 0)
            take(attention.o_proj, q_rows, 1)
    return model


def test_permutation_preserves_logits_and_means_first_k(tmp_path, ids):
    tiny = build_tiny(tmp_path / "m", "qwen2", lora=False)
    orders = random_orders(open_base(tiny.base), seed=3)
    original = transformers.AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval()
    permuted = permute_model_(
        transformers.AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval(), orders
    )
    assert (logits(permuted, ids) - logits(original, ids)).abs().max() <= ATOL
    layers = PLANS["depth"]
    layers = [{k: v for k, v in layer.items() if k != "lora_rank"} for layer in layers]
    assert (
        masked_logits(original, layers, orders, ids) - masked_logits(permuted, layers, None, ids)
    ).abs().max() <= ATOL


def test_adapter_order_refuses_another_selection(tmp_path, write_plan, ids):
    tiny = build_tiny(tmp_path / "m", "llama")
    store_orders(tiny.adapter, tiny.base, random_orders(open_base(tiny.base)))
    plan = write_plan(tmp_path / "p.json", PLANS["ranks"], tiny.config)
    from nsc_prune.hf.cut.selection import SelectionConfig

    with pytest.raises(ConfigError, match="its own channel order"):
        extract_subnet(
            plan, tiny.base, tmp_path / "o", point=0, adapter=tiny.adapter, selection=SelectionConfig("magnitude")
        )
    assert not (tmp_path / "o").exists()


def test_an_adapter_order_with_a_non_integer_entry_is_one_line(tmp_path):
    from nsc_prune.hf.cut.selection import adapter_channel_orders

    tiny = build_tiny(tmp_path / "m", "llama")
    base = open_base(tiny.base)
    store_orders(tiny.adapter, tiny.base, random_orders(base))
    path = tiny.adapter / CHANNEL_ORDER_NAME
    document = json.loads(path.read_text())
    whole = list(document["layers"][1]["ffn"])
    for entry in ("a", True, whole[1]):  # "a" made sorted() raise a TypeError; True sorted as 1; a repeat
        document["layers"][1]["ffn"][0] = entry
        path.write_text(json.dumps(document))
        with pytest.raises(ConfigError, match=r"layer 1 'ffn' must be a permutation of 0\.\.\d+ \(the base's\)"):
            adapter_channel_orders(tiny.adapter, base)
    document["layers"][1]["ffn"] = whole
    for version in (2, "1", None):  # read as format 1 whatever it said
        path.write_text(json.dumps({**document, "format": version}))
        with pytest.raises(ConfigError, match=f"'format' must be 1, the one this nsc-prune reads; got {version!r}"):
            adapter_channel_orders(tiny.adapter, base)


def test_sampler_sandwich_is_seeded(tiny_llama):
    tiny = tiny_llama(gqa=True, lora=False)
    space = build_space("ffn-heads-depth", tiny.config, ffn_step=16, protect_layers=[0])
    sampler = SubnetSampler(tuple(space_choices(space)), n_random=2, seed=5)
    plans = sampler.plans(7)
    assert len(plans) == 4 and plans == sampler.plans(7) and plans != sampler.plans(8)
    assert plans[0] == [LayerPlan(ffn=96, kv_groups=2)] * 3
    assert plans[1][0] == LayerPlan(ffn=96, kv_groups=2) and not any(p.keep for p in plans[1][1:])  # layer 0 protected


# ---------------------------------------------------------------------------------------------- end to end


def corpus(path, words=6000, seed=0):
    """A learnable word-level text for the tiny tokenizer: a noisy deterministic chain over w3..w127."""
    rng = random.Random(seed)
    current, out = 3, []
    for i in range(words):
        out.append(f"w{current}")
        current = (current * 7 + 5) % 125 + 3 if rng.random() < 0.9 else rng.randrange(3, 128)
        if i % 200 == 199:
            out.append("\n\n")
    path.write_text(" ".join(out))
    return path


TRAIN = [
    "--max-steps",
    "40",
    "--seq-len",
    "32",
    "--quiet",
    "--set",
    "batch_size=4",
    "--set",
    "learning_rate=3e-3",
    "--set",
    "warmup_steps=0",
    "--set",
    "save_steps=1000",
    "--set",
    "eval_steps=1000",
    "--set",
    "lora_rank=8",
    "--set",
    "lora_alpha=32",
]


def test_train_supernet_end_to_end(tmp_path, tiny_llama, write_plan, ids):
    """A short seeded run lowers the held-out loss of the smallest and the largest subnet, and every sampled
    plan's training forward equals what extract --adapter writes from the trained adapter."""
    from nsc_prune.hf.train.data import load_text_blocks
    from nsc_prune.hf.train.trainer import evaluate_loss

    tiny = tiny_llama(gqa=True, lora=False)
    data = corpus(tmp_path / "text.txt")
    out = tmp_path / "sa"
    argv = [
        "train-supernet",
        "--base",
        str(tiny.base),
        "--space",
        "ffn-heads-depth",
        "--data",
        str(data),
        "--out",
        str(out),
        "--selection",
        "magnitude",
        "--set",
        "ffn_step=16",
        *TRAIN,
    ]
    assert main(argv) == 0
    assert {p.name for p in out.iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
        CHANNEL_ORDER_NAME,
        SUPERNET_RECORD_NAME,
    }
    assert not (tmp_path / ".sa.train").exists()
    record = json.loads((out / SUPERNET_RECORD_NAME).read_text())
    assert record["sampling"]["rule"] == "sandwich" and record["token_budget"]["tokens"] == 40 * 4 * 32
    assert record["subnets_per_step"] == 4 and record["token_budget"]["subnet_forward_tokens"] == 4 * 40 * 4 * 32
    card = (out / "README.md").read_text()  # PEFT's blank template, with the base as typed for a Hub id, before
    assert "[More Information Needed]" not in card and "base_model" not in card and "library_name: peft" in card
    assert (
        "by `nsc-prune train-supernet` over the `ffn-heads-depth` space: 40 steps, 5,120 tokens of `text.txt`" in card
    )
    assert "ranked by largest weight norms (data-free)" in card and f"--adapter {out.name} --out pruned" in card

    base = open_base(tiny.base)
    from nsc_prune.hf.cut.selection import adapter_channel_orders

    orders, _ = adapter_channel_orders(out, base)
    trained = supernet(tiny.base, out)
    sampler = SubnetSampler(tuple(space_choices(build_space("ffn-heads-depth", tiny.config, ffn_step=16))), 2, 0)
    for i, plans in enumerate(sampler.plans(3)):
        layers = [{"ffn": p.ffn, "kv_groups": p.kv_groups, "keep": p.keep} if p.keep else DROP for p in plans]
        expected = extracted_logits(tmp_path, tiny.base, out, layers, tiny.config, write_plan, ids, f"x{i}")
        assert (masked_logits(trained, layers, orders, ids) - expected).abs().max() <= ATOL

    blocks = load_text_blocks([data], transformers.AutoTokenizer.from_pretrained(tiny.base), 32, seed=0)
    untrained = transformers.AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval()
    for plans in (sampler.largest(), sampler.smallest()):
        with subnet_context(untrained, plans, orders):
            before = evaluate_loss(untrained, blocks.val)
        with subnet_context(trained, plans, orders):
            after = evaluate_loss(trained, blocks.val)
        assert after < before - 0.05, (plans, before, after)


def test_data_flags_shape_the_blocks(tmp_path, tiny_llama):
    """heal's data flags work for train-supernet: --max-tokens caps what is read, --val-fraction the held-out part."""
    tiny = tiny_llama(gqa=True, lora=False)
    data = corpus(tmp_path / "text.txt", words=2000)  # 10 documents
    out = tmp_path / "sa"
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--data", str(data), "--out", str(out)]
    argv += ["--max-steps", "1", "--seq-len", "32", "--quiet", "--set", "ffn_step=16", "--set", "batch_size=2"]
    assert main([*argv, "--max-tokens", "600", "--val-fraction", "0.25"]) == 0
    record = json.loads((out / SUPERNET_RECORD_NAME).read_text())["data"]
    assert record["max_tokens"] == 600 and record["val_fraction"] == 0.25 and record["text_field"] == "text"
    read = record["describe"]
    per_document = read["tokens_read"] / read["documents"]  # documents have one length here
    assert 600 <= read["tokens_read"] < 600 + per_document and read["documents"] < 10  # stops at the cap
    assert read["val_documents"] == 1 and read["val_tokens"] > 0  # 25 % of ~4 documents


def test_a_warning_about_the_text_is_said_before_the_calibration_pass(tmp_path, tiny_llama, capsys, monkeypatch):
    """It came after the activation pass over that very text (heal says it before its first pass)."""
    import nsc_prune.hf.train.supernet as supernet_module

    tiny = tiny_llama(gqa=True, lora=False)
    data = tmp_path / "unknown.txt"
    data.write_text("\n\n".join(" ".join(["zz qq xx"] * 30) for _ in range(20)))
    said_before, orders_for = [], supernet_module._orders_for
    monkeypatch.setattr(
        supernet_module,
        "_orders_for",
        lambda *args: (said_before.append(capsys.readouterr().err), orders_for(*args))[1],
    )
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--data", str(data), "--out",
            str(tmp_path / "sa"), "--max-steps", "1", "--seq-len", "32", "--batch-size", "2", "--set", "ffn_step=16"]  # fmt: skip
    assert main(argv) == 0
    assert "are the tokenizer's unknown token" in said_before[0]


def test_one_sample_a_line_text_trains_a_supernet(tmp_path, tiny_llama):
    """train-supernet reads a one-sample-a-line text as line documents and records how it split them."""
    tiny = tiny_llama(gqa=True, lora=False)
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(" ".join(f"w{3 + (i + k) % 7}" for k in range(20)) for i in range(40)) + "\n")
    out = tmp_path / "sa"
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--data", str(data), "--out", str(out)]
    argv += ["--max-steps", "1", "--seq-len", "32", "--batch-size", "2", "--quiet", "--set", "ffn_step=16"]
    assert main(argv) == 0
    assert json.loads((out / SUPERNET_RECORD_NAME).read_text())["recipe"]["batch_size"] == 2
    read = json.loads((out / SUPERNET_RECORD_NAME).read_text())["data"]["describe"]
    assert read["sources"][0]["documents_by"] == "lines" and read["documents"] == 40 and read["split"] == "documents"


def test_the_sandwich_trains_the_lowest_and_the_highest_lora_rank(tiny_llama):
    """Merged LoRA adds no parameters, so a width's ranks tie on parameters: the smallest subnet took the first of
    them, the highest rank, and the lowest rank was trained only when a random draw picked it."""
    from nsc_prune.spaces.registry import build_space

    tiny = tiny_llama(lora=False)
    sampler = SubnetSampler(tuple(space_choices(build_space("lonas", tiny.config, lora_rank=8))), 2, 0)
    assert {(p.ffn, p.lora_rank) for p in sampler.smallest()} == {(48, 4)}
    assert {(p.ffn, p.lora_rank) for p in sampler.largest()} == {(96, 8)}


def test_a_front_of_plans_no_run_can_train_or_extract_is_refused(tmp_path, tiny_llama, write_plan, monkeypatch):
    """--pareto points were not checked like the space's options: on olmo2 a front cutting KV groups trained (exit
    0) on masks extract then refused; and under a launcher a largest point that drops a layer crashed both ranks in
    DDP (its LoRA is not in the last subnet's graph, whose backward syncs the gradients)."""
    from nsc_prune.errors import UnsupportedArchitectureError
    from nsc_prune.hf.train.subnets import pareto_points

    olmo = build_tiny(tmp_path / "olmo", "olmo2", lora=False)
    cut = write_plan(tmp_path / "cut.json", [{"ffn": 96, "kv_groups": 1}] * 4, olmo.config, extra_points=1)
    with pytest.raises(UnsupportedArchitectureError, match="train-supernet --pareto of olmo2 cannot cut KV groups"):
        pareto_points(cut, open_base(olmo.base), 8)
    tiny = tiny_llama(lora=False)
    dropped = write_plan(tmp_path / "drop.json", [{"ffn": 96}, {"ffn": 0, "kv_groups": 0, "keep": False}, {"ffn": 96}],
                         tiny.config, extra_points=1)  # fmt: skip
    assert len(pareto_points(dropped, open_base(tiny.base), 8)) == 2  # one process trains it
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="--pareto's largest point drops a layer, which several processes cannot"):
        pareto_points(dropped, open_base(tiny.base), 8)


@pytest.mark.parametrize(
    "space, message",
    [
        (["--space", "ffn-heads", "--set", "ffn_step=16"], "searched with kind 'lonas' and --space 'ffn-heads' has 'elastic'"),
        (["--space", "lonas", "--lora-rank", "16"], "searched with lora_rank 8 and --space 'lonas' has 16"),
    ],
)  # fmt: skip
def test_a_front_of_another_space_is_refused(tmp_path, tiny_llama, write_plan, capsys, space, message):
    """The adapter's record names --space, which the search then builds from (and a lonas front's fixed modules
    keep its rank in extraction): both trained the front's plans and said another space."""
    tiny = tiny_llama(lora=False)
    layers = [{"ffn": 96, "lora_rank": 8}, {"ffn": 48, "lora_rank": 4}, {"ffn": 72, "lora_rank": 8}]
    pareto = write_plan(tmp_path / "pareto.json", layers, tiny.config)
    document = json.loads(pareto.read_text())
    document["space"] = {"name": "lonas", "kind": "lonas", "lora_rank": 8, "rank_deltas": [0, -4]}
    pareto.write_text(json.dumps(document))
    data = corpus(tmp_path / "text.txt", words=300)
    argv = ["train-supernet", "--base", str(tiny.base), *space, "--data", str(data), "--out", str(tmp_path / "sa"),
            "--pareto", str(pareto), "--max-steps", "1", "--quiet"]  # fmt: skip
    capsys.readouterr()  # what building the tiny model printed
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "sa").exists(), err


def test_a_lonas_front_of_other_rank_deltas_is_refused():
    """The ranks a lonas front chose from are its rank_deltas: a front searched with [0, -2] trained under a space
    of [0, -4] would train ranks its plans never hold, and the record would name the wrong space."""
    from nsc_prune.hf.train.supernet import _check_front_space

    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}  # fmt: skip
    space = build_space("lonas", config, lora_rank=8, rank_deltas=[0, -4])
    front = {"kind": "lonas", "lora_rank": 8, "rank_deltas": [0, -4]}
    _check_front_space(front, space)
    with pytest.raises(ConfigError, match=r"searched with rank_deltas \[0, -2\] and --space 'lonas' has \(0, -4\)"):
        _check_front_space({**front, "rank_deltas": [0, -2]}, space)


def test_train_supernet_lonas_from_pareto(tmp_path, tiny_llama, write_plan):
    """--pareto draws the plans from a front; the lonas space sets r/alpha/targets; the search reads them back."""
    from nsc_prune.spaces.lonas import read_adapter_config

    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=3000)
    layers = [{"ffn": 96, "lora_rank": 8}, {"ffn": 48, "lora_rank": 4}, {"ffn": 72, "lora_rank": 8}]
    pareto = write_plan(tmp_path / "pareto.json", layers, tiny.config, extra_points=2)
    out = tmp_path / "sa"
    space = tmp_path / "lonas-r8.yaml"
    space.write_text("kind: lonas\nlora_rank: 8\nlora_alpha: 16\nrank_deltas: [0, -4]\n")
    argv = [
        "train-supernet",
        "--base",
        str(tiny.base),
        "--space",
        str(space),
        "--data",
        str(data),
        "--out",
        str(out),
        "--pareto",
        str(pareto),
        "--teacher",
        "--max-steps",
        "3",
        "--seq-len",
        "32",
        "--quiet",
        "--set",
        "batch_size=2",
    ]
    assert main(argv) == 0, argv
    config = read_adapter_config(out)
    assert config["lora_rank"] == 8 and config["lora_alpha"] == 16  # the space's alpha, not TrainConfig's
    record = json.loads((out / SUPERNET_RECORD_NAME).read_text())
    assert record["sampling"]["rule"] == "pareto" and record["recipe"]["distill"] is True
    trained_front = record["sampling"]["pareto_sha256"]
    assert trained_front == hashlib.sha256(pareto.read_bytes()).hexdigest()
    assert record["precision"] == ("bf16 autocast" if uses_bf16(TrainConfig()) else "float32")  # "auto" resolved


def test_minutes_sizes_a_supernet_run_end_to_end(tmp_path, tiny_llama, monkeypatch):
    """``train-supernet --minutes``: a fake clock (1 s a reading: 3 s of probe, 1 s a step) sizes 0.25 minutes to
    12 steps with a warm-up of 1, and the record holds the sized recipe and the measured throughput."""
    import itertools

    import nsc_prune.cli.train_supernet as supernet_command
    from nsc_prune.hf.train.budget import TimeBudget

    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=3000)
    clock = itertools.count(0.0, 1.0).__next__
    monkeypatch.setattr(supernet_command, "time_budget", lambda args, settings: TimeBudget(args.minutes, clock=clock))
    out = tmp_path / "sa"
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--data",
            str(data), "--out", str(out), "--minutes", "0.25", "--warmup-steps", "20", "--seq-len", "32", "--quiet",
            "--set", "batch_size=2"]  # fmt: skip
    assert main(argv) == 0
    record = json.loads((out / SUPERNET_RECORD_NAME).read_text())
    assert (record["recipe"]["max_steps"], record["recipe"]["warmup_steps"]) == (12, 1)
    assert record["token_budget"]["steps"] == 12 and record["token_budget"]["tokens"] == 12 * 2 * 32
    sized = record["result"]["budget"]
    assert sized["max_steps"] == 12 and sized["minutes"] == 0.25 and sized["tokens_per_s"] == 2 * 32


def test_help_states_the_defaults_train_supernet_runs_with():
    """Where train-supernet's recipe defaults are not TrainConfig's (heal's), its --help and docs/cli.md say so."""
    from nsc_prune.cli.heal import build_parser as heal_parser
    from nsc_prune.cli.parser import shown_default
    from nsc_prune.cli.train_supernet import build_parser

    def shown(parser):
        return {action.dest: shown_default(action) for action in parser._actions}

    heal, supernet = shown(heal_parser()), shown(build_parser())
    assert heal["gradient_checkpointing"] == "auto" and supernet["gradient_checkpointing"] == "false"
    for dest in ("lora_rank", "lora_alpha"):  # the lonas space sets its own
        assert supernet[dest].startswith(heal[dest]) and "lonas" in supernet[dest]
    assert supernet["max_steps"] == heal["max_steps"]
    assert supernet["learning_rate"] == "0.0005" and heal["learning_rate"] == "0.0005 with LoRA, 0.0001 with --full"


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--space", "ffn-grid"], "an elastic axis"),  # step 256 on a 96-wide FFN: one width
        (["--space", "lonas", "--set", "lora_rank=200"], "LoRA rank 200 is larger than the narrowest adapted matrix"),
        (["--space", "ffn-grid", "--set", "ffn_step=16", "--set", "no_such_key=1"], "no setting"),
        (["--space", "ffn-grid", "--set", "ffn_step=16", "--set", "batchsize=2"], "did you mean batch_size?"),
        (["--space", "txl-wt103"], "a space over a base model's layers (kind lonas or elastic); got 'txl-wt103 (kind"),
        (["--space", "ffn-heads", "--set", "ffn_step=16", "--seq-len", "1000"], "max_position_embeddings"),
        (
            ["--space", "ffn-heads", "--set", "ffn_step=16", "--set", "gradient_checkpointing=true"],
            "gradient_checkpointing",
        ),
        (["--space", "ffn-grid", "--set", "ffn_step=16", "--minutes", "1", "--max-steps", "2"], "--minutes and"),
        (
            ["--space", "ffn-grid", "--set", "ffn_step=16", "--lora-targets", "foo_proj"],
            "--lora-targets must be decoder projections of a llama layer",
        ),
        (  # a linear module, but not one extraction and the search can slice: refused before training
            ["--space", "ffn-grid", "--set", "ffn_step=16", "--set", "lora_targets=[lm_head]"],
            "lora_targets must be decoder projections of a llama layer (q_proj, k_proj, v_proj, o_proj, gate_proj, "
            "up_proj, down_proj); got ['lm_head']",
        ),
        (  # the space samples ranks of modules the adapter would not have
            ["--space", "lonas", "--set", "lora_targets=[o_proj]"],
            "lora_targets must be the lonas space's LoRA modules (",
        ),
        (["--space", "ffn-grid", "--set", "ffn_step=16", "--set", "full=true"], "full must be false"),
        (  # a batch of the text's few blocks: the probe runs, and finds no step fits
            ["--space", "ffn-grid", "--set", "ffn_step=16", "--batch-size", "2", "--minutes", "0.0000001"],
            "enough for one training step",
        ),
        (["--space", "ffn-grid", "--set", "ffn_step=16"], "--batch-size must be at most the 4 training blocks of 128"),
        (  # each a forward and backward pass a step: SIGTERM then waited minutes for the step to end
            ["--space", "ffn-grid", "--set", "ffn_step=16", "--sandwich-random", "100000"],
            "--sandwich-random must be at most the ",
        ),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, tiny_llama, capsys, extra, message):
    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    out = tmp_path / "sa"
    capsys.readouterr()  # the fixture's progress bars
    argv = ["train-supernet", "--base", str(tiny.base), "--data", str(data), "--out", str(out), "--quiet", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    if "0.0000001" in extra:  # refused after the probe: the base's loading bar precedes the one error line
        err = err.splitlines()[-1]
    assert len(err.splitlines()) == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]


def test_a_resume_refused_for_other_settings_writes_nothing_in_that_folder(tmp_path, tiny_llama, capsys):
    """--resume into the work folder of a run with other settings is refused in one line before the channel order
    is written there (it was written, then the trainer refused)."""
    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    common = ["train-supernet", "--base", str(tiny.base), "--data", str(data), "--space", "ffn-grid", "--set",
              "ffn_step=16", "--max-steps", "1", "--seq-len", "32", "--quiet", "--set", "batch_size=2"]  # fmt: skip
    work = tmp_path / "work"
    (work / "checkpoints").mkdir(parents=True)  # the state of a run with another LoRA rank
    record = {"config": {"lora_rank": 999}, "data_sha256": "x", "blocks_sha256": "x", "teacher": False,
              "teacher_logits": None, "minutes": None, "budget": None}  # fmt: skip
    (work / "checkpoints" / "nsc_prune_train.json").write_text(json.dumps(record))
    (work / "checkpoints" / "checkpoint-1").mkdir()
    before = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "b"), "--work-dir", str(work), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "which used other settings" in err, err
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == before
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("ends", ["finished", "diverged"])
def test_the_new_folders_above_the_state_go_with_it(tmp_path, tiny_llama, capsys, ends):
    """The state folder was removed after a run (or a fresh run's failure) and the empty folders made for it stayed."""
    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    (tmp_path / "runs").mkdir()  # there before the run: it stays
    extra = ["--learning-rate", "1e30"] if ends == "diverged" else []
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--data",
            str(data), "--out", str(tmp_path / "sa"), "--quiet", "--max-steps", "2", "--seq-len", "32", "--work-dir",
            str(tmp_path / "runs" / "new" / "deeper" / "state"), *extra]  # fmt: skip
    code, err = main(argv), capsys.readouterr().err
    assert code == 0 if ends == "finished" else code == 2 and "training diverged" in err, err
    assert (tmp_path / "sa").is_dir() == (ends == "finished") and not any((tmp_path / "runs").iterdir())


def test_a_work_dir_that_removing_would_lose_data_is_refused(tmp_path, tiny_llama, capsys):
    """The state folder is removed after the run: the base (even with --resume), a folder of the user's or one
    inside the base is refused in one line and left as it was."""
    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("important")
    inside = tiny.base / "state"  # a stopped run would leave its state in the model folder
    for work, extra in ((tiny.base, ["--resume"]), (mine, []), (inside, [])):
        watched = work if work.exists() else work.parent
        before = sorted(p.name for p in watched.iterdir())
        capsys.readouterr()
        argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--data",
                str(data), "--out", str(tmp_path / "sa"), "--quiet", "--work-dir", str(work), *extra]  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--work-dir" in err, err
        assert sorted(p.name for p in watched.iterdir()) == before and not (tmp_path / "sa").exists()


def test_a_sharded_launch_is_refused_in_one_line(tmp_path, tiny_llama, capsys, monkeypatch):
    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--data",
            str(data), "--out", str(tmp_path / "sa"), "--quiet"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "train-supernet runs plain data parallelism only" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]


def test_existing_nonempty_out_refused(tmp_path, tiny_llama, capsys):
    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    out = tmp_path / "sa"
    capsys.readouterr()  # the fixture's progress bars
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    argv = [
        "train-supernet",
        "--base",
        str(tiny.base),
        "--space",
        "ffn-heads",
        "--set",
        "ffn_step=16",
        "--data",
        str(data),
        "--out",
        str(out),
    ]
    for extra in ([], ["--overwrite"]):  # "pass --overwrite" first was advice that --overwrite then refused
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "replaces only a super-adapter written by nsc-prune train-supernet" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and sorted(p.name for p in tmp_path.iterdir()) == [
        "sa",
        "text.txt",
    ]


def test_under_a_launcher_only_rank_0_writes_the_adapter(tmp_path, tiny_llama, monkeypatch):
    """Every rank of an ``accelerate launch`` run trains; a rank but the first writes nothing and leaves the state
    folder to rank 0 (which reads its channel order from it), so no rank can delete what another still reads."""
    tiny = tiny_llama(gqa=True, lora=False)
    data = corpus(tmp_path / "text.txt", words=2000)
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--data", str(data), "--quiet"]
    argv += ["--max-steps", "1", "--seq-len", "32", "--batch-size", "2", "--set", "ffn_step=16"]
    as_rank_alone(monkeypatch, 1)
    assert main([*argv, "--out", str(tmp_path / "sa")]) == 0
    assert not (tmp_path / "sa").exists() and (tmp_path / ".sa.train" / CHANNEL_ORDER_NAME).is_file()
    as_rank_alone(monkeypatch, 0)
    assert main([*argv, "--out", str(tmp_path / "sa0")]) == 0
    assert (tmp_path / "sa0" / CHANNEL_ORDER_NAME).is_file() and not (tmp_path / ".sa0.train").exists()


ADAPTER_FILE = "adapter_model.safetensors"
LAUNCHED_SUPERNET = """
import json, os
from nsc_prune.cli import main
rank = os.environ["RANK"]
code = main([arg.replace("%RANK%", rank) for arg in {argv!r}])  # %RANK%: a path of each rank's own
json.dump({{"code": code}}, open({out!r} + ".%s.json" % rank, "w"))
"""


def test_two_launched_processes_train_the_one_process_adapter(tmp_path, tiny_llama):
    """Two gloo processes of batch 2 write the adapter one process of batch 4 trains (every rank samples the same
    subnets and channel orders); ranks given other texts stop in one line, nothing written. (Before the ranks
    compared their inputs, rank 0 could create the state folder before rank 1 checked that it was absent: rank 1
    refused, rank 0 waited for it; seen in 3 of 8 runs here.)"""
    from safetensors.torch import load_file

    tiny = tiny_llama(gqa=True, lora=False)
    corpus(tmp_path / "text.0.txt", words=2000)
    corpus(tmp_path / "text.1.txt", words=2000, seed=1)
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--quiet", "--max-steps", "3"]
    argv += ["--seq-len", "32", "--set", "ffn_step=16", "--learning-rate", "5e-3", "--warmup-steps", "0"]
    argv += ["--bf16", "false"]  # auto is bf16 on a CPU with AVX512-BF16, whose round-off the tolerance is not for
    single = tmp_path / "single"
    assert main([*argv, "--data", str(tmp_path / "text.0.txt"), "--batch-size", "4", "--out", str(single)]) == 0
    for name, data in (("dp", "text.0.txt"), ("apart", "text.%RANK%.txt")):
        out, script = tmp_path / name, tmp_path / f"{name}.py"
        launched = [*argv, "--data", str(tmp_path / data), "--batch-size", "2", "--out", str(out)]
        script.write_text(LAUNCHED_SUPERNET.format(argv=launched, out=str(out)))
        done = run_two_processes(script, timeout=240)
        codes = [json.loads(Path(f"{out}.{rank}.json").read_text())["code"] for rank in (0, 1)]
        assert codes == ([0, 0] if name == "dp" else [2, 2]), done.stderr[-2000:]
    assert done.stderr.count("the 2 processes disagree on the inputs of train-supernet") == 1  # rank 0 prints it
    assert not (tmp_path / "apart").exists() and not (tmp_path / ".apart.train").exists()
    ours, reference = load_file(tmp_path / "dp" / ADAPTER_FILE), load_file(single / ADAPTER_FILE)
    assert ours.keys() == reference.keys()
    assert max(float(v.abs().max()) for k, v in reference.items() if "lora_B" in k) > 1e-3  # trained (B starts at 0)
    # Round-off of the gradient sums (one sum of 4 against two of 2) reaches the weights through Adam's division
    # by sqrt(v): elements whose gradients are near 0 move by up to ~1e-4 (lr 5e-3; seen 3.7e-5 and 9.0e-5), a
    # handful of them; another subnet or channel order on a rank moves most elements by ~lr.
    for key, value in reference.items():
        torch.testing.assert_close(ours[key], value, atol=5e-4, rtol=0)
    apart = sum(int(((ours[k] - v).abs() > 1e-6).sum()) for k, v in reference.items())
    assert apart <= 0.005 * sum(v.numel() for v in reference.values()), apart
    record = json.loads((tmp_path / "dp" / SUPERNET_RECORD_NAME).read_text())
    budget = record["token_budget"]  # tokens_per_step was one process's while tokens counted both
    assert record["result"]["world_size"] == 2 and budget["tokens"] == budget["steps"] * budget["tokens_per_step"]


def test_work_dir_holds_the_training_state(tmp_path, tiny_llama, capsys):
    """--work-dir means what it means in heal: the state folder a fresh run refuses and --resume continues."""
    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    work = tmp_path / "state"
    (work / "checkpoints").mkdir(parents=True)
    capsys.readouterr()  # the fixture's progress bars
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-heads", "--set", "ffn_step=16"]
    argv += ["--data", str(data), "--out", str(tmp_path / "sa"), "--work-dir", str(work)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and f"the training state folder {work} holds an earlier run" in err
        and "--resume" in err
    )
    assert not (tmp_path / ".sa.train").exists() and not (tmp_path / "sa").exists()


def test_an_existing_super_adapter_is_replaced_only_with_overwrite(tmp_path, tiny_llama, capsys):
    """docs/outputs.md: train-supernet into its own earlier output is refused (one line, nothing touched) and
    replaced with --overwrite."""
    tiny = tiny_llama(gqa=True, lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    out = tmp_path / "sa"
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--data", str(data), "--out", str(out)]
    argv += ["--max-steps", "1", "--seq-len", "32", "--quiet", "--set", "ffn_step=16"]
    assert main([*argv, "--batch-size", "1"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main([*argv, "--batch-size", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already exists; pass --overwrite" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*argv, "--batch-size", "2", "--overwrite"]) == 0
    assert json.loads((out / SUPERNET_RECORD_NAME).read_text())["recipe"]["batch_size"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sa", "text.txt"]  # no training state left behind
    (out / "notes.txt").write_text("mine")  # a file of the user's beside the adapter: --overwrite deleted it
    assert main([*argv, "--batch-size", "1", "--overwrite"]) == 2
    assert "also holds notes.txt, which it would delete" in capsys.readouterr().err and (out / "notes.txt").is_file()


def test_resume_after_a_failure_writes_the_same_adapter(tmp_path, tiny_llama, monkeypatch, capsys):
    """A run that fails after its checkpoints keeps .OUT.train; a fresh run is then refused, and --resume
    finishes it (the stored channel order, the same LoRA modules as an uninterrupted run)."""
    from safetensors.torch import load_file

    from nsc_prune.hf.train import supernet

    tiny = tiny_llama(gqa=True, lora=False)
    data = corpus(tmp_path / "text.txt", words=2000)
    common = [
        "--base",
        str(tiny.base),
        "--space",
        "ffn-heads",
        "--data",
        str(data),
        "--max-steps",
        "3",
        "--seq-len",
        "32",
        "--quiet",
        "--set",
        "ffn_step=16",
        "--set",
        "save_steps=1",
        "--set",
        "batch_size=2",
    ]
    assert main(["train-supernet", *common, "--out", str(tmp_path / "ref")]) == 0

    def fail(folder, base):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(supernet, "_check_written", fail)
    out = tmp_path / "sa"
    assert main(["train-supernet", *common, "--out", str(out)]) == 2
    assert not out.exists() and (tmp_path / ".sa.train" / "checkpoints").is_dir()
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["train-supernet", *common, "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    for other, changed in (  # these resumed the run without a word, and the record named the new settings only
        (["--set", "ffn_min_fraction=0.75"], "space"),
        (["--sandwich-random", "1"], "sandwich_random"),
        (["--selection", "magnitude"], "selection"),
    ):
        assert main(["train-supernet", *common, *other, "--out", str(out), "--resume"]) == 2
        err = capsys.readouterr().err.strip()
        assert f"which used other settings ({changed} differ)" in err and len(err.splitlines()) == 1, err
    assert main(["train-supernet", *common, "--out", str(out), "--resume"]) == 0
    assert not (tmp_path / ".sa.train").exists()
    assert (out / CHANNEL_ORDER_NAME).read_text() == (tmp_path / "ref" / CHANNEL_ORDER_NAME).read_text()
    got, want = load_file(out / "adapter_model.safetensors"), load_file(tmp_path / "ref" / "adapter_model.safetensors")
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-6, rtol=0)
    assert json.loads((out / SUPERNET_RECORD_NAME).read_text())["result"]["steps"] == 3


def test_an_out_inside_the_base_is_refused(tmp_path, tiny_llama, capsys):
    tiny = tiny_llama(lora=False)  # the base then held a folder its files do not account for
    data = corpus(tmp_path / "text.txt", words=500)
    before = sorted(p.name for p in tiny.base.iterdir())
    argv = ["train-supernet", "--base", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--data",
            str(data), "--out", str(tiny.base / "sa"), "--quiet"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "sa is inside the model folder" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tiny.base.iterdir()) == before


def test_a_pruned_checkpoint_as_base_is_refused_in_one_line(tmp_path, heal_inputs, capsys):
    _, pruned, data = heal_inputs  # was transformers' AmbiguousGlobalPerLayerAttributeError traceback
    assert "per_layer_config" in json.loads((pruned / "config.json").read_text())
    argv = ["train-supernet", "--base", str(pruned), "--space", "ffn-grid", "--set", "ffn_step=16", "--data",
            str(data), "--out", str(tmp_path / "sa"), "--quiet"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "is a pruned checkpoint (its layers differ in width)" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "sa").exists()


def test_sigterm_exits_143_and_resume_writes_the_adapter(tmp_path, tiny_llama, sigterm_at_step, capsys):
    """A preempted run exits as SIGTERM ends a process, as heal does (it exited 2, a usage error's status)."""
    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    argv = ["train-supernet", "--base", str(tiny.base), "--data", str(data), "--space", "ffn-grid", "--set",
            "ffn_step=16", "--max-steps", "2", "--save-steps", "1", "--seq-len", "32", "--quiet", "--set",
            "batch_size=2", "--out", str(tmp_path / "sa")]  # fmt: skip
    sigterm_at_step(1)
    capsys.readouterr()
    assert main(argv) == 143
    assert "stopped by SIGTERM after step 1" in capsys.readouterr().err and not (tmp_path / "sa").exists()
    assert main([*argv, "--resume"]) == 0
    assert json.loads((tmp_path / "sa" / SUPERNET_RECORD_NAME).read_text())["token_budget"]["steps"] == 2


def test_sigterm_before_the_first_step_exits_143_and_leaves_no_state(tmp_path, tiny_llama, monkeypatch, capsys):
    """A SIGTERM while the channel orders are computed killed the process outright: no message, and a state folder
    whose leftover orders made the next run ask for --resume."""
    import os
    import signal

    from nsc_prune.hf.train import supernet

    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    orders = supernet.train_orders

    def stopped(*args, **kwargs):
        found = orders(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return found

    monkeypatch.setattr(supernet, "train_orders", stopped)
    argv = ["train-supernet", "--base", str(tiny.base), "--data", str(data), "--space", "ffn-grid", "--set",
            "ffn_step=16", "--max-steps", "1", "--seq-len", "32", "--quiet", "--set", "batch_size=2", "--out",
            str(tmp_path / "sa")]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 143
    assert capsys.readouterr().err.strip() == "nsc-prune: stopped by SIGTERM; nothing was written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]  # no .sa.train
    monkeypatch.setattr(supernet, "train_orders", orders)
    assert main(argv) == 0


@pytest.mark.parametrize("spoilt", ["nan", "overflowing outputs"])
def test_a_nan_in_the_base_is_named_before_training(tmp_path, tiny_llama, capsys, spoilt):
    """It was "training diverged at step 1 ... remove .s.train first", naming a folder that did not exist; finite
    weights whose outputs overflow (an LM-head row of 1e38) were "lower --learning-rate" at step 1."""
    tiny = tiny_llama(lora=False)
    if spoilt == "nan":
        spoil_weight(tiny.base, "model.layers.0.mlp.up_proj.weight")
        said = "model.layers.0.mlp.up_proj.weight holds NaN or inf values"  # said by its calibration, first
    else:
        spoil_weight(tiny.base, "lm_head.weight", 1e38, whole_row=True)
        said = "its loss on the text is nan before any training, its weights finite but its outputs overflow"
    data = corpus(tmp_path / "text.txt", words=500)
    argv = ["train-supernet", "--base", str(tiny.base), "--data", str(data), "--out", str(tmp_path / "sa"), "--quiet",
            "--space", "ffn-grid", "--set", "ffn_step=16", "--max-steps", "1", "--seq-len", "32", "--batch-size", "2"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"{tiny.base}: {said}" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]


def test_activation_orders_on_too_few_training_tokens_are_refused(tmp_path, tiny_llama, capsys):
    """extract and the search refuse fewer than MIN_CALIB_TOKENS calibration tokens; train-supernet ranked the
    channels on 32."""
    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=40)
    argv = ["train-supernet", "--base", str(tiny.base), "--data", str(data), "--space", "ffn-grid", "--set",
            "ffn_step=16", "--max-steps", "1", "--seq-len", "8", "--quiet", "--set", "batch_size=2", "--selection",
            "activation", "--out", str(tmp_path / "sa")]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the training text has only" in err and "at least 64" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]


def test_without_progress_train_supernet_draws_no_bar(tmp_path, tiny_llama, capsys, monkeypatch, transformers_bars_on):
    """SupernetRequest(progress=False) drew every bar but the Trainer's: the training text's, transformers'
    loading bar, the calibration and the held-out loss."""
    import sys

    from nsc_prune.hf.train.supernet import SupernetRequest, train_supernet

    tiny = tiny_llama(lora=False)
    data = corpus(tmp_path / "text.txt", words=500)
    monkeypatch.setattr(type(sys.stderr), "isatty", lambda self: True)  # stderr is capsys's
    settings = {"ffn_step": 16, "batch_size": 2}
    for progress, out in ((True, "shown"), (False, "hidden")):
        capsys.readouterr()
        request = SupernetRequest(tiny.base, "ffn-grid", data, tmp_path / out, settings, max_steps=1, seq_len=32,
                                  selection="magnitude", progress=progress)  # fmt: skip
        train_supernet(request)
        err = capsys.readouterr().err
        assert ("tokenizing" in err) is ("Loading weights" in err) is ("held-out loss" in err) is progress, err
    assert transformers_bars_on.is_progress_bar_enabled()


def test_sandwich_random_is_refused_just_past_the_spaces_architectures():
    from nsc_prune.errors import InvalidInputError
    from nsc_prune.hf.train.subnets import LayerChoices

    layer = LayerChoices((LayerPlan(ffn=8), LayerPlan(ffn=4)), (2, 1))
    assert len(SubnetSampler((layer, layer), n_random=4).plans(0)) == 6  # 2 x 2 architectures
    with pytest.raises(InvalidInputError, match="--sandwich-random must be at most the 4 architectures in the space"):
        SubnetSampler((layer, layer), n_random=5)


def test_each_step_trains_the_subnets_the_sampler_draws_for_it():
    from nsc_prune.hf.train.subnets import subnet_contexts

    class Sampler:
        def __init__(self):
            self.steps = []

        def plans(self, step):
            self.steps.append(step)
            return []

    sampler = Sampler()
    contexts = subnet_contexts(None, sampler, None)
    assert contexts(7) == [] and contexts(8) == [] and sampler.steps == [7, 8]


def test_the_adapter_rank_must_hold_the_spaces_largest_rank():
    from nsc_prune.hf.train.subnets import LayerChoices
    from nsc_prune.hf.train.supernet import _check_rank

    choices = [LayerChoices((LayerPlan(ffn=8, lora_rank=8), LayerPlan(ffn=8, lora_rank=4)), (1, 1))]
    _check_rank(8, choices)
    with pytest.raises(ConfigError, match=r"must be >= 8, the largest rank of the space \(\[4, 8\]\); got 7"):
        _check_rank(7, choices)


def test_a_pareto_samplers_rule_records_how_many_points_it_draws_from():
    """The super-adapter's record says the front's size beside the rule (``sampling.points``)."""
    from nsc_prune.hf.train.subnets import LayerChoices

    layer = LayerChoices((LayerPlan(ffn=8), LayerPlan(ffn=4)), (2, 1))
    points = ((LayerPlan(ffn=4),), (LayerPlan(ffn=8),))
    sampler = SubnetSampler((layer,), n_random=1, seed=3, points=points)
    assert sampler.rule == {"rule": "pareto", "random": 1, "seed": 3, "points": 2}
    assert SubnetSampler((layer,), n_random=1, seed=3).rule == {"rule": "sandwich", "random": 1, "seed": 3}
    assert sampler.largest() == [LayerPlan(ffn=8)] and sampler.smallest() == [LayerPlan(ffn=4)]


def test_a_homogeneous_space_is_refused_for_training(tiny_llama):
    """homogeneous=true ties every layer to one option: the sandwich's random subnets would train none of the
    mixed-width subnets the search later scores; the refusal says to search with it instead."""
    tiny = tiny_llama(lora=False)
    assert len(space_choices(build_space("ffn-grid", tiny.config, ffn_step=16))) == 3
    with pytest.raises(ConfigError, match="homogeneous=true restricts the search, not the subnets train-supernet"):
        space_choices(build_space("ffn-grid", tiny.config, ffn_step=16, homogeneous=True))


def test_a_pruned_checkpoint_whose_layers_differ_only_in_heads_is_refused_as_base(tmp_path, tiny_llama, capsys):
    """Extraction writes ``nsc_per_layer_attention`` alone for a plan of uniform FFN width and per-layer KV heads:
    such a checkpoint as --base is refused in one line, as one with per-layer widths is, before any data is read."""
    import shutil

    from safetensors.torch import load_file, save_file

    from nsc_prune.core.spec import PER_LAYER_HEADS_KEY

    tiny = tiny_llama(gqa=True, lora=False)
    base = tmp_path / "pruned"
    shutil.copytree(tiny.base, base)
    config = json.loads((base / "config.json").read_text())
    config[PER_LAYER_HEADS_KEY] = {"1": {"num_attention_heads": 2, "num_key_value_heads": 1}}
    (base / "config.json").write_text(json.dumps(config))
    cut = {f"model.layers.1.self_attn.{n}.weight": k for n, k in (("q_proj", 32), ("k_proj", 16), ("v_proj", 16))}
    for shard in sorted(base.glob("*.safetensors")):  # layer 1 cut to its first KV group, as extraction writes it
        tensors = load_file(shard)
        for name in tensors:
            if name in cut:
                tensors[name] = tensors[name][: cut[name]]
            elif name == "model.layers.1.self_attn.o_proj.weight":
                tensors[name] = tensors[name][:, :32]
        save_file({k: v.contiguous() for k, v in tensors.items()}, shard, metadata={"format": "pt"})
    (tmp_path / "a.txt").write_text("\n\n".join(" ".join(f"w{3 + (i + k) % 7}" for k in range(30)) for i in range(40)))
    argv = ["train-supernet", "--base", str(base), "--space", "ffn-grid", "--set", "ffn_step=16", "--data",
            str(tmp_path / "a.txt"), "--out", str(tmp_path / "sa"), "--quiet"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "is a pruned checkpoint (its layers differ in width)" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "sa").exists()
