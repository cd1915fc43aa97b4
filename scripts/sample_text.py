"""Text a model writes itself, to heal on (``nsc-prune heal --data``): samples that start from the end-of-text
token, at temperature 1, top-k 50 and top-p 0.95, each at most ``--new-tokens`` tokens and cut at its first end
token, one sample a paragraph, until ``--tokens`` tokens are written. docs/recovery.md ("More text, the same
minutes") says what it bought.

    python scripts/sample_text.py BASE --tokens 300000 --out sampled.txt

``--batch-size`` samples a ``generate`` call, with a static KV cache, in bf16 on a GPU or on a CPU that multiplies
bf16 natively (float32 otherwise; ``--dtype`` decides). Writes OUT and OUT.json (the settings, the tokens and
seconds, provenance), each atomically; OUT is written only when every sample is done.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
import time
from pathlib import Path
from typing import Any

from nsc_prune._io import atomic_write_text, check_output, provenance, to_json
from nsc_prune.errors import NSCError
from nsc_prune.eval.runner import resolve_device


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="BASE", help="the model to sample from: a safetensors checkpoint folder")
    parser.add_argument("--tokens", type=int, required=True, help="stop once this many tokens are written")
    parser.add_argument("--out", type=Path, required=True, help="the text file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--batch-size", type=int, default=64, help="samples a generate call (default 64)")
    parser.add_argument("--new-tokens", type=int, default=128, help="the longest sample, in tokens (default 128)")
    parser.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest; 0: all (default 50)")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling's mass (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="torch's seed (default 0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model runs (default cpu)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="default bfloat16 on CUDA or a CPU with native bf16"
    )
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.batch_size < 1 or args.new_tokens < 1 or args.top_k < 0 or not 0 < args.top_p <= 1:
        parser.error("--tokens, --batch-size and --new-tokens must be positive, --top-k >= 0, --top-p in (0, 1]")
    return args


def one_paragraph(text: str) -> str:
    """``text`` with its blank lines removed, so that ``heal --data`` reads it as one document."""
    return re.sub(r"\n\s*\n", "\n", text).strip()


def sample(model: Any, tokenizer: Any, args: argparse.Namespace) -> tuple[list[str], int]:
    """Samples of ``model`` (one paragraph each) until ``args.tokens`` tokens: (the samples, their tokens)."""
    import torch

    from nsc_prune.hf.progress import progress

    eos = tokenizer.eos_token_id
    samples, written = [], 0
    for _ in progress(itertools.count(), "sampling", "batch"):
        start = torch.full((args.batch_size, 1), eos, device=model.device)
        with torch.inference_mode():
            generated = model.generate(
                start,
                attention_mask=torch.ones_like(start),
                do_sample=True,
                temperature=1.0,
                top_p=args.top_p,
                top_k=args.top_k,
                max_new_tokens=args.new_tokens,
                pad_token_id=eos,
                eos_token_id=eos,
                cache_implementation="static",
            )
        for row in generated[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            text = one_paragraph(tokenizer.decode(row))
            if text:
                samples.append(text)
                written += len(row)
        if written >= args.tokens:
            break
    return samples, written


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_output(args.out, [args.model], args.overwrite, marker=None)
        resolve_device(args.device)
    except NSCError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nsc_prune.hf.train.trainer import cpu_has_native_bf16

    native_bf16 = args.device == "cuda" or cpu_has_native_bf16()
    dtype = args.dtype or ("bfloat16" if native_bf16 else "float32")
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, dtype)).to(args.device).eval()
    start = time.perf_counter()
    samples, written = sample(model, tokenizer, args)
    seconds = time.perf_counter() - start
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "overwrite")} | {"dtype": dtype}
    record = {"settings": settings, "samples": len(samples), "tokens": written, "seconds": round(seconds, 1)}
    atomic_write_text(args.out, "\n\n".join(samples) + "\n")
    atomic_write_text(args.out.with_name(args.out.name + ".json"), to_json(record | {"provenance": provenance()}))
    print(f"wrote {args.out}: {written:,} tokens in {len(samples):,} samples, {seconds:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
