"""The learning-rate schedule of every run: linear warm-up, then cosine decay to 0 at the run's last step.

It is ``transformers.get_cosine_schedule_with_warmup``'s, as a multiplier object rather than a closure, so
that a time budget can move the horizon once the run has measured its own steps (``budget.resize``), and so
that ``LambdaLR`` checkpoints the horizon with the scheduler's state (it saves a callable object's
``__dict__``): a resumed run decays to the same step as the run it continues.
"""

from __future__ import annotations

import math


class WarmupCosine:
    """``lr(step) / peak``: ``step / warmup`` during the warm-up, then a half cosine from 1 to 0 over the steps
    from ``warmup`` to ``horizon``. The warm-up's values do not depend on ``horizon``."""

    def __init__(self, warmup: int, horizon: int) -> None:
        self.warmup = int(warmup)
        self.horizon = int(horizon)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return float(step) / float(max(1, self.warmup))
        progress = float(step - self.warmup) / float(max(1, self.horizon - self.warmup))
        # num_cycles 0.5, multiplied in transformers' order so that every rate equals theirs to the bit
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))
