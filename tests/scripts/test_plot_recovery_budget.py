"""scripts/plot_recovery_budget.py on a tiny results JSON written here (2 recipes x 2 step counts at one budget)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_script

pytest.importorskip("matplotlib")

DENSE = {"docstrings": 13.0, "prose": 34.0, "code": 5.2}
PRUNED = {"docstrings": 18.6, "prose": 69.8, "code": 9.0}


@pytest.fixture(scope="module")
def plot():
    return load_script("plot_recovery_budget")


def write_results(path: Path, rows: list[dict]) -> Path:
    path.write_text(
        json.dumps({"dense": DENSE, "pruned": {"80%": PRUNED}, "params": {"80%": 107_530_560}, "rows": rows})
    )
    return path


def row(recipe: str, steps: int, gain: float) -> dict:
    healed = {domain: value * (1 - gain) for domain, value in PRUNED.items()}
    return {"budget": "80%", "recipe": recipe, "steps": steps, "tokens": steps * 1024, "seconds": steps * 5.0, **healed}


def test_main_writes_a_png(plot, tmp_path, capsys):
    rows = [row(name, steps, gain * steps / 20) for name, gain in (("a", 0.1), ("b", 0.2)) for steps in (20, 6)]
    results = write_results(tmp_path / "budget.json", rows)
    out = tmp_path / "tmp" / "x.png"
    assert plot.main(["--results", str(results), "--out", str(out), "--tokens-per-s", "200"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.strip() == str(out)
    assert [p.name for p in out.parent.iterdir()] == ["x.png"]  # no temporary file left beside it


def test_results_without_rows_are_refused(plot, tmp_path, capsys):
    results = write_results(tmp_path / "budget.json", [])
    out = tmp_path / "x.png"
    assert plot.main(["--results", str(results), "--out", str(out), "--tokens-per-s", "200"]) == 2
    assert "has no rows: run scripts/study_recovery_budget.py first" in capsys.readouterr().err
    assert not out.exists()


def test_an_existing_figure_or_the_results_themselves_are_never_replaced_silently(plot, tmp_path, capsys):
    results = write_results(tmp_path / "budget.json", [row("a", 20, 0.1)])
    before = results.read_text()
    for out in (results, tmp_path / "mine.png"):  # the results were overwritten by a PNG
        (tmp_path / "mine.png").write_text("mine")
        with pytest.raises(SystemExit) as exit_info:
            plot.main(["--results", str(results), "--out", str(out), "--tokens-per-s", "200"])
        assert exit_info.value.code == 2
    assert results.read_text() == before and (tmp_path / "mine.png").read_text() == "mine"
    argv = ["--results", str(results), "--out", str(tmp_path / "mine.png"), "--tokens-per-s", "200", "--overwrite"]
    assert plot.main(argv) == 0 and (tmp_path / "mine.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "results, message",
    [("[1, 2]", "must hold a JSON object"), ('{"rows": [{"x": 1}]}', "every row must be an object with budget")],
)
def test_results_of_another_shape_are_one_line(plot, tmp_path, capsys, results, message):
    (tmp_path / "r.json").write_text(results)
    argv = ["--results", str(tmp_path / "r.json"), "--out", str(tmp_path / "x.png"), "--tokens-per-s", "200"]
    assert plot.main(argv) == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plot.main([*argv[:-1], "nan"])  # drew an axis of NaN


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda doc: doc["rows"][0].update(budget=["80%"]), "recipe and budget must be strings"),  # unhashable
        (lambda doc: doc["dense"].pop("prose"), "perplexities must be numbers for docstrings, prose, code"),  # KeyError
    ],
)
def test_results_that_cannot_be_drawn_are_one_line(plot, tmp_path, capsys, spoil, message):
    results = write_results(tmp_path / "budget.json", [row("a", 20, 0.1)])
    doc = json.loads(results.read_text())
    spoil(doc)
    results.write_text(json.dumps(doc))
    assert plot.main(["--results", str(results), "--out", str(tmp_path / "x.png"), "--tokens-per-s", "200"]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "x.png").exists()


def test_recipes_pick_their_rows_and_an_unknown_or_unmeasured_one_is_refused(plot, tmp_path):
    from nsc_prune.errors import InvalidInputError

    results = write_results(tmp_path / "budget.json", [row("a", 20, 0.1), row("b", 20, 0.2)])
    assert [r["recipe"] for r in plot.load_rows(results, ["b"])[1]] == ["b"]
    with pytest.raises(InvalidInputError, match=r"no rows of recipes \['c'\]; it has \['a', 'b'\]"):
        plot.load_rows(results, ["c"])
    doc = json.loads(results.read_text())
    results.write_text(json.dumps(doc | {"pruned": {}}))  # a KeyError while drawing
    with pytest.raises(InvalidInputError, match=r"lacks the dense model's or the pruned \['80%'\] perplexities"):
        plot.load_rows(results, None)


def test_each_recipe_runs_from_the_pruned_model_at_0_tokens_in_step_order(plot, tmp_path):
    from nsc_prune.plot import require_matplotlib

    plt = require_matplotlib()
    rows = [row("a", 20, 0.2), row("a", 6, 0.1)]
    summary = json.loads(write_results(tmp_path / "budget.json", rows).read_text())
    fig = plot.draw(summary, rows, 200.0)
    lines = {line.get_label(): line for line in fig.axes[1].get_lines()}  # docstrings, prose, code
    plt.close(fig)
    assert list(lines["a"].get_xdata()) == [0.0, 6.144, 20.48]  # thousands of training tokens
    assert list(lines["a"].get_ydata()) == pytest.approx(
        [PRUNED["prose"], PRUNED["prose"] * 0.9, PRUNED["prose"] * 0.8]
    )
    assert lines["dense"].get_ydata()[0] == DENSE["prose"]
    assert lines["1.35x dense"].get_ydata()[0] == pytest.approx(1.35 * DENSE["prose"])
