"""Ranking trained architectures by NSC: the paper's other families (``families``), benchmark readers
(``benchmarks``) and ranking metrics (``metrics``). numpy/scipy only."""

from __future__ import annotations

from nsc_prune._deprecated import forward_moved

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

__getattr__ = forward_moved(__name__, dict.fromkeys(_OLD_METRICS, "nsc_prune.ranking.metrics"))
