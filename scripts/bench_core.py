"""Core speed: psi_mp vs scipy quadrature, NSC-DP front times, and the whole search command.

Prints ratios against reference runs made in the same process (no timed unit tests).
Run: python scripts/bench_core.py [--benchmarks DIR]   (DIR holds autoformer_tiny_1001.json;
default $NSC_PRUNE_BENCHMARKS, else ../shared/benchmarks)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nsc_prune.cli.scripts import run_script
from nsc_prune.core import solver
from nsc_prune.core.capacity import init_std, psi_mp, psi_mp_quad
from nsc_prune.core.front import search
from nsc_prune.errors import InvalidInputError
from nsc_prune.presets import resolve_model
from nsc_prune.ranking.benchmarks import check_benchmarks_option
from nsc_prune.spaces.nas import TxlSpaceConfig, txl_layer_params
from nsc_prune.spaces.registry import build_space


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_psi() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    m, k = rng.integers(1, 16384, n), rng.integers(1, 16384, n)
    s = init_std(m, k, "xavier")
    vec = best_of(lambda: psi_mp(m, k, s), 3) / n
    shapes = list(zip(m[:200].tolist(), k[:200].tolist(), s[:200].tolist()))
    quad = best_of(lambda: [psi_mp_quad(*shape) for shape in shapes], 1) / len(shapes)
    print(
        f"psi_mp vectorised: {1 / vec:,.0f} evaluations/s; scipy.integrate.quad: {1 / quad:,.0f}/s; "
        f"speed-up per evaluation {quad / vec:,.0f}x (target >= 5000x)"
    )
    calls = 20_000
    scalar = best_of(lambda: [psi_mp(768, 3072, 0.02) for _ in range(calls)], 3) / calls
    one = (np.array([768]), np.array([3072]), np.array([0.02]))
    single = best_of(lambda: [psi_mp(*one) for _ in range(calls)], 3) / calls
    print(
        f"psi_mp scalar (Python int/float fast path): {1 / scalar:,.0f} calls/s; "
        f"{single / scalar:.0f}x faster than the vectorised path on a 1-element array"
    )


def txl_tables() -> list:
    """18 layers x 21 FFN options x 28 (d_model, n_layer) groups with the TXL cost formula."""
    space = TxlSpaceConfig()  # the paper's d_model, n_layer and d_ff grids
    d_ff = np.array(space.d_ff)
    groups = []
    for d in space.d_model:
        values = (2 * psi_mp(d_ff, d, 0.02)).tolist()
        costs = txl_layer_params(d, d_ff).tolist()
        for n_layer in space.n_layer:
            groups.append(([values] * n_layer, [costs] * n_layer))
    return groups


def bench_solver() -> None:
    llama = build_space("lonas", resolve_model("llama-7b").config)
    for cost in ("params", "macs"):
        seconds = best_of(lambda cost=cost: search(llama, cost=cost))
        result = search(llama, cost=cost)
        target = "target <= 50 ms; paper 460 ms" if cost == "params" else "no target: every MACs level is a point"
        print(
            f"LoNAS LLaMA-7B, 32 layers x 10 options, {cost}: whole front ({len(result.points)} points) in "
            f"{1000 * seconds:.1f} ms ({target})"
        )
    groups = txl_tables()
    seconds = best_of(lambda: solver.solve(groups))
    front = solver.solve(groups)
    print(
        f"TXL-shaped, <=18 layers x 21 options x 28 groups: whole front ({len(front)} points) in "
        f"{1000 * seconds:.1f} ms (target <= 200 ms; paper 2.0 s)"
    )
    for name, target in (("ffn-grid", "target < 1 s"), ("ffn-heads", "no target"), ("ffn-heads-depth", "no target")):
        llama70 = build_space(name, resolve_model("llama-3-70b").config)
        seconds = best_of(lambda space=llama70: search(space), 3 if name == "ffn-grid" else 1)
        result = search(llama70)
        print(
            f"llama-3-70b {name}, 80 layers x {len(llama70.subspaces[0].layers[0])} options: whole front "
            f"({len(result.points)} points) in {1000 * seconds:.0f} ms ({target})"
        )


def bench_cli() -> None:
    """The README's command as typed (pareto.json into ./out, no plot), then with --out (adds pareto.png)."""
    reference = [sys.executable, "-c", "import numpy, yaml"]
    command = [sys.executable, "-m", "nsc_prune", "--model", "llama-7b", "--budget", "5.7B"]
    with tempfile.TemporaryDirectory() as cwd:
        ref = statistics.median(_wall(reference, cwd) for _ in range(3))
        run = statistics.median(_wall(command, cwd) for _ in range(5))
        plot = statistics.median(_wall([*command, "--out", "with-plot", "--overwrite"], cwd) for _ in range(3))
    print(
        f"`nsc-prune --model llama-7b --budget 5.7B` start to exit: {run:.2f} s (target < 1.5 s; "
        f"{run / ref:.1f}x a bare `python -c 'import numpy, yaml'` at {ref:.2f} s); "
        f"with --out (pareto.png, matplotlib): {plot:.2f} s"
    )


def _wall(command: list[str], cwd: str | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, cwd=cwd)
    return time.perf_counter() - start


def bench_families(benchmarks: str | None) -> None:
    """scripts/bench_families.py's figures, run as its own process (a script imports only the package)."""
    sys.stdout.flush()
    command = [sys.executable, str(Path(__file__).with_name("bench_families.py"))]
    subprocess.run(command + ([] if benchmarks is None else ["--benchmarks", benchmarks]), check=True)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument(
        "--benchmarks", metavar="DIR", help="passed on to scripts/bench_families.py (see its --help for the default)"
    )
    args = cli.parse_args()
    try:
        check_benchmarks_option(args.benchmarks)  # before the minutes of the other figures
    except InvalidInputError as err:
        cli.error(str(err))
    bench_psi()
    bench_solver()
    bench_families(args.benchmarks)
    bench_cli()


if __name__ == "__main__":
    raise SystemExit(run_script(main))
