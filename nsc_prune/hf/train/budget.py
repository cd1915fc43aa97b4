"""A time budget for a training run (``--minutes``): its steps and warm-up sized from measured throughput.

How the throughput is measured (the design choice): before the run, ``probe`` times ``passes`` *probe passes*
- each the forward and backward of one optimizer step's batches (teacher and subnets included, as training
computes them) on the real model and data - and throws their gradients away. No weight, optimizer state or
learning rate is touched; the probe's time is counted against the budget. The first pass warms caches and
allocators and is charged but not timed; the others give seconds per step. The probe fixes the warm-up
(``min(recipe warm-up, recipe.WARMUP_FRACTION of the sized steps)``: never more than the run) and a first
step count.

Then the run re-sizes itself from its own steps (``resize``): two probe passes misjudge a step (on a 2-core CPU
they ran 7-23 % slower than the steps that followed), so the steps' measured seconds (all but the first this
process ran, each from the end of the step before, so the periodic evaluation and checkpoint writes between
them are charged too) replace the probe's and the step count is set to what fits the rest of the budget, as
long as the rates run so far do not depend on the run's length (``schedule.resizable``): once, at the end of the
warm-up, under ``cosine`` (its rates rise linearly from 0 whatever the length); at every step from there until
the decay begins under ``wsd``. So the schedule is exactly that of one run planned with the final length from its start.
A step count the run can no longer move is ``settled``; a run whose steps time nothing keeps the probe's count.

The sizing (``SizedRun``) is stored with the run's checkpoints and rewritten at each re-size: a resumed run
reads it back instead of measuring again, so it continues to the same step count - and the same weights - as
an uninterrupted one (a resumed run counts the steps it did not time at the rate of those it did).

Not in the budget: loading the models, the held-out losses before and after, the evaluation and checkpoint
write after the last step, and writing the output. The record states the minutes actually used by the probe
and the training loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, replace
from typing import Any

from nsc_prune._validation import is_int, is_number, must_be
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.hf.train.recipe import capped_warmup

PROBE_PASSES = 3  # forward+backward passes timed before a timed run (the first one untimed)
GROWTH_CAP = 2  # a re-size gives at most this many times the probe's steps
MAX_MINUTES = 366 * 24 * 60


@dataclass(frozen=True)
class TimeBudget:
    """``minutes`` of training (probe passes plus steps); ``clock`` (seconds, monotonic) is injectable for tests.
    ``warmup_steps``: the warm-up the recipe asks for, when it asks for more than its ``TrainConfig`` keeps (a
    config caps its warm-up at a tenth of its ``max_steps``, which a budget replaces); the sized run's cap applies
    instead. None: the config's."""

    minutes: float
    passes: int = PROBE_PASSES
    clock: Callable[[], float] = field(default=time.perf_counter, compare=False, repr=False)
    warmup_steps: int | None = None

    def __post_init__(self) -> None:
        if not is_number(self.minutes) or not math.isfinite(self.minutes) or self.minutes <= 0:
            raise ConfigError(must_be("--minutes", "a number > 0", self.minutes))
        if self.minutes > MAX_MINUTES:  # 1e308 minutes overflowed the step count
            raise ConfigError(must_be("--minutes", f"at most {MAX_MINUTES:,} (a year)", self.minutes))
        if not is_int(self.passes) or self.passes < 1:
            raise ConfigError(must_be("passes", "an integer >= 1", self.passes))
        if self.warmup_steps is not None and (not is_int(self.warmup_steps) or self.warmup_steps < 0):
            raise ConfigError(must_be("warmup_steps", "an integer >= 0", self.warmup_steps))

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
    probe_max_steps: int | None = None  # the probe's step count (``max_steps`` until the re-size moves it)
    run_step_seconds: float | None = None  # seconds a step of the run took, at its last re-size (None before)
    run_step_tokens: float | None = None  # tokens those steps held, per step and process (a pass's last is short)
    settled: bool = False  # the step count is final: no re-size is left

    def __post_init__(self) -> None:
        if self.probe_max_steps is None:
            object.__setattr__(self, "probe_max_steps", self.max_steps)

    @property
    def tokens_per_s(self) -> float:
        """Training tokens per second and process: the run's own steps once re-sized (the tokens they held), else
        the probe's passes (full batches)."""
        if self.run_step_seconds is not None:
            return (self.run_step_tokens or self.tokens_per_step) / self.run_step_seconds
        return self.tokens_per_step / self.step_seconds

    @property
    def step_cap(self) -> int:
        """The most steps this run may reach: ``GROWTH_CAP`` x the probe's count until the count is settled."""
        return self.max_steps if self.settled else self.probe_max_steps * GROWTH_CAP

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": round(self.tokens_per_s, 1)}

    @classmethod
    def from_dict(cls, data: Any) -> SizedRun:
        """A stored sizing (``to_dict``); ValueError naming the first field missing or of another type."""
        if not isinstance(data, dict):
            raise ValueError(f"the sizing must be an object; got {data!r:.40}")
        checks = {
            "minutes": lambda v: is_number(v) and 0 < v < math.inf,
            "probe_passes": lambda v: is_int(v) and v >= 1,
            "probe_seconds": lambda v: is_number(v) and 0 <= v < math.inf,
            "step_seconds": lambda v: is_number(v) and 0 < v < math.inf,
            "tokens_per_step": lambda v: is_int(v) and v >= 1,
            "max_steps": lambda v: is_int(v) and v >= 1,
            "warmup_steps": lambda v: is_int(v) and v >= 0,
            "probe_max_steps": lambda v: v is None or (is_int(v) and v >= 1),
            "run_step_seconds": lambda v: v is None or (is_number(v) and 0 < v < math.inf),
            "run_step_tokens": lambda v: v is None or (is_number(v) and 0 < v < math.inf),
            "settled": lambda v: isinstance(v, bool),
        }
        fields = cls.__dataclass_fields__
        values = {k: data[k] if k in data else fields[k].default for k in fields}
        bad = next((k for k, ok in checks.items() if values[k] is MISSING or not ok(values[k])), None)
        if bad is not None:
            raise ValueError(f"its sizing's {bad!r} is {'missing' if values[bad] is MISSING else repr(values[bad])}")
        return cls(**values)


class BudgetTooSmall(InvalidInputError):
    """A ``--minutes`` budget that holds no training step after the probe (refused before training writes)."""


def too_small(minutes: float, needed: float) -> BudgetTooSmall:
    """The one-line refusal of a budget that holds no training step."""
    return BudgetTooSmall(
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


def resize(
    sized: SizedRun, steps_done: int, seconds_spent: float, step_seconds: float, step_tokens: float | None = None
) -> SizedRun:
    """The run re-sized from its own steps: ``steps_done`` steps so far took
    ``seconds_spent`` (steps a resumed run did not time count at ``step_seconds``), and the steps left at
    ``step_seconds`` each fill the budget after the probe; at least the steps done, at most ``step_cap``.
    ``step_tokens``: the tokens a timed step held (recorded for its tokens/s; the sizing counts steps)."""
    if not step_seconds > 0:
        raise InvalidInputError(must_be("the measured seconds per step", "> 0", step_seconds))
    left = sized.minutes * 60.0 - sized.probe_seconds - seconds_spent
    steps = steps_done + max(0, math.floor(left / step_seconds + 1e-9))
    return replace(
        sized,
        max_steps=min(steps, sized.step_cap),
        run_step_seconds=float(step_seconds),
        run_step_tokens=None if step_tokens is None else float(step_tokens),
    )
