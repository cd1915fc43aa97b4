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


def test_own_domain_judges_each_table_on_the_text_that_calibrated_it(study):
    rows = []
    for label, (m, h) in {"prose": (40.0, 50.0), "code": (9.0, 6.0)}.items():
        for budget in study.BUDGETS:
            # each plan is judged on both texts; only the calibrating text's cell counts
            rows.append({"window": label, "budget": budget, "method": study.MEASURED, "ppl_prose": m, "ppl_code": m})
            rows.append({"window": label, "budget": budget, "method": study.HAND, "ppl_prose": h, "ppl_code": h})
    rows = [r | {"ppl_code": r["ppl_code"] * 100} if r["window"] == "prose" else r for r in rows]
    summary = study.own_domain_summary(rows)
    assert len(summary) == 2 * len(study.BUDGETS)
    prose = next(c for c in summary if c["text"] == "prose" and c["budget"] == 90)
    code = next(c for c in summary if c["text"] == "code" and c["budget"] == 70)
    assert (prose["measured"], prose["hand"], prose["ratio_to_hand"]) == (40.0, 50.0, 0.8)
    assert (code["measured"], code["hand"], code["ratio_to_hand"]) == (9.0, 6.0, 1.5)


def test_own_domain_and_windows_are_refused_together(study):
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--windows", "2", "--own-domain"])
    assert exit_info.value.code == 2


def test_the_calibration_tail_starts_after_the_judged_tokens(study, smollm2_dir):
    from nsc_prune.eval import studies
    from nsc_prune.hf.cut.selection import calibration_ids

    text = studies.prose_text()
    tail = study.heldout_tail(smollm2_dir, text, 100)
    judged = text[: len(text) - len(tail)]
    assert tail and text.endswith(tail)
    # the cut falls at the end of the 100th token: the prefix holds exactly the judged tokens
    assert calibration_ids(smollm2_dir, judged, 10**6).tolist() == calibration_ids(smollm2_dir, text, 100).tolist()
    with pytest.raises(ValueError, match="none left"):
        study.heldout_tail(smollm2_dir, "a short text", 100)
