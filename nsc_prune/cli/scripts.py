"""How the study and benchmark scripts under ``scripts/`` end, as an ``nsc-prune`` command does: bad input is one
``error:`` line (exit 2); a Ctrl-C, SIGTERM or SIGHUP unwinds through the script's clean-ups (its temporary folders
and models are removed) and is one line (exit 130, 143 or 129), not a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from nsc_prune._io import sigterm_exits, stop_signal
from nsc_prune.errors import NSCError

EXIT_INTERRUPTED = 130  # 128 + SIGINT


def run_script(main: Callable[[], int | None]) -> int:
    """Run a script's ``main()`` and return its exit status: ``main``'s, or 2 for an ``NSCError`` it let through,
    130 for a Ctrl-C, 143 for a SIGTERM, 129 for a SIGHUP (each printed on one line)."""
    name = Path(sys.argv[0]).name
    try:
        with sigterm_exits():
            return int(main() or 0)
    except NSCError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as done:
        signal_name = stop_signal(done.code)
        if signal_name is None:
            raise
        print(f"{name}: stopped by {signal_name}", file=sys.stderr)
        return int(done.code)
