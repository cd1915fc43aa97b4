"""Study: what a few minutes of recovery buy on SmolLM2-135M, recipe by recipe (CPU; float32 unless a recipe says bf16).

The ``--budgets`` points of ``ffn-grid`` (step 64, down to 25 %) chosen by ``--score measured`` (calibrated on the
training text, no layer protected) are extracted with ``activation`` selection; each is then healed from scratch
once per recipe (``RECIPES``) and per step count (``--steps``; one optimizer step is ``--batch-size`` x
``--seq-len`` tokens), always from the same pruned checkpoint with the same data and seed. Every healed model is
measured by held-out perplexity on three domains, none trained or calibrated on: stdlib docstrings, English prose
(lm-eval's task READMEs) and Python code without docstrings or comments (``nsc_prune.eval.studies``). Training
text: ``pydoc_data.topics``.

A row records the training tokens and the run's wall seconds; on a machine shared with other work the seconds are
inflated, so compare recipes by tokens and convert with an idle tokens/s measurement (scripts/bench_heal.py).
Rows are appended to ``OUT/budget.json`` as they finish; a rerun with the same ``--out`` skips the rows it has.

    python scripts/study_recovery_budget.py --out runs/budget                        # 80 %, 6 and 20 steps
    python scripts/study_recovery_budget.py --out runs/budget --budgets 80% 70% --steps 6 20 60
    python scripts/study_recovery_budget.py --out runs/budget --recipes lora-kd-w10 full-kd-w10 --steps 60
    python scripts/study_recovery_budget.py --out runs/budget --budgets 80% 70% --super-adapter-minutes 10
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from nsc_prune._files import RECORD_NAME
from nsc_prune._io import read_json_object
from nsc_prune.cli.parser import positive_int, positive_number
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import NSCError
from nsc_prune.eval import studies

# name -> (TrainConfig fields over the defaults, distil from the dense model). "w20": the old fixed 20-step warm-up
# (TrainConfig now caps every warm-up at a tenth of the run, so a rerun of a "w20" recipe warms up like "w10";
# docs/recovery_budget_results.json holds the rows run before the cap); "w10": a tenth of the run. The learning
# rate is given everywhere, so the rows do not move with the recipe's default; so is bf16 (float32 unless the recipe
# says so: "auto" now means bf16 autocast on a CPU with native bf16, and the first rows ran before that), and the
# schedule (cosine unless the recipe says so: the default was cosine until the "-wsd" row).
RECIPES: dict[str, tuple[dict[str, Any], bool]] = {
    "lora-ce-w20": ({"learning_rate": 2e-4}, False),
    "lora-kd-w20": ({"learning_rate": 2e-4}, True),
    "lora-kd-w10": ({"warmup_steps": "10%", "learning_rate": 2e-4}, True),
    "lora-kd-w10-lr1e-3": ({"warmup_steps": "10%", "learning_rate": 1e-3}, True),
    "lora-kd-w10-lr3e-3": ({"warmup_steps": "10%", "learning_rate": 3e-3}, True),
    "lora-ce-w10-lr1e-3": ({"warmup_steps": "10%", "learning_rate": 1e-3}, False),
    "lora64-kd-w10-lr1e-3": ({"warmup_steps": "10%", "learning_rate": 1e-3, "lora_rank": 64, "lora_alpha": 128}, True),
    "lora-kd+ce-w10": ({"warmup_steps": "10%", "ce_weight": 0.5, "learning_rate": 2e-4}, True),
    "full-kd-w10": ({"warmup_steps": "10%", "full": True, "learning_rate": 1e-4}, True),
    "lora-kd-w10-lr1e-3-bf16": ({"warmup_steps": "10%", "learning_rate": 1e-3, "bf16": True}, True),
    "lora-kd-w10-lr1e-3-bf16-top64": ({"warmup_steps": "10%", "learning_rate": 1e-3, "bf16": True}, True),
    "lora-kd-w10-lr1e-3-bf16-T2": (
        {"warmup_steps": "10%", "learning_rate": 1e-3, "bf16": True, "temperature": 2.0},
        True,
    ),
    "lora64-kd-w10-lr1e-3-bf16": (
        {"warmup_steps": "10%", "learning_rate": 1e-3, "bf16": True, "lora_rank": 64, "lora_alpha": 128},
        True,
    ),
    "lora64-kd-w10-lr1e-3-bf16-wsd": (
        {
            "warmup_steps": "10%",
            "learning_rate": 1e-3,
            "bf16": True,
            "lora_rank": 64,
            "lora_alpha": 128,
            "schedule": "wsd",
        },
        True,
    ),
    "lora-mlp-kd-w10-lr1e-3-bf16": (
        {
            "warmup_steps": "10%",
            "learning_rate": 1e-3,
            "bf16": True,
            "lora_targets": ["gate_proj", "up_proj", "down_proj"],
        },
        True,
    ),
    # the same tokens a step (1,024) in longer or shorter sequences
    "lora-kd-w10-lr1e-3-bf16-s512b2": (
        {"warmup_steps": "10%", "learning_rate": 1e-3, "bf16": True, "seq_len": 512, "batch_size": 2},
        True,
    ),
    "lora-kd-w10-lr1e-3-bf16-s128b8": (
        {"warmup_steps": "10%", "learning_rate": 1e-3, "bf16": True, "seq_len": 128, "batch_size": 8},
        True,
    ),
}
RECIPES["lora64-kd-w10-lr1e-3-bf16-wsd-top64"] = RECIPES["lora64-kd-w10-lr1e-3-bf16-wsd"]
RECIPES["lora64-kd-w10-lr5e-4-bf16-wsd"] = (
    {**RECIPES["lora64-kd-w10-lr1e-3-bf16-wsd"][0], "learning_rate": 5e-4},
    True,
)
# Recipes distilled from cached top-k teacher logits (heal --teacher-logits; computed in the row, so its seconds
# include the cache) instead of the live teacher: name -> k. The "-top64" row was recorded when the cache's top k
# were renormalised; a rerun keeps the rest of the mass as one bucket, as --teacher-logits does now.
CACHED_TOP_K = {"lora-kd-w10-lr1e-3-bf16-top64": 64, "lora64-kd-w10-lr1e-3-bf16-wsd-top64": 64}
DOMAINS = ("docstrings", "prose", "code")  # studies.heldout_domains(), in table order
SHARED_RECIPE = "lora-kd-w10-lr1e-3-bf16"  # --super-adapter-minutes' default recipe: the heals' and the super-adapter's
SUPERNET_KEYS = ("learning_rate", "batch_size", "bf16", "lora_rank", "lora_alpha", "seq_len", "warmup_steps",
                 "save_steps", "eval_steps", "logging_steps", "gradient_checkpointing", "schedule")  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budgets", nargs="+", default=["80%"])
    parser.add_argument("--steps", nargs="+", type=positive_int, default=[6, 20])
    parser.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=list(RECIPES))
    parser.add_argument("--seq-len", type=positive_int, default=256)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--tokens", type=positive_int, default=4096, help="held-out tokens per domain (default 4096)")
    parser.add_argument(
        "--super-adapter-minutes",
        type=positive_number,
        help="instead of the recipes: one super-adapter trained this many minutes on the --budgets points' front "
        "against healing each point for an equal share of them (--shared-recipe, distilled from the dense model)",
    )
    parser.add_argument(
        "--shared-recipe",
        choices=sorted(RECIPES),
        default=SHARED_RECIPE,
        help=f"the recipe of --super-adapter-minutes (default {SHARED_RECIPE})",
    )
    args = parser.parse_args(argv)
    try:  # before the minutes of measuring
        for budget in args.budgets:
            studies.check_budget(budget)
    except NSCError as err:
        parser.error(str(err))
    check_same_setup(parser, args)
    return args


def check_same_setup(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A rerun into an ``--out`` that holds rows adds rows only when they are measured as those were: on the same
    held-out tokens, with the same sequence length and batch (a row is skipped as done by budget, recipe, steps)."""
    results = args.out / "budget.json"
    if not results.is_file():
        return
    summary = read_json_object(results)
    held = summary.get("setup") or {"tokens": summary.get("heldout_tokens", args.tokens)}
    asked = {"tokens": args.tokens, "seq_len": args.seq_len, "batch_size": args.batch_size}
    differ = [f"--{k.replace('_', '-')} {held[k]}" for k in held if held[k] != asked[k]]
    if differ:
        parser.error(f"{results} holds rows measured with {', '.join(differ)}: pass the same, or another --out")


def recipe(name: str, steps: int, args: argparse.Namespace) -> Any:
    """The ``TrainConfig`` of recipe ``name`` for a run of ``steps`` steps (no checkpoints or evaluation inside)."""
    from nsc_prune.hf.train.recipe import TrainConfig

    fields, _ = RECIPES[name]
    fields = dict(fields)
    if fields.get("warmup_steps") == "10%":
        fields["warmup_steps"] = max(1, steps // 10)
    return TrainConfig.from_dict(
        {
            **TrainConfig().to_dict(),
            "max_steps": steps,
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "save_steps": 10**6,
            "eval_steps": 10**6,
            "logging_steps": max(1, steps // 4),
            "gradient_checkpointing": False,
            "bf16": False,
            "schedule": "cosine",
            **fields,
        }
    )


def heldout_ids(base_dir: Path, tokens: int) -> dict[str, Any]:
    """The first ``tokens`` token ids of each held-out domain."""
    from nsc_prune.hf.cut.selection import calibration_ids

    return {name: calibration_ids(base_dir, text, tokens) for name, text in studies.heldout_domains().items()}


def perplexities(folder: Path, ids: dict[str, Any]) -> dict[str, float]:
    from nsc_prune.eval.perplexity import perplexity
    from nsc_prune.hf.weights.loading import load_pruned

    model = load_pruned(folder, dtype="float32", adapter=False).eval()
    return {name: round(perplexity(model, domain_ids, 512), 3) for name, domain_ids in ids.items()}


def heal_row(name: str, steps: int, pruned: Path, base_dir: Path, text: Path, args: argparse.Namespace) -> dict:
    """Heal ``pruned`` with recipe ``name`` for ``steps`` steps into a temporary folder; its row (no perplexity)."""
    import shutil

    import torch

    from nsc_prune.hf.train.data import TextData
    from nsc_prune.hf.train.heal import heal

    config = recipe(name, steps, args)
    _, distill = RECIPES[name]
    data = TextData((str(text),), max_tokens=int(steps * args.seq_len * args.batch_size / 0.95) + 2 * args.seq_len)
    out = args.out / "healed" / f"{pruned.name}-{name}-{steps}"
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(0)
    start = time.perf_counter()
    cache = {}
    if name in CACHED_TOP_K:
        cache = {"teacher_logits": out.with_name(out.name + ".logits"), "teacher_top_k": CACHED_TOP_K[name]}
        cache["teacher_logits"].unlink(missing_ok=True)
    heal(pruned, data, out, config, teacher=base_dir if distill else None, progress=False, **cache)
    seconds = time.perf_counter() - start
    record = json.loads((out / "nsc_prune_extract.json").read_text())["recovery"]
    return {"recipe": name, "steps": steps, "tokens": record["tokens"], "seconds": round(seconds, 1), "folder": out}


def super_adapter_rows(
    args: argparse.Namespace, base_dir: Path, text: Path, pruned: dict[str, Path]
) -> list[dict[str, Any]]:
    """One super-adapter trained ``--super-adapter-minutes`` on the measured front (subnets drawn from its points),
    extracted at each budget; and each budget's point healed for an equal share of those minutes. The same recipe
    (``--shared-recipe``) and text; the rows carry their folder for the perplexities."""
    import torch

    from nsc_prune._files import SUPERNET_RECORD_NAME
    from nsc_prune.hf.extract import ExtractOptions, extract_subnet
    from nsc_prune.hf.train.budget import TimeBudget
    from nsc_prune.hf.train.heal import heal
    from nsc_prune.hf.train.supernet import SupernetRequest, train_supernet

    minutes, share = args.super_adapter_minutes, args.super_adapter_minutes / len(args.budgets)
    search = studies.measured_search(base_dir, text, args.budgets[0]).document.write(args.out / "search")
    config = recipe(args.shared_recipe, 1000, args)  # 1000 steps: the time budget sizes the run
    settings = {"ffn_step": studies.FFN_STEP, "ffn_min_fraction": studies.MIN_FRACTION}
    fields = config.to_dict()
    settings |= {key: fields[key] for key in SUPERNET_KEYS}
    torch.manual_seed(0)
    start = time.perf_counter()
    adapter = train_supernet(SupernetRequest(
        base=base_dir, space="ffn-grid", data=(str(text),), out=args.out / "super-adapter", settings=settings,
        pareto=search, distill=True, progress=False, budget=TimeBudget(minutes), overwrite=True,
    ))  # fmt: skip
    seconds = time.perf_counter() - start
    tokens = json.loads((adapter / SUPERNET_RECORD_NAME).read_text())["token_budget"]["tokens"]
    rows = []
    for budget in args.budgets:
        out = args.out / "healed" / f"super-adapter-{budget.rstrip('%')}"
        extract_subnet(search, base_dir, out, budget=budget, adapter=adapter, options=ExtractOptions(dtype="float32"))
        rows.append({"budget": budget, "recipe": f"super-adapter, {len(args.budgets)} points ({args.shared_recipe})",
                     "minutes": minutes, "tokens": tokens, "seconds": round(seconds, 1), "folder": out})  # fmt: skip
    for budget in args.budgets:
        out = args.out / "healed" / f"heal-{budget.rstrip('%')}"
        torch.manual_seed(0)
        start = time.perf_counter()
        heal(pruned[budget], (str(text),), out, config, teacher=base_dir,
             progress=False, budget=TimeBudget(share), overwrite=True)  # fmt: skip
        record = json.loads((out / "nsc_prune_extract.json").read_text())["recovery"]
        rows.append({"budget": budget, "recipe": f"heal ({args.shared_recipe})", "minutes": share,
                     "tokens": record["tokens"], "seconds": round(time.perf_counter() - start, 1), "folder": out})  # fmt: skip
    return rows


def print_table(summary: dict[str, Any]) -> None:
    dense = summary["dense"]
    print(f"| point | recipe | steps | tokens | wall s | {' | '.join(DOMAINS)} |")
    print("|---|---|---|---|---|" + "---|" * len(DOMAINS))
    print(f"| dense | - | - | - | - | {' | '.join(f'{dense[d]:.2f}' for d in DOMAINS)} |")
    for budget, pruned in summary["pruned"].items():
        print(f"| {budget} | none | 0 | 0 | 0 | {' | '.join(f'{pruned[d]:.2f}' for d in DOMAINS)} |")
    for row in summary["rows"]:
        ppl = " | ".join(f"{row[d]:.2f} ({row[d] / dense[d]:.2f}x)" for d in DOMAINS)
        print(f"| {row['budget']} | {row['recipe']} | {row['steps']} | {row['tokens']} | {row['seconds']} | {ppl} |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import shutil

    from nsc_prune._io import atomic_write_text, provenance, to_json
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

    args.out.mkdir(parents=True, exist_ok=True)
    base_dir, text, results = smollm2_checkpoint(), args.out / "train.txt", args.out / "budget.json"
    text.write_text(studies.calibration_text())
    ids = heldout_ids(base_dir, args.tokens)
    summary = (
        json.loads(results.read_text()) if results.exists() else {"dense": perplexities(base_dir, ids), "rows": []}
    )
    done = {(row["budget"], row["recipe"], row.get("steps")) for row in summary["rows"]}
    points = {}
    for budget in args.budgets:
        pruned = points[budget] = args.out / f"pruned-{budget.rstrip('%')}"
        if not pruned.exists():
            found = studies.measured_point(base_dir, text, budget, pruned)
            summary.setdefault("params", {})[budget] = found.document.points[found.selected].params
        if budget not in summary.setdefault("params", {}):  # a point an earlier run cut: its record says
            summary["params"][budget] = (read_json_object(pruned / RECORD_NAME).get("point") or {}).get("params")
        if budget not in summary.setdefault("pruned", {}):
            summary["pruned"][budget] = perplexities(pruned, ids)
    if args.super_adapter_minutes is not None:
        for row in super_adapter_rows(args, base_dir, text, points):
            row.update(perplexities(row.pop("folder"), ids))
            summary.setdefault("per_minute", []).append(row)
            atomic_write_text(results, to_json(summary | {"provenance": provenance()}))
            print(json.dumps(row), flush=True)
        shutil.rmtree(args.out / "healed", ignore_errors=True)
        return 0
    for budget in args.budgets:
        pruned = points[budget]
        for name in args.recipes:
            for steps in args.steps:
                if (budget, name, steps) in done:
                    continue
                row = heal_row(name, steps, pruned, base_dir, text, args)
                row.update(budget=budget, **perplexities(row.pop("folder"), ids))
                shutil.rmtree(args.out / "healed", ignore_errors=True)
                summary["rows"].append(row)
                summary.update(recipes={n: RECIPES[n] for n in sorted({r["recipe"] for r in summary["rows"]})})
                summary.update(heldout_tokens=args.tokens, provenance=provenance())
                summary.update(setup={"tokens": args.tokens, "seq_len": args.seq_len, "batch_size": args.batch_size})
                atomic_write_text(results, to_json(summary))
                print(json.dumps(row), flush=True)
    print_table(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
