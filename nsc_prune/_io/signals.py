"""Stop signals: SIGTERM and SIGHUP (a scheduler's preemption, a closed terminal) turned into a clean exit, every
stop signal held off while an output is published (and delivered after it), and ignored while one is cleaned up."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

# The signals that stop a command as SIGTERM does: a scheduler's preemption (scancel, kubectl delete) and a closed
# terminal or ssh session (SIGHUP).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
_SIGHUP = getattr(signal, "SIGHUP", None)  # POSIX only


def stop_signal(status: object) -> str | None:
    """The name of the stop signal (``STOP_SIGNALS``) whose exit status (128 + the signal) is ``status``, or None."""
    return next((signum.name for signum in STOP_SIGNALS if status == 128 + signum), None)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # the shell's exit status for a signal; unwinds through atomic_dir's cleanup


def _detach_hung_up_terminal() -> None:
    """After a hang-up every write to the terminal fails (EIO), so a stop's clean-up and its one line would end in
    an OSError: point stdout and stderr, where they are that terminal, at the null device (a log file, a pipe or a
    terminal still open keep them; a write of nothing tells them apart)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                os.write(fd, b"")
            except OSError as err:
                if err.errno == errno.EIO:
                    os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _on_stop(handler: Callable[[int, Any], None], signum: int, frame: Any) -> None:
    if signum == _SIGHUP:
        _detach_hung_up_terminal()
    handler(signum, frame)


@contextlib.contextmanager
def handling_signals(handler: Any, signums: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Handle ``signums`` (SIGTERM and SIGHUP) with ``handler`` for the block and restore the old handlers after. A
    SIGHUP the process ignores (``nohup``) stays ignored, and a SIGHUP's terminal is let go first (its writes would
    fail). Only the main thread can set handlers; elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ignored = {s for s in signums if s == _SIGHUP and signal.getsignal(s) == signal.SIG_IGN}
    installed = functools.partial(_on_stop, handler) if callable(handler) else handler
    old = {signum: signal.signal(signum, installed) for signum in signums if signum not in ignored}
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)


def signals_ignored() -> contextlib.AbstractContextManager[None]:
    """Ignore Ctrl-C, SIGTERM and SIGHUP for the block: a clean-up that a second signal would leave half done."""
    return handling_signals(signal.SIG_IGN, (signal.SIGINT, *STOP_SIGNALS))


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP off for the block and deliver, after it, the first that came during it to the
    handlers in force before (later ones are dropped: a Ctrl-C then a SIGTERM exits as the Ctrl-C). A publish's
    renames must not be cut in two, and a command that goes on working after it (a training after its teacher
    logits) must still stop: ignoring them lost a scheduler's one SIGTERM."""
    pending: list[int] = []
    try:
        with handling_signals(lambda signum, frame: pending.append(signum), (signal.SIGINT, *STOP_SIGNALS)):
            yield
    finally:
        if pending:
            signal.raise_signal(pending[0])


def sigterm_exits(*, keep_set_handlers: bool = False) -> contextlib.AbstractContextManager[None]:
    """While the block runs (in the main thread), SIGTERM (SIGHUP) raises ``SystemExit(143)`` (129) instead of ending
    the process outright, so that clean-ups and ``finally`` blocks run as they do for a Ctrl-C. With
    ``keep_set_handlers`` (a library's own writes) only a signal at its default is taken: a handler the caller set
    (a program that embeds the library, a training run's stop request, the command's own) or an ignored signal stays."""
    if not keep_set_handlers:
        return handling_signals(_terminate)
    return handling_signals(_terminate, tuple(s for s in STOP_SIGNALS if signal.getsignal(s) == signal.SIG_DFL))
