"""The learning-rate schedules of a run: linear warm-up, then cosine decay to 0 at the run's last step
(``cosine``), or warm-up, the peak, and a decay over the run's last fifth (``wsd``: warm-up, stable, decay).

Each is transformers' (``get_cosine_schedule_with_warmup``; ``get_wsd_schedule`` with ``decay_type="1-sqrt"``),
as a multiplier object rather than a closure, so that a time budget can move the horizon once the run has
measured its own steps (``budget.resize``), and so that ``LambdaLR`` checkpoints the horizon with the
scheduler's state (it saves a callable object's ``__dict__``): a resumed run decays to the same step as the run
it continues. Why two: a cosine rate depends on the run's length from the warm-up's end on, so a timed run can
re-size itself only there; a ``wsd`` rate does not until its decay begins, so a timed run re-sizes itself at
every step up to that point, from every step it has timed (``trainer``), and fills its budget.
"""

from __future__ import annotations

import abc
import math

SCHEDULES = ("cosine", "wsd")
DECAY_FRACTION = 0.2  # wsd: the decay's share of the run (Hagele et al. 2024: a fifth of 1-sqrt matches cosine)


class _Schedule(abc.ABC):
    """``lr(step) / peak`` over a run of ``horizon`` steps whose first ``warmup`` steps rise linearly from 0."""

    def __init__(self, warmup: int, horizon: int) -> None:
        self.warmup = int(warmup)
        self.horizon = int(horizon)

    @property
    @abc.abstractmethod
    def decay_start(self) -> int:
        """The last step whose rate (the peak) is that of any horizon; the rates after it depend on ``horizon``."""

    @abc.abstractmethod
    def __call__(self, step: int) -> float:
        """The rate of ``step`` over the peak."""

    def resizable(self, step: int) -> bool:
        """Whether the run may be re-sized after ``step`` steps: every rate it has run, and the next one, are
        those of any horizon (from the warm-up's end to ``decay_start``)."""
        return self.warmup <= step <= self.decay_start

    def fit_horizon(self, step: int, horizon: int) -> int:
        """The horizon of a re-size to ``horizon`` after ``step`` steps that keeps the rates already run."""
        return horizon


class WarmupCosine(_Schedule):
    """``step / warmup`` during the warm-up, then a half cosine from 1 to 0 over the steps from ``warmup`` to
    ``horizon``. Only the warm-up's rates and the peak after it do not depend on ``horizon``."""

    @property
    def decay_start(self) -> int:
        return self.warmup

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return float(step) / float(max(1, self.warmup))
        progress = float(step - self.warmup) / float(max(1, self.horizon - self.warmup))
        # num_cycles 0.5, multiplied in transformers' order so that every rate equals theirs to the bit
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


class WarmupStableDecay(_Schedule):
    """``step / warmup`` during the warm-up, 1 until ``decay_start``, then ``1 - sqrt(p)`` over the run's last
    ``decay_steps`` steps (``p`` from 0 to ``(n - 1) / n``)."""

    @staticmethod
    def decay_steps(warmup: int, horizon: int) -> int:
        """The decay's steps in a run of ``horizon``: ``DECAY_FRACTION`` of it, at least one, never the warm-up's."""
        return min(max(1, round(DECAY_FRACTION * horizon)), max(0, horizon - warmup))

    @property
    def decay_start(self) -> int:
        return self.horizon - self.decay_steps(self.warmup, self.horizon)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return float(step) / float(max(1, self.warmup))
        if step < self.decay_start:
            return 1.0
        if step < self.horizon:
            progress = float(step - self.decay_start) / float(max(1, self.decay_steps(self.warmup, self.horizon)))
            return max(0.0, 1.0 - math.sqrt(progress))
        return 0.0

    def fit_horizon(self, step: int, horizon: int) -> int:
        """``horizon``, or the shortest whose decay starts at ``step`` where it would start earlier: the rates
        already run stay the peak's."""
        while horizon - self.decay_steps(self.warmup, horizon) < step:
            horizon += 1
        return horizon


def make_schedule(name: str, warmup: int, horizon: int) -> WarmupCosine | WarmupStableDecay:
    """The multiplier of schedule ``name`` (one of ``SCHEDULES``)."""
    return {"cosine": WarmupCosine, "wsd": WarmupStableDecay}[name](warmup, horizon)
