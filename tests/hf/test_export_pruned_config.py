"""nsc_prune.hf.export.pruned.global_width: the width a pruned config.json states globally."""

from __future__ import annotations

import pytest

from nsc_prune.hf.export.pruned import global_width


@pytest.mark.parametrize(
    ("widths", "expected"),
    [
        ([64, 64, 64], 64),  # uniform: no per-layer override, stock LLaMA loads it
        ([96, 64, 64], 64),  # the most common
        ([64, 96, 96, 64, 32], 96),  # a tie: the widest of the most common
        ([32, 64], 64),
        ([48], 48),
    ],
)
def test_most_common_width_widest_on_ties(widths, expected):
    assert global_width(widths) == expected
    assert global_width(widths[::-1]) == expected  # the layer order does not matter
