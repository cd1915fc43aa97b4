"""One rule for an existing output (docs/outputs.md, ``nsc_prune._io.check_output``), here for the search; the
other commands test it beside their own tests (test_extract, test_heal, test_evaluate, test_profile,
test_supernet)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nsc_prune._io import check_output, check_work_dir
from nsc_prune.cli import main
from nsc_prune.errors import InvalidInputError
from tests.conftest import as_rank_alone

SEARCH = ["--model", "smollm2-135m", "--space", "ffn-grid", "--no-plot"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_search_into_an_out_with_pareto_json_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*SEARCH, "--budget", "80%", "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    before = _snapshot(out)
    capsys.readouterr()
    assert main([*SEARCH, "--budget", "90%", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pareto.json already exists; pass --overwrite" in err, err
    assert _snapshot(out) == before  # nothing replaced
    assert main([*SEARCH, "--budget", "90%", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "pareto.json").read_text())["budget"]["requested"] == "90%"
    assert (out / "notes.txt").read_text() == "mine"  # --overwrite replaces the search's files only


def test_an_out_without_pareto_json_is_written_without_overwrite(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main([*SEARCH, "--budget", "80%", "--out", str(out)]) == 0
    assert (out / "pareto.json").is_file() and (out / "notes.txt").read_text() == "mine"


def test_the_default_folder_is_rewritten_so_the_first_command_runs_twice(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--model", "llama-7b", "--budget"]
    assert main([*argv, "5.7B"]) == 0
    written = tmp_path / "out" / "llama-7b-lonas" / "pareto.json"
    assert json.loads(written.read_text())["budget"]["requested"] == "5.7B"
    assert main([*argv, "5.5B"]) == 0
    assert json.loads(written.read_text())["budget"]["requested"] == "5.5B"


@pytest.mark.parametrize("overwrite", [False, True])
def test_the_rule_for_a_folder_output(tmp_path, overwrite):
    """A folder: new or empty is fine; an existing one needs overwrite and must hold the command's record."""
    folder = tmp_path / "ckpt"
    check_output(folder, overwrite=overwrite, marker="record.json")  # new
    folder.mkdir()
    check_output(folder, overwrite=overwrite, marker="record.json")  # empty counts as new
    (folder / "record.json").write_text(json.dumps({"provenance": {"nsc_prune_version": "0.1.0"}}))
    if overwrite:
        check_output(folder, overwrite=True, marker="record.json")
    else:
        with pytest.raises(InvalidInputError, match="already exists; pass --overwrite to replace it"):
            check_output(folder, overwrite=False, marker="record.json")
    (folder / "record.json").unlink()
    (folder / "theirs.txt").write_text("x")
    with pytest.raises(InvalidInputError, match="other files"):  # said at once, not "pass --overwrite" first
        check_output(folder, overwrite=overwrite, marker="record.json")
    with pytest.raises(InvalidInputError, match="must not be or contain an input"):
        check_output(tmp_path, [folder / "theirs.txt"], overwrite=True, marker="record.json")


def test_overwrite_keeps_a_folder_holding_files_its_record_does_not_list(tmp_path):
    """A record that lists what the command wrote (``files``: extract's and heal's) lets --overwrite replace the
    folder only while it holds nothing else: a file of yours, or a GGUF extracted into it later, is not deleted."""
    from nsc_prune._io import WRITTEN_FILES_KEY, written_files

    folder = tmp_path / "ckpt"
    (folder / "adapter").mkdir(parents=True)
    (folder / "adapter" / "w.safetensors").write_text("x")
    (folder / "config.json").write_text("{}")
    listed = written_files(folder, "record.json")
    assert listed == ["adapter/w.safetensors", "config.json", "record.json"]
    ours = {"provenance": {"nsc_prune_version": "0.1.0"}}
    (folder / "record.json").write_text(json.dumps({**ours, WRITTEN_FILES_KEY: listed}))
    check_output(folder, overwrite=True, marker="record.json")
    (folder / "mine.txt").write_text("x")
    (folder / "adapter" / "notes.md").write_text("x")
    for overwrite in (True, False):  # without --overwrite too: "pass --overwrite" first sent the user twice
        with pytest.raises(InvalidInputError, match="also holds adapter/notes.md, mine.txt, which it would delete"):
            check_output(folder, overwrite=overwrite, marker="record.json")
    (folder / "record.json").write_text(json.dumps(ours))  # an older record, without the list: as before
    check_output(folder, overwrite=True, marker="record.json")
    for theirs in (
        "{}",
        '{"accuracy": 0.93}',
        "[1]",
        "not json",
        "[" * 100_000 + "]" * 100_000,
    ):  # not written by nsc-prune
        (folder / "record.json").write_text(theirs)  # was taken as the command's: eval deleted the folder
        for overwrite in (True, False):
            with pytest.raises(InvalidInputError, match="record.json was not written by nsc-prune .* would delete"):
                check_output(folder, overwrite=overwrite, marker="record.json")


def test_the_rule_for_a_file_output(tmp_path):
    table = tmp_path / "lut.json"
    check_output(table, marker=None)
    table.write_text("{}")
    with pytest.raises(InvalidInputError, match="lut.json already exists; pass --overwrite"):
        check_output(table, marker=None)
    check_output(table, overwrite=True, marker=None)
    with pytest.raises(InvalidInputError, match="is a folder; name the file"):
        check_output(tmp_path, overwrite=True, marker=None)


def test_the_search_never_writes_over_a_file_it_reads(tmp_path, capsys):
    """A config.json read as --model that sits where pareto.json goes is refused even with --overwrite."""
    config = tmp_path / "pareto.json"
    config.write_text((Path(__file__).resolve().parents[2] / "nsc_prune/configs/models/smollm2-135m.json").read_text())
    before = config.read_text()
    assert main(["--model", str(config), "--budget", "80%", "--out", str(tmp_path), "--overwrite", "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must not be or contain an input" in err, err
    assert config.read_text() == before


def test_an_out_in_a_folder_that_cannot_be_written_is_refused_before_the_work(tmp_path, capsys, monkeypatch):
    """A read-only mount failed only when the output was written: eval and profile then lost their results."""
    locked = tmp_path / "ro"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != locked and real(path, mode, **kw))
    capsys.readouterr()
    assert main([*SEARCH, "--budget", "80%", "--out", str(locked / "run" / "s80")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"nsc-prune: error: --out {locked / 'run' / 's80' / 'pareto.json'}: cannot write in {locked} (read-only, or not yours); choose another --out"
    )
    with pytest.raises(InvalidInputError, match="cannot write in"):
        check_output(locked / "lut.json", marker=None)
    for work in (locked / "w", locked):  # a training state folder to make there, or to write in: heal failed later
        with pytest.raises(InvalidInputError, match=rf"--work-dir {work}: cannot write in {locked} \(read-only"):
            check_work_dir(work, (), own=("checkpoints",))
    assert list(locked.iterdir()) == []


def test_a_mount_point_out_is_refused_before_the_work(tmp_path, monkeypatch):
    """`--out /out` on a container's volume passed every check (an empty folder is new), then the publish could not
    rename over it (EBUSY) after the work, leaving an empty .out.*.old beside it; heal's --resume failed alike."""
    volume = tmp_path / "out"
    volume.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == volume)
    with pytest.raises(InvalidInputError, match=r"--out \S+/out is a mount point, .*name a folder inside it, e\.g\."):
        check_output(volume, (), False, marker="nsc_prune_extract.json")
    check_output(volume / "ckpt", (), False, marker="nsc_prune_extract.json")  # a folder inside it is fine


def test_an_out_name_too_long_for_its_temporary_is_refused_before_the_work(tmp_path):
    """A legal name of 240 bytes failed only when written: the hidden temporary beside it adds 24."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    long_file = tmp_path / ("t" * (limit - 10) + ".json")
    with pytest.raises(InvalidInputError, match=rf"\({limit - 5} bytes\) is too long here \(at most {limit - 24}"):
        check_output(long_file, marker=None)
    check_output(tmp_path / ("t" * (limit - 30) + ".json"), marker=None)
    assert list(tmp_path.iterdir()) == []
    search_out = tmp_path / ("d" * (limit - 10))  # a folder of a long name: only its pareto.json gets a temporary
    assert main([*SEARCH, "--budget", "80%", "--out", str(search_out)]) == 0 and (search_out / "pareto.json").is_file()


def test_a_pareto_json_made_while_the_search_ran_is_kept(tmp_path, monkeypatch, capsys):
    """--out is checked before the search (a measured table can take hours) and again when the front is written."""
    import nsc_prune.cli.search as search_cli

    searched = search_cli._search

    def search_while_a_file_appears(args):
        found = searched(args)
        (tmp_path / "out" / "pareto.json").write_text("mine")
        return found

    (tmp_path / "out").mkdir()
    monkeypatch.setattr(search_cli, "_search", search_while_a_file_appears)
    capsys.readouterr()
    assert main(["--model", "llama-7b", "--budget", "5.7B", "--out", str(tmp_path / "out"), "--no-plot"]) == 2
    assert "pareto.json was created while this command ran" in capsys.readouterr().err
    assert (tmp_path / "out" / "pareto.json").read_text() == "mine"
    assert json.loads((tmp_path / "out" / "pareto.json.kept-1").read_text())["budget"]["requested"] == "5.7B"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_stop_is_said_by_rank_0_alone(rank, tmp_path, monkeypatch, capsys):
    """A launcher's Ctrl-C or SIGTERM stops every rank, and each printed the same stop line."""
    import nsc_prune.cli.search as search_cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(search_cli, "_search", interrupted)
    as_rank_alone(monkeypatch, rank)
    capsys.readouterr()
    assert main(["--model", "llama-7b", "--budget", "5.7B", "--out", str(tmp_path / "out")]) == 130
    err = capsys.readouterr().err
    assert ("interrupted; nothing was written" in err) == (rank == "0") and (rank == "0" or err == ""), err


@pytest.mark.parametrize(
    "space, cost, label",
    [
        ("autoformer-tiny", "macs", "plan MACs (per 224x224 image)"),  # its note's reason ran off the figure
        ("smollm2-135m", "latency", "plan latency (us, the table's prediction)"),  # said "(@ 256 tokens)"
    ],
)
def test_the_plot_s_cost_axis_says_what_the_cost_counts(tmp_path, monkeypatch, space, cost, label):
    figure_module = pytest.importorskip("matplotlib.figure")
    from nsc_prune.core.front import LayerCosts, search
    from nsc_prune.plot import write_plot
    from nsc_prune.presets import resolve_model
    from nsc_prune.spaces.registry import build_space

    if cost == "latency":
        built = build_space("ffn-grid", resolve_model(space).config, ffn_step=512)
        layers = tuple(tuple(10 + j for j in range(len(options))) for options in built.subspaces[0].layers)
        result = search(built, cost="latency", latency=LayerCosts(fixed=100, layers=layers))
    else:
        result = search(build_space(space), cost=cost)
    figures = []
    monkeypatch.setattr(figure_module.Figure, "savefig", lambda figure, *args, **kw: figures.append(figure))
    write_plot(result, len(result.points) - 1, tmp_path / "pareto.png")  # an empty file: nothing drawn
    assert [ax.get_xlabel() for ax in figures[0].axes[:2]] == [label, label]


def test_a_character_stdout_cannot_encode_is_escaped_not_a_traceback(tmp_path):
    """On Windows a pipe or file takes cp1252: a search whose --out (or model folder) had a character cp1252 lacks
    wrote its outputs, then ended in a UnicodeEncodeError traceback (exit 1) before printing its plan."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONIOENCODING": "cp1252", "PYTHONUTF8": "0"}
    out = tmp_path / "ψ-run"
    argv = [sys.executable, "-m", "nsc_prune", "--model", "llama-7b", "--budget", "80%", "--out", str(out), "--no-plot"]
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    assert b"\\u03c8-run" in done.stdout and (out / "pareto.json").is_file(), done.stdout
