"""scripts/study_sensitivity_smollm2.py --windows, --own-domain and --frontier: summaries on rows written here,
and the frontier search on a loss written here."""

from __future__ import annotations

import math
import random

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


@pytest.mark.parametrize("flags", [["--windows", "2", "--own-domain"], ["--own-domain", "--frontier", "5"]])
def test_two_studies_are_refused_together(study, flags):
    with pytest.raises(SystemExit) as exit_info:
        study.main(flags)
    assert exit_info.value.code == 2


def test_the_frontier_objective_is_the_worst_text_plus_a_quarter_of_the_mean(study):
    assert study.worst_ratio({"a": 0.1, "b": -0.3, "c": -0.1}) == pytest.approx(0.1 + 0.25 * (-0.1))
    # a move that helps two texts and leaves the third level still lowers it
    assert study.worst_ratio({"a": 0.0, "b": -0.1, "c": -0.1}) < study.worst_ratio(dict.fromkeys("abc", 0.0))


class TwoTextLoss:
    """A stand-in for the study's Probe: text "early" is hurt by cutting layer 0, text "late" by cutting layer 3;
    every other layer is free to cut."""

    grid = [256, 192, 128, 64]  # widest first, as the studies' grid

    def loss(self, widths, text="", ids=None):
        layer = {"early": 0, "late": 3}[ids]
        return (256 - widths[layer]) / 64 + 0.001 * sum(widths)


def test_the_frontier_search_keeps_only_moves_that_help_the_worst_text_at_equal_parameters(study):
    probe, start = TwoTextLoss(), [128, 192, 192, 128]
    found = study.frontier_search(probe, {"early": "early", "late": "late"}, start, 200, random.Random(0), 0.0)
    # both sensitive layers end whole, paid for by the free layers, and the parameter count is unchanged
    assert found["widths"][0] == found["widths"][3] == 256
    assert sum(found["widths"]) == sum(start)
    assert all(ratio < 1 for ratio in found["tail_ratios"].values())
    assert 0 < found["kept"] <= found["moves"] == 200


def test_a_one_step_move_keeps_the_grid_and_the_total(study):
    grid, rng = [256, 192, 128, 64], random.Random(1)
    for _ in range(200):
        widths = [rng.choice(grid) for _ in range(5)]
        moved = study.one_step_move(widths, grid, rng)
        if moved is None:
            continue
        assert sum(moved) == sum(widths) and set(moved) <= set(grid)
        assert sum(a != b for a, b in zip(moved, widths, strict=True)) == 2


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


def test_a_tie_with_the_hand_rule_is_no_win_and_the_extremes_ignore_window_order(study):
    summary = study.window_summary(rows(study, [30.0, 10.0], [30.0, 20.0]), ["prose"])
    cell = next(c for c in summary if c["budget"] == 80 and c["method"] == study.MEASURED)
    assert cell["wins_against_hand"] == 1 and (cell["min"], cell["max"]) == (10.0, 30.0)
