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
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's nsc_prune, installed or not

LORA_RANK, LORA_ALPHA = 32, 64  # LoNAS's LLaMA-7B super-adapter
LORA_MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
GIB = 2**30


def _peak_rss_mib() -> float:
    """Peak RSS of this process image (VmHWM; ru_maxrss would carry the parent's over fork + exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no /proc/self/status: this benchmark needs Linux")


def model_config(layers: int, hidden: int, ffn: int, heads: int, vocab: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "rope_theta": 10000.0,
    }


def base_specs(config: dict) -> list:
    from nsc_prune.core.spec import projection_shapes
    from nsc_prune.hf.weights.safetensors_io import TensorSpec

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    shapes = projection_shapes(hidden, hidden // heads, heads, heads, config["intermediate_size"])
    specs = [TensorSpec("model.embed_tokens.weight", "BF16", (config["vocab_size"], hidden))]
    for i in range(config["num_hidden_layers"]):
        specs += [TensorSpec(f"model.layers.{i}.{m}.weight", "BF16", s) for m, s in shapes.items()]
        specs += [
            TensorSpec(f"model.layers.{i}.{n}.weight", "BF16", (hidden,))
            for n in ("input_layernorm", "post_attention_layernorm")
        ]
    return [
        *specs,
        TensorSpec("model.norm.weight", "BF16", (hidden,)),
        TensorSpec("lm_head.weight", "BF16", (config["vocab_size"], hidden)),
    ]


def child_build(root: Path, config: dict, shard_bytes: int) -> dict:
    """base/ and adapter/: random bf16 tensors, each made and written alone (a pool sliced at moving offsets)."""
    import torch

    from nsc_prune.hf.weights.safetensors_io import TensorSpec, write_safetensors, write_sharded

    specs = base_specs(config)
    largest = max(math.prod(s.shape) for s in specs)
    pool = (torch.randn(largest + 4099, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)
    offsets = iter(range(0, 1 << 62, 4099))

    def random(shape: tuple[int, ...]) -> torch.Tensor:
        numel = math.prod(shape)
        start = next(offsets) % (pool.numel() - numel + 1)
        tensor = pool[start : start + numel].reshape(shape).clone()
        return tensor.fill_(1.0) if len(shape) == 1 else tensor  # RMSNorm weights at 1, as trained models roughly are

    (root / "base").mkdir(parents=True)
    write_sharded(root / "base", specs, (random(s.shape) for s in specs), max_shard_bytes=shard_bytes)
    (root / "base" / "config.json").write_text(json.dumps(config, indent=2))
    shapes = {s.name: s.shape for s in specs}
    lora = []
    for i in range(config["num_hidden_layers"]):
        for m in LORA_MODULES:
            out_f, in_f = shapes[f"model.layers.{i}.{m}.weight"]
            prefix = f"base_model.model.model.layers.{i}.{m}"
            lora += [
                TensorSpec(f"{prefix}.lora_A.weight", "BF16", (LORA_RANK, in_f)),
                TensorSpec(f"{prefix}.lora_B.weight", "BF16", (out_f, LORA_RANK)),
            ]
    (root / "adapter").mkdir()
    write_safetensors(root / "adapter" / "adapter_model.safetensors", lora, (random(s.shape) for s in lora))
    adapter_config = {
        "peft_type": "LORA",
        "r": LORA_RANK,
        "lora_alpha": LORA_ALPHA,
        "bias": "none",
        "task_type": "CAUSAL_LM",
        "target_modules": sorted({m.split(".")[-1] for m in LORA_MODULES}),
    }
    (root / "adapter" / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return {"base_bytes": sum(s.nbytes for s in specs), "adapter_bytes": sum(s.nbytes for s in lora)}


def child_cli(argv: list[str]) -> dict:
    from nsc_prune.cli import main

    code = main(argv)
    if code:
        raise SystemExit(f"nsc-prune {' '.join(argv)} exited with {code}")
    return {}


def child_forward(out: Path) -> dict:
    import torch

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (default 32, LLaMA-7B)")
    parser.add_argument("--hidden", type=int, default=4096, help="hidden size (default 4096)")
    parser.add_argument("--ffn", type=int, default=11008, help="FFN width (default 11008)")
    parser.add_argument("--heads", type=int, default=32, help="attention heads (default 32, MHA)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard-gb", type=float, default=2.0, help="base shard size in GB (default 2)")
    parser.add_argument("--budget", default="85%", help="search budget (default 85%%)")
    parser.add_argument("--root", help="work folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the files (default: delete them at the end)")
    if sys.argv[1:2] == ["--child"]:  # a step run by run_child; its arguments are nsc-prune's own flags
        step, *rest = sys.argv[2:]
        record = {
            "build": lambda: child_build(Path(rest[0]), json.loads(rest[1]), int(rest[2])),
            "cli": lambda: child_cli(rest),
            "forward": lambda: child_forward(Path(rest[0])),
        }[step]()
        print(json.dumps({**record, "peak_rss_mib": _peak_rss_mib()}))
        return
    args = parser.parse_args()

    config = model_config(args.layers, args.hidden, args.ffn, args.heads, args.vocab)
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
        search = [
            "--model",
            str(root / "base"),
            "--adapter",
            str(root / "adapter"),
            "--budget",
            args.budget,
            "--out",
            str(root / "search"),
            "--no-plot",
        ]
        _row({**run_child("cli", *search), "step": "search (lonas)"})
        for fmt in ("pruned", "nemotron-nas"):
            out = root / fmt
            extract = [
                "extract",
                "--pareto",
                str(root / "search"),
                "--base",
                str(root / "base"),
                "--adapter",
                str(root / "adapter"),
                "--out",
                str(out),
                "--format",
                fmt,
            ]
            record = run_child("cli", *extract)
            _row({**record, "step": f"extract --format {fmt}", "out_gb": _dir_bytes(out) / 1e9, "target_mib": target})
            _row({**run_child("forward", str(out)), "step": f"load_pruned + forward ({fmt})"})
            shutil.rmtree(out)
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
    main()
