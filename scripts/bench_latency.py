"""Does a latency table predict what a whole pruned model measures? (issue 24; docs/speed.md)

    python scripts/bench_latency.py --out out/bench-latency       # ~20 min on 2 CPU cores

Profiles SmolLM2-135M's ``ffn-grid`` (``nsc-prune profile``'s defaults: CPU float32, transformers), then draws
``--plans`` random plans and times each as a whole model: the package's per-layer class (what ``load_pruned``
builds from an extracted checkpoint) from the plan's config, random weights (speed does not depend on the values),
with the same timers (plans built ``--group`` at a time and timed in turn with the dense model; ``measured`` is the
fastest run of each). A shared machine has slow spells that shift a whole round alike, so each plan is also reported
relative to the dense model of its own rounds: the median over rounds of (plan / dense in that round), scaled to the
profile's dense time (``measured_relative``). Prints Spearman's rho and the median absolute error of predicted
against measured latency, for decode and prefill, and the table's cost against one whole-model measurement.

``--backend llama.cpp`` (needs ``pip install 'nsc-prune[llamacpp]'``) profiles with llama.cpp instead, and times
each plan as the deci GGUF ``extract --format gguf`` would write for it (random weights, ``--outtype``, default f16).

``--threads`` (default 1) sets the CPU threads for the profile and the plans alike: on a 2-vCPU VM one thread
decodes as fast as two and its runs spread several times less (docs/speed.md). ``--set`` narrows or widens the space
as the search's ``--set`` does (e.g. ``--set ffn_min_fraction=0.25``).

Plans are drawn to span the space: each plan draws ``q ~ U(0, 1)`` and each layer's option index from
``Binomial(options - 1, q)``, so the set runs from near-dense to near-narrowest, with mixed widths inside each plan.
Plans at one fixed budget differ far less in latency than the timing noise; ``--same-budget`` reports those too.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

from nsc_prune._io import publish_text
from nsc_prune.cli.parser import check_file_output, nonnegative_int, positive_int
from nsc_prune.cli.profile import add_timed_type_arguments, timed_dtype
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import ConfigError

RESULT_FILES = ("lut.json", "latency_results.json")  # replaced only with --overwrite


def plan_config(config: dict, widths: list[int]) -> dict:
    """The pruned checkpoint's config.json for these FFN widths (as ``extract`` writes it)."""
    from nsc_prune.hf.export.pruned import global_width

    common = global_width(widths)
    overrides = {str(i): {"intermediate_size": w} for i, w in enumerate(widths) if w != common}
    out = {k: v for k, v in config.items() if k not in ("per_layer_config", "quantization_config")}
    return {**out, "intermediate_size": common, **({"per_layer_config": overrides} if overrides else {})}


def build_plan_model(config: dict, widths: list[int], dtype):
    from nsc_prune.hf.weights.loading import pruned_classes

    config_class, model_class = pruned_classes()[config["model_type"]]
    return model_class(config_class.from_dict(plan_config(config, widths))).to(dtype).eval()


def plan_timing(config: dict, settings, folder: Path):
    """(widths -> a whole plan model to time, the backend's timer): the package's per-layer class (transformers), or
    the deci GGUF of the plan with random weights, loaded in llama.cpp."""
    if settings.backend != "llama.cpp":
        import torch

        from nsc_prune.hf.latency.transformers_backend import timer

        return lambda widths: build_plan_model(config, widths, getattr(torch, settings.timed_dtype)), timer(settings)
    from nsc_prune.core.layer_plan import LayerPlan
    from nsc_prune.core.spec import layer_dims
    from nsc_prune.hf.latency.llamacpp_backend import build_gguf_model, timer
    from nsc_prune.hf.latency.profiling import LayerShape

    dims, count = layer_dims(config), itertools.count()

    def build(widths: list[int]):
        layers = [LayerShape(d, LayerPlan(ffn=w)) for d, w in zip(dims, widths)]
        return build_gguf_model(folder / f"plan-{next(count)}.gguf", config, layers, settings)

    return build, timer(config, settings)


def errors(predicted: list[float], measured: list[float]) -> dict:
    """Rank agreement (None when the predictions are all equal: plans of one multiset of options) and errors."""
    predicted, measured = np.array(predicted), np.array(measured)
    relative = np.abs(predicted - measured) / measured
    constant = np.ptp(predicted) <= 1e-12 * np.abs(predicted).max()
    return {
        "spearman_rho": None if constant else float(stats.spearmanr(predicted, measured).statistic),
        "median_abs_error": float(np.median(relative)),
        "max_abs_error": float(relative.max()),
        "mean_signed_error": float(np.mean((predicted - measured) / measured)),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/bench-latency"))
    parser.add_argument("--plans", type=nonnegative_int, default=24)
    parser.add_argument(
        "--same-budget",
        type=nonnegative_int,
        default=6,
        help="extra plans at one FFN total (each a permutation of the same widths)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=positive_int, default=5, help="rounds per group of plans (fastest run kept)")
    parser.add_argument("--group", type=positive_int, default=4, help="plans built and timed in turn at once")
    parser.add_argument("--threads", type=positive_int, default=1, help="CPU threads, profile and plans alike")
    parser.add_argument("--backend", choices=("transformers", "llama.cpp"), default="transformers")
    add_timed_type_arguments(parser)  # the profile's --dtype (transformers) and --outtype (llama.cpp)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="space YAML override")
    parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")
    args = parser.parse_args(argv)
    for name in RESULT_FILES:  # before the minutes of profiling
        check_file_output(parser, str(args.out / name), args.overwrite)
    try:
        timed_dtype(args)  # before the output folder is made
    except ConfigError as err:
        parser.error(str(err))
    return args


def random_plans(options: list, args: argparse.Namespace) -> list[tuple[str, list[int]]]:
    """(kind, option index per layer): ``--plans`` spread over the space, ``--same-budget`` at one FFN total."""
    rng = np.random.default_rng(args.seed)
    plans = []
    for _ in range(args.plans):
        q = rng.uniform()
        plans.append(("spread", [int(rng.binomial(len(row) - 1, q)) for row in options]))
    for _ in range(args.same_budget):  # a permutation of one multiset of options: the same FFN total
        base = [j for j in range(len(options[0])) for _ in range(len(options) // len(options[0]))]
        base += [0] * (len(options) - len(base))
        plans.append(("same-budget", [int(j) for j in rng.permutation(base)]))
    return plans


def time_plans(plans: list, options: list, table, model, settings, args: argparse.Namespace, start: float) -> list:
    """Each plan built as a whole model and timed, ``--group`` at a time in turn with the dense model: its fastest
    run, its time relative to the dense model's in the same rounds, and the table's prediction."""
    from nsc_prune.choices import PHASES
    from nsc_prune.core.latency_table import predicted_seconds
    from nsc_prune.hf.latency.profiling import fastest, time_rounds

    rows = []
    folder = Path(tempfile.mkdtemp(prefix="bench-latency-", dir=args.out))  # llama.cpp: the plans' GGUF files
    plan_settings = dataclasses.replace(settings, repeats=args.repeats)
    full = [row[0].label["ffn"] for row in options]
    dense_profiled = table.settings["dense_measured"]
    build, once = plan_timing(model.config, plan_settings, folder)
    for first in range(0, len(plans), args.group):
        group = plans[first : first + args.group]
        widths = {i: [options[l][j].label["ffn"] for l, j in enumerate(choice)] for i, (_, choice) in enumerate(group)}
        built = {i: build(w) for i, w in widths.items()}
        built["dense"] = build(full)  # the reference of this group's rounds
        rounds = time_rounds(built, plan_settings, once)  # timed in turn, round after round
        del built
        for path in folder.iterdir():  # this group's GGUF files (llama.cpp)
            path.unlink()
        timed = fastest(rounds)
        for i, (kind, choice) in enumerate(group):
            predicted = {p: predicted_seconds(table, choice, p) for p in PHASES}
            # the plan's time over the dense model's in the same round (median of rounds), at the profile's dense time
            relative = {
                p: float(np.median([a[p] / b[p] for a, b in zip(rounds[i], rounds["dense"])])) * dense_profiled[p]
                for p in PHASES
            }
            rows.append({"kind": kind, "options": choice, "mean_ffn": float(np.mean(widths[i])),
                         "measured": timed[i], "dense_same_rounds": timed["dense"], "measured_relative": relative,
                         "predicted": predicted})  # fmt: skip
            print(
                f"[{time.perf_counter() - start:.0f}s] plan {first + i} ({kind}, mean FFN {np.mean(widths[i]):.0f}): "
                + ", ".join(
                    f"{p} {1e3 * timed[i][p]:.2f} ms measured ({1e3 * relative[p]:.2f} relative) / "
                    f"{1e3 * predicted[p]:.2f} predicted"
                    for p in PHASES
                ),
                flush=True,
            )
    shutil.rmtree(folder)
    return rows


def print_report(report: dict, dense_runs: list, table, plans: int, profile_s: float, plans_s: float) -> None:
    from nsc_prune.choices import PHASES

    print(
        f"profile {profile_s:.1f} s ({table.settings['distinct_options']} options); {plans} whole plans timed in "
        f"{plans_s:.1f} s"
    )
    for phase in PHASES:  # the noise floor: the same dense model, fastest run of each group of rounds
        times = [1e3 * d[phase] for d in dense_runs]
        print(f"dense model, {phase}, fastest run per group: {min(times):.1f}..{max(times):.1f} ms")
    for kind, phases in report.items():
        for phase, numbers in phases.items():
            rho = "-" if numbers["spearman_rho"] is None else f"{numbers['spearman_rho']:.3f}"
            print(
                f"{kind:30s} {phase:7s}: Spearman rho {rho}, median |error| "
                f"{100 * numbers['median_abs_error']:.1f} %, max {100 * numbers['max_abs_error']:.1f} %, "
                f"mean signed {100 * numbers['mean_signed_error']:+.1f} %"
            )


def main(argv: list[str] | None = None) -> int:
    import torch

    from nsc_prune.choices import PHASES
    from nsc_prune.cli.parser import parse_overrides
    from nsc_prune.core.latency_table import ProfileSettings
    from nsc_prune.hf.latency.profile import profile_latency
    from nsc_prune.hf.progress import quiet
    from nsc_prune.planning import resolve_space

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model, space = resolve_space("smollm2-135m", "ffn-grid", parse_overrides(args.set))
    settings = ProfileSettings(backend=args.backend, dtype=timed_dtype(args), threads=args.threads)
    torch.set_num_threads(args.threads)  # for the whole plans; profile_latency sets (and restores) its own
    with quiet():
        t0 = time.perf_counter()
        table = profile_latency(space, model.config, model.name, settings)
        profile_s = time.perf_counter() - t0
    table.write(args.out / "lut.json", overwrite=args.overwrite, checked=True)
    options = space.subspaces[0].layers
    plans = random_plans(options, args)
    t0 = time.perf_counter()
    rows = time_plans(plans, options, table, model, settings, args, start)
    plans_s = time.perf_counter() - t0
    dense_runs = list(
        {json.dumps(r["dense_same_rounds"], sort_keys=True): r["dense_same_rounds"] for r in rows}.values()
    )
    report = {}
    for kind in ("spread", "same-budget"):
        chosen = [r for r in rows if r["kind"] == kind]
        for measure in ("measured_relative", "measured"):
            if len(chosen) >= 3:
                report[f"{kind}, {measure}"] = {
                    p: errors([r["predicted"][p] for r in chosen], [r[measure][p] for r in chosen]) for p in PHASES
                }
    result = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "report": report,
        "profile_seconds": profile_s,
        "plans_seconds": plans_s,
        "dense_per_group": dense_runs,
        "table_fixed": dict(table.fixed),
        "settings": table.to_dict()["settings"],
        "machine": dict(table.machine),
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }
    publish_text(args.out / "latency_results.json", json.dumps(result, indent=2), args.overwrite, checked=True)
    print_report(report, dense_runs, table, len(plans), profile_s, plans_s)
    print(f"wrote {args.out / 'latency_results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
