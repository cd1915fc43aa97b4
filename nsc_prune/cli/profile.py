"""``nsc-prune profile``: measure each layer option's latency on this machine (the table ``--cost latency`` reads)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nsc_prune._files import CONFIG_NAME, user_path
from nsc_prune._io import check_output
from nsc_prune._validation import is_int, must_be
from nsc_prune.choices import DEVICES, GGUF_TYPE_OF, GGUF_TYPES, LATENCY_BACKENDS, PROFILE_DTYPES
from nsc_prune.cli.parser import (
    CommandParser,
    add_deprecated_flag,
    field_default,
    parse_overrides,
    path_value,
    refuse_launcher,
    show_default,
)
from nsc_prune.core.budget import format_cost, full_name
from nsc_prune.core.front import search
from nsc_prune.core.latency_table import ProfileSettings
from nsc_prune.core.spec import model_params
from nsc_prune.errors import ConfigError

EXAMPLES = """examples:
  nsc-prune profile --model smollm2-135m --space ffn-grid --device cpu --out lut.json
  nsc-prune --model smollm2-135m --space ffn-grid --cost latency --latency-table lut.json --budget 80%
  nsc-prune profile --model llama-7b --space ffn-heads --device cuda --batch-size 8 --out lut-h100.json
  nsc-prune profile --model smollm2-135m --backend llama.cpp --outtype q8_0 --threads 4 --out lut-llamacpp.json
The table needs no weights (latency does not depend on their values); it is valid for this machine, backend,
dtype (or GGUF type) and these settings only, and is refused for another model or space. docs/speed.md"""


TORCH_DTYPES = tuple(dtype for dtype in PROFILE_DTYPES if dtype not in GGUF_TYPES)  # --dtype: transformers
DTYPE_OF_GGUF = {gguf: dtype for dtype, gguf in GGUF_TYPE_OF.items()}  # --outtype -> the dtype the table records


def _torch_dtype(text: str) -> str:
    """``--dtype`` value; a GGUF type (nsc-prune 0.1's ``--dtype q8_0``) names ``--outtype`` instead."""
    if text in GGUF_TYPES:
        raise argparse.ArgumentTypeError(
            f"{text} is a GGUF tensor type, not a torch dtype; use --outtype {text} (with --backend llama.cpp)"
        )
    return text


def add_timed_type_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dtype`` (transformers) and ``--outtype`` (llama.cpp): what ``timed_dtype`` reads."""
    show_default(
        parser.add_argument(
            "--dtype", type=_torch_dtype, choices=TORCH_DTYPES, help="torch dtype timed (transformers)"
        ),
        "float32 on cpu, bfloat16 on cuda",
    )
    show_default(
        parser.add_argument(
            "--outtype", choices=GGUF_TYPES, help="GGUF tensor type of the 2-D weights timed (llama.cpp), as extract"
        ),
        "f16",
    )


def timed_dtype(args: argparse.Namespace) -> str | None:
    """``ProfileSettings.dtype`` (what the table records: float16, q8_0, ...) from --dtype or --outtype."""
    if args.outtype is None:
        if args.dtype is not None and args.backend == "llama.cpp":
            raise ConfigError(
                f"--dtype is the torch dtype of --backend transformers; llama.cpp times GGUF tensor types: "
                f"use --outtype {GGUF_TYPE_OF[args.dtype]}"
            )
        return args.dtype
    if args.backend != "llama.cpp":
        raise ConfigError(f"--outtype {args.outtype} is a GGUF tensor type for --backend llama.cpp; use --dtype")
    if args.dtype is not None:
        raise ConfigError("--dtype and --outtype both given; --backend llama.cpp takes --outtype only")
    return DTYPE_OF_GGUF[args.outtype]


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nsc-prune profile",
        description="Time every option of every layer of a space (prefill and decode) with the backend and device "
        "you deploy on, and write the latency table that `nsc-prune --cost latency --latency-table FILE` solves "
        "the exact DP over.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--model", required=True, help="preset, folder with config.json, or cached hub id")
    parser.add_argument("--space", default="ffn-grid", help="space name or YAML path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="space YAML override")
    parser.add_argument(
        "--out",
        type=path_value,
        required=True,
        help="the latency table (JSON) to write (must not exist unless --overwrite)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing table file")
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="where to time")
    parser.add_argument(
        "--backend",
        choices=LATENCY_BACKENDS,
        default="transformers",
        help="inference library (llama.cpp: deci GGUF files, as extract --format gguf writes; pip install "
        "'nsc-prune[llamacpp]')",
    )
    add_timed_type_arguments(parser)
    for name, flag, text in (
        ("batch", "--batch-size", "prefill sequences per forward pass"),
        ("prefill_tokens", "--prefill-tokens", "tokens per prefill sequence"),
        ("decode_context", "--decode-context", "tokens in the KV cache before the timed decode steps"),
        ("decode_tokens", "--decode-tokens", "timed greedy decode steps per run"),
        ("repeats", "--repeats", "rounds in which the options are timed in turn (fastest run kept)"),
        ("stack", "--stack", "identical layers per timed model"),
    ):
        metavar = flag[2:].upper().replace("-", "_")
        parser.add_argument(
            flag, dest=name, metavar=metavar, type=int, default=field_default(ProfileSettings, name), help=text
        )
    add_deprecated_flag(parser, "--batch", "--batch-size")
    show_default(
        parser.add_argument(
            "--threads",
            type=int,
            help="CPU threads while timing, as you will deploy (at most the CPUs this process may use: its affinity, "
            "capped by a container's CPU quota)",
        ),
        "the backend's",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _check_lengths(settings: ProfileSettings, context: int | None) -> None:
    """Refuse a timing the model could not run: a prefill, or a decode's context and steps, past its context."""
    if context is not None and not (is_int(context) and context > 0):
        raise ConfigError(must_be("config.json's max_position_embeddings", "a positive integer", context))
    for flags, tokens in (
        ("--prefill-tokens", settings.prefill_tokens),
        ("--decode-context + --decode-tokens", settings.decode_context + settings.decode_tokens),
    ):
        if context and tokens > context:
            raise ConfigError(must_be(flags, f"at most the model's max_position_embeddings ({context})", tokens))


def run(args: argparse.Namespace) -> int:
    from nsc_prune.hf.latency.profile import profile_latency
    from nsc_prune.planning import resolve_space

    refuse_launcher("profile", "processes timing at once on one machine disturb each other's timings")
    settings = ProfileSettings(
        device=args.device,
        backend=args.backend,
        dtype=timed_dtype(args),
        batch=args.batch,
        prefill_tokens=args.prefill_tokens,
        decode_context=args.decode_context,
        decode_tokens=args.decode_tokens,
        repeats=args.repeats,
        stack=args.stack,
        threads=args.threads,
    )
    out = Path(args.out)
    given = user_path(args.model)  # a folder or the config.json it reads, else a preset or a cached hub id
    read = [given / CONFIG_NAME if given.is_dir() else given] if given.exists() else []
    space = user_path(args.space) if args.space else None  # read so (spaces.registry)
    read += [space] if space and space.is_file() else []  # a space YAML of yours
    check_output(args.out, read, overwrite=args.overwrite, marker=None)  # before the slow timing
    model, space = resolve_space(args.model, args.space, parse_overrides(args.set))
    _check_lengths(settings, model.config.get("max_position_embeddings"))
    search(space)  # a space the search refuses (a homogeneous one whose layers share no option): before the timing
    table = profile_latency(space, model.config, model.name, settings)
    table.write(out, args.overwrite, checked=True)  # checked before the timing
    fronts = {phase: search(space, cost="latency", latency=table.costs(phase)) for phase in ("decode", "prefill")}
    widest = fronts["decode"].points[-1]  # what a search's percentages are of (its front's widest plan)

    def full(phase: str) -> str:
        return format_cost(fronts[phase].points[-1].latency_us, "latency")

    print(
        f"profiled {sum(len(o) for o in table.layers)} options of {len(table.layers)} layers "
        f"({table.settings['distinct_options']} distinct shapes) of {model.name}, space {space.name!r}, "
        f"with {table.describe()} in {table.provenance['seconds']:.0f} s"
    )
    print(
        f"{full_name(widest.params == model_params(model.config)).removeprefix('the ')} predicted: decode "
        f"{full('decode')} per token after {settings.decode_context} tokens, "
        f"prefill {full('prefill')} for {settings.batch} x {settings.prefill_tokens} tokens"
    )
    print(f"wrote {out}")
    return 0
