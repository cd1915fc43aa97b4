"""Benchmark: streaming extraction's peak memory and throughput on a synthetic multi-shard checkpoint.

Builds a random bf16 LLaMA-like checkpoint (default ~2.3 GB, GQA, 23 layers, written as 6 shards of at
most 430 MiB: ``--shards 5`` sets the shard size to a fifth of the total and whole tensors are never
split, so one more file is written) plus a rank-32 LoRA super-adapter, then extracts a mixed plan
(FFN 75 % / 50 %, LoRA rank 28, merged) in a fresh child process and prints its peak RSS against the
largest input shard (issue 4 asks for at most the largest shard + 1 GiB) and its MB/s. The reference
run, in a child process of the same script, is the naive extraction (safetensors load_file of every
shard, slice and merge in memory, save_file); the two outputs are compared tensor for tensor.

``--calib-tokens N`` also measures ``activation`` selection's calibration (random token ids, no
tokenizer) in its own child process: its peak RSS against one float32 decoder layer and the whole base
in float32 (what loading the model for calibration would take).

    python scripts/bench_extract.py                 # ~1-2 min on 2 cores, needs ~6 GB of free disk
    python scripts/bench_extract.py --size-gb 0.5 --no-reference
    python scripts/bench_extract.py --no-reference --calib-tokens 512
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
from nsc_prune.cli.parser import nonnegative_int, positive_int, positive_number
from nsc_prune.cli.scripts import run_script

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, RANK = 2048, 16, 4, 5632, 32000, 32


def build(root: Path, size_gb: float, shards: int) -> dict:
    """Write base/ (sharded safetensors + config), adapter/ (PEFT LoRA, rank ``RANK``) with random bf16 weights
    (``nsc_prune.hf.weights.synthetic``) and pareto.json with the mixed plan."""
    from nsc_prune.hf.weights.synthetic import (
        base_specs,
        layer_shapes,
        llama_config,
        write_random_base,
        write_random_lora,
    )

    def config_of(layers: int) -> dict:
        return llama_config(
            layers, HIDDEN, FFN, HEADS, VOCAB, kv_heads=KV_HEADS, rms_norm_eps=1e-5, max_position_embeddings=4096
        )

    per_layer = sum(r * c for r, c in layer_shapes(config_of(1)).values()) * 2
    layers = max(1, round((size_gb * 1e9 - 2 * VOCAB * HIDDEN * 2) / per_layer))
    config = config_of(layers)
    total = sum(spec.nbytes for spec in base_specs(config))
    write_random_base(root / "base", config, shard_bytes=-(-total // shards))
    write_random_lora(root / "adapter", config, RANK, 64)
    plan = [{"ffn": FFN * 3 // 4 if i % 2 else FFN // 2, "lora_rank": 28} for i in range(layers)]
    pareto = {
        "model": {"name": "synthetic", "config": config},
        "points": [{"params": 1, "macs": 1, "nsc": 1.0, "layers": plan}],
    }
    (root / "pareto.json").write_text(json.dumps(pareto))
    return {"layers": layers, "base_bytes": total, "layer_bytes": per_layer}


def child_stream(root: Path) -> dict:
    start = time.perf_counter()
    import transformers  # noqa: F401  (the extractor checks its output config with it)

    from nsc_prune.hf.extract import ExtractOptions, extract_subnet

    imported = time.perf_counter()
    extract_subnet(
        root / "pareto.json",
        root / "base",
        root / "stream",
        point=0,
        adapter=root / "adapter",
        options=ExtractOptions(max_shard_size=1 << 30),
    )
    return {"seconds": time.perf_counter() - imported, "import_seconds": imported - start}


def child_naive(root: Path) -> dict:
    """The obvious in-memory extraction: every shard loaded, sliced and merged, saved in one go."""
    import torch
    from safetensors.torch import load_file, save_file

    start = time.perf_counter()
    from nsc_prune.plan import ParetoDocument

    plan = ParetoDocument.read(root).points[0].layers
    weights = {}
    for shard in sorted((root / "base").glob("model-*.safetensors")):
        weights.update(load_file(shard))
    lora = load_file(root / "adapter" / "adapter_model.safetensors")
    out = {}
    for name, w in weights.items():
        parts = name.split(".")
        if parts[1] == "layers" and parts[-1] == "weight" and w.dim() == 2:
            layer, module = int(parts[2]), ".".join(parts[3:5])
            k, r = plan[layer]["ffn"], plan[layer]["lora_rank"]
            rows = k if module in ("mlp.gate_proj", "mlp.up_proj") else w.shape[0]
            cols = k if module == "mlp.down_proj" else w.shape[1]
            w = w[:rows, :cols].float()
            key = f"base_model.model.model.layers.{layer}.{module}"
            if f"{key}.lora_A.weight" in lora:
                a, b = lora[f"{key}.lora_A.weight"][:r, :cols], lora[f"{key}.lora_B.weight"][:rows, :r]
                w = w.addmm(b.float(), a.float(), alpha=64 / RANK)
            w = w.to(torch.bfloat16).contiguous()
        out[name] = w
    (root / "naive").mkdir()
    save_file(out, root / "naive" / "model.safetensors")
    return {"seconds": time.perf_counter() - start}


def child_calib(root: Path, tokens: int) -> dict:
    """Activation selection's calibration pass over ``tokens`` random token ids (streamed float32)."""
    start = time.perf_counter()
    import torch

    from nsc_prune.hf.cut.selection import activation_scores
    from nsc_prune.hf.weights.base import open_base

    base = open_base(root / "base")
    ids = torch.randint(3, VOCAB, (tokens,), generator=torch.Generator().manual_seed(0))
    imported = time.perf_counter()
    activation_scores(base, ids, seq_len=512)
    return {"seconds": time.perf_counter() - imported, "import_seconds": imported - start}


def child_baseline(_: Path) -> dict:
    import transformers

    import nsc_prune.hf.extract  # noqa: F401

    transformers.LlamaConfig  # noqa: B018  the extractor checks its output config with it: part of the floor

    return {"seconds": 0.0}


def run_child(mode: str, root: Path) -> dict:
    command = [sys.executable, __file__, "--child", mode, str(root)]
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{mode} run failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def compare(root: Path) -> bool:
    from safetensors import safe_open

    index = json.loads((root / "stream" / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(root / "naive" / "model.safetensors", "pt") as naive:
        for name, shard in index.items():
            with safe_open(root / "stream" / shard, "pt") as stream:
                if not stream.get_tensor(name).equal(naive.get_tensor(name)):
                    print(f"  mismatch: {name}")
                    return False
    return True


def disk_problem(where: Path, size_gb: float, no_reference: bool) -> str | None:
    """Why `where` cannot hold the base and each run's output, or None; it failed only once the disk was full."""
    need = size_gb * 1e9 * (2 if no_reference else 3) + 2**30  # the base, each run's output, and slack
    free = shutil.disk_usage(where).free
    if free >= need:
        return None
    return (
        f"{where} has {free / 1e9:.1f} GB free, but a {size_gb:g} GB base and its outputs need about "
        f"{need / 1e9:.1f} GB; pass a smaller --size-gb, --no-reference, or a --workdir on a larger disk"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=positive_number, default=2.3, help="synthetic base size in GB (default 2.3)")
    parser.add_argument(
        "--shards",
        type=positive_int,
        default=5,
        help="shard size = total / N; whole tensors never split, so N + 1 files are usual (default 5)",
    )
    parser.add_argument(
        "--calib-tokens",
        type=nonnegative_int,
        default=0,
        help="also measure activation calibration over N tokens (default 0: skip)",
    )
    parser.add_argument("--workdir", type=Path, help="where to build (default: a temp dir, removed afterwards)")
    parser.add_argument("--no-reference", action="store_true", help="skip the naive in-memory reference run")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workdir is not None and not args.workdir.is_dir():
        parser.error(f"--workdir {args.workdir} is not an existing folder")
    if args.child:
        mode, root = args.child
        if mode.startswith("calib:"):
            record = child_calib(Path(root), int(mode.split(":")[1]))
        else:
            record = {"stream": child_stream, "naive": child_naive, "baseline": child_baseline}[mode](Path(root))
        print(json.dumps({**record, "peak_rss_mb": peak_rss_mib()}))
        return

    problem = disk_problem(args.workdir or Path(tempfile.gettempdir()), args.size_gb, args.no_reference)
    if problem:
        parser.error(problem)
    root = Path(tempfile.mkdtemp(prefix="nsc-bench-", dir=args.workdir))
    try:
        start = time.perf_counter()
        info = build(root, args.size_gb, args.shards)
        shards = sorted((root / "base").glob("model-*.safetensors"))
        largest = max(p.stat().st_size for p in shards) / 2**20
        print(
            f"built {info['base_bytes'] / 1e9:.2f} GB base ({info['layers']} layers, {len(shards)} shards, "
            f"largest {largest:.0f} MiB) + LoRA r={RANK} in {time.perf_counter() - start:.1f}s"
        )
        baseline = run_child("baseline", root)
        stream = run_child("stream", root)
        out_bytes = sum(p.stat().st_size for p in (root / "stream").glob("*.safetensors"))
        in_bytes = info["base_bytes"] + (root / "adapter" / "adapter_model.safetensors").stat().st_size
        bound = largest + 1024
        print(
            f"streaming : peak RSS {stream['peak_rss_mb']:.0f} MiB (imports alone {baseline['peak_rss_mb']:.0f} MiB), "
            f"{stream['seconds']:.1f}s (+{stream['import_seconds']:.1f}s imports), "
            f"{in_bytes / 2**20 / stream['seconds']:.0f} MB/s read, "
            f"{out_bytes / 2**20 / stream['seconds']:.0f} MB/s written"
        )
        print(
            f"peak RSS / largest shard = {stream['peak_rss_mb'] / largest:.2f}; bound largest shard + 1 GiB = "
            f"{bound:.0f} MiB: {'PASS' if stream['peak_rss_mb'] <= bound else 'FAIL'}"
        )
        if args.calib_tokens:
            calib = run_child(f"calib:{args.calib_tokens}", root)
            fp32 = 4 / 2 * info["base_bytes"] / 2**20
            layer = 4 / 2 * info["layer_bytes"] / 2**20
            print(
                f"activation calibration ({args.calib_tokens} tokens, streamed float32): "
                f"peak RSS {calib['peak_rss_mb']:.0f} MiB "
                f"(imports alone {baseline['peak_rss_mb']:.0f} MiB; one float32 layer {layer:.0f} MiB; "
                f"the whole base in float32 "
                f"{fp32:.0f} MiB), {calib['seconds']:.1f}s"
            )
        if not args.no_reference:
            naive = run_child("naive", root)
            print(
                f"reference : naive load_file/save_file peak RSS {naive['peak_rss_mb']:.0f} MiB, "
                f"{naive['seconds']:.1f}s; "
                f"streaming uses {stream['peak_rss_mb'] / naive['peak_rss_mb']:.2f}x the memory and "
                f"{stream['seconds'] / naive['seconds']:.2f}x the time; outputs identical: {compare(root)}"
            )
        print(f"total {time.perf_counter() - start:.1f}s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(run_script(main))
