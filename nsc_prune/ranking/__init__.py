"""Ranking trained architectures by NSC: the paper's other families (``families``), benchmark readers
(``benchmarks``) and ranking metrics (``metrics``). numpy/scipy only."""

from __future__ import annotations

import importlib
from typing import Any

# nsc-prune 0.1 had the metrics in a module named ``nsc_prune.ranking``; its names are kept for one release.
_OLD_METRICS = (
    "DEFAULT_WINDOW",
    "TIE_RTOL",
    "aggregation_ablation",
    "aggregation_scores",
    "distinct_count",
    "format_report",
    "kendall_tau",
    "method_metrics",
    "partial_tau",
    "rank_benchmark",
    "snap_ties",
    "spearman_rho",
    "windowed_tau",
)


def __getattr__(name: str) -> Any:
    if name not in _OLD_METRICS:
        raise AttributeError(f"module 'nsc_prune.ranking' has no attribute {name!r}")
    from nsc_prune._deprecated import warn_moved

    warn_moved(f"nsc_prune.ranking.{name}", "nsc_prune.ranking.metrics")
    return getattr(importlib.import_module("nsc_prune.ranking.metrics"), name)
