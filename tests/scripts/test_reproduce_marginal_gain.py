"""scripts/reproduce_marginal_gain.py's table: forward differences against the exact envelope derivative."""

from __future__ import annotations

from tests.conftest import load_script


def test_each_first_forward_difference_lies_between_the_exact_derivatives_and_every_second_difference_is_negative():
    gain = load_script("reproduce_marginal_gain")
    for row in gain.marginal_gain_table():  # psi_MP is concave in n: the slope over [512, 640] lies between the ends
        assert row["exact_lo"] > row["gain_lo"] > float(gain.envelope_derivative(640, row["d_model"], 0.02))
        assert row["negative"] == row["second_diffs"] == 27 and row["resolved"]
