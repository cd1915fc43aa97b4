"""scripts/reproduce_marginal_gain.py's table: forward differences against the exact envelope derivative."""

from __future__ import annotations

from tests.conftest import load_script


def test_the_exact_derivative_brackets_each_first_forward_difference():
    gain = load_script("reproduce_marginal_gain")
    for row in gain.marginal_gain_table():  # psi_MP is concave in n: the slope over [512, 640] lies between the ends
        assert row["exact_lo"] > row["gain_lo"] > float(gain.envelope_derivative(640, row["d_model"], 0.02))
        assert row["exact_hi"] < row["gain_lo"] and row["negative"] == row["second_diffs"] == 27 and row["resolved"]
