"""``nsc-prune rank --benchmark FILE``: how well NSC ranks trained architectures (paper section 4.1)."""

from __future__ import annotations

import argparse
import sys

from nsc_prune._io import check_output, provenance, publish_text, to_json
from nsc_prune.cli.parser import CommandParser, path_value, refuse_launcher, show_default
from nsc_prune.core.capacity import parse_init
from nsc_prune.errors import InvalidInputError
from nsc_prune.ranking import families
from nsc_prune.ranking.benchmarks import load_benchmark
from nsc_prune.ranking.families.autoformer import HEAD_DIM_EMBED, parse_head_dim
from nsc_prune.ranking.metrics import DEFAULT_WINDOW, format_report, rank_benchmark, skipped_note

EXAMPLES = """examples:
  nsc-prune rank --benchmark ../shared/benchmarks/flexibert_glue_500.json
  nsc-prune rank --benchmark evals/ranking/lts_gpt2_wt103_200.json --json
  nsc-prune rank --benchmark flexibert_glue_500.json --ffn trained     # the trained FFN structure
  nsc-prune rank --benchmark lts_gpt2_wt103_200.json --attention merged --init xavier
  nsc-prune rank --benchmark autoformer_small_1000.json --head-dim embed  # AutoFormer: head dim embed_dim / heads
formats (auto-detected): flexibert-glue, lts-gpt2, autoformer-ood, nsc-ranking (see nsc_prune/ranking/benchmarks.py)"""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nsc-prune rank",
        description="Score every architecture of a benchmark file with NSC and report Kendall tau, Spearman rho, "
        "windowed and partial tau against #Params and #FLOPs, and the sum/min/product aggregation ablation.",
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "--benchmark", type=path_value, required=True, help="benchmark JSON file (format auto-detected)"
    )
    parser.add_argument(
        "--family", help=f"expected family ({', '.join(sorted(families.FAMILIES))}); must match the file"
    )
    show_default(parser.add_argument("--target", help="metric to rank against"), "glue / valid_ppl / clean")
    show_default(
        parser.add_argument("--init", help="init convention: xavier, kaiming or a std such as 0.02"),
        "the paper's per family",
    )
    show_default(
        parser.add_argument(
            "--attention", choices=("per_head", "merged"), help="Q/K/V per head or one merged QKV matrix"
        ),
        "the paper's: merged for FlexiBERT, per_head for GPT-2 and AutoFormer",
    )
    show_default(
        parser.add_argument(
            "--ffn", choices=("declared", "trained"), help="FlexiBERT FFN: declared branches or the trained structure"
        ),
        "declared, the paper's",
    )
    head_dim = parser.add_argument(
        "--head-dim",
        metavar="64|embed",
        help=f"AutoFormer Q/K/V per-head dim: a number or {HEAD_DIM_EMBED} "
        "(embed_dim // heads; reproduces the paper's AutoFormer-Small/Base figures)",
    )
    show_default(head_dim, "64, the supernet's")
    parser.add_argument(
        "--window", type=float, default=DEFAULT_WINDOW, help="relative window for windowed tau, a fraction in (0, 1)"
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse a file where some rows lack the target (otherwise: score the others, report the skipped rows)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out", type=path_value, help="also write the JSON report (with provenance) to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    return parser


def run(args: argparse.Namespace) -> int:
    refuse_launcher("rank", "it scores a benchmark file in milliseconds")  # each rank wrote --out, racing
    if not 0 < args.window < 1:  # 10 meant as 10 % kept every pair: the windowed tau was the plain one
        raise InvalidInputError(f"--window must be a fraction in (0, 1), e.g. 0.1 for 10 %; got {args.window:g}")
    if args.overwrite and args.out is None:
        raise InvalidInputError("--overwrite would be ignored: it replaces an --out file; add --out FILE or drop it")
    if args.out is not None:  # docs/outputs.md: an existing file only with --overwrite, never the benchmark itself
        check_output(args.out, (args.benchmark,), args.overwrite, marker=None)
    benchmark = load_benchmark(args.benchmark, family=args.family, target=args.target, strict=args.strict)
    init = None if args.init is None else parse_init(args.init)
    head_dim = None if args.head_dim is None else parse_head_dim(args.head_dim)
    options = families.make_options(
        benchmark.family, init=init, attention=args.attention, ffn=args.ffn, head_dim=head_dim
    )
    report = rank_benchmark(benchmark, options, window=args.window)
    if args.out:
        publish_text(args.out, to_json({**report, "provenance": provenance()}), args.overwrite, checked=True)
    if args.json:
        sys.stdout.write(to_json(report))
        if skipped_note(report):
            print(skipped_note(report), file=sys.stderr)
    else:
        print(format_report(report))
    return 0
