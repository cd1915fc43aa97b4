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


def test_capped_probe_work_at_32_layers_and_a_stride_that_thins_only_the_heads(bench):
    import math

    later = range(32)  # layers after each layer; a probe within 6 of the head carries all 512 tokens
    counts = [512 if n <= 6 else math.ceil(512 * 6 / n) for n in later]
    steps, heads = sum(c * n for c, n in zip(counts, later)) / 512, 1 + sum(counts) / 512
    assert bench.probe_work(32, 6) == pytest.approx((steps, heads))
    assert bench.probe_work(32, 6, anchors=2, stride=2) == pytest.approx((2 * steps, (1 + 2 * sum(counts) / 512) / 2))


def test_main_models_the_real_depth_from_the_measured_layers(bench, monkeypatch, capsys):
    import re

    import nsc_prune.hf.weights.synthetic as synthetic

    runs = []
    timings = {"activation": {"seconds": 10.0, "peak_rss_mib": 1.0}, "probe": {"seconds": 2.0, "head_seconds": 1.0}}

    def fake(kind, root, tokens, depth, widths=2, stride=1, repeat=1):
        runs.append((kind, depth))
        table = {"seconds": 50.0, "peak_rss_mib": 1.0, "options_per_layer": 22, "probe_tokens_per_layer": []}
        return timings.get(kind, table)

    monkeypatch.setattr(bench, "run_child", fake)
    monkeypatch.setattr(synthetic, "write_random_base", lambda *a, **k: None)
    assert bench.main(["--shape", "7b", "--layers", "2"]) == 0
    assert [r for r in runs if r[0] == "table"] == [("table", 6)]  # 2 of 32 layers: one table, the first cap
    out = capsys.readouterr().out
    steps, heads = bench.probe_work(2, 6, 2, 2)
    per_layer = (50.0 - 2.0 * steps - 1.0 * heads) / 2
    for cap, label in ((6, "probe depth 6"), (0, "no cap (the old probes)")):
        steps, heads = bench.probe_work(32, cap, 2, 2)
        probes = 2.0 * steps + 1.0 * heads
        total = 32 * per_layer + probes
        line = next(line for line in out.splitlines() if f"extrapolated to 32 layers, {label}:" in line)
        assert f"activation {32 * 5 / 60:.1f} min, table {total / 60:.1f} min ({total / 160:.2f}x)" in line
        assert re.search(rf"probes {probes / 60:.1f} min \({probes / total:.0%}", line)
    runs.clear()
    assert bench.main(["--shape", "7b", "--layers", "32"]) == 0  # the real depth: each cap measured, modelled
    assert [r for r in runs if r[0] == "table"] == [("table", 6), ("table", 0)]
    assert "modelled 32 layers, no cap" in capsys.readouterr().out
