"""``nsc-prune extract``: turn one Pareto point into a runnable Hugging Face checkpoint."""

from __future__ import annotations

import argparse
import errno
import json
import time

from nsc_prune.cli.parser import CommandParser
from nsc_prune.errors import InvalidInputError

EXAMPLES = """\
examples:
  nsc-prune extract --pareto out/pareto.json --budget 5.7B --base llama-7b/ --adapter lonas-lora/ --out ckpt/
  nsc-prune extract --pareto out/ --point 12 --base llama-7b/ --adapter lonas-lora/ --keep-adapter --out ckpt/
  nsc-prune extract --pareto out/pareto.json --budget 85% --base smollm2/ --format padded --out ckpt/
  nsc-prune extract --pareto out/ --budget 80% --base smollm2/ --selection activation --calib text.txt --out ckpt/

The base must be a safetensors folder (pickle .bin weights are refused). The plan says how many FFN
channels and KV groups each layer keeps (or drops the layer); --selection says which: `first`
(supernet order; default with --adapter), `magnitude` (weight norms, data-free) or `activation`
(mean |activation| over --calib-tokens tokens of --calib FILE; default for plain models when --calib
is given). Each layer keeps its first LoRA ranks; LoRA is merged unless --keep-adapter. Load the result
with nsc_prune.load_pruned(DIR) or AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True).
"""


def _size(text: str) -> int:
    from nsc_prune.budget import parse_budget

    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    for unit, scale in units.items():
        if text.upper().endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return parse_budget(text)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nsc-prune extract",
        description="Extract a Pareto point (per-layer FFN widths and LoRA ranks) from base weights "
        "(+ a LoRA super-adapter) into a pruned safetensors checkpoint.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--pareto", required=True, help="pareto.json written by `nsc-prune --model M --budget B` (or its folder)")
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--budget", help="largest point with params <= B: 5.7B, 5700M, 85%% (of the largest point)")
    pick.add_argument("--point", type=int, help="index into the Pareto points (default: the search's selected point)")
    parser.add_argument("--base", required=True, help="base model folder (config.json + safetensors)")
    parser.add_argument("--adapter", help="PEFT LoRA super-adapter folder")
    parser.add_argument("--out", required=True, help="output checkpoint folder (must not exist unless --overwrite)")
    parser.add_argument("--keep-adapter", action="store_true", help="write the sliced adapter to OUT/adapter instead of merging")
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), help="output dtype (default: the base's)")
    parser.add_argument(
        "--format", choices=("pruned", "padded"), default="pruned",
        help="padded: zero-padded full-width weights stock transformers loads (saves no memory)",
    )  # fmt: skip
    parser.add_argument("--max-shard-size", type=_size, default="5GB", help="output shard size, e.g. 2GB (default 5GB)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument(
        "--selection", choices=("first", "magnitude", "activation"),
        help="which channels/KV groups to keep (default: first with --adapter, else activation if --calib is given)",
    )  # fmt: skip
    parser.add_argument("--calib", help="UTF-8 text file for --selection activation")
    parser.add_argument("--calib-tokens", type=int, default=4096, help="calibration tokens (default 4096)")
    return parser


def _selection(args: argparse.Namespace):
    import warnings

    from nsc_prune.selection import SelectionConfig

    method = args.selection
    if method is None:
        method = "first" if args.adapter or not args.calib else "activation"
        if not args.adapter and not args.calib:
            warnings.warn(
                "a plain model without --calib: keeping the FIRST channels of each layer, which is poor for models "
                "not trained as supernets; pass --calib FILE (activation selection) or --selection magnitude",
                stacklevel=2,
            )
    return SelectionConfig(method=method, calib=args.calib, calib_tokens=args.calib_tokens)


def run(args: argparse.Namespace) -> int:
    from nsc_prune.extract import RECORD_NAME, ExtractOptions, extract_subnet

    options = ExtractOptions(
        keep_adapter=args.keep_adapter, dtype=args.dtype, format=args.format,
        max_shard_size=args.max_shard_size, overwrite=args.overwrite,
    )  # fmt: skip
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
