"""Ranking quality of an architecture score against trained performance (paper section 4.1,
appendices C and F.2).

Pure metrics over numpy arrays (higher target = better):

* ``kendall_tau`` (tau-b) and ``spearman_rho`` (scipy.stats); ``None`` (undefined) when either
  input is constant;
* ``windowed_tau``: tau-b over the pairs whose control Z (#Params, #FLOPs) differs by less
  than ``window`` (10%): ``|Z_i - Z_j| / max(|Z_i|, |Z_j|) < window``;
* ``partial_tau``: Kendall partial correlation by the Conover-Iman rank-OLS estimator (rank
  everything, OLS-residualise the score and target ranks on the control ranks, tau of the
  residuals); ``None`` where the score is itself a control ("---" in the paper's tables);
* ``distinct_count``, after ``snap_ties``: layer sums of permuted architectures differ only by
  floating-point rounding and must tie (the paper's tau 0.695 on FlexiBERT needs it).

``rank_benchmark`` is the one-call report behind ``nsc-prune rank``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nsc_prune.errors import InvalidInputError
from nsc_prune.ranking.families.base import aggregate

TIE_RTOL = 1e-9
DEFAULT_WINDOW = 0.10


def _stats() -> Any:
    """``scipy.stats``, imported when a metric is first computed: it takes about half a second, which
    ``nsc-prune rank --help`` and the search need not pay."""
    from scipy import stats

    return stats


def _pair(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise InvalidInputError(f"score and target must have the same length; got {x.size} and {y.size}")
    if x.size < 2:
        raise InvalidInputError(f"need at least 2 architectures to rank; got {x.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise InvalidInputError("scores and targets must be finite numbers")
    return x, y


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _constant(x: np.ndarray) -> bool:
    return bool(x.min() == x.max())


def snap_ties(x: Any, rtol: float = TIE_RTOL) -> np.ndarray:
    """Replace values within relative ``rtol`` of their sorted neighbour by the group's first value; an infinity
    ties only with itself (within ``rtol`` of it, every number would), a NaN with nothing."""
    x = np.asarray(x, dtype=np.float64).ravel()
    if x.size < 2:
        return x.copy()
    order = np.argsort(x, kind="stable")
    s = x[order]
    new_group = np.ones(s.size, dtype=bool)
    with np.errstate(invalid="ignore"):  # inf - inf
        close = np.abs(np.diff(s)) <= rtol * np.maximum(np.abs(s[1:]), np.abs(s[:-1]))
    new_group[1:] = ~((s[1:] == s[:-1]) | (close & np.isfinite(s[1:]) & np.isfinite(s[:-1])))
    starts = np.flatnonzero(new_group)
    snapped = np.empty_like(x)
    snapped[order] = s[starts][np.cumsum(new_group) - 1]
    return snapped


def distinct_count(x: Any, rtol: float = TIE_RTOL) -> int:
    """Number of distinct scores, values within relative ``rtol`` counted once (paper Table 2)."""
    return int(np.unique(snap_ties(x, rtol)).size)


def kendall_tau(x: Any, y: Any) -> float | None:
    """Kendall tau-b (``scipy.stats.kendalltau``); ``None`` when ``x`` or ``y`` is constant."""
    x, y = _pair(x, y)
    return None if _constant(x) or _constant(y) else _finite_or_none(_stats().kendalltau(x, y).statistic)


def spearman_rho(x: Any, y: Any) -> float | None:
    """Spearman rho (``scipy.stats.spearmanr``); ``None`` when ``x`` or ``y`` is constant."""
    x, y = _pair(x, y)
    return None if _constant(x) or _constant(y) else _finite_or_none(_stats().spearmanr(x, y).statistic)


def windowed_tau(x: Any, y: Any, z: Any, window: float = DEFAULT_WINDOW, block: int = 1024) -> float | None:
    """Kendall tau-b over pairs whose control ``z`` differs by less than ``window`` (appendix F.2).

    Vectorised over blocks of rows of the pair matrix; ``None`` when no pair is informative.
    """
    x, y = _pair(x, y)
    z = np.asarray(z, dtype=np.float64).ravel()
    if z.shape != x.shape:
        raise InvalidInputError(f"control has {z.size} values for {x.size} architectures")
    if not (np.isfinite(window) and window > 0):
        raise InvalidInputError(f"window must be a positive number; got {window:g}")  # -3, not -3.0
    n = x.size
    concordance = ties_free_x = ties_free_y = 0
    cols = np.arange(n)
    for start in range(0, n, block):
        rows = np.arange(start, min(start + block, n))
        upper = cols[None, :] > rows[:, None]
        zi, zj = z[rows, None], z[None, :]
        near = upper & (np.abs(zi - zj) < window * np.maximum(np.abs(zi), np.abs(zj)))
        sx = np.sign(x[rows, None] - x[None, :])[near]
        sy = np.sign(y[rows, None] - y[None, :])[near]
        concordance += int(np.sum(sx * sy))
        ties_free_x += int(np.count_nonzero(sx))
        ties_free_y += int(np.count_nonzero(sy))
    denominator = np.sqrt(float(ties_free_x) * float(ties_free_y))
    return concordance / denominator if denominator > 0 else None


def partial_tau(x: Any, y: Any, controls: Sequence[Any]) -> float | None:
    """Kendall partial tau by Conover-Iman rank-OLS (appendix F.2): tau of the residuals of the
    ranks of ``x`` and ``y`` after least squares on the ranks of ``controls`` (plus intercept).

    ``None`` when ``x`` or ``y`` is (rank-)collinear with the controls: a self-control is
    undefined, and so is a constant score or target.
    """
    x, y = _pair(x, y)
    ranked = [_stats().rankdata(np.asarray(c, dtype=np.float64).ravel()) for c in controls]
    for i, c in enumerate(ranked):
        if c.size != x.size:
            raise InvalidInputError(
                f"control #{i} has {c.size} values for {x.size} architectures; give one value per architecture"
            )
    design = np.column_stack([np.ones(x.size), *ranked])
    residuals = []
    for r in (_stats().rankdata(x), _stats().rankdata(y)):
        res, scale = r - design @ np.linalg.lstsq(design, r, rcond=None)[0], np.linalg.norm(r - r.mean())
        if scale == 0 or np.linalg.norm(res) <= 1e-8 * scale:
            return None
        residuals.append(res)
    return _finite_or_none(_stats().kendalltau(*residuals).statistic)


def method_metrics(score: Any, target: Any, params: Any, flops: Any, window: float = DEFAULT_WINDOW) -> dict[str, Any]:
    """Every ranking metric of one score (a row of the paper's controlled-correlation tables)."""
    return {
        "kendall_tau": kendall_tau(score, target),
        "spearman_rho": spearman_rho(score, target),
        "windowed_tau_params": windowed_tau(score, target, params, window),
        "windowed_tau_flops": windowed_tau(score, target, flops, window),
        "partial_tau_params": partial_tau(score, target, [params]),
        "partial_tau_flops": partial_tau(score, target, [flops]),
        "partial_tau_params_flops": partial_tau(score, target, [params, flops]),
        "distinct_scores": distinct_count(score),
    }


def aggregation_scores(layer_psi: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Network scores under each across-layer rule (Table 2), snapped for ties. The product is
    ranked through its logarithm, the sum of log Psi_l (same order, no overflow)."""
    with np.errstate(divide="ignore"):  # log(0) of an empty layer is -inf: ranks it last, as 0 would
        log_psi = np.log(layer_psi)
    return {
        "sum": snap_ties(aggregate(layer_psi, mask, "sum")),
        "min": snap_ties(aggregate(layer_psi, mask, "min")),
        "product": snap_ties(aggregate(log_psi, mask, "sum")),
    }


def aggregation_ablation(scores: Mapping[str, np.ndarray], target: Any) -> dict[str, dict[str, Any]]:
    """Kendall tau, Spearman rho and distinct scores of each rule of ``aggregation_scores`` (paper Table 2)."""
    return {
        rule: {
            "kendall_tau": kendall_tau(score, target),
            "spearman_rho": spearman_rho(score, target),
            "distinct_scores": distinct_count(score),
        }
        for rule, score in scores.items()
    }


def rank_benchmark(benchmark: Any, options: Any = None, window: float = DEFAULT_WINDOW) -> dict[str, Any]:
    """Score every architecture of a loaded benchmark and report NSC against #Params and #FLOPs.

    Returns ``{"n", "benchmark", "skipped", "options", "methods": {"nsc", "params", "flops"}, "aggregation",
    "baselines", "seconds"}`` (JSON-ready; ``None`` marks undefined entries; ``skipped`` counts the file's
    rows without the target, which are not scored).
    """
    if len(benchmark) < 2:
        raise InvalidInputError(
            f"{benchmark.path}: a ranking needs at least 2 architectures with target {benchmark.target_name!r}; "
            f"got {len(benchmark)}"
        )
    if _constant(np.asarray(benchmark.target, dtype=np.float64)):
        raise InvalidInputError(
            f"{benchmark.path}: target {benchmark.target_name!r} is the same for all {len(benchmark)} architectures, "
            "so no ranking "
            "correlation is defined; use a benchmark (or --target) whose values differ"
        )
    start = time.perf_counter()
    batch = benchmark.batch(options)
    layer_psi = batch.layer_capacity()  # > 0: an init std small enough to underflow is refused (MIN_INIT_STD)
    scores = aggregation_scores(layer_psi, batch.mask)
    score_seconds = time.perf_counter() - start
    params, flops, target = batch.params().astype(np.float64), batch.flops(), benchmark.target
    # a baseline controlled by itself (or by a rank-identical control) comes out None: undefined
    methods = {
        name: method_metrics(values, target, params, flops, window)
        for name, values in (("nsc", scores["sum"]), ("params", params), ("flops", flops))
    }
    return {
        "n": len(batch),
        "benchmark": benchmark.describe(),
        "skipped": benchmark.skipped_report(),
        "options": dict(batch.options),
        "window": window,
        "methods": methods,
        "aggregation": aggregation_ablation(scores, target),
        "baselines": benchmark.baseline_notes(batch.options),
        "seconds": {"score": score_seconds, "total": time.perf_counter() - start},
    }


def skipped_note(report: Mapping[str, Any]) -> str:
    """One line saying how many of the file's rows a ``rank_benchmark`` report left out and why ("" if none)."""
    skipped = report.get("skipped") or {}
    if not skipped.get("count"):
        return ""
    shown = ", ".join(skipped["ids"][:5]) + (", ..." if skipped["count"] > 5 else "")
    return (
        f"skipped {skipped['count']} of {skipped['rows_in_file']} rows: {skipped['reason']} ({shown}); "
        "--strict makes this an error"
    )


def format_report(report: Mapping[str, Any]) -> str:
    """Human-readable tables of a ``rank_benchmark`` report."""

    def cell(value: Any) -> str:
        return "---" if value is None else (f"{value:d}" if isinstance(value, int) else f"{value:.3f}")

    bench = report["benchmark"]
    order = "higher" if bench["higher_is_better"] else "lower"
    lines = [
        f"{bench['format']} ({bench['family']}): {report['n']} architectures vs {bench['target']} ({order} is better)"
    ]
    if skipped_note(report):
        lines.append(skipped_note(report))
    lines.append("")
    cols = [
        "kendall_tau",
        "spearman_rho",
        "windowed_tau_params",
        "windowed_tau_flops",
        "partial_tau_params",
        "partial_tau_flops",
        "partial_tau_params_flops",
        "distinct_scores",
    ]
    window = f"{100 * report['window']:g}%"
    heads = ["tau", "rho", f"tau|P<{window}", f"tau|F<{window}", "ptau|P", "ptau|F", "ptau|P,F", "distinct"]
    width = max(11, *(len(h) + 2 for h in heads))
    lines.append(f"{'method':<8}" + "".join(f"{h:>{width}}" for h in heads))
    for name, row in report["methods"].items():
        lines.append(f"{name:<8}" + "".join(f"{cell(row[c]):>{width}}" for c in cols))
    lines += [
        f"tau|P<{window}, tau|F<{window}: tau over the pairs within {window} of #Params, of #FLOPs; "
        "ptau: partial tau given them",
        "---: undefined (a baseline controlled by itself, a constant score, or no pair in the window)",
    ]
    lines += ["", "aggregation ablation (paper Table 2):", f"{'rule':<8}{'tau':>11}{'rho':>11}{'distinct':>11}"]
    for rule, row in report["aggregation"].items():
        lines.append(
            f"{rule:<8}{cell(row['kendall_tau']):>11}{cell(row['spearman_rho']):>11}{cell(row['distinct_scores']):>11}"
        )
    lines += ["", *(f"{k}: {v}" for k, v in report["baselines"].items())]
    lines.append(f"options: {', '.join(f'{k}={v}' for k, v in report['options'].items())}")
    lines.append(f"scored in {report['seconds']['score'] * 1e3:.1f} ms")
    return "\n".join(lines)
