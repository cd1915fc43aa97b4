"""nsc_prune.eval.studies: the SmolLM2 studies' texts, grid front and random baseline plan."""

from __future__ import annotations

import random

import pytest

from nsc_prune.eval import studies
from nsc_prune.plan import ParetoDocument, pareto_path


def test_texts_are_distinct_and_heldout_is_not_in_calibration():
    calibration, heldout = studies.calibration_text(), studies.heldout_text()
    assert len(calibration) > 100_000 and len(heldout) > 10_000
    assert calibration == studies.calibration_text()  # deterministic
    paragraphs = [p for p in heldout.split("\n\n") if len(p) > 200]
    assert paragraphs and not any(p in calibration for p in paragraphs[:50])


def test_calibration_windows_rotate_the_whole_text_and_start_apart():
    from pydoc_data.topics import topics

    whole = studies.calibration_text()
    assert studies.calibration_text(0, 6) == whole
    windows = [studies.calibration_text(k, 6) for k in range(6)]
    for window in windows:  # the same topics, rotated
        assert len(window) == len(whole) and all(topic in window for topic in topics.values())
    # the first ~4,096 tokens of each window (20,000 characters) share no paragraph with another window's
    firsts = [{p for p in window[:20_000].split("\n\n")[:-1] if len(p) > 200} for window in windows]
    assert all(firsts) and not any(a & b for i, a in enumerate(firsts) for b in firsts[i + 1 :])
    assert windows[1].startswith(topics[sorted(topics)[len(topics) // 6]])
    with pytest.raises(ValueError, match="window"):
        studies.calibration_text(6, 6)


def test_prose_paragraphs_hold_no_code_or_links():
    pytest.importorskip("lm_eval")
    parts = studies.prose_text().split("\n\n")
    assert len(parts) > 10 and len(parts) == len(set(parts))
    assert all(len(p) >= 200 and "http" not in p and "`" not in p for p in parts)


def test_code_text_is_code_without_docstrings_and_disjoint_from_the_docstrings():
    import ast

    code = studies.code_text()
    assert len(code) > 50_000 and code == studies.code_text()
    assert not set(studies.CODE_MODULES) & set(studies.EVAL_MODULES)
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            assert ast.get_docstring(node) is None, node.name
    assert "#" not in "".join(line.split("'")[0].split('"')[0] for line in code.splitlines())  # no comments
    assert "def insort_left" in code and "class Fraction" in code


@pytest.mark.parametrize("seed", range(20))
def test_random_plan_matches_the_budget_on_the_grid(seed):
    grid = list(range(1536, 383, -64))
    rng = random.Random(seed)
    widths = [rng.choice(grid) for _ in range(30)]
    plan = studies.random_plan(widths, grid, {0, 5}, random.Random(seed + 1000))  # not the draws of widths
    assert sum(widths) - 64 < sum(plan) <= sum(widths) and plan != widths
    assert set(plan) <= set(grid) and plan[0] == widths[0] and plan[5] == widths[5]


def test_random_plan_that_cannot_match_raises():
    # the free layer's narrowest width (128) already overshoots the total (64 + 64)
    with pytest.raises(RuntimeError, match="could not match the budget"):
        studies.random_plan([64, 64], [192, 128], {0}, random.Random(0))


def test_grid_front_uses_the_studies_grid(tmp_path):
    document = studies.grid_front("smollm2-135m", tmp_path)
    assert ParetoDocument.read(pareto_path(tmp_path)).points == document.points
    full = max(p.params for p in document.points)
    smallest = min(document.points, key=lambda p: p.params)
    widths = [plan.ffn for plan in smallest.layer_plans()]
    assert widths[0] == 1536  # layer 0 protected
    assert min(widths) == int(1536 * studies.MIN_FRACTION) and all(w % studies.FFN_STEP == 0 for w in widths)
    assert smallest.params < full


def test_calibration_ids_refuse_a_batch_longer_than_the_text_in_one_line():
    """bench_heal.py and bench_train.py with --seq-len 40000 loaded both models, then died of a ZeroDivisionError."""
    from nsc_prune.errors import ConfigError
    from nsc_prune.eval.studies import calibration_ids, calibration_text

    def words(text: str, add_special_tokens: bool) -> dict[str, list[int]]:
        return {"input_ids": list(range(len(text.split())))}

    total = len(calibration_text().split())
    assert calibration_ids(words, 100, 100) == list(range(100))
    assert len(calibration_ids(words, 10 * total, total)) == total
    with pytest.raises(ConfigError, match=rf"holds {total:,} tokens, less than one batch .* = {total + 1:,}: lower"):
        calibration_ids(words, 10 * total, total + 1)
