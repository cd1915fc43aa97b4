"""scripts/study_sensitivity_smollm2.py --windows: the summary over calibration windows, on rows written here."""

from __future__ import annotations

import math

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def study():
    return load_script("study_sensitivity_smollm2")


def rows(study, measured: list[float], hand: list[float]) -> list[dict]:
    out = []
    for window, (m, h) in enumerate(zip(measured, hand, strict=True)):
        for budget in study.BUDGETS:
            out.append({"window": window, "budget": budget, "method": study.MEASURED, "ppl_prose": m})
            out.append({"window": window, "budget": budget, "method": study.HAND, "ppl_prose": h})
    return out


def test_the_summary_pairs_each_window_with_its_own_hand_rule(study):
    # window 0: measured 10 against 20 (wins); window 1: 30 against 15 (loses). Unpaired means would say 20 vs 17.5.
    summary = study.window_summary(rows(study, [10.0, 30.0], [20.0, 15.0]), ["prose"])
    cell = next(c for c in summary if c["budget"] == 80 and c["method"] == study.MEASURED)
    assert cell["wins_against_hand"] == 1 and cell["windows"] == 2
    assert cell["geomean_ratio_to_hand"] == pytest.approx(math.sqrt(0.5 * 2.0))
    assert (cell["mean"], cell["min"], cell["max"]) == (20.0, 10.0, 30.0)
    assert cell["sd"] == pytest.approx(math.sqrt(200.0))
    hand = next(c for c in summary if c["budget"] == 80 and c["method"] == study.HAND)
    assert "wins_against_hand" not in hand and hand["mean"] == 17.5
    assert len(summary) == 2 * len(study.BUDGETS)
