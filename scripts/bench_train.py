"""Benchmark: super-adapter training cost against plain LoRA on SmolLM2-135M (CPU, float32).

One process, one model (LoRA r=16 on every linear, as train-supernet's default recipe), the same batches:

- a plain LoRA step: forward + CE + backward + AdamW step on the full model;
- a super-adapter step: the sandwich rule with ``--random`` random plans (largest, smallest, n random of
  ``ffn-grid`` with layer 0 protected), each forward inside its ``subnet_context`` followed by the backward of
  its share of the mean loss (one graph alive at a time, as ``RecoveryTrainer.compute_loss`` does), then one
  AdamW step. ``--one-graph`` keeps all the subnets' graphs until one backward instead, for comparison.

Prints training tokens/s of both, the ratio of one super step to one plain step (target <= 4.5x with n=2,
i.e. 4 subnets) and the process's peak RSS. Warm-up steps are not timed.

    python scripts/bench_train.py                     # ~3-5 min on 2 cores
    python scripts/bench_train.py --steps 3 --seq-len 128 --batch-size 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from nsc_prune._io import atomic_write_text, provenance
from nsc_prune._memory import peak_rss_mib
from nsc_prune.cli.parser import check_file_output, nonnegative_int, positive_int
from nsc_prune.cli.scripts import run_script


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=4, help="timed steps of each kind (default 4)")
    parser.add_argument(
        "--warmup", type=nonnegative_int, default=1, help="untimed steps of each kind first (default 1)"
    )
    parser.add_argument("--seq-len", type=positive_int, default=256)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--random", type=nonnegative_int, default=2, help="random subnets per super step (default 2)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--one-graph",
        action="store_true",
        help="keep every subnet's graph until one backward (how the trainer worked before; for comparison)",
    )
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    args = parser.parse_args()
    check_file_output(parser, args.json, args.overwrite, flag="--json")
    return args


def step_timer(model: Any, orders: Any, one_graph: bool) -> Any:
    """``step(batch, plans_list) -> seconds`` of one optimizer step: plain LoRA (``plans_list`` None) or one
    super-adapter step over every subnet of ``plans_list`` (a backward per subnet, or one with ``one_graph``)."""
    import torch

    from nsc_prune.hf.train.losses import causal_lm_loss
    from nsc_prune.hf.train.subnets import subnet_context

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step(batch: Any, plans_list: Any) -> float:
        start = time.perf_counter()
        if plans_list is None:
            causal_lm_loss(model(input_ids=batch).logits, batch).backward()
        else:
            losses = []
            for plans in plans_list:
                with subnet_context(model, plans, orders):
                    loss = causal_lm_loss(model(input_ids=batch).logits, batch) / len(plans_list)
                    if one_graph:
                        losses.append(loss)
                    else:
                        loss.backward()
            if one_graph:
                torch.stack(losses).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return step


def main() -> int:
    args = parse_args()

    import torch
    import transformers

    from nsc_prune.eval.studies import calibration_ids
    from nsc_prune.hf.cut.selection import magnitude_orders
    from nsc_prune.hf.train.recipe import TrainConfig
    from nsc_prune.hf.train.subnets import SubnetSampler, space_choices
    from nsc_prune.hf.train.trainer import prepare_model
    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint
    from nsc_prune.hf.weights.loading import from_pretrained
    from nsc_prune.spaces.registry import build_space

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = smollm2_checkpoint()
    tokens = args.batch_size * args.seq_len
    steps = args.warmup + args.steps
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor(calibration_ids(tokenizer, 2 * steps * tokens, tokens), dtype=torch.long)  # before loading
    base = open_base(folder)
    recipe = TrainConfig()
    torch.manual_seed(0)
    model = from_pretrained(transformers.AutoModelForCausalLM, folder, dtype=torch.float32)
    model = prepare_model(model, recipe).train()  # the trainer's own LoRA set-up
    step = step_timer(model, magnitude_orders(base), args.one_graph)
    space = build_space("ffn-grid", base.config, protect_layers=[0])
    sampler = SubnetSampler(tuple(space_choices(space)), n_random=args.random, seed=0)
    batches = ids[: len(ids) // tokens * tokens].reshape(-1, args.batch_size, args.seq_len)

    times = {"plain": [], "super": []}
    for i in range(steps):  # interleaved, so machine load drifts hit both kinds alike
        plain = step(batches[(2 * i) % len(batches)], None)
        sup = step(batches[(2 * i + 1) % len(batches)], sampler.plans(i))
        if i >= args.warmup:
            times["plain"].append(plain)
            times["super"].append(sup)
    plain_s, super_s = statistics.median(times["plain"]), statistics.median(times["super"])
    result = {
        "model": "SmolLM2-135M",
        "device": "cpu",
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "batch": [args.batch_size, args.seq_len],
        "tokens_per_step": tokens,
        "subnets_per_super_step": 2 + args.random,
        "backward": "one graph" if args.one_graph else "per subnet",
        "plain_step_s": round(plain_s, 3),
        "super_step_s": round(super_s, 3),
        "plain_tokens_per_s": round(tokens / plain_s, 1),
        "super_tokens_per_s": round(tokens / super_s, 1),
        "super_over_plain": round(super_s / plain_s, 3),
        "target": 4.5,
        "peak_rss_mb": round(peak_rss_mib(), 1),
        "steps_timed": args.steps,
    }
    print(json.dumps(result, indent=2))
    print(
        f"super-adapter step ({2 + args.random} subnets) / plain LoRA step = {result['super_over_plain']:.2f}x "
        f"(target <= 4.5x); {result['super_tokens_per_s']:.0f} vs {result['plain_tokens_per_s']:.0f} "
        "training tokens/s; "
        f"peak RSS {result['peak_rss_mb']:.0f} MB"
    )
    if args.json:
        atomic_write_text(args.json, json.dumps({**result, "provenance": provenance()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
