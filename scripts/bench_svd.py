"""psi_W back-end cost: time and peak RSS on SmolLM2-135M and on one synthetic LLaMA-7B-shaped layer.

What is computed and what is compared, for the 7B-shaped layer (4 x 4096^2 attention + 3 x 4096 x 11008
FFN matrices, random bf16):

- ours (timed): ``layer_weight_tables``, i.e. psi_W for EVERY FFN prefix width k = 0..11008 (one Cholesky
  factorisation per FFN matrix gives all 11009 values) and for every KV-group count 0..32 (per-head SVDs
  of q/k/v, one Cholesky over o's column prefixes), from a cold cache, weights streamed one tensor at a time;
- reference (extrapolated, not run in full): one SVD per width, for the 3 FFN matrices only and only at
  the 22 widths of the default 256-channel grid (11008 down to 5632): ONE truncated SVD of the gate
  matrix (its first 8192 rows, the middle grid width) is timed and multiplied by 3 x 22. The reference does less
  work than ours (no attention, 22 widths instead of 11009), so the printed speed-up is a lower bound.

Peak RSS is the process maximum (ru_maxrss): it includes the synthetic weights this script builds in
memory and the float64 11008 x 11008 Gram matrix and its Cholesky factor (about 1 GB each), which the
prefix method needs.

Run: python scripts/bench_svd.py [--skip-7b]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import torch

from nsc_prune.cli.scripts import run_script
from nsc_prune.core.capacity import psi_weights
from nsc_prune.hf.score.psi_w import layer_weight_tables
from nsc_prune.spaces.elastic import ffn_grid


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_smollm2() -> None:
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

    model_dir = smollm2_checkpoint()
    config = json.loads((model_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        layer_weight_tables(model_dir, config, cache)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        layer_weight_tables(model_dir, config, cache)
        warm = time.perf_counter() - start
    size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 2**20
    print(
        f"SmolLM2-135M psi_W tables (30 layers, every FFN width and KV-group count): {cold:.1f} s cold, "
        f"{warm:.2f} s from cache; peak RSS {peak_rss_mb():.0f} MB for a {size:.0f} MB checkpoint"
    )


def bench_7b_layer() -> None:
    from safetensors.torch import save_file

    hidden, ffn = 4096, 11008
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": 1,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
    }
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (hidden, hidden),
        "self_attn.v_proj": (hidden, hidden),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (ffn, hidden),
        "mlp.up_proj": (ffn, hidden),
        "mlp.down_proj": (hidden, ffn),
    }
    with tempfile.TemporaryDirectory() as root:
        model_dir = Path(root) / "model"
        model_dir.mkdir()
        tensors = {
            f"model.layers.0.{name}.weight": (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            for name, shape in shapes.items()
        }
        save_file(tensors, model_dir / "model.safetensors")
        largest = max(t.numel() * 2 for t in tensors.values()) / 2**20
        gate = tensors["model.layers.0.mlp.gate_proj.weight"].double()
        del tensors
        rss_before = peak_rss_mb()
        start = time.perf_counter()
        layer_weight_tables(model_dir, config, Path(root) / "cache")
        ours = time.perf_counter() - start
        widths = ffn_grid(ffn, 256, 0.5)
        start = time.perf_counter()
        psi_weights(gate[: widths[len(widths) // 2]])  # one truncation of one of the three FFN matrices
        one_svd = time.perf_counter() - start
    reference = one_svd * 3 * len(widths)
    print(
        f"7B-shaped layer (4 x 4096^2 + 3 x 4096x11008, bf16): psi_W for all {ffn + 1} FFN prefix widths "
        f"(0..{ffn}) and all "
        f"{config['num_key_value_heads'] + 1} KV-group counts in {ours:.1f} s (Cholesky prefix trick, cold cache)"
    )
    print(
        f"  reference, extrapolated: one SVD per width for the 3 FFN matrices at only the {len(widths)} widths "
        f"of the 256-grid "
        f"= 3 x {len(widths)} x {one_svd:.1f} s (one timed SVD) = ~{reference:.0f} s "
        f"({reference / ours:.1f}x, a lower bound: "
        f"the reference covers fewer widths and no attention)"
    )
    print(
        f"  peak RSS {peak_rss_mb():.0f} MB (before: {rss_before:.0f} MB, incl. the synthetic weights; "
        f"largest tensor {largest:.0f} MB)"
    )
    print(f"  -> 32 such layers: ~{32 * ours / 60:.1f} min on this CPU, weights streamed one tensor at a time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-7b", action="store_true")
    args = parser.parse_args()
    bench_smollm2()
    if not args.skip_7b:
        bench_7b_layer()


if __name__ == "__main__":
    raise SystemExit(run_script(main))
