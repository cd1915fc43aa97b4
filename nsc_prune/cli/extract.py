"""``nsc-prune extract``: turn one Pareto point into a runnable Hugging Face checkpoint."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import time
import warnings
from typing import TYPE_CHECKING, Any

from nsc_prune.cli.parser import CommandParser
from nsc_prune.errors import InvalidInputError
from nsc_prune.hf.selection import MIN_CALIB_TOKENS, SELECTIONS, SelectionConfig

if TYPE_CHECKING:
    from nsc_prune.hf.extract import ExtractOptions

EXAMPLES = f"""\
examples:
  nsc-prune extract --pareto out/pareto.json --budget 5.7B --base llama-7b/ --adapter lonas-lora/ --out ckpt/
  nsc-prune extract --pareto out/ --point 12 --base llama-7b/ --adapter lonas-lora/ --keep-adapter --out ckpt/
  nsc-prune extract --pareto out/pareto.json --budget 85% --base smollm2/ --format padded --out ckpt/
  nsc-prune extract --pareto out/ --budget 80% --base smollm2/ --selection activation --calib text.txt --out ckpt/

The base must be a safetensors folder (pickle .bin weights are refused). The plan says how many FFN
channels and KV groups each layer keeps (or drops the layer); --selection says which: `first`
(supernet order; default with --adapter), `magnitude` (weight norms, data-free) or `activation`
(mean |activation| over --calib-tokens tokens of --calib FILE, at least {MIN_CALIB_TOKENS}; default for plain models
when --calib is given; tokenized with the base's tokenizer or --tokenizer DIR). With --adapter, --calib
is refused unless --selection activation is asked for. --budget compares against the front's cost kind
(params, or macs for a `--cost macs` search). Each layer keeps its first LoRA ranks; LoRA is merged
unless --keep-adapter. An adapter written by `nsc-prune train-supernet` carries its own channel order
(nsc_prune_channel_order.json), which is applied to base and LoRA alike. Load the result with
nsc_prune.load_pruned(DIR) or AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True).
"""


def _size(text: str) -> int:
    from nsc_prune.core.budget import parse_budget

    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    for unit, scale in units.items():
        if text.upper().endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return parse_budget(text)


def _default(config: type, name: str) -> Any:
    """A config dataclass field's default: the one place defaults live (flags > dataclass defaults)."""
    return {field.name: field.default for field in dataclasses.fields(config)}[name]


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nsc-prune extract",
        description="Extract a Pareto point (per-layer FFN widths and LoRA ranks) from base weights "
        "(+ a LoRA super-adapter) into a pruned safetensors checkpoint.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--pareto", required=True, help="pareto.json written by `nsc-prune --model M --budget B` (or its folder)")
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument(
        "--budget",
        help="largest point whose cost (the front's kind: params, or macs for a --cost macs search) is <= B: "
        "5.7B, 5700M, 85%% (of the full model's cost, the largest point)",
    )
    pick.add_argument("--point", type=int, help="index into the Pareto points (default: the search's selected point)")
    parser.add_argument("--base", required=True, help="base model folder (config.json + safetensors)")
    parser.add_argument("--adapter", help="PEFT LoRA super-adapter folder")
    parser.add_argument("--out", required=True, help="output checkpoint folder (must not exist unless --overwrite)")
    parser.add_argument("--keep-adapter", action="store_true", default=None, help="write the sliced adapter to OUT/adapter instead of merging")
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), help="output dtype (default: the base's)")
    parser.add_argument(
        "--format", choices=("pruned", "padded"),
        help="pruned (default) or padded: zero-padded full-width weights stock transformers loads (saves no memory)",
    )  # fmt: skip
    # Default None: ExtractOptions holds the default; importing it here would import torch for --help
    # (tests/test_selection.py checks that this help text states ExtractOptions' value).
    parser.add_argument("--max-shard-size", type=_size, help="output shard size, e.g. 2GB or 500MiB (default 5 GiB)")
    parser.add_argument("--overwrite", action="store_true", default=None, help="replace an existing output folder")
    parser.add_argument(
        "--selection", choices=SELECTIONS,
        help="which channels/KV groups to keep (default: first with --adapter, else activation if --calib is given)",
    )  # fmt: skip
    parser.add_argument("--calib", help="UTF-8 text file for --selection activation")
    tokens = _default(SelectionConfig, "calib_tokens")
    parser.add_argument("--calib-tokens", type=int, default=tokens, help=f"calibration tokens (default {tokens})")
    parser.add_argument("--tokenizer", help="folder with the tokenizer files for --calib (default: the --base folder)")
    return parser


def _selection(args: argparse.Namespace) -> SelectionConfig:
    """The channel selection the flags ask for; --calib that would be ignored is refused."""
    method = args.selection
    if method is None:
        method = "first" if args.adapter or not args.calib else "activation"
        if not args.adapter and not args.calib:
            warnings.warn(
                "a plain model without --calib: keeping the FIRST channels of each layer, which is poor for models "
                "not trained as supernets; pass --calib FILE (activation selection) or --selection magnitude",
                stacklevel=2,
            )
    unused = [flag for flag, value in (("--calib", args.calib), ("--tokenizer", args.tokenizer)) if value]
    if unused and method != "activation":
        why = f"--selection {method}" if args.selection else "--adapter (a supernet keeps its first channels)"
        raise InvalidInputError(
            f"{' and '.join(unused)} would be ignored: only --selection activation uses them, and {why} selects "
            f"{method!r}; drop {' and '.join(unused)}, or pass --selection activation to rank channels by "
            "calibration on the base weights"
        )
    if method == "activation" and args.adapter:
        warnings.warn(
            "--selection activation with --adapter: calibration runs on the base weights without the adapter, "
            "and a LoNAS supernet was trained to keep its first channels (--selection first)",
            stacklevel=2,
        )
    return SelectionConfig(method=method, calib=args.calib, calib_tokens=args.calib_tokens, tokenizer=args.tokenizer)


def _options(args: argparse.Namespace) -> ExtractOptions:
    """ExtractOptions from the flags given; the rest keep the dataclass defaults."""
    from nsc_prune.hf.extract import ExtractOptions

    given = {"keep_adapter": args.keep_adapter, "dtype": args.dtype, "format": args.format,
             "max_shard_size": args.max_shard_size, "overwrite": args.overwrite}  # fmt: skip
    return ExtractOptions(**{key: value for key, value in given.items() if value is not None})


def run(args: argparse.Namespace) -> int:
    from nsc_prune._files import RECORD_NAME
    from nsc_prune.hf.extract import extract_subnet

    options = _options(args)
    selection = _selection(args)
    start = time.perf_counter()
    try:
        out = extract_subnet(
            args.pareto, args.base, args.out, point=args.point, budget=args.budget, adapter=args.adapter,
            options=options, selection=selection,
        )  # fmt: skip
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS):
            raise InvalidInputError(f"could not write {args.out}: {err.strerror}; nothing was written") from err
        raise
    summary = json.loads((out / RECORD_NAME).read_text())
    params = summary["params"]
    print(
        f"wrote {out} in {time.perf_counter() - start:.1f}s: point {summary['point_index']}, "
        f"{params['model']:,} params ({params['model'] / params['base']:.1%} of the base), "
        f"selection {summary['selection']['method']}"
        + (f" + {params['adapter']:,} adapter params" if params["adapter"] else "")
    )
    return 0
