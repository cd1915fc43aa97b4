"""Progress bars of the long weight steps (tqdm on stderr, with rate and ETA), and the one switch that silences
them: extraction's tensor stream, activation calibration, psi_W scores and held-out loss. Training and lm-eval
draw their own bars (the Trainer's, lm-eval's) under the same ``--quiet``, and transformers' own (loading weights)
follows ours (``library_bars``).

A bar is drawn only on a terminal (tqdm's ``disable=None``), so logs and tests stay clean; inside ``quiet()``
(the CLI's ``--quiet``) none is drawn.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from nsc_prune._io import context_value

T = TypeVar("T")
_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("nsc_prune_quiet", default=False)
_LOG_LINES: contextvars.ContextVar[bool] = contextvars.ContextVar("nsc_prune_log_lines", default=False)


def quiet(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within this block (``on``), ``progress`` draws no bar."""
    return context_value(_QUIET, on)


def is_quiet() -> bool:
    """Whether bars are silenced here (``quiet``)."""
    return _QUIET.get()


def log_lines(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within this block (``on``) a training run prints its log lines instead of drawing its bar: a command whose
    output is not a terminal (a notebook, where the library is called, keeps its bar)."""
    return context_value(_LOG_LINES, on)


def prints_log_lines() -> bool:
    """Whether a training run prints lines instead of a bar here (``log_lines``)."""
    return _LOG_LINES.get()


def _tqdm() -> Any:
    from tqdm import tqdm

    return tqdm


def progress(iterable: Iterable[T], desc: str, unit: str, total: int | None = None) -> Iterable[T]:
    """``iterable`` under a tqdm bar ``desc`` counting ``unit``s (on a terminal, unless ``quiet``)."""
    if is_quiet():
        return iterable
    try:
        bar = _tqdm()
    except ImportError:  # tqdm comes with transformers; without it, no bar
        return iterable
    return bar(iterable, desc=desc, unit=unit, total=total, disable=None, leave=False, dynamic_ncols=True)


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
    off = enabled() and (is_quiet() or not sys.stderr.isatty())
    if off:
        disable()
    try:
        yield
    finally:
        if off:
            enable()
