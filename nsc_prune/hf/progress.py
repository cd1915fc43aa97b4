"""Progress bars of the long weight steps (tqdm on stderr, with rate and ETA), a library logger quieted where its
lines are about nsc-prune's own use of it (``quiet_logger``), and the one switch that silences the bars:
extraction's tensor stream, activation calibration, psi_W scores and held-out loss. Training and lm-eval draw
their own bars (the Trainer's, lm-eval's) under the same ``--quiet``, and transformers' own (loading weights)
follows ours (``library_bars``).

A bar is drawn only on a terminal (tqdm's ``disable=None``) or in a Jupyter kernel (``in_notebook``: its stderr is
not a terminal, but a cell shows the bar), so tests and captured output stay clean; a command whose
stderr is a file (``log_lines``: a batch job's log) prints a plain line instead when a bar starts and then at most
once a minute (``LOG_EVERY_S``), so that a log shows that the job moves without filling with redraws; inside
``quiet()`` (the CLI's ``--quiet``) none is drawn.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from nsc_prune._io import context_value

T = TypeVar("T")
LOG_EVERY_S = 60.0  # a bar's line in a log at most this often
_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("nsc_prune_quiet", default=False)
_LOG_LINES: contextvars.ContextVar[bool] = contextvars.ContextVar("nsc_prune_log_lines", default=False)


def quiet(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within this block (``on``), ``progress`` draws no bar; ``quiet(False)`` leaves an outer ``quiet`` in force
    (a library call's ``progress=True`` under the CLI's ``--quiet``)."""
    return context_value(_QUIET, on or is_quiet())


def is_quiet() -> bool:
    """Whether bars are silenced here (``quiet``)."""
    return _QUIET.get()


def log_lines(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within this block (``on``) bars are lines (``bar_settings``) and a training run prints its log lines instead
    of drawing its bar: a command whose output is not a terminal (a notebook, where the library is called, keeps
    its bar)."""
    return context_value(_LOG_LINES, on)


def prints_log_lines() -> bool:
    """Whether a training run prints lines instead of a bar here (``log_lines``)."""
    return _LOG_LINES.get()


class _Lines:
    """The file tqdm draws into in a log: each redraw (a carriage return, then the bar) becomes one line."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        for part in re.split(r"[\r\n]", text):
            if part.strip():  # a cleared bar is blanks
                self.stream.write(f"nsc-prune: {part.strip()}\n")

    def flush(self) -> None:
        self.stream.flush()


def bar_settings() -> dict[str, Any]:
    """tqdm's settings for a bar here: drawn on a terminal; in a log (``log_lines``) a line when it starts and then
    at most every ``LOG_EVERY_S`` seconds, with counts, elapsed time and the time left."""
    if not prints_log_lines():
        return {"disable": False if in_notebook() else None, "dynamic_ncols": True}
    return {
        "disable": False,
        "file": _Lines(sys.stderr),
        "mininterval": LOG_EVERY_S,
        "maxinterval": LOG_EVERY_S,
        "bar_format": "{desc}: {n_fmt}/{total_fmt} {unit}, {elapsed} elapsed, {remaining} left",
    }


def bars_seen() -> bool:
    """Whether a bar drawn on stderr is seen: a terminal, or a Jupyter kernel (what tqdm's ``disable=None`` and
    ``in_notebook`` decide for ours; the Trainer's and lm-eval's bars take a bool)."""
    return in_notebook() or bool(getattr(sys.stderr, "isatty", lambda: False)())


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel, where a long library call should show its bar (an extraction of a
    70B model sat silent for minutes there, while heal and eval drew theirs)."""
    return "ipykernel" in sys.modules


def _tqdm() -> Any:
    if in_notebook():
        from tqdm.auto import tqdm  # the notebook's widget where ipywidgets is installed
    else:
        from tqdm import tqdm

    return tqdm


def progress(iterable: Iterable[T], desc: str, unit: str, total: int | None = None) -> Iterable[T]:
    """``iterable`` under a tqdm bar ``desc`` counting ``unit``s (on a terminal, or as lines in a log: ``bar_settings``;
    none when ``quiet``)."""
    if is_quiet():
        return iterable
    try:
        bar = _tqdm()
    except ImportError:  # tqdm comes with transformers; without it, no bar
        return iterable
    return bar(iterable, desc=desc, unit=unit, total=total, leave=False, **bar_settings())


@contextlib.contextmanager
def quiet_logger(name: str, level: int = logging.CRITICAL) -> Iterator[None]:
    """The library logger ``name`` at ``level`` while open, as it was after (for lines about nsc-prune's own use of
    the library, which a user cannot act on)."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


@contextlib.contextmanager
def plain_bars(shown: bool | None = None) -> Iterator[None]:
    """Within this block a tqdm bar opened without a ``disable`` argument (lm-eval's, transformers' GGUF
    conversion: no switch of theirs reaches it) is drawn only where ``shown`` (None: where ours would, on a terminal
    and not ``quiet``); tqdm as it was after. (TQDM_DISABLE set while tqdm was first imported turned them off for
    the rest of the process, a caller's own bars too.)"""
    import tqdm.std

    if shown is None:
        shown = bars_seen() and not is_quiet()
    bar = tqdm.std.tqdm
    init = bar.__dict__["__init__"]

    def unless_shown(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("disable", not shown)
        init.__get__(self, type(self))(*args, **kwargs)

    bar.__init__ = unless_shown
    try:
        yield
    finally:
        bar.__init__ = init


@contextlib.contextmanager
def library_bars(library: str = "transformers") -> Iterator[None]:
    """Within this block ``library`` (transformers: "Loading weights"; datasets: "Generating train split") draws its
    own bars only where ours would: on a terminal and not ``quiet``. It draws them everywhere by default, into logs
    and under ``--quiet``."""
    if library == "datasets":
        import datasets

        enabled, disable, enable = (
            datasets.is_progress_bar_enabled,
            datasets.disable_progress_bars,
            datasets.enable_progress_bars,
        )
    else:
        from transformers.utils import logging as hf_logging

        enabled, disable, enable = (
            hf_logging.is_progress_bar_enabled,
            hf_logging.disable_progress_bar,
            hf_logging.enable_progress_bar,
        )
    off = enabled() and (is_quiet() or not bars_seen())
    if off:
        disable()
    try:
        yield
    finally:
        if off:
            enable()
