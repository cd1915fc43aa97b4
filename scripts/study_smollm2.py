"""Real-model study on CPU (issue 6 item 4): SmolLM2-135M pruned to 90/80/70 % of its params.

On ``ffn-grid`` (``ffn_step=64``, widths down to 25 %, layer 0 protected) it compares, at each budget:
NSC-DP with psi_MP, NSC-DP with psi_W (``--score psi_w``), uniform widths (the widest one grid width for
every unprotected layer that fits), and five random plans of the same parameter count (random grid
widths, then random +-step moves until the FFN total is within one step under the NSC plan's).
Every plan is extracted with the same ``activation`` channel orders, computed once from a calibration
text (Python's ``pydoc_data.topics``: the language reference topics) and evaluated by perplexity on a
different held-out English text (the docstrings of a fixed list of stdlib modules), and by zero-shot
accuracy on the offline commonsense sets (``commonsense8_offline``: 8 x 40 questions, so Avg8 has a
standard error of about 2.5 points; read differences below that as noise).

    .venv/bin/python scripts/study_smollm2.py            # full study, writes out/study-smollm2/
    .venv/bin/python scripts/study_smollm2.py --quick    # one budget, two random plans, fewer tokens

Writes ``study.md`` (table), ``study.json`` and ``study.png`` to ``--out``; ``rows.jsonl`` there grows
one line per evaluated plan, so an interrupted run keeps what it measured. Existing outputs (``rows.jsonl``
included) are refused unless ``--overwrite``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsc_prune._io import atomic_file, publish_text
from nsc_prune.cli.parser import check_file_output, percent_list, positive_int
from nsc_prune.cli.scripts import run_script
from nsc_prune.eval.studies import (
    EVAL_MODULES,
    MIN_FRACTION,
    TASKS,
    calibration_text,
    grid_front,
    heldout_text,
    random_plan,
)

OUTPUTS = ("study.md", "study.json", "study.png", "rows.jsonl")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/study-smollm2"))
    parser.add_argument("--budgets", type=percent_list, help="percent of the full model's params (default 90,80,70)")
    parser.add_argument("--random", type=positive_int, help="random plans per budget (default 5)")
    parser.add_argument("--calib-tokens", type=positive_int, help="default 4096")
    parser.add_argument("--eval-tokens", type=positive_int, help="default 8192")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-tasks", action="store_true", help="perplexity only (skip the offline task accuracy)")
    parser.add_argument(
        "--quick", action="store_true", help="by default one budget (80), two random plans, 1024/2048 tokens"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier study in --out")
    args = parser.parse_args(argv)
    defaults = ([80], 2, 1024, 2048) if args.quick else ([90, 80, 70], 5, 4096, 8192)
    for name, default in zip(("budgets", "random", "calib_tokens", "eval_tokens"), defaults, strict=True):
        if getattr(args, name) is None:  # a flag given wins over --quick
            setattr(args, name, default)
    for name in OUTPUTS:
        check_file_output(parser, str(args.out / name), args.overwrite)
    return args


def measurer(base_dir: Path, args: argparse.Namespace, stack: contextlib.ExitStack) -> Callable[[Path], tuple]:
    """checkpoint folder -> (held-out perplexity, Avg8 or None with ``--no-tasks``)."""
    from transformers import AutoTokenizer

    from nsc_prune.eval.perplexity import perplexity
    from nsc_prune.eval.runner import EvalConfig, evaluate_model
    from nsc_prune.eval.tasks import average, resolve_tasks
    from nsc_prune.hf.cut.selection import calibration_ids
    from nsc_prune.hf.weights.loading import load_pruned

    eval_ids = calibration_ids(base_dir, heldout_text(), args.eval_tokens)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    eval_config = EvalConfig(tasks=(TASKS,), device="cpu", dtype="float32", batch_size=16)
    tasks = None if args.no_tasks else stack.enter_context(resolve_tasks(TASKS))

    def measure(path: Path) -> tuple[float, float | None]:
        model = load_pruned(path, dtype="float32", adapter=False)
        ppl = perplexity(model, eval_ids, 512)
        acc = None if tasks is None else average(evaluate_model(model, tokenizer, tasks, eval_config))
        return ppl, acc

    return measure


def budget_plans(
    fronts: dict[str, Any], base: Any, limit: int, params: Callable[[list[int]], int], args: argparse.Namespace,
    rng: random.Random,
) -> dict[str, list[int]]:  # fmt: skip
    """name -> FFN widths at ``limit`` params: each front's point, the uniform plan, ``args.random`` random plans."""
    n_layers = base.num_layers
    grid = list(range(base.widths[0], int(base.widths[0] * MIN_FRACTION) - 1, -64))  # the search's grid
    plans: dict[str, list[int]] = {}
    for name, front in fronts.items():
        point = front.points[front.select(budget=limit)]
        plans[name] = [plan.ffn for plan in point.layer_plans()]
    uniform = next((w for w in grid if params([base.widths[0]] + [w] * (n_layers - 1)) <= limit), None)
    if uniform is not None:
        plans["uniform"] = [base.widths[0]] + [uniform] * (n_layers - 1)
    for k in range(args.random):
        plans[f"random {k + 1}"] = random_plan(plans["NSC psi_MP"], grid, {0}, rng)
    return plans


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()

    import torch

    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    base_dir = smollm2_checkpoint()
    base = open_base(base_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="study-", dir=args.out))
    try:
        return study(args, base_dir, base, work, start)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def study(args: argparse.Namespace, base_dir: Path, base: Any, work: Path, start: float) -> int:
    """The study in the temporary folder ``work`` (removed by the caller)."""
    from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders
    from nsc_prune.hf.extract import extract_plan
    from nsc_prune.plan import LayerPlan
    from nsc_prune.planning import ScoreSettings

    calib_file = work / "calib.txt"
    calib_file.write_text(calibration_text())
    t0 = time.perf_counter()
    orders, selection = channel_orders(
        base, SelectionConfig("activation", calib=str(calib_file), calib_tokens=args.calib_tokens)
    )
    calib_s = time.perf_counter() - t0
    stack = contextlib.ExitStack()
    measure = measurer(base_dir, args, stack)

    dense, dense_acc = measure(base_dir)
    print(f"dense        ppl {dense:9.2f}  avg8 {fmt_acc(dense_acc)}", flush=True)

    t0 = time.perf_counter()
    fronts = {
        "NSC psi_MP": grid_front("smollm2-135m", work / "mp"),
        "NSC psi_W": grid_front("smollm2-135m", work / "w", score=ScoreSettings("psi_w", str(base_dir))),
    }
    search_s = time.perf_counter() - t0
    full = max(p.params for p in fronts["NSC psi_MP"].points)
    hidden = base.config["hidden_size"]
    fixed = full - 3 * hidden * sum(base.widths)  # params outside the FFNs

    def params(widths: list[int]) -> int:
        return fixed + 3 * hidden * sum(widths)

    rows, rng = [], random.Random(args.seed)
    log = (args.out / "rows.jsonl").open("w")
    for pct in args.budgets:
        for name, widths in budget_plans(fronts, base, full * pct // 100, params, args, rng).items():
            out = work / f"{pct}-{name.replace(' ', '_')}"
            extract_plan([LayerPlan(ffn=w) for w in widths], base, out, orders=orders)
            ppl, acc = measure(out)
            rows.append(
                {"budget": pct, "plan": name, "params": params(widths), "ppl": ppl, "avg8": acc, "widths": widths}
            )
            log.write(json.dumps(rows[-1]) + "\n")
            log.flush()
            print(
                f"{pct}% {name:12s} params {params(widths) / 1e6:7.2f}M  ppl {ppl:9.2f}  avg8 {fmt_acc(acc)}",
                flush=True,
            )
            shutil.rmtree(out)
    stack.close()
    wall = time.perf_counter() - start
    write_outputs(args, rows, (dense, dense_acc), selection, calib_s, search_s, wall, full)
    return 0


def fmt_acc(acc: float | None) -> str:
    return "n/a" if acc is None else f"{100 * acc:.2f}"


def write_outputs(args, rows, dense, selection, calib_s, search_s, wall, full) -> None:
    dense_ppl, dense_acc = dense
    budgets = sorted({r["budget"] for r in rows}, reverse=True)
    names = [n for n in dict.fromkeys(r["plan"] for r in rows) if not n.startswith("random")]
    with_acc = dense_acc is not None

    def cell(ppl: float, acc: float | None) -> str:
        return f"{ppl:.2f}" + (f" / {fmt_acc(acc)}" if with_acc else "")

    metric = "perplexity / Avg8 (%)" if with_acc else "perplexity"
    lines = [
        f"SmolLM2-135M on ffn-grid (step 64, down to {MIN_FRACTION:.0%}, layer 0 protected); every plan extracted "
        f"with `activation` selection on {selection['calib_tokens']} tokens of pydoc topics. Cells: {metric}; "
        f"perplexity on {args.eval_tokens} tokens of stdlib docstrings ({', '.join(EVAL_MODULES)})"
        + (f", Avg8 on `{TASKS}` (320 questions, standard error about 2.5 points)" if with_acc else "")
        + f". Dense model ({full / 1e6:.2f}M params): {cell(dense_ppl, dense_acc)}.",
        "",
        "| budget | " + " | ".join(names) + f" | random (mean of {args.random}) | random (best ppl) |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    for b in budgets:
        at = {r["plan"]: r for r in rows if r["budget"] == b}
        rand = [r for n, r in at.items() if n.startswith("random")]
        cells = [
            f"{cell(at[n]['ppl'], at[n]['avg8'])} ({at[n]['params'] / 1e6:.1f}M)" if n in at else "n/a" for n in names
        ]
        if rand:
            mean_acc = sum(r["avg8"] for r in rand) / len(rand) if with_acc else None
            best = min(rand, key=lambda r: r["ppl"])
            cells += [cell(sum(r["ppl"] for r in rand) / len(rand), mean_acc), cell(best["ppl"], best["avg8"])]
        else:
            cells += ["n/a", "n/a"]
        lines.append(f"| {b}% | " + " | ".join(cells) + " |")
    lines += [
        "",
        (
            f"Wall time {wall:.0f} s (calibration {calib_s:.0f} s, both searches {search_s:.1f} s), "
            f"command: `{' '.join([Path(sys.executable).name, *sys.argv])}`"
        ),
        "",
    ]
    publish_text(args.out / "study.md", "\n".join(lines))
    publish_text(
        args.out / "study.json",
        json.dumps(
            {"dense_ppl": dense_ppl, "dense_avg8": dense_acc, "selection": selection, "rows": rows, "wall_s": wall},
            indent=2,
        ),
    )
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = [("ppl", dense_ppl, "perplexity (held-out)")] + (
        [("avg8", dense_acc, "Avg8 (offline tasks)")] if with_acc else []
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (key, ref, label) in zip(axes[0], panels):
        for name in names:
            pts = sorted((r["params"] / 1e6, r[key]) for r in rows if r["plan"] == name)
            ax.plot(*zip(*pts), marker="o", label=name)
        rand = [(r["params"] / 1e6, r[key]) for r in rows if r["plan"].startswith("random")]
        if rand:
            ax.scatter(*zip(*rand), marker="x", color="gray", label="random")
        ax.axhline(ref, color="black", linestyle=":", label="dense")
        ax.set_xlabel("params (M)")
        ax.set_ylabel(label)
        if key == "ppl":
            ax.set_yscale("log")
        ax.legend()
    fig.tight_layout()
    with atomic_file(args.out / "study.png", overwrite=True) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


if __name__ == "__main__":
    raise SystemExit(run_script(main))
