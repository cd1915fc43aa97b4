"""The Pareto front as a document: ``pareto.json`` (schema in the README) and ``pareto.png``."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nsc_prune.errors import ConfigError
from nsc_prune.io import atomic_write_text, default_file_mode, provenance, to_json
from nsc_prune.space import ParetoResult

PARETO_FILE = "pareto.json"
PLOT_FILE = "pareto.png"
SCHEMA_VERSION = 1
MACS_CONVENTION = "multiply-accumulates of the Linear layers (LoRA and lm_head included) at seq_len tokens (LoNAS convention)"
_SHORT = {"ffn": "ffn", "lora_rank": "r", "kv_heads": "kv", "keep": "keep"}


def pareto_document(
    result: ParetoResult, selected: int, model: Mapping[str, Any] | None, budget: Mapping[str, Any]
) -> dict[str, Any]:
    """Everything about one search run, JSON-ready."""
    points = [
        {**dict(p.choice), "params": p.params, "macs": p.macs, "nsc": p.nsc, "layers": [dict(layer) for layer in p.layers]}
        for p in result.points
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "model": dict(model) if model else None,
        "space": {"name": result.space.name, "description": result.space.description, "size": str(result.space.size), **dict(result.space.settings)},
        "cost": {"kind": result.cost, "seq_len": result.seq_len, "convention": result.space.params_convention if result.cost == "params" else MACS_CONVENTION},
        "budget": dict(budget),
        "selected": selected,
        "points": points,
        "search_seconds": round(result.seconds, 6),
        "provenance": provenance(**_input_hashes(model)),
    }


def _input_hashes(model: Mapping[str, Any] | None) -> dict[str, str]:
    """sha256 of the resolved model config (canonical JSON), to tell runs on the same config apart."""
    if not model or "config" not in model:
        return {}
    return {"model_config_sha256": hashlib.sha256(to_json(model["config"]).encode()).hexdigest()}


def load_pareto(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a ``pareto.json`` (a file, or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / PARETO_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ConfigError(f"no Pareto file at {path}; run `nsc-prune --model M --budget B --out DIR` first") from err
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON ({err})") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list) or not doc["points"]:
        raise ConfigError(f"{path} is not a pareto.json: it needs a non-empty 'points' list")
    for index, point in enumerate(doc["points"]):
        if not isinstance(point, dict) or not {"params", "macs", "nsc", "layers"} <= set(point):
            raise ConfigError(f"{path}: point {index} needs params, macs, nsc and layers")
    return doc


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


def pareto_json(doc: Mapping[str, Any]) -> str:
    """``doc`` as sorted, indented JSON with one point per line: readable, and fast for fronts of
    thousands of points (json's C encoder only runs without ``indent``)."""
    head = to_json({key: value for key, value in doc.items() if key != "points"}).rstrip()
    rows = ",\n    ".join(json.dumps(p, sort_keys=True, allow_nan=False, separators=(", ", ": ")) for p in doc["points"])
    return f'{head[:-1].rstrip()},\n  "points": [\n    {rows}\n  ]\n}}\n'


def write_pareto(doc: Mapping[str, Any], out_dir: str | os.PathLike) -> Path:
    path = Path(out_dir) / PARETO_FILE
    atomic_write_text(path, pareto_json(doc))
    return path
