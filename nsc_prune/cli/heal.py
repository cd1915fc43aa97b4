"""``nsc-prune heal``: recover the quality of one extracted pruned checkpoint by a short fine-tune."""

from __future__ import annotations

import argparse
import time
from typing import Any

from nsc_prune.cli.parser import (
    CommandParser,
    add_data_arguments,
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
  nsc-prune heal ckpt/ --data corpus.txt --out ckpt-healed/
  nsc-prune heal ckpt/ --data alpaca.json --teacher smollm2/ --max-steps 2000 --seq-len 1024 --out ckpt-healed/
  nsc-prune heal ckpt/ --data corpus.txt --teacher smollm2/ --minutes 30 --out ckpt-healed/
  nsc-prune heal ckpt/ --data corpus.txt --teacher smollm2/ --teacher-logits t.safetensors --out ckpt-healed/
  nsc-prune heal ckpt/ --data hf:wikitext:wikitext-2-raw-v1:train --full --learning-rate 2e-5 --out ckpt-healed/
  accelerate launch --num_processes 8 -m nsc_prune heal ckpt/ --data corpus.jsonl --out ckpt-healed/

--data: plain text (read as written, one EOS at its end; its paragraphs, or lines when there is no blank line, are
the held-out split's units), JSONL with a text field (--text-field), instruction JSON/JSONL ({instruction, input,
output}, Alpaca template), or hf:NAME[:split] (hf:NAME:CONFIG:SPLIT) for a dataset in the local datasets cache.
The recipe: its TrainConfig fields as flags (--batch-size 4) or --set KEY=VALUE (--set batch_size=4), as for
train-supernet. LoRA (r=--lora-rank on every linear layer) by default, merged into the output; --full trains every
weight. --teacher BASE distills from BASE (same tokenizer), mixing in --ce-weight of cross-entropy;
--teacher-logits FILE runs the teacher once over the data and keeps its top-k log-probabilities in FILE (every
later heal on the same teacher, data and tokenizer reads them instead of running it). Checkpoints go to OUT.heal/
(or --work-dir) every --save-steps; after SIGTERM or a crash, the same command with --resume continues there.
--minutes N sizes the run to the budget from measured throughput (probe passes, then the run's own steps until its
learning-rate decay begins; a resumed run reads the stored sizing). See docs/recovery.md.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nsc-prune heal",
        description="Fine-tune (LoRA or all weights; cross-entropy or distillation) a checkpoint written by "
        "`nsc-prune extract` and write the merged result in the same format.",
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "checkpoint", metavar="CKPT", type=path_value, help="pruned checkpoint folder (nsc-prune extract's output)"
    )
    add_data_arguments(parser, "training text (see below)")
    parser.add_argument(
        "--out", type=path_value, required=True, help="output checkpoint folder (must not exist unless --overwrite)"
    )
    parser.add_argument(
        "--teacher",
        type=path_value,
        metavar="BASE",
        help="distill from this checkpoint (same tokenizer), e.g. the unpruned base",
    )
    parser.add_argument(
        "--teacher-logits",
        type=path_value,
        metavar="FILE",
        help="cached teacher logits: read FILE if it exists (checked against --teacher, --data and the tokenizer), "
        "else compute them once and write FILE; training then never runs the teacher (its top K tokens and the "
        "rest of its mass as one bucket, at temperature 1)",
    )
    show_default(
        parser.add_argument(
            "--teacher-top-k", type=int, metavar="K", help="log-probabilities kept per token in --teacher-logits"
        ),
        DEFAULT_TOP_K_TEXT,
    )
    parser.add_argument("--full", action="store_true", help="train every weight instead of LoRA adapters")
    parser.add_argument("--resume", action="store_true", help="continue the interrupted run in the work folder")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    show_default(
        parser.add_argument(
            "--work-dir", type=path_value, help="training checkpoints' folder (--resume continues there)"
        ),
        "OUT.heal",
    )
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep the work folder after success")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_minutes_argument(parser)
    add_recipe_arguments(parser, "a recipe setting, e.g. --set batch_size=4 (repeatable; the flags above win)")
    return parser


DEFAULT_TOP_K_TEXT = "64"  # nsc_prune.hf.train.teacher_logits.DEFAULT_TOP_K (not imported: the parser loads no torch)


def _teacher_top_k(args: argparse.Namespace) -> int:
    from nsc_prune.errors import InvalidInputError
    from nsc_prune.hf.train.teacher_logits import DEFAULT_TOP_K

    if args.teacher_top_k is not None and args.teacher_logits is None:
        raise InvalidInputError("--teacher-top-k sets the cached teacher logits: pass --teacher-logits FILE with it")
    return DEFAULT_TOP_K if args.teacher_top_k is None else args.teacher_top_k


def _config(args: argparse.Namespace) -> tuple[Any, Any]:
    """The recipe and the time budget (None without --minutes)."""
    from nsc_prune.errors import InvalidInputError
    from nsc_prune.hf.train.recipe import TrainConfig

    settings = recipe_settings(args)
    for key, flag in (("full", "--full"), ("distill", "--teacher BASE")):
        if key in settings:  # the flag decides; a --set of it would be overridden without a word
            raise InvalidInputError(f"--set {key} is not a heal setting: pass {flag} instead")
    budget = time_budget(args, settings)
    return TrainConfig.from_settings({**settings, "full": args.full, "distill": args.teacher is not None}), budget


def run(args: argparse.Namespace) -> int:
    from nsc_prune._files import RECORD_NAME
    from nsc_prune._io import read_json_object
    from nsc_prune.hf.train.heal import heal

    config, budget = _config(args)
    top_k = _teacher_top_k(args)
    data = text_data(args)
    start = time.perf_counter()
    out = heal(
        args.checkpoint,
        data,
        args.out,
        config,
        teacher=args.teacher,
        resume=args.resume,
        overwrite=args.overwrite,
        work_dir=args.work_dir,
        keep_checkpoints=args.keep_checkpoints,
        progress=not args.quiet,
        budget=budget,
        teacher_logits=args.teacher_logits,
        teacher_top_k=top_k,
    )
    if is_main_process():  # under accelerate launch only rank 0 reports
        rec = read_json_object(out / RECORD_NAME)["recovery"]
        print(
            f"wrote {out} in {time.perf_counter() - start:.1f}s: {rec['steps']} steps, {rec['tokens']:,} tokens "
            f"({rec['tokens_per_s']:,.0f} tokens/s), "
            f"held-out loss {rec['val_loss_before']:.4f} -> {rec['val_loss_after']:.4f}"
            + (
                f"; resumed at step {rec['resumed_from_step']}: the time is this run's"
                if rec["resumed_from_step"]
                else ""
            )
        )
        if rec.get("time_budget"):
            timed = rec["time_budget"]
            print(
                f"time budget: {timed['minutes_asked']:g} min asked, {timed['minutes_used']:g} used; "
                f"probe -> {timed['probe_max_steps']} steps, {timed['warmup_steps']} warm-up; "
                f"{timed['tokens_per_s_measured']:,.0f} tokens/s measured -> {timed['max_steps']} steps"
            )
    return 0
