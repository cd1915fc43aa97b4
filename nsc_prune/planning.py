"""``search_plan``: the search as one library call (what ``nsc-prune --model M --budget B`` runs).

Resolves the model and the space, picks the DP's values (``psi_MP`` from the config by default; ``psi_W`` from
the weights; or the measured sensitivity table from weights and calibration text), runs the exact DP, checks the
budget and returns the ``ParetoDocument`` with the selected point. The weights-based scores import torch lazily,
only when asked for.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsc_prune._files import SUPERNET_RECORD_NAME
from nsc_prune._io import sha256_file
from nsc_prune._validation import check_settings, is_int, is_number, must_be
from nsc_prune._warn import warn
from nsc_prune.choices import DEVICES, PHASES, SCORE_ALIASES, SCORES
from nsc_prune.core.budget import check_budget, check_cost_kind, full_name
from nsc_prune.core.front import LayerCosts, ParetoResult, Point, SearchSpace, search
from nsc_prune.core.latency_table import LatencyTable
from nsc_prune.core.spec import model_params
from nsc_prune.errors import ConfigError
from nsc_prune.plan import ParetoDocument, elastic_layer_plans
from nsc_prune.presets import ModelSource, resolve_model
from nsc_prune.spaces.registry import build_space, load_space_yaml

if TYPE_CHECKING:
    from nsc_prune.hf.score.sensitivity import SensitivityConfig


@dataclass(frozen=True)
class ScoreSettings:
    """What the DP maximises per layer option."""

    backend: str = "psi_mp"  # psi_MP (config only); psi_w: psi_W (weights); measured: measured damage (+ text)
    weights: str | None = None  # safetensors model folder, for psi_w and measured
    sensitivity: SensitivityConfig | None = None  # calibration text and selection, for measured
    table: str | None = None  # measured: the table file to read or write (default: the cache)
    progress: bool = True  # psi_w, measured: bars while weights are read and measured
    device: str = "cpu"  # psi_w: where the factorisations run (measured: sensitivity.compute.device)
    refine: int = 0  # measured: rounds of plan-conditioned refinement at the budget (0: the table as measured)
    shrink: float = 0.0  # measured: weight of the layers' mean in the DP's table (0: the table as measured)

    def __post_init__(self) -> None:
        if self.backend in SCORE_ALIASES:  # nsc-prune 0.1's names, for one release
            new = SCORE_ALIASES[self.backend]
            warn(
                f"ScoreSettings backend {self.backend!r} is deprecated; use {new!r}",
                DeprecationWarning,
            )
            object.__setattr__(self, "backend", new)
        if self.backend not in SCORES:
            raise ConfigError(must_be("score", f"one of {SCORES}", self.backend))
        if self.backend != "psi_mp" and self.weights is None:
            raise ConfigError(f"--score {self.backend} needs --weights (a safetensors folder of the model)")
        if self.device not in DEVICES:
            raise ConfigError(must_be("device", f"one of {DEVICES}", self.device))
        if self.backend == "psi_mp" and self.weights is not None:
            raise ConfigError("--weights applies to --score psi_w or measured; psi_MP reads only the config")
        if self.backend == "psi_mp" and self.device != "cpu":
            raise ConfigError("--device applies to --score psi_w or measured; psi_MP is closed-form, on the CPU")
        if self.backend == "measured" and self.sensitivity is None:
            raise ConfigError("--score measured needs --calib FILE (calibration text, never your evaluation text)")
        if self.backend != "measured" and (self.sensitivity is not None or self.table is not None):
            flag = "--sensitivity-table" if self.table is not None else "--calib"
            raise ConfigError(f"{flag} applies to --score measured; got --score {self.backend}")
        if not is_int(self.refine) or self.refine < 0:
            raise ConfigError(must_be("--refine", "a non-negative integer (rounds)", self.refine))
        if self.refine and self.backend != "measured":
            raise ConfigError(f"--refine applies to --score measured; got --score {self.backend}")
        if not is_number(self.shrink) or not 0 <= self.shrink <= 1:
            raise ConfigError(must_be("--sensitivity-shrink", "a number from 0 to 1", self.shrink))
        if self.shrink and self.backend != "measured":
            raise ConfigError(f"--sensitivity-shrink applies to --score measured; got --score {self.backend}")


def _no_model_to_time(space: SearchSpace) -> str:
    return (
        f"--cost latency budgets a model's measured latency (nsc-prune profile --model M); space {space.name!r} takes "
        "no model: use --cost params or macs"
    )


@dataclass(frozen=True)
class LatencySettings:
    """The measured latency table (``nsc-prune profile``) a search reads, and which of its phases it costs."""

    table: str
    phase: str = "decode"  # decode: one generated token; prefill: a prompt's forward pass

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ConfigError(must_be("--latency-phase", f"one of {PHASES}", self.phase))

    def read(self, space: SearchSpace, model: ModelSource | None) -> tuple[LayerCosts, dict[str, Any]]:
        """The table's costs for ``space`` of ``model`` (refused for another model or space) and its record."""
        if model is None:  # only the NAS spaces search without a model
            raise ConfigError(_no_model_to_time(space))
        table = LatencyTable.read(self.table)
        table.check_fits(space, model.config, self.table)
        record = {
            "phase": self.phase,
            "unit": "microseconds",
            "latency_table": {
                "path": str(Path(self.table).resolve()),
                "sha256": sha256_file(self.table),
                "backend": dict(table.backend),
                "settings": dict(table.settings),
                "machine": dict(table.machine),
            },
        }
        return table.costs(self.phase), record


@dataclass(frozen=True)
class PlanSearch:
    """One search: the document (what pareto.json holds), the DP's result, the model and the resolved budget.
    ``full`` is the space's widest plan, which a score other than psi_MP may leave off the front: the full model
    (every layer whole) unless the space's options stop below it (``document.cost["full_is_model"]`` says which)."""

    document: ParetoDocument
    result: ParetoResult
    space: SearchSpace
    model: ModelSource | None
    budget: int
    above_full: bool
    full: Point
    score: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # the generated one printed the front three times over (123 MB for a 70B search)
        model = self.model.name if self.model else None
        return (
            f"PlanSearch(model={model!r}, space={self.space.name!r}, budget={self.budget:,}, "
            f"selected point {self.selected} of {len(self.document.points)})"
        )

    @property
    def selected(self) -> int:
        return int(self.document.selected)


def _space(space: str | None, model: ModelSource | None, overrides: Mapping[str, Any], adapter: str | None):
    name = "lonas" if space is None else space  # --space '' is an unknown space, not the default
    settings = dict(overrides)
    if adapter is not None and not str(adapter).strip():  # '' read as no adapter
        raise ConfigError(must_be("adapter", "a LoRA adapter folder or None", adapter))
    if adapter is not None:
        from nsc_prune.spaces.lonas import comparable, read_adapter_config, trained_space_settings

        kind = load_space_yaml(name)[1]["kind"]
        if kind != "lonas":
            raise ConfigError(
                f"--adapter describes a LoNAS super-adapter; space {name!r} is of kind {kind!r} (use --space lonas)"
            )
        from_adapter = read_adapter_config(adapter, model.config.get("model_type") if model else None)
        clash = sorted(
            k for k in from_adapter if k in overrides and comparable(k, overrides[k]) != comparable(k, from_adapter[k])
        )
        if clash:
            raise ConfigError(
                f"--set {', '.join(clash)} contradicts --adapter {adapter}, whose adapter_config.json gives "
                f"{', '.join(f'{k}={from_adapter[k]!r}' for k in clash)}; drop that --set (the adapter's own "
                "settings are what it was trained with)"
            )
        # the subnets a super-adapter was trained on (its widths, rank deltas), under --set and the adapter's config
        trained = trained_space_settings(adapter, from_adapter["lora_rank"])
        try:
            return build_space(name, model.config if model else None, **{**trained, **settings, **from_adapter})
        except ConfigError as err:
            if not trained:
                raise
            raise ConfigError(f"{err} (the space as trained, from {adapter}'s {SUPERNET_RECORD_NAME})") from err
    return build_space(name, model.config if model else None, **settings)


def resolve_space(
    model: str | None,
    space: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    adapter: str | None = None,
) -> tuple[ModelSource | None, SearchSpace]:
    """The model (None for the NAS spaces) and the built space a search over ``space`` (default ``lonas``) of
    ``model`` runs on: what ``search_plan`` and ``nsc-prune profile`` share."""
    if model is None and space is None:
        raise ConfigError("pass --model (a preset, folder or cached hub id) or --space (a NAS space such as txl-wt103)")
    if overrides is not None and not isinstance(overrides, Mapping):  # a list was a TypeError from dict()
        raise ConfigError(must_be("overrides", 'a mapping of space keys, e.g. {"ffn_step": 64}', overrides))
    resolved = resolve_model(model) if model is not None else None  # --model '' is refused, not absent
    return resolved, _space(space, resolved, overrides or {}, adapter)


def _check_score_inputs(space: SearchSpace, model: ModelSource | None, score: ScoreSettings) -> None:
    """``_scored``'s checks of its inputs (the family, the weights, the device, the calibration text, the table
    path), so that a bad one is named before the budget and nothing is computed before the budget is checked."""
    if score.backend == "psi_mp":
        return
    if model is None:
        raise ConfigError(f"--score {score.backend} needs --model (the model whose weights --weights holds)")
    if score.backend == "psi_w":
        from nsc_prune.hf.score.psi_w import check_psi_w_inputs
        from nsc_prune.hf.weights.compute import Compute

        Compute(score.device).check()  # before a launcher's ranks join on that device
        check_psi_w_inputs(space, model.config, score.weights)  # another model's weights: named before the budget
        return
    from nsc_prune.hf.score.sensitivity import check_table_inputs

    check_table_inputs(space, score.weights, model.config, score.sensitivity, score.table)


def _weights_bars(score: ScoreSettings) -> contextlib.AbstractContextManager[None]:
    """``score.progress`` False: no bar while weights are read (transformers' "Loading weights" and psi_W's too)."""
    if score.backend == "psi_mp":  # reads no weights
        return contextlib.nullcontext()
    from nsc_prune.hf.progress import quiet

    return quiet(not score.progress)


def _scored(space: SearchSpace, model: ModelSource | None, closed_form: ParetoResult, cost: str, seq_len: int,
            score: ScoreSettings, latency: LayerCosts | None) -> tuple[ParetoResult, dict[str, Any]]:  # fmt: skip
    """The result under ``score``'s values and the record for pareto.json's ``score``."""
    if score.backend == "psi_mp":
        return closed_form, {"backend": "psi_mp"}
    from nsc_prune.hf.weights.fingerprint import weights_fingerprint

    weights = {"weights": str(Path(score.weights).resolve()), "weights_fingerprint": weights_fingerprint(score.weights)}
    if score.backend == "psi_w":
        from nsc_prune.hf.ranks import current_ranks
        from nsc_prune.hf.score.psi_w import consistency_report, weight_values

        ranks = current_ranks(score.device)
        values = weight_values(space, score.weights, model.config, device=score.device, ranks=ranks)
        result = search(space, cost=cost, seq_len=seq_len, values=values, latency=latency)
        return result, {
            "backend": "psi_w",
            **weights,
            "selection": "first",  # psi_W rates each cut on its first channels (docs/search.md)
            "processes": ranks.count,
            "consistency_vs_psi_mp": consistency_report(closed_form, result, values[0]),
        }
    from nsc_prune.hf.score.sensitivity import BACKEND, sensitivity_table

    table = sensitivity_table(space, score.weights, model.config, score.sensitivity, score.table, score.progress)
    table = table.shrunk(score.shrink)
    result = search(space, cost=cost, seq_len=seq_len, values=table.values(), latency=latency)
    return result, {"backend": BACKEND, **weights, **table.record}


def _refined(
    space: SearchSpace, model: ModelSource, score: ScoreSettings, result: ParetoResult, selected: int, budget: int,
    cost: str, seq_len: int, latency: LayerCosts | None,
) -> tuple[ParetoResult, int, dict[str, Any]]:  # fmt: skip
    """Plan-conditioned refinement (``--refine N``): measure every layer's options with the others cut as the plan
    says (which also measures the plan's own damage), solve again at the same budget (exact over that table), and
    repeat on the new plan, for at most N tables, stopping early when the new plan was measured already (unchanged,
    or a cycle). Returns the result and selected point of the measured plan with the least damage (so never one
    measured worse than the unrefined plan), and a record of the rounds."""
    from nsc_prune.hf.score.sensitivity import sensitivity_table

    rows = elastic_layer_plans(space, "--refine")

    def options(found: ParetoResult, index: int) -> tuple[int, ...]:
        return tuple(row.index(label) for row, label in zip(rows, found.points[index].layers, strict=True))

    plan = options(result, selected)
    solved, damage, rounds = {plan: (result, selected)}, {}, []
    for _ in range(score.refine):
        table = sensitivity_table(
            space, score.weights, model.config, score.sensitivity, progress=score.progress, plan=plan
        )
        damage[plan] = table.record["plan_damage"]
        values = table.shrunk(score.shrink).values()  # the DP's table; predictions stay the measured ones
        found = search(space, cost=cost, seq_len=seq_len, values=values, latency=latency)
        index = found.index_under(budget)
        new = options(found, index)
        rounds.append({
            "plan": list(plan),
            "plan_damage": damage[plan],
            "next_predicted_damage": damage[plan] + table.predicted_damage(new) - table.predicted_damage(plan),
            "layers_changed": sum(a != b for a, b in zip(plan, new, strict=True)),
            "table": table.record["table"],
            "cache_hit": table.record["cache_hit"],
            "seconds": table.record.get("seconds"),
        })  # fmt: skip
        solved.setdefault(new, (found, index))
        if new in damage:
            break
        plan = new
    best = min(damage, key=damage.__getitem__)
    record = {"rounds": rounds, "converged": rounds[-1]["layers_changed"] == 0, "plan": list(best)}
    return *solved[best], record


def search_plan(
    model: str | os.PathLike | None,
    budget: str | int,
    space: str | os.PathLike | None = None,
    cost: str = "params",
    *,
    seq_len: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    adapter: str | os.PathLike | None = None,
    score: ScoreSettings | None = None,
    allow_above_full: bool = False,
    latency: LatencySettings | None = None,
) -> PlanSearch:
    """Search ``space`` (default ``lonas``) of ``model`` (a preset, a folder with config.json or a cached hub id;
    None for the NAS spaces) and select the best plan under ``budget`` (``5.7B``, ``85%``, ...).

    ``overrides`` replace space YAML keys (``{"ffn_step": 64}``); ``adapter`` reads a LoNAS adapter's ranks;
    ``score`` picks the DP's values (default psi_MP; ``score.refine`` refines a measured plan at the budget);
    ``latency`` a measured latency table, the cost under ``cost="latency"`` (every point then also records its
    predicted latency). InfeasibleBudgetError below the
    smallest plan; a budget above the full model is refused unless ``allow_above_full``."""
    check_settings(score=(score, ScoreSettings), latency=(latency, LatencySettings))  # score="psi_w" failed late
    check_cost_kind(budget, cost, latency is not None)  # before any work: "45ms" under --cost params
    score = score or ScoreSettings()
    if score.backend == "measured" and isinstance(overrides, Mapping) and "init" in overrides:  # the same front
        raise ConfigError(
            "--init (or --set init) applies to psi_MP (--score psi_mp, and psi_w's comparison with it); --score "
            "measured ranks by measured damage, which no init enters"
        )
    resolved, built = resolve_space(model, space, overrides, adapter)
    seq_len = built.default_seq_len if seq_len is None else seq_len  # 0 is refused by search, not the default
    if cost == "latency" and resolved is None:
        raise ConfigError(_no_model_to_time(built))
    if cost == "latency" and latency is None:
        raise ConfigError("--cost latency needs --latency-table FILE (measure one with nsc-prune profile)")
    costs, cost_info = latency.read(built, resolved) if latency is not None else (None, {})
    closed_form = search(built, cost=cost, seq_len=seq_len, latency=costs)
    # The budget is checked before a measured table is built (hours at 70B): the cheapest plan and the full model
    # (psi_MP grows with width) are the ends of the front whatever the score.
    _check_score_inputs(built, resolved, score)
    first, full = closed_form.points[0], closed_form.points[-1]
    other_full = full.macs if cost == "params" else None
    smallest, full_cost = closed_form.cost_of(first), closed_form.cost_of(full)
    # what a percentage is of: the front's widest plan, the model unless the space stops below it (lonas with
    # ffn_fractions [0.75, 0.5]; a homogeneous space over layers of other widths); a benchmark space is its own
    is_model = resolved is None or full.params == model_params(resolved.config)
    resolved_budget = check_budget(
        budget, smallest, full_cost, cost, other_full, allow_above_full, built.name, whole=full_name(is_model)
    )
    with _weights_bars(score):
        result, score_info = _scored(built, resolved, closed_form, cost, seq_len, score, costs)
        selected = result.index_under(resolved_budget)
        if score.refine:
            result, selected, refinement = _refined(
                built, resolved, score, result, selected, resolved_budget, cost, seq_len, costs
            )
            score_info = {**score_info, "refinement": refinement}
    model_info = {"name": resolved.name, "source": resolved.source, "config": resolved.config} if resolved else None
    over = resolved_budget > full_cost
    budget_info = {"requested": budget, "resolved": resolved_budget, "above_full_model": over}
    # a percentage's base when extract reads the front again, and whether it is the model (its messages name it)
    cost_info = {**cost_info, "full": full_cost, "full_is_model": is_model}
    document = ParetoDocument.from_result(result, selected, model_info, budget_info, score=score_info, cost=cost_info)
    return PlanSearch(document, result, built, resolved, resolved_budget, over, full, score_info)
