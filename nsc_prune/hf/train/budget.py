"""A time budget for a training run (``--minutes``): its steps and warm-up sized from measured throughput.

How the throughput is measured (the design choice): before the run, ``probe`` times ``passes`` *probe passes*
- each the forward and backward of one optimizer step's batches (teacher and subnets included, as training
computes them) on the real model and data - and throws their gradients away. No weight, optimizer state or
learning rate is touched, so the learning-rate schedule is defined once, after the measurement, from the sized
step count and never depends on it retroactively; the probe's time is counted against the budget. The first
pass warms caches and allocators and is charged but not timed; the others give seconds per step. (Timing the
first real steps instead would run them under a warm-up schedule that is not yet known.)

The sized run (``SizedRun``) is fixed once and stored with the run's checkpoints: a resumed run reads it back
instead of measuring again, so it continues to the same step count - and the same weights - as an
uninterrupted one. Warm-up is ``min(recipe warm-up, recipe.WARMUP_FRACTION of the sized steps)``: never more than the
run, whatever the budget or the throughput.

Not in the budget: loading the models, the held-out losses before and after, periodic evaluation and
checkpoint writes during training, the optimizer's own update (small for LoRA), and writing the output. The
record states the minutes actually used by the probe and the training steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from nsc_prune._validation import is_int, is_number, must_be
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.hf.train.recipe import capped_warmup

PROBE_PASSES = 3  # forward+backward passes timed before a timed run (the first one untimed)


@dataclass(frozen=True)
class TimeBudget:
    """``minutes`` of training (probe passes plus steps); ``clock`` (seconds, monotonic) is injectable for tests."""

    minutes: float
    passes: int = PROBE_PASSES
    clock: Callable[[], float] = field(default=time.perf_counter, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not is_number(self.minutes) or not math.isfinite(self.minutes) or self.minutes <= 0:
            raise ConfigError(must_be("--minutes", "a number > 0", self.minutes))
        if not is_int(self.passes) or self.passes < 1:
            raise ConfigError(must_be("passes", "an integer >= 1", self.passes))

    @property
    def seconds(self) -> float:
        return float(self.minutes) * 60.0


@dataclass(frozen=True)
class SizedRun:
    """What a budget was turned into: the measurement, and the steps and warm-up it fixed (stored with the run)."""

    minutes: float
    probe_passes: int
    probe_seconds: float
    step_seconds: float
    tokens_per_step: int
    max_steps: int
    warmup_steps: int

    @property
    def tokens_per_s(self) -> float:
        """Training tokens per second the probe measured (all processes)."""
        return self.tokens_per_step / self.step_seconds

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": round(self.tokens_per_s, 1)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SizedRun:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def too_small(minutes: float, needed: float) -> InvalidInputError:
    """The one-line refusal of a budget that holds no training step."""
    return InvalidInputError(
        must_be(
            "--minutes",
            f"enough for one training step after the throughput probe (at least {needed / 60:.3g} minutes here)",
            minutes,
            "Give a larger budget, or a smaller --batch-size / --seq-len",
        )
    )


def size_run(
    minutes: float, probe_seconds: float, step_seconds: float, tokens_per_step: int, warmup_steps: int, passes: int
) -> SizedRun:
    """The run that fits ``minutes`` after the probe: ``floor((60 minutes - probe) / step)`` steps, warm-up
    ``recipe.capped_warmup``. Raises InvalidInputError when no step fits."""
    if not step_seconds > 0:
        raise InvalidInputError(must_be("the measured seconds per step", "> 0", step_seconds))
    steps = math.floor((minutes * 60.0 - probe_seconds) / step_seconds + 1e-9)
    if steps < 1:
        raise too_small(minutes, probe_seconds + step_seconds)
    warmup = capped_warmup(warmup_steps, steps)
    return SizedRun(
        minutes=float(minutes),
        probe_passes=passes,
        probe_seconds=probe_seconds,
        step_seconds=step_seconds,
        tokens_per_step=int(tokens_per_step),
        max_steps=steps,
        warmup_steps=warmup,
    )


def probe(step: Callable[[int], None], budget: TimeBudget) -> tuple[float, float]:
    """Run ``step(i)`` for ``budget.passes`` passes, reading the clock before the first and after each; returns
    (seconds charged, seconds per step). The first pass is charged but not timed (unless it is the only one); a
    budget the first pass already spends is refused at once, before the others run."""
    clock = budget.clock
    start = clock()
    step(0)
    first = clock()
    if first - start >= budget.seconds:
        raise too_small(budget.minutes, 2 * (first - start))
    end = first
    for i in range(1, budget.passes):
        step(i)
        end = clock()
    per_step = (end - first) / (budget.passes - 1) if budget.passes > 1 else first - start
    return end - start, per_step
