"""``--format nemotron-nas`` (issue 14): a checkpoint vLLM's ``DeciLMForCausalLM`` loads, made exact by zero padding.

Tiny random llama (q/k/v/o and MLP biases) and mistral (no sliding window) bases with 8 query heads in 4 KV groups
(GQA 2) and a random LoRA, cut by plans with FFN cuts, KV-group cuts (3 of 4 groups, which pads a zero KV head; 2
of 4, whose real query heads are not a prefix) and a dropped layer. The reference is ``masked_reference`` of
tests/hf/test_extract_heads_depth.py (stock model + unmerged LoRA, dropped units zeroed, dropped layers identities).
vLLM cannot run here, so its width formula is reimplemented below from its definition and compared with the
tensors written.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from test_extract_heads_depth import ATOL, logits, masked_reference
from test_extract_model_types import TinyModel, build_tiny

from nsc_prune.cli import main
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError
from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders
from nsc_prune.hf.export.nemotron_nas import kv_layout
from nsc_prune.hf.extract import ExtractOptions, extract_subnet
from nsc_prune.hf.train.heal import load_teacher
from nsc_prune.hf.weights.base import open_base
from nsc_prune.hf.weights.loading import load_pruned
from nsc_prune.hf.weights.safetensors_io import index_model_dir

pytestmark = pytest.mark.filterwarnings("ignore:base .* has no tokenizer files")

DROP = {"ffn": 0, "kv_groups": 0, "keep": False}
# Layer 0: 3 of 4 KV groups (padded to 4 KV heads, 6 of 8 query heads); layer 1 dropped; layer 2: 2 groups (real
# query heads 0,1 and 4,5); layer 3: 1 group; layer 4: everything. FFN widths cut everywhere but layer 4.
PLAN = [
    {"ffn": 70, "kv_groups": 3},
    DROP,
    {"ffn": 40, "kv_groups": 2},
    {"ffn": 17, "kv_groups": 1},
    {"ffn": 96, "kv_groups": 4},
]
# The bases the format takes, with their config options (mistral without a sliding window; its bias flags build
# nothing in transformers, so the DeciLM config must not carry them over).
FAMILIES = {
    "llama": {"mlp_bias": True, "attention_bias": True},
    "mistral": {"sliding_window": None, "mlp_bias": True, "attention_bias": True},
}


def build(root: Path, family: str, lora: bool = True, **extra) -> TinyModel:
    """A tiny 5-layer base with 8 query heads in 4 KV groups (``extra``: more config options)."""
    options = {**FAMILIES.get(family, {}), **extra}
    return build_tiny(root, family, lora, options=options, num_hidden_layers=5, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=8)  # fmt: skip


@pytest.fixture
def tiny(tmp_path_factory):
    return lambda family, **kwargs: build(tmp_path_factory.mktemp(family), family, **kwargs)


@pytest.fixture
def ids():
    return torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))


def extract(tmp_path, model, layers, write_plan, name="out", selection=None, **options) -> Path:
    plan = write_plan(tmp_path / f"{name}.json", layers, model.config)
    return extract_subnet(
        plan,
        model.base,
        tmp_path / name,
        point=0,
        adapter=model.adapter,
        selection=selection,
        options=ExtractOptions(format="nemotron-nas", dtype="float32", max_shard_size=30_000, **options),
    )


def vllm_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The weight shapes vLLM's DeciLM builds from config.json, from its documented definition: query heads are
    global, KV heads = heads / n_heads_in_group, FFN width = ffn.intermediate_size, or when the block has
    ``ffn_mult``: ``_find_multiple(int(2 * ffn_mult * hidden / 3), 256)``; a no_op part has no weights."""

    def find_multiple(n: int, k: int) -> int:
        return n if n % k == 0 else n + k - n % k

    hidden, heads, dim = config["hidden_size"], config["num_attention_heads"], config["head_dim"]
    shapes = {}
    for i, block in enumerate(config["block_configs"]):
        prefix = f"model.layers.{i}"
        if not block["attention"]["no_op"]:
            kv = heads // block["attention"]["n_heads_in_group"]
            shapes.update(
                {
                    f"{prefix}.self_attn.q_proj.weight": (heads * dim, hidden),
                    f"{prefix}.self_attn.k_proj.weight": (kv * dim, hidden),
                    f"{prefix}.self_attn.v_proj.weight": (kv * dim, hidden),
                    f"{prefix}.self_attn.o_proj.weight": (hidden, heads * dim),
                    f"{prefix}.input_layernorm.weight": (hidden,),
                }
            )
        if not block["ffn"]["no_op"]:
            ffn = block["ffn"]
            width = (
                find_multiple(int(2 * ffn["ffn_mult"] * hidden / 3), 256)
                if "ffn_mult" in ffn
                else ffn["intermediate_size"]
            )
            shapes.update(
                {
                    f"{prefix}.mlp.gate_proj.weight": (width, hidden),
                    f"{prefix}.mlp.up_proj.weight": (width, hidden),
                    f"{prefix}.mlp.down_proj.weight": (hidden, width),
                    f"{prefix}.post_attention_layernorm.weight": (hidden,),
                }
            )
    return shapes


def written_shapes(out: Path) -> dict[str, tuple[int, ...]]:
    return {name: tuple(info.shape) for name, info in index_model_dir(out).items()}


def diff(a, b, ids) -> float:
    return (logits(a, ids) - logits(b, ids)).abs().max().item()


# ------------------------------------------------------------------------------ logits, shapes, padding


@pytest.mark.parametrize("method", ["first", "magnitude"])  # prefixes; gathered index sets
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_nemotron_nas_equals_masked_reference(tmp_path, tiny, write_plan, ids, family, method):
    model = tiny(family)
    out = extract(tmp_path, model, PLAN, write_plan, selection=SelectionConfig(method))
    orders, _ = channel_orders(open_base(model.base), SelectionConfig(method))
    reference = masked_reference(model, PLAN, [(order.ffn, order.kv_groups) for order in orders])
    remote = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32).eval()
    local = load_pruned(out)
    assert type(remote).__name__ == type(local).__name__ == "DeciLMForCausalLM"
    assert type(local).__module__ == "nsc_prune.hf.modeling.modeling_nsc_decilm"  # no remote code
    assert diff(remote, reference, ids) <= ATOL and diff(local, reference, ids) <= ATOL
    local.save_pretrained(tmp_path / "saved")  # neither file its auto_map names was written
    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved", trust_remote_code=True).eval()
    for name in ("modeling_nsc_decilm.py", "configuration_nsc_decilm.py"):
        assert (tmp_path / "saved" / name).read_bytes() == (out / name).read_bytes()
    assert diff(saved, local, ids) == 0.0
    teacher = load_teacher(out, torch.float32)  # heal --teacher: it tried the stock classes (KeyError 'nemotron-nas')
    assert type(teacher).__name__ == "DeciLMForCausalLM" and diff(teacher, local, ids) == 0.0
    # The check can fail: the pruning moves the logits far more than the tolerance.
    assert diff(masked_reference(model, [{"ffn": 96, "kv_groups": 4}] * 5), reference, ids) > 1e-2

    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "nemotron-nas" and config["architectures"] == ["DeciLMForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_nsc_decilm.DeciLMConfig",
        "AutoModelForCausalLM": "modeling_nsc_decilm.DeciLMForCausalLM",
    }
    assert config["num_hidden_layers"] == 5 and config["num_attention_heads"] == 8
    assert config["block_configs"][1] == {"attention": {"no_op": True}, "ffn": {"no_op": True}}
    assert [b["attention"].get("n_heads_in_group") for b in config["block_configs"]] == [2, None, 4, 8, 2]
    assert [b["ffn"].get("intermediate_size") for b in config["block_configs"]] == [70, None, 40, 17, 96]
    # vLLM's formula applied to the written block_configs gives exactly the tensors written (names and shapes).
    weights = {k: v for k, v in written_shapes(out).items() if k.startswith("model.layers.") and k.endswith("weight")}
    assert weights == vllm_shapes(config)
    assert not any(k.startswith("model.layers.1.") for k in written_shapes(out))  # the no_op block has no tensors
    # KV heads: a divisor of the largest in every layer (vLLM's KV-cache pages divide each other).
    kv = [8 // b["attention"]["n_heads_in_group"] for b in config["block_configs"] if not b["attention"]["no_op"]]
    assert kv == [4, 2, 1, 4] and all(max(kv) % k == 0 for k in kv)
    assert (out / "configuration_nsc_decilm.py").is_file() and (out / "modeling_nsc_decilm.py").is_file()
    assert not (out / "modeling_nsc_llama.py").exists()
    generated = local.generate(torch.tensor([[1, 5, 9]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert generated.shape == (1, 7)


def test_padding_is_zero_and_reported(tmp_path, tiny, write_plan, capsys):
    model = tiny("llama", lora=False)
    plan = write_plan(tmp_path / "plan.json", PLAN, model.config)
    out = tmp_path / "out"
    args = [
        "extract",
        "--pareto",
        str(plan),
        "--point",
        "0",
        "--base",
        str(model.base),
        "--out",
        str(out),
        "--format",
        "nemotron-nas",
        "--selection",
        "magnitude",
    ]
    assert main(args) == 0
    stdout = capsys.readouterr().out
    record = json.loads((out / "nsc_prune_extract.json").read_text())
    padding = record["export"]["padding"]
    # Layer 0: 2 zero query heads (q rows + bias, o columns) and 1 zero KV head (k, v rows + biases); layer 2: 4 zero
    # query heads; layer 3: 6. Head dim 8, hidden 64.
    zero_q, zero_kv = 2 + 4 + 6, 1
    assert (padding["zero_query_heads"], padding["zero_kv_heads"]) == (zero_q, zero_kv)
    assert padding["params"] == zero_q * 8 * (64 + 1 + 64) + zero_kv * 2 * 8 * (64 + 1)
    assert padding["linear_macs_per_token"] == zero_q * 8 * 64 * 2 + zero_kv * 2 * 8 * 64
    assert padding["attention_macs_per_token_per_position"] == 2 * 8 * zero_q
    kv_written = sum(shape[0] for name, shape in written_shapes(out).items() if name.endswith("k_proj.weight")) // 8
    assert padding["kv_cache_fraction"] == zero_kv / kv_written
    assert f"nemotron-nas padding: {padding['params']:,} zero params" in stdout
    assert "modeling_nsc_decilm.py" in (out / "README.md").read_text()
    # The padded entries are zeros: count them in the written tensors.
    from safetensors import safe_open

    zeros = 0
    for file in sorted(out.glob("*.safetensors")):
        with safe_open(file, "pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                if ".self_attn." in name:
                    zeros += int((handle.get_tensor(name) == 0).sum())
    assert zeros == padding["params"]
    assert record["params"]["model"] == sum(math.prod(s) for s in written_shapes(out).values())


def test_no_pad_writes_exact_plans_and_refuses_the_rest(tmp_path, tiny, write_plan, capsys):
    model = tiny("llama", lora=False)
    exact = [
        {"ffn": 70, "kv_groups": 4},
        DROP,
        {"ffn": 40, "kv_groups": 4},
        {"ffn": 17, "kv_groups": 4},
        {"ffn": 96, "kv_groups": 4},
    ]
    out = extract(tmp_path, model, exact, write_plan, pad=False)
    assert json.loads((out / "nsc_prune_extract.json").read_text())["export"]["padding"]["params"] == 0
    plan = write_plan(tmp_path / "plan.json", PLAN, model.config)
    capsys.readouterr()
    args = [
        "extract",
        "--pareto",
        str(plan),
        "--point",
        "0",
        "--base",
        str(model.base),
        "--out",
        str(tmp_path / "no"),
        "--format",
        "nemotron-nas",
        "--no-pad",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan layer 0's query heads for --format nemotron-nas --no-pad must be all 8" in err
    assert "drop --no-pad" in err
    assert not (tmp_path / "no").exists()


def test_kv_layout_divides_the_largest():
    assert kv_layout([3, 2, 1, 4], 8) == [4, 2, 1, 4]
    assert kv_layout([3, 1], 8) == [4, 1]
    assert kv_layout([5, 3], 12) == [6, 3]
    assert kv_layout([4, 3], 6) == [6, 3]


# ------------------------------------------------------------------------------ what is refused


@pytest.mark.parametrize(
    "case", ["qwen2", "sliding-mistral", "mistral-default-window", "unknown-format", "keep-adapter"]
)
def test_refused_in_one_line_nothing_written(tmp_path, tiny, write_plan, capsys, case):
    family = {"qwen2": "qwen2", "sliding-mistral": "mistral", "mistral-default-window": "mistral"}.get(case, "llama")
    model = tiny(family, lora=case == "keep-adapter", **({"sliding_window": 4} if case == "sliding-mistral" else {}))
    if case == "mistral-default-window":  # no sliding_window key: MistralConfig attends in 4096 tokens
        config = {k: v for k, v in model.config.items() if k != "sliding_window"}
        (model.base / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    plan = write_plan(tmp_path / "plan.json", PLAN, model.config)
    out = tmp_path / "out"
    args = [
        "extract",
        "--pareto",
        str(plan),
        "--point",
        "0",
        "--base",
        str(model.base),
        "--out",
        str(out),
        "--format",
        "gguf-nope" if case == "unknown-format" else "nemotron-nas",
    ]
    if case == "keep-adapter":
        args += ["--adapter", str(model.adapter), "--keep-adapter"]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    expected = {
        "qwen2": r"the base model_type for --format nemotron-nas must be one of \['llama', 'mistral'\]; got 'qwen2'",
        "sliding-mistral": "sliding_window for --format nemotron-nas must be null",
        "mistral-default-window": "sliding_window for --format nemotron-nas must be null .*; got 4096",
        "unknown-format": "argument --format: invalid choice: 'gguf-nope'",
        "keep-adapter": "--keep-adapter writes nsc-prune's own format",
    }[case]
    assert re.search(expected, err), err
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_a_window_as_long_as_the_context_is_full_attention(tmp_path, tiny, write_plan):
    """sliding_window == max_position_embeddings attends to every position a model can see: DeciLM runs it."""
    model = tiny("mistral", lora=False, sliding_window=128)
    assert model.config["sliding_window"] == model.config["max_position_embeddings"] == 128
    out = extract(tmp_path, model, PLAN, write_plan)
    assert json.loads((out / "config.json").read_text())["model_type"] == "nemotron-nas"


def test_library_errors_are_typed(tmp_path, tiny, write_plan):
    with pytest.raises(UnsupportedArchitectureError):
        extract(tmp_path, tiny("qwen2", lora=False), PLAN, write_plan)
    with pytest.raises(ConfigError, match="--no-pad"):
        extract(tmp_path, tiny("llama", lora=False), PLAN, write_plan, name="b", pad=False)
    for other in ("pruned", "padded", "gguf"):  # they never pad: --no-pad would mean nothing there
        with pytest.raises(InvalidInputError, match="--no-pad"):
            ExtractOptions(format=other, pad=False)


def _tiny_decilm():
    from nsc_prune.hf.modeling.modeling_nsc_decilm import DeciLMConfig, DeciLMForCausalLM

    blocks = [
        {"attention": {"no_op": True}, "ffn": {"no_op": True}},
        {"attention": {"no_op": False, "n_heads_in_group": 2}, "ffn": {"no_op": False, "intermediate_size": 40}},
        {"attention": {"no_op": True}, "ffn": {"no_op": False, "intermediate_size": 24}},
        {"attention": {"no_op": False, "n_heads_in_group": 4}, "ffn": {"no_op": True}},
    ]
    sizes = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4}
    config = DeciLMConfig.from_dict(
        {
            **sizes,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 128,
            "initializer_range": 0.5,
            "block_configs": blocks,
        }
    )
    torch.manual_seed(0)
    return DeciLMForCausalLM(config).eval()


def test_cached_generation_with_layer_0_a_no_op():
    """KV-cache bookkeeping when the first layer has no attention: cached greedy decoding equals uncached."""
    model = _tiny_decilm()
    names = {name for name, _ in model.named_parameters()}
    assert not any(
        n.startswith(("model.layers.0.", "model.layers.2.self_attn", "model.layers.2.input_layernorm")) for n in names
    )
    assert not any(n.startswith(("model.layers.3.mlp", "model.layers.3.post_attention_layernorm")) for n in names)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    cached = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    tokens = ids
    with torch.no_grad():
        for _ in range(6):
            tokens = torch.cat([tokens, model(tokens, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, tokens) and len(set(tokens[0, 5:].tolist())) > 1


@pytest.mark.parametrize("step", [[7], [7, 8, 9]])
def test_a_cached_forward_with_layer_0_a_no_op_continues_at_the_right_position(step):
    """LlamaModel counts a cache's tokens in layer 0's cache, which a no-op attention never filled: a cached step
    without positions restarted at position 0 (logits 9.4 off), and a step of several tokens got a mask as if
    nothing came before (16 off)."""
    model = _tiny_decilm()
    ids, step = torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([step])
    with torch.no_grad():
        full = model(torch.cat([ids, step], dim=1), use_cache=False).logits[:, -step.shape[1] :]
        prefix = model(ids, use_cache=True)
        cached = model(step, cache=prefix.cache, use_cache=True).logits
    assert (cached - full).abs().max().item() < 1e-4


def test_a_static_cache_set_up_before_the_first_step_generates_as_uncached():
    """generate(cache_implementation="static", prefill_chunk_size=...) sets every layer's cache up from the global KV
    heads: a no-op layer's placeholder and a layer of other heads failed their first write (index_copy_)."""
    model = _tiny_decilm()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    settings = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    chunked = model.generate(ids, cache_implementation="static", prefill_chunk_size=3, **settings)
    assert torch.equal(chunked, model.generate(ids, use_cache=False, **settings))


def test_a_left_padded_batch_generates_what_each_row_generates_alone_with_layer_0_a_no_op():
    """The padded row attended to its padding (the mask was sized from layer 0's empty cache): other tokens."""
    model = _tiny_decilm()
    batch, mask = torch.tensor([[0, 0, 1, 2, 3], [4, 5, 6, 7, 8]]), torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    generated = model.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    for row, keep, new in zip(batch, mask, generated[:, -5:]):
        alone = model.generate(row[keep.bool()][None], max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(new, alone[0, -5:])


def test_device_map_auto_keeps_each_decoder_layer_whole():
    """``--device-map auto`` over several GPUs: the modules that must not be split are the model's own layers
    (the stock LLaMA's name matches none of them, and transformers' balancing then fails on an empty set)."""
    from transformers.integrations.accelerate import get_balanced_memory

    model = _tiny_decilm()
    layers = {type(m).__name__ for m in model.model.layers}
    assert layers == {"DeciLMDecoderLayer"} and layers <= set(model._no_split_modules)
    gpus = {0: 10**6, 1: 10**6}  # two GPUs' budgets: the balancing runs as on a machine that has them
    assert set(get_balanced_memory(model, gpus, no_split_module_classes=model._no_split_modules)) >= {0, 1}
