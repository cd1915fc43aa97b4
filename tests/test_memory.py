"""nsc_prune._memory: peak RSS of this process, and its reset."""

from __future__ import annotations

import subprocess
import sys

from nsc_prune._memory import peak_rss_mib, reset_peak_rss

CHILD = """
from nsc_prune._memory import peak_rss_mib, reset_peak_rss
block = bytearray(300 * 2**20)  # touched: 300 MiB resident
block[::4096] = b"x" * len(block[::4096])
peak = peak_rss_mib()
del block
reset = reset_peak_rss()
print(peak, peak_rss_mib(), reset)
"""


def test_peak_rss_sees_an_allocation_and_its_reset():
    out = subprocess.run([sys.executable, "-c", CHILD], check=True, capture_output=True, text=True).stdout.split()
    peak, after, reset = float(out[0]), float(out[1]), out[2] == "True"
    assert peak > 300
    if reset:  # Linux with /proc/self/clear_refs: the peak starts again from the current RSS
        assert after < peak - 200
    else:
        assert after >= peak


def test_peak_rss_is_at_least_the_current_size():
    assert peak_rss_mib() > 10
    assert isinstance(reset_peak_rss(), bool)
