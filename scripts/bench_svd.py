"""psi_W back-end cost: time and peak RSS on SmolLM2-135M and on one synthetic LLaMA-7B-shaped
layer, with the reference "one SVD per FFN width" run in the same process for the ratio.

Run: python scripts/bench_svd.py [--skip-7b]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from nsc_prune.capacity import psi_weights
from nsc_prune.elastic import ffn_grid
from nsc_prune.weight_score import layer_weight_tables


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_smollm2() -> None:
    from nsc_prune.gguf import smollm2_checkpoint

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
    print(f"SmolLM2-135M psi_W tables (30 layers, every FFN width and KV-group count): {cold:.1f} s cold, "
          f"{warm:.2f} s from cache; peak RSS {peak_rss_mb():.0f} MB for a {size:.0f} MB checkpoint")


def bench_7b_layer() -> None:
    from safetensors.torch import save_file

    hidden, ffn = 4096, 11008
    config = {"model_type": "llama", "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": 1,
              "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000}
    gen = torch.Generator().manual_seed(0)
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, hidden), "self_attn.v_proj": (hidden, hidden),
              "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (ffn, hidden), "mlp.up_proj": (ffn, hidden),
              "mlp.down_proj": (hidden, ffn)}
    with tempfile.TemporaryDirectory() as root:
        model_dir = Path(root) / "model"
        model_dir.mkdir()
        tensors = {f"model.layers.0.{name}.weight": (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16) for name, shape in shapes.items()}
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
    print(f"7B-shaped layer (4 x 4096^2 + 3 x 4096x11008, bf16): psi_W for every one of {ffn} FFN widths and 32 head counts "
          f"in {ours:.1f} s; one SVD per width on the {len(widths)}-width 256-grid would take ~{reference:.0f} s "
          f"({reference / ours:.1f}x); peak RSS {peak_rss_mb():.0f} MB (before: {rss_before:.0f} MB; largest tensor {largest:.0f} MB)")
    print(f"  -> 32 such layers: ~{32 * ours / 60:.1f} min on this CPU, weights streamed one tensor at a time")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-7b", action="store_true")
    args = parser.parse_args()
    bench_smollm2()
    if not args.skip_7b:
        bench_7b_layer()
    sys.exit(0)
