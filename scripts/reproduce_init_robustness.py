"""Reproduce the init-robustness table of appendix H: NSC ranking quality (Kendall tau, Spearman
rho against the trained metric) under Xavier, Kaiming fan-in and s = 0.02, and the pairwise
Spearman rho between the three score vectors.

Benchmarks: FlexiBERT (spec-faithful and, ours, the trained FFN structure) and LTS GPT-2 from
``evals/ranking/``; AutoFormer-Tiny from ``../shared/benchmarks/`` when present. The paper's
"Serianni" FlexiBERT protocol (every model built at H=256, FFN 1024) is not reproduced.

    python scripts/reproduce_init_robustness.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from nsc_prune import families
from nsc_prune.benchmarks import load_benchmark
from nsc_prune.families.base import aggregate
from nsc_prune.ranking import kendall_tau, snap_ties, spearman_rho

ROOT = Path(__file__).resolve().parent.parent
INITS = ("xavier", "kaiming", 0.02)
CASES = (  # label, file, family options, paper (tau, rho) per init
    ("FlexiBERT (spec-faithful)", ROOT / "evals/ranking/flexibert_glue_500.json", {}, ((0.695, 0.884), (0.704, 0.892), (0.575, 0.788))),
    ("FlexiBERT (trained FFN)", ROOT / "evals/ranking/flexibert_glue_500.json", {"ffn": "trained"}, None),
    ("GPT-2 (LTS)", ROOT / "evals/ranking/lts_gpt2_wt103_200.json", {}, ((0.814, 0.950), (0.802, 0.944), (0.849, 0.968))),
    ("AutoFormer-Tiny", ROOT.parent / "shared/benchmarks/autoformer_tiny_1001.json", {}, None),
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


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(f"{'benchmark':<27}{'init':<9}{'tau':>7}{'rho':>7}{'paper tau':>10}{'rho':>7}{'rho vs xavier':>15}{'rho vs kaiming':>16}")
    for label, path, options, paper in CASES:
        if not path.exists():
            print(f"{label:<27}(skipped: {path} not found)")
            continue
        rows = init_table(path, options)
        for i, (init, (tau, rho, score)) in enumerate(zip(INITS, rows)):
            ref = paper[i] if paper else (float("nan"), float("nan"))
            pair = [spearman_rho(score, rows[j][2]) if j != i else None for j in (0, 1)]
            cells = "".join(f"{'---' if p is None else f'{p:.3f}':>{w}}" for p, w in zip(pair, (15, 16)))
            print(f"{label if i == 0 else '':<27}{str(init):<9}{tau:>7.3f}{rho:>7.3f}{ref[0]:>10.3f}{ref[1]:>7.3f}{cells}")


if __name__ == "__main__":
    main()
