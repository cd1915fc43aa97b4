"""``nsc-prune profile``: measure each layer option's latency on this machine (the table ``--cost latency`` reads)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nsc_prune._io import check_output
from nsc_prune.choices import DEVICES, LATENCY_BACKENDS, PROFILE_DTYPES
from nsc_prune.cli.parser import CommandParser, field_default, parse_overrides
from nsc_prune.core.budget import format_cost
from nsc_prune.core.latency_table import MICROSECONDS, ProfileSettings

EXAMPLES = """examples:
  nsc-prune profile --model smollm2-135m --space ffn-grid --device cpu --out lut.json
  nsc-prune --model smollm2-135m --space ffn-grid --cost latency --latency-table lut.json --budget 80%
  nsc-prune profile --model llama-7b --space ffn-heads --device cuda --batch 8 --out lut-h100.json
  nsc-prune profile --model smollm2-135m --backend llama.cpp --dtype q8_0 --threads 4 --out lut-llamacpp.json
The table needs no weights (latency does not depend on their values); it is valid for this machine, backend,
dtype and these settings only, and is refused for another model or space. docs/speed.md"""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nsc-prune profile",
        description="Time every option of every layer of a space (prefill and decode) with the backend and device "
        "you deploy on, and write the latency table that `nsc-prune --cost latency --latency-table FILE` solves "
        "the exact DP over.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--model", required=True, help="preset, folder with config.json, or cached hub id")
    parser.add_argument("--space", default="ffn-grid", help="space name or YAML path (default: %(default)s)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="space YAML override")
    parser.add_argument(
        "--out", required=True, help="the latency table (JSON) to write (must not exist unless --overwrite)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing table file")
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="where to time (default: %(default)s)")
    parser.add_argument(
        "--backend",
        choices=LATENCY_BACKENDS,
        default="transformers",
        help="inference library (llama.cpp: deci GGUF files, as extract --format gguf writes; pip install "
        "'nsc-prune[llamacpp]')",
    )
    parser.add_argument(
        "--dtype",
        choices=PROFILE_DTYPES,
        help="default: float32 on cpu, bfloat16 on cuda; llama.cpp: float16 (or q8_0)",
    )
    for name, text in (
        ("batch", "prefill batch"),
        ("prefill_tokens", "tokens per prefill sequence"),
        ("decode_context", "tokens in the KV cache before the timed decode steps"),
        ("decode_tokens", "timed greedy decode steps per run"),
        ("repeats", "rounds in which the options are timed in turn (fastest run kept)"),
        ("stack", "identical layers per timed model"),
    ):
        default = field_default(ProfileSettings, name)
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=default, help=f"{text} (default {default})"
        )
    parser.add_argument(
        "--threads", type=int, help="CPU threads while timing, as you will deploy (default: the backend's)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def run(args: argparse.Namespace) -> int:
    from nsc_prune.hf.latency.profile import profile_latency
    from nsc_prune.planning import resolve_space

    settings = ProfileSettings(
        device=args.device,
        backend=args.backend,
        dtype=args.dtype,
        batch=args.batch,
        prefill_tokens=args.prefill_tokens,
        decode_context=args.decode_context,
        decode_tokens=args.decode_tokens,
        repeats=args.repeats,
        stack=args.stack,
        threads=args.threads,
    )
    out = Path(args.out)
    check_output(out, overwrite=args.overwrite, marker=None)  # before the slow timing
    model, space = resolve_space(args.model, args.space, parse_overrides(args.set))
    table = profile_latency(space, model.config, model.name, settings)
    table.write(out)

    def full(phase: str) -> str:
        return format_cost(MICROSECONDS * table.full_seconds(phase), "latency")

    print(
        f"profiled {sum(len(o) for o in table.layers)} options of {len(table.layers)} layers "
        f"({table.settings['distinct_options']} distinct shapes) of {model.name}, space {space.name!r}, "
        f"with {table.describe()} in {table.provenance['seconds']:.0f} s"
    )
    print(
        f"full model predicted: decode {full('decode')} per token after {settings.decode_context} tokens, "
        f"prefill {full('prefill')} for {settings.batch} x {settings.prefill_tokens} tokens"
    )
    print(f"wrote {out}")
    return 0
