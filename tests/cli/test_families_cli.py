"""The search-only families through the CLI: a search on each new preset runs from its config alone; every
weights command on a tiny saved model of such a family refuses in one line (exit 2), naming the type and what
is missing, and writes nothing."""

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
    """Tiny random gemma2 and phi3 models saved as safetensors folders, plus a search of each and a text file."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("families")
    (root / "text.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    for name in ("gemma2", "phi3"):
        config = transformers.AutoConfig.for_model(**FAMILIES[name])
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
MISSING = {"gemma2": "logit soft-capping need their own modeling", "phi3": "fused qkv_proj and gate_up_proj"}


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
    assert MISSING[family] in err and "supported: granite, llama, mistral, qwen2, qwen3, smollm3" in err
    assert sorted(p.name for p in saved.iterdir()) == before  # nothing written
