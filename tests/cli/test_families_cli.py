"""The search-only families through the CLI: a search on each new preset runs from its config alone; every
weights command on a tiny saved model of such a family refuses in one line (exit 2), naming the type and what
is missing, and writes nothing."""

import json

import pytest

from nsc_prune.cli import main
from nsc_prune.plan import ParetoDocument
from tests.core.test_spec_families import FAMILIES, FAMILY_PRESETS


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", FAMILY_PRESETS)
def test_search_on_each_family_preset(name, tmp_path, capsys):
    code, _, err = run_cli(
        ["--model", name, "--budget", "85%", "--space", "ffn-heads-depth", "--out", tmp_path / "run", "--no-plot"],
        capsys,
    )
    assert code == 0 and err == "", err
    document = ParetoDocument.read(tmp_path / "run")
    assert document.model_config["_name_or_path"] and document.points[document.selected].params > 0


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Tiny random models of the search-only types (the gemma3 wrapper) saved as safetensors folders, plus a search of each and a text file."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("families")
    (root / "text.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    for name in sorted(MISSING):
        config = transformers.AutoConfig.for_model(**MULTIMODAL.get(name, FAMILIES.get(name)))
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(root / name)
        code = main(
            [
                "--model",
                str(root / name),
                "--budget",
                "99%",
                "--space",
                "ffn-heads",
                "--set",
                "ffn_step=16",
                "--out",
                str(root / f"{name}-run"),
                "--no-plot",
            ]
        )
        assert code == 0
    return root


EXTRACT = "extract --pareto {run}/pareto.json --base {model} --out {out}"
SEARCH = "--model {model} --budget 99% --space ffn-heads --weights {model} --out {out} --score"
COMMANDS = {
    name: command.split()
    for name, command in {
        "extraction": EXTRACT,
        "extraction-padded": f"{EXTRACT} --format padded",
        "extraction-nemotron": f"{EXTRACT} --format nemotron-nas",
        "extraction-gguf": f"{EXTRACT}.gguf --format gguf",
        "--score psi_w": f"{SEARCH} psi_w",
        "--score measured": f"{SEARCH} measured --calib {{root}}/text.txt",
        "healing": "heal {model} --data {root}/text.txt --out {out}",
        "train-supernet": "train-supernet --base {model} --space ffn-grid --data {root}/text.txt --out {out}",
        "profile (--backend transformers)": "profile --model {model} --space ffn-grid --out {out}",
    }.items()
}
MISSING = {"gemma3": "the multimodal wrapper nests its language model under text_config beside a vision tower"}
MULTIMODAL = {  # a tiny Gemma 3 wrapper: the gemma3_text model beside a one-layer vision tower
    "gemma3": {"model_type": "gemma3", "mm_tokens_per_image": 4,
               "text_config": {k: v for k, v in FAMILIES["gemma3_text"].items() if k != "model_type"},
               "vision_config": {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
                                 "num_attention_heads": 2, "image_size": 28, "patch_size": 14}},
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(MISSING))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_weights_commands_refuse_in_one_line_and_write_nothing(saved, family, command, capsys):
    out = saved / f"out-{family}-{command.split()[0].strip('-')}"
    before = sorted(p.name for p in saved.iterdir())
    args = [a.format(run=saved / f"{family}-run", model=saved / family, out=out, root=saved) for a in COMMANDS[command]]
    code, stdout, err = run_cli(args, capsys)
    job = command.split("-")[0] if command.startswith("extraction") else command
    assert code == 2 and stdout == ""
    assert err.startswith(f"nsc-prune: error: {job} of {family} is not supported yet: ") and err.count("\n") == 1
    assert (
        MISSING[family] in err
        and "supported: gemma2, gemma3_text, granite, llama, mistral, olmo2, phi3, qwen2, qwen3, smollm3" in err
    )
    assert sorted(p.name for p in saved.iterdir()) == before  # nothing written


# ------------------------------------------------------------------------------ granite and smollm3: every command

GRANITE = {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.2, "logits_scaling": 4.0}
PLAN = [{"ffn": 96, "kv_groups": 2}, {"ffn": 0, "kv_groups": 0, "keep": False}, {"ffn": 40, "kv_groups": 1},
        {"ffn": 17, "kv_groups": 1}]  # fmt: skip
STEPS = "--seq-len 16 --batch-size 2 --max-steps 1 --quiet"
WEIGHTS_COMMANDS = {  # command -> its arguments; "{run}" is a search's folder, "{plan}" a heterogeneous pareto.json
    "psi_w": f"{SEARCH} psi_w --set ffn_step=32",
    "measured": f"{SEARCH} measured --calib {{root}}/text.txt --set ffn_step=32",
    "extract": "extract --pareto {plan} --base {model} --out {out}",
    "padded": "extract --pareto {plan} --base {model} --out {out} --format padded",
    "train-supernet": f"train-supernet --base {{model}} --space ffn-grid --data {{root}}/text.txt --out {{out}} {STEPS}"
    " --set ffn_step=32",
    "profile": "profile --model {model} --space ffn-heads-depth --set ffn_step=32 --out {out} --quiet --repeats 1 "
    "--stack 2 --prefill-tokens 8 --decode-context 4 --decode-tokens 2",
}
# What the engine of each refused format lacks, as the one line names it.
REFUSED = {
    ("granite", "nemotron-nas"): "vLLM's DeciLM has no embedding, residual and attention multipliers",
    (
        "granite",
        "gguf",
    ): "llama.cpp's granite architecture (src/models/granite.cpp) creates every layer at layer 0's FFN width",
    ("smollm3", "nemotron-nas"): "vLLM's DeciLM has no layers without rotary embedding",
    (
        "smollm3",
        "gguf",
    ): "llama.cpp's smollm3 architecture (src/models/smollm3.cpp) creates every layer at layer 0's FFN width",
    ("phi3", "nemotron-nas"): "vLLM's DeciLM has no partial rotary embedding nor LongRoPE",
    (
        "phi3",
        "gguf",
    ): "llama.cpp's phi3 architecture (src/models/phi3.cpp) is written here with default or linear rope only",
    ("olmo2", "nemotron-nas"): "vLLM's DeciLM has no norms after attention and the MLP nor q/k norms",
    ("olmo2", "gguf"): "llama.cpp's olmo2 architecture (src/models/olmo2.cpp) is written without biases",
    ("gemma2", "nemotron-nas"): "vLLM's DeciLM has no norms after attention and the MLP, attention and logit soft",
    ("gemma2", "gguf"): "llama.cpp's gemma2 architecture (src/models/gemma2.cpp) is written without biases",
    ("gemma3_text", "nemotron-nas"): "vLLM's DeciLM has no norms after attention and the MLP, q/k norms nor scaled",
    ("gemma3_text", "gguf"): "llama.cpp's gemma3 architecture (src/models/gemma3.cpp) is written without biases",
}
FULL = ["granite", "smollm3", "olmo2", "phi3", "gemma2", "gemma3_text"]
GEMMA = {"attention_bias": True, "sliding_window": 4, "query_pre_attn_scalar": 9, "tie_word_embeddings": True}
NO_KV = {"olmo2"}  # keeps every KV group (core.spec.NO_KV_CUTS): its plan and spaces cut FFN and layers only
PHI3_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
             "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 5.0, 8.0],
             "original_max_position_embeddings": 64}  # fmt: skip


@pytest.fixture(scope="module")
def full_support(tmp_path_factory):
    """Tiny random granite (multipliers far from 1) and smollm3 (no RoPE in every other layer) models with a
    tokenizer, a text file and a heterogeneous plan of each (per-layer widths, KV groups, a dropped layer)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from tests.conftest import _write_plan
    from tests.eval.test_evaluate import char_tokenizer

    root = tmp_path_factory.mktemp("supported")
    (root / "text.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    sizes = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 128,
             "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}  # fmt: skip
    quirks = {"granite": GRANITE, "smollm3": {"no_rope_layer_interval": 2}, "olmo2": {"attention_bias": True},
              "phi3": {"rope_parameters": PHI3_ROPE},
              "gemma2": {**GEMMA, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0},
              "gemma3_text": {**GEMMA, "sliding_window_pattern": 2}}  # fmt: skip
    for family, options in quirks.items():
        torch.manual_seed(0)
        config = transformers.AutoConfig.for_model(family, **{**sizes, **options})
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(root / family / "base")
        char_tokenizer().save_pretrained(root / family / "base")
        config = json.loads((root / family / "base" / "config.json").read_text())
        _write_plan(root / family / "plan.json", _plan(family, PLAN), config)
        _write_plan(root / family / "kv-plan.json", PLAN, config)
    return root


def _plan(family, layers):
    return [{**layer, "kv_groups": 2} if family in NO_KV and layer.get("keep", True) else layer for layer in layers]


def _command(family, command, root, out, plan="plan.json"):
    args = WEIGHTS_COMMANDS[command].format(model=root / family / "base", plan=root / family / plan, out=out,
                                            root=root)  # fmt: skip
    return (args.replace("--space ffn-heads ", "--space ffn-grid ") if family in NO_KV else args).split()


@pytest.mark.parametrize("family", FULL)
@pytest.mark.parametrize("command", sorted(WEIGHTS_COMMANDS))
def test_weights_commands_run_on_granite_smollm3_olmo2(full_support, family, command, capsys):
    root, out = full_support, full_support / family / f"out-{command}"
    args = _command(family, command, root, out)
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    assert out.exists()


@pytest.mark.parametrize("family", FULL)
def test_a_pruned_granite_or_smollm3_heals_reloads_and_evaluates(full_support, family, capsys, tmp_path):
    torch = pytest.importorskip("torch")
    from nsc_prune.hf.weights.loading import load_pruned

    root = full_support / family
    pruned, healed = tmp_path / "pruned", tmp_path / "healed"
    assert (
        run_cli(f"extract --pareto {root / 'plan.json'} --base {root / 'base'} --out {pruned}".split(), capsys)[0] == 0
    )
    assert (pruned / "modeling_nsc_llama.py").is_file()  # heterogeneous: the shipped class
    code, _, err = run_cli(
        f"heal {pruned} --data {full_support / 'text.txt'} --out {healed} {STEPS} --warmup-steps 0 --learning-rate 5e-3".split(),
        capsys,
    )
    assert code == 0, err
    before, after = load_pruned(pruned), load_pruned(healed)
    assert type(after).__name__ == type(before).__name__ and after.config.model_type == family
    ids = torch.tensor([[1, 5, 9, 14]])
    with torch.no_grad():
        assert not torch.equal(before(ids).logits, after(ids).logits)  # a step was taken and written
    code, _, err = run_cli(
        [
            "eval",
            str(healed),
            "--tasks",
            "piqa_offline",
            "--limit",
            "2",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "e"),
        ],
        capsys,
    )
    assert code == 0, err
    assert (tmp_path / "e" / "results.json").is_file()


@pytest.mark.parametrize(("family", "format"), sorted(REFUSED))
def test_formats_that_cannot_express_the_family_refuse_in_one_line(full_support, family, format, capsys):
    root = full_support / family
    out = root / f"refused-{format}{'.gguf' if format == 'gguf' else ''}"
    before = sorted(p.name for p in root.iterdir())
    args = f"extract --pareto {root / 'plan.json'} --base {root / 'base'} --out {out} --format {format}".split()
    code, stdout, err = run_cli(args, capsys)
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    assert REFUSED[family, format] in err and "--format pruned" in err
    assert sorted(p.name for p in root.iterdir()) == before  # nothing written


@pytest.mark.parametrize("command", ["psi_w", "measured", "extract", "train-supernet"])
def test_olmo2_kv_group_cuts_refuse_in_one_line(full_support, command, capsys):
    """No exact KV-group cut exists for OLMo 2 (its q/k norms span every head): a space or plan with one is refused
    by every weights job that would score, train or write it, in one line, with nothing written."""
    root, out = full_support, full_support / "olmo2" / f"kv-{command}"
    args = WEIGHTS_COMMANDS[command].replace("--space ffn-grid", "--space ffn-heads")
    args = args.format(model=root / "olmo2" / "base", plan=root / "olmo2" / "kv-plan.json", out=out, root=root).split()
    before = sorted(p.name for p in (root / "olmo2").iterdir())
    code, stdout, err = run_cli(args, capsys)
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    assert "of olmo2 cannot cut KV groups: its q_norm and k_norm normalise" in err and "--space ffn-grid" in err
    assert sorted(p.name for p in (root / "olmo2").iterdir()) == before and not out.exists()
