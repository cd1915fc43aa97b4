"""One CLI vocabulary (STYLE.md, CLI): every command's parser is walked; an idea has one flag name and one meaning,
no parser takes abbreviations, every default is shown in --help, docs/cli.md is the generated table, and each old
spelling still works for one release with exactly one warning."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")  # heal's and train-supernet's --help show TrainConfig's defaults

from nsc_prune.choices import GGUF_TYPES
from nsc_prune.cli import main
from nsc_prune.cli.parser import CommandParser, HelpFormatter, shown_default
from nsc_prune.cli.reference import command_parsers, documented_actions, render_flag_table

ROOT = Path(__file__).resolve().parents[1]
PARSERS = command_parsers()

# idea -> (the one flag, spellings no parser may show). Old spellings may live on only as hidden aliases.
IDEAS = {
    "batch size": ("--batch-size", ("--batch", "--bs", "--batch_size", "--per-device-batch-size")),
    "distillation teacher": ("--teacher", ("--distill", "--teacher-model", "--kd")),
    "training block length": ("--seq-len", ("--block-size", "--max-seq-len", "--seq-length", "--max-length")),
    "MACs tokens": ("--macs-tokens", ("--mac-tokens", "--tokens")),
    "calibration block length": ("--calib-seq-len", ("--calib-block", "--calib-len", "--calib-seq-length")),
    "sensitivity table": ("--sensitivity-table", ("--table", "--sens-table")),
    "GGUF tensor type": ("--outtype", ("--gguf-type", "--quant", "--quantization", "--out-type")),
    "training work folder": ("--work-dir", ("--workdir", "--state-dir", "--output-dir")),
    "output": ("--out", ("--output", "--out-dir", "-o")),
    "replace the output": ("--overwrite", ("--force", "--overwrite-output-dir")),
    "no progress bars": ("--quiet", ("--silent", "--no-progress")),
    "learning rate": ("--learning-rate", ("--lr",)),
    "optimizer steps": ("--max-steps", ("--steps", "--num-steps")),
}

# flag -> a test of its meaning that must hold in every command that has it
TORCH_DTYPES = {"auto", "float32", "bfloat16", "float16"}
MEANINGS = {
    "--seq-len": lambda action: "training block" in action.help,
    "--calib-seq-len": lambda action: "calibration block" in action.help,
    "--batch-size": lambda action: "sequences per" in action.help,
    "--teacher": lambda action: "distill" in action.help,
    "--work-dir": lambda action: "--resume" in action.help,
    "--dtype": lambda action: set(action.choices or ()) <= TORCH_DTYPES,
    "--outtype": lambda action: tuple(action.choices) == GGUF_TYPES,
    "--macs-tokens": lambda action: "MACs" in action.help,
}

# the old spellings: (command argv prefix, old argv, new argv)
HEAL = ["heal", "CKPT", "--data", "a.txt", "--out", "o"]
SUPERNET = ["train-supernet", "--base", "b", "--space", "ffn-grid", "--data", "a.txt", "--out", "o"]
SEARCH = ["--model", "llama-7b", "--budget", "5.7B"]
PROFILE = ["profile", "--model", "llama-7b", "--out", "lut.json"]
DEPRECATED = [
    (PROFILE, ["--batch", "4"], ["--batch-size", "4"], "--batch is deprecated; use --batch-size"),
    (
        SEARCH,
        ["--table", "t.json"],
        ["--sensitivity-table", "t.json"],
        "--table is deprecated; use --sensitivity-table",
    ),
    (SUPERNET, ["--distill"], ["--teacher", "base"], "--distill is deprecated; use --teacher"),
    (SEARCH, ["--score", "mp"], ["--score", "psi_mp"], "--score mp is deprecated; use --score psi_mp"),
    (SEARCH, ["--score", "svd"], ["--score", "psi_w"], "--score svd is deprecated; use --score psi_w"),
]


def _parser_of(argv: list[str]):
    name = "nsc-prune" if argv[0].startswith("-") else f"nsc-prune {argv[0]}"
    return PARSERS[name], argv if argv[0].startswith("-") else argv[1:]


def _visible(parser) -> set[str]:
    return {option for action in documented_actions(parser) for option in action.option_strings}


def test_every_command_is_walked():
    assert len(PARSERS) == 8 and all(isinstance(p, CommandParser) for p in PARSERS.values())


@pytest.mark.parametrize("idea", IDEAS)
def test_an_idea_has_one_spelling(idea):
    canonical, synonyms = IDEAS[idea]
    shown = {command: _visible(parser) & set(synonyms) for command, parser in PARSERS.items()}
    assert not any(shown.values()), f"{idea} is {canonical}; also spelled {shown}"
    assert any(canonical in _visible(parser) for parser in PARSERS.values())


@pytest.mark.parametrize("flag", MEANINGS)
def test_a_flag_has_one_meaning_in_every_command(flag):
    having = {
        command: action
        for command, parser in PARSERS.items()
        for action in documented_actions(parser)
        if flag in action.option_strings
    }
    assert having, f"no command has {flag}"
    wrong = [command for command, action in having.items() if not MEANINGS[flag](action)]
    assert not wrong, f"{flag} means something else in {wrong}"


# Flags that name a file or folder: '' is refused by argparse (path_value), never read as "not given" or as '.'.
PATH_FLAGS = {"--out", "--adapter", "--weights", "--calib", "--latency-table", "--sensitivity-table", "--teacher",
              "--teacher-logits", "--pareto", "--base", "--tokenizer", "--work-dir", "--config", "--benchmark"}  # fmt: skip
LABEL_OR_PATH = {("nsc-prune eval", "--base"), ("nsc-prune train-supernet", "--teacher")}  # a label, or a choice


def test_every_path_flag_refuses_an_empty_path():
    from nsc_prune.cli.parser import path_value

    found = {
        (command, flag): action.type
        for command, parser in PARSERS.items()
        for action in documented_actions(parser)
        for flag in action.option_strings
        if flag in PATH_FLAGS and (command, flag) not in LABEL_OR_PATH
    }
    assert len(found) >= 20 and not [key for key, kind in found.items() if kind is not path_value]


def test_the_search_alone_counts_macs_tokens_and_seq_len_is_the_training_block():
    with_macs = [c for c, p in PARSERS.items() if "--macs-tokens" in _visible(p)]
    with_seq_len = [c for c, p in PARSERS.items() if "--seq-len" in _visible(p)]
    assert with_macs == ["nsc-prune"]
    assert with_seq_len == ["nsc-prune heal", "nsc-prune train-supernet"]


@pytest.mark.parametrize("command", PARSERS)
def test_no_parser_takes_abbreviations(command):
    assert PARSERS[command].allow_abbrev is False


@pytest.mark.parametrize(
    "argv, flag",
    [([*HEAL, "--max-step", "5"], "--max-steps"), (["eval", "ckpt", "--task", "x"], "--tasks")],
    ids=["heal --max-step", "eval --task"],
)
def test_an_abbreviated_flag_fails_in_one_line_naming_the_flag(capsys, argv, flag):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"did you mean {flag}?" in err and err.startswith("nsc-prune")


@pytest.mark.parametrize("command", PARSERS)
def test_every_default_is_shown_in_help(command):
    parser = PARSERS[command]
    assert parser.formatter_class is HelpFormatter
    text = " ".join(parser.format_help().split())
    hidden = [
        action.option_strings[0]
        for action in documented_actions(parser)
        if action.option_strings
        and shown_default(action) is not None
        and f"(default: {' '.join(shown_default(action).split())})" not in text
    ]
    assert not hidden, f"{command} --help hides the defaults of {hidden}"


def test_recipe_defaults_come_from_train_config():
    from nsc_prune.hf.train.recipe import TrainConfig

    text = " ".join(PARSERS["nsc-prune heal"].format_help().split())
    assert f"optimizer steps (default: {TrainConfig().max_steps})" in text
    lora, full = TrainConfig().learning_rate, TrainConfig(full=True).learning_rate
    assert f"(default: {lora:g} with LoRA, {full:g} with --full)" in text


def test_docs_cli_md_is_the_generated_table():
    committed = (ROOT / "docs" / "cli.md").read_text()
    assert committed == render_flag_table(), "docs/cli.md is stale: python -m nsc_prune.cli.reference > docs/cli.md"
    for command, parser in PARSERS.items():
        for action in documented_actions(parser):
            for option in action.option_strings:
                assert re.search(rf"\| `{command}` \| [^|\n]*`{option}`", committed), (command, option)


@pytest.mark.parametrize("prefix, old, new, message", DEPRECATED, ids=[" ".join(item[1]) for item in DEPRECATED])
def test_an_old_spelling_parses_as_the_new_one_with_one_warning(prefix, old, new, message):
    parser, args = _parser_of(prefix)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parsed_old = parser.parse_args([*args, *old])
    parsed_new = parser.parse_args([*args, *new])
    assert [str(w.message) for w in caught] == [message]
    assert vars(parsed_old) == vars(parsed_new)
    assert old[0] not in _visible(parser) or old[0] == "--score"  # hidden from --help


@pytest.mark.parametrize(
    "prefix, old, new, message", DEPRECATED[:3], ids=[" ".join(item[1]) for item in DEPRECATED[:3]]
)
def test_an_old_spelling_beside_the_new_one_is_refused(prefix, old, new, message, capsys):
    """`profile --batch-size 3 --batch 2` timed batch 2, saying only that --batch is deprecated: the last won."""
    parser, args = _parser_of(prefix)
    for argv in ([*args, *old, *new], [*args, *new, *old]):
        with pytest.raises(SystemExit) as stopped:
            parser.parse_args(argv)
        assert stopped.value.code == 2
        line = f"{old[0]} is an old spelling of {new[0]}, and both are given; pass {new[0]}"
        assert line in capsys.readouterr().err


def test_an_old_spelling_prints_one_warning_line_through_the_cli(capsys, tmp_path):
    argv = [*SEARCH, "--table", "a.json", "--table", "b.json", "--score", "mp", "--score", "mp"]
    assert main([*argv, "--out", str(tmp_path / "table")]) == 2  # a table applies to --score measured only
    assert capsys.readouterr().err.splitlines() == [
        "nsc-prune: error: --sensitivity-table applies to --score measured; got --score psi_mp"
    ]
    assert main([*SEARCH, "--score", "mp", "--score", "mp", "--out", str(tmp_path / "old")]) == 0
    assert capsys.readouterr().err.splitlines() == ["nsc-prune: warning: --score mp is deprecated; use --score psi_mp"]
    assert main([*SEARCH, "--out", str(tmp_path / "new")]) == 0
    old, new = (json.loads((tmp_path / name / "pareto.json").read_text()) for name in ("old", "new"))
    assert old["score"] == new["score"] == {"backend": "psi_mp"}


@pytest.mark.parametrize(
    "argv, message",
    [
        ([*SEARCH, "--seq-len", "512"], "--seq-len is the training block length of heal and train-supernet"),
        ([*SEARCH, "--seq-len", "512"], "the search counts MACs over --macs-tokens N"),
        ([*PROFILE, "--dtype", "q8_0"], "use --outtype q8_0"),
    ],
    ids=["search --seq-len", "search --seq-len names --macs-tokens", "profile --dtype q8_0"],
)  # fmt: skip
def test_an_ambiguous_old_spelling_fails_in_one_line_naming_the_new_one(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_bad_max_shard_size_has_its_own_error(capsys):
    argv = ["extract", "--pareto", "p", "--base", "b", "--out", "o", "--max-shard-size", "lots"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-shard-size: must be a size such as 2GB, 500MiB" in err
    assert "budget" not in err


@pytest.mark.parametrize("text, size", [("2GB", 2 * 10**9), ("500MiB", 500 * 2**20), ("1000", 1000), ("1.5kb", 1500)])
def test_max_shard_size_units(text, size):
    from nsc_prune.cli.extract import _size

    assert _size(text) == size


def test_cli_functions_read_in_named_parts():
    import ast

    long = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted((ROOT / "nsc_prune" / "cli").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long, f"split into named parts: {long}"


def test_score_settings_read_the_old_names_with_a_deprecation_warning():
    from nsc_prune.planning import ScoreSettings

    with pytest.warns(DeprecationWarning, match="ScoreSettings backend 'svd' is deprecated; use 'psi_w'"):
        settings = ScoreSettings("svd", weights="w/")
    assert settings == ScoreSettings("psi_w", weights="w/")
    with pytest.warns(DeprecationWarning, match="'mp' is deprecated; use 'psi_mp'"):
        assert ScoreSettings("mp").backend == "psi_mp" == ScoreSettings().backend


def test_the_psi_w_front_goes_to_a_psi_w_folder():
    from nsc_prune.cli.search import build_parser, default_out_dir

    args = build_parser().parse_args([*SEARCH, "--score", "psi_w", "--weights", "weights/llama-7b"])
    assert default_out_dir(args, "llama-7b", "lonas") == Path("out/llama-7b-lonas-psi_w")
    args = build_parser().parse_args([*SEARCH, "--score", "psi_w", "--weights", "w/"])  # other weights: their name
    assert default_out_dir(args, "llama-7b", "lonas") == Path("out/llama-7b-lonas-psi_w-weights-w")
    assert default_out_dir(build_parser().parse_args(SEARCH), "llama-7b", "lonas") == Path("out/llama-7b-lonas")


def test_fronts_timed_by_other_latency_tables_go_to_other_folders():
    """Two latency searches with two tables both went to out/<model>-<space>-latency-decode: the second replaced
    the first; a table under another cost still records each point's time."""
    from nsc_prune.cli.search import build_parser, default_out_dir

    def folder(*extra):
        return default_out_dir(build_parser().parse_args([*SEARCH, *extra]), "smollm2-135m", "ffn-grid")

    timed = ["--cost", "latency", "--latency-table"]
    assert folder(*timed, "t/cpu.json") == Path("out/smollm2-135m-ffn-grid-latency-decode-table-cpu")
    assert folder(*timed, "t/gpu.json") == Path("out/smollm2-135m-ffn-grid-latency-decode-table-gpu")
    assert folder("--latency-table", "t/cpu.json") == Path("out/smollm2-135m-ffn-grid-table-cpu")


def test_measured_fronts_of_other_texts_or_table_settings_go_to_other_folders():
    """Every measured run went to out/<model>-<space>-measured-<selection> and rewrote the one before it."""
    from nsc_prune.cli.search import build_parser, default_out_dir

    measured = [*SEARCH, "--score", "measured", "--weights", "w/llama-7b", "--calib", "c/calib.txt"]
    folders = [
        default_out_dir(build_parser().parse_args([*measured, *extra]), "llama-7b", "lonas")
        for extra in (
            [],
            ["--sensitivity-target", "loss"],
            ["--probe-depth", "0", "--calib-dtype", "bfloat16"],
            ["--selection", "magnitude"],  # named once, as the measured run's selection
        )
    ]
    assert folders[0] == Path("out/llama-7b-lonas-measured-activation-calib-calib")
    assert folders[1] == Path("out/llama-7b-lonas-measured-activation-calib-calib-sensitivity-target-loss")
    assert folders[2] == Path("out/llama-7b-lonas-measured-activation-calib-calib-probe-depth-0-bfloat16")
    assert folders[3] == Path("out/llama-7b-lonas-measured-magnitude-calib-calib")
    other_text = [*SEARCH, "--score", "measured", "--weights", "w/llama-7b", "--calib", "code.txt"]
    assert default_out_dir(build_parser().parse_args(other_text), "llama-7b", "lonas").name.endswith("-calib-code")


def test_a_default_folder_name_past_the_file_systems_limit_ends_in_a_digest(tmp_path, monkeypatch, capsys):
    """A 250-character model folder's default out/<model>-lonas failed with 'File name too long', leaving out/."""
    from nsc_prune.cli import main
    from nsc_prune.cli.search import DEFAULT_OUT_NAME_MAX, build_parser, default_out_dir

    args = build_parser().parse_args(SEARCH)
    names = [default_out_dir(args, "x" * 250 + tail, "lonas").name for tail in ("a", "b")]
    assert names[0] != names[1] and all(len(name) == DEFAULT_OUT_NAME_MAX for name in names)
    assert names[0].startswith("x" * 100) and default_out_dir(args, "x" * 100, "lonas").name == "x" * 100 + "-lonas"
    wide = [default_out_dir(args, "模" * 100 + tail, "lonas").name for tail in "ab"]  # 3 bytes a character
    assert wide[0] != wide[1] and all(len(name.encode()) <= DEFAULT_OUT_NAME_MAX for name in wide)
    # a name of letters outside ASCII was dropped: two such models wrote one folder, the second over the first
    assert [default_out_dir(args, m, "lonas").name for m in ("模型一", "模型二")] == ["模型一-lonas", "模型二-lonas"]
    model = tmp_path / ("m" * 250)
    model.mkdir()
    (model / "config.json").write_text((Path(__file__).parent / "fixtures" / "tiny_llama_config.json").read_text())
    monkeypatch.chdir(tmp_path)
    argv = ["--model", str(model), "--space", "ffn-grid", "--set", "ffn_step=16", "--budget", "90%", "--no-plot"]
    assert main(argv) == 0, capsys.readouterr()
    (written,) = (tmp_path / "out").iterdir()
    assert (written / "pareto.json").is_file() and len(written.name) == DEFAULT_OUT_NAME_MAX
