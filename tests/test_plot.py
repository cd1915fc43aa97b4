"""The plot of a front: the selected point marked on each cost, its plan drawn, and the layer summary."""

from __future__ import annotations

import pytest

from nsc_prune.core.front import search
from nsc_prune.plot import summarize_layers
from nsc_prune.presets import resolve_model
from nsc_prune.spaces.registry import build_space


def test_summarize_layers_groups_runs_of_layers():
    layers = (
        [{"ffn": 9632, "lora_rank": 32}] * 2 + [{"ffn": 8256, "lora_rank": 32}] * 3 + [{"ffn": 9632, "lora_rank": 32}]
    )
    assert summarize_layers(layers) == ("3 x (ffn 9632, r 32) [layers 0-1,5] + 3 x (ffn 8256, r 32) [layers 2-4]")
    space = build_space("lonas", resolve_model("smollm2-135m").config, rank_deltas=[0])  # rank does not vary
    assert summarize_layers([{"ffn": 1536, "lora_rank": 32}] * 2, space) == "2 x (ffn 1536) [layers 0-1]"
    uniform = build_space("ffn-grid", resolve_model("smollm2-135m").config, ffn_min_fraction=1)
    assert summarize_layers([{"ffn": 1536, "kv_groups": 3}], uniform) == "1 x (as is) [layer 0]"


def test_the_plot_marks_the_selected_point_and_draws_its_plan(tmp_path, monkeypatch):
    figure_module = pytest.importorskip("matplotlib.figure")
    from nsc_prune.plot import write_plot

    result = search(build_space("ffn-heads-depth", resolve_model("smollm2-135m").config), cost="macs")
    selected = len(result.points) // 2
    figures = []
    monkeypatch.setattr(figure_module.Figure, "savefig", lambda figure, *args, **kw: figures.append(figure))
    write_plot(result, selected, tmp_path / "pareto.png")
    ax_nsc, ax_other, ax_plan = figures[0].axes[:3]
    point = result.points[selected]
    star = ax_nsc.lines[1]
    assert list(star.get_xdata()) == [point.macs] and star.get_label() == f"selected (point {selected})"
    assert list(ax_other.lines[0].get_ydata()) == [p.params for p in result.points]  # the other cost: params
    assert ax_other.get_ylabel() == "params"
    heights = [bar.get_height() for bar in ax_plan.patches]
    assert heights == [layer["ffn"] if layer.get("keep", True) else 0 for layer in point.layers]
