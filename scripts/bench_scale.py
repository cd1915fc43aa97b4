"""Benchmark: the whole pipeline at LLaMA-7B scale on a small machine (2 CPU cores, 24 GiB).

Writes a random-weight LLaMA-7B-shaped base as bf16 safetensors shards (streamed one tensor at a time, never the
whole model in memory: ~13.5 GB on disk for the full shape) and a LoNAS-shaped LoRA super-adapter (rank 32,
alpha 64, on q/k/v/gate/up/down), then runs, each step in its own child process:

    search (LoNAS space, --adapter)  ->  extract (default format)  ->  load_pruned + one forward pass
                                     ->  extract --format nemotron-nas  ->  load_pruned + one forward pass

and prints each step's wall time and peak RSS (VmHWM of the child). Extraction's target is the largest input shard
+ 1 GiB. Outputs are deleted after their forward pass, and everything at the end unless --keep.

    python scripts/bench_scale.py                        # the full 7B shape: ~13.5 GB base + ~10 GB per output
    python scripts/bench_scale.py --layers 4             # the same widths, 4 layers (~2 GB)
    python scripts/bench_scale.py --layers 2 --hidden 1024 --ffn 2752 --heads 8
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nsc_prune._memory import peak_rss_mib
from nsc_prune.cli.parser import positive_int, positive_number
from nsc_prune.cli.scripts import run_script
from nsc_prune.core.budget import parse_budget
from nsc_prune.errors import NSCError

LORA_RANK, LORA_ALPHA = 32, 64  # LoNAS's LLaMA-7B super-adapter
GIB = 2**30


def child_build(root: Path, config: dict, shard_bytes: int) -> dict:
    """base/ and adapter/ (rank ``LORA_RANK`` on q/k/v/gate/up/down): random bf16 tensors, each made and written
    alone (``nsc_prune.hf.weights.synthetic``)."""
    from nsc_prune.hf.weights.synthetic import write_random_base, write_random_lora

    specs = write_random_base(root / "base", config, shard_bytes)
    lora = write_random_lora(root / "adapter", config, LORA_RANK, LORA_ALPHA)
    return {"base_bytes": sum(s.nbytes for s in specs), "adapter_bytes": sum(s.nbytes for s in lora)}


def child_cli(argv: list[str]) -> dict:
    from nsc_prune.cli import main

    code = main(argv)
    if code:
        raise SystemExit(f"nsc-prune {' '.join(argv)} exited with {code}")
    return {}


def child_forward(out: Path) -> dict:
    import torch
    import transformers.models.llama.modeling_llama  # noqa: F401  imported before the clock: load_s is the load

    from nsc_prune import load_pruned

    start = time.perf_counter()
    model = load_pruned(out)
    loaded = time.perf_counter()
    with torch.no_grad():
        ids = torch.tensor([[1, 306, 4658, 278, 6790, 310, 29871, 13]]) % model.config.vocab_size
        logits = model(ids, use_cache=False).logits
    if not torch.isfinite(logits.float()).all():
        raise SystemExit(f"{out}: non-finite logits")
    return {
        "load_s": loaded - start,
        "forward_s": time.perf_counter() - loaded,
        "class": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
    }


def run_child(step: str, *args: str) -> dict:
    start = time.perf_counter()
    command = [sys.executable, __file__, "--child", step, *args]
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode:
        sys.exit(f"step {step} failed:\n{result.stderr[-3000:]}")
    record = json.loads(result.stdout.strip().splitlines()[-1])
    return {"step": step, "wall_s": wall, **record, "stdout": result.stdout.strip().splitlines()[:-1]}


def _dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=positive_int, default=32, help="decoder layers (default 32, LLaMA-7B)")
    parser.add_argument("--hidden", type=positive_int, default=4096, help="hidden size (default 4096)")
    parser.add_argument("--ffn", type=positive_int, default=11008, help="FFN width (default 11008)")
    parser.add_argument("--heads", type=positive_int, default=32, help="attention heads (default 32, MHA)")
    parser.add_argument("--vocab", type=positive_int, default=32000)
    parser.add_argument("--shard-gb", type=positive_number, default=2.0, help="base shard size in GB (default 2)")
    parser.add_argument("--budget", default="85%", help="search budget (default 85%%)")
    parser.add_argument("--root", help="work folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the files (default: delete them at the end)")
    args = parser.parse_args()
    try:  # before the base is built (13.5 GB at the default shape); its full count is known only then
        parse_budget(args.budget, full=10**12)  # its form only: any full count (a percentage of 1 rounds down to 0)
    except NSCError as err:
        parser.error(str(err))
    root = Path(args.root) if args.root else None
    if root is not None and root.exists() and (not root.is_dir() or any(root.iterdir())):
        parser.error(f"--root {root} must be a new or empty folder: the run fills it, and removes it unless --keep")
    return args


def child_main(step: str, rest: list[str]) -> None:
    """A step run by run_child; its arguments are nsc-prune's own flags. Prints its record as JSON."""
    record = {
        "build": lambda: child_build(Path(rest[0]), json.loads(rest[1]), int(rest[2])),
        "cli": lambda: child_cli(rest),
        "forward": lambda: child_forward(Path(rest[0])),
    }[step]()
    print(json.dumps({**record, "peak_rss_mib": peak_rss_mib()}))


def pipeline(root: Path, args: argparse.Namespace, target: float) -> None:
    """search -> extract (each format) -> load_pruned + forward, a row each."""
    search = ["--model", str(root / "base"), "--adapter", str(root / "adapter"), "--budget", args.budget,
              "--out", str(root / "search"), "--no-plot"]  # fmt: skip
    _row({**run_child("cli", *search), "step": "search (lonas)"})
    for fmt in ("pruned", "nemotron-nas"):
        out = root / fmt
        extract = ["extract", "--pareto", str(root / "search"), "--base", str(root / "base"),
                   "--adapter", str(root / "adapter"), "--out", str(out), "--format", fmt]  # fmt: skip
        record = run_child("cli", *extract)
        _row({**record, "step": f"extract --format {fmt}", "out_gb": _dir_bytes(out) / 1e9, "target_mib": target})
        _row({**run_child("forward", str(out)), "step": f"load_pruned + forward ({fmt})"})
        shutil.rmtree(out)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2], sys.argv[3:])
        return
    args = parse_args()
    from nsc_prune.hf.weights.synthetic import base_specs, llama_config

    config = llama_config(args.layers, args.hidden, args.ffn, args.heads, args.vocab)
    base_bytes = sum(s.nbytes for s in base_specs(config))
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="nsc-bench-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    need = int(base_bytes * 1.9) + GIB  # base + one output (<= the base) at a time + adapter and slack
    free = shutil.disk_usage(root).free
    if free < need:
        sys.exit(
            f"bench_scale: {root} has {free / 1e9:.1f} GB free but needs about {need / 1e9:.1f} GB (base "
            f"{base_bytes / 1e9:.1f} GB + one output); free some space, pass --root on a larger disk, or use --layers N"
        )
    print(
        f"shape: {args.layers} layers, hidden {args.hidden}, ffn {args.ffn}, {args.heads} heads; "
        f"base {base_bytes / 1e9:.2f} GB bf16 in {root}",
        flush=True,
    )
    try:
        build = {**run_child("build", str(root), json.dumps(config), str(int(args.shard_gb * 1e9))), "step": "build"}
        largest = max(p.stat().st_size for p in (root / "base").glob("*.safetensors"))
        target = (largest + GIB) / 2**20
        print(
            f"largest base shard {largest / 2**20:.0f} MiB; "
            f"extraction target (largest shard + 1 GiB) {target:.0f} MiB\n"
        )
        print("| step | wall s | peak RSS MiB | notes |\n|---|---|---|---|")
        _row(build)
        pipeline(root, args, target)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def _row(s: dict) -> None:
    """One step's line of the results table, printed as soon as the step is done."""
    notes = []
    if "target_mib" in s:
        ok = "within" if s["peak_rss_mib"] <= s["target_mib"] else "OVER"
        notes.append(f"{ok} target; output {s['out_gb']:.2f} GB")
    if "load_s" in s:
        notes.append(
            f"{s['class']}, {s['params'] / 1e9:.2f} B params, load {s['load_s']:.1f} s, forward {s['forward_s']:.2f} s"
        )
    if "base_bytes" in s:
        notes.append(f"base {s['base_bytes'] / 1e9:.2f} GB, adapter {s['adapter_bytes'] / 1e6:.0f} MB")
    notes += [line for line in s.get("stdout", []) if line.startswith(("wrote", "nemotron-nas padding"))][:2]
    print(f"| {s['step']} | {s['wall_s']:.1f} | {s['peak_rss_mib']:.0f} | {'; '.join(notes)} |", flush=True)


if __name__ == "__main__":
    raise SystemExit(run_script(main))
