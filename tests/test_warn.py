"""Warnings name the line of the caller's code, however deep in the package they are raised, and say once what
holds for every layer of a file; under ``-W error`` the CLI says one line."""

from __future__ import annotations

import json
import warnings

import pytest

from nsc_prune.cli import main
from nsc_prune.plan import ParetoDocument, layer_plans
from nsc_prune.planning import ScoreSettings


def _caught(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return caught


def test_a_library_warning_names_the_callers_line_whatever_the_route():
    """Hand-counted stacklevels named lines inside nsc_prune (plan.py, a list comprehension) for some routes."""
    layers = [{"ffn": 8, "new_axis": 1}, {"ffn": 4, "new_axis": 2}]
    point = {"params": 1, "macs": 1, "nsc": 1.0, "layers": layers}
    routes = {
        "layer_plans": lambda: layer_plans(layers),
        "ParetoDocument.from_dict": lambda: ParetoDocument.from_dict({"points": [point], "notes": ""}, "a.json"),
        "ScoreSettings": lambda: ScoreSettings("mp"),
    }
    for route, call in routes.items():
        caught = _caught(call)
        assert caught and {(w.filename, w.lineno) for w in caught} == {(__file__, call.__code__.co_firstlineno)}, route
    texts = {str(w.message) for w in _caught(routes["layer_plans"])}
    assert texts == {"the plan's layers: ignoring unknown keys ['new_axis'] (written by a newer nsc-prune?)"}


def test_a_warning_made_an_error_is_one_line_and_exit_2(capsys):
    """``python -W error`` (or PYTHONWARNINGS=error) turned a deprecated spelling into a 30-line traceback, exit 1."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code = main(["--model", "llama-7b", "--budget", "5.7B", "--score", "mp"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("nsc-prune: error: ") and "deprecated" in err


def test_another_librarys_warning_made_an_error_keeps_its_traceback(monkeypatch):
    """Said as nsc-prune's bad input, numpy's "Mean of empty slice" lost where it came from."""
    import numpy as np

    import nsc_prune.cli.search

    monkeypatch.setattr(nsc_prune.cli.search, "_search", lambda args: np.mean([]))
    with warnings.catch_warnings(), pytest.raises(RuntimeWarning, match="Mean of empty slice"):
        warnings.simplefilter("error")
        main(["--model", "llama-7b", "--budget", "5.7B"])


def test_a_latency_tables_unknown_key_is_one_warning_for_all_its_options(tmp_path):
    """One line per layer and option (tens of thousands for a 70B table) once the CLI merged repeated lines."""
    from pathlib import Path

    from nsc_prune.core.latency_table import LatencyTable

    doc = json.loads((Path(__file__).parent / "fixtures" / "latency_table_v1.json").read_text())
    for row in doc["space"]["options"]:
        for option in row:
            option["new_axis"] = 1
    (tmp_path / "lut.json").write_text(json.dumps(doc))
    caught = _caught(lambda: LatencyTable.read(tmp_path / "lut.json"))
    assert len(caught) > 1 and len({str(w.message) for w in caught}) == 1 and caught[0].filename == __file__
    assert str(caught[0].message).startswith(f"{tmp_path / 'lut.json'}: options: ignoring unknown keys ['new_axis']")


@pytest.mark.parametrize("held_before", [["before the step"], []])
def test_warnings_after_the_long_step_started_are_kept_when_an_error_ends_the_command(held_before, monkeypatch, capsys):
    import nsc_prune.cli.search
    from nsc_prune._warn import say_held_warnings, warn
    from nsc_prune.errors import ConfigError

    def failing(args):
        for message in held_before:
            warn(message)
        say_held_warnings()
        warn("during the step")
        raise ConfigError("the step failed")

    monkeypatch.setattr(nsc_prune.cli.search, "_search", failing)
    assert main(["--model", "llama-7b", "--budget", "5.7B"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        *(f"nsc-prune: warning: {message}" for message in held_before),
        "nsc-prune: warning: during the step",
        "nsc-prune: error: the step failed",
    ]


def test_held_warnings_are_said_as_a_long_step_starts_and_each_once(capsys):
    from nsc_prune._warn import say_held_warnings, warn
    from nsc_prune.cli.parser import collected_warnings, print_warnings

    say_held_warnings()  # no command holds any: nothing
    with collected_warnings() as held:
        warn("about the inputs")
        say_held_warnings()  # training or an evaluation starts
        assert capsys.readouterr().err == "nsc-prune: warning: about the inputs\n"
        warn("about the inputs")
        warn("about the step")
        print_warnings(held)  # as the command ends
    assert capsys.readouterr().err == "nsc-prune: warning: about the step\n"
