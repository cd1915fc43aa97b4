"""``extract --format gguf`` for the families llama.cpp has its own architecture for (nsc_prune.hf.export.gguf_native).

Each family is a tiny random model of tests/hf/test_extract_model_types.py (4 layers, GQA 4:2, head_dim 16, random
norms) with its quirks on and a byte-level BPE tokenizer: Granite's multipliers far from 1, SmolLM3 without RoPE
in every 4th layer, OLMo 2's post norms and q/k norms, Gemma 2's soft-caps and alternating 4-token sliding
windows, Gemma 3's q/k norms and local RoPE base, Phi-3's partial rotary and fused projections. A homogeneous
plan (one FFN width, one KV-group count where the architecture can cut heads, a dropped layer) is written and
read back with ``gguf.GGUFReader``: the architecture, the keys, and every tensor equal to the pruned HF
checkpoint's (q/k rows un-permuted for llama-style rope, Gemma's norms minus the stored 1). A heterogeneous plan
(and SmolLM3 layers whose RoPE pattern llama.cpp cannot express) is refused in one line, exit 2, nothing
written. Marked ``llamacpp``: llama.cpp loads each file and its logits match the pruned HF model's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("peft")

from safetensors.torch import load_file  # noqa: E402
from test_export_gguf import VOCAB, _bpe_tokenizer  # noqa: E402
from test_extract_model_types import GRANITE, TinyModel, build_tiny  # noqa: E402
from test_extract_phi3 import build_phi3  # noqa: E402

from nsc_prune.cli import main  # noqa: E402
from nsc_prune.hf.export.gguf_file import unpermute_rows  # noqa: E402
from nsc_prune.hf.export.gguf_native import ARCHS  # noqa: E402
from nsc_prune.hf.extract import ExtractOptions, extract_subnet  # noqa: E402

GEMMA = {"sliding_window": 4, "query_pre_attn_scalar": 16, "pad_token_id": 0, "tie_word_embeddings": True}
OPTIONS = {  # quirks on, no biases (llama.cpp's architectures are written without them)
    "granite": {**GRANITE},
    "smollm3": {"no_rope_layer_interval": 4, "pad_token_id": 0},
    "olmo2": {},
    "gemma2": {**GEMMA, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0},
    "gemma3_text": {**GEMMA, "sliding_window_pattern": 2, "rope_local_base_freq": 100.0},
}
PHI3_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}  # built by build_phi3
ARCH = {"granite": "granite", "smollm3": "smollm3", "olmo2": "olmo2", "gemma2": "gemma2", "gemma3_text": "gemma3",
        "phi3": "phi3"}  # fmt: skip
DROP = {"ffn": 0, "kv_groups": 0, "keep": False}
CUT = {"ffn": 64, "kv_groups": 1}
WHOLE_HEADS = {"ffn": 64, "kv_groups": 2}  # phi3 and olmo2 size the queries by the hidden size: no head cut
PLANS = {
    "granite": [CUT, DROP, CUT, CUT],
    "gemma2": [CUT, DROP, CUT, CUT],  # sliding, (global), sliding, global -> [True, True, False]
    "gemma3_text": [CUT, DROP, CUT, CUT],
    "smollm3": [CUT, CUT, CUT, DROP],  # RoPE in layers 0-2, none in 3: dropping 3 keeps llama.cpp's rule
    "olmo2": [WHOLE_HEADS, DROP, WHOLE_HEADS, WHOLE_HEADS],
    "phi3": [WHOLE_HEADS, DROP, WHOLE_HEADS, WHOLE_HEADS],
}
PERMUTED = ("granite", "smollm3")
GEMMAS = ("gemma2", "gemma3_text")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> its tiny model (+ LoRA) with a byte-level BPE tokenizer, built once."""
    cache = {}

    def get(family):
        if family not in cache:
            root = tmp_path_factory.mktemp(family)
            if family == "phi3":  # no LoRA: the fused projections' LoRA is tests/hf/test_extract_phi3.py's
                base = build_phi3(root, PHI3_ROPE, vocab_size=VOCAB)
                model = TinyModel(base, None, json.loads((base / "config.json").read_text()))
            else:
                model = build_tiny(root, family, options=OPTIONS[family], vocab_size=VOCAB)
            _bpe_tokenizer(model.base)
            cache[family] = model
        return cache[family]

    return get


def _export(tmp_path, model, layers, write_plan, name="model.gguf", fmt="gguf"):
    plan = write_plan(tmp_path / "pareto.json", layers, model.config)
    options = ExtractOptions(format="gguf", outtype="f32") if fmt == "gguf" else ExtractOptions(dtype="float32")
    return extract_subnet(plan, model.base, tmp_path / name, point=0, adapter=model.adapter, options=options)


def _field(reader, key):
    field = reader.get_field(key)
    assert field is not None, key
    return field.contents()


def _keys(family, arch):
    expected = {
        "general.architecture": arch,
        f"{arch}.block_count": 3,
        f"{arch}.feed_forward_length": 64,
        f"{arch}.attention.head_count": 2 if family not in ("olmo2", "phi3") else 4,
        f"{arch}.attention.head_count_kv": 1 if family not in ("olmo2", "phi3") else 2,
        f"{arch}.attention.key_length": 16,
        f"{arch}.rope.dimension_count": 12 if family == "phi3" else 16,
    }
    if family == "granite":
        expected |= {f"{arch}.logit_scale": 4.0, f"{arch}.residual_scale": 0.5, f"{arch}.embedding_scale": 3.0}
        expected[f"{arch}.attention.scale"] = pytest.approx(0.2)
    if family in GEMMAS:
        expected |= {f"{arch}.attention.sliding_window": 4}
        expected[f"{arch}.attention.sliding_window_pattern"] = [True, True, False]
    if family == "gemma2":
        expected |= {f"{arch}.attn_logit_softcapping": 2.0, f"{arch}.final_logit_softcapping": 3.0}
    if family == "gemma3_text":
        expected[f"{arch}.rope.freq_base_swa"] = 100.0
    return expected


@pytest.mark.parametrize("family", sorted(PLANS))
def test_homogeneous_plan_reads_back_equal_to_the_pruned_checkpoint(family, tmp_path, models, write_plan):
    model = models(family)
    out = _export(tmp_path, model, PLANS[family], write_plan)
    ckpt = _export(tmp_path, model, PLANS[family], write_plan, name="ckpt", fmt="pruned")
    hf = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        hf |= load_file(shard)
    reader = gguf.GGUFReader(out)
    arch = ARCH[family]
    for key, value in _keys(family, arch).items():
        assert _field(reader, key) == value, key
    names = gguf.get_tensor_name_map(ARCHS[family], 3)
    gguf_to_hf = {names.get_name(k, try_suffixes=(".weight",)): k for k in hf}
    tied = model.config.get("tie_word_embeddings", False)
    seen = set()
    for tensor in reader.tensors:
        hf_name = gguf_to_hf[tensor.name]
        value = torch.from_numpy(tensor.data.copy())
        stored = value.clone()
        if family in PERMUTED and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            value = unpermute_rows(value, value.shape[0] // 16)
            assert not torch.equal(value, stored)  # the permutation did something
        if family in GEMMAS and hf_name.endswith("norm.weight"):
            value = value - 1.0  # stored as llama.cpp multiplies: 1 + w
        assert value.shape == hf[hf_name].shape, tensor.name
        torch.testing.assert_close(value, hf[hf_name], rtol=0, atol=1e-6, msg=tensor.name)
        seen.add(hf_name)
    assert seen == set(hf) - ({"lm_head.weight"} if tied else set())
    assert json.loads(_field(reader, "nsc_prune.extract"))["format"]["architecture"] == arch


HETEROGENEOUS = {family: [*layers[:2], {**layers[2], "ffn": 32}, layers[3]] for family, layers in PLANS.items()}
REFUSED = {
    family: r"the plan for --format gguf of \w+ must be homogeneous .*; got 'FFN widths \[32, 64\]" for family in PLANS
}
HETEROGENEOUS["phi3-heads"] = [CUT, DROP, CUT, CUT]
REFUSED["phi3-heads"] = r"KV groups .* must be all 2 kept; got 1\. llama.cpp's phi3 architecture .* attn_qkv"
HETEROGENEOUS["smollm3-rope"] = PLANS["granite"]  # base layer 3 (no RoPE) becomes layer 2: llama.cpp ropes it
REFUSED["smollm3-rope"] = r"no_rope_layers .* must be \[1, 1, 1\] .*; got \[1, 1, 0\]\. llama.cpp's smollm3"


@pytest.mark.parametrize("copy", [True, False])
def test_a_tied_gemma_that_stores_a_head_is_written_only_when_the_head_is_its_embedding(
    copy, tmp_path, write_plan, capsys
):
    """llama.cpp's gemma2 always reads the embedding as its head: a stored copy of it is left out, a stored head
    that differs (which transformers 5 runs untied) is refused in words, not as a tensor llama.cpp lacks."""
    from safetensors.torch import load_file, save_file

    model = build_tiny(tmp_path / "m", "gemma2", lora=False, max_shard_size="10MB", options=OPTIONS["gemma2"],
                       vocab_size=VOCAB)  # fmt: skip
    _bpe_tokenizer(model.base)
    tensors = load_file(model.base / "model.safetensors")
    embedding = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = embedding.clone() if copy else embedding.flip(0).contiguous()
    save_file(tensors, model.base / "model.safetensors", metadata={"format": "pt"})
    plan = write_plan(tmp_path / "pareto.json", PLANS["gemma2"], model.config)
    argv = ["extract", "--pareto", plan, "--base", model.base, "--out", tmp_path / "m.gguf", "--format", "gguf"]
    capsys.readouterr()
    assert main([str(a) for a in argv]) == (0 if copy else 2)
    err = capsys.readouterr().err
    said = "lm_head.weight for --format gguf must be the input embedding (tied); got 'another matrix'"
    assert (tmp_path / "m.gguf").exists() is copy and (said in err) is not copy, err


@pytest.mark.parametrize("case", sorted(HETEROGENEOUS))
def test_inexpressible_plans_are_refused_in_one_line(case, tmp_path, models, write_plan, capsys):
    model = models(case.split("-")[0])
    plan = write_plan(tmp_path / "pareto.json", HETEROGENEOUS[case], model.config)
    argv = ["extract", "--pareto", plan, "--base", model.base, "--out", tmp_path / "m.gguf", "--format", "gguf"]
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and re.search(REFUSED[case], err), err
    assert "llama.cpp's" in err and "src/models/" in err
    assert ("--set kv_heads=false" if case == "phi3-heads" else "--set homogeneous=true") in err or "rope" in case
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pareto.json"]


REFUSED_CONFIGS = {  # a config llama.cpp's architecture would run otherwise than transformers does
    **{
        f"gemma3-{key}": ("gemma3_text", {key: 3.0}, rf"{key} of .* must be null; got 3\.0")
        for key in ("attn_logit_softcapping", "final_logit_softcapping")
    },
    "gemma2-attn-cap-null": ("gemma2", {"attn_logit_softcapping": None}, r"softcapping.* must be set; got None"),
    "gemma2-final-cap-null": ("gemma2", {"final_logit_softcapping": None}, r"softcapping.* must be set; got None"),
    "olmo2-tied": ("olmo2", {"tie_word_embeddings": True}, r"tie_word_embeddings of .* must be false; got True"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_CONFIGS))
def test_configs_llama_cpp_would_run_otherwise_are_refused_in_one_line(case, tmp_path, write_plan, capsys):
    """llama.cpp's gemma3 graph with a sliding window (every file nsc-prune writes) applies no soft-cap: the final
    one was written and ignored there, so the file's logits were not the model's. Its gemma2 soft-caps always (at
    defaults of its own where the file says nothing), and its olmo2 reads an output tensor a tied model does not
    store."""
    family, changes, said = REFUSED_CONFIGS[case]
    model = build_tiny(tmp_path / "m", family, lora=False, options={**OPTIONS[family], **changes}, vocab_size=VOCAB)
    assert all(model.config.get(key) == value for key, value in changes.items())
    _bpe_tokenizer(model.base)
    plan = write_plan(tmp_path / "pareto.json", PLANS[family], model.config)
    argv = ["extract", "--pareto", plan, "--base", model.base, "--out", tmp_path / "m.gguf", "--format", "gguf"]
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and re.search(said, err), err
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(("model_type", "layers_27b"), [("gemma2", 46), ("gemma3_text", 62)])
def test_gemma_attention_scale_is_hidden_over_heads_only_at_the_27b_depth(model_type, layers_27b):
    """llama.cpp's Gemma scale: 1/sqrt(head_dim), but 1/sqrt(hidden / heads) for a model of the 27B's depth."""
    from types import SimpleNamespace

    from nsc_prune.core.layer_plan import LayerPlan
    from nsc_prune.hf.export.gguf_native import _gemma_scale

    config = {"model_type": model_type, "hidden_size": 4608}
    base = SimpleNamespace(head_dim=128, kv_heads=[16] * 64, group_size=2)  # 32 query heads: 4608 / 32 = 144
    for kept in (layers_27b - 1, layers_27b, layers_27b + 1):
        plans = [LayerPlan(ffn=8, kv_groups=16)] * kept + [LayerPlan(ffn=0, keep=False)] * (64 - kept)
        expected = 144**-0.5 if kept == layers_27b else 128**-0.5
        assert _gemma_scale(config, plans, base) == pytest.approx(expected, rel=1e-12), kept


@pytest.mark.parametrize("family", ["gemma2", "granite"])
def test_a_homogeneous_search_is_written_as_the_familys_architecture(family, tmp_path, models, capsys):
    """``--set homogeneous=true`` on the tiny model's folder, then ``extract --format gguf`` of the selected point."""
    model = models(family)
    search = ["--model", model.base, "--space", "ffn-heads-depth", "--budget", "60%", "--set", "homogeneous=true",
              "--set", "ffn_step=32", "--out", tmp_path / "search", "--no-plot"]  # fmt: skip
    assert main([str(a) for a in search]) == 0
    doc = json.loads((tmp_path / "search" / "pareto.json").read_text())
    kept = [layer for layer in doc["points"][doc["selected"]]["layers"] if layer.get("keep", True)]
    (shape,) = {(layer["ffn"], layer["kv_groups"]) for layer in kept}
    assert len(kept) < 4 or shape != (96, 2)  # a cut model
    out = tmp_path / "m.gguf"
    extract = ["extract", "--pareto", tmp_path / "search", "--base", model.base, "--out", out, "--format", "gguf",
               "--outtype", "f32", "--selection", "first", "--quiet"]  # fmt: skip
    assert main([str(a) for a in extract]) == 0, capsys.readouterr().err
    reader = gguf.GGUFReader(out)
    arch = ARCH[family]
    assert _field(reader, "general.architecture") == arch
    assert _field(reader, f"{arch}.block_count") == len(kept)
    assert _field(reader, f"{arch}.feed_forward_length") == shape[0]
    assert _field(reader, f"{arch}.attention.head_count_kv") == shape[1]


# family -> (config.json keys left out, the GGUF keys holding what the transformers config class fills for them)
LEFT_OUT = {
    "gemma2": (
        ("layer_types", "rope_parameters", "rms_norm_eps", "sliding_window"),
        {"gemma2.attention.sliding_window_pattern": [True, False, True, False], "gemma2.rope.freq_base": 10000.0,
         "gemma2.attention.layer_norm_rms_epsilon": 1e-6, "gemma2.attention.sliding_window": 4096},
    ),
    "gemma3_text": (
        ("layer_types", "rope_parameters", "sliding_window_pattern"),
        {"gemma3.attention.sliding_window_pattern": [True, True, True, True], "gemma3.rope.freq_base": 1e6,
         "gemma3.rope.freq_base_swa": 10000.0},
    ),
    "granite": (
        ("logits_scaling", "residual_multiplier", "embedding_multiplier", "attention_multiplier"),
        {"granite.logit_scale": 1.0, "granite.residual_scale": 1.0, "granite.embedding_scale": 1.0,
         "granite.attention.scale": 1.0},
    ),
    "smollm3": (("rope_parameters",), {"smollm3.rope.freq_base": 2e6}),
    "olmo2": (("rms_norm_eps",), {"olmo2.attention.layer_norm_rms_epsilon": 1e-5}),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(LEFT_OUT))
def test_fields_a_config_leaves_out_are_written_as_transformers_fills_them(family, tmp_path, write_plan):
    """Gemma 2 without layer_types and every layer kept was a KeyError; Granite without a multiplier too; a missing
    rope_theta was written as 10000 where transformers runs Gemma 3 at 1e6 and SmolLM3 at 2e6."""
    options = {key: value for key, value in OPTIONS[family].items() if key not in ("rope_local_base_freq",)}
    model = build_tiny(tmp_path / "m", family, lora=False, options=options, vocab_size=VOCAB)
    _bpe_tokenizer(model.base)
    left_out, expected = LEFT_OUT[family]
    config = {key: value for key, value in model.config.items() if key not in left_out}
    (model.base / "config.json").write_text(json.dumps(config))
    layers = [WHOLE_HEADS] * 4 if family == "olmo2" else [CUT] * 4
    reader = gguf.GGUFReader(_export(tmp_path, dataclasses.replace(model, config=config), layers, write_plan))
    for key, value in expected.items():
        assert _field(reader, key) == pytest.approx(value), key


# ---------------------------------------------------------------------------------------------- llama.cpp


@pytest.mark.llamacpp
@pytest.mark.parametrize("family", sorted(PLANS))
def test_llamacpp_logits_match_the_pruned_model(family, tmp_path, models, write_plan):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not installed: pip install llama-cpp-python (builds llama.cpp, 10-20 min)")
    import llama_cpp

    from nsc_prune.hf.weights.loading import load_pruned

    model = models(family)
    out = _export(tmp_path, model, PLANS[family], write_plan)
    ckpt = _export(tmp_path, model, PLANS[family], write_plan, name="ckpt", fmt="pruned")
    ids = torch.randint(3, VOCAB, (10,), generator=torch.Generator().manual_seed(1)).tolist()  # > the 4-token window
    with torch.no_grad():
        expected = load_pruned(ckpt, dtype=torch.float32)(torch.tensor([ids])).logits[0].numpy()
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    llm.eval(ids)
    got = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    # The llama test's bound (0.25; llama.cpp keeps an f16 KV cache), on every position of the sequence.
    assert np.abs(got - expected).max() < 0.25, np.abs(got - expected).max()
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.8


def test_cut_heads_that_do_not_divide_the_width_are_the_headers_heads(tmp_path, write_plan):
    """6 of 8 query heads at width 64: the pruned config keeps the base's global heads (Gemma2Config refuses 64 % 6)
    and gives the cut ones per layer; the header said the global 8 / 4 over tensors of 6 / 3."""
    options = {**OPTIONS["gemma2"], "query_pre_attn_scalar": 8}
    model = build_tiny(tmp_path / "m", "gemma2", options=options, vocab_size=VOCAB,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=8)  # fmt: skip
    _bpe_tokenizer(model.base)
    layers = [{"ffn": 64, "kv_groups": 3}, DROP, {"ffn": 64, "kv_groups": 3}, {"ffn": 64, "kv_groups": 3}]
    ckpt = _export(tmp_path, model, layers, write_plan, name="ckpt", fmt="pruned")
    assert json.loads((ckpt / "config.json").read_text())["num_attention_heads"] == 8  # the base's, kept global
    reader = gguf.GGUFReader(_export(tmp_path, model, layers, write_plan))
    assert _field(reader, "gemma2.attention.head_count") == 6 and _field(reader, "gemma2.attention.head_count_kv") == 3
    shapes = {tensor.name: tuple(int(n) for n in tensor.shape) for tensor in reader.tensors}
    assert shapes["blk.0.attn_q.weight"] == (64, 48) and shapes["blk.0.attn_k.weight"] == (64, 24)
