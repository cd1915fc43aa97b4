"""``nsc-prune --model M --budget B``: output, pareto.json schema, bad input (exit 2, no files)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nsc_prune.cli import main
from nsc_prune.cli.parser import parse_overrides
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.plan import ParetoDocument
from nsc_prune.presets import PRESETS_DIR


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_llama_7b_search_writes_front(tmp_path, capsys):
    code, out, err = run_cli(
        ["--model", "llama-7b", "--budget", "5.7B", "--out", str(tmp_path / "run"), "--no-plot"], capsys
    )
    assert code == 0 and err == ""
    assert "plan: 2 x (ffn 9632, r 32) [layers 0-1] + 30 x (ffn 8256, r 32) [layers 2-31]" in out
    doc = ParetoDocument.read(tmp_path / "run").to_dict()
    assert len(doc["points"]) == 129 and doc["selected"] == 66
    point = doc["points"][doc["selected"]]
    assert point["params"] <= 5_700_000_000 < doc["points"][doc["selected"] + 1]["params"]
    assert set(point) == {"params", "macs", "nsc", "layers"} and point["layers"][0] == {"ffn": 9632, "lora_rank": 32}
    assert doc["cost"]["kind"] == "params" and doc["model"]["config"]["hidden_size"] == 4096
    assert doc["provenance"]["nsc_prune_version"] and "--budget 5.7B" in doc["provenance"]["command"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["pareto.json"]


def test_a_space_past_a_floats_range_is_counted(tmp_path, capsys):
    """10 options in each of 310 layers (lonas): 1e+310 plans, past a float; counting them failed after the write."""
    config = json.loads((PRESETS_DIR / "smollm2-135m.json").read_text())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 310}))
    code, out, err = run_cli(
        ["--model", str(tmp_path / "m"), "--budget", "90%", "--out", str(tmp_path / "o"), "--no-plot"], capsys
    )
    assert code == 0, err
    assert "(1e+310 architectures)" in out.splitlines()[0] and (tmp_path / "o" / "pareto.json").is_file()


def test_json_to_stdout_and_macs_budget(tmp_path, capsys):
    code, out, _ = run_cli(
        ["--model", "llama-7b", "--budget", "1.4T", "--cost", "macs", "--json", "--out", str(tmp_path)], capsys
    )
    doc = json.loads(out)
    chosen = doc["points"][doc["selected"]]
    assert code == 0 and chosen["macs"] <= 1.4e12 and doc["cost"]["seq_len"] == 256
    assert all(a["macs"] < b["macs"] for a, b in zip(doc["points"], doc["points"][1:]))


def test_a_macs_budget_prints_the_share_of_the_full_model_s_macs(tmp_path, capsys):
    """``--budget 70% --cost macs`` printed only the params' share (70.4 %), not the MACs' the budget is of."""
    code, out, _ = run_cli(["--model", "llama-7b", "--budget", "70%", "--cost", "macs", "--out", str(tmp_path)], capsys)
    doc = json.loads((tmp_path / "pareto.json").read_text())
    chosen, full = doc["points"][doc["selected"]], doc["points"][-1]
    share = re.search(r"MACs [\d.]+T \(([\d.]+)% of ([\d.]+)T\) @ 256 tokens", out)
    assert code == 0 and float(share[1]) == round(100 * chosen["macs"] / full["macs"], 1) <= 70.0
    assert float(share[2]) == round(full["macs"] / 1e12, 3)


def test_percent_budget_and_above_full_model(tmp_path, capsys):
    code, out, err = run_cli(["--model", "smollm2-135m", "--budget", "80%", "--out", str(tmp_path / "a")], capsys)
    assert code == 0 and "point" in out
    code, out, err = run_cli(["--model", "smollm2-135m", "--budget", "10B", "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and "--allow-above-full" in err and not (tmp_path / "b").exists()
    code, out, err = run_cli(
        ["--model", "smollm2-135m", "--budget", "10B", "--allow-above-full", "--out", str(tmp_path / "b")], capsys
    )
    assert code == 0 and err.startswith("nsc-prune: warning: ") and "returning the full model" in err
    doc = ParetoDocument.read(tmp_path / "b").to_dict()
    assert doc["selected"] == len(doc["points"]) - 1 and doc["budget"]["above_full_model"] is True
    code, out, err = run_cli(["--model", "smollm2-135m", "--budget", "100%", "--out", str(tmp_path / "c")], capsys)
    doc = ParetoDocument.read(tmp_path / "c").to_dict()
    assert (
        code == 0
        and err == ""
        and doc["selected"] == len(doc["points"]) - 1
        and doc["budget"]["above_full_model"] is False
    )


@pytest.mark.parametrize(
    "budget, resolved",
    [
        ("5.7B", 5_700_000_000),
        ("5700M", 5_700_000_000),
        (".006T", 6_000_000_000),
        ("5.G", 5_000_000_000),
        ("5.7e9", None),
        (" 6.1 b ", 6_100_000_000),
        ("9007199254740993", 2**53 + 1),  # a MAC count past float64's integers keeps its last digit (it lost it)
        ("\u0661\u0662\u0663", None),  # digits of another script were read as 123
    ],
)
def test_budget_spellings(budget, resolved):
    from nsc_prune.core.budget import parse_budget
    from nsc_prune.errors import InvalidInputError

    if resolved is None:
        with pytest.raises(InvalidInputError, match="cannot read budget"):
            parse_budget(budget)
    else:
        assert parse_budget(budget) == resolved


def test_a_fractional_budget_rounds_down_so_no_plan_above_it_is_chosen():
    """Rounded to nearest, 62.65% of 400 (250.6) allowed a plan of 251 and 15.9646ms one of 15,965 us."""
    from nsc_prune.core.budget import parse_budget

    assert parse_budget("62.65%", full=400) == 250 and parse_budget("250.6") == 250
    assert parse_budget("15.9646ms", kind="latency") == 15964


def test_plot_is_written_with_out(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code, out, _ = run_cli(["--model", "smollm2-135m", "--budget", "90%", "--out", str(tmp_path)], capsys)
    assert code == 0 and (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"and {tmp_path / 'pareto.png'}" in out


def test_a_pareto_png_of_yours_is_kept_and_a_folder_of_that_name_refused(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    argv = ["--model", "smollm2-135m", "--budget", "90%", "--out", str(tmp_path)]
    (tmp_path / "pareto.png").write_text("mine")  # was replaced without --overwrite: only pareto.json was checked
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and "output file" in err and "pareto.png already exists; pass --overwrite" in err
    assert run_cli([*argv, "--no-plot"], capsys)[0] == 0 and (tmp_path / "pareto.png").read_text() == "mine"
    (tmp_path / "pareto.json").unlink()
    (tmp_path / "pareto.png").unlink()
    (tmp_path / "pareto.png").mkdir()  # was refused only after pareto.json had been written
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and "holds a folder named pareto.png" in err and not (tmp_path / "pareto.json").exists()


def test_an_unknown_set_key_is_refused(capsys):
    """--set bogus=null was accepted: a None override is dropped, and it was dropped before the check (the CLI now
    refuses a setting without a value first; the library's keyword is still checked before it is dropped)."""
    from nsc_prune.spaces.registry import build_space

    code, _, err = run_cli(["--model", "llama-7b", "--budget", "5.7B", "--set", "bogus=1", "--json"], capsys)
    assert code == 2 and "has no setting bogus" in err
    with pytest.raises(ConfigError, match="has no setting bogus"):
        build_space("autoformer-tiny", bogus=None)


def test_json_without_out_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["--model", "smollm2-135m", "--budget", "90%", "--json"], capsys)
    assert code == 0 and json.loads(out)["selected"] >= 0 and list(tmp_path.iterdir()) == []


def test_plot_with_json_and_no_out_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --plot was ignored
    code, out, err = run_cli(["--model", "smollm2-135m", "--budget", "90%", "--json", "--plot"], capsys)
    assert code == 2 and out == "" and "writes pareto.png only into --out" in err and list(tmp_path.iterdir()) == []
    code, out, err = run_cli(["--model", "smollm2-135m", "--budget", "90%", "--json", "--overwrite"], capsys)
    assert code == 2 and out == "" and "--overwrite with --json would be ignored" in err  # exit 0, nothing written


def test_set_init_is_honoured(tmp_path, capsys):
    code, out, _ = run_cli(["--space", "txl-wt103", "--budget", "40.32M", "--set", "init=xavier", "--json"], capsys)
    assert code == 0 and json.loads(out)["space"]["init"] == "xavier"


def test_a_number_in_exponent_form_is_read_as_one_by_set_and_a_space_file(tmp_path, capsys):
    """YAML 1.1 reads 1e-3 (no dot) as text: --set init=1e-3 was refused while --init 1e-3 ran."""
    runs = [["--set", "init=1e-3"], ["--init", "1e-3"], ["--set", "init=1.0e-3"]]
    (tmp_path / "s.yaml").write_text("kind: elastic\ninit: 1e-3\nffn_step: 64\n")
    fronts = []
    for extra in runs:
        code, out, err = run_cli(["--model", "smollm2-135m", "--space", "ffn-grid", "--set", "ffn_step=64",
                                  "--budget", "90%", "--json", *extra], capsys)  # fmt: skip
        assert code == 0, err
        fronts.append(json.loads(out)["points"])
    code, out, err = run_cli(["--model", "smollm2-135m", "--space", str(tmp_path / "s.yaml"), "--budget", "90%",
                              "--json"], capsys)  # fmt: skip
    assert code == 0 and json.loads(out)["space"]["init"] == 0.001, err
    assert fronts[0] == fronts[1] == fronts[2] == json.loads(out)["points"]
    assert parse_overrides(["a=1e-3", "b=-2E+5", "c=1e", "d=[1, 1e-1]"]) == {
        "a": 1e-3,
        "b": -2e5,
        "c": "1e",
        "d": [1, 0.1],
    }
    assert parse_overrides(["a=1.5e3", "b=.5e3", "c=1.2.3e4"]) == {"a": 1500.0, "b": 500.0, "c": "1.2.3e4"}


@pytest.mark.parametrize("value", ["null", "", "~"])
def test_a_setting_without_a_value_is_refused(capsys, value):
    """The space dropped it: the default ran, in a folder named ...-set-ffn_step-null."""
    code, out, err = run_cli(["--model", "llama-7b", "--space", "ffn-grid", "--budget", "5.7B", "--set",
                              f"ffn_step={value}", "--json"], capsys)  # fmt: skip
    assert (
        code == 2
        and out == ""
        and err == (f"nsc-prune: error: --set ffn_step gives no value (got {value!r}); leave it out for the default\n")
    )


def test_set_keys_are_read_without_their_spaces_and_a_key_is_needed():
    assert parse_overrides([" ffn_step =64", "protect_layers=[0, 1]"]) == {"ffn_step": 64, "protect_layers": [0, 1]}
    assert parse_overrides(["note=a=b"]) == {"note": "a=b"}  # the first '=' ends the key
    for item in ("=5", " =5", "ffn_step"):
        with pytest.raises(ConfigError, match=r"--set takes KEY=VALUE"):
            parse_overrides([item])


def test_a_setting_given_twice_is_refused(capsys):
    """The last value won silently, and the default output folder was named after both."""
    argv = ["--model", "smollm2-135m", "--budget", "90%", "--set", "ffn_step=64", "--set", " ffn_step=128"]
    code, out, err = run_cli(argv, capsys)
    assert (
        code == 2 and out == "" and err == "nsc-prune: error: --set ffn_step is given twice; give each setting once\n"
    )


def test_unwritable_out_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    code, out, err = run_cli(["--model", "smollm2-135m", "--budget", "90%", "--out", str(tmp_path / "file")], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("nsc-prune: error: ")
    assert "a file where a folder is needed" in err
    assert (tmp_path / "file").read_text() == "not a folder"


def test_adapter_config_sets_rank(tmp_path, capsys):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 16,
                "lora_alpha": 32,
                "target_modules": ["q_proj", "k_proj", "v_proj", "up_proj", "gate_proj", "down_proj"],
            }
        )
    )
    code, out, _ = run_cli(
        ["--model", "smollm2-135m", "--budget", "90%", "--adapter", str(adapter), "--out", str(tmp_path / "o")], capsys
    )
    doc = ParetoDocument.read(tmp_path / "o").to_dict()
    assert code == 0 and {layer["lora_rank"] for p in doc["points"] for layer in p["layers"]} <= {16, 12}
    assert doc["space"]["lora_alpha"] == 32.0
    config = json.loads((adapter / "adapter_config.json").read_text())
    config.pop("lora_alpha")  # PEFT's LoraConfig reads 8, as extract merges with; the search recorded r (16)
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    argv = ["--model", "smollm2-135m", "--budget", "90%", "--adapter", str(adapter), "--out", str(tmp_path / "o")]
    assert run_cli([*argv, "--overwrite"], capsys)[0] == 0
    assert ParetoDocument.read(tmp_path / "o").to_dict()["space"]["lora_alpha"] == 8.0
    peft = pytest.importorskip("peft")
    assert peft.LoraConfig.from_pretrained(str(adapter)).lora_alpha == 8


def _adapter(folder, **config):
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 16, "lora_alpha": 32, **config}))
    return str(folder)


@pytest.mark.parametrize(
    ("model", "config", "extra", "message"),
    [
        ("llama-7b", {"target_modules": 5}, [], "target_modules must be a list of module names or 'all-linear'; got 5"),
        ("llama-7b", {"target_modules": {"q_proj": 1}}, [], "target_modules must be a list of module names"),
        ("llama-7b", {"target_modules": ["qkv_proj", "o_proj"]}, [],
         "target_modules ['qkv_proj'] are not projections of a llama layer (q_proj, k_proj, v_proj, o_proj, "
         "gate_proj, up_proj, down_proj); is the adapter made for another base model?"),
        ("llama-7b", {"target_modules": ["q_proj", "down_proj"]}, ["--set", "elastic_rank_modules=[k_proj]"],
         "--set elastic_rank_modules contradicts --adapter"),
        ("llama-7b", {"target_modules": ["q_proj", "down_proj"]}, ["--set", "lora_alpha=8"],
         "--set lora_alpha contradicts --adapter"),
    ],
)  # fmt: skip
def test_an_adapter_that_does_not_fit_is_one_line_naming_it(tmp_path, capsys, model, config, extra, message):
    adapter = _adapter(tmp_path / "adapter", **config)
    args = ["--model", model, "--budget", "90%", "--adapter", adapter, "--out", str(tmp_path / "o"), *extra]
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "o").exists()


def test_a_super_adapter_is_searched_on_the_subnets_it_was_trained_on(tmp_path, capsys):
    """--adapter read adapter_config.json only: a super-adapter trained on FFN fractions [1, 0.5] was searched on the
    default five, three of which it never trained. The record beside it gives them now; --set still wins."""
    adapter = Path(_adapter(tmp_path / "adapter", target_modules=["q_proj", "v_proj", "down_proj"]))
    trained = {"kind": "lonas", "ffn_fractions": [1.0, 0.5], "rank_deltas": [0, -8], "lora_rank": 16}
    (adapter / "nsc_prune_supernet.json").write_text(json.dumps({"space": {"name": "lonas", "settings": trained}}))
    args = ["--model", "llama-7b", "--budget", "90%", "--adapter", str(adapter), "--json"]
    doc = json.loads(run_cli(args, capsys)[1])
    assert (doc["space"]["ffn_fractions"], doc["space"]["rank_deltas"]) == ([1.0, 0.5], [0, -8])
    assert {layer["ffn"] for point in doc["points"] for layer in point["layers"]} <= {11008, 5504}
    doc = json.loads(run_cli([*args, "--set", "ffn_fractions=[1.0, 0.75]"], capsys)[1])
    assert (doc["space"]["ffn_fractions"], doc["space"]["rank_deltas"]) == ([1.0, 0.75], [0, -8])
    (adapter / "nsc_prune_supernet.json").write_text(json.dumps({"space": {"settings": {**trained, "lora_rank": 12}}}))
    doc = json.loads(run_cli(args, capsys)[1])  # trained at r 12 (ranks 12 and 4) in the adapter's r 16
    assert (doc["space"]["lora_rank"], doc["space"]["rank_deltas"]) == (16, [-4, -12])
    (adapter / "nsc_prune_supernet.json").write_text(
        json.dumps({"space": {"settings": {**trained, "kind": "elastic"}}})
    )
    assert json.loads(run_cli(args, capsys)[1])["space"]["ffn_fractions"] == [1.0, 0.875, 0.75, 0.625, 0.5]
    (adapter / "nsc_prune_supernet.json").write_text(json.dumps({"space": 3}))
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "nsc_prune_supernet.json must hold the space it was trained on" in err
    one = json.dumps({"settings": trained})
    (adapter / "nsc_prune_supernet.json").write_text(f'{{"space": {one}, "space": {one}}}')  # json kept the last
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "the key 'space' appears more than once in one object" in err
    for change, message in (  # a float rank was read as no rank: ranks relative to the adapter's, silently
        ({"lora_rank": 4.0}, "must hold the lonas settings it was trained on; got lora_rank 4.0"),
        ({"ffn_fractions": None}, "got null ffn_fractions"),  # the default, silently
        ({"lora_rank": 2}, "(the space as trained, from"),  # ranks 2 and -6: names the record, not a --set
    ):
        record = {"space": {"settings": {**trained, **change}}}
        (adapter / "nsc_prune_supernet.json").write_text(json.dumps(record))
        code, _, err = run_cli(args, capsys)
        assert code == 2 and message in err and err.count("\n") == 1, err


def test_an_adapters_own_settings_repeated_by_set_are_accepted(tmp_path, capsys):
    adapter = _adapter(tmp_path / "adapter", target_modules=["q_proj", "v_proj", "down_proj"])
    args = ["--model", "llama-7b", "--budget", "90%", "--adapter", adapter, "--out", str(tmp_path / "o"),
            "--set", "lora_rank=16", "--set", "lora_alpha=32",
            "--set", "elastic_rank_modules=[v_proj, q_proj]"]  # fmt: skip
    assert run_cli(args, capsys)[0] == 0


def test_lonas_with_no_module_for_lora_says_to_pass_lora_rank_0(tmp_path, capsys):
    """Both lists empty was min()'s ValueError traceback."""
    args = ["--model", "llama-7b", "--space", "lonas", "--budget", "90%", "--out", str(tmp_path / "o"),
            "--set", "elastic_rank_modules=[]", "--set", "fixed_rank_modules=[]"]  # fmt: skip
    code, _, err = run_cli(args, capsys)
    said = "both empty: no projection gets the LoRA rank 32; for FFN widths alone pass lora_rank=0"
    assert code == 2 and err.count("\n") == 1 and said in err and not (tmp_path / "o").exists(), err
    assert run_cli([*args, "--set", "lora_rank=0"], capsys)[0] == 0


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("elastic_rank_modules=qkv_proj", None),  # one module, not its letters
        ("elastic_rank_modules=5", "elastic_rank_modules must be a list of module names; got 5"),
        ("fixed_rank_modules=[q_proj]", "['qkv_proj'] would have both an elastic and a fixed rank (a phi3 layer"),
    ],
)
def test_lonas_module_lists_on_phi3(tmp_path, capsys, setting, message):
    args = [
        "--model",
        "phi-4-mini",
        "--space",
        "lonas",
        "--budget",
        "90%",
        "--set",
        setting,
        "--out",
        str(tmp_path / "o"),
    ]
    code, _, err = run_cli(args, capsys)
    if message is None:
        assert code == 0, err
    else:
        assert code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-8b", "--budget", "5B"], "unknown model 'llama-8b'. Did you mean"),
        (["--model", "llama-7b", "--budget", "five"], "cannot read budget 'five'"),
        (["--model", "smollm2-135m", "--budget", "100%", "--init", "1e-170"], "init std 1e-170 is below 1e-150"),
        (["--model", "smollm2-135m", "--budget", "90%", "--set", "init=1.0e-170"], "init std 1e-170 is below 1e-150"),
        (["--model", "llama-7b", "--budget", "4B"], "at least the smallest plan's 4.574B (4,574,154,752) params"),
        (["--model", "llama-7b", "--space", "lonass", "--budget", "5B"], "unknown space 'lonass'. Did you mean lonas"),
        (["--budget", "5B"], "pass --model"),
        (["--model", "", "--budget", "5B"], "--model must name a preset, a folder with config.json"),  # was absent
        (["--model", "  ", "--budget", "5B"], "a folder with config.json, or a cached hub id; got '  '"),
        (["--model", "org/name/extra", "--budget", "5B"], "unknown model 'org/name/extra'. Presets: "),  # not a hub id
        (["--model", "llama-7b", "--budget", "-.5B"], "cannot read budget '-.5B'; use a number"),
        (
            ["--model", "llama-7b", "--budget", "5B", "--out", " "],
            "argument --out: must name a file or folder; got ' '",
        ),
        (["--model", "~nosuchuser-nsc/x", "--budget", "5B"], "~nosuchuser-nsc/x does not exist"),  # a traceback
        *(  # '' was read as not given, or as the current folder
            (["--model", "llama-7b", "--budget", "5B", flag, ""], f"argument {flag}: must name a file or folder")
            for flag in ("--out", "--adapter", "--latency-table", "--weights", "--calib", "--sensitivity-table")
        ),
        (["--model", "{tmp}/gpt2", "--budget", "5B"], "model_type 'gpt2' is not supported"),
        (["--model", "{tmp}/broken", "--budget", "5B"], "missing required fields"),
        (
            ["--model", "llama-7b", "--budget", "5B", "--adapter", "{tmp}/bad-adapter"],
            "do not exist in a LLaMA-family model",
        ),
        (["--model", "llama-7b", "--budget", "5B", "--adapter", "{tmp}/list-adapter"], "must hold a JSON object"),
        (
            ["--model", "llama-7b", "--budget", "5B", "--adapter", "{tmp}/text-rank"],
            "r must be a positive integer; got 'abc'",
        ),
        (["--model", "llama-7b", "--budget", "5B", "--adapter", "{tmp}/no-targets"], "names no target_modules: PEFT"),
        (["--model", "llama-7b", "--budget", "5B", "--adapter", "{tmp}/patterned"], "rank_pattern"),
        (["--model", "llama-7b", "--budget", "5B", "--adapter", "{tmp}/some-layers"], "layers_to_transform leave"),
        (
            ["--model", "smollm2-135m", "--budget", "90%", "--adapter", "{tmp}/huge-rank"],
            "LoRA rank 4096 is larger than the narrowest",
        ),
        (
            ["--model", "smollm2-135m", "--space", "ffn-grid", "--budget", "90%", "--adapter", "{tmp}/good-adapter"],
            "use --space lonas",
        ),
        (
            ["--model", "smollm2-135m", "--space", "ffn-grid", "--budget", "90%", "--set", "lora_rank=8"],
            "has no setting lora_rank",
        ),
        (["--model", "llama-7b", "--budget", "5B", "--set", "lora_rank=abc"], "lora_rank must be a whole number"),
        # written into pareto.json as given (x), a JSON traceback (nan), plans of rank 36 above r_max 32, a TypeError
        (["--model", "llama-7b", "--budget", "5B", "--set", "lora_alpha=x"], "lora_alpha must be a positive finite"),
        (["--model", "llama-7b", "--budget", "5B", "--set", "lora_alpha=.nan"], "lora_alpha must be a positive finite"),
        (
            ["--model", "llama-7b", "--budget", "5B", "--set", "rank_deltas=[0,4]"],
            "rank_deltas must be non-empty, each",
        ),
        (["--model", "llama-7b", "--budget", "5B", "--set", "ffn_fractions=0.5"], "ffn_fractions must be a list, e.g."),
        (
            ["--model", "llama-7b", "--budget", "5B", "--adapter", "{tmp}/nan-alpha"],
            "adapter_config.json is not valid JSON (NaN is not a JSON number)",
        ),
        (["--model", "llama-7b", "--budget", "-1B"], "cannot read budget '-1B'"),
        (["--model", "llama-7b", "--budget", "5.7X"], "cannot read budget '5.7X'"),
        (["--model", "llama-7b", "--budget", "0"], "budget must be at least 1; got '0'"),
        (["--model", "llama-7b", "--budget", "0.0001"], "budget must be at least 1; got '0.0001' (it rounds to 0)"),
        (["--model", "llama-7b", "--budget", "0%"], "percentage must be > 0"),
        (["--model", "llama-7b", "--budget", "5B", "--cost", "flops"], "invalid choice: 'flops'"),
        (["--model", "llama-7b"], "the following arguments are required: --budget"),
        (["--model", "{tmp}/string-width", "--budget", "5B"], "['hidden_size'] must be positive integers"),
        (["--model", "{tmp}/kv-zero", "--budget", "5B"], "'num_key_value_heads' must be a positive integer or absent"),
        (
            ["--model", "{tmp}/text-flag", "--budget", "5B"],
            "'mlp_bias' must be true or false; got 'false'",
        ),  # read as true
        (["--model", "./nothere", "--budget", "5B"], "./nothere does not exist"),
        (["--model", "{tmp}/notes.txt", "--budget", "5B"], "notes.txt is not a config.json"),
        (["--model", "llama-7b", "--space", "txl-wt103", "--budget", "40M"], "it takes no model: drop --model"),
        (["--space", "txl-wt103", "--cost", "latency", "--budget", "40M"], "takes no model: use --cost params or macs"),
        (
            ["--model", "llama-7b", "--budget", "5B", "--init", "glorot"],
            "init must be xavier, kaiming or a positive std",
        ),
        (["--model", "llama-7b", "--budget", "5B", "--init", "-0.02"], "init std must be a positive finite number"),
        (
            ["--model", "llama-7b", "--cost", "macs", "--macs-tokens", "2000000000", "--budget", "50%"],
            "beyond the exact integer range",
        ),
        # flags another score reads were ignored without a word (a --calib even when its file did not exist)
        (
            ["--model", "llama-7b", "--budget", "5B", "--calib", "{tmp}/none.txt"],
            "--calib applies to --score measured;",
        ),
        (
            ["--model", "llama-7b", "--budget", "5B", "--calib-tokens", "600", "--calib-seq-len", "64"],
            "--calib-tokens and --calib-seq-len apply to --score measured (with --calib); got --score psi_mp",
        ),
        (["--model", "llama-7b", "--budget", "5B", "--selection", "magnitude"], "--selection applies to --score"),
        (["--model", "llama-7b", "--budget", "5B", "--calib-dtype", "bfloat16"], "--calib-dtype applies to --score"),
        (["--model", "llama-7b", "--budget", "5B", "--weights", "{tmp}/gpt2"], "psi_MP reads only the config"),
        (["--model", "llama-7b", "--budget", "5B", "--device", "cuda"], "--device applies to --score psi_w or"),
        (
            ["--model", "llama-7b", "--budget", "5B", "--sensitivity-table", "{tmp}/t.json"],
            "--sensitivity-table applies to --score measured; got --score psi_mp",
        ),
        (["--model", "llama-7b", "--cost", "macs", "--macs-tokens", "0", "--budget", "1T"], "--macs-tokens must be a"),
        (["--model", "llama-7b", "--budget", "5B", "--latency-phase", "prefill"], "applies to --cost latency with"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, message):
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 768}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (tmp_path / "bad-adapter").mkdir()
    (tmp_path / "bad-adapter" / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["c_attn"]})
    )
    targets = ["q_proj", "k_proj", "v_proj", "up_proj", "gate_proj", "down_proj"]
    adapters = {
        "list-adapter": [1, 2],
        "text-rank": {"r": "abc", "target_modules": targets},
        "no-targets": {"r": 8},
        "patterned": {"r": 8, "target_modules": targets, "rank_pattern": {"q_proj": 4}},
        "some-layers": {"r": 8, "target_modules": targets, "layers_to_transform": [0, 2]},
        "huge-rank": {"r": 4096, "target_modules": targets},
        "good-adapter": {"r": 8, "target_modules": targets},
        "nan-alpha": {"r": 8, "lora_alpha": float("nan"), "target_modules": targets},
    }
    for name, config in adapters.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps(config))
    (tmp_path / "string-width").mkdir()
    config = {**json.loads((PRESETS_DIR / "smollm2-135m.json").read_text()), "hidden_size": "576"}
    (tmp_path / "string-width" / "config.json").write_text(json.dumps(config))
    (tmp_path / "text-flag").mkdir()
    (tmp_path / "text-flag" / "config.json").write_text(json.dumps({**config, "hidden_size": 576, "mlp_bias": "false"}))
    (tmp_path / "kv-zero").mkdir()  # was read as 'no GQA'
    (tmp_path / "kv-zero" / "config.json").write_text(
        json.dumps({**config, "hidden_size": 576, "num_key_value_heads": 0})
    )
    (tmp_path / "notes.txt").write_text("not a config")
    out_dir = tmp_path / "out"
    code, out, err = run_cli([a.replace("{tmp}", str(tmp_path)) for a in args] + ["--out", str(out_dir)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("nsc-prune: error: ") and message in err
    assert not out_dir.exists()


def test_search_path_imports_no_torch(tmp_path):
    code = (
        "import sys; from nsc_prune.cli import main; "
        f"rc = main(['--model', 'llama-7b', '--budget', '5.7B', '--out', r'{tmp_path}']); "
        "assert rc == 0; assert 'torch' not in sys.modules and 'scipy' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


@pytest.mark.parametrize("command", ["heal", "train-supernet", "extract", "eval", "profile", "rank", "models"])
def test_every_command_s_help_needs_no_torch(command):
    """A core install reads every command's flags (heal's and train-supernet's imported torch for the recipe)."""
    code = (  # a finder that refuses torch, as a machine without it would (sys.modules None misleads scipy)
        "import sys, importlib.abc\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch': raise ImportError(name)\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        f"from nsc_prune.cli import main; sys.exit(main([{command!r}, '--help']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and "usage: nsc-prune" in done.stdout, done.stderr


def test_models_command_lists_presets(capsys, tmp_path, monkeypatch):
    (tmp_path / "llama-7b").mkdir()  # a folder named like a preset: models asks for no --model, so no warning
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["models"], capsys)
    assert code == 0 and "llama-7b" in out and "qwen2.5-7b" in out and "lonas" in out and err == ""


def test_search_plan_is_what_the_command_writes(tmp_path):
    """The library entry point and the CLI give the same document (the CLI only parses and prints)."""
    import nsc_prune

    assert main(["--model", "smollm2-135m", "--space", "ffn-grid", "--budget", "80%", "--out", str(tmp_path)]) == 0
    written = ParetoDocument.read(tmp_path)
    found = nsc_prune.search_plan("smollm2-135m", "80%", "ffn-grid")
    assert found.document.points == written.points and found.selected == written.selected
    assert found.document.budget == written.budget and found.document.score == written.score == {"backend": "psi_mp"}
    assert found.budget == written.budget["resolved"] and not found.above_full


def test_unreadable_yaml_is_one_line(tmp_path, capsys):
    """PyYAML's messages span several lines (the text quoted under them): a --set value or a space file that is not
    YAML is still one line, with where the parser stopped."""
    space = tmp_path / "bad.yaml"
    space.write_text("kind: [1\n")
    for extra in (["--set", "ffn_step=[1"], ["--space", str(space)]):
        assert main(["--model", "llama-7b", "--budget", "80%", "--out", str(tmp_path / "o"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "(line " in err and "Traceback" not in err, err


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    """Nine nested aliases of ten items in 458 bytes make 10**9 values: the check's message printed them all (the
    search ran past a minute and 2 GB). Aliases are refused where nsc-prune reads YAML."""
    lines = ["l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    space = tmp_path / "bomb.yaml"
    space.write_text("\n".join([*lines, "kind: elastic", "ffn_step: *l8", ""]))
    code, out, err = run_cli(["--model", "smollm2-135m", "--space", str(space), "--budget", "90%"], capsys)
    assert code == 2 and "found the alias *l0: write the value out (line 2" in err and err.count("\n") == 1, err


def test_a_yaml_key_written_twice_is_refused_as_the_json_readers_are(tmp_path, capsys):
    """The last ffn_step was searched, silently; a JSON file with a key twice was already refused."""
    space = tmp_path / "dup.yaml"
    space.write_text("kind: elastic\nffn_step: 256\nffn_min_fraction: 0.5\nffn_step: 512\n")
    code, out, err = run_cli(["--model", "smollm2-135m", "--space", str(space), "--budget", "90%"], capsys)
    assert code == 2 and "found the key 'ffn_step' twice in one mapping: keep one (line 4" in err, err
    from nsc_prune._io import parse_yaml

    assert parse_yaml("a: {b: 1}\nc: [{b: 2}, {b: 3}]\n") == {"a": {"b": 1}, "c": [{"b": 2}, {"b": 3}]}
    assert parse_yaml("<<: {a: 1, b: 1}\na: 2\n") == {"a": 2, "b": 1}  # a merge key restates keys, as YAML allows
    import yaml

    with pytest.raises(yaml.YAMLError, match="found the key 'a' twice"):
        parse_yaml("<<: {a: 1, a: 2}\n")  # but the mapping it merges is checked
    code, out, err = run_cli(["--model", "smollm2-135m", "--budget", "90%", "--set", "ffn_step=!!set [64]"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err  # was a TypeError traceback


@pytest.mark.parametrize(
    "raised",
    [
        MemoryError(),  # e.g. a config.json with hidden_size 1e12: a traceback
        # torch's CPU allocator, a mapped file, CUDA: RuntimeErrors, tracebacks (exit 1) until they were read as such
        RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate memory"),
        RuntimeError("unable to mmap 894720200 bytes from file <x>: Cannot allocate memory (12)"),
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    ],
)
def test_running_out_of_memory_is_one_line(monkeypatch, capsys, raised):
    import nsc_prune.cli.search as search_command

    def exhausted(args):
        raise raised

    monkeypatch.setattr(search_command, "run", exhausted)
    code, out, err = run_cli(["--model", "llama-7b", "--budget", "5B"], capsys)
    assert (
        code == 2
        and out == ""
        and err == "nsc-prune: error: out of memory: the model or the settings need more than this machine has\n"
    )
    monkeypatch.setattr(search_command, "run", lambda args: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # any other RuntimeError keeps its traceback
        run_cli(["--model", "llama-7b", "--budget", "5B"], capsys)


def test_a_full_disk_while_the_plot_is_written_names_the_plot(monkeypatch, capsys, tmp_path):
    """matplotlib's OSError for a full disk names no file: the line was a bare "No space left on device"."""
    import errno

    import nsc_prune.cli.search as search_command

    pytest.importorskip("matplotlib")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(search_command, "write_plot", full)
    code, _, err = run_cli(["--model", "llama-7b", "--budget", "5B", "--out", str(tmp_path / "p"), "--plot"], capsys)
    assert code == 2 and f"No space left on device: {tmp_path / 'p' / 'pareto.png'}" in err, err
    assert not (tmp_path / "p").exists()


def test_a_file_size_limit_is_named_as_such(monkeypatch, capsys, tmp_path):
    """ulimit -f (or FAT32's 4 GiB a file under extract's 5 GB shards) gave a bare "File too large": no path, no
    hint (extract) or no cause (the search's pareto.json)."""
    import errno

    import nsc_prune.cli.search as search_command
    import nsc_prune.hf.extract as extract_module

    def too_large(*args, **kwargs):
        raise OSError(errno.EFBIG, "File too large", str(tmp_path / "out" / "pareto.json"))

    plan = tmp_path / "plan"
    assert run_cli(["--model", "llama-7b", "--budget", "5B", "--out", str(plan), "--no-plot"], capsys)[0] == 0
    monkeypatch.setattr(extract_module, "extract_subnet", too_large)
    code, _, err = run_cli(
        ["extract", "--pareto", str(plan), "--base", str(tmp_path), "--out", str(tmp_path / "c")], capsys
    )
    assert code == 2 and "File too large (a file-size limit" in err and "pass a smaller --max-shard-size" in err, err
    gguf = ["extract", "--pareto", str(plan), "--base", str(tmp_path), "--format", "gguf", "--out", str(tmp_path / "g")]
    code, _, err = run_cli(gguf, capsys)  # one file: --max-shard-size would be refused
    assert code == 2 and "max-shard-size" not in err and "; write to another file system; nothing was" in err, err

    def short_write(*args, **kwargs):  # numpy's, past ulimit -f in a GGUF's tensors: no errno
        raise OSError("19200 requested and 6368 written")

    import nsc_prune.cli.extract as extract_command

    monkeypatch.setattr(extract_module, "extract_subnet", short_write)
    monkeypatch.setattr(extract_command, "file_size_limit", lambda: 61440)
    code, _, err = run_cli(gguf, capsys)
    assert code == 2 and "the disk is full or the file-size limit (ulimit -f: 61440 bytes) was reached" in err, err
    monkeypatch.setattr(search_command, "run", too_large)
    code, _, err = run_cli(["--model", "llama-7b", "--budget", "5B"], capsys)
    assert code == 2 and err.endswith("pareto.json (a file-size limit: ulimit -f, or the file system's)\n"), err


def test_a_full_disk_under_safetensors_is_one_line_and_its_other_errors_keep_their_traceback(monkeypatch, capsys):
    safetensors = pytest.importorskip("safetensors")
    import nsc_prune.cli.search as search_command

    def full(args):  # safetensors raises its own error, not an OSError: a traceback ending in it, exit 1
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(search_command, "run", full)
    code, out, err = run_cli(["--model", "llama-7b", "--budget", "5B"], capsys)
    assert code == 2 and err == (
        "nsc-prune: error: could not write a safetensors file: Error while serializing: I/O error: No space left on "
        "device (os error 28)\n"
    )

    def corrupt(args):
        raise safetensors.SafetensorError("Error while deserializing header: HeaderTooLarge")

    monkeypatch.setattr(search_command, "run", corrupt)
    with pytest.raises(safetensors.SafetensorError, match="HeaderTooLarge"):
        run_cli(["--model", "llama-7b", "--budget", "5B"], capsys)


def test_ctrl_c_while_the_plot_is_drawn_keeps_the_last_pair_and_says_what_was_written(tmp_path, capsys, monkeypatch):
    """A Ctrl-C while pareto.png was drawn left the new pareto.json beside the last run's plot, and a Ctrl-C after
    the files were written said "nothing was written"."""
    pytest.importorskip("matplotlib")
    from nsc_prune.cli import search

    argv = ["--model", "smollm2-135m", "--budget", "90%", "--out", str(tmp_path), "--overwrite"]
    assert run_cli(argv[:-1], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "write_plot", ctrl_c)
    code, _, err = run_cli([*argv[:3], "80%", *argv[4:]], capsys)
    assert code == 130 and err.strip() == "nsc-prune: interrupted; nothing was written"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # the pair of the last run, untouched
    monkeypatch.undo()
    monkeypatch.setattr(search, "_print_plan", ctrl_c)
    code, _, err = run_cli([*argv[:3], "80%", *argv[4:]], capsys)
    png, pareto = tmp_path / "pareto.png", tmp_path / "pareto.json"
    assert code == 130 and err.strip() == f"nsc-prune: interrupted after it wrote {pareto}, {png}"
    assert json.loads(pareto.read_text())["budget"]["requested"] == "80%"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"score": "psi_w"}, "score must be a ScoreSettings or None; got 'psi_w'"),  # an AttributeError
        ({"latency": "lut.json"}, "latency must be a LatencySettings or None; got 'lut.json'"),
        ({"overrides": [1]}, "overrides must be a mapping of space keys"),  # a TypeError from dict()
        ({"adapter": ""}, "adapter must be a LoRA adapter folder or None; got ''"),  # read as no adapter
    ],
)
def test_search_plan_names_an_argument_of_the_wrong_type(change, message):
    from nsc_prune.planning import search_plan

    with pytest.raises(ConfigError, match=message):
        search_plan("llama-7b", "5.7B", **change)


@pytest.mark.parametrize("given, name", [(".", "mymodel"), ("../mymodel/.", "mymodel"), ("config.json", "mymodel")])
def test_a_model_given_as_the_current_folder_is_named_by_it(tmp_path, monkeypatch, given, name):
    """--model . was named '' (the header, pareto.json, the card's "search for n/a"), config.json by its stem."""
    from nsc_prune.presets import resolve_model

    folder = tmp_path / "mymodel"
    folder.mkdir()
    (folder / "config.json").write_text((Path(__file__).parents[1] / "fixtures" / "tiny_llama_config.json").read_text())
    (tmp_path / "link").symlink_to(folder)  # a hub snapshot's folder is named by a hash: a link keeps its own name
    monkeypatch.chdir(folder)
    assert resolve_model(given).name == name and resolve_model(str(tmp_path / "link")).name == "link"


def test_a_hub_snapshot_folder_is_named_by_its_repository_not_its_commit(tmp_path):
    """A snapshot of the hub cache passed as a folder was named by its commit hash: the header, pareto.json, the
    default --out, the card, a GGUF file's name and eval's table all said 0123abcd..."""
    from nsc_prune.presets import folder_model_name, hub_repo_id, resolve_model

    snapshot = tmp_path / "hub" / "models--my-org--My-Model-7B" / "snapshots" / ("0123abcd" * 5)
    snapshot.mkdir(parents=True)
    config = json.loads((Path(__file__).parents[1] / "fixtures" / "tiny_llama_config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "_name_or_path"}))
    assert hub_repo_id(snapshot) == "my-org/My-Model-7B" and hub_repo_id(tmp_path) is None
    assert (
        resolve_model(str(snapshot)).name == resolve_model(str(snapshot / "config.json")).name == "my-org/My-Model-7B"
    )
    assert folder_model_name(snapshot) == "My-Model-7B"
    (snapshot / "config.json").write_text(json.dumps({**config, "_name_or_path": "their/Own-Name"}))
    assert folder_model_name(snapshot) == "Own-Name"  # the model's own name first
    (snapshot / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "_name_or_path"}))
    (snapshot / "nsc_prune_extract.json").write_text(json.dumps({"base_name": "Base-Model"}))
    assert folder_model_name(snapshot) == "Base-Model"  # a pruned checkpoint on the Hub keeps its lineage


def test_a_cached_hub_id_where_a_folder_goes_names_the_folder(tmp_path, monkeypatch):
    """--model takes a cached hub id, the weights inputs (--base, --weights, CKPT) a folder: the id given there
    said only "does not exist", though nsc-prune knows where the snapshot is."""
    from nsc_prune.presets import read_model_config

    snapshot = tmp_path / "hub" / "models--org--m" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        InvalidInputError,
        match=rf"--base must be .*got 'org/m' \(it does not exist; the hub id is cached at {snapshot}: pass that folder\)",
    ):
        read_model_config("org/m", "--base")
    with pytest.raises(InvalidInputError, match=r"got 'org/other' \(it does not exist\)$"):
        read_model_config("org/other", "--base")


def test_a_stopped_command_says_its_warnings_before_the_stop(monkeypatch, capsys):
    """Warnings were printed when the command returned: a run stopped by Ctrl-C or SIGTERM lost them, though they
    were about its inputs and were raised before the slow step."""
    import warnings

    from nsc_prune.cli import search

    def warn_then(stop):
        def run(args):
            warnings.warn("a warning about the inputs", stacklevel=1)
            raise stop

        return run

    for stop, code, said in ((KeyboardInterrupt(), 130, "interrupted"), (SystemExit(143), 143, "stopped by SIGTERM")):
        monkeypatch.setattr(search, "run", warn_then(stop))
        got, _, err = run_cli(["--model", "smollm2-135m", "--budget", "90%"], capsys)
        assert got == code and "a warning about the inputs" in err, err  # in Python's format: raised in a test
        assert err.index("a warning about the inputs") < err.index(said) and err.count("Warning: a warning") == 1


def test_a_quoted_tilde_is_the_home_folder_for_every_path_flag(tmp_path, capsys, monkeypatch):
    """--out=~/s (the shell expands no ~ there) wrote into a folder named '~' in the working folder; --weights, a
    space YAML and extract's paths were "does not exist"."""
    from nsc_prune.presets import resolve_model

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    (home / "m").mkdir(parents=True)
    (home / "m" / "config.json").write_text(json.dumps(resolve_model("smollm2-135m").config))
    (home / "space.yaml").write_text("kind: elastic\nffn_step: 256\n")
    code, _, err = run_cli(["--model", "~/m", "--space", "~/space.yaml", "--budget", "80%", "--out=~/s"], capsys)
    assert code == 0 and (home / "s" / "pareto.json").is_file() and not (tmp_path / "~").exists(), err
    (home / "m" / "Config.JSON").write_bytes((home / "m" / "config.json").read_bytes())  # was "is not a config.json"
    assert run_cli(["--model", "~/m/Config.JSON", "--space", "~/space.yaml", "--budget", "80%"], capsys)[0] == 0
    code, _, err = run_cli(["extract", "--pareto", "~/s", "--base", "~/m", "--out", "~/c"], capsys)
    assert code == 2 and "does not exist" not in err and "~" not in err, err  # read: the config-only base's line
    for space in ("~/space", str(home / "space")):  # the absolute one read space.yaml, unsaid
        code, _, err = run_cli(["--model", "~/m", "--space", space, "--budget", "80%"], capsys)
        assert code == 2 and f"space file {space} must end in .yaml or .yml; a bundled space is a bare name" in err


def test_the_default_folder_is_not_rewritten_with_the_front_of_another_model_of_the_same_name(
    tmp_path, capsys, monkeypatch
):
    """m1/base and m2/base share out/base-ffn-grid: the second search replaced the first one's front, unsaid."""
    from nsc_prune.presets import resolve_model

    monkeypatch.chdir(tmp_path)
    config = resolve_model("smollm2-135m").config
    for folder, layers in (("m1", 30), ("m2", 28)):
        (tmp_path / folder / "base").mkdir(parents=True)
        (tmp_path / folder / "base" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    args = ["--space", "ffn-grid", "--budget", "80%", "--no-plot"]
    assert run_cli(["--model", "m1/base", *args], capsys)[0] == 0
    assert run_cli(["--model", "m1/base", *args], capsys)[0] == 0  # the same search rewrites its folder
    assert run_cli(["--model", "m1/base/config.json", *args], capsys)[0] == 0  # the same model, named another way
    front = json.loads((tmp_path / "out" / "base-ffn-grid" / "pareto.json").read_text())
    code, _, err = run_cli(["--model", "m2/base", *args], capsys)
    said = f"out/base-ffn-grid holds the front of another model ({tmp_path / 'm1' / 'base' / 'config.json'}), of this"
    assert code == 2 and said in err, err
    assert json.loads((tmp_path / "out" / "base-ffn-grid" / "pareto.json").read_text()) == front
    assert run_cli(["--model", "m2/base", *args, "--overwrite"], capsys)[0] == 0
    edited = json.loads((tmp_path / "m2" / "base" / "config.json").read_text())
    (tmp_path / "m2" / "base" / "config.json").write_text(json.dumps({**edited, "transformers_version": "9.9"}))
    assert run_cli(["--model", "m2/base", *args], capsys)[0] == 0  # changed in place: the same search, rewritten


def test_a_homogeneous_space_over_layers_that_differ_says_its_widest_plan_is_not_the_model(tmp_path, capsys):
    """Its widest plan is the widest width every layer shares; "100%" named it "the full model" (pareto.json's
    cost.full_is_model true), and a budget between it and the model was "above the full model"."""
    from nsc_prune.presets import resolve_model

    config = {**resolve_model("smollm2-135m").config, "per_layer_config": {"3": {"intermediate_size": 768}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ["--model", str(tmp_path / "config.json"), "--space", "ffn-grid", "--set", "homogeneous=true",
            "--set", "ffn_step=256", "--out", str(tmp_path / "front")]  # fmt: skip
    code, out, _ = run_cli([*args, "--budget", "100%"], capsys)
    assert code == 0 and "of the widest plan's" in out and "; the model has" in out, out
    assert json.loads((tmp_path / "front" / "pareto.json").read_text())["cost"]["full_is_model"] is False
    code, _, err = run_cli([*args, "--budget", "133M", "--overwrite"], capsys)
    assert code == 2 and "--budget must be at most the widest plan's" in err, err
    heads = {"nsc_per_layer_attention": {"3": {"num_attention_heads": 3, "num_key_value_heads": 1}}}
    (tmp_path / "config.json").write_text(json.dumps({**config, **heads}))
    code, _, err = run_cli([*args, "--budget", "90%", "--overwrite"], capsys)  # said "pick a grid the layers share"
    assert code == 2 and "have 1, 3 of them: no option is shared; add kv_heads=true" in err, err


def test_the_summary_names_the_widest_plan_when_the_space_stops_below_the_model(tmp_path, capsys, monkeypatch):
    """`lonas` with ffn_fractions [0.75, 0.5] never holds the model: "(89.6% of 114.608M)" read as the model's size,
    and extract of the same point said "76.3% of the base"."""
    monkeypatch.chdir(tmp_path)  # the searches write to their default folders under out/
    config = json.loads((PRESETS_DIR / "smollm2-135m.json").read_text())
    hidden, ffn, layers, vocab = (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_hidden_layers"],
        config["vocab_size"],
    )
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    block = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn + 2 * hidden  # attention, FFN, two norms
    model = vocab * hidden + hidden + layers * block  # tied embeddings, final norm
    assert model == 134_515_008
    code, out, _ = run_cli(["--model", "smollm2-135m", "--space", "lonas", "--budget", "90%", "--set",
                            "ffn_fractions=[0.75,0.5]"], capsys)  # fmt: skip
    assert code == 0 and "% of the widest plan's 114.608M; the model has 134.515M)" in out, out
    code, out, _ = run_cli(["--model", "smollm2-135m", "--budget", "90%"], capsys)
    assert code == 0 and "% of 134.515M)" in out and "widest" not in out
    # a budget above it names it too (a 120M budget, below the model, was "above the full model")
    below = ["--model", "smollm2-135m", "--space", "lonas", "--set", "ffn_fractions=[0.75,0.5]", "--budget", "120M"]
    code, _, err = run_cli(below, capsys)
    assert code == 2 and "--budget must be at most the widest plan's 114.608M params; got '120M = " in err, err
    assert err.endswith("to accept the widest plan\n") and "full model" not in err  # it prunes: no "(nothing pruned)"
    code, _, err = run_cli([*below[:-1], "2G"], capsys)  # read as MACs: the widest plan's, not the model's
    assert code == 2 and "Did you mean --cost macs (the widest plan is 31.265B MACs)?" in err, err
    code, _, err = run_cli([*below, "--allow-above-full"], capsys)
    assert code == 0 and "is above the widest plan (114.608M); returning the widest plan" in err, err
    # extract reads it from pareto.json (cost.full_is_model)
    assert run_cli([*below[:-1], "90%", "--out", str(tmp_path / "front")], capsys)[0] == 0
    doc = json.loads((tmp_path / "front" / "pareto.json").read_text())
    assert doc["cost"]["full"] == 114_608_448 and doc["cost"]["full_is_model"] is False
    extract = ["extract", "--pareto", str(tmp_path / "front"), "--base", str(tmp_path), "--out", str(tmp_path / "x")]
    code, _, err = run_cli([*extract, "--budget", "120M"], capsys)
    assert code == 2 and "at most the widest plan's 114.608M params; got '120M = 104.7% of the widest plan'" in err
    (tmp_path / "front" / "pareto.json").write_text(json.dumps({**doc, "cost": {**doc["cost"], "full_is_model": 0}}))
    code, _, err = run_cli([*extract, "--budget", "90%"], capsys)
    assert code == 2 and "'cost.full_is_model' must be true or false; got 0" in err, err
    (tmp_path / "front" / "pareto.json").write_text(json.dumps({**doc, "cost": {**doc["cost"], "full_is_model": None}}))
    code, _, err = run_cli([*extract, "--budget", "120M"], capsys)  # null reads as absent (an older file): the model
    assert code == 2 and "at most the full model's 114.608M params" in err, err


def test_an_error_names_a_setting_by_the_flag_typed_for_it():
    """`--probe-depth -1` said "probe_depth must be ...", a name `--help` does not show; a value given through
    --set or a YAML keeps its field's name, which is how the user gave it."""
    from nsc_prune.cli import _as_typed
    from nsc_prune.cli.search import build_parser

    parser = build_parser()
    message = "probe_depth must be a non-negative integer (0: no cap); got -1"
    assert _as_typed(message, parser, ["--probe-depth", "-1"]) == "--probe-depth" + message.removeprefix("probe_depth")
    assert (
        _as_typed("settings: probe_depth must be x", parser, ["--probe-depth=-1"])
        == "settings: --probe-depth must be x"
    )
    assert _as_typed(message, parser, ["--set", "probe_depth=-1"]) == message
    assert _as_typed("the text must be longer", parser, ["--text"]) == "the text must be longer"


def test_the_space_size_is_three_digits_also_past_a_floats_range_and_rounds_up_a_power():
    from nsc_prune.cli.search import _number_of

    assert [_number_of(n) for n in (12345, 496 * 10**373)] == ["1.23e+04", "4.96e+375"]
    assert _number_of(99996 * 10**301) == "1e+306"  # 9.9996 rounds to 10: one more power of ten, not 10e+305


def test_an_os_error_says_what_stood_in_the_way():
    import errno

    from nsc_prune.cli import _os_error_text

    wanted = {
        NotADirectoryError(
            errno.ENOTDIR, "Not a directory", "x/y"
        ): "Not a directory: x/y (a file where a folder is needed)",
        FileExistsError(errno.EEXIST, "File exists", "x"): "File exists: x (a file where a folder is needed)",
        IsADirectoryError(errno.EISDIR, "Is a directory", "x"): "Is a directory: x (a folder where a file is needed)",
        OSError(
            errno.EFBIG, "File too large", "x"
        ): "File too large: x (a file-size limit: ulimit -f, or the file system's)",
        OSError(
            errno.ENOSPC, "No space left on device", "a", None, "b"
        ): "No space left on device: b",  # the rename's target
    }
    assert {err: _os_error_text(err) for err in wanted} == wanted
