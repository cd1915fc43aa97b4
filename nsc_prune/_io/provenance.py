"""What produced an output: the command line being run and the provenance record every output carries."""

from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import platform
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nsc_prune._version import __version__

_COMMAND: contextvars.ContextVar[str | None] = contextvars.ContextVar("nsc_prune_command", default=None)


@contextlib.contextmanager
def context_value(var: contextvars.ContextVar[Any], value: Any) -> Iterator[None]:
    """Within this block ``var`` holds ``value`` (restored on exit): the CLI's per-command switches."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def recorded_command(command: str | None) -> contextlib.AbstractContextManager[None]:
    """Within this block, ``provenance()`` records ``command`` (the CLI's shell-quoted command line)."""
    return context_value(_COMMAND, command)


def command_line() -> str:
    """The command being run: the one set by ``recorded_command``, else ``sys.argv`` shell-quoted."""
    return _COMMAND.get() or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


def provenance(**extra: Any) -> dict[str, Any]:
    """What produced an output: package version, exact command, time, Python; plus ``extra``."""
    record = {
        "nsc_prune_version": __version__,
        "command": command_line(),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
    }
    record.update(extra)
    return record
