"""Where a healed model's held-out loss stands against its base's, token by token: every held-out token bucketed by
how often it occurs in the training text. A heal recovers most on the tokens its text shows it; docs/recovery_study.md
("Where the prose gap lies, token by token") has what this found on SmolLM2.

    python scripts/token_gap.py BASE HEALED --pruned PRUNED --data train.txt --out gap.json
    python scripts/token_gap.py BASE HEALED --data train.txt --heldout served.txt --out gap.json

Held-out text: ``--heldout FILE...`` (UTF-8, the first ``--tokens`` tokens of each), by default the three texts the
studies judge on (stdlib docstrings, English prose, Python code: ``nsc_prune.eval.studies.heldout_domains``). The
training text is read as ``nsc-prune heal --data`` reads it. Per bucket: the held-out tokens in it, each model's
mean loss (nats), the bucket's share of HEALED's summed loss above BASE's (``gap_share``) and, with ``--pruned``,
the share of the bucket's pruning damage the heal removed (``recovered``). Writes OUT atomically (with provenance).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from nsc_prune._io import atomic_write_text, check_output, check_outside, provenance, to_json
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import InvalidInputError, NSCError
from nsc_prune.eval.checkpoints import check_checkpoint

BUCKETS = ((0, 0), (1, 9), (10, 99), (100, 999), (1000, None))  # occurrences in the training text, inclusive


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", metavar="BASE", help="the dense model: a safetensors checkpoint folder")
    parser.add_argument("healed", metavar="HEALED", help="the healed checkpoint (nsc-prune heal --out)")
    parser.add_argument("--pruned", help="the checkpoint before the heal: adds each bucket's share recovered")
    parser.add_argument("--data", nargs="+", required=True, help="the training text, as heal --data reads it")
    parser.add_argument("--text-field", default="text", help="the JSONL text field, as heal (default text)")
    parser.add_argument("--heldout", nargs="+", type=Path, help="held-out text files (default: the studies' three)")
    parser.add_argument("--tokens", type=int, default=4096, help="held-out tokens a text (default 4096)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens a forward window (default 512)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    if args.tokens < 2 or args.seq_len < 1:
        parser.error("--tokens must be at least 2 and --seq-len positive")
    return args


def training_counts(tokenizer: Any, sources: list[str], text_field: str = "text") -> Counter:
    """How often each token id occurs in the training text, its documents tokenized as ``heal`` tokenizes them."""
    from nsc_prune.hf.train.data import check_distinct_sources, document_ids

    check_distinct_sources(sources)  # heal refuses a file named twice; counted twice, every count doubled
    counts: Counter = Counter()
    for source in sources:
        for ids in document_ids(source, tokenizer, text_field)[1]:  # as heal reads it, EOS included
            counts.update(ids)
    return counts


def bucket_rows(losses: dict[str, Any], occurrences: Any) -> list[dict[str, Any]]:
    """One row a bucket of ``BUCKETS`` that holds a token: ``losses`` (model name -> per-token losses, the same
    tokens; "base" and "healed" required, "pruned" optional) against each token's ``occurrences``."""
    gap = losses["healed"] - losses["base"]
    rows = []
    for low, high in BUCKETS:
        inside = occurrences >= low if high is None else (occurrences >= low) & (occurrences <= high)
        if not bool(inside.any()):
            continue
        row: dict[str, Any] = {"occurrences": f"{low}-{high}" if high is not None else f">={low}"}
        row["tokens"] = int(inside.sum())
        row |= {name: round(float(loss[inside].mean()), 4) for name, loss in losses.items()}
        row["gap_share"] = _share(gap[inside].sum(), gap.sum())
        if "pruned" in losses:
            row["recovered"] = _share((losses["pruned"] - losses["healed"])[inside].sum(),
                                      (losses["pruned"] - losses["base"])[inside].sum())  # fmt: skip
        rows.append(row)
    return rows


def _share(part: Any, whole: Any) -> float | None:
    return round(float(part) / float(whole), 4) if float(whole) != 0 else None


def heldout_texts(files: list[Path] | None) -> dict[str, str]:
    """Name -> text: the files given (named by their stem), else the studies' three held-out texts."""
    if not files:
        from nsc_prune.eval.studies import heldout_domains

        return heldout_domains()
    from nsc_prune.hf.cut.selection import read_calibration_text

    stems = [path.stem for path in files]  # a/x.txt and b/x.txt: by path, or the second replaced the first
    names = stems if len(set(stems)) == len(stems) else [str(path) for path in files]
    if len(set(names)) < len(names):
        raise InvalidInputError(f"--heldout names a file twice: {sorted(n for n in names if names.count(n) > 1)[0]}")
    return {name: read_calibration_text(path, "heldout") for name, path in zip(names, files)}


def token_gap(args: argparse.Namespace) -> dict[str, Any]:
    """Every held-out text's per-bucket rows (``bucket_rows``) and each model's mean loss."""
    import torch
    import transformers

    from nsc_prune.eval.perplexity import token_losses
    from nsc_prune.hf.cut.selection import calibration_ids
    from nsc_prune.hf.train.heal import check_same_vocabulary
    from nsc_prune.hf.weights.loading import bos_token_added, load_pruned

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.base)
    bos = bos_token_added(tokenizer)  # windows read as served: BOS first (LLaMA's, Gemma's), every token predicted
    for role, folder in (("pruned model", args.pruned), ("healed model", args.healed)):
        if folder is not None:  # every model is scored on the base's token ids
            check_same_vocabulary(
                Path(args.base), Path(folder), tokenizer, ("base", role), "Compare models of one base"
            )
    counts = training_counts(tokenizer, args.data, args.text_field)
    texts = {name: calibration_ids(args.base, text, args.tokens) for name, text in heldout_texts(args.heldout).items()}
    folders = {"base": args.base, **({"pruned": args.pruned} if args.pruned else {}), "healed": args.healed}
    losses: dict[str, dict[str, Any]] = {name: {} for name in texts}
    for model_name, folder in folders.items():  # one model in memory at a time
        model = load_pruned(folder, dtype="float32")
        for name, ids in texts.items():
            losses[name][model_name] = token_losses(model, ids, args.seq_len, bos)
        del model
    domains = {}
    for name, ids in texts.items():
        predicted = ids if bos is not None else ids[1:]
        occurrences = torch.tensor([counts[int(token)] for token in predicted])
        mean = {model_name: round(float(loss.mean()), 4) for model_name, loss in losses[name].items()}
        domains[name] = {"tokens": len(predicted), "mean_loss": mean, "buckets": bucket_rows(losses[name], occurrences)}
    return {"training_tokens": sum(counts.values()), "training_vocabulary": len(counts), "domains": domains}


def print_table(result: dict[str, Any]) -> None:
    print(f"training text: {result['training_tokens']:,} tokens, {result['training_vocabulary']:,} distinct")
    for name, domain in result["domains"].items():
        models = list(domain["mean_loss"])
        print(f"\n{name} ({domain['tokens']} tokens; mean loss " + ", ".join(
            f"{m} {v:.3f}" for m, v in domain["mean_loss"].items()) + ")")  # fmt: skip
        extra = ["recovered"] if "pruned" in models else []
        header = ["occurrences", "tokens", *models, "gap_share", *extra]
        print("  ".join(f"{h:>11}" for h in header))
        for row in domain["buckets"]:
            print("  ".join(f"{'-' if row[h] is None else row[h]:>11}" for h in header))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        inputs = [args.base, args.healed, args.pruned, *(args.heldout or [])]
        inputs += [source for source in args.data if not source.startswith("hf:")]
        for model in (args.base, args.healed, args.pruned):
            if model is not None:
                check_checkpoint(Path(model))  # a folder with config.json, safetensors and a tokenizer (not the Hub)
        check_output(args.out, inputs, args.overwrite, marker=None)
        check_outside(Path(args.out), [args.base, args.healed, args.pruned])
        result = token_gap(args)
    except NSCError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_table(result)
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    settings["heldout"] = [str(p) for p in args.heldout] if args.heldout else None
    atomic_write_text(args.out, to_json({"settings": settings, **result, "provenance": provenance()}))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
