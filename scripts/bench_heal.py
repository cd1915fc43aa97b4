"""Benchmark: one ``heal`` distillation step on SmolLM2-135M (CPU, float32 weights), before and after issue 31.

One process, the student (SmolLM2-135M with the default recipe's LoRA, r=16 on every linear) and the teacher
(SmolLM2-135M, frozen), the same batches; each step is forward + loss + backward + AdamW step:

- before: the teacher's forward under ``torch.no_grad`` and the distillation loss as it was (boolean-indexed
  copies of both [N, V] logit tensors, two float32 log-softmaxes, ``kl_div``), kept here only for comparison;
- after: the default recipe's step as ``heal`` runs it: ``nsc_prune.hf.train.trainer.teacher_side`` (forward
  under ``torch.inference_mode``, the teacher's softmax once per batch), the forwards without a KV cache
  (``forward_logits``) and ``recipe_loss`` (``logsumexp(z) - <p, z>`` per position, no [N, V] copies), teacher and
  student under bf16 autocast where the recipe's ``bf16="auto"`` turns it on (``uses_bf16``: a CUDA GPU, or a
  CPU with native bf16); ``--bf16 false`` times the float32 step instead;
- cached: the after step with the teacher's forward replaced by its cached top-k log-probabilities
  (``--cached-top-k``, default 64; 0 skips it), computed once before the timed steps (that time is printed apart:
  it is paid once per teacher, text and tokenizer, ``heal --teacher-logits``).

Steps alternate between the kinds, so a drift in machine load hits both alike; the first step of each is not
timed. Prints heal tokens/s of each and the ratios to before (target >= 1.3x).

    python scripts/bench_heal.py                       # ~2-4 min on 2 cores
    python scripts/bench_heal.py --steps 2 --seq-len 128 --batch-size 2
    python scripts/bench_heal.py --bf16 false                 # the float32 step (no bf16 autocast)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from nsc_prune._io import atomic_write_text, provenance
from nsc_prune._memory import peak_rss_mib
from nsc_prune.cli.parser import check_file_output, nonnegative_int, positive_int
from nsc_prune.cli.scripts import run_script


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=3, help="timed steps of each kind (default 3)")
    parser.add_argument(
        "--warmup", type=nonnegative_int, default=1, help="untimed steps of each kind first (default 1)"
    )
    parser.add_argument("--seq-len", type=positive_int, default=256)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--bf16", choices=("auto", "true", "false"), default="auto", help="the after step's bf16 (default: auto)"
    )
    parser.add_argument(
        "--cached-top-k", type=nonnegative_int, default=64, help="k of the cached step (0: no cached step)"
    )
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    args = parser.parse_args()
    check_file_output(parser, args.json, args.overwrite, flag="--json")
    return args


def old_distillation_loss(student_logits: Any, teacher_logits: Any, labels: Any, temperature: float = 1.0) -> Any:
    """The distillation loss before issue 31 (``ce_weight`` 0, the default recipe), kept for the comparison."""
    import torch.nn.functional as F

    from nsc_prune.hf.train.recipe import IGNORE_INDEX

    student = student_logits[:, :-1].reshape(-1, student_logits.shape[-1])
    teacher = teacher_logits[:, :-1].reshape(-1, teacher_logits.shape[-1])
    keep = labels[:, 1:].reshape(-1) != IGNORE_INDEX
    log_p_s = F.log_softmax(student[keep].float() / temperature, dim=-1)
    log_p_t = F.log_softmax(teacher[keep].float() / temperature, dim=-1)
    kd = F.kl_div(log_p_s, log_p_t, log_target=True, reduction="sum") / keep.sum().clamp(min=1)
    return temperature**2 * kd


def step_timer(student: Any, teacher: Any, recipe: Any, cached: Any) -> Any:
    """``step(batch, rows, kind) -> (seconds, loss)`` of one distillation step on the ``before``, ``after`` or
    ``cached`` code path (``rows``: the batch's blocks in ``cached``)."""
    import torch

    from nsc_prune.hf.train.precision import training_autocast
    from nsc_prune.hf.train.trainer import forward_logits, recipe_loss, teacher_side

    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-4)

    def step(batch: Any, rows: Any, kind: str) -> tuple[float, float]:
        start = time.perf_counter()
        if kind == "before":
            with torch.no_grad():
                teacher_logits = teacher(input_ids=batch).logits
            loss = old_distillation_loss(student(input_ids=batch).logits, teacher_logits, batch)
        else:
            targets = teacher_side(cached if kind == "cached" else teacher, batch, recipe, rows)
            with training_autocast(recipe, batch.device):
                logits = forward_logits(student, batch)
            loss = recipe_loss(logits.float(), batch, targets, recipe)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start, float(loss.detach())

    return step


def models(folder: Path, recipe: Any) -> tuple[Any, Any]:
    """The LoRA student (the trainer's own set-up) and the frozen teacher, both SmolLM2-135M in float32."""
    import torch
    import transformers

    from nsc_prune.hf.train.trainer import prepare_model
    from nsc_prune.hf.weights.loading import from_pretrained

    torch.manual_seed(0)
    student = from_pretrained(transformers.AutoModelForCausalLM, folder, dtype=torch.float32)
    student = prepare_model(student, recipe).train()
    teacher = from_pretrained(transformers.AutoModelForCausalLM, folder, dtype=torch.float32).eval()
    teacher.requires_grad_(False)
    return student, teacher


def cached_logits(teacher: Any, blocks: Any, top_k: int, recipe: Any) -> tuple[Any, float]:
    """The teacher's top-k log-probabilities of ``blocks`` (``heal --teacher-logits``) and the seconds they took."""
    from nsc_prune.hf.train.data import TextBlocks
    from nsc_prune.hf.train.teacher_logits import compute_teacher_logits

    started = time.perf_counter()
    cached = compute_teacher_logits(teacher, TextBlocks(blocks, blocks[:0], "bench"), {"top_k": top_k}, recipe)
    return cached, time.perf_counter() - started


def main() -> int:
    args = parse_args()

    import torch
    import transformers

    from nsc_prune.eval.studies import calibration_ids
    from nsc_prune.hf.train.precision import uses_bf16
    from nsc_prune.hf.train.recipe import TrainConfig
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = smollm2_checkpoint()
    bf16 = {"auto": "auto", "true": True, "false": False}[args.bf16]
    recipe = TrainConfig(distill=True, bf16=bf16)  # the default recipe (T = 1, ce_weight 0), with a teacher
    tokens = args.batch_size * args.seq_len
    steps = args.warmup + args.steps
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor(calibration_ids(tokenizer, steps * tokens, tokens), dtype=torch.long)  # before loading
    student, teacher = models(folder, recipe)
    blocks = ids[: len(ids) // tokens * tokens].reshape(-1, args.seq_len)
    cached, cache_s = cached_logits(teacher, blocks, args.cached_top_k, recipe) if args.cached_top_k else (None, None)
    step = step_timer(student, teacher, recipe, cached)

    kinds = ["before", "after"] + (["cached"] if cached is not None else [])
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    batches = len(blocks) // args.batch_size
    for i in range(steps):
        rows = torch.arange(args.batch_size) + (i % batches) * args.batch_size
        for kind in kinds:
            seconds, _ = step(blocks[rows], rows, kind)
            if i >= args.warmup:
                times[kind].append(seconds)
    before_s, after_s = statistics.median(times["before"]), statistics.median(times["after"])
    result = {
        "model": "SmolLM2-135M (student: LoRA r=16; teacher: the same weights, frozen)",
        "device": "cpu",
        "dtype": "float32 weights",
        "after_precision": "bf16 autocast" if uses_bf16(recipe) else "float32",
        "threads": torch.get_num_threads(),
        "batch": [args.batch_size, args.seq_len],
        "tokens_per_step": tokens,
        "before_step_s": round(before_s, 3),
        "after_step_s": round(after_s, 3),
        "before_tokens_per_s": round(tokens / before_s, 1),
        "after_tokens_per_s": round(tokens / after_s, 1),
        "speedup": round(before_s / after_s, 3),
        "target": 1.3,
        "peak_rss_mb": round(peak_rss_mib(), 1),
        "steps_timed": args.steps,
    }
    if cached is not None:
        cached_s = statistics.median(times["cached"])
        result.update(
            cached_top_k=args.cached_top_k,
            cached_step_s=round(cached_s, 3),
            cached_tokens_per_s=round(tokens / cached_s, 1),
            cached_speedup=round(before_s / cached_s, 3),
            cache_build_tokens_per_s=round(blocks.numel() / cache_s, 1),
        )
    print(json.dumps(result, indent=2))
    print(
        f"heal distillation step: {result['before_tokens_per_s']:.0f} -> {result['after_tokens_per_s']:.0f} "
        f"tokens/s = {result['speedup']:.2f}x (target >= 1.3x; after: {result['after_precision']}); "
        f"peak RSS {result['peak_rss_mb']:.0f} MB"
    )
    if cached is not None:
        print(
            f"with cached top-{args.cached_top_k} teacher logits: {result['cached_tokens_per_s']:.0f} tokens/s = "
            f"{result['cached_speedup']:.2f}x before (the cache itself: {result['cache_build_tokens_per_s']:.0f} "
            "tokens/s, once)"
        )
    if args.json:
        atomic_write_text(args.json, json.dumps({**result, "provenance": provenance()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
