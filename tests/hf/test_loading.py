"""nsc_prune.hf.weights.loading: tokenizer checks, config parsing, checkpoint shape refusals, kept adapters."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nsc_prune.errors import ConfigError  # noqa: E402
from nsc_prune.hf.weights.loading import (  # noqa: E402
    bos_token_added,
    meta_model,
    parse_config,
    warn_if_mostly_unknown,
)

SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 50}


def _word_level(template: str | None, unk: bool):
    """A word-level ``w1 w2 ...`` tokenizer (BOS w1, EOS w2) whose post-processor is ``template``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {**({"<unk>": 0} if unk else {}), **{f"w{i}": i for i in range(1, 40)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, **({"unk_token": "<unk>"} if unk else {})))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if template:
        specials = [(w, int(w[1:])) for w in ("w1", "w2") if w in template]
        backend.post_processor = processors.TemplateProcessing(single=template, special_tokens=specials)
    extra = {"unk_token": "<unk>"} if unk else {}
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="w1", eos_token="w2", **extra)


@pytest.mark.parametrize("unk", [True, False], ids=["open", "closed"])
def test_a_tokenizer_that_appends_eos_adds_no_bos(unk):
    """A tokenizer ending every text with EOS (and none starting it with BOS) was read as adding its first token as
    BOS when only the lengths were compared: training and calibration would put <unk> (or EOS) before each block."""
    assert bos_token_added(_word_level("$A w2", unk)) is None
    assert bos_token_added(_word_level("w1 $A w2", unk)) == 1


def test_the_unknown_share_warns_past_one_half_only():
    """More than half the ids <unk> warns; half or less, or no text at all, does not (an empty text divided by 0)."""
    tok = type("Tok", (), {"unk_token_id": 0, "unk_token": "<unk>"})()
    with pytest.warns(UserWarning, match=r"60% of the 5 tokens of the text are the tokenizer's unknown token"):
        warn_if_mostly_unknown(tok, [[0, 0, 5], [0, 6]], "the text")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_mostly_unknown(tok, [[0, 0, 5, 6]], "the text")
        warn_if_mostly_unknown(tok, [], "the text")
        warn_if_mostly_unknown(tok, [[]], "the text")


def test_parse_config_leaves_the_callers_config_as_it_was():
    """transformers adds rope_theta into a config's rope_scaling dict in place: the base's config read once
    (``BaseModel.config``) would be changed under every later reader, and written so into the output config.json."""
    scaling = {"rope_type": "linear", "factor": 2.0}
    config = {"model_type": "llama", **SIZES, "rope_theta": 10000.0, "rope_scaling": scaling}
    before = copy.deepcopy(config)
    parse_config(transformers.LlamaConfig, config)
    assert config == before


def test_a_config_transformers_rejects_is_named_by_what_was_being_built():
    """meta_model's ConfigError names the checkpoint (or output config) it was building, not only the field."""
    config = {"model_type": "llama", **SIZES, "rms_norm_eps": "x"}
    with pytest.raises(ConfigError, match=r"^checkpoint /some/where: config\.json does not load in transformers"):
        meta_model(config, True, "checkpoint /some/where")


def test_a_checkpoint_shape_refusal_counts_every_problem_it_does_not_name(tiny_llama, tmp_path):
    """The refusal names the first bad tensor and counts them all: a user fixing one at a time learns how many are
    left (the counts were not checked: a constant 1 passed)."""
    import dataclasses

    from nsc_prune.hf.weights.loading import check_checkpoint_shapes
    from nsc_prune.hf.weights.safetensors_io import index_model_dir

    tiny = tiny_llama(lora=False)
    found = index_model_dir(tiny.base)
    config = json.loads((tiny.base / "config.json").read_text())
    check_checkpoint_shapes(tiny.base, config, found, pruned=True)
    ups = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(2)]
    bent = {**found, **{n: dataclasses.replace(found[n], shape=(8, found[n].shape[1])) for n in ups}}
    with pytest.raises(ConfigError, match=rf"tensor {ups[0]} should be \[96, 64\] .*\(2 mismatching tensor\(s\)\)"):
        check_checkpoint_shapes(tiny.base, config, bent, pruned=True)
    with pytest.raises(ConfigError, match=r"lacks tensor model\.layers\.0\.mlp\.up_proj\.weight .*\(2 missing\)"):
        check_checkpoint_shapes(tiny.base, config, {n: i for n, i in found.items() if n not in ups}, pruned=True)
    stray = {**found, **{f"model.layers.{i}.stray.weight": found[ups[0]] for i in range(3)}}
    with pytest.raises(ConfigError, match=r"holds tensor model\.layers\.0\.stray\.weight .*\(3 extra\)"):
        check_checkpoint_shapes(tiny.base, config, stray, pruned=True)
    check_checkpoint_shapes(tiny.base, config, stray, pruned=False)  # a stock checkpoint may carry tensors of its own


@pytest.fixture
def kept(tmp_path, tiny_llama, write_plan):
    """A --keep-adapter checkpoint of a tiny GQA LLaMA (uneven widths and ranks)."""
    from nsc_prune.hf.extract import ExtractOptions, extract_subnet

    tiny = tiny_llama(gqa=True)
    layers = [{"ffn": 96, "lora_rank": 8}, {"ffn": 40, "lora_rank": 3}, {"ffn": 17, "lora_rank": 0}]
    plan = write_plan(tmp_path / "pareto.json", layers, tiny.config)
    options = ExtractOptions(dtype="float32", keep_adapter=True)
    return extract_subnet(plan, tiny.base, tmp_path / "kept", point=0, adapter=tiny.adapter, options=options)


def test_a_kept_adapter_is_attached_unless_asked_not_to_and_its_weights_must_be_safetensors(kept):
    """``adapter=False`` loads the bare pruned model; a kept adapter/ without adapter_model.safetensors is refused in
    one line (PEFT would fall back to reading a pickle file, or fail in a traceback)."""
    from nsc_prune.errors import InvalidInputError
    from nsc_prune.hf.weights.loading import load_pruned

    peft = pytest.importorskip("peft")
    assert isinstance(load_pruned(kept), peft.PeftModel)
    assert not isinstance(load_pruned(kept, adapter=False), peft.PeftModel)
    (kept / "adapter" / "adapter_model.safetensors").rename(kept / "adapter" / "elsewhere.safetensors")
    with pytest.raises(InvalidInputError, match=r"adapter has no adapter_model\.safetensors; re-run the extraction"):
        load_pruned(kept)
    assert not isinstance(load_pruned(kept, adapter=False), peft.PeftModel)  # the weights alone still load


def test_a_kept_adapter_missing_several_tensors_counts_the_rest(kept):
    """The refusal names one absent LoRA tensor and counts the others."""
    from safetensors.torch import load_file, save_file

    from nsc_prune.hf.weights.loading import load_pruned

    weights = kept / "adapter" / "adapter_model.safetensors"
    tensors = load_file(weights)
    dropped = sorted(name for name in tensors if "lora_B" in name)[:3]
    save_file({k: v for k, v in tensors.items() if k not in dropped}, weights, metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"lacks \S+ \(2 more\); re-run the extraction"):
        load_pruned(kept)


def test_load_pruned_refuses_a_model_type_it_has_no_class_for_naming_the_way(tmp_path, tiny_llama):
    """A folder of another architecture (gpt2) is UnsupportedArchitectureError pointing at AutoModelForCausalLM, not
    a KeyError from the class table reported as a config.json transformers cannot build."""
    import shutil

    from nsc_prune.errors import UnsupportedArchitectureError
    from nsc_prune.hf.weights.loading import load_pruned

    folder = Path(shutil.copytree(tiny_llama(lora=False).base, tmp_path / "gpt2"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(UnsupportedArchitectureError, match=r"for load_pruned.*Load it with transformers\.AutoModel"):
        load_pruned(folder)
