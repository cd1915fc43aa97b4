"""A search space (network-level choices ``g`` x per-layer option tables) and ``search()``, which runs
NSC-DP over it and returns the whole Pareto front. Spaces are built from YAML in ``nsc_prune.spaces``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nsc_prune._validation import must_be
from nsc_prune.choices import COST_KINDS
from nsc_prune.core import solver
from nsc_prune.core.budget import index_under as budget_index_under
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.core.spec import LayerOption
from nsc_prune.errors import ConfigError, InvalidInputError


@dataclass(frozen=True)
class Subspace:
    """One network-level choice ``g``: its keys (e.g. ``{"d_model": 512, "n_layer": 16}``,
    empty when there is none), the parts it fixes, and one option table per layer."""

    choice: Mapping[str, Any]
    fixed: LayerOption
    layers: tuple[tuple[LayerOption, ...], ...]


DECODER_PARAMS = "deployed parameters; embeddings, lm_head, norms and biases included"
LORA_PARAMS = "deployed parameters after LoRA is merged; embeddings, lm_head, norms and biases included"


@dataclass(frozen=True)
class SearchSpace:
    name: str
    subspaces: tuple[Subspace, ...]
    description: str = ""
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # What "params" counts in this space, in words (shown with every result and in pareto.json).
    params_convention: str = DECODER_PARAMS
    # What MACs are counted per, given the sequence length: a language model's tokens, an image's patches.
    macs_per: str = "@ {seq_len} tokens"
    default_seq_len: int = 256  # the sequence length MACs use when none is given (LoNAS: 256 tokens)

    def macs_note(self, seq_len: int) -> str:
        """``"@ 256 tokens"`` (decoders) or the space's own wording (``"per 224x224 image ..."``)."""
        return self.macs_per.format(seq_len=seq_len) if seq_len == self.default_seq_len else f"@ {seq_len} tokens"

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


def option_plans(space: SearchSpace, what: str) -> list[list[LayerPlan]]:
    """Every layer's options as ``LayerPlan``s, in table order, of a space over one model's decoder layers (the
    elastic and lonas kinds label their options with them); ConfigError naming ``what`` for any other space."""
    layers = space.subspaces[0].layers if len(space.subspaces) == 1 else ()
    if not layers or not all(isinstance(option.label, LayerPlan) for options in layers for option in options):
        raise ConfigError(must_be(what, "a per-layer space of one model (elastic, lonas)", space.name))
    return [[option.label for option in options] for options in layers]


@dataclass(frozen=True)
class LayerCosts:
    """Measured integer costs of a one-subspace space (a latency table in microseconds): ``fixed`` for the parts
    every plan has, ``layers[l][j]`` for option ``j`` of layer ``l``."""

    fixed: int
    layers: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Point:
    """One Pareto-optimal architecture."""

    params: int
    macs: int
    nsc: float
    choice: Mapping[str, Any]
    layers: tuple[Mapping[str, Any], ...]  # each layer's option label: a LayerPlan in a decoder space
    options: tuple[int, ...] = ()  # index of the chosen option in each layer's table
    latency_us: int | None = None  # predicted latency (microseconds) when the search had a latency table


@dataclass(frozen=True)
class ParetoResult:
    """The whole front of ``space`` under ``cost`` (``"params"`` or ``"macs"`` at ``seq_len``)."""

    space: SearchSpace
    cost: str
    seq_len: int
    points: tuple[Point, ...]
    seconds: float

    def cost_of(self, point: Point) -> int:
        if self.cost == "latency":
            return int(point.latency_us)
        return point.params if self.cost == "params" else point.macs

    def index_under(self, budget: int) -> int:
        """Index of the best point whose cost is ``<= budget`` (raises InfeasibleBudgetError)."""
        return budget_index_under([self.cost_of(p) for p in self.points], budget)


def _option_cost(option: LayerOption, cost: str, seq_len: int) -> int:
    return option.params if cost == "params" else option.macs * seq_len


def _layer_costs(space: SearchSpace, latency: LayerCosts) -> list[list[int]]:
    """``latency`` as the solver's cost table ``[fixed, *layers]``, checked against ``space``'s option tables."""
    shape = [len(options) for sub in space.subspaces for options in sub.layers]
    if len(space.subspaces) != 1 or [len(row) for row in latency.layers] != shape:
        raise InvalidInputError("a latency table must have one cost per option of every layer of a one-subspace space")
    return [[latency.fixed], *[list(row) for row in latency.layers]]


def search(
    space: SearchSpace,
    cost: str = "params",
    seq_len: int = 256,
    values: Sequence[Sequence[Sequence[float]]] | None = None,
    latency: LayerCosts | None = None,
) -> ParetoResult:
    """Run NSC-DP over every network-level choice of ``space`` and return the whole front.

    ``values[g][l][j]`` replaces the closed-form NSC of option ``j`` of layer ``l`` in subspace
    ``g`` (e.g. psi_W from real weights); by default each option's ``psi_mp`` sum is used.
    ``latency`` (a measured table, ``nsc_prune.core.latency_table``) is the cost under ``cost="latency"`` and is
    reported as each point's ``latency_us`` under any cost.
    """
    if cost not in COST_KINDS:
        raise InvalidInputError(f"cost must be one of {COST_KINDS}; got {cost!r}")
    if seq_len <= 0:
        raise InvalidInputError(f"seq_len must be a positive integer; got {seq_len}")
    if cost == "latency" and latency is None:
        raise InvalidInputError("cost 'latency' needs a latency table (nsc-prune profile; --latency-table FILE)")
    latency_table = _layer_costs(space, latency) if latency is not None else None
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
        if cost == "latency":
            costs = latency_table
        else:
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
        params = sum(
            np.array([o.params for o in options], dtype=np.int64)[choices[:, l]]
            for l, options in enumerate(tables[group])
        )
        macs = sum(
            np.array([o.macs for o in options], dtype=np.int64)[choices[:, l]]
            for l, options in enumerate(tables[group])
        )
        latency_us = (
            sum(np.array(row, dtype=np.int64)[choices[:, l]] for l, row in enumerate(latency_table))
            if latency_table is not None
            else None
        )
        for row, index in enumerate(members):
            points[index] = Point(
                params=int(params[row]),
                macs=int(macs[row]) * seq_len,
                nsc=float(front.values[index]),
                choice=sub.choice,
                layers=tuple(options[j].label for options, j in zip(sub.layers, choices[row, 1:])),
                options=tuple(int(j) for j in choices[row, 1:]),
                latency_us=int(latency_us[row]) if latency_us is not None else None,
            )
    return ParetoResult(
        space=space, cost=cost, seq_len=seq_len, points=tuple(points), seconds=time.perf_counter() - start
    )
