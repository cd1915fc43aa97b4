"""How a plan reads to a person: the one-line per-layer summary and ``pareto.png`` (matplotlib, optional)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from nsc_prune.core.front import ParetoResult, SearchSpace
from nsc_prune.errors import MissingDependencyError, import_problem
from nsc_prune.plan import score_reading

_SHORT = {"ffn": "ffn", "lora_rank": "r", "kv_groups": "kv", "keep": "keep"}
_AXIS_NAMES = {
    "ffn": "FFN width",
    "lora_rank": "LoRA rank",
    "kv_groups": "KV groups",
    "num_heads": "heads",
    "mlp_ratio": "MLP ratio",
}


def varying_keys(space: SearchSpace) -> set[str]:
    """The per-layer choices ``space`` varies (an axis with one value everywhere is not worth printing)."""
    values: dict[str, set] = {}
    for sub in space.subspaces:
        for options in sub.layers:
            for option in options:
                for key, value in option.label.items():
                    values.setdefault(key, set()).add(value)
    return {key for key, seen in values.items() if len(seen) > 1}


def format_label(label: Mapping[str, Any], keys: Collection[str] | None = None) -> str:
    """``ffn 8256, r 32``; a dropped layer reads ``dropped``; ``keys`` limits the axes shown."""
    if label.get("keep", True) is False:
        return "dropped"
    return ", ".join(
        f"{_SHORT.get(key, key)} {value}"
        for key, value in label.items()
        if key != "keep" and (keys is None or key in keys)
    )


def _ranges(indices: Sequence[int]) -> str:
    parts, start = [], indices[0]
    for prev, cur in zip(indices, [*indices[1:], None]):
        if cur != prev + 1:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(parts)


def summarize_layers(layers: Sequence[Mapping[str, Any]], space: SearchSpace | None = None) -> str:
    """Compress a per-layer plan: ``2 x (ffn 9632, r 32) [layers 0-1] + 30 x (ffn 8256, r 32) [layers 2-31]``;
    with ``space``, only the axes it varies are shown."""
    keys = varying_keys(space) if space is not None else None
    groups: dict[str, list[int]] = {}
    for index, label in enumerate(layers):
        groups.setdefault(format_label(label, keys) or "as is", []).append(index)
    return " + ".join(
        f"{len(idx)} x {text if text == 'dropped' else f'({text})'} "
        f"[{'layer' if len(idx) == 1 else 'layers'} {_ranges(idx)}]"
        for text, idx in groups.items()
    )


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or MissingDependencyError naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as err:  # an ImportError, or what its import raised (a missing home folder: RuntimeError)
        raise MissingDependencyError(import_problem("matplotlib", "plot", err, "the plot")) from err
    return plt


def _human_axis(axis: Any, which: str) -> None:
    """Tick labels such as 5.7B / 120M instead of an offset ``1e9``."""
    from matplotlib.ticker import FuncFormatter

    def tick(value: float, _: Any) -> str:
        for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if abs(value) >= scale:
                return f"{value / scale:.4g}{suffix}"
        return f"{value:g}"

    getattr(axis, f"{which}axis").set_major_formatter(FuncFormatter(tick))


def write_plot(
    result: ParetoResult,
    selected: int,
    path: Path,
    model: str | None = None,
    budget: Mapping[str, Any] | None = None,
    score: str | None = None,
) -> bool:
    """Write ``pareto.png``: the plan's value, named by its ``score`` (``nsc_prune.plan.score_reading``: NSC, or the
    predicted damage under ``measured``), and the other cost vs the plan's cost (budget line, selected point marked)
    and the selected plan's per-layer choices, into ``path`` as it is (the CLI publishes it atomically); raises
    MissingDependencyError without matplotlib."""
    plt = require_matplotlib()
    space = result.space
    reading = score_reading(score)
    costs = [result.cost_of(p) for p in result.points]
    nsc = [reading.shown(p.nsc) for p in result.points]
    other = [p.macs if result.cost == "params" else p.params for p in result.points]
    macs_note = space.macs_note(result.seq_len).split(" (")[0]  # an axis holds "per 224x224 image", not its reason
    fig, (ax_nsc, ax_other, ax_plan) = plt.subplots(1, 3, figsize=(15, 4.4))
    title = " / ".join(filter(None, [model, f"space {space.name}", f"cost {result.cost}"]))
    fig.suptitle(f"NSC-DP Pareto front: {title}")
    xlabel = {"params": "plan params", "latency": "plan latency (us, the table's prediction)"}.get(
        result.cost, f"plan MACs ({macs_note})"
    )
    for ax, ys, ylabel, color in (
        (ax_nsc, nsc, reading.label, "tab:blue"),
        (ax_other, other, f"MACs ({macs_note})" if result.cost == "params" else "params", "tab:green"),
    ):
        ax.plot(costs, ys, ".-", lw=1, ms=3, color=color, label=f"Pareto front ({ylabel})")
        ax.plot(costs[selected], ys[selected], "r*", ms=14, label=f"selected (point {selected})")
        if budget and budget.get("resolved"):
            ax.axvline(budget["resolved"], color="gray", ls="--", lw=1, label=f"budget {budget.get('requested')}")
        ax.set(xlabel=xlabel, ylabel=ylabel)
        _human_axis(ax, "x")
        if ax is ax_other:
            _human_axis(ax, "y")
    ax_nsc.set_title(f"{reading.name} along the front")
    ax_other.set_title("the other cost along the front")
    ax_nsc.legend(fontsize=8)
    _plan_panel(ax_plan, result.points[selected].layers, space)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=110)  # the format named: the CLI's path is a temporary publish name
    finally:
        plt.close(fig)
    return True


def _plan_panel(ax: Any, layers: Sequence[Mapping[str, Any]], space: SearchSpace) -> None:
    """Bars of the selected plan's per-layer choices (first varying axis), the others as lines on a twin axis."""
    keys = [key for key in layers[0] if key != "keep" and key in varying_keys(space)] if layers else []
    index = list(range(len(layers)))
    ax.set(
        xlabel="layer",
        title="selected plan per layer"
        + (" (x: dropped)" if any(l.get("keep", True) is False for l in layers) else ""),
    )
    if not keys:
        ax.text(0.5, 0.5, "every layer as in the base", ha="center", va="center", transform=ax.transAxes)
        return
    kept = [layer.get("keep", True) is not False for layer in layers]
    first, rest = keys[0], keys[1:]
    ax.bar(index, [layer[first] if ok else 0 for layer, ok in zip(layers, kept)], color="tab:blue", alpha=0.7)
    ax.plot([i for i, ok in zip(index, kept) if not ok], [0] * kept.count(False), "rx", ms=8)
    ax.set_ylabel(_AXIS_NAMES.get(first, first), color="tab:blue")
    if rest:
        twin = ax.twinx()
        for key, color in zip(rest, ("tab:orange", "tab:purple", "tab:brown")):
            twin.plot(
                index,
                [layer[key] if ok else 0 for layer, ok in zip(layers, kept)],
                "o-",
                ms=3,
                color=color,
                label=_AXIS_NAMES.get(key, key),
            )
        twin.set_ylabel(" / ".join(_AXIS_NAMES.get(key, key) for key in rest))
        twin.legend(fontsize=8, loc="lower right")
