"""``nsc-prune extract``: turn one Pareto point into a runnable Hugging Face checkpoint."""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsc_prune._io import file_size_limit
from nsc_prune._warn import warn
from nsc_prune.choices import CHECKPOINT_DTYPES, FORMATS, GGUF_TYPES, SELECTIONS
from nsc_prune.cli.parser import (
    CommandParser,
    add_compute_arguments,
    compute_settings,
    field_default,
    path_value,
    refuse_launcher,
    show_default,
)
from nsc_prune.errors import InvalidInputError, NSCError
from nsc_prune.hf.cut.reconstruct import DEFAULT_RIDGE, ReconstructConfig, check_reconstruct
from nsc_prune.hf.cut.selection import MIN_CALIB_TOKENS, SelectionConfig

if TYPE_CHECKING:
    from nsc_prune.hf.cut.request import ExtractOptions

EXAMPLES = f"""\
examples:
  nsc-prune extract --pareto out/pareto.json --budget 5.7B --base llama-7b/ --adapter lonas-lora/ --out ckpt/
  nsc-prune extract --pareto out/ --point 12 --base llama-7b/ --adapter lonas-lora/ --keep-adapter --out ckpt/
  nsc-prune extract --pareto out/pareto.json --budget 85% --base smollm2/ --format padded --out ckpt/
  nsc-prune extract --pareto out/ --budget 5.7B --base llama-7b/ --adapter lonas-lora/ --format nemotron-nas --out ckpt/
  nsc-prune extract --pareto out/ --budget 80% --base smollm2/ --selection activation --calib text.txt --out ckpt/
  nsc-prune extract --pareto out/ --budget 80% --base smollm2/ --format gguf --outtype f16 --out pruned.gguf

The base must be a safetensors folder (pickle .bin weights are refused). The plan says how many FFN channels
and KV groups each layer keeps (or drops the layer); --selection says which: `first` (supernet order; default
with --adapter), `magnitude` (weight norms, data-free) or `activation` (mean |activation| over --calib-tokens
tokens of --calib FILE, at least {MIN_CALIB_TOKENS}; default for plain models when --calib is given; tokenized
with the base's tokenizer or --tokenizer DIR). --reconstruct also refits each layer's down_proj / o_proj on that
text so its output changes least where input channels are cut. With --adapter, --calib is refused unless --selection
activation is asked for. --budget compares against the front's cost kind (params, or macs for a `--cost macs`
search) and is read as the search reads it: a bare number below the front gets a suffix hint, and a budget
above the front's largest point is refused unless --allow-above-full. Each layer keeps its first LoRA ranks;
LoRA is merged unless --keep-adapter. An adapter written by `nsc-prune train-supernet` carries its own channel
order (nsc_prune_channel_order.json), which is applied to base and LoRA alike. Load the result with
nsc_prune.load_pruned(DIR) or AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True); a plan with
the same width and KV groups in every kept layer is written as a stock checkpoint (no remote code). --format gguf
writes one llama.cpp GGUF file (architecture deci for llama/mistral bases; llama.cpp's own architecture for
gemma2, gemma3_text, granite, olmo2, phi3 and smollm3, with a homogeneous plan; tokenizer included) to an --out ending
in .gguf, or into an existing --out folder as <model>-<params>-p<point>.<outtype>.gguf (one file per plan).
An existing output is replaced only with --overwrite (docs/outputs.md).
"""


SIZE_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}  # KB = K; KiB: powers of 2**10
SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGT])(I?)B?)?", re.IGNORECASE)


def _size(text: str) -> int:
    """``--max-shard-size``: bytes, or a number with KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (of 1024)."""
    match = SIZE.fullmatch(text.strip())
    size = 0
    if match:
        unit = (match[2] or "").upper()
        scale = 2 ** (10 * " KMGT".index(unit)) if match[3] else SIZE_UNITS[unit]
        size = int(float(match[1]) * scale)
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be a size such as 2GB, 500MiB or 1000000 (bytes); got {text!r}")
    return size


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nsc-prune extract",
        description="Extract a Pareto point (per-layer FFN widths and LoRA ranks) from base weights "
        "(+ a LoRA super-adapter) into a pruned safetensors checkpoint.",
        epilog=EXAMPLES,
    )
    _add_point_arguments(parser)
    _add_output_arguments(parser)
    _add_selection_arguments(parser)
    return parser


def _add_point_arguments(parser: argparse.ArgumentParser) -> None:
    """Which plan: the front and the point of it (by budget or index)."""
    parser.add_argument(
        "--pareto",
        type=path_value,
        required=True,
        help="pareto.json written by `nsc-prune --model M --budget B` (or its folder)",
    )
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument(
        "--budget",
        help="largest point whose cost (the front's kind: params, macs for a --cost macs search, latency for a "
        "--cost latency one) is <= B: 5.7B, 5700M, 60ms, 85%% (of the full model's cost, the largest point: the "
        "widest plan where the space stops below the model)",
    )
    point = pick.add_argument(
        "--point",
        type=int,
        help="0-based index into the Pareto points, as printed by the search and stored as 'selected' in pareto.json",
    )
    show_default(point, "the search's selected point")
    parser.add_argument(
        "--allow-above-full",
        action="store_true",
        help="accept a --budget above the front's largest point (writes that point, the full model or the space's "
        "widest plan; otherwise an error)",
    )
    parser.add_argument("--base", type=path_value, required=True, help="base model folder (config.json + safetensors)")
    parser.add_argument("--adapter", type=path_value, help="PEFT LoRA super-adapter folder")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """What is written: where, in which format and type."""
    parser.add_argument(
        "--out",
        type=path_value,
        required=True,
        help="output checkpoint folder, or FILE.gguf with --format gguf (an existing one only with --overwrite)",
    )
    parser.add_argument(
        "--keep-adapter",
        action="store_true",
        default=None,
        help="write the sliced adapter to OUT/adapter instead of merging",
    )
    show_default(parser.add_argument("--dtype", choices=CHECKPOINT_DTYPES, help="output dtype"), "the base's")
    fmt = parser.add_argument(
        "--format",
        choices=FORMATS,
        help="pruned; padded: zero-padded full-width weights stock transformers loads (saves no memory); "
        "nemotron-nas: vLLM's DeciLMForCausalLM (dropped query heads zero-padded, see --no-pad); "
        "gguf: one llama.cpp GGUF file (architecture deci, or the family's own for a homogeneous plan; tokenizer "
        "included) at --out FILE.gguf or in --out DIR",
    )
    show_default(fmt, "pruned")
    parser.add_argument(
        "--no-pad",
        dest="pad",
        action="store_false",
        default=None,
        help="refuse a plan the --format cannot express exactly instead of zero-padding it (nemotron-nas)",
    )
    outtype = parser.add_argument(
        "--outtype",
        choices=GGUF_TYPES,
        help="with --format gguf: GGUF tensor type of the weight matrices (norms stay f32; q8_0 quantises them "
        "with gguf's Q8_0, token_embd and output included, f16 for rows not a multiple of 32)",
    )
    show_default(outtype, "f16")
    # Default None: ExtractOptions holds the default; importing it here would import torch for --help
    # (tests/hf/test_selection.py checks that this help text states ExtractOptions' value).
    shard = parser.add_argument("--max-shard-size", type=_size, help="output shard size, e.g. 2GB or 500MiB")
    show_default(shard, "5 GiB")
    parser.add_argument(
        "--overwrite", action="store_true", default=None, help="replace an existing output (docs/outputs.md)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars (calibration, writing the tensors)")


def _add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """Which channels each layer keeps, and the calibration text that ranks them."""
    selection = parser.add_argument("--selection", choices=SELECTIONS, help="which channels/KV groups to keep")
    show_default(selection, "first with --adapter, else activation if --calib is given")
    parser.add_argument("--calib", type=path_value, help="UTF-8 text file for --selection activation")
    # Default None so that a value --selection would ignore is refused; SelectionConfig holds the defaults.
    show_default(
        parser.add_argument("--calib-tokens", type=int, help="calibration tokens"),
        field_default(SelectionConfig, "calib_tokens"),
    )
    show_default(
        parser.add_argument("--calib-seq-len", type=int, help="tokens per calibration block (forward pass)"),
        field_default(SelectionConfig, "seq_len"),
    )
    show_default(
        parser.add_argument("--tokenizer", type=path_value, help="folder with the tokenizer files for --calib"),
        "the --base folder",
    )
    add_compute_arguments(parser, "--selection activation and --reconstruct")
    parser.add_argument(
        "--reconstruct",
        action="store_true",
        help="refit down_proj / o_proj on the --calib text so each layer's output changes least where its input "
        "channels are cut (least squares, layer by layer; docs/extract.md)",
    )
    ridge = parser.add_argument(
        "--reconstruct-ridge", type=float, help="--reconstruct's ridge, relative to the kept channels' mean energy"
    )
    show_default(ridge, str(DEFAULT_RIDGE))


def _selection(args: argparse.Namespace) -> SelectionConfig:
    """The channel selection the flags ask for; --calib that would be ignored is refused."""
    method = args.selection
    if method is None:
        method = "first" if args.adapter or not args.calib else "activation"
    given = (("--calib", args.calib), ("--tokenizer", args.tokenizer))
    given += (("--calib-tokens", args.calib_tokens is not None), ("--calib-seq-len", args.calib_seq_len is not None))
    given += (("--device", args.device != "cpu"), ("--calib-dtype", args.calib_dtype != "float32"))
    unused = [flag for flag, value in given if value]
    if unused and method != "activation":
        if args.selection:
            why = f"--selection {method} selects {method!r}"
        elif args.adapter:
            why = "--adapter selects 'first' (a supernet keeps its first channels)"
        else:
            why = "with no --calib the selection is 'first'"
        raise InvalidInputError(
            f"{' and '.join(unused)} would be ignored: only --selection activation uses them, and {why}; drop "
            f"{' and '.join(unused)}, or pass --selection activation{'' if args.calib else ' with --calib FILE'} to "
            "rank channels by calibration on the base weights"
        )
    if method == "activation" and args.adapter:
        warn(
            "--selection activation with --adapter: calibration runs on the base weights without the adapter, "
            "and a LoNAS supernet was trained to keep its first channels (--selection first)",
        )
    sizes = {"calib_tokens": args.calib_tokens, "seq_len": args.calib_seq_len}
    return SelectionConfig(
        method=method,
        calib=args.calib,
        compute=compute_settings(args),
        tokenizer=args.tokenizer,
        **{name: value for name, value in sizes.items() if value is not None},
    )


def _reconstruct(args: argparse.Namespace) -> ReconstructConfig | None:
    """The reconstruction --reconstruct asks for (None without it); refused before any slow step where it cannot run."""
    if not args.reconstruct:
        if args.reconstruct_ridge is not None:
            raise InvalidInputError("--reconstruct-ridge without --reconstruct would be ignored: add --reconstruct")
        return None
    config = ReconstructConfig(DEFAULT_RIDGE if args.reconstruct_ridge is None else args.reconstruct_ridge)
    check_reconstruct(config, args.selection or ("activation" if args.calib else None), args.adapter)
    return config


def _options(args: argparse.Namespace) -> ExtractOptions:
    """ExtractOptions from the flags given; the rest keep the dataclass defaults. Flags that would be ignored are
    refused here, where a given value can be told from a default."""
    from nsc_prune.hf.cut.request import ExtractOptions

    if args.allow_above_full and args.budget is None:
        raise InvalidInputError("--allow-above-full would be ignored: it applies to a --budget; drop it or pass one")
    if args.max_shard_size is not None and args.format == "gguf":
        raise InvalidInputError("--max-shard-size would be ignored: --format gguf writes one file; drop it")
    if args.format != "gguf" and str(args.out).lower().endswith(".gguf"):  # a folder llama.cpp cannot read
        raise InvalidInputError(
            f"--out {args.out} names a GGUF file, and --format {args.format or 'pruned'} writes a folder: "
            "add --format gguf, or name a folder"
        )

    given = {
        "keep_adapter": args.keep_adapter,
        "dtype": args.dtype,
        "format": args.format,
        "max_shard_size": args.max_shard_size,
        "overwrite": args.overwrite,
        "pad": args.pad,
        "outtype": args.outtype,
    }
    return ExtractOptions(**{key: value for key, value in given.items() if value is not None})


def _narrows_a_kept_layer(record: dict[str, Any], base: str) -> bool:
    """Whether an extraction's plan keeps a layer with fewer FFN channels or KV groups than the base has: only then
    does the channel selection choose anything (read from the base's config.json, which the extraction read; a
    front's own config may be a hand-written one without a model type)."""
    from nsc_prune.core.spec import layer_dims
    from nsc_prune.presets import read_model_config

    try:
        base_dims = layer_dims(read_model_config(base, "--base"))
    except NSCError:  # the warning is advice: a config it cannot read is no reason to fail a written extraction
        return False
    for plan, dims in zip(record["plan"], base_dims):
        fewer_kv = plan.get("kv_groups") is not None and plan["kv_groups"] < dims.num_key_value_heads
        if plan.get("keep", True) and (plan["ffn"] < dims.intermediate_size or fewer_kv):
            return True
    return False


def _names_the_output(err: OSError, out: str, gguf: bool) -> bool:
    """Whether ``err`` names no file, or the output (a checkpoint folder or what is in it; a GGUF file, in the
    ``--out`` folder it goes into) or its hidden temporary: an input that cannot be read (a weights shard of 0600 on
    a shared store, maybe in the folder a GGUF goes into) is not a write's failure."""
    if err.filename is None:
        return True
    path, target = Path(os.path.abspath(err.filename)), Path(os.path.abspath(out))
    if gguf and target.is_dir():  # DIR/NAME.gguf, or its .NAME.gguf.*.partial
        return path.parent == target and (path.suffix.lower() == ".gguf" or path.name.lower().endswith(".partial"))
    beside = path.parent == target.parent and path.name.startswith(f".{target.name}.")
    return path == target or beside or (not gguf and target in path.parents)


def run(args: argparse.Namespace) -> int:
    from nsc_prune._files import RECORD_NAME
    from nsc_prune.hf.extract import extract_subnet
    from nsc_prune.plan import point_label

    refuse_launcher("extract", "it streams one tensor at a time; its calibration takes --device cuda")
    options = _options(args)
    reconstruct = _reconstruct(args)
    selection = _selection(args)
    start = time.perf_counter()
    try:
        out = extract_subnet(
            args.pareto,
            args.base,
            args.out,
            point=args.point,
            budget=args.budget,
            adapter=args.adapter,
            options=options,
            selection=selection,
            reconstruct=reconstruct,
            allow_above_full=args.allow_above_full,
        )
    except OSError as err:
        written = errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS
        if err.errno in written and _names_the_output(err, args.out, gguf=args.format == "gguf"):
            raise InvalidInputError(f"could not write {args.out}: {err.strerror}; nothing was written") from err
        smaller = "" if args.format == "gguf" else "pass a smaller --max-shard-size, or "  # a GGUF is one file
        if err.errno == errno.EFBIG:  # ulimit -f, or FAT32's 4 GiB a file under the default 5 GB shards
            raise InvalidInputError(
                f"could not write {args.out}: {err.strerror} (a file-size limit: ulimit -f, or the file system's); "
                f"{smaller}write to another file system; nothing was written"
            ) from err
        if err.errno is None and "requested and" in str(err):  # numpy's short write (a GGUF's tensors): no errno
            limit = file_size_limit()
            cause = (
                "the disk is full"
                if limit is None
                else f"the disk is full or the file-size limit (ulimit -f: {limit} bytes) was reached"
            )
            raise InvalidInputError(f"could not write {args.out}: {cause} ({err}); nothing was written") from err
        raise
    if out.is_file():  # an export format's single file (GGUF) carries its record inside
        from nsc_prune.hf.export.gguf_file import read_record

        summary = read_record(out)
    else:
        summary = json.loads((out / RECORD_NAME).read_text())
    params = summary["params"]
    print(
        f"wrote {out} in {time.perf_counter() - start:.1f}s: "
        f"{point_label(summary['point_index'], summary.get('point_count'))}, "
        f"{params['model']:,} params ({params['model'] / params['base']:.1%} of the base"
        + (f", {params['model'] / params['original']:.1%} of the original model" if params.get("original") else "")
        + "), "
        f"selection {summary['selection']['method']}"
        + (f", reconstructed (ridge {reconstruct.ridge:g})" if reconstruct else "")
        + (f" + {params['adapter']:,} adapter params" if params["adapter"] else "")
    )
    if args.selection is None and not (args.adapter or args.calib) and _narrows_a_kept_layer(summary, args.base):
        warn(  # a plan that cuts no channel (an export of a whole checkpoint) keeps them all in any order
            "a plain model without --calib: kept the FIRST channels of each layer, which is poor for models not "
            "trained as supernets; pass --calib FILE (activation selection) or --selection magnitude",
        )
    if padding := summary.get("export", {}).get("padding"):
        print(
            f"{summary['export']['format']} padding: {padding['params']:,} zero params "
            f"({padding['params_fraction']:.1%} "
            f"of the checkpoint), {padding['linear_macs_per_token']:,} linear MACs/token, "
            f"{padding['attention_macs_per_token_per_position']:,} attention MACs/token/position "
            f"({padding['zero_query_heads']} zero query heads, {padding['zero_kv_heads']} zero KV heads)"
        )
    return 0
