"""One budget parser and one point selector for every command (issue 22): the search and `extract` read
``--budget`` the same way, refuse a budget above the full model unless ``--allow-above-full``, and give the same
hints for a bare number."""

from __future__ import annotations

import numpy as np
import pytest

from nsc_prune.cli import main
from nsc_prune.core.budget import select
from nsc_prune.errors import InfeasibleBudgetError, InvalidInputError
from nsc_prune.plan import ParetoDocument

SEARCH = ["--model", "smollm2-135m", "--space", "ffn-grid", "--no-plot"]


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    out = tmp_path_factory.mktemp("front")
    assert main([*SEARCH, "--budget", "80%", "--out", str(out)]) == 0
    return out


def error_line(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0].split(": ", 1)[1]  # without the "nsc-prune[ extract]:" prefix


@pytest.mark.parametrize(
    "budget, message",
    [
        (
            "500M",
            r"--budget must be at most the full model's .* params; got '500M = .* the full model'\. "
            "Pass --allow-above-full",
        ),
        ("100", r"--budget must be at least the smallest plan's .*; got '100 = 100 params'\. Did you mean 100M"),
        ("250%", r"got '250% = [\d.]+M params'\. A percentage of the full model is at most 100%"),
        ("9" * 400, r"budget '9{400}' is past any model's cost \(at most 1e\+30\)"),  # an OverflowError traceback
        ("9" * 400 + "%", r"budget '9{400}%' is past any model's cost"),
        ("1" + "0" * 29 + "1", r"budget '10{29}1' is past any model's cost"),  # 28 digits rounded it to 1e30
        ("{full+1}", r"got '\d+ = 100\.0+\d+% of the full model'"),  # one more than the full model read 100.0%
    ],
    ids=[
        "above-full",
        "bare-number",
        "percent",
        "past-a-float",
        "percent-past-a-float",
        "past-28-digits",
        "a-unit-above",
    ],
)
def test_search_and_extract_read_a_budget_the_same_way(front, tmp_path, capsys, budget, message):
    if budget == "{full+1}":
        budget = str(ParetoDocument.read(front).cost["full"] + 1)
    search = error_line([*SEARCH, "--budget", budget, "--out", str(tmp_path / "s")], capsys)
    extract = ["extract", "--pareto", str(front), "--base", str(tmp_path / "base"), "--out", str(tmp_path / "x")]
    extracted = error_line([*extract, "--budget", budget], capsys)
    assert __import__("re").search(message, search), search
    assert extracted.replace(" in space 'ffn-grid'", "") == search.replace(" in space 'ffn-grid'", "")
    assert not (tmp_path / "x").exists() and not (tmp_path / "s").exists()


def test_a_budget_that_reads_as_macs_names_the_flag_of_the_command_that_has_it(front, tmp_path, capsys):
    """extract said "Did you mean --cost macs", a flag only the search has."""
    search = error_line([*SEARCH, "--budget", "30B", "--out", str(tmp_path / "s")], capsys)
    assert "Did you mean --cost macs (the full model is" in search
    extract = ["extract", "--pareto", str(front), "--base", str(tmp_path / "base"), "--out", str(tmp_path / "x")]
    extracted = error_line([*extract, "--budget", "30B"], capsys)
    assert "The front counts params (the full model is" in extracted and "search with --cost macs" in extracted


def test_extract_allow_above_full_gets_past_the_budget(front, tmp_path, capsys):
    extract = ["extract", "--pareto", str(front), "--base", str(tmp_path / "base"), "--out", str(tmp_path / "x")]
    error = error_line([*extract, "--budget", "500M", "--allow-above-full"], capsys)
    assert "--budget" not in error and "base" in error  # the budget passed; the (missing) base is the next check


def test_allow_above_full_selects_the_full_model(front):
    doc = ParetoDocument.read(front)
    with pytest.raises(InvalidInputError, match="at most the full model's"):
        doc.select(budget="500M")
    assert doc.select(budget="500M", allow_above_full=True) == len(doc.points) - 1
    with pytest.raises(InvalidInputError, match="allow_above_full must be True or False; got 'no'"):
        doc.select(budget="500M", allow_above_full="no")  # a truthy string accepted the full model
    assert doc.select(budget="500M", allow_above_full=np.True_) == len(doc.points) - 1  # a numpy bool is a bool


def test_a_budget_just_above_a_huge_full_model_never_reads_100_percent():
    from nsc_prune.core.budget import check_budget

    with pytest.raises(InvalidInputError, match=r"= 100\.000000000000001% of the full model"):
        check_budget(str(10**17 + 1), 1, 10**17, "macs")  # a float ratio of the two is exactly 1.0


def test_a_percentage_just_above_100_names_both_counts_in_full_where_they_round_alike():
    from nsc_prune.core.budget import check_budget

    said = (
        r"at most the full model's 1\.000T \(1,000,000,000,000\) params; got '100\.0000001% = 1\.000T \(1,000,000,001"
    )
    with pytest.raises(InvalidInputError, match=said):  # was "1.000T params; got '100.0000001% = 1.000T params'"
        check_budget("100.0000001%", 10, 10**12, "params")
    with pytest.raises(
        InvalidInputError, match=r"at most the full model's 1\.000T params; got '120% = 1\.200T params'"
    ):
        check_budget("120%", 10, 10**12, "params")


def test_select_is_the_one_point_selector():
    costs = [100, 200, 300, 400]
    assert select(costs, "250") == (1, 250) and select(costs, 400) == (3, 400) and select(costs, "50%") == (1, 200)
    with pytest.raises(InfeasibleBudgetError, match="at least the smallest plan's 100"):
        select(costs, "99")
    with pytest.raises(InvalidInputError, match="at most the full model's"):
        select(costs, "401")
    assert select(costs, "1K", allow_above_full=True) == (3, 1000)


@pytest.mark.parametrize(
    "flags, told",
    [
        (["--budget", "45ms"], "--budget 45ms is a time"),
        (["--latency-table", "lut.json", "--budget", "45ms"], "--budget 45ms is a time and --latency-table is given"),
        (["--latency-table", "lut.json", "--budget", "80%"], "--latency-table is given"),
        (["--cost", "macs", "--budget", "0.4s"], "--budget 0.4s is a time"),
    ],
)
def test_a_time_budget_or_latency_table_without_cost_latency_says_to_add_it(tmp_path, capsys, monkeypatch, flags, told):
    """Not "45ms is not a count": one line naming what asked for latency and the flag that fixes it, nothing
    written, before the table is even opened (lut.json does not exist)."""
    monkeypatch.chdir(tmp_path)
    line = error_line([*SEARCH, *flags], capsys)
    assert line.split("error: ", 1)[-1].startswith(told) and "add --cost latency" in line, line
    assert list(tmp_path.iterdir()) == []


def test_extract_reads_a_time_budget_on_a_count_front_the_same_way(front, tmp_path, capsys):
    args = [
        "extract",
        "--pareto",
        str(front),
        "--budget",
        "45ms",
        "--base",
        str(tmp_path),
        "--out",
        str(tmp_path / "c"),
    ]
    line = error_line(args, capsys)
    assert "--budget 45ms is a time, but the cost is params: add --cost latency to the search" in line, line


def test_a_budget_just_above_the_full_model_is_not_shown_as_100_percent():
    from nsc_prune.core.budget import check_budget

    with pytest.raises(Exception, match=r"got '3\.3ms = 100\.3% of the full model'"):  # was "= 100% of"
        check_budget("3.3ms", 1_000, 3_290, "latency")


def test_the_suffix_hint_passes_over_a_reading_past_any_model():
    """A bare number below a front of 1e18 MACs: its T reading (1.2e30) was refused as past any model's cost,
    instead of the number itself being named below the smallest plan."""
    from nsc_prune.core.budget import check_budget

    with pytest.raises(InfeasibleBudgetError, match=r"at least the smallest plan's .*; got '1200000000000000000 = "):
        check_budget("1200000000000000000", smallest=2 * 10**18, full=4 * 10**18, cost="macs")


def test_a_latency_floor_is_shown_once_and_in_full_where_it_rounds():
    from nsc_prune.core.budget import check_budget

    with pytest.raises(InfeasibleBudgetError, match=r"smallest plan's 45 us latency; got '30us = 30 us latency'"):
        check_budget("30us", smallest=45, full=100, cost="latency")  # was "45 us (45 us)"
    with pytest.raises(InfeasibleBudgetError, match=r"smallest plan's 16 ms \(15,965 us\) latency"):
        check_budget("1ms", smallest=15_965, full=20_000, cost="latency")
