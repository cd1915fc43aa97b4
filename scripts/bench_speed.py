"""Inference speed of what nsc-prune writes: SmolLM2-135M dense against NSC-DP plans and uniform plans of the same
parameter count, in every output format this machine can run (docs/speed.md).

    python scripts/bench_speed.py --out out/bench-speed            # ~15 min on 2 CPU cores

The variants are extracted into ``--out`` (``dense``, ``nsc-80``, ``uniform-80``, ...) and removed at the end,
with the calibration text and the front, unless ``--keep``; a rerun reuses the ones kept. A folder or GGUF file of
such a name that ``extract`` did not write is refused. The results (``speed_results.json``, ``speed.md``,
``speed.png``) replace an earlier run's only with ``--overwrite``.

Variants: the dense model; the NSC-DP plans (``--score measured`` on ``ffn-grid``, the comparison's settings:
``ffn_step=64``, down to 25 %) at ``--budgets`` of the parameters; for each, the uniform plan whose parameter count
is closest (every layer at one width, any integer, as the comparison's ``uniform + activation`` baseline).

Backends, each variant measured in a fresh process (so its peak RSS is its own):

- transformers: the ``pruned`` checkpoint ``extract`` writes, loaded by ``load_pruned`` (CPU float32; CUDA bfloat16
  when a GPU is present); the uniform plans also as a stock ``LlamaForCausalLM``;
- llama.cpp (``llama-cpp-python``, if installed): the ``gguf`` export in f16 and q8_0; the dense model is the
  full plan through the same exporter (architecture ``deci``);
- vLLM: needs a GPU and ``vllm``; skipped, and said so, otherwise.

Prefill: tokens/s of one forward pass of ``batch x 512`` random tokens (batch 1 and 8; llama.cpp batch 1: its Python
binding runs one sequence). Decode: tokens/s of 128 greedy tokens at batch 1 after a 128-token prompt. Medians of
``--rounds`` rounds after a warm-up, with the spread (max - min) / median. All variants of a backend are loaded in
one process and timed in turn, a round at a time, so a slow spell of a shared machine falls on all of them alike; peak
RSS is measured per variant in a fresh process (load, one batch-8 prefill, 16 decode steps); a GGUF's memory is its
file, which llama.cpp maps. The timers are ``nsc_prune.hf.latency.transformers_backend``'s,
the ones ``nsc-prune profile`` uses. Speed-ups are reported next to the parameter ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nsc_prune._files import RECORD_NAME
from nsc_prune._io import atomic_file, provenance, publish_text
from nsc_prune._memory import peak_rss_mib
from nsc_prune.cli.parser import check_file_output, percent_list, positive_int
from nsc_prune.cli.scripts import run_script
from nsc_prune.eval import studies

PROMPT, NEW_TOKENS, PREFILL_TOKENS = 128, 128, 512
RESULT_FILES = ("speed_results.json", "speed.md", "speed.png")  # replaced only with --overwrite
CALIB_FILE, FRONT_DIR = ".bench-speed-calib.txt", ".bench-speed-front"  # work files, removed unless --keep
VARIANT_KINDS = ("dense", "nsc", "uniform")  # the dense model; then, per budget, the NSC-DP and the uniform plan


def summary(times: list[float], tokens: int) -> dict[str, Any]:
    """Tokens/s of the median run, its spread, and the raw seconds."""
    median = statistics.median(times)
    return {
        "tokens_per_s": tokens / median,
        "spread": (max(times) - min(times)) / median,
        "seconds": times,
    }


def load_transformers(folder: str, loader: str, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from nsc_prune.hf.weights.loading import from_pretrained, load_pruned

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if loader == "stock":
        model = from_pretrained(AutoModelForCausalLM, folder, dtype=dtype)
    else:
        model = load_pruned(folder, dtype=dtype, adapter=False)
    return model.to(device).eval()


def in_rounds(runners: dict[str, dict[str, Any]], rounds: int) -> dict[str, dict[str, list[float]]]:
    """``runners[variant][measure](warmup) -> seconds``: every measure of every variant ``rounds`` times, variants in
    turn (``nsc_prune.hf.latency.profiling.time_rounds``: the first round warms each one up first), so a slow spell
    of the machine falls on all variants alike. Returns the seconds per round of each measure of each variant."""
    from nsc_prune.core.latency_table import ProfileSettings
    from nsc_prune.hf.latency.profiling import time_rounds

    def once(measures: dict[str, Any], warmup: bool) -> dict[str, float]:
        return {name: measure(warmup) for name, measure in measures.items()}

    timed = time_rounds(runners, ProfileSettings(repeats=rounds), once)  # only ``repeats`` is read
    return {v: {m: [run[m] for run in runs] for m in runners[v]} for v, runs in timed.items()}


def measure_transformers(variants: list[list[str]], device: str, rounds: int) -> dict[str, Any]:
    """Every (name, folder, loader) checkpoint loaded at once and timed in turn: prefill at batch 1 and 8 and
    decode, with ``nsc_prune.hf.latency.transformers_backend``'s timers."""
    import torch

    from nsc_prune.hf.latency.transformers_backend import decode_seconds, prefill_seconds

    models = {name: load_transformers(folder, loader, device) for name, folder, loader in variants}

    def runners(model: Any) -> dict[str, Any]:
        return {
            "prefill_b1": lambda warmup: prefill_seconds(model, 1, PREFILL_TOKENS, 1, warmup=warmup)[0],
            "prefill_b8": lambda warmup: prefill_seconds(model, 8, PREFILL_TOKENS, 1, warmup=warmup)[0],
            "decode": lambda warmup: decode_seconds(model, PROMPT, NEW_TOKENS, 1, warmup=warmup)[0],
        }

    with torch.inference_mode():
        times = in_rounds({name: runners(model) for name, model in models.items()}, rounds)
    tokens = {"prefill_b1": PREFILL_TOKENS, "prefill_b8": 8 * PREFILL_TOKENS, "decode": 1}
    return {
        name: {
            "class": type(models[name]).__name__,
            "params": sum(p.numel() for p in models[name].parameters()),
            **{key: summary(runs, tokens[key]) for key, runs in times[name].items()},
        }
        for name in models
    }


def measure_memory(folder: str, loader: str, device: str) -> dict[str, Any]:
    """Peak memory of one checkpoint in a fresh process: load, one prefill of 8 x 512 tokens, 16 decode steps."""
    import torch

    from nsc_prune.hf.latency.transformers_backend import decode_seconds, prefill_seconds

    model = load_transformers(folder, loader, device)
    prefill_seconds(model, 8, PREFILL_TOKENS, 1, warmup=False)
    decode_seconds(model, PROMPT, 16, 1, warmup=False)
    out = {"peak_rss_mb": peak_rss_mib()}
    if device == "cuda":
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def measure_llamacpp(paths: list[list[str]], rounds: int, threads: int) -> dict[str, Any]:
    """Every (name, GGUF path) loaded at once in llama.cpp and timed in turn: a prefill of 512 tokens, and 128 greedy
    tokens after a 128-token prompt (``nsc_prune.hf.latency.llamacpp_backend``'s timers, the ones ``profile`` uses)."""
    from nsc_prune.hf.latency.llamacpp_backend import decode_seconds, load_gguf, prefill_seconds, random_tokens

    models = {name: load_gguf(path, 1024, PREFILL_TOKENS, threads) for name, path in paths}
    tokens = random_tokens(next(iter(models.values())).n_vocab(), PREFILL_TOKENS, 0)

    def prefill(llm: Any, warmup: bool) -> float:
        if warmup:
            prefill_seconds(llm, tokens)
        return prefill_seconds(llm, tokens)

    def decode(llm: Any, warmup: bool) -> float:
        if warmup:
            decode_seconds(llm, tokens[:PROMPT], NEW_TOKENS)
        return decode_seconds(llm, tokens[:PROMPT], NEW_TOKENS)

    runners = {
        name: {"prefill_b1": lambda w, llm=llm: prefill(llm, w), "decode": lambda w, llm=llm: decode(llm, w)}
        for name, llm in models.items()
    }
    times = in_rounds(runners, rounds)
    sizes = {name: Path(path).stat().st_size / 2**20 for name, path in paths}
    return {
        name: {
            "prefill_b1": summary(times[name]["prefill_b1"], PREFILL_TOKENS),
            "decode": summary(times[name]["decode"], 1),
            "file_mb": sizes[name],
        }
        for name in models
    }


def in_subprocess(*args: str) -> dict[str, Any]:
    """Run this script's ``--measure`` mode in a fresh process and return its JSON."""
    done = subprocess.run([sys.executable, __file__, "--measure", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"measuring {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def variant_names(budgets: list[int]) -> list[str]:
    """The variants' folder names in ``--out``, as ``plans_to_measure`` names them."""
    dense, *per_budget = VARIANT_KINDS
    return [dense, *(f"{kind}-{budget}" for budget in budgets for kind in per_budget)]


def foreign_outputs(out: Path, budgets: list[int], gguf_types: list[str]) -> list[Path]:
    """Variant folders and GGUF files in ``out`` that the run would measure and then remove but that ``extract``
    did not write (an earlier run's, kept with ``--keep``, are reused)."""
    names = variant_names(budgets)
    folders = [out / name for name in names if (out / name).exists()]
    ggufs = [out / f"{name}-{outtype}.gguf" for name in names for outtype in gguf_types]
    return [folder for folder in folders if not (folder / RECORD_NAME).is_file()] + [
        path for path in ggufs if path.exists() and not written_by_extract(path)
    ]


def written_by_extract(gguf_path: Path) -> bool:
    """Whether ``gguf_path`` is a GGUF file holding ``extract``'s record."""
    from nsc_prune.hf.export.gguf_file import read_record

    try:
        read_record(gguf_path)
    except Exception:  # not a GGUF file, a truncated one, or one without the record: gguf raises several kinds
        return False
    return True


def plans_to_measure(base, budgets: list[int], work: Path) -> dict[str, tuple[list, str]]:
    """name -> (layer plans, description): dense, the NSC-DP plans and the uniform plans of the same params."""
    from nsc_prune.hf.score.sensitivity import SensitivityConfig
    from nsc_prune.plan import LayerPlan
    from nsc_prune.planning import ScoreSettings

    calib = work / CALIB_FILE
    calib.write_text(studies.calibration_text())
    score = ScoreSettings(
        "measured", str(base.folder), SensitivityConfig(str(calib), calib_tokens=2048), progress=False
    )
    front = studies.grid_front("smollm2-135m", work / FRONT_DIR, "ffn-grid", {"protect_layers": []}, score)
    hidden, layers, width = base.config["hidden_size"], base.num_layers, base.widths[0]
    full = int(front.cost["full"])  # the dense model's params: a measured front may leave it off
    fixed = full - 3 * hidden * width * layers

    def params(widths: list[int]) -> int:
        return fixed + 3 * hidden * sum(widths)

    dense, nsc, uniform = VARIANT_KINDS
    variants = {dense: ([LayerPlan(ffn=width)] * layers, f"{layers} x {width}")}
    for budget in budgets:
        point = front.points[front.select(budget=f"{budget}%")]
        plans = point.layer_plans()
        widths = [p.ffn for p in plans]
        variants[f"{nsc}-{budget}"] = (plans, f"NSC-DP measured, FFN {min(widths)}..{max(widths)}")
        even = min(range(1, width + 1), key=lambda w: abs(params([w] * layers) - point.params))
        variants[f"{uniform}-{budget}"] = ([LayerPlan(ffn=even)] * layers, f"uniform {even}")
    return variants


def markdown(rows: list[dict[str, Any]]) -> str:
    """The results as one Markdown table per backend."""
    lines = []
    for backend in dict.fromkeys(row["backend"] for row in rows):
        chosen = [row for row in rows if row["backend"] == backend]
        dense = next((r for r in chosen if r["variant"] == "dense"), None)
        lines += [
            f"\n**{backend}**\n",
            "| variant | plan | params | prefill b1 tok/s | prefill b8 tok/s | decode tok/s "
            + "| speed-up prefill b1 / decode | params ratio | memory MB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in chosen:

            def cell(key: str, row: dict[str, Any] = row) -> str:
                value = row.get(key)
                if value is None:
                    return "-"
                spread = f" (±{50 * value['spread']:.0f} %)" if len(value["seconds"]) > 1 else ""  # one run: none
                return f"{value['tokens_per_s']:.1f}{spread}"

            speedups = "-"
            if dense is not None:
                speedups = " / ".join(
                    f"{row[k]['tokens_per_s'] / dense[k]['tokens_per_s']:.2f}x" for k in ("prefill_b1", "decode")
                )
            ratio = f"{dense['params'] / row['params']:.2f}x" if dense else "-"
            lines.append(
                f"| {row['variant']} | {row['plan']} | {row['params'] / 1e6:.1f}M | {cell('prefill_b1')} | "
                f"{cell('prefill_b8')} | {cell('decode')} | {speedups} | {ratio} | {row.get('peak_rss_mb', row.get('file_mb')):.0f} |"
            )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path, overwrite: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2))
    for ax, key, title in ((axes[0], "prefill_b1", "prefill, batch 1 x 512"), (axes[1], "decode", "decode, batch 1")):
        for backend in dict.fromkeys(row["backend"] for row in rows):
            for kind, marker in (("nsc", "o"), ("uniform", "s"), ("dense", "*")):
                chosen = [r for r in rows if r["backend"] == backend and r["variant"].startswith(kind)]
                if chosen:
                    ax.plot(
                        [r["params"] / 1e6 for r in chosen], [r[key]["tokens_per_s"] for r in chosen], marker,
                        label=f"{backend} {kind}", alpha=0.8,
                    )  # fmt: skip
        ax.set(xlabel="parameters (M)", ylabel="tokens/s", title=title, yscale="log")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    with atomic_file(path, overwrite=overwrite, checked=True) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


def extract_variants(
    variants: dict[str, tuple[list, str]], base: Any, work: Path, gguf_types: list[str], args: argparse.Namespace
) -> tuple[list[list[str]], dict[str, list[list[str]]]]:
    """Each variant extracted once into ``work`` (kept from an earlier run): the pruned checkpoint (the uniform ones
    also loaded as stock), and a GGUF of each of ``gguf_types`` (uniform plans only with ``--uniform-gguf``).
    Returns the transformers variants ``[name, folder, loader]`` and the GGUFs ``[name, path]`` per type."""
    from nsc_prune.hf.extract import ExtractOptions, extract_plan

    hf_variants, gguf_variants = [], {outtype: [] for outtype in gguf_types}
    for name, (plans, _) in variants.items():
        folder = work / name
        if not folder.exists():
            extract_plan(plans, base, folder, options=ExtractOptions(dtype="float32"))
        hf_variants.append([name, str(folder), "pruned"])
        if name.startswith("uniform"):
            hf_variants.append([f"{name}-stock", str(folder), "stock"])
        if not name.startswith("uniform") or args.uniform_gguf:
            for outtype in gguf_types:
                path = work / f"{name}-{outtype}.gguf"
                if not path.exists():
                    extract_plan(plans, base, path, options=ExtractOptions(format="gguf", outtype=outtype))
                gguf_variants[outtype].append([name, str(path)])
    return hf_variants, gguf_variants


def skipped_backends(llamacpp: bool, device: str) -> list[str]:
    """Why each backend that did not run was skipped."""
    skipped = []
    if not llamacpp:
        skipped.append("llama.cpp: llama-cpp-python is not installed (pip install llama-cpp-python)")
    if device != "cuda" or importlib.util.find_spec("vllm") is None:
        skipped.append("vLLM: needs a CUDA GPU and the vllm package; none here")
    return skipped


def run(args: argparse.Namespace) -> int:
    import torch

    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

    start = time.perf_counter()
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    base = open_base(smollm2_checkpoint())
    variants = plans_to_measure(base, args.budgets, work)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    llamacpp = importlib.util.find_spec("llama_cpp") is not None and not args.skip_llamacpp
    gguf_types = args.gguf_types.split(",")
    rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        speed = ", ".join(
            f"{key} {row[key]['tokens_per_s']:.1f} tok/s"
            for key in ("prefill_b1", "prefill_b8", "decode")
            if key in row
        )
        print(f"[{time.perf_counter() - start:.0f}s] {row['backend']} {row['variant']}: {speed}", flush=True)

    hf_variants, gguf_variants = extract_variants(variants, base, work, gguf_types if llamacpp else [], args)
    print(f"[{time.perf_counter() - start:.0f}s] extracted {len(hf_variants)} checkpoints", flush=True)

    def describe(name: str) -> str:
        return variants[name.removesuffix("-stock")][1]

    timed = in_subprocess("transformers", json.dumps(hf_variants), device, str(args.rounds))
    for name, folder, loader in hf_variants:
        memory = in_subprocess("memory", folder, loader, device)
        backend = f"transformers {device} ({'load_pruned' if loader == 'pruned' else 'stock LlamaForCausalLM'})"
        record({"backend": backend, "variant": name.removesuffix("-stock"), "plan": describe(name),
                **timed[name], **memory})  # fmt: skip
    params = {row["variant"]: row["params"] for row in rows}
    for outtype, paths in gguf_variants.items():
        if paths:
            timed = in_subprocess("llamacpp", json.dumps(paths), str(args.rounds), str(args.threads))
            for name, _ in paths:
                record({"backend": f"llama.cpp {outtype}", "variant": name, "plan": describe(name),
                        "params": params[name], **timed[name]})  # fmt: skip
    skipped = skipped_backends(llamacpp, device)
    for line in skipped:
        print(f"skipped {line}")
    result = {
        "rows": rows,
        "skipped": skipped,
        "settings": {
            "prefill_tokens": PREFILL_TOKENS, "prompt": PROMPT, "new_tokens": NEW_TOKENS, "rounds": args.rounds,
            "device": device, "budgets": ",".join(map(str, args.budgets)),
            "torch_threads": torch.get_num_threads(),  # the default the transformers children start with too
            "llamacpp_threads": args.threads,
        },
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "torch": torch.__version__},
        "provenance": provenance(),
        "seconds": time.perf_counter() - start,
    }  # fmt: skip
    publish_text(work / "speed_results.json", json.dumps(result, indent=2), args.overwrite, checked=True)
    publish_text(work / "speed.md", markdown(rows), args.overwrite, checked=True)
    plot(rows, work / "speed.png", args.overwrite)
    print(markdown(rows))
    print(f"wrote {', '.join(str(work / name) for name in RESULT_FILES)}")
    if not args.keep:  # the checkpoints, GGUF files, calibration text and front, as --keep says
        (work / CALIB_FILE).unlink(missing_ok=True)
        shutil.rmtree(work / FRONT_DIR, ignore_errors=True)
        for name in variants:
            shutil.rmtree(work / name, ignore_errors=True)
        for _, path in (entry for paths in gguf_variants.values() for entry in paths):
            Path(path).unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--measure":  # a child process: one backend, JSON on the last line
        kind, *rest = argv[1:]
        if kind == "transformers":
            out = measure_transformers(json.loads(rest[0]), rest[1], int(rest[2]))
        elif kind == "memory":
            out = measure_memory(rest[0], rest[1], rest[2])
        else:
            out = measure_llamacpp(json.loads(rest[0]), int(rest[1]), int(rest[2]))
        print(json.dumps(out))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/bench-speed")
    parser.add_argument(
        "--budgets", type=percent_list, default="90,80,70", help="percent of the dense model's parameters"
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="timed rounds (every variant once a round)")
    parser.add_argument("--gguf-types", default="f16,q8_0")
    parser.add_argument("--threads", type=positive_int, default=2, help="llama.cpp threads")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--uniform-gguf", action="store_true", help="also run the uniform plans in llama.cpp")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints and GGUF files")
    parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")
    args = parser.parse_args(argv)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        parser.error(f"--out {args.out} is a file; name the folder the checkpoints and results go to")
    foreign = foreign_outputs(Path(args.out), args.budgets, args.gguf_types.split(","))
    if foreign:  # it would be measured as a variant, then removed
        parser.error(
            f"--out holds {', '.join(map(str, foreign))}, which nsc-prune extract did not write; move it, or pass "
            "another --out"
        )
    for name in RESULT_FILES:  # docs/ holds files of these names: --out docs replaced docs/speed.md without a word
        check_file_output(parser, str(Path(args.out) / name), args.overwrite)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(run_script(main))
