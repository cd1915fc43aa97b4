"""Reproduce the init-robustness table of appendix H: NSC ranking quality (Kendall tau, Spearman
rho against the trained metric) under Xavier, Kaiming fan-in and s = 0.02, and the pairwise
Spearman rho between the three score vectors, each beside the paper's value.

Benchmarks: FlexiBERT (spec-faithful and, ours, the trained FFN structure) and LTS GPT-2 from
``evals/ranking/``; AutoFormer-Tiny from ``--benchmarks DIR`` (default ``$NSC_PRUNE_BENCHMARKS``,
else ``../shared/benchmarks``) when present. The paper's "Serianni" FlexiBERT protocol (every
model built at H=256, FFN 1024) is not reproduced. "-" marks a cell the paper does not report;
"---" the pairwise rho of a convention with itself.

    python scripts/reproduce_init_robustness.py [--benchmarks DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import NSCError
from nsc_prune.ranking import families
from nsc_prune.ranking.benchmarks import (
    AUTOFORMER_TINY_FILE,
    benchmarks_dir,
    check_benchmarks_option,
    load_benchmark,
    missing_benchmark_note,
)
from nsc_prune.ranking.families.base import aggregate
from nsc_prune.ranking.metrics import kendall_tau, snap_ties, spearman_rho

ROOT = Path(__file__).resolve().parent.parent
INITS = ("xavier", "kaiming", 0.02)
# paper Table "init_variance": (tau, rho, rho_pair vs Xavier, rho_pair vs Kaiming) per init; None = "---"
PAPER_FLEXIBERT = ((0.695, 0.884, None, 0.997), (0.704, 0.892, 0.997, None), (0.575, 0.788, 0.888, 0.894))
PAPER_GPT2 = ((0.814, 0.950, None, 0.999), (0.802, 0.944, 0.999, None), (0.849, 0.968, 0.986, 0.982))
NO_PAPER = (("-",) * 4,) * 3


def cases(benchmarks: str | None) -> tuple[tuple[str, Path, dict, tuple], ...]:
    """(label, file, family options, paper rows) of every benchmark in the table."""
    return (
        ("FlexiBERT (spec-faithful)", ROOT / "evals/ranking/flexibert_glue_500.json", {}, PAPER_FLEXIBERT),
        ("FlexiBERT (trained FFN)", ROOT / "evals/ranking/flexibert_glue_500.json", {"ffn": "trained"}, NO_PAPER),
        ("GPT-2 (LTS)", ROOT / "evals/ranking/lts_gpt2_wt103_200.json", {}, PAPER_GPT2),
        ("AutoFormer-Tiny", benchmarks_dir(benchmarks) / AUTOFORMER_TINY_FILE, {}, NO_PAPER),
    )


def init_table(path: Path, options: dict) -> list[tuple[float, float, np.ndarray]]:
    """(tau, rho, scores) of NSC under each init convention."""
    bench = load_benchmark(path)
    rows = []
    for init in INITS:
        batch = bench.batch(families.make_options(bench.family, init=init, **options))
        score = snap_ties(aggregate(batch.layer_capacity(), batch.mask))
        rows.append((kendall_tau(score, bench.target), spearman_rho(score, bench.target), score))
    return rows


def cell(value: float | str | None, width: int) -> str:
    text = "---" if value is None else value if isinstance(value, str) else f"{value:.3f}"
    return f"{text:>{width}}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", metavar="DIR", help=f"folder holding {AUTOFORMER_TINY_FILE}")
    args = parser.parse_args()
    try:
        check_benchmarks_option(args.benchmarks)
        print_tables(args.benchmarks)
    except NSCError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def print_tables(benchmarks: str | None) -> None:
    """The robustness table: each benchmark's tau and rho under every init, beside the paper's."""
    widths = (7, 7, 8, 8, 7, 7, 8, 8)
    heads = ("tau", "rho", "pair X", "pair K", "tau", "rho", "pair X", "pair K")
    print(f"{'':<36}{'ours':^30}{'paper':^30}")
    print(f"{'benchmark':<27}{'init':<9}" + "".join(f"{h:>{w}}" for h, w in zip(heads, widths)))
    for label, path, options, paper in cases(benchmarks):
        if not path.exists():
            print(f"{label:<27}skipped: {missing_benchmark_note(path, benchmarks)}")
            continue
        rows = init_table(path, options)
        for i, (init, (tau, rho, score)) in enumerate(zip(INITS, rows)):
            pairs = [spearman_rho(score, rows[j][2]) if j != i else None for j in (0, 1)]
            ours = (tau, rho, *pairs)
            print(
                f"{label if i == 0 else '':<27}{init!s:<9}"
                + "".join(cell(v, w) for v, w in zip((*ours, *paper[i]), widths))
            )
    print(
        "\npair X / pair K: Spearman rho between this convention's scores and Xavier's / Kaiming's; "
        "'-': not in the paper; '---': a convention against itself"
    )


if __name__ == "__main__":
    raise SystemExit(run_script(main))
