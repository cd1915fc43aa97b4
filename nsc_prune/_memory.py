"""This process's peak resident memory, for the benchmarks and studies that report it (scripts/)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")


def peak_rss_mib() -> float:
    """Peak RSS of this process image in MiB: Linux's ``VmHWM`` (``ru_maxrss`` would carry the parent's peak over
    fork + exec, so a child process started to measure one step would report its parent's size), else
    ``ru_maxrss`` (bytes on macOS, KiB elsewhere)."""
    if _STATUS.is_file():
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS where Linux allows it (``/proc/self/clear_refs``); False when it cannot,
    and then ``peak_rss_mib`` keeps the peak since the process started."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
