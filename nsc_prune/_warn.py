"""Warnings reported where the user's code called nsc-prune, however deep inside the package they are raised."""

from __future__ import annotations

import contextlib
import contextvars
import sys
import warnings
from collections.abc import Callable, Iterator
from types import FrameType

_PASSED_THROUGH = {"contextlib", "functools"}  # the stdlib frames between two of ours (a `with`, a wrapper)
_SAY_HELD: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("nsc_prune_held", default=None)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` located at the first caller outside ``nsc_prune``: a library user's own
    line (what filters match and what Python prints), not a line of ours that moves with every refactor. Counting
    frames by hand (``stacklevel``) was right for one route to a warning and wrong for the others."""
    frame, level = sys._getframe(1), 2
    while frame is not None and _passed_through(_module_of(frame)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


@contextlib.contextmanager
def held_until_said(say: Callable[[], None]) -> Iterator[None]:
    """Within this block warnings are held (the CLI collects them) and ``say_held_warnings`` calls ``say``."""
    token = _SAY_HELD.set(say)
    try:
        yield
    finally:
        _SAY_HELD.reset(token)


def say_held_warnings() -> None:
    """Print now the warnings a command holds until it ends (``held_until_said``): called as training or an
    evaluation starts, so that a warning about the inputs (text that is mostly unknown tokens) is read before the
    wait, not after it. Nothing outside such a block."""
    say = _SAY_HELD.get()
    if say is not None:
        say()


def is_ours(module: str) -> bool:
    """Whether ``module`` (a frame's ``__name__``) is part of nsc-prune."""
    return module == "nsc_prune" or module.startswith("nsc_prune.")


def raised_by_nsc_prune(err: BaseException) -> bool:
    """Whether nsc-prune's code raised ``err`` (a warning that ``-W error`` made an exception): the innermost frame
    of its traceback outside the ``warnings`` module is ours."""
    tb, module = err.__traceback__, ""
    while tb is not None:
        if _module_of(tb.tb_frame) != "warnings":
            module = _module_of(tb.tb_frame)
        tb = tb.tb_next
    return is_ours(module)


def _module_of(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _passed_through(module: str) -> bool:
    """Whether a frame of ``module`` is ours (by module, not file: a dataclass's generated ``__init__`` runs in our
    module from ``<string>``) or the stdlib's between two of ours."""
    return is_ours(module) or module in _PASSED_THROUGH
