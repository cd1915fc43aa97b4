"""Recovery loss on SmolLM2-135M: cross-entropy against distillation from the dense model, at the same tokens.

The 80 % plan of ``ffn-grid`` (step 64, down to 25 %) chosen by ``--score measured`` is extracted with
``activation`` selection, then healed twice with the same recipe, data and seed: once with cross-entropy on the
training text (``heal`` without a teacher), once distilled from the dense model (``heal --teacher``). Both are
measured by held-out perplexity on the stdlib docstrings and on English prose (``nsc_prune.eval.studies``), neither trained
or calibrated on. Training and calibration text: ``pydoc_data.topics``.

    python scripts/study_distill_smollm2.py --out runs/distill                 # 12 steps x 4 x 256 tokens each
    python scripts/study_distill_smollm2.py --out runs/distill-48 --steps 48

``--out`` must be a new or empty folder: the study fills it from scratch.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from nsc_prune.cli.parser import check_new_folder, positive_int
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import NSCError
from nsc_prune.eval import studies


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", default="80%")
    parser.add_argument("--steps", type=positive_int, default=12)
    parser.add_argument("--seq-len", type=positive_int, default=256)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--tokens", type=positive_int, default=4096, help="held-out tokens per text")
    args = parser.parse_args(argv)
    try:  # before the minutes of measuring: a budget or recipe refused at the end would waste them
        studies.check_budget(args.budget)
        recipe(args)
    except NSCError as err:
        parser.error(str(err))
    check_new_folder(parser, args.out)
    return args


def recipe(args: argparse.Namespace) -> Any:
    """The heal recipe of both runs: ``--steps`` of ``--batch-size`` x ``--seq-len`` tokens."""
    from nsc_prune.hf.train.recipe import TrainConfig

    return TrainConfig.from_dict(
        {
            **TrainConfig().to_dict(),
            "max_steps": args.steps,
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "warmup_steps": min(20, args.steps // 10),
            "save_steps": 10**6,
            "eval_steps": 10**6,
            "logging_steps": max(1, args.steps // 4),
            "gradient_checkpointing": False,
        }
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import torch

    from nsc_prune._io import atomic_write_text, provenance, to_json
    from nsc_prune.eval.perplexity import perplexity
    from nsc_prune.hf.cut.selection import calibration_ids
    from nsc_prune.hf.train.data import TextData
    from nsc_prune.hf.train.heal import heal
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint
    from nsc_prune.hf.weights.loading import load_pruned

    wall = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    base_dir = smollm2_checkpoint()
    text = args.out / "train.txt"
    text.write_text(studies.calibration_text())
    texts = {"docstrings": studies.heldout_text(), "prose": studies.prose_text()}
    eval_ids = {name: calibration_ids(base_dir, t, args.tokens) for name, t in texts.items()}

    def perplexities(folder: Path) -> dict[str, float]:
        model = load_pruned(folder, dtype="float32", adapter=False).eval()
        return {name: perplexity(model, ids, 512) for name, ids in eval_ids.items()}

    pruned = args.out / "pruned"
    found = studies.measured_point(base_dir, text, args.budget, pruned)
    results = {"pruned": perplexities(pruned)}
    print(f"[{time.perf_counter() - wall:.0f}s] pruned {results['pruned']}", flush=True)
    config = recipe(args)
    data = TextData((str(text),), max_tokens=int(args.steps * args.seq_len * args.batch_size / 0.95) + 2 * args.seq_len)
    for name, teacher in (("cross-entropy", None), ("distillation", base_dir)):
        torch.manual_seed(0)
        start = time.perf_counter()
        healed = heal(pruned, data, args.out / name, config, teacher=teacher, progress=False)
        record = json.loads((healed / "nsc_prune_extract.json").read_text())["recovery"]
        results[name] = {**perplexities(healed), "seconds": time.perf_counter() - start, "tokens": record["tokens"]}
        print(f"[{time.perf_counter() - wall:.0f}s] {name} {results[name]}", flush=True)
    summary = {
        "budget": args.budget,
        "params": found.document.points[found.selected].params,
        "recipe": config.to_dict(),
        "training_text": "pydoc_data.topics",
        "heldout": {"docstrings": f"docstrings of {', '.join(studies.EVAL_MODULES)}", "prose": studies.PROSE_SOURCE},
        "heldout_tokens": args.tokens,
        "dense": perplexities(base_dir),
        "results": results,
        "seconds": time.perf_counter() - wall,
        "provenance": provenance(),
    }
    atomic_write_text(args.out / "distill.json", to_json(summary))
    print(json.dumps(summary["results"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
