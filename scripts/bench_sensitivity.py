"""Benchmark: the measured sensitivity table (``--score measured``) at LLaMA-7B shape, against one ``activation``
calibration pass over the same tokens, each in its own child process (wall time and peak RSS, VmHWM).

Builds a random bf16 base with the 7B widths (hidden 4096, FFN 11008, 32 heads, vocab 32000) and ``--layers``
decoder layers (``nsc_prune.hf.weights.synthetic.write_random_base``), then measures the ``ffn-grid`` table (step 256, down to half width:
22 options a layer) on ``--tokens`` random token ids. Per layer the table costs the calibration pass's forward, the
options (prefix sums) and the loss probes, which are carried through every later layer: at L layers the probes
cost ``L (L - 1) / 2`` probe-chunk forwards, so the script also times one probe step and extrapolates to 32 layers.

    python scripts/bench_sensitivity.py                    # 2 layers at 7B width (~1.3 GB base), 4096 tokens
    python scripts/bench_sensitivity.py --layers 4 --tokens 2048
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

SEQ_LEN, PROBE_TOKENS = 512, 512


def _ids(tokens: int, vocab: int):
    import torch

    return torch.randint(3, vocab, (tokens,), generator=torch.Generator().manual_seed(0))


def child(kind: str, root: str, tokens: str) -> dict:
    import torch

    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.plan import elastic_layer_plans
    from nsc_prune.spaces.registry import build_space

    base = open_base(Path(root) / "base")
    ids = _ids(int(tokens), base.config["vocab_size"])
    start = time.perf_counter()
    extra = {}
    if kind == "activation":
        from nsc_prune.hf.cut.selection import activation_scores

        activation_scores(base, ids, SEQ_LEN)
    elif kind == "table":
        from nsc_prune.hf.score.sensitivity import measure_errors

        cuts = elastic_layer_plans(build_space("ffn-grid", base.config), "bench")
        measure_errors(base, ids, SEQ_LEN, cuts, None, PROBE_TOKENS, progress=False)
        extra["options_per_layer"] = len(cuts[0])
    else:  # one probe step: a probe chunk through one float32 7B-shaped layer
        from nsc_prune.hf.weights.streaming import StreamedDecoder

        with StreamedDecoder(base) as model, torch.no_grad(), model.layer(0):
            hidden = model.embed(ids[:PROBE_TOKENS], SEQ_LEN)
            model.run(hidden[0])
            start = time.perf_counter()
            for _ in range(3):
                model.run(hidden[0])
            return {"seconds": (time.perf_counter() - start) / 3, "peak_rss_mib": peak_rss_mib()}
    return {"seconds": time.perf_counter() - start, "peak_rss_mib": peak_rss_mib(), **extra}


def run_child(kind: str, root: Path, tokens: int) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(root), str(tokens)], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    root = Path(tempfile.mkdtemp(prefix="bench-sensitivity-"))
    try:
        from nsc_prune.hf.weights.synthetic import llama_config, write_random_base

        write_random_base(root / "base", llama_config(args.layers, 4096, 11008, 32, 32000), shard_bytes=2 << 30)
        layer_bytes = (4 * 4096 * 4096 + 3 * 4096 * 11008) * 4  # one float32 decoder layer
        act = run_child("activation", root, args.tokens)
        table = run_child("table", root, args.tokens)
        probe = run_child("probe", root, args.tokens)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    layers = args.layers
    per_layer_act = act["seconds"] / layers
    probe_steps = layers * (layers - 1) // 2
    per_layer_table = (table["seconds"] - probe_steps * probe["seconds"]) / layers
    at_32 = {"activation_s": 32 * per_layer_act, "table_s": 32 * per_layer_table + 32 * 31 // 2 * probe["seconds"]}
    print(f"{layers} layers at LLaMA-7B width, {args.tokens} tokens, {table['options_per_layer']} options a layer")
    print(f"activation pass: {act['seconds']:.1f} s, peak RSS {act['peak_rss_mib']:.0f} MiB")
    print(f"table:           {table['seconds']:.1f} s ({table['seconds'] / act['seconds']:.2f}x), "
          f"peak RSS {table['peak_rss_mib']:.0f} MiB")  # fmt: skip
    print(f"one probe step (512 tokens through one layer): {probe['seconds']:.2f} s")
    print(f"one float32 layer: {layer_bytes / 2**20:.0f} MiB; hidden states: {args.tokens * 4096 * 4 / 2**20:.0f} MiB "
          f"per copy; table peak - (layer + 1 GiB) = {table['peak_rss_mib'] - layer_bytes / 2**20 - 1024:.0f} MiB")  # fmt: skip
    print(f"extrapolated to 32 layers: activation {at_32['activation_s'] / 60:.1f} min, table "
          f"{at_32['table_s'] / 60:.1f} min ({at_32['table_s'] / at_32['activation_s']:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
