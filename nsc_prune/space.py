"""Search spaces: network-level choices ``g`` x per-layer option tables, loaded from YAML, and
``search()`` which runs NSC-DP over them and returns the whole Pareto front.

A space YAML names its ``kind``; each kind registers a config dataclass (YAML keys equal its
field names) and a builder ``(config, model_config) -> SearchSpace``.
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import importlib
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from nsc_prune import solver
from nsc_prune.errors import ConfigError, InfeasibleBudgetError, InvalidInputError
from nsc_prune.spec import LayerOption

CONFIG_DIR = Path(__file__).parent / "configs"
SPACES_DIR = CONFIG_DIR / "spaces"
COST_KINDS = ("params", "macs")


@dataclass(frozen=True)
class Subspace:
    """One network-level choice ``g``: its keys (e.g. ``{"d_model": 512, "n_layer": 16}``,
    empty when there is none), the parts it fixes, and one option table per layer."""

    choice: Mapping[str, Any]
    fixed: LayerOption
    layers: tuple[tuple[LayerOption, ...], ...]


@dataclass(frozen=True)
class SearchSpace:
    name: str
    subspaces: tuple[Subspace, ...]
    description: str = ""
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # What "params" counts in this space, in words (shown with every result and in pareto.json).
    params_convention: str = "deployed parameters after LoRA is merged; embeddings, lm_head, norms and biases included"

    @property
    def size(self) -> int:
        """Number of architectures in the space."""
        total = 0
        for sub in self.subspaces:
            count = 1
            for options in sub.layers:
                count *= len(options)
            total += count
        return total


@dataclass(frozen=True)
class Point:
    """One Pareto-optimal architecture."""

    params: int
    macs: int
    nsc: float
    choice: Mapping[str, Any]
    layers: tuple[Mapping[str, Any], ...]
    options: tuple[int, ...] = ()  # index of the chosen option in each layer's table


@dataclass(frozen=True)
class ParetoResult:
    """The whole front of ``space`` under ``cost`` (``"params"`` or ``"macs"`` at ``seq_len``)."""

    space: SearchSpace
    cost: str
    seq_len: int
    points: tuple[Point, ...]
    seconds: float

    def cost_of(self, point: Point) -> int:
        return point.params if self.cost == "params" else point.macs

    def index_under(self, budget: int) -> int:
        """Index of the best point whose cost is ``<= budget`` (raises InfeasibleBudgetError)."""
        costs = [self.cost_of(p) for p in self.points]
        index = bisect.bisect_right(costs, budget) - 1
        if index < 0:
            raise InfeasibleBudgetError(
                f"budget {budget:,} {self.cost} is below the smallest plan in space {self.space.name!r}, "
                f"which needs {costs[0]:,} {self.cost}",
                min_cost=costs[0],
            )
        return index


def _option_cost(option: LayerOption, cost: str, seq_len: int) -> int:
    return option.params if cost == "params" else option.macs * seq_len


def search(
    space: SearchSpace, cost: str = "params", seq_len: int = 256, values: Sequence[Sequence[Sequence[float]]] | None = None
) -> ParetoResult:
    """Run NSC-DP over every network-level choice of ``space`` and return the whole front.

    ``values[g][l][j]`` replaces the closed-form NSC of option ``j`` of layer ``l`` in subspace
    ``g`` (e.g. psi_W from real weights); by default each option's ``psi_mp`` sum is used.
    """
    if cost not in COST_KINDS:
        raise InvalidInputError(f"cost must be one of {COST_KINDS}; got {cost!r}")
    if seq_len <= 0:
        raise InvalidInputError(f"seq_len must be a positive integer; got {seq_len}")
    start = time.perf_counter()
    groups, tables = [], []
    for g, sub in enumerate(space.subspaces):
        layer_tables = [(sub.fixed,), *sub.layers]
        if values is None:
            layer_values = [[option.nsc for option in options] for options in layer_tables]
        else:
            layer_values = [[sub.fixed.nsc], *values[g]]
            if [len(v) for v in layer_values] != [len(options) for options in layer_tables]:
                raise InvalidInputError("values must have one entry per option of every layer of the space")
        costs = [[_option_cost(option, cost, seq_len) for option in options] for options in layer_tables]
        groups.append((layer_values, costs))
        tables.append(layer_tables)
    front = solver.solve(groups)
    points: list[Point | None] = [None] * len(front)
    for group, sub in enumerate(space.subspaces):
        members = np.flatnonzero(front.groups == group)
        if members.size == 0:
            continue
        choices = np.stack([front.choices[i] for i in members])
        params = sum(np.array([o.params for o in options], dtype=np.int64)[choices[:, l]] for l, options in enumerate(tables[group]))
        macs = sum(np.array([o.macs for o in options], dtype=np.int64)[choices[:, l]] for l, options in enumerate(tables[group]))
        for row, index in enumerate(members):
            points[index] = Point(
                params=int(params[row]),
                macs=int(macs[row]) * seq_len,
                nsc=float(front.values[index]),
                choice=sub.choice,
                layers=tuple(options[j].label for options, j in zip(sub.layers, choices[row, 1:])),
                options=tuple(int(j) for j in choices[row, 1:]),
            )
    return ParetoResult(space=space, cost=cost, seq_len=seq_len, points=tuple(points), seconds=time.perf_counter() - start)


# --------------------------------------------------------------------------------------------
# Space kinds and YAML

SpaceBuilder = Callable[[Any, Mapping[str, Any] | None], SearchSpace]
_KINDS: dict[str, tuple[type, SpaceBuilder]] = {}
_MODEL_FREE_KINDS: set[str] = set()  # kinds that define the whole network themselves (NAS spaces)
# Built-in kinds register themselves when their module is imported.
_BUILTIN_KIND_MODULES = {
    "lonas": "nsc_prune.supernets.lonas",
    "elastic": "nsc_prune.elastic",
    "txl": "nsc_prune.families.nas_spaces",
    "autoformer": "nsc_prune.families.nas_spaces",
}


def register_space_kind(kind: str, config_class: type, builder: SpaceBuilder, *, takes_model: bool = True) -> None:
    """Register a space ``kind``: its config dataclass and builder. Duplicates are refused.

    ``takes_model=False`` marks spaces that define the whole network (NAS spaces): giving them a
    model config is an error rather than silently ignored.
    """
    if kind in _KINDS:
        raise ValueError(f"space kind {kind!r} is already registered")
    _KINDS[kind] = (config_class, builder)
    if not takes_model:
        _MODEL_FREE_KINDS.add(kind)


def _kind(kind: str) -> tuple[type, SpaceBuilder]:
    if kind not in _KINDS and kind in _BUILTIN_KIND_MODULES:
        importlib.import_module(_BUILTIN_KIND_MODULES[kind])
    if kind not in _KINDS:
        known = sorted(set(_KINDS) | set(_BUILTIN_KIND_MODULES))
        raise ConfigError(f"unknown space kind {kind!r}; known kinds: {', '.join(known)}")
    return _KINDS[kind]


def bundled_spaces() -> list[str]:
    return sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))


def config_from_dict(config_class: type, data: Mapping[str, Any], source: str) -> Any:
    """Build a config dataclass from a mapping: unknown keys warn, missing required keys fail."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        warnings.warn(f"{source}: ignoring unknown keys {unknown} (known: {sorted(fields)})", stacklevel=3)
    required = [name for name, f in fields.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        raise ConfigError(f"{source}: missing required keys {missing}")
    try:
        return config_class(**{k: v for k, v in data.items() if k in fields})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: {err}") from err


def load_space_yaml(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """Read a bundled space by name or a YAML file by path; returns ``(name, mapping)``."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = SPACES_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            names = bundled_spaces()
            close = difflib.get_close_matches(str(name_or_path), names, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"unknown space {name_or_path!r}.{hint} Bundled spaces: {', '.join(names)}; or pass a path to a .yaml file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(data, dict) or "kind" not in data:
        raise ConfigError(f"{path}: a space YAML must be a mapping with a 'kind' key")
    return path.stem, data


def build_space(name_or_path: str, model_config: Mapping[str, Any] | None = None, **overrides: Any) -> SearchSpace:
    """Load a space YAML and build it (for ``model_config`` where the kind needs one).

    ``overrides`` replace YAML keys (flags > YAML > dataclass defaults).
    """
    name, data = load_space_yaml(name_or_path)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    kind = data.pop("kind")
    data.pop("description", None)
    config_class, builder = _kind(kind)
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"space {name!r} (kind {kind!r}) has no setting {', '.join(unknown)}; its settings: {', '.join(sorted(known))}")
    data = {**data, **overrides}
    if model_config is not None and kind in _MODEL_FREE_KINDS:
        raise ConfigError(f"space {name!r} defines its whole network (kind {kind!r}); it takes no model: drop --model")
    config = config_from_dict(config_class, data, f"space {name!r}")
    space = builder(config, model_config)
    return dataclasses.replace(space, name=name, settings={"kind": kind, **dataclasses.asdict(config)})
