"""Speed of the family scorers and the NAS searches (issue 7 targets).

* Scoring every architecture of a benchmark file after parsing (batched spec + one psi_mp call
  per distinct layer): target < 10 ms for 1,001 AutoFormer-Tiny and 500 FlexiBERT architectures.
  Reference in the same process: the one-architecture-at-a-time path (a LayerOption per layer).
* The Transformer-XL search (28 network-level choices, 4.4e24 architectures): target < 0.2 s
  (paper: 2.0 s); AutoFormer searches for comparison (paper: 0.03 / 0.345 / 0.600 s).

Times are the best of N runs (the median is printed too: shared machines are noisy).
Run: python scripts/bench_families.py [--benchmarks DIR]   (DIR holds autoformer_tiny_1001.json;
default $NSC_PRUNE_BENCHMARKS, else ../shared/benchmarks)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nsc_prune.cli.scripts import run_script
from nsc_prune.core.front import search
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
from nsc_prune.spaces.registry import build_space

ROOT = Path(__file__).resolve().parent.parent
VENDORED = (
    ("FlexiBERT", ROOT / "evals/ranking/flexibert_glue_500.json"),
    ("GPT-2 (LTS)", ROOT / "evals/ranking/lts_gpt2_wt103_200.json"),
)


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(best, median) seconds over ``repeat`` runs."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def bench_scoring(repeat: int = 30, benchmarks: str | Path | None = None) -> None:
    """Score every architecture of each file; ``benchmarks`` is the folder of the non-vendored AutoFormer file."""
    for label, path in (("AutoFormer-Tiny", benchmarks_dir(benchmarks) / AUTOFORMER_TINY_FILE), *VENDORED):
        if not path.exists():
            print(f"{label}: skipped: {missing_benchmark_note(path, benchmarks)}")
            continue
        bench = load_benchmark(path)
        fam = families.get_family(bench.family)
        archs = fam.parse(bench.ids, bench.configs)  # parsing is not timed
        options = fam.options_class()

        def batched(fam: families.Family = fam, archs: object = archs, options: object = options) -> object:
            batch = fam.build(archs, options)
            return aggregate(batch.layer_capacity(), batch.mask)

        def one_by_one(bench: object = bench, options: object = options) -> object:
            return [
                sum(o.nsc for o in families.layer_options(bench.family, config, options)) for config in bench.configs
            ]

        best, median = timed(batched, repeat)
        ref, _ = timed(one_by_one, 3)  # best of 3, as the batched path's best of ``repeat``: first calls cost more
        print(
            f"{label}: {len(bench)} architectures scored in {best * 1e3:.2f} ms "
            f"(median {median * 1e3:.2f} ms; target < 10 ms: {_verdict(median < 0.010)}); "
            f"one architecture at a time {ref * 1e3:.0f} ms ({ref / best:.0f}x slower)"
        )


def _verdict(met: bool) -> str:
    return "PASS" if met else "FAIL"


def bench_searches(repeat: int = 10) -> None:
    for name, overrides in (
        ("txl-wt103", {}),
        ("txl-wt103", {"attention": "per_head"}),
        ("autoformer-tiny", {}),
        ("autoformer-small", {}),
        ("autoformer-base", {}),
    ):
        space = build_space(name, **overrides)
        best, median = timed(lambda space=space: search(space), repeat)
        built, _ = timed(lambda name=name, overrides=overrides: build_space(name, **overrides), 3)
        tag = f"{name} ({overrides['attention']})" if overrides else name
        target = f"; target < 0.2 s: {_verdict(median < 0.2)}, paper 2.0 s" if name.startswith("txl") else ""
        print(
            f"search {tag}: {best:.3f} s (median {median:.3f} s) over {float(space.size):.3g} architectures; "
            f"building the space {built * 1e3:.0f} ms{target}"
        )


def bench_families(benchmarks: str | Path | None = None) -> None:
    """Print the scoring and search speed figures."""
    bench_scoring(benchmarks=benchmarks)
    bench_searches()


def add_benchmarks_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--benchmarks",
        metavar="DIR",
        help=f"folder holding {AUTOFORMER_TINY_FILE} "
        "(default: $NSC_PRUNE_BENCHMARKS, else ../shared/benchmarks beside the checkout)",
    )


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_benchmarks_option(cli)
    args = cli.parse_args()
    try:
        check_benchmarks_option(args.benchmarks)
        bench_families(args.benchmarks)
    except NSCError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
