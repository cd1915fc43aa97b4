"""Study: one super-adapter for the whole front vs healing each point, on SmolLM2-135M (CPU, float32).

Space ``ffn-grid`` with layer 0 protected, step 64 and ``ffn_min_fraction`` 0.25 (so that 70 % is reachable: at
the bundled 0.5 the smallest point is 71 % of the parameters), the grid of scripts/study_smollm2.py and
scripts/compare_peers_smollm2.py (which can reuse this super-adapter: ``--super-adapter OUT/super-adapter``).
Data, all local:

- training text: the stdlib's ``pydoc_data.topics`` (the Python language reference topics ``help()`` shows);
- held-out texts: the docstrings of a fixed list of stdlib modules and their public members (``HELDOUT_MODULES``),
  and English prose from another source (``nsc_prune.eval.studies.prose_text``: lm-eval's task READMEs), neither trained on.

Steps: (1) the search's front (``nsc-prune --model BASE --space ffn-grid ...``); (2) ``train-supernet`` for
``--steps`` steps of ``--batch-size`` x ``--seq-len`` tokens (sandwich rule, n=2: 4 subnets per step; activation
order on the training text); (3) for the 90/80/70 % points: (a) the same plan and channel order with no training
(the base weights cut in the super-adapter's stored channel order, no LoRA), (b) extraction from the
super-adapter, (c) ``heal`` of (a) with the same total training-token budget split over the three points
(``--heal-budget per-point`` gives each point the whole budget instead). Reported per checkpoint: held-out
perplexity on both texts, ``commonsense8_offline`` Avg8 (``--limit`` documents per task), tokens and wall time.

    python scripts/study_recovery_smollm2.py --out runs/recovery                 # defaults: see --help
    python scripts/study_recovery_smollm2.py --out runs/r --steps 12 --seq-len 128 --limit 40
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from nsc_prune.cli.parser import check_new_folder, positive_int, positive_number
from nsc_prune.cli.scripts import run_script
from nsc_prune.eval import studies  # the prose held-out text, shared with the other SmolLM2 studies

HELDOUT_MODULES = (
    "argparse",
    "collections",
    "csv",
    "dataclasses",
    "datetime",
    "functools",
    "itertools",
    "json",
    "logging",
    "pathlib",
    "random",
    "re",
    "shutil",
    "statistics",
    "string",
    "subprocess",
    "textwrap",
    "typing",
    "unittest",
    "urllib.parse",
)
POINTS = ("90%", "80%", "70%")
# the grid of the other SmolLM2 studies
SPACE = {"ffn_step": studies.FFN_STEP, "protect_layers": [0], "ffn_min_fraction": studies.MIN_FRACTION}


# This study keeps its own texts (topics stripped; docstrings of HELDOUT_MODULES) rather than
# nsc_prune.eval.studies': its published numbers (docs) were measured on them.
def training_text(path: Path) -> Path:
    from pydoc_data.topics import topics

    path.write_text("\n\n".join(topics[key].strip() for key in sorted(topics)) + "\n")
    return path


def heldout_text(path: Path) -> Path:
    """Docstrings of ``HELDOUT_MODULES`` and their public classes and functions, one document each."""
    docs = []
    for name in HELDOUT_MODULES:
        module = importlib.import_module(name)
        docs.append(inspect.getdoc(module) or "")
        for attr in sorted(dir(module)):
            obj = getattr(module, attr)
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)):
                docs.append(inspect.getdoc(obj) or "")
    path.write_text("\n\n".join(d.strip() for d in dict.fromkeys(docs) if d and len(d) > 80) + "\n")
    return path


def untrained_point(search: Path, base: Path, adapter: Path, budget: str, out: Path) -> Path:
    """The point's plan cut in the super-adapter's channel order, with no LoRA: what the super-adapter starts from."""
    from nsc_prune.hf.cut.selection import adapter_channel_orders
    from nsc_prune.hf.extract import ExtractOptions, extract_plan
    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.plan import ParetoDocument, pareto_path

    document = ParetoDocument.read(pareto_path(search))
    index = document.select(budget=budget)
    model = open_base(base)
    orders, selection = adapter_channel_orders(adapter, model)
    record = {"point_index": index, "selection": selection, "note": "untrained: the super-adapter's order, no LoRA"}
    plans = document.points[index].layer_plans()
    return extract_plan(plans, model, out, None, ExtractOptions(dtype="float32"), record, orders)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def perplexity(folder: Path, heldout: Path, seq_len: int, tokens: int) -> tuple[float, int]:
    """Held-out perplexity of ``folder`` over the training loader's blocks of ``heldout`` (the trainer's own
    ``evaluate_loss``, so it reads as the recovery's validation loss; this study's published numbers use it, which is
    why it is not ``nsc_prune.eval.perplexity``'s overlapping windows), and the tokens read. The published numbers
    were measured before training text was read as written (12-06), with an EOS after each paragraph of ``heldout``;
    a rerun reads it as one text, so its numbers differ."""
    import transformers

    from nsc_prune.hf.train.data import load_text_blocks
    from nsc_prune.hf.train.trainer import evaluate_loss
    from nsc_prune.hf.weights.loading import load_pruned

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    blocks = load_text_blocks([heldout], tokenizer, seq_len, val_fraction=0.0, max_tokens=tokens)
    model = load_pruned(folder, dtype="float32").eval()
    return math.exp(evaluate_loss(model, blocks.train, 8)), int(blocks.train.numel())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="working folder (must not exist)")
    parser.add_argument("--steps", type=positive_int, default=60, help="super-adapter optimizer steps (default 60)")
    parser.add_argument("--seq-len", type=positive_int, default=256)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--learning-rate", type=positive_number, default=5e-4)
    parser.add_argument(
        "--heal-budget",
        choices=("total", "per-point"),
        default="total",
        help="heal tokens: the super-adapter's total split over the points (default) or all of it each",
    )
    parser.add_argument(
        "--heldout-tokens", type=positive_int, default=16384, help="held-out tokens read (default 16384)"
    )
    parser.add_argument(
        "--limit", type=positive_int, default=50, help="commonsense8_offline documents per task (default 50)"
    )
    parser.add_argument("--no-eval", action="store_true", help="skip commonsense8_offline (perplexity only)")
    args = parser.parse_args()
    check_new_folder(parser, args.out)
    return args


def train_super_adapter(args: argparse.Namespace, base: Path, train_file: Path, out: Path, recipe: dict) -> Path:
    """(2) ``train-supernet`` on the study's grid for ``--steps`` steps."""
    from nsc_prune.hf.train.supernet import SupernetRequest, train_supernet

    say(f"training the super-adapter: {args.steps} steps of {args.batch_size} x {args.seq_len} tokens")
    return train_supernet(
        SupernetRequest(
            base=base,
            space="ffn-grid",
            data=(str(train_file),),
            out=out / "super-adapter",
            settings=SPACE | recipe,
            max_steps=args.steps,
            seq_len=args.seq_len,
            progress=False,
        )
    )


def point_checkpoints(
    args: argparse.Namespace, base: Path, adapter: Path, recipe: dict, train_file: Path, out: Path, adapter_s: float
) -> tuple[list[tuple[str, Any, int, float]], int, int]:
    """(3) Each point untrained, from the super-adapter and healed: (label, folder, training tokens, wall s) each;
    with the super-adapter's tokens and the heal steps per point."""
    from nsc_prune._files import SUPERNET_RECORD_NAME
    from nsc_prune.hf.extract import ExtractOptions, extract_subnet
    from nsc_prune.hf.train.heal import heal
    from nsc_prune.hf.train.recipe import TrainConfig

    search = out / "search"
    super_tokens = json.loads((adapter / SUPERNET_RECORD_NAME).read_text())["token_budget"]["tokens"]
    heal_steps = max(1, args.steps // len(POINTS)) if args.heal_budget == "total" else args.steps
    options = ExtractOptions(dtype="float32")
    config = TrainConfig.from_dict(
        {**TrainConfig().to_dict(), **recipe, "max_steps": heal_steps, "seq_len": args.seq_len,
         "gradient_checkpointing": False}
    )  # fmt: skip
    checkpoints = [("base", base, 0, 0.0)]
    for budget in POINTS:
        tag = budget.rstrip("%")
        say(f"{budget}: extracting (untrained, super-adapter) and healing {heal_steps} steps")
        t0 = time.perf_counter()
        plain = untrained_point(search, base, adapter, budget, out / f"p{tag}-untrained")
        t_plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        trained = extract_subnet(search, base, out / f"p{tag}-super", budget=budget, adapter=adapter, options=options)
        t_super = time.perf_counter() - t0
        t0 = time.perf_counter()
        healed = heal(plain, [str(train_file)], out / f"p{tag}-heal", config, progress=False)
        t_heal = time.perf_counter() - t0
        checkpoints += [
            (f"{budget} untrained", plain, 0, t_plain),
            (f"{budget} super-adapter", trained, super_tokens, adapter_s + t_super),
            (f"{budget} heal", healed, heal_steps * config.tokens_per_step, t_plain + t_heal),
        ]
    return checkpoints, super_tokens, heal_steps


def add_task_scores(rows: list[dict[str, Any]], base: Path, limit: int, out: Path) -> None:
    """Avg8 on ``commonsense8_offline`` (``limit`` documents per task), its standard error and the params, per row."""
    from nsc_prune.eval.runner import EvalConfig, evaluate_checkpoints
    from nsc_prune.eval.tasks import average_stderr

    say(f"commonsense8_offline, {limit} documents per task")
    config = EvalConfig(tasks=("commonsense8_offline",), limit=limit, device="cpu", dtype="float32", base=str(base))
    doc = evaluate_checkpoints([row["path"] for row in rows], config, out / "eval", progress=False)
    for row, result in zip(rows, doc["checkpoints"], strict=True):
        row["avg8"] = result.get("avg")
        row["avg8_stderr"] = average_stderr(result["results"]) if result.get("results") else None
        row["params"] = result.get("params")


def print_table(rows: list[dict[str, Any]], eval_tokens: int, out: Path) -> None:
    print("| checkpoint | ppl docstrings | ppl prose | Avg8 | training tokens | wall s |\n|---|---|---|---|---|---|")
    for row in rows:
        avg = row.get("avg8")
        err = row.get("avg8_stderr")
        avg = f"{100 * avg:.1f}" + (f" ± {100 * err:.1f}" if err else "") if isinstance(avg, (int, float)) else "-"
        print(
            f"| {row['label']} | {row['heldout_ppl']:.2f} | {row['heldout_ppl_prose']:.2f} | {avg} "
            f"| {row['train_tokens']:,} | {row['wall_s']:.0f} |"
        )
    print(f"held-out: {eval_tokens:,} tokens; details in {out / 'study.json'}")


def main() -> int:
    args = parse_args()

    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint
    from nsc_prune.planning import search_plan

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # new or empty (parse_args)
    base = smollm2_checkpoint()
    train_file, heldout = training_text(out / "train.txt"), heldout_text(out / "heldout.txt")
    prose = out / "prose.txt"  # English prose from another source, never trained on (studies.prose_text)
    prose.write_text(studies.prose_text())
    search_plan(str(base), POINTS[-1], "ffn-grid", overrides=SPACE).document.write(out / "search")
    recipe = {
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "warmup_steps": 0,
        "save_steps": 10**6,
        "eval_steps": 10**6,
        "logging_steps": max(1, args.steps // 10),
    }
    timings = {}
    start = time.perf_counter()
    adapter = train_super_adapter(args, base, train_file, out, recipe)
    timings["super_adapter_train_s"] = time.perf_counter() - start
    checkpoints, super_tokens, heal_steps = point_checkpoints(
        args, base, adapter, recipe, train_file, out, timings["super_adapter_train_s"]
    )

    say("held-out perplexity")
    rows = []
    for label, folder, tokens, wall in checkpoints:
        ppl, eval_tokens = perplexity(Path(folder), heldout, args.seq_len, args.heldout_tokens)
        ppl_prose, _ = perplexity(Path(folder), prose, args.seq_len, args.heldout_tokens)
        rows.append(
            {
                "label": label,
                "path": str(folder),
                "heldout_ppl": round(ppl, 3),
                "heldout_ppl_prose": round(ppl_prose, 3),
                "train_tokens": tokens,
                "wall_s": round(wall, 1),
            }
        )
    summary = {
        "heldout_tokens": eval_tokens,
        "super_adapter_tokens": super_tokens,
        "subnets_per_step": 4,
        "heal_steps_per_point": heal_steps,
        "heal_budget": args.heal_budget,
        "args": vars(args),
        "timings": timings,
        "rows": rows,
    }
    (out / "study.json").write_text(json.dumps(summary, indent=2) + "\n")  # kept if the evaluation is stopped
    if not args.no_eval:
        add_task_scores(rows, base, args.limit, out)
    (out / "study.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_table(rows, eval_tokens, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
