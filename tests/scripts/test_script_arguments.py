"""The scripts' arguments are checked before any slow step: a bad one exits 2 in one line and writes nothing."""

from __future__ import annotations

import argparse
import sys

import pytest

from nsc_prune._files import RECORD_NAME
from nsc_prune.cli.parser import nonnegative_int, percent_list, positive_int, positive_number
from tests.conftest import load_script


@pytest.mark.parametrize(
    "kind, text",
    [
        (positive_int, "0"),
        (positive_int, "1.5"),
        (nonnegative_int, "-1"),
        (positive_number, "nan"),
        (positive_number, "inf"),
        (percent_list, "90,100"),  # the full model is no budget to study
        (percent_list, "0,80"),
    ],
)
def test_the_count_and_size_types_refuse_what_they_cannot_be(kind, text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be "):
        kind(text)
    assert (positive_int("3"), nonnegative_int("0"), positive_number("2.5")) == (3, 0, 2.5)
    assert percent_list("99,1") == [99, 1]


@pytest.mark.parametrize(
    "script, argv, message",
    [
        ("bench_heal", ["--steps", "0"], "--steps: must be a whole number >= 1"),  # no median of no steps
        ("bench_heal", ["--cached-top-k", "-5"], "--cached-top-k: must be a whole number >= 0"),
        ("bench_train", ["--random", "-3"], "--random: must be a whole number >= 0"),  # named --sandwich-random
        ("bench_scale", ["--shard-gb", "0"], "--shard-gb: must be a finite number > 0"),
        ("bench_extract", ["--shards", "0"], "--shards: must be a whole number >= 1"),  # a ZeroDivisionError
        ("bench_extract", ["--size-gb", "-1"], "--size-gb: must be a finite number > 0"),  # built 0.35 GB, "PASS"
        ("reproduce_marginal_gain", ["--std", "1e-320"], "--std 1e-320 is too small"),  # a table of nan
        ("reproduce_marginal_gain", ["--std", "1e-8"], "below float64's resolution"),  # a verdict of rounding noise
        ("study_distill_smollm2", ["--out", "x", "--budget", "bogus"], "cannot read budget 'bogus'"),  # after minutes
        # It named --allow-above-full, a flag the study does not have.
        ("study_distill_smollm2", ["--out", "x", "--budget", "120%"], "at most the full model's 134.515M params"),
        # Each of these was read only after minutes of work, then failed in a traceback.
        ("bench_latency", ["--group", "0"], "--group: must be a whole number >= 1"),  # range() arg 3 is zero
        ("bench_latency", ["--repeats", "0"], "--repeats: must be a whole number >= 1"),
        # The profile's own type flags: --dtype q8_0 named --outtype, a flag the script did not have.
        ("bench_latency", ["--dtype", "q8_0"], "use --outtype q8_0 (with --backend llama.cpp)"),
        ("bench_latency", ["--backend", "llama.cpp", "--dtype", "float16"], "use --outtype f16"),
        ("study_sensitivity_smollm2", ["--tokens", "0"], "--tokens: must be a whole number >= 1"),  # "no tokens"
        ("study_recovery_budget", ["--out", "x", "--steps", "0"], "--steps: must be a whole number >= 1"),
        ("study_recovery_budget", ["--out", "x", "--budgets", "5%"], "--budget must be at least"),
        # 0 read as "not given": the whole recipe grid ran instead
        ("study_recovery_budget", ["--out", "x", "--super-adapter-minutes", "0"], "must be a finite number > 0"),
        ("bench_sensitivity", ["--probe-stride", "0"], "--probe-stride: must be a whole number >= 1"),
        ("study_smollm2", ["--budgets", "abc"], "--budgets: must be whole percents in 1..99"),
        ("compare_peers_smollm2", ["--budgets", "abc"], "--budgets: must be whole percents in 1..99"),
        ("compare_peers_smollm2", ["--methods", "bogus"], "--methods: unknown ['bogus']"),  # exit 1, no "error:"
        # Each was read after the conversion, the dense evaluation and the searches (a ZeroDivisionError, or a run)
        ("compare_peers_smollm2", ["--heal-seq-len", "0"], "--heal-seq-len: must be a whole number >= 1"),
        ("compare_peers_smollm2", ["--tokens", "-1"], "--tokens: must be a whole number >= 1"),
        ("compare_peers_smollm2", ["--sensitivity-shrink", "nan"], "--sensitivity-shrink must be in [0, 1]; got nan"),
        ("bench_scale", ["--budget", "abc"], "cannot read budget 'abc'"),  # after building a 13.5 GB base
        ("reproduce_marginal_gain", ["--std", "1e308"], "is too large"),  # a table of nan, and a verdict
        ("bench_extract", ["--size-gb", "1e6"], "GB free, but a 1e+06 GB base"),  # failed once the disk was full
    ],
)
def test_a_bad_argument_exits_2_naming_it(script, argv, message, monkeypatch, capsys):
    module = load_script(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv) if script == "study_distill_smollm2" else module.main()
    assert exit_info.value.code == 2 and message in capsys.readouterr().err.replace("9.99989e-321", "1e-320")


def test_bench_scale_never_takes_a_folder_that_holds_files(tmp_path, monkeypatch, capsys):
    root = tmp_path / "root"
    root.mkdir()
    (root / "mine.txt").write_text("mine")  # was deleted with the folder at the end of the run
    monkeypatch.setattr(sys, "argv", ["bench_scale.py", "--root", str(root), "--layers", "1"])
    with pytest.raises(SystemExit) as exit_info:
        load_script("bench_scale").main()
    assert exit_info.value.code == 2 and "must be a new or empty folder" in capsys.readouterr().err
    assert (root / "mine.txt").read_text() == "mine"


def test_a_bench_json_that_exists_is_kept(tmp_path, monkeypatch, capsys):
    out = tmp_path / "numbers.json"
    out.write_text("mine")
    monkeypatch.setattr(sys, "argv", ["bench_heal.py", "--json", str(out)])
    with pytest.raises(SystemExit) as exit_info:
        load_script("bench_heal").main()
    assert exit_info.value.code == 2 and "already exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_text() == "mine"


def test_bench_speed_reads_its_budgets_and_out_before_it_makes_a_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script("bench_speed").main(["--out", str(tmp_path / "bs"), "--budgets", "abc"])
    assert exit_info.value.code == 2 and "whole percents in 1..99" in capsys.readouterr().err
    assert not (tmp_path / "bs").exists()
    (tmp_path / "results.json").write_text("mine")  # a FileExistsError traceback
    with pytest.raises(SystemExit) as exit_info:
        load_script("bench_speed").main(["--out", str(tmp_path / "results.json")])
    assert exit_info.value.code == 2 and "is a file; name the folder" in capsys.readouterr().err


@pytest.mark.parametrize(("script", "name"), [("bench_speed", "speed.md"), ("bench_latency", "lut.json")])
def test_a_bench_s_results_of_an_earlier_run_are_kept_unless_overwrite(tmp_path, capsys, monkeypatch, script, name):
    """``bench_speed.py --out docs`` replaced docs/speed.md with the run's table, without a word, after the run."""
    module = load_script(script)
    ran = []
    if script == "bench_speed":
        monkeypatch.setattr(module, "run", lambda args: ran.append(args) or 0)
    arguments = module.parse_args if script == "bench_latency" else module.main  # checked before any work
    (tmp_path / name).write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        arguments(["--out", str(tmp_path)])
    assert exit_info.value.code == 2 and f"{tmp_path / name} already exists" in capsys.readouterr().err
    assert (tmp_path / name).read_text() == "mine" and not ran
    assert arguments(["--out", str(tmp_path), "--overwrite"]) is not None


def test_bench_speed_refuses_an_out_whose_variant_folder_it_did_not_write(tmp_path, capsys):
    """A folder named like a variant was measured as one, then removed with the user's files in it."""
    mine = tmp_path / "bs" / "uniform-80"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        load_script("bench_speed").main(["--out", str(tmp_path / "bs"), "--budgets", "90,80"])
    assert exit_info.value.code == 2 and f"--out holds {mine}, which nsc-prune extract did not write" in (
        capsys.readouterr().err
    )
    assert (mine / "notes.txt").read_text() == "mine"
    bench_speed = load_script("bench_speed")
    assert bench_speed.variant_names([90, 80]) == ["dense", "nsc-90", "uniform-90", "nsc-80", "uniform-80"]
    (mine / RECORD_NAME).write_text("{}")  # an earlier run's checkpoint, kept with --keep: reused
    assert bench_speed.foreign_outputs(tmp_path / "bs", [90, 80], ["f16"]) == []


def test_bench_speed_refuses_an_out_whose_variant_gguf_it_did_not_write(tmp_path, capsys):
    """A file named like a variant's GGUF was loaded as one, then deleted."""
    gguf = pytest.importorskip("gguf")
    from nsc_prune.hf.export.gguf_file import RECORD_KEY

    mine = tmp_path / "bs" / "nsc-80-q8_0.gguf"
    mine.parent.mkdir()
    mine.write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        load_script("bench_speed").main(["--out", str(tmp_path / "bs"), "--budgets", "80"])
    assert exit_info.value.code == 2 and f"--out holds {mine}, which nsc-prune extract did not write" in (
        capsys.readouterr().err
    )
    assert mine.read_text() == "mine"
    bench_speed = load_script("bench_speed")
    assert bench_speed.foreign_outputs(tmp_path / "bs", [80], ["f16"]) == []  # not a type this run writes
    writer = gguf.GGUFWriter(mine, "llama")  # an earlier run's, kept with --keep: it holds extract's record
    writer.add_string(RECORD_KEY, "{}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert bench_speed.foreign_outputs(tmp_path / "bs", [80], ["q8_0"]) == []


@pytest.mark.parametrize("script", ["reproduce_init_robustness", "bench_families"])
def test_a_benchmarks_folder_given_but_missing_is_an_error_not_a_skip(script, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--benchmarks", str(tmp_path / "nowhere")])
    assert load_script(script).main() == 2
    assert "--benchmarks must name the folder that holds autoformer_tiny_1001.json" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["study_distill_smollm2", "study_recovery_smollm2"])
def test_a_study_out_must_be_a_new_or_empty_folder(script, tmp_path, monkeypatch, capsys):
    """study_distill's own second usage line (the first's --out again) failed after a minute, naming a flag it
    lacks; an empty folder was refused by the other."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    cases = {"full": "exists and is not empty", "file": "is a file", "file/x": "is below the file"}
    for out, message in cases.items():
        monkeypatch.setattr(sys, "argv", [f"{script}.py", "--out", str(tmp_path / out)])
        with pytest.raises(SystemExit) as exit_info:
            load_script(script).parse_args(*([None] if script == "study_distill_smollm2" else []))
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--out", str(tmp_path / "empty")])
    assert load_script(script).parse_args(*([None] if script == "study_distill_smollm2" else [])).out


def test_study_smollm2_keeps_an_earlier_runs_rows(tmp_path, monkeypatch, capsys):
    """Every start emptied rows.jsonl, the file that keeps what an interrupted run measured."""
    (tmp_path / "rows.jsonl").write_text('{"budget": 80}\n')
    with pytest.raises(SystemExit) as exit_info:
        load_script("study_smollm2").parse_args(["--out", str(tmp_path), "--quick"])
    assert exit_info.value.code == 2 and "rows.jsonl already exists; pass --overwrite" in capsys.readouterr().err
    args = load_script("study_smollm2").parse_args(
        ["--out", str(tmp_path), "--quick", "--budgets", "70", "--overwrite"]
    )
    assert (args.budgets, args.random, args.calib_tokens) == ([70], 2, 1024)  # a flag given wins over --quick


def test_study_sensitivity_keeps_an_earlier_result(tmp_path, monkeypatch, capsys):
    """A rerun replaced study.json (or windows.json ...) without a word."""
    (tmp_path / "windows.json").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        load_script("study_sensitivity_smollm2").main(["--out", str(tmp_path), "--windows", "2"])
    assert exit_info.value.code == 2 and "windows.json already exists; pass --overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["windows.json"]
