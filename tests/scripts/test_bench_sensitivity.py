"""scripts/bench_sensitivity.py's extrapolation: the probe work it charges a table at L layers."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_sensitivity")


def test_uncapped_probes_are_quadratic_and_capped_ones_linear(bench):
    for layers in (2, 32, 80):
        steps, heads = bench.probe_work(layers, 0)
        assert steps == layers * (layers - 1) / 2 and heads == 1 + layers  # every probe on 512 tokens
        capped, capped_heads = bench.probe_work(layers, 8)
        assert capped <= 8 * layers + layers / 512 and capped_heads <= heads
    assert bench.probe_work(2, 8) == bench.probe_work(2, 0)  # two layers: no probe is shortened
    assert bench.probe_work(80, 8)[0] / bench.probe_work(80, 0)[0] < 0.2
    assert bench.probe_work(32, 8, anchors=2) == (2 * bench.probe_work(32, 8)[0], 2 * bench.probe_work(32, 8)[1] - 1)
