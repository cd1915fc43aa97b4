"""Benchmark: the measured sensitivity table (``--score measured``) at SmolLM2-135M, LLaMA-7B or Llama-3-70B width,
against one ``activation`` calibration pass over the same tokens, each in its own child process (wall time, peak RSS).

Builds a random bf16 base with the shape's widths and ``--layers`` decoder layers
(``nsc_prune.hf.weights.synthetic.write_random_base``) and measures the ``ffn-grid`` table (SmolLM2: step 64 down to
25 %, as its studies; 7B: 22 options a layer) on ``--tokens`` random token ids. Per layer the table costs the
calibration pass's forward, the options (prefix sums) and the loss probes, carried through every later layer and
the LM head. The script also times one probe step (512 tokens through one float32 layer) and one LM-head
evaluation (512 tokens), splits the table's time into per-layer work, probe steps and heads, and models the
table at the shape's real depth (30, 32 or 80 layers) for each ``--probe-depth`` (0: no cap), with the probes'
share. At the real depth (SmolLM2 ``--layers 30``) the table is also measured once per probe depth.

    python scripts/bench_sensitivity.py --shape smollm2 --layers 30   # SmolLM2-135M's shape, every layer
    python scripts/bench_sensitivity.py                               # 2 layers at 7B width (~1.3 GB base)
    python scripts/bench_sensitivity.py --shape 70b --layers 2        # 2 layers at 70B width (~8 GB base, ~15 min)
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
from nsc_prune.cli.parser import nonnegative_int, positive_int
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import InvalidInputError
from nsc_prune.hf.score.probes import PROBE_DEPTH, PROBE_STRIDE, probe_token_count

SEQ_LEN, PROBE_TOKENS = 512, 512
SHAPES = {  # hidden, FFN, heads, KV heads, vocab, real depth
    "smollm2": (576, 1536, 9, 3, 49152, 30),
    "7b": (4096, 11008, 32, 32, 32000, 32),
    "70b": (8192, 28672, 64, 8, 128256, 80),
}


def _ids(tokens: int, vocab: int):
    import torch

    return torch.randint(3, vocab, (tokens,), generator=torch.Generator().manual_seed(0))


def child(kind: str, root: str, tokens: str, probe_depth: str, probe_widths: str, probe_stride: str) -> dict:
    import torch

    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.plan import elastic_layer_plans
    from nsc_prune.spaces.registry import build_space

    base = open_base(Path(root) / "base")
    small = base.config["hidden_size"] < 1024  # SmolLM2: the grid of the SmolLM2 studies
    ids = _ids(int(tokens), base.config["vocab_size"])
    start = time.perf_counter()
    extra = {}
    if kind == "activation":
        from nsc_prune.hf.cut.selection import activation_scores

        activation_scores(base, ids, SEQ_LEN)
    elif kind == "table":
        from nsc_prune.hf.score.probes import ProbeConfig, measure_errors
        from nsc_prune.hf.score.sensitivity import SensitivityConfig

        target = SensitivityConfig.__dataclass_fields__["target"].default  # the default measure
        probes = ProbeConfig(PROBE_TOKENS, target, int(probe_depth), int(probe_widths), int(probe_stride))

        space = build_space("ffn-grid", base.config, **({"ffn_step": 64, "ffn_min_fraction": 0.25} if small else {}))
        cuts = elastic_layer_plans(space, "bench")
        _, record = measure_errors(base, ids, SEQ_LEN, cuts, None, probes, progress=False)
        extra = {"options_per_layer": len(cuts[0]), "probe_tokens_per_layer": record["probe_tokens_per_layer"]}
    else:  # one probe step through one float32 layer, and one LM-head evaluation, each on 512 tokens
        from nsc_prune.hf.score.probes import _logits
        from nsc_prune.hf.weights.streaming import StreamedDecoder

        with StreamedDecoder(base) as model, torch.no_grad():
            with model.layer(0):
                hidden = model.embed(ids[:PROBE_TOKENS], SEQ_LEN)
                model.run(hidden[0])
                start = time.perf_counter()
                for _ in range(3):
                    model.run(hidden[0])
                step = (time.perf_counter() - start) / 3
            norm, head = model.head()
            torch.log_softmax(_logits(norm, head, hidden[0], None), dim=-1)  # warm-up: the first call cost twice
            start = time.perf_counter()
            for _ in range(2):
                torch.log_softmax(_logits(norm, head, hidden[0], None), dim=-1)
            return {"seconds": step, "head_seconds": (time.perf_counter() - start) / 2, "peak_rss_mib": peak_rss_mib()}
    return {"seconds": time.perf_counter() - start, "peak_rss_mib": peak_rss_mib(), **extra}


def run_child(kind: str, root: Path, tokens: int, probe_depth: int, probe_widths: int = 2, probe_stride: int = 1,
              repeat: int = 1) -> dict:  # fmt: skip
    """The fastest of ``repeat`` runs, each in a fresh process (the least disturbed by other work on the machine)."""
    runs = []
    for _ in range(repeat):
        argv = [str(root), str(tokens), str(probe_depth), str(probe_widths), str(probe_stride)]
        done = subprocess.run([sys.executable, __file__, "--child", kind, *argv], capture_output=True, text=True)
        if done.returncode != 0:  # the child's own last line says why (its traceback is in stderr)
            reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise InvalidInputError(f"the {kind} step failed: {reason}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return min(runs, key=lambda run: run["seconds"])


def probe_work(layers: int, probe_depth: int, anchors: int = 1, stride: int = 1) -> tuple[float, float]:
    """(probe steps, LM-head evaluations) of a table at ``layers`` layers with ``anchors`` probed cuts a layer, in
    units of one 512-token step: each probe is carried through every later layer and then the head, on every
    ``stride``-th position; the clean stream adds one head evaluation."""
    counts = [probe_token_count(PROBE_TOKENS, probe_depth, layers - 1 - i) for i in range(layers)]
    steps = sum(count * (layers - 1 - i) for i, count in enumerate(counts)) / PROBE_TOKENS
    return anchors * steps, (1 + anchors * sum(counts) / PROBE_TOKENS) / stride


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    parser.add_argument("--layers", type=positive_int, default=2, help="decoder layers built and measured (default 2)")
    parser.add_argument("--tokens", type=positive_int, default=4096)
    parser.add_argument(
        "--probe-depth",
        type=nonnegative_int,
        nargs="+",
        default=[PROBE_DEPTH, 0],
        help=f"(default {PROBE_DEPTH} 0; 0: no cap)",
    )
    parser.add_argument("--probe-widths", type=int, choices=(1, 2), default=2, help="FFN widths probed a layer (2)")
    parser.add_argument(
        "--probe-stride",
        type=positive_int,
        default=PROBE_STRIDE,
        help=f"a probe scores every k-th position ({PROBE_STRIDE})",
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=1, help="fresh-process runs of each step; the fastest counts"
    )
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    hidden, ffn, heads, kv_heads, vocab, depth = SHAPES[args.shape]
    root = Path(tempfile.mkdtemp(prefix="bench-sensitivity-"))
    try:
        from nsc_prune.hf.weights.synthetic import llama_config, write_random_base

        config = llama_config(args.layers, hidden, ffn, heads, vocab, kv_heads=kv_heads)
        write_random_base(root / "base", config, shard_bytes=2 << 30)
        kv = hidden // heads * kv_heads
        layer_bytes = (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn) * 4  # one float32 decoder layer
        act = run_child("activation", root, args.tokens, 0, repeat=args.repeat)
        measured = args.layers == depth
        depths = args.probe_depth if measured else args.probe_depth[:1]
        tables = {
            d: run_child("table", root, args.tokens, d, args.probe_widths, args.probe_stride, args.repeat)
            for d in depths
        }
        probe = run_child("probe", root, args.tokens, 0, repeat=args.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    layers, step, head = args.layers, probe["seconds"], probe["head_seconds"]
    first, table = next(iter(tables.items()))
    steps, heads_done = probe_work(layers, first, args.probe_widths, args.probe_stride)
    per_layer_act = act["seconds"] / layers
    per_layer_table = (table["seconds"] - steps * step - heads_done * head) / layers
    print(f"{layers} layers at {args.shape} width (hidden {hidden}, FFN {ffn}, {heads} heads, {kv_heads} KV heads, "
          f"vocab {vocab}), {args.tokens} tokens, {table['options_per_layer']} options a layer")  # fmt: skip
    print(f"activation pass: {act['seconds']:.1f} s, peak RSS {act['peak_rss_mib']:.0f} MiB")
    for d, timed in tables.items():
        print(f"table, probe depth {d}: {timed['seconds']:.1f} s ({timed['seconds'] / act['seconds']:.2f}x), "
              f"peak RSS {timed['peak_rss_mib']:.0f} MiB")  # fmt: skip
    print(f"one probe step (512 tokens through one layer): {step:.3f} s; one LM-head evaluation (512 tokens): "
          f"{head:.3f} s; per layer without probes: table {per_layer_table:.2f} s, "
          f"activation {per_layer_act:.2f} s")  # fmt: skip
    spare = table["peak_rss_mib"] - layer_bytes / 2**20 - 1024
    print(f"one float32 layer: {layer_bytes / 2**20:.0f} MiB; hidden states: {args.tokens * hidden * 4 / 2**20:.0f} "
          f"MiB per copy; table peak - (layer + 1 GiB) = {spare:.0f} MiB")  # fmt: skip
    for cap in args.probe_depth:
        steps, heads_done = probe_work(depth, cap, args.probe_widths, args.probe_stride)
        probes = steps * step + heads_done * head
        total, activation = depth * per_layer_table + probes, depth * per_layer_act
        label = f"probe depth {cap}" if cap else "no cap (the old probes)"
        print(f"{'modelled' if measured else 'extrapolated to'} {depth} layers, {label}: activation "
              f"{activation / 60:.1f} min, table {total / 60:.1f} min ({total / activation:.2f}x), probes "
              f"{probes / 60:.1f} min ({probes / total:.0%} of the table: {steps:.0f} probe steps, {heads_done:.1f} "
              "head evaluations)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
