"""``--cost latency`` without torch: a measured table is the DP's cost (brute force agrees), latency budgets are
read in time units, the table is checked and refused for another model or space, and pareto.json keeps it."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from nsc_prune.cli import main
from nsc_prune.core.budget import format_cost, parse_budget
from nsc_prune.core.front import search
from nsc_prune.core.latency_table import (
    LatencyTable,
    model_fingerprint,
    predicted_seconds,
    space_options,
    usable_cpus,
)
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.plan import ParetoDocument
from nsc_prune.planning import LatencySettings, search_plan
from nsc_prune.presets import resolve_model
from nsc_prune.spaces.registry import build_space

LAYERS = 4


@pytest.fixture
def model_dir(tmp_path):
    """A 4-layer SmolLM2-shaped config (hidden 576, FFN 1536: 4 widths a layer on ffn-grid, 256 plans)."""
    config = dict(resolve_model("smollm2-135m").config, num_hidden_layers=LAYERS)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def synthetic_table(space, config, seed: int = 0) -> LatencyTable:
    """Random seconds per option; narrower options are not always faster (the DP must not assume it)."""
    rng = np.random.default_rng(seed)
    options = space_options(space)
    layers = tuple(
        tuple({"decode": float(rng.uniform(1e-3, 3e-3)), "prefill": float(rng.uniform(0.01, 0.03))} for _ in row)
        for row in options
    )
    return LatencyTable(
        model={"name": "test", "fingerprint": model_fingerprint(config)},
        space={"name": space.name, "description": space.description, "options": options},
        fixed={"decode": 0.004, "prefill": 0.05},
        layers=layers,
        backend={"name": "transformers", "device": "cpu", "dtype": "float32"},
    )


@pytest.fixture
def table_file(tmp_path, model_dir):
    model = resolve_model(str(model_dir))
    space = build_space("ffn-grid", model.config)
    path = tmp_path / "lut.json"
    synthetic_table(space, model.config).write(path)
    return path


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_latency_dp_equals_brute_force(model_dir, table_file, phase):
    model = resolve_model(str(model_dir))
    space = build_space("ffn-grid", model.config)
    table = LatencyTable.read(table_file)
    costs = table.costs(phase)
    result = search(space, cost="latency", latency=costs)
    options = space.subspaces[0].layers
    plans = list(itertools.product(*(range(len(row)) for row in options)))
    value = {p: sum(options[l][j].nsc for l, j in enumerate(p)) for p in plans}
    cost = {p: costs.fixed + sum(costs.layers[l][j] for l, j in enumerate(p)) for p in plans}
    for point in result.points:  # every point's latency is its plan's, in integer microseconds
        assert point.latency_us == cost[point.options]
        # each option was rounded to a microsecond
        assert abs(point.latency_us - 1e6 * predicted_seconds(table, point.options, phase)) <= LAYERS + 1
    predicted = [predicted_seconds(table, p, phase) for p in plans]
    assert table.fastest_seconds(phase) == pytest.approx(min(predicted), rel=1e-12)
    # the widest plan, first; in the DP's whole microseconds, what the search's percentages are of
    assert table.full_us(phase) == cost[plans[0]] == result.points[-1].latency_us
    for budget in np.linspace(min(cost.values()), max(cost.values()), 25).astype(int):
        best = max(value[p] for p in plans if cost[p] <= budget)
        chosen = result.points[result.index_under(int(budget))]
        assert chosen.latency_us <= budget
        assert math.isclose(chosen.nsc, best, rel_tol=1e-9)


def test_latency_search_writes_the_table_record_and_extract_selects_by_time(model_dir, table_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([
        "--model", str(model_dir), "--space", "ffn-grid", "--cost", "latency", "--latency-table", str(table_file),
        "--budget", "85%", "--out", str(out), "--no-plot",
    ]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    doc = ParetoDocument.read(out)
    point = doc.points[doc.selected]
    assert doc.cost["kind"] == "latency" and doc.cost["phase"] == "decode"
    assert doc.cost["latency_table"]["path"] == str(table_file.resolve())
    assert doc.budget["resolved"] == round(0.85 * doc.points[-1].latency_us)
    assert point.latency_us <= doc.budget["resolved"] < doc.points[doc.selected + 1].latency_us
    assert f"predicted decode latency {format_cost(point.latency_us, 'latency')}" in printed
    # extraction reads a latency budget the same way, on the stored points
    budget_us = (point.latency_us + doc.points[doc.selected + 1].latency_us) // 2
    assert doc.select(budget=f"{budget_us / 1000}ms") == doc.selected


@pytest.mark.parametrize(
    ("backend", "said"),
    [(None, "backend not recorded"), ({}, "backend not recorded"), ({"name": "mine"}, "mine on ?, ?")],
    ids=["absent", "empty", "name-only"],
)
def test_a_table_that_does_not_record_its_backend_is_searched_and_said_so(
    model_dir, table_file, tmp_path, capsys, backend, said
):
    """The backend record is optional in a table; the search once wrote pareto.json, then failed printing it."""
    data = json.loads(table_file.read_text())
    data.pop("backend") if backend is None else data.update(backend=backend)
    table_file.write_text(json.dumps(data))
    argv = ["--model", str(model_dir), "--space", "ffn-grid", "--cost", "latency", "--latency-table", str(table_file)]
    assert main([*argv, "--budget", "85%", "--out", str(tmp_path / "out"), "--no-plot"]) == 0
    assert f"; {said}, table {table_file})" in capsys.readouterr().out


def test_latency_budget_strings():
    assert parse_budget("25ms", kind="latency") == 25_000
    assert parse_budget("0.4s", kind="latency") == 400_000
    assert parse_budget("900us", kind="latency") == 900
    assert parse_budget("70%", full=10_000, kind="latency") == 7_000
    for bad in ("5B", "25", "ms", "-3ms"):
        with pytest.raises(InvalidInputError, match="latency budget"):
            parse_budget(bad, kind="latency")
    assert format_cost(23_456, "latency") == "23.5 ms" and format_cost(1_500_000, "latency") == "1.500 s"


@pytest.mark.parametrize(
    ("value", "kind", "text"),
    [
        (999_700, "latency", "1.000 s"),  # was "1e+03 ms"
        (999_400, "latency", "999 ms"),
        (999.6, "latency", "1 ms"),  # was "1000 us"
        (999.4, "latency", "999 us"),
        (999_999_999, "params", "1.000B"),  # was "1000.000M"
        (999_999_499, "params", "999.999M"),
        (999_999, "params", "999.999K"),
        (134_515_008, "params", "134.515M"),
        (999, "params", "999"),
        (float("nan"), "latency", "nan us"),  # as before: a comparison, not round(), decides the unit
    ],
)
def test_a_cost_that_rounds_up_to_the_next_unit_is_written_in_it(value, kind, text):
    assert format_cost(value, kind) == text


def test_a_table_for_another_model_or_space_is_refused(model_dir, table_file, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(config, intermediate_size=1280)))
    cases = {
        (str(other), "ffn-grid"): "was profiled for model 'test'",
        (str(model_dir), "ffn-heads"): "was profiled for space",
    }
    for (model, space), message in cases.items():
        out = tmp_path / f"out-{space}"
        code = main([
            "--model", model, "--space", space, "--cost", "latency", "--latency-table", str(table_file),
            "--budget", "90%", "--out", str(out),
        ])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1
        assert not out.exists()


def test_a_table_fits_a_model_of_the_same_shapes_whatever_its_init_std(model_dir, tmp_path):
    """The preset of SmolLM2 (init std 0.0417) and its prepared folder (0.02) have one speed: a table of one was
    refused for the other. A table written before, whose fingerprint held the init std, still fits its model."""
    config = json.loads((model_dir / "config.json").read_text())
    space = build_space("ffn-grid", config)
    table = synthetic_table(space, config)
    assert config["initializer_range"] != 0.02
    table.check_fits(space, dict(config, initializer_range=0.02), "t.json")
    older = dataclasses.replace(table, model={"name": "test", "fingerprint": model_fingerprint(config, with_init=True)})
    older.check_fits(space, config, "t.json")
    with pytest.raises(ConfigError, match="was profiled for model 'test'"):
        older.check_fits(space, dict(config, intermediate_size=1280), "t.json")
    edited = dataclasses.replace(table, space={**table.space, "options": [row[::-1] for row in table.space["options"]]})
    with pytest.raises(ConfigError, match="option list differs from space 'ffn-grid' .* though it names the same"):
        edited.check_fits(space, config, "t.json")


def _full_model_at_0_us(table: dict) -> None:
    table["fixed"]["decode"] = 0.0
    for row in table["layers"]:
        for option in row:
            option["decode"] = 1e-8  # under half a microsecond: 0 in the DP's units


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.update(schema_version=9), "schema_version 9"),
        (lambda t: t["layers"][1].pop(), "layer 1 must time each of its 4 options"),
        (lambda t: t["layers"].pop(), "'layers' must list one row per layer of 'space.options'"),
        (lambda t: t["fixed"].update(decode=True), "'fixed' (embeddings, final norm, LM head) needs non-negative"),
        (lambda t: t["space"]["options"].__setitem__(1, 2), "layer 1's entry of 'space.options' must be a list"),
        (lambda t: t["layers"][2][0].update(decode=-1.0), "non-negative decode and prefill seconds below 1e"),
        (lambda t: t.pop("fixed"), "no 'fixed'"),
        (lambda t: t.update(unit="milliseconds"), "unit 'milliseconds', expected 'seconds'"),  # read as seconds
        (lambda t: t.pop("unit"), "unit None, expected 'seconds'"),
        (lambda t: t["fixed"].update(decode=float("nan")), "is not valid JSON (NaN is not a JSON number)"),
        (lambda t: t["fixed"].update(decode=None), "'fixed' (embeddings, final norm, LM head) needs non-negative"),
        (lambda t: t.update(space=[]), "'model' and 'space' must be objects"),
        (lambda t: t.update(backend="cpu"), "'backend' must be an object"),  # an AttributeError in the search
        (lambda t: t.update(machine=[1]), "'machine' must be an object"),
        (_full_model_at_0_us, "full model (decode) must be at least 1 us"),
        (lambda t: (t.clear(), t.update(schema_version=2, points=[])), "is a search's Pareto front (pareto.json), not"),
    ],
)
def test_a_corrupt_table_is_one_line_and_nothing_is_written(table_file, model_dir, tmp_path, capsys, edit, message):
    data = json.loads(table_file.read_text())
    edit(data)
    table_file.write_text(json.dumps(data))
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        LatencyTable.read(table_file).costs("decode")
    out = tmp_path / "out"
    code = main([
        "--model", str(model_dir), "--space", "ffn-grid", "--cost", "latency", "--latency-table", str(table_file),
        "--budget", "90%", "--out", str(out),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_time_past_any_measurement_is_refused_with_the_table(table_file, model_dir, tmp_path, capsys):
    """It printed all 307 digits of it in microseconds, later as the solver's "costs must be below 2**62 ... count
    in coarser units (e.g. fewer --macs-tokens)", which named neither the table nor the fix."""
    data = json.loads(table_file.read_text())
    data["layers"][0][0]["decode"] = 1e300
    table_file.write_text(json.dumps(data))
    argv = ["--model", str(model_dir), "--space", "ffn-grid", "--cost", "latency", "--latency-table", str(table_file),
            "--budget", "90%", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{table_file} is not an nsc-prune latency table (layer 0: every entry needs non-negative" in err
    assert "seconds below 1e+06); re-run nsc-prune profile" in err and err.count("\n") == 1


def test_cost_latency_needs_a_table_and_a_known_phase(model_dir, tmp_path):
    with pytest.raises(ConfigError, match="--cost latency needs --latency-table"):
        search_plan(str(model_dir), "90%", "ffn-grid", "latency")
    with pytest.raises(ConfigError, match="is not a file; name the file nsc-prune profile --out wrote"):
        LatencyTable.read(tmp_path)  # was "no latency table at DIR; write one with profile --out DIR"
    with pytest.raises(ConfigError, match="--latency-phase"):
        LatencySettings("lut.json", phase="train")


def test_points_without_latency_cannot_be_selected_by_time(model_dir):
    doc = search_plan(str(model_dir), "90%", "ffn-grid").document
    assert all(p.latency_us is None for p in doc.points)
    with pytest.raises(ConfigError, match="no predicted latency"):
        doc.points[0].cost("latency")


def test_a_table_read_and_written_back_is_the_same_file(tmp_path):
    """The option labels are ``LayerPlan``s in memory and dicts on disk: a table profiled before they were typed
    (tests/fixtures/latency_table_v1.json) reads and writes back byte for byte."""
    fixture = Path(__file__).parents[1] / "fixtures" / "latency_table_v1.json"
    table = LatencyTable.read(fixture)
    assert all(isinstance(plan, LayerPlan) for row in table.space["options"] for plan in row)
    assert table.write(tmp_path / "lut.json").read_bytes() == fixture.read_bytes()
    edited = tmp_path / "edited.json"  # a key written twice by hand: json kept the last, the search used it
    edited.write_text(fixture.read_text().replace('"decode": 0.0303955078125,', '"decode": 0.5, "decode": 0.03,', 1))
    with pytest.raises(ConfigError, match="the key 'decode' appears more than once in one object"):
        LatencyTable.read(edited)


def test_a_time_budget_just_above_the_full_model_shows_both_to_the_microsecond():
    from nsc_prune.core.budget import check_budget

    with pytest.raises(
        InvalidInputError, match=r"full model's 16 ms \(15,965 us\) latency; got '16ms = 100.2% of the full model'"
    ):
        check_budget("16ms", 10_000, 15_965, "latency")  # read "at most 16 ms; got 16 ms"


@pytest.mark.parametrize(
    ("files", "cpus"),
    [
        ({"cpu.max": "150000 100000\n"}, 2),  # cgroup v2: 1.5 CPUs of time, two threads at most
        ({"cpu.max": "max 100000\n"}, None),  # no quota
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu.max": "garbled"}, None),
        ({}, None),  # no cgroup files: the affinity alone
    ],
)
def test_usable_cpus_keeps_to_a_containers_cpu_quota(tmp_path, files, cpus):
    """profile --threads is refused above usable_cpus(): in a container whose quota is a few of the host's many
    CPUs, the affinity alone let it time oversubscribed threads."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    affinity = usable_cpus(tmp_path / "nowhere")
    assert usable_cpus(tmp_path) == (affinity if cpus is None else min(affinity, cpus))
