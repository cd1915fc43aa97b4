"""How a plan reads to a person: the one-line per-layer summary and ``pareto.png`` (matplotlib, optional)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nsc_prune._io import default_file_mode
from nsc_prune.core.search import ParetoResult

_SHORT = {"ffn": "ffn", "lora_rank": "r", "kv_heads": "kv", "keep": "keep"}


def format_label(label: Mapping[str, Any]) -> str:
    return ", ".join(f"{_SHORT.get(key, key)} {value}" for key, value in label.items())


def _ranges(indices: Sequence[int]) -> str:
    parts, start = [], indices[0]
    for prev, cur in zip(indices, [*indices[1:], None]):
        if cur != prev + 1:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(parts)


def summarize_layers(layers: Sequence[Mapping[str, Any]]) -> str:
    """Compress a per-layer plan: ``2 x (ffn 9632, r 32) [0-1] + 30 x (ffn 8256, r 32) [2-31]``."""
    groups: dict[str, list[int]] = {}
    for index, label in enumerate(layers):
        groups.setdefault(format_label(label), []).append(index)
    return " + ".join(f"{len(idx)} x ({text}) [layers {_ranges(idx)}]" for text, idx in groups.items())


def write_plot(result: ParetoResult, selected: int, path: Path) -> bool:
    """Write ``pareto.png`` (NSC and the other cost vs the plan's cost, selected point marked) when
    matplotlib is installed; returns whether a plot was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    costs = [result.cost_of(p) for p in result.points]
    nsc = [p.nsc for p in result.points]
    other = [p.macs if result.cost == "params" else p.params for p in result.points]
    fig, (ax_nsc, ax_other) = plt.subplots(1, 2, figsize=(10, 4))
    ax_nsc.plot(costs, nsc, ".-", lw=1, ms=3)
    ax_nsc.plot(costs[selected], nsc[selected], "r*", ms=14, label="selected")
    ax_nsc.set(xlabel=f"plan cost ({result.cost})", ylabel="NSC", title=f"Pareto front: {result.space.name}")
    ax_nsc.legend()
    ax_other.plot(costs, other, ".-", lw=1, ms=3, color="tab:green")
    ax_other.plot(costs[selected], other[selected], "r*", ms=14)
    ax_other.set(xlabel=f"plan cost ({result.cost})", ylabel=f"MACs @ {result.seq_len} tokens" if result.cost == "params" else "params",
                 title="the other cost along the front")
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return True
