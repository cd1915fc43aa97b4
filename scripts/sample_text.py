"""Text a model writes itself, to heal on (``nsc-prune heal --data``): samples that start from the tokenizer's end
token (``eos_token``: ``<|im_end|>`` for SmolLM2-135M-Instruct, not ``<|endoftext|>``), at temperature 1, top-k 50 and top-p 0.95, each at most ``--new-tokens`` tokens and cut at its first end
token, one sample a paragraph, until ``--tokens`` tokens are written (an OUT ending in ``.jsonl``: one record
``{"text": ...}`` a sample, which heal ends with EOS each; a ``.txt`` is read by heal as one text, its samples
paragraphs without EOS between them). docs/recovery_study.md ("More text, the
same minutes"; "Conversations the model writes itself") says what they bought. With ``--chat`` each sample is a conversation the model writes itself from its chat
template alone (Magpie, Xu et al. 2024): a user's question sampled after the template's user header, cut at its
end-of-turn token, then the assistant's answer to it; the question and the answer make the paragraph.

    python scripts/sample_text.py BASE --tokens 300000 --out sampled.txt
    python scripts/sample_text.py BASE --tokens 300000 --out chats.txt --chat

``--batch-size`` samples a ``generate`` call, with a static KV cache sized to the call, in bf16 on a GPU or on a CPU
that multiplies bf16 natively (float32 otherwise; ``--dtype`` decides). Writes OUT and OUT.json (the settings, the
tokens and seconds, provenance) together, atomically. A Ctrl-C, SIGTERM or SIGHUP keeps what was sampled: OUT holds
the samples of the whole batches done, and OUT.json says ``stopped_by`` (exit 130, 143 or 129); nothing is written
when no batch was done. Sampling does not resume: the same command again says that OUT is a stopped run's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nsc_prune._io import (
    atomic_files,
    check_output,
    check_outside,
    handling_signals,
    provenance,
    read_json_object,
    to_json,
)
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import InvalidInputError, NSCError
from nsc_prune.eval.checkpoints import check_checkpoint
from nsc_prune.eval.runner import resolve_device

MAX_BATCHES_WITHOUT_A_QUESTION = 8


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="BASE", help="the model to sample from: a safetensors checkpoint folder")
    parser.add_argument("--tokens", type=int, required=True, help="stop once this many tokens are written")
    parser.add_argument("--out", type=Path, required=True, help="the text file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--batch-size", type=int, default=64, help="samples a generate call (default 64)")
    parser.add_argument("--new-tokens", type=int, default=128, help="the longest sample, in tokens (default 128)")
    parser.add_argument(
        "--chat", action="store_true", help="a question and its answer a sample, from the chat template (Magpie)"
    )
    parser.add_argument(
        "--question-tokens", type=int, default=64, help="with --chat, the longest question (default 64)"
    )
    parser.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest; 0: all (default 50)")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling's mass (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="torch's seed (default 0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model runs (default cpu)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="default bfloat16 on CUDA or a CPU with native bf16"
    )
    args = parser.parse_args(argv)
    counts = (args.tokens, args.batch_size, args.new_tokens, args.question_tokens)
    if min(counts) < 1 or args.top_k < 0 or not 0 < args.top_p <= 1:
        parser.error(
            "--tokens, --batch-size, --new-tokens and --question-tokens must be positive, --top-k >= 0, "
            "--top-p in (0, 1]"
        )
    return args


def one_paragraph(text: str) -> str:
    """``text`` with its blank lines removed, so that a sample is one paragraph of OUT (one unit of heal's held-out
    split)."""
    return re.sub(r"\n\s*\n", "\n", text).strip()


def chat_turns(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The chat template around one user message: (the ids before it, the ids after it up to the assistant's
    answer). The ids after it start with the end-of-turn token; a template without one is refused."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidInputError("--chat needs a tokenizer with a chat template; this one has none")
    marker = "\x00question\x00"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True
    )
    before, after = text.split(marker)
    before_ids, after_ids = (tokenizer(part, add_special_tokens=False)["input_ids"] for part in (before, after))
    if not after_ids or after_ids[0] not in tokenizer.all_special_ids:
        raise InvalidInputError(f"--chat: the chat template's user turn does not end with a special token ({after!r})")
    return before_ids, after_ids


def generate(model: Any, prompts: list[list[int]], pad: int, stop: list[int], new_tokens: int, args: Any) -> list:
    """A sample after each prompt (left-padded into one batch), cut before its first ``stop`` token."""
    import torch
    from transformers import StaticCache

    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    # A cache sized to this call: cache_implementation="static" would reuse the longest length of any earlier call,
    # so with --chat every question would attend over an answer's cache (32-39 % slower, docs/recovery_study.md).
    cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=width + new_tokens)
    with torch.inference_mode():
        generated = model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens=new_tokens,
            pad_token_id=pad,
            eos_token_id=stop,
            cache=cache,
        )
    rows = []
    for row in generated[:, width:].tolist():
        end = next((i for i, token in enumerate(row) if token in stop), None)
        rows.append((row, False) if end is None else (row[:end], True))
    return rows


def conversations(model: Any, turns: tuple[list[int], list[int]], eos: int, args: Any) -> list[tuple[list[int], ...]]:
    """One batch of (question, answer) ids, each cut at its turn's end; an unfinished question is dropped."""
    before, after = turns
    stop = sorted({eos, after[0]})
    asked = generate(model, [before] * args.batch_size, eos, stop, args.question_tokens, args)
    questions = [row for row, ended in asked if ended and row]
    if not questions:
        return []
    answers = generate(model, [before + q + after for q in questions], eos, stop, args.new_tokens, args)
    return [(q, a) for q, (a, _) in zip(questions, answers) if a]


def batches(
    model: Any, tokenizer: Any, args: argparse.Namespace, turns: tuple[list[int], list[int]] | None = None
) -> Iterator[list[tuple[str, int]]]:
    """Samples of ``model``, a batch at a time without end: each sample one paragraph and its tokens. With ``turns``
    (``chat_turns``), a sampled question and its answer a sample."""
    from nsc_prune.hf.weights.loading import bos_token_added

    eos = tokenizer.eos_token_id
    start = bos_token_added(tokenizer)  # a text starts as heal reads it: BOS (LLaMA's, Gemma's), else after an EOS
    prompt = [[eos if start is None else start]] * args.batch_size
    idle = 0
    while True:
        if turns is None:
            rows = [(row,) for row, _ in generate(model, prompt, eos, [eos], args.new_tokens, args)]
        else:
            rows = conversations(model, turns, eos, args)
            idle = 0 if rows else idle + 1
            if idle == MAX_BATCHES_WITHOUT_A_QUESTION:
                raise InvalidInputError(
                    f"--chat: no finished question and answer in {idle} batches "
                    f"(at most --question-tokens {args.question_tokens} and --new-tokens {args.new_tokens} each)"
                )
        texts = ((one_paragraph("\n".join(tokenizer.decode(part) for part in parts)), parts) for parts in rows)
        yield [(text, sum(map(len, parts))) for text, parts in texts if text]


def sample(model: Any, tokenizer: Any, args: argparse.Namespace, turns: Any, samples: list[tuple[str, int]]) -> None:
    """Append samples of ``model`` and their tokens to ``samples`` (``batches``) until ``args.tokens`` tokens. What
    a Ctrl-C or SIGTERM interrupts is in ``samples``, up to the last whole batch."""
    from nsc_prune.hf.progress import progress

    written = 0
    for batch in progress(batches(model, tokenizer, args, turns), "sampling", "batch"):
        samples.extend(batch)
        written += sum(tokens for _, tokens in batch)
        if written >= args.tokens:
            break


def sigterm_interrupts() -> contextlib.AbstractContextManager[None]:
    """SIGTERM (SIGHUP) raises ``KeyboardInterrupt`` in the block, as a Ctrl-C does, so that what was sampled is
    kept."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    return handling_signals(interrupt)


def record_path(out: Path) -> Path:
    """The run's record beside the text: ``OUT.json``."""
    return Path(out).with_name(Path(out).name + ".json")


def check_not_stopped(out: Path, overwrite: bool) -> None:
    """Name an earlier run of ``out`` that a signal stopped short (a requeued job meets it): a run is not resumed."""
    record = record_path(out)
    if overwrite or not (out.is_file() and record.is_file()):
        return
    try:
        stopped = read_json_object(record)
    except NSCError:
        return  # not a record of ours: check_output's rule for an existing file says the rest
    if stopped.get("stopped_by"):
        tokens = stopped.get("tokens")
        short = f" after {tokens:,} tokens" if isinstance(tokens, int) else ""
        raise InvalidInputError(
            f"{out} holds a run that {stopped['stopped_by']} stopped{short} (its samples are whole); sampling does "
            "not resume: pass --overwrite to sample again, or another --out and join the texts"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_checkpoint(Path(args.model))  # a folder with config.json, safetensors and a tokenizer (not the Hub)
        check_outside(Path(args.out), [args.model])
        check_not_stopped(Path(args.out), args.overwrite)
        for out in (args.out, record_path(args.out)):
            check_output(out, [args.model], args.overwrite, marker=None)
        resolve_device(args.device)
    except NSCError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nsc_prune.hf.train.precision import cpu_has_native_bf16
    from nsc_prune.hf.weights.loading import from_pretrained

    native_bf16 = args.device == "cuda" or cpu_has_native_bf16()
    dtype = args.dtype or ("bfloat16" if native_bf16 else "float32")
    torch.manual_seed(args.seed)
    samples: list[tuple[str, int]] = []
    stopped_by = None
    start = time.perf_counter()
    with sigterm_interrupts():
        try:
            tokenizer = AutoTokenizer.from_pretrained(args.model)
            turns = chat_turns(tokenizer) if args.chat else None
            model = from_pretrained(AutoModelForCausalLM, args.model, dtype=getattr(torch, dtype))
            model = model.to(args.device).eval()
            start = time.perf_counter()
            sample(model, tokenizer, args, turns, samples)
        except NSCError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as stop:
            stopped_by = str(stop) or "SIGINT"
            if not samples:
                print(f"interrupted by {stopped_by}; nothing was written", file=sys.stderr)
                return 128 + signal.Signals[stopped_by]  # as the shell reports a process the signal ended
    seconds, written = time.perf_counter() - start, sum(tokens for _, tokens in samples)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "overwrite")} | {"dtype": dtype}
    record = {"settings": settings, "samples": len(samples), "tokens": written, "seconds": round(seconds, 1)}
    if stopped_by:
        record["stopped_by"] = stopped_by
    with atomic_files(args.out, record_path(args.out), overwrite=True) as (text_tmp, record_tmp):
        texts = [text for text, _ in samples]
        jsonl = args.out.suffix == ".jsonl"
        lines = "\n".join(json.dumps({"text": text}) for text in texts) if jsonl else "\n\n".join(texts)
        text_tmp.write_text(lines + "\n", encoding="utf-8")
        record_tmp.write_text(to_json(record | {"provenance": provenance()}), encoding="utf-8")
    summary = f"{args.out}: {written:,} tokens in {len(samples):,} samples, {seconds:.0f} s"
    if stopped_by is None:
        print(f"wrote {summary}", flush=True)
        return 0
    print(f"interrupted by {stopped_by}: wrote {summary}, short of --tokens {args.tokens:,}", file=sys.stderr)
    return 128 + signal.Signals[stopped_by]  # as the shell reports a process the signal ended


if __name__ == "__main__":
    raise SystemExit(run_script(main))
