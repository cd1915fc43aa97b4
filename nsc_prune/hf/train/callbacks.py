"""The Trainer callbacks of a recovery run: stop at a SIGTERM (or SIGHUP) or a NaN loss, re-size a timed run
(``--minutes``) from its own steps, skip the evaluation at the stop step when the caller evaluates the final
model itself, and print the run's log lines into a batch job's log."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsc_prune._io import atomic_write_text, handling_signals, to_json
from nsc_prune.errors import require
from nsc_prune.hf.train.budget import SizedRun, resize
from nsc_prune.hf.train.launch import agreed_sizing

if TYPE_CHECKING:
    from nsc_prune.hf.train.trainer import RecoveryTrainer

torch = require("torch", "hf")
transformers = require("transformers", "hf")


class StopOnSignal(transformers.TrainerCallback):
    """Turns a stop signal (SIGTERM, SIGHUP: ``signal_name`` set by the handler) into "save a checkpoint and stop"
    at the end of the step."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


class ResizeWhileRatesAllow(transformers.TrainerCallback):
    """``--minutes``: re-size the run from its own steps' seconds (``budget.resize``) after every step whose rates,
    and the next one's, are those of any horizon (``schedule.resizable``: the warm-up's end under ``cosine``, every
    step from there to the decay's first under ``wsd``); the schedule's horizon, the Trainer's stop and the stored
    run record follow, and the sizing is settled at the last such step. A step costs the budget's clock from the
    end of the step before to its own end, so the periodic evaluation and checkpoint writes between steps are
    charged, spread over the steps; the first step this process runs also allocates and sets no rate. The
    scheduler has already set the next step's rate when this runs, so the run's rates are those of a run planned
    with the final horizon from its start."""

    def __init__(
        self, trainer: RecoveryTrainer, sized: SizedRun, clock: Callable[[], float], record: dict[str, Any], path: Path
    ) -> None:
        self.trainer, self.sized, self.clock, self.record, self.path = trainer, sized, clock, record, path
        self.first_step: int | None = None
        self.began: float | None = None  # this process's first step began
        self.first_end: float | None = None  # ... and ended
        self.tokens_at_first_end = 0  # every process's tokens seen then (a pass's last step may hold fewer)
        self.timed = 0  # steps this process ran

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # A resumed run's checkpoint holds the horizon of its save; the stored sizing may be later (it is rewritten
        # at every re-size, a checkpoint only every --save-steps): the sizing wins, and the next rate follows it.
        self.trainer.schedule.horizon = self.sized.max_steps
        scheduler = self.trainer.lr_scheduler
        for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True):
            group["lr"] = base * self.trainer.schedule(state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.began is None:
            self.first_step = state.global_step
            self.began = self.clock()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        now = self.clock()
        self.timed += 1
        if self.first_end is None:
            self.first_end, self.tokens_at_first_end = now, state.num_input_tokens_seen
        schedule, step = self.trainer.schedule, state.global_step
        if self.sized.settled or step < schedule.warmup:
            return control
        sized = self.sized
        if schedule.resizable(step) and self.timed >= 2:  # one step (it also allocated) times nothing
            step_seconds = (now - self.first_end) / (self.timed - 1)
            step_tokens = (state.num_input_tokens_seen - self.tokens_at_first_end) / (self.timed - 1) / args.world_size
            untimed = self.first_step or 0  # the steps a stopped run did before this process resumed it
            sized = resize(sized, step, now - self.began + untimed * step_seconds, step_seconds, step_tokens)
            sized = dataclasses.replace(sized, max_steps=schedule.fit_horizon(step, sized.max_steps))
        self.sized = agreed_sizing(dataclasses.replace(sized, settled=not schedule.resizable(step + 1)))
        schedule.horizon = self.sized.max_steps
        state.max_steps = self.sized.max_steps
        if self.trainer.is_world_process_zero():  # what a resume reads
            atomic_write_text(self.path, to_json({**self.record, "budget": self.sized.to_dict()}))
        for callback in self.trainer.callback_handler.callbacks:  # the progress bar's total, when one shows
            bar = getattr(callback, "training_bar", None)
            if bar is not None and bar.total != self.sized.max_steps:
                bar.total = self.sized.max_steps
                bar.refresh()
        if step >= state.max_steps:  # the steps so far used the budget
            control.should_training_stop = control.should_save = True
        return control


def tensors_finite(tensors: Iterable[Any]) -> bool:
    """Whether every element of ``tensors`` (floating-point torch tensors) is finite, with one device sync. A sum is
    NaN or inf where any element is (an inf never cancels to a finite sum): on SmolLM2's float32 gradients, 0.02 s
    against 0.3 s for an elementwise check, run at every step. Finite values whose float32 sum overflows (beyond
    3e38) count as not finite, a run there having diverged anyway."""
    sums = [t.sum(dtype=torch.float32) for t in tensors]
    return not sums or bool(torch.isfinite(torch.stack(sums)).all())


class StopOnDivergence(transformers.TrainerCallback):
    """Stops a run at the first step whose gradients, or the first logged loss, are NaN or inf (a learning rate too
    high, say), or whose logged gradient norm is 0, without saving or evaluating that step; ``step`` is where it
    was seen (None: never). The gradients are checked after the processes' reduction, so every process stops at the
    same step, and every step is checked, the last ones included (a logged loss is one every --logging-steps).
    A norm of 0 is a diverged run whose residual stream overflowed inside RMSNorm (x^2 -> inf, rsqrt -> 0): every
    logit 0, the loss a finite ln(vocabulary), no gradient left; a live run always has some."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        if not tensors_finite(p.grad for p in model.parameters() if p.grad is not None):
            self._stop(state.global_step + 1, control)  # the step being taken
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.step is not None:  # after the other callbacks' on_step_end: no save or evaluation of this step
            self._stop(self.step, control)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        losses = [value for key, value in (logs or {}).items() if key in ("loss", "eval_loss")]
        if any(not math.isfinite(value) for value in losses) or (logs or {}).get("grad_norm") == 0:
            self._stop(state.global_step if self.step is None else self.step, control)
        return control

    def _stop(self, step: int, control: Any) -> None:
        self.step = step
        control.should_training_stop = True
        control.should_save = control.should_evaluate = False


class BarOnStderr(transformers.trainer_callback.ProgressCallback):
    """The Trainer's bar, with the dicts it logs written above it on stderr beside the bar: ``tqdm.write`` writes
    to stdout, which carries a command's result alone (``heal ... > result.txt`` filled with one dict a step)."""

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            super().on_log(args, state, control, logs=logs, **kwargs)


class LogLines(transformers.TrainerCallback):
    """A run's progress in a batch job's log, where no bar is drawn: one line on stdout per logged loss (the step of
    the run's total, its loss, learning rate and gradient norm, the tokens so far and the run's tokens/s, every
    process's, since a resume; the time elapsed and left), one per held-out loss, and one at the end. The time left
    is this process's seconds per step so far times the steps to go. ``planned`` gives a timed run's (``--minutes``)
    total as sized so far: the Trainer's own is the cap its re-sizing may grow to."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, planned: Callable[[], int] | None = None) -> None:
        self.clock, self.planned = clock, planned
        self.began = 0.0
        self.first_step = 0  # a resumed run's checkpoint step: the seconds per step are this process's

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.began, self.first_step = self.clock(), state.global_step

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if state.is_world_process_zero and logs:
            line = self.line(logs, state.global_step, self.planned() if self.planned else state.max_steps)
            if line:
                print(line, file=sys.stdout, flush=True)
        return control

    def line(self, logs: dict[str, Any], step: int, total: int) -> str | None:
        """The line of one log of the Trainer at ``step`` of ``total`` (None for one of no loss)."""
        at = f"step {step:,}/{total:,}"
        if "eval_loss" in logs:
            return f"{at}: held-out loss {logs['eval_loss']:.4f}"
        if "train_loss" in logs:  # the end: a run shorter than --logging-steps printed nothing before it
            return f"{at}: done, mean loss {logs['train_loss']:.4f}, {_interval(self.clock() - self.began)} elapsed"
        if "loss" not in logs:
            return None
        parts = [f"loss {logs['loss']:.4f}"]
        for key, name in (("learning_rate", "learning rate"), ("grad_norm", "grad norm")):
            if key in logs:
                parts.append(f"{name} {logs[key]:.3g}")
        if "num_input_tokens_seen" in logs:
            rate = logs.get("train_tokens_per_second")
            parts.append(f"{logs['num_input_tokens_seen']:,} tokens" + (f" ({rate:,.0f} tokens/s)" if rate else ""))
        elapsed = self.clock() - self.began
        done = step - self.first_step
        left = elapsed / done * max(total - step, 0) if done > 0 else None
        parts.append(f"{_interval(elapsed)} elapsed, {_interval(left) if left is not None else '?'} left")
        return f"{at}: " + ", ".join(parts)


def _interval(seconds: float) -> str:
    """``seconds`` as the progress bars write a time (``12:10``, ``1:02:03``)."""
    from tqdm import tqdm

    return tqdm.format_interval(seconds)


class NoEvaluationAtStop(transformers.TrainerCallback):
    """Drops the held-out evaluation the Trainer runs at the step training stops at (the last step, a SIGTERM or
    a spent time budget): for a caller that measures the final model on the same blocks itself (``heal``)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if control.should_training_stop:
            control.should_evaluate = False
        return control


def sigterm_requests(stopper: StopOnSignal) -> contextlib.AbstractContextManager[None]:
    """While it is open, a SIGTERM or SIGHUP sets ``stopper.signal_name`` instead of killing the process (main thread
    only)."""

    def handler(signum: int, frame: Any) -> None:
        stopper.signal_name = signal.Signals(signum).name

    return handling_signals(handler)
