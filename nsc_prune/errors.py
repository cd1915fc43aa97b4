"""Typed errors. Every user-facing failure is one of these; the CLI prints its message on one line."""

from __future__ import annotations

import signal
import types


class NSCError(Exception):
    """Base class for every error nsc-prune raises on purpose.

    ``every_rank=True``: raised alike by every process of a launched run (a verdict the ranks reached together, or
    a launch setting they all share), so rank 0 alone prints it."""

    def __init__(self, *args: object, every_rank: bool = False):
        super().__init__(*args)
        self.every_rank = every_rank


class InvalidInputError(NSCError, ValueError):
    """A value passed by the user is out of range, malformed or inconsistent."""


class InfeasibleBudgetError(InvalidInputError):
    """No plan fits the budget. ``min_cost`` is the cheapest feasible cost."""

    def __init__(self, message: str, min_cost: int):
        super().__init__(message)
        self.min_cost = min_cost


class ConfigError(InvalidInputError):
    """A model config, space YAML or adapter config is missing fields or does not match."""


class UnsupportedArchitectureError(ConfigError):
    """The model type has no spec builder."""


class MissingDependencyError(NSCError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


class Stopped(NSCError):
    """A stop signal (SIGTERM, SIGHUP) ended a command that kept its work so far; the message says where and how to
    go on. The CLI exits ``status`` (128 + the signal), as a process the signal ends."""

    def __init__(self, message: str, signal_name: str = "SIGTERM") -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.status = 128 + signal.Signals[signal_name]


class StoppedRun(Stopped):
    """A stop signal stopped a training run at the end of a step, after it saved ``checkpoint``; the same command
    with ``--resume`` continues there."""

    def __init__(self, steps: int, checkpoint: object, signal_name: str = "SIGTERM") -> None:
        super().__init__(
            f"stopped by {signal_name} after step {steps}; the checkpoint is in {checkpoint}. "
            "Run the same command with --resume to continue",
            signal_name,
        )
        self.checkpoint = checkpoint


class InterruptedRun(KeyboardInterrupt):
    """Ctrl-C stopped a training run that left checkpoints to resume from; the message says where and how."""


def require(module: str, extra: str) -> types.ModuleType:
    """Import an optional module or raise MissingDependencyError naming the pip extra (``import_problem``)."""
    import importlib

    try:
        return importlib.import_module(module)
    except Exception as err:  # an ImportError, or whatever else the module's own import code raised
        raise MissingDependencyError(import_problem(module, extra, err)) from err


def import_problem(module: str, extra: str, err: Exception, needed_for: str = "this command") -> str:
    """Why ``module`` did not import, in one line: not installed (name the pip extra), or installed but failing
    to import (name what failed: a dependency of it missing, or built for another numpy), which "not installed"
    would hide."""
    import importlib.util

    top = module.split(".")[0]
    missing = getattr(err, "name", None)
    if missing in (module, top) or (missing is None and importlib.util.find_spec(top) is None):
        return f"{module!r} is required for {needed_for}: pip install 'nsc-prune[{extra}]'"
    cause = " ".join(str(err).split()) or type(err).__name__
    if any(sign in cause for sign in ("bad_alloc", "Cannot allocate memory", "failed to map segment")):
        return f"out of memory while importing {module!r} ({cause}): let the process use more memory (raise ulimit -v)"
    return (
        f"{module!r} is installed but does not import ({type(err).__name__}: {cause}); reinstall it with the "
        f"versions nsc-prune supports: pip install --upgrade 'nsc-prune[{extra}]'"
    )


def require_installed(module: str, extra: str) -> None:
    """Raise MissingDependencyError naming the pip extra unless ``module`` is installed, without importing it
    (for code that must configure things before the module's first import)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(f"{module!r} is required for this command: pip install 'nsc-prune[{extra}]'")
