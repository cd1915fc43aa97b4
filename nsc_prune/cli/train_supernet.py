"""``nsc-prune train-supernet``: train one LoRA super-adapter that serves every point of an elastic space."""

from __future__ import annotations

import argparse
import json
import time

from nsc_prune.choices import TRAIN_SELECTIONS
from nsc_prune.cli.parser import (
    CommandParser,
    add_data_arguments,
    add_deprecated_flag,
    add_minutes_argument,
    add_recipe_arguments,
    is_main_process,
    path_value,
    recipe_settings,
    show_default,
    text_data,
    time_budget,
)

EXAMPLES = """\
examples:
  nsc-prune train-supernet --base smollm2/ --space ffn-grid --set protect_layers=[0] --data text.txt --out supernet/
  nsc-prune train-supernet --base llama/ --space lonas --data a.jsonl b.txt --teacher base --max-steps 2000 --out lonas-lora/
  nsc-prune train-supernet --base llama/ --space ffn-heads --pareto out/pareto.json --data text.txt --out sa/
  nsc-prune --model llama/ --space lonas --adapter lonas-lora/ --budget 80% --out out/lonas   # search with the adapter
  nsc-prune extract --pareto out/lonas --budget 80% --base llama/ --adapter lonas-lora/ --out ckpt/

The base's FFN channels and KV groups are ranked first (--selection activation on the training text, or
magnitude) and the order is stored in the adapter folder (nsc_prune_channel_order.json): `nsc-prune extract
--base ORIGINAL --adapter OUT` applies it by itself. Each step trains the largest, the smallest and
--sandwich-random random subnets of the space (or, with --pareto, the largest, smallest and random points of
that front), masked exactly as extraction cuts them; the loss is the mean over them. The recipe is typed as
for heal: its fields as flags (--batch-size 4, --learning-rate 3e-3, ...) or --set KEY=VALUE (flags win);
--set also takes space keys (ffn_step, protect_layers, ...). The lonas space sets the LoRA rank, alpha and
targets itself unless given. Training state lives in --work-dir (default .OUT.train beside OUT) until OUT
is written (--resume continues it). --teacher base distills from the full base model's logits (the only teacher
train-supernet takes: the student with its adapter off and no mask).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nsc-prune train-supernet",
        description="Train a PEFT LoRA super-adapter on sampled subnets of an elastic space (one run, whole front).",
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "--base",
        type=path_value,
        required=True,
        help="base model folder (config.json + safetensors; gemma2, gemma3_text, granite, llama, mistral, olmo2, phi3, qwen2, qwen3, smollm3)",
    )
    parser.add_argument(
        "--space", required=True, help="elastic space: a bundled name (lonas, ffn-grid, ffn-heads, ...) or a YAML file"
    )
    add_data_arguments(
        parser, "training text: .txt, .jsonl/.json, hf:NAME[:split] or hf:NAME:CONFIG:SPLIT (as for heal)"
    )
    parser.add_argument(
        "--out", type=path_value, required=True, help="output adapter folder (must not exist unless --overwrite)"
    )
    parser.add_argument(
        "--teacher",
        nargs="?",
        const="base",
        choices=("base",),
        help="distill (KL, Minitron) from the full base model's logits; `--teacher` alone means base",
    )
    add_deprecated_flag(parser, "--distill", "--teacher")
    parser.add_argument(
        "--pareto",
        type=path_value,
        help="draw the subnets from this front (pareto.json or its folder) instead of the space",
    )
    parser.add_argument(
        "--selection",
        choices=TRAIN_SELECTIONS,
        default="activation",
        help="channel order: activation (on the training text) or magnitude (data-free)",
    )
    parser.add_argument(
        "--sandwich-random",
        type=int,
        default=2,
        metavar="N",
        help="random subnets per step besides the largest and the smallest",
    )
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run of the same --out")
    show_default(
        parser.add_argument("--work-dir", type=path_value, help="training state folder (--resume continues there)"),
        ".OUT.train beside OUT",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output adapter folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_minutes_argument(parser)
    lonas = "; with --space lonas, the space's"
    add_recipe_arguments(
        parser,
        "a space or recipe setting, e.g. --set protect_layers=[0] --set batch_size=4 (repeatable)",
        own={  # where train-supernet's defaults are not TrainConfig's (nsc_prune.hf.train.supernet._recipe)
            "lora_rank": ("LoRA rank", f"64{lonas}"),
            "lora_alpha": ("LoRA alpha", f"128{lonas}"),
            "lora_targets": ("LoRA target modules", f"every projection{lonas}"),
            "gradient_checkpointing": (
                "only false: subnet masks are not active when checkpointing recomputes the forward",
                "false",
            ),
        },
        full=False,
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from nsc_prune._files import SUPERNET_RECORD_NAME
    from nsc_prune.hf.train.supernet import SupernetRequest, train_supernet

    settings = recipe_settings(args)
    request = SupernetRequest(
        base=args.base,
        space=args.space,
        data=text_data(args),
        out=args.out,
        settings=settings,
        pareto=args.pareto,
        selection=args.selection,
        sandwich_random=args.sandwich_random,
        distill=True if args.teacher else None,
        work_dir=args.work_dir,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=not args.quiet,
        budget=time_budget(args, settings),
    )
    start = time.perf_counter()
    out = train_supernet(request)
    if not is_main_process():  # rank 0 writes the adapter and reports
        return 0
    record = json.loads((out / SUPERNET_RECORD_NAME).read_text())
    budget = record["token_budget"]
    print(
        f"wrote {out} in {time.perf_counter() - start:.1f}s: {budget['steps']} steps, {budget['tokens']:,} tokens "
        f"x {record['subnets_per_step']} subnets, space {record['space']['name']}, "
        f"order {record['selection']['method']}"
    )
    return 0
