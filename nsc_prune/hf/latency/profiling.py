"""Profiling, whatever the backend: models timed in turn in rounds, each layer option's cost against a reference
model, and the latency table assembled from what was measured (``nsc_prune.hf.latency.transformers_backend`` for transformers,
``nsc_prune.hf.latency.llamacpp_backend`` for llama.cpp; the method is in their docstrings and docs/speed.md).

A shared CPU is noisy: single timings of one model vary by tens of percent in slow spells lasting seconds. So the
stacks and the reference are built together (up to ``MAX_TIMED_BYTES`` of weights at a time), timed in turn for
``repeats`` rounds, and each keeps its fastest run.

What is timed is a ``LayerShape``: a layer's dims narrowed to a ``LayerPlan`` (its FFN width and KV groups; LoRA is
merged away, a dropped layer is not timed). Layers of one shape share a timing.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from nsc_prune._io import provenance
from nsc_prune.choices import PHASES
from nsc_prune.core.front import SearchSpace
from nsc_prune.core.latency_table import LatencyTable, ProfileSettings, model_fingerprint, space_options
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.core.spec import DecoderDims, layer_dims
from nsc_prune.errors import InvalidInputError
from nsc_prune.hf.progress import progress

K = TypeVar("K")
Timer = Callable[[Any, bool], dict[str, float]]  # once(model, warmup) -> seconds per phase of one run
MAX_TIMED_BYTES = 2 * 2**30  # weights of the models timed in turn at once


def time_rounds(models: Mapping[K, Any], settings: ProfileSettings, once: Timer) -> dict[K, list[dict[str, float]]]:
    """Each model's time per phase (``PHASES``) in each of ``settings.repeats`` rounds. After one warm-up each,
    the models are timed in turn in every round, so a slow spell of a shared machine hits them alike. ``once(model,
    warmup)`` times one run of both phases with the backend's timers."""
    rounds = {key: [once(model, True)] for key, model in models.items()}
    for _ in range(settings.repeats - 1):
        for key, model in models.items():
            rounds[key].append(once(model, False))
    return rounds


def fastest(rounds: Mapping[K, list[dict[str, float]]]) -> dict[K, dict[str, float]]:
    """The fastest run of each phase of each model in ``time_rounds``' output: the estimate least affected by
    interference (as ``timeit`` advises)."""
    return {key: {phase: min(run[phase] for run in runs) for phase in PHASES} for key, runs in rounds.items()}


def time_models(models: Mapping[K, Any], settings: ProfileSettings, once: Timer) -> dict[K, dict[str, float]]:
    """The fastest run of each phase of each model over ``time_rounds``."""
    return fastest(time_rounds(models, settings, once))


def machine_record(**backend: Any) -> dict[str, Any]:
    """Where a table was measured: the machine, and what the backend adds (its threads, the GPU)."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        **backend,
    }


@dataclass(frozen=True)
class LayerShape:
    """One timed decoder layer: a layer of ``dims`` narrowed to ``plan``. The plan is held as timed (FFN width and
    KV groups, every field set: a LoRA rank is merged away), so equal shapes are equal keys."""

    dims: DecoderDims
    plan: LayerPlan

    def __post_init__(self) -> None:
        if not self.plan.keep:
            raise InvalidInputError(f"a dropped layer has no shape to time; got {self.plan}")
        timed = LayerPlan(ffn=self.plan.ffn, kv_groups=self.plan.groups_of(self.dims.num_key_value_heads))
        object.__setattr__(self, "plan", timed)

    @classmethod
    def full(cls, dims: DecoderDims) -> LayerShape:
        """The unpruned layer of ``dims``."""
        return cls(dims, LayerPlan(ffn=dims.intermediate_size))

    @property
    def heads(self) -> int:
        """Query heads: each kept KV group keeps its ``group_size`` of them."""
        return self.plan.kv_groups * self.dims.group_size


def option_shapes(space: SearchSpace, config: Mapping[str, Any]) -> set[LayerShape]:
    """The distinct kept options of ``space``; layers of one shape share a timing."""
    options, dims = space_options(space), layer_dims(config)
    return {LayerShape(dims[l], plan) for l, plans in enumerate(options) for plan in plans if plan.keep}


def dense_fits(space: SearchSpace, config: Mapping[str, Any], itemsize: float) -> bool:
    """Whether the dense model is timed, and anchors the fixed part: it is the space's widest plan (a space whose
    widths stop below the model's, lonas with ``ffn_fractions=[0.75, 0.5]`` say, has it nowhere: its time less the
    widest options' would put the missing width into every plan) and its weights fit ``MAX_TIMED_BYTES``."""
    dims = layer_dims(config)
    widest = all(
        LayerShape(dims[l], plans[0]) == LayerShape.full(dims[l]) for l, plans in enumerate(space_options(space))
    )
    sub = space.subspaces[0]
    return widest and (sub.fixed.params + sum(row[0].params for row in sub.layers)) * itemsize <= MAX_TIMED_BYTES


def time_options(
    shapes: set[LayerShape],
    build_stack: Callable[[LayerShape], Any],
    nbytes: Callable[[Any], int],
    reference: Any,
    dense: Any | None,
    settings: ProfileSettings,
    once: Timer,
) -> tuple[dict[LayerShape, dict[str, float]], dict[str, float], dict[str, float] | None]:
    """Each option's cost per phase, ``(t(build_stack(shape)) - t(reference)) / settings.stack``: the stacks are
    built up to ``MAX_TIMED_BYTES`` at a time, ``reference`` and ``dense`` counted (a batch is timed before the next
    stack when that stack, as large as the last one built, would pass it; at least one stack a batch), and timed in
    turn with ``reference`` (and ``dense``, in the first batch), the fastest run of each. Returns the costs, the
    reference's time and the dense model's (or None)."""
    reference_runs, measured, batch, dense_time = [], {}, {}, None
    anchor = {} if dense is None else {"dense": dense}
    fixed = nbytes(reference) + (nbytes(dense) if dense is not None else 0)  # held by the caller throughout
    held, last = fixed, 0

    def time_batch() -> None:
        nonlocal dense_time
        timed = time_models({"reference": reference, **anchor, **batch}, settings, once)
        reference_runs.append(timed["reference"])
        dense_time = dense_time or timed.get("dense")
        anchor.clear()
        for shape in batch:
            measured[shape] = {p: max(0.0, (timed[shape][p] - timed["reference"][p]) / settings.stack) for p in PHASES}
        batch.clear()

    for shape in progress(
        sorted(shapes, key=repr), desc=f"profiling layer options ({settings.backend})", unit="option"
    ):
        if batch and held + last > MAX_TIMED_BYTES:
            time_batch()
            held = fixed
        batch[shape] = build_stack(shape)
        last = nbytes(batch[shape])
        held += last
    if batch:
        time_batch()
    return measured, {p: min(run[p] for run in reference_runs) for p in PHASES}, dense_time


@dataclass(frozen=True)
class Measured:
    """What a backend measured: each option's cost (by ``LayerShape``), the model without layers (and how it was
    had), the dense model's time (None when it was not timed), and with what, where."""

    options: Mapping[LayerShape, Mapping[str, float]]
    without_layers: Mapping[str, float]
    without_layers_from: str
    dense: Mapping[str, float] | None
    versions: Mapping[str, str]
    machine: Mapping[str, Any]


def assemble_table(
    space: SearchSpace,
    config: Mapping[str, Any],
    model_name: str,
    settings: ProfileSettings,
    measured: Measured,
    start: float,
) -> LatencyTable:
    """The table of a profile: each option's measured cost, nothing for a dropped layer, and the fixed part: the
    dense model's time less its layers' when it was timed (the intercept that makes the dense prediction its
    measured time), else the model without layers."""
    options, dims = space_options(space), layer_dims(config)
    zero = dict.fromkeys(PHASES, 0.0)
    layers = tuple(
        tuple(measured.options[LayerShape(dims[l], plan)] if plan.keep else zero for plan in plans)
        for l, plans in enumerate(options)
    )
    fixed, fixed_from, dense = dict(measured.without_layers), measured.without_layers_from, measured.dense
    if dense is not None:
        fixed = {p: max(0.0, dense[p] - sum(row[0][p] for row in layers)) for p in PHASES}
        fixed_from = "the dense model's time less its layers' (timed in the same rounds)"
    backend = {
        "name": settings.backend,
        "device": settings.device,
        "dtype": settings.timed_dtype,
        "versions": dict(measured.versions),
    }
    return LatencyTable(
        model={"name": model_name, "fingerprint": model_fingerprint(config)},
        space={"name": space.name, "description": space.description, "options": options},
        fixed=fixed,
        layers=layers,
        backend=backend,
        settings={
            **asdict(settings),
            "dtype": settings.timed_dtype,
            "distinct_options": len(measured.options),
            "fixed_from": fixed_from,
            "fixed_without_layers": dict(measured.without_layers),
            "dense_measured": None if dense is None else dict(dense),
        },
        machine=dict(measured.machine),
        provenance=provenance(seconds=round(time.perf_counter() - start, 3)),
    )
