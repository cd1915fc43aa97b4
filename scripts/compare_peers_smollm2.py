"""Head to head: nsc-prune against Torch-Pruning (DepGraph) on SmolLM2-135M, before and after recovery.

FFN channels only (the peer cannot prune the attention heads of this GQA model in reasonable time, see
docs/compare.md). At each budget (percent of the dense model's parameters) every method lands at the same
parameter count (+-0.5 %, exact counts reported):

- ``NSC-DP psi_MP``: the search's plan on ``ffn-grid`` (step 64, down to 25 %, layer 0 protected, as in
  scripts/study_smollm2.py), extracted with ``activation`` selection;
- ``NSC-DP psi_W``: the same with ``--score psi_w`` (the real weight spectra);
- ``uniform + activation``: every layer at one width (the width whose parameter count is closest to the
  budget; the peer's widths), our ``activation`` selection;
- ``TP magnitude``: ``torch_pruning`` MetaPruner, ``MagnitudeImportance(p=2, group_reduction="mean")``, one
  uniform ratio found by bisection;
- ``TP Taylor``: the same with ``TaylorImportance`` (gradients of the LM loss on the calibration text);
- ``NSC-DP psi_MP ffn-heads``: the search's plan on ``ffn-heads`` (FFN widths and KV groups; the same grid),
  ``activation`` selection: ours only, since the peer cannot prune this model's heads (when its plan equals
  another NSC-DP row's, that checkpoint is measured and healed once and the row says ``same_plan_as``);
- ``NSC-DP psi_MP + super-adapter`` (with ``--super-adapter DIR``, a ``train-supernet`` adapter on the same
  grid, e.g. from scripts/study_recovery_smollm2.py): the psi_MP plan cut in the adapter's channel order,
  without (pruned) and with (recovered) its LoRA; recovery is that one training run, not ``heal``.

Text (all local): calibration (activation statistics, Taylor gradients) and recovery training use Python's
``pydoc_data.topics``; held-out perplexity is measured on the docstrings of ten stdlib modules (never used for
calibration or training; ``nsc_prune.eval.studies.heldout_text``). Every pruned model is then healed with the same
recipe (``nsc_prune.hf.train.heal.heal``: LoRA, distillation from the dense model, same data, same tokens).

    python scripts/compare_peers_smollm2.py --overwrite                       # full run: 90/80/70 %, into docs/
    python scripts/compare_peers_smollm2.py --budgets 80 --limit 20 --heal-tokens 16384 --tokens 2048 \
        --results out/compare.json --plot out/compare.png                     # a quick look, docs/ left alone
    python scripts/compare_peers_smollm2.py --render-doc docs/compare_results.json   # refresh docs/compare.md

``--results`` and ``--plot`` (docs/compare_results.json and docs/compare.png by default) are refused when they
exist, unless ``--overwrite``; both are rewritten atomically after every row, so an interrupted run keeps the rows
it measured (``"partial": true``).

Needs ``pip install torch-pruning`` (benchmark-only; not an nsc-prune dependency).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import platform
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsc_prune._io import atomic_file, existing_file, publish_text, read_json_object
from nsc_prune._memory import peak_rss_mib, reset_peak_rss
from nsc_prune.cli.parser import check_file_output, percent_list, positive_int
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import InvalidInputError
from nsc_prune.eval import studies

ROOT = Path(__file__).resolve().parents[1]

DOC = ROOT / "docs" / "compare.md"
TABLE_START, TABLE_END = "<!-- compare-table:start -->", "<!-- compare-table:end -->"
FFN_HEADS = "NSC-DP psi_MP ffn-heads"
MEASURED = "NSC-DP measured (no protect)"
SUPER_ADAPTER = "NSC-DP psi_MP + super-adapter"
TP_METHODS = ("TP magnitude", "TP Taylor")
METHODS = (MEASURED, "NSC-DP psi_MP", "NSC-DP psi_W", FFN_HEADS, "uniform + activation", *TP_METHODS)
# what a row copies from an earlier row with the same plan
MEASURED_KEYS = ("params", "ppl", "ppl_prose", "avg8", "avg8_stderr", "siqa", "siqa_stderr", "eval_s", "healed")
TOLERANCE = 0.005


# =========================================================================================== peer wrapper
# Torch-Pruning as a user would call it; nothing below imports nsc_prune.


def count_params(model: Any) -> int:
    """Parameters of ``model`` (tied tensors once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def ffn_only_settings(model: Any) -> tuple[list[Any], list[tuple[Any, int]]]:
    """``ignored_layers`` and ``unwrapped_parameters`` that make MetaPruner prune only the FFN channels of a
    llama-style ``*ForCausalLM``: attention projections, ``down_proj``, embeddings and ``lm_head`` are not roots
    (``down_proj``'s inputs still follow the gate/up outputs), and the RMSNorm weights are unwrapped on dim 0."""
    ignored = [model.get_input_embeddings(), model.get_output_embeddings()]
    for layer in model.model.layers:
        attn = layer.self_attn
        ignored += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, layer.mlp.down_proj]
    unwrapped = [(p, 0) for name, p in model.named_parameters() if name.endswith("norm.weight")]
    return ignored, unwrapped


def taylor_gradients(model: Any, ids: Any, seq_len: int) -> None:
    """Accumulate ``.grad`` of the LM loss over ``ids`` (1-D token ids) in ``seq_len`` windows."""
    import torch

    model.zero_grad(set_to_none=True)
    chunks = [ids[i : i + seq_len] for i in range(0, len(ids), seq_len) if len(ids[i : i + seq_len]) > 1]
    with torch.enable_grad():
        for chunk in chunks:
            out = model(chunk[None], labels=chunk[None], use_cache=False)
            (out.loss / len(chunks)).backward()


def tp_prune_ffn(model: Any, ratio: float, importance: Any, vocab_size: int) -> Any:
    """Prune ``ratio`` of every layer's FFN channels of ``model`` in place with one MetaPruner step."""
    import torch
    import torch_pruning as tp

    ignored, unwrapped = ffn_only_settings(model)
    example = torch.randint(0, vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    pruner = tp.pruner.MetaPruner(
        model,
        example,
        importance=importance,
        pruning_ratio=ratio,
        ignored_layers=ignored,
        unwrapped_parameters=unwrapped,
        output_transform=lambda out: out.logits,
    )
    pruner.step()
    widths = {layer.mlp.gate_proj.out_features for layer in model.model.layers}
    if len(widths) != 1:
        raise RuntimeError(f"expected one FFN width after uniform pruning, got {sorted(widths)}")
    model.config.intermediate_size = widths.pop()
    return model


def make_importance(method: str) -> Any:
    import torch_pruning as tp

    if method == "magnitude":
        return tp.importance.MagnitudeImportance(p=2, group_reduction="mean")
    if method == "taylor":
        return tp.importance.TaylorImportance(group_reduction="mean")
    raise ValueError(f"method must be magnitude or taylor, got {method!r}")


def tp_prune_to_budget(
    model_dir: str | Path,
    target: int,
    method: str,
    out: str | Path,
    *,
    calib_ids: Any = None,
    seq_len: int = 512,
    tolerance: float = TOLERANCE,
    max_iter: int = 30,
) -> dict[str, Any]:
    """Load ``model_dir`` (float32), prune its FFN channels with Torch-Pruning at the uniform ratio whose pruned
    parameter count is closest to ``target`` (bisection on the ratio), ``save_pretrained`` it (and the tokenizer)
    to ``out``. ``method``: ``magnitude`` or ``taylor`` (needs ``calib_ids``). Returns the record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nsc_prune.hf.weights.loading import from_pretrained

    start = time.perf_counter()
    model = from_pretrained(AutoModelForCausalLM, model_dir, dtype=torch.float32).eval()
    dense = count_params(model)
    vocab = model.config.vocab_size
    if method == "taylor":
        if calib_ids is None:
            raise ValueError("taylor importance needs calib_ids")
        taylor_gradients(model, calib_ids, seq_len)
    # bracket the bisection around the ratio the FFN parameter count predicts (each trial builds a DepGraph)
    ffn = sum(layer.mlp.gate_proj.weight.numel() * 3 for layer in model.model.layers)
    guess = (dense - target) / ffn
    lo, hi, best, tried = max(0.0, guess - 0.02), min(0.99, guess + 0.02), None, []
    for _ in range(max_iter):
        mid = (lo + hi) / 2
        trial = copy.deepcopy(model)
        for src, dst in zip(model.parameters(), trial.parameters()):  # deepcopy drops .grad (Taylor needs it)
            dst.grad = None if src.grad is None else src.grad.clone()
        trial = tp_prune_ffn(trial, mid, make_importance(method), vocab)
        n = count_params(trial)
        tried.append((round(mid, 6), n))
        if best is None or abs(n - target) < abs(best[1] - target):
            best = (mid, n, trial)
        else:
            del trial
        if abs(n - target) <= tolerance / 5 * target or hi - lo < 1e-6:
            break
        lo, hi = (mid, hi) if n > target else (lo, mid)
    ratio, params, pruned = best
    if abs(params - target) > tolerance * target:
        raise RuntimeError(f"no ratio hits {target} params within {tolerance:.1%} (best {params} at ratio {ratio:.4f})")
    pruned.zero_grad(set_to_none=True)
    for p in pruned.parameters():
        p.requires_grad_(True)
    pruned.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return {
        "method": f"torch_pruning {method}",
        "ratio": ratio,
        "params": params,
        "dense_params": dense,
        "ffn_width": pruned.config.intermediate_size,
        "bisection": tried,
        "seconds": time.perf_counter() - start,
    }


# =========================================================================================== measurement


@contextlib.contextmanager
def measured(record: dict[str, Any]):
    """Wall time and peak RSS of the block into ``record['prune_s']`` / ``record['peak_rss_mb']``."""
    record["rss_reset"] = reset_peak_rss()
    t0 = time.perf_counter()
    yield record
    record["prune_s"] = time.perf_counter() - t0
    record["peak_rss_mb"] = peak_rss_mib()


def environment() -> dict[str, Any]:
    import importlib.metadata as md

    versions = {}
    for name in ("torch", "transformers", "torch-pruning", "peft", "lm-eval"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor(),
        "versions": versions,
    }


# =========================================================================================== report


def fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def render_table(results: dict[str, Any]) -> str:
    """The markdown table of docs/compare.md from a results JSON (the test checks the doc equals this).

    "recovered" is ``heal`` for every method but the super-adapter's, whose recovery is its one training run."""
    rows = results["rows"]
    dense = results["dense"]
    lines = [
        (
            f"Dense SmolLM2-135M-Instruct: {dense['params']:,} params, held-out perplexity {fmt(dense['ppl'])} "
            f"(docstrings), {fmt(dense.get('ppl_prose'))} (prose), "
            f"Avg8 {fmt_pct(dense['avg8'], dense['avg8_stderr'])}, "
            f"SIQA {fmt_pct(dense.get('siqa'), dense.get('siqa_stderr'))}."
        ),
        "",
        (
            "| budget | method | params (exact) | vs target | ppl docs pruned | ppl docs recovered | ppl prose pruned "
            "| ppl prose recovered | Avg8 pruned | Avg8 recovered | SIQA pruned | SIQA recovered | prune step (s) "
            "| peak RSS (MB) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for budget in sorted({r["budget"] for r in rows}, reverse=True):
        for r in [r for r in rows if r["budget"] == budget]:
            rec = r.get("healed") or {}
            method = r["method"] + (f" (same plan as {r['same_plan_as']})" if r.get("same_plan_as") else "")
            lines.append(
                f"| {budget}% | {method} | {r['params']:,} | {100 * (r['params'] / r['target'] - 1):+.2f}% "
                f"| {fmt(r['ppl'])} | {fmt(rec.get('ppl'))} | {fmt(r.get('ppl_prose'))} | {fmt(rec.get('ppl_prose'))} "
                f"| {fmt_pct(r['avg8'], r['avg8_stderr'])} "
                f"| {fmt_pct(rec.get('avg8'), rec.get('avg8_stderr'))} "
                f"| {fmt_pct(r.get('siqa'), r.get('siqa_stderr'))} | {fmt_pct(rec.get('siqa'), rec.get('siqa_stderr'))} "
                f"| {fmt(r['prune_s'], 1)} | {fmt(r['peak_rss_mb'], 0)} |"
            )
    return "\n".join(lines)


def fmt_pct(value: float | None, stderr: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.1f}" + (f" ± {100 * stderr:.1f}" if stderr is not None else "")


def embed_table(doc: Path, table: str) -> None:
    text = doc.read_text()
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    publish_text(doc, f"{head}{TABLE_START}\n{table}\n{TABLE_END}{tail}")


def doc_table(doc: Path = DOC) -> str:
    text = doc.read_text()
    return text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip("\n")


def plot(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    rows = results["rows"]
    top = 5 * results["dense"]["ppl"]  # a collapsed model (perplexity 1e5) would flatten every other line
    # a method that repeats another's plan at every budget is drawn once, under both names
    methods = list(dict.fromkeys(r["method"] for r in rows))
    repeats = {}
    for m in methods:
        sources = {r.get("same_plan_as") for r in rows if r["method"] == m}
        if len(sources) == 1 and None not in sources:
            repeats[m] = sources.pop()
    names = {m: " = ".join([m, *(o for o, s in repeats.items() if s == m)]) for m in methods}
    for i, method in enumerate(m for m in methods if m not in repeats):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["params"])
        pruned = [(r["params"] / 1e6, r["ppl"]) for r in mine]
        recovered = [(r["params"] / 1e6, r["healed"]["ppl"]) for r in mine if r.get("healed")]
        for points, kind, marker, style in ((pruned, "pruned", "o", "-"), (recovered, "recovered", "s", "--")):
            if not points:
                continue
            params, ppl = zip(*points)
            off = f" (off scale: {min(ppl):.3g}-{max(ppl):.3g})" if max(ppl) > top else ""
            ax.plot(
                params,
                [min(p, top) for p in ppl],
                marker="^" if off else marker,
                linestyle=style,
                color=f"C{i}",
                label=f"{names[method]} ({kind}){off}",
            )
    ax.axhline(results["dense"]["ppl"], color="black", linestyle=":", label="dense")
    ax.set_xlabel("params (M)")
    ax.set_ylabel("held-out perplexity (stdlib docstrings)")
    ax.set_yscale("log")
    ax.set_ylim(top=top * 1.05)
    title = f"SmolLM2-135M, FFN-only pruning ({results['settings']['label']})"
    ax.set_title(textwrap.fill(title, 90), fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    with atomic_file(path, overwrite=True) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


# =========================================================================================== the run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/compare-peers"), help="working folder")
    parser.add_argument("--budgets", type=percent_list, default="90,80,70", help="percent of the dense model's params")
    parser.add_argument("--tokens", type=positive_int, default=4096, help="held-out perplexity tokens")
    parser.add_argument(
        "--calib-tokens", type=positive_int, default=2048, help="calibration tokens (activation, Taylor)"
    )
    parser.add_argument("--heal-tokens", type=positive_int, default=262144, help="training tokens of each heal run")
    parser.add_argument("--heal-seq-len", type=positive_int, default=256)
    parser.add_argument("--heal-batch-size", type=positive_int, default=4)
    parser.add_argument(
        "--limit", type=positive_int, default=None, help="commonsense8_offline documents per task (default all 40)"
    )
    parser.add_argument(
        "--siqa-limit",
        type=positive_int,
        default=300,
        help="SIQA questions (BIG-bench copy, scripts/prepare_bigbench_siqa.py; skipped when not cached)",
    )
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    parser.add_argument(
        "--super-adapter",
        type=Path,
        default=None,
        help="a train-supernet adapter on the same grid: adds the NSC-DP psi_MP + super-adapter rows",
    )
    parser.add_argument(
        "--sensitivity-shrink",
        type=float,
        default=0.0,
        metavar="W",
        help="the measured plan's --sensitivity-shrink (recorded in the results' sensitivity record)",
    )
    parser.add_argument("--no-heal", action="store_true")
    parser.add_argument("--no-tasks", action="store_true", help="perplexity only")
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "compare_results.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "compare.png")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --results and --plot")
    parser.add_argument("--label", default=None, help="run label shown in the doc and plot")
    parser.add_argument(
        "--render-doc",
        type=Path,
        default=None,
        metavar="JSON",
        help="only re-render docs/compare.md (and --plot) from JSON",
    )
    args = parser.parse_args(argv)
    if args.render_doc is not None:
        results = read_json_object(existing_file(args.render_doc, "--render-doc"))
        embed_table(DOC, render_table(results))
        plot(results, args.plot)
        print(render_table(results))
        return 0
    try:
        args.methods = selected_methods(args)
    except InvalidInputError as err:
        parser.error(str(err))
    if not 0 <= args.sensitivity_shrink <= 1:  # checked before the slow steps, as every argument
        parser.error(f"--sensitivity-shrink must be in [0, 1]; got {args.sensitivity_shrink}")
    for flag, path in (("--results", args.results), ("--plot", args.plot)):
        check_file_output(parser, str(path), args.overwrite, flag=flag)
    return run(args)


@dataclass
class Study:
    """What every row of a run reads: the settings, the dense model, the measure, our channel orders and fronts
    (with their timings), the super-adapter (with ``--super-adapter``) and the heal recipe."""

    args: argparse.Namespace
    methods: list[str]
    base_dir: Path
    base: Any
    work: Path
    calib_ids: Any
    measure: Callable[[Path], dict[str, Any]]
    siqa_note: str
    start: float = field(default_factory=time.perf_counter)
    orders: Any = None
    selection: dict[str, Any] | None = None
    calib_s: float = 0.0
    calib_rss: float = 0.0
    fronts: dict[str, Any] = field(default_factory=dict)
    search_s: dict[str, float] = field(default_factory=dict)
    sensitivity_record: dict[str, Any] | None = None
    adapter: Any = None
    adapter_orders: Any = None
    supernet: dict[str, Any] | None = None
    recipe: Any = None
    heal_data: Any = None
    heal_steps: int = 0
    dense: dict[str, Any] = field(default_factory=dict)

    def elapsed(self) -> str:
        return f"[{time.perf_counter() - self.start:.0f}s]"

    def plan_params(self, widths: list[int]) -> int:
        """Parameters of the dense model with these FFN widths."""
        hidden = self.base.config["hidden_size"]
        return self.dense["params"] - 3 * hidden * sum(self.base.widths) + 3 * hidden * sum(widths)


def selected_methods(args: argparse.Namespace) -> list[str]:
    """``--methods`` checked against ``METHODS``, plus the super-adapter's rows with ``--super-adapter``."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(METHODS)
    if unknown or not methods:
        raise InvalidInputError(f"--methods: unknown {sorted(unknown)}; choose from {METHODS}")
    if args.super_adapter is not None:
        methods.append(SUPER_ADAPTER)
    return methods


def make_measure(
    base_dir: Path, args: argparse.Namespace, stack: contextlib.ExitStack
) -> tuple[Callable[[Path], dict[str, Any]], str]:
    """(checkpoint folder -> params, held-out perplexities, Avg8 and SIQA with their standard errors, eval time;
    the note on SIQA)."""
    from transformers import AutoTokenizer

    from nsc_prune._files import cache_dir
    from nsc_prune.eval.perplexity import perplexity
    from nsc_prune.eval.runner import EvalConfig, evaluate_model
    from nsc_prune.eval.tasks import average, average_stderr, resolve_tasks
    from nsc_prune.hf.cut.selection import calibration_ids
    from nsc_prune.hf.weights.loading import load_pruned

    eval_ids = calibration_ids(base_dir, studies.heldout_text(), args.tokens)
    prose_ids = calibration_ids(base_dir, studies.prose_text(), args.tokens)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    suites = []  # (tasks, config, key)
    if not args.no_tasks:
        config = EvalConfig(tasks=(studies.TASKS,), device="cpu", dtype="float32", batch_size=16, limit=args.limit)
        suites.append((stack.enter_context(resolve_tasks(studies.TASKS)), config, "avg8"))
    siqa = cache_dir() / "bigbench-siqa"
    if siqa.exists() and not args.no_tasks:
        config = EvalConfig(tasks=(str(siqa),), device="cpu", dtype="float32", batch_size=16, limit=args.siqa_limit)
        suites.append((stack.enter_context(resolve_tasks(str(siqa))), config, "siqa"))
        siqa_note = f"BIG-bench's copy of SIQA validation (scripts/prepare_bigbench_siqa.py), first {args.siqa_limit}"
    elif args.no_tasks:
        siqa_note = "not run (--no-tasks)"
    else:
        siqa_note = "skipped: run scripts/prepare_bigbench_siqa.py first (its data is not cached)"

    def measure(path: Path) -> dict[str, Any]:
        model = load_pruned(path, dtype="float32", adapter=False).eval()
        t0 = time.perf_counter()
        out = {
            "params": count_params(model),
            "ppl": perplexity(model, eval_ids, 512),
            "ppl_prose": perplexity(model, prose_ids, 512),
            "avg8": None,
            "avg8_stderr": None,
        }
        for tasks, config, key in suites:
            res = evaluate_model(model, tokenizer, tasks, config)
            out[key], out[f"{key}_stderr"] = average(res), average_stderr(res)
        out["eval_s"] = time.perf_counter() - t0
        return out

    return measure, siqa_note


def search_fronts(study: Study, calib_file: Path) -> None:
    """Our side: the channel orders once (timed apart, added to each of our methods' pruning time) and the front of
    every NSC-DP method run (psi_MP's also for the super-adapter's rows)."""
    from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders
    from nsc_prune.hf.score.sensitivity import SensitivityConfig
    from nsc_prune.planning import ScoreSettings

    args, shared = study.args, {}
    with measured(shared):
        study.orders, study.selection = channel_orders(
            study.base, SelectionConfig("activation", calib=str(calib_file), calib_tokens=args.calib_tokens)
        )
    study.calib_s, study.calib_rss = shared["prune_s"], shared["peak_rss_mb"]
    # the table measures the same text and the same activation selection as extraction below
    table_settings = SensitivityConfig(str(calib_file), calib_tokens=args.calib_tokens)
    weights = str(study.base_dir)
    searches = (
        (
            MEASURED,
            "ffn-grid",
            {"protect_layers": []},
            ScoreSettings("measured", weights, table_settings, progress=False, shrink=args.sensitivity_shrink),
        ),
        ("NSC-DP psi_MP", "ffn-grid", {}, None),
        ("NSC-DP psi_W", "ffn-grid", {}, ScoreSettings("psi_w", weights)),
        (FFN_HEADS, "ffn-heads", {}, None),
    )
    for name, space, overrides, score in searches:
        if name in study.methods or (name == "NSC-DP psi_MP" and SUPER_ADAPTER in study.methods):
            t0 = time.perf_counter()
            folder = study.work / name.replace(" ", "_")
            study.fronts[name] = studies.grid_front("smollm2-135m", folder, space, overrides, score)
            study.search_s[name] = time.perf_counter() - t0
            if score is not None and score.backend == "measured":
                study.sensitivity_record = dict(study.fronts[name].score)
    study.fronts[SUPER_ADAPTER] = study.fronts.get("NSC-DP psi_MP")
    study.search_s[SUPER_ADAPTER] = study.search_s.get("NSC-DP psi_MP", 0.0)


def load_super_adapter(study: Study, folder: Path) -> None:
    """The ``--super-adapter``: its channel order and its training record."""
    from nsc_prune._files import SUPERNET_RECORD_NAME
    from nsc_prune.hf.cut.selection import adapter_channel_orders
    from nsc_prune.hf.weights.adapter import open_adapter

    study.adapter = open_adapter(folder)
    study.adapter_orders, _ = adapter_channel_orders(study.adapter.folder, study.base) or (None, None)
    if study.adapter_orders is None:
        raise SystemExit(f"{folder} has no channel order: pass an adapter written by train-supernet")
    study.supernet = json.loads((study.adapter.folder / SUPERNET_RECORD_NAME).read_text())


def heal_setup(study: Study, train_file: Path) -> None:
    """The one heal recipe and data of every method: ``--heal-tokens`` in steps of the heal batch."""
    from nsc_prune.hf.train.data import TextData
    from nsc_prune.hf.train.recipe import TrainConfig

    args = study.args
    steps = study.heal_steps = max(1, args.heal_tokens // (args.heal_seq_len * args.heal_batch_size))
    study.recipe = TrainConfig.from_dict(
        {
            **TrainConfig().to_dict(),
            "max_steps": steps,
            "seq_len": args.heal_seq_len,
            "batch_size": args.heal_batch_size,
            "warmup_steps": min(20, steps // 10),
            "save_steps": 10**6,
            "eval_steps": 10**6,
            "logging_steps": max(1, steps // 5),
            "gradient_checkpointing": False,
            "distill": True,  # heal() sets it anyway when given a teacher; recorded here so the JSON says so
        }
    )
    # cap the text read so that the held-out split (5 %) stays small; every heal run reads the same tokens
    study.heal_data = TextData(
        (str(train_file),),
        max_tokens=int(steps * args.heal_seq_len * args.heal_batch_size / 0.95) + 2 * args.heal_seq_len,
    )


def settings_record(study: Study) -> dict[str, Any]:
    """The results' ``settings``: what was run, on which texts, with which peer settings."""
    args = study.args
    heal_text = (
        "no heal"
        if args.no_heal
        else f"heal {study.heal_steps} steps x {args.heal_batch_size} x {args.heal_seq_len} tokens"
    )
    tasks_text = "no tasks" if args.no_tasks else f"task limit {args.limit or 'none'}"
    budgets = ",".join(map(str, args.budgets))  # as given: "90,80,70"
    label = args.label or (
        f"budgets {budgets}, {args.tokens} held-out tokens, calib {args.calib_tokens} tokens, {heal_text}, {tasks_text}"
    )
    return {
        "label": label,
        "budgets": budgets,
        "methods": study.methods,
        "heldout_tokens": args.tokens,
        "calib_tokens": args.calib_tokens,
        "heal_recipe": study.recipe.to_dict(),
        "task_limit": args.limit,
        "heldout_text": f"docstrings of {', '.join(studies.EVAL_MODULES)}",
        "heldout_prose": studies.PROSE_SOURCE,
        "sensitivity_table": study.sensitivity_record,
        "calibration_and_training_text": "pydoc_data.topics",
        "tolerance": TOLERANCE,
        "torch_pruning": {
            "pruner": "MetaPruner",
            "importance": {
                "magnitude": "MagnitudeImportance(p=2, group_reduction='mean')",
                "taylor": "TaylorImportance(group_reduction='mean')",
            },
            "ignored_layers": "embed_tokens, lm_head, q/k/v/o_proj, down_proj",
            "unwrapped_parameters": "every RMSNorm weight, dim 0",
            "round_to": None,
        },
    }


def write_results(study: Study, rows: list[dict[str, Any]], partial: bool) -> None:
    """The results JSON (``--results``) and plot (``--plot``) of the rows so far; the table once complete."""
    args = study.args
    results = {
        "settings": settings_record(study),
        "environment": environment(),
        "dense": study.dense,
        "selection": study.selection,
        "siqa": study.siqa_note,
        "rows": rows,
        "wall_s": time.perf_counter() - study.start,
        "command": " ".join(["python", *sys.argv]),
        "partial": partial,
    }
    publish_text(args.results, json.dumps(results, indent=2) + "\n")
    plot(results, args.plot)
    if not partial:
        print(render_table(results))


def prune_peer(study: Study, method: str, ckpt: Path, row: dict[str, Any]) -> None:
    """A Torch-Pruning row: the uniform ratio closest to the row's target, saved to ``ckpt``."""
    kind = "taylor" if "Taylor" in method else "magnitude"
    with measured(row):
        calib_ids = study.calib_ids if kind == "taylor" else None
        info = tp_prune_to_budget(study.base_dir, row["target"], kind, ckpt, calib_ids=calib_ids)
    row.update(ratio=info["ratio"], widths=f"{info['ffn_width']} in every layer", bisection=info["bisection"])


def prune_ours(study: Study, method: str, ckpt: Path, row: dict[str, Any]) -> list[Any]:
    """One of our rows: the method's plan at the row's target extracted to ``ckpt``; its time includes the channel
    orders' and the search's. Returns the layer plans."""
    from nsc_prune.hf.extract import ExtractOptions, extract_plan
    from nsc_prune.plan import LayerPlan

    target, n_layers = row["target"], study.base.num_layers
    with measured(row):
        if method == "uniform + activation":
            widths = range(1, study.base.widths[0] + 1)
            w = min(widths, key=lambda w: abs(study.plan_params([w] * n_layers) - target))
            plans = [LayerPlan(ffn=w)] * n_layers
        else:
            front = study.fronts[method]
            plans = front.points[front.select(budget=target)].layer_plans()
        orders = study.adapter_orders if method == SUPER_ADAPTER else study.orders
        extract_plan(plans, study.base, ckpt, options=ExtractOptions(dtype="float32"), orders=orders)
    if method != SUPER_ADAPTER:  # the adapter's order was computed by its training run
        row["prune_s"] += study.calib_s
        row["peak_rss_mb"] = max(row["peak_rss_mb"], study.calib_rss)
        row["calibration_s"] = study.calib_s
    row["prune_s"] += study.search_s.get(method, 0.0)
    row["widths"] = compress_widths(p.ffn for p in plans)
    if method == FFN_HEADS:
        row["kv_groups"] = compress_widths(p.kv_groups for p in plans)
    row["search_s"] = study.search_s.get(method)
    return plans


def recover_super(study: Study, plans: list[Any], ckpt: Path) -> dict[str, Any]:
    """The super-adapter's recovered row: the plan extracted from the adapter (LoRA merged) and measured."""
    from nsc_prune.hf.extract import ExtractOptions, extract_plan

    recovered = study.work / f"{ckpt.name}-super"
    t0 = time.perf_counter()
    options = ExtractOptions(dtype="float32")
    extract_plan(plans, study.base, recovered, study.adapter, options, orders=study.adapter_orders)
    result = study.supernet["result"]
    healed = {
        **study.measure(recovered),
        "recovery": "train-supernet (one run for every budget)",
        "extract_s": time.perf_counter() - t0,
        "heal_s": result["seconds"],
        "tokens": result["tokens"],
        "steps": result["steps"],
    }
    shutil.rmtree(recovered)
    return healed


def heal_row(study: Study, ckpt: Path) -> dict[str, Any]:
    """``ckpt`` healed with the run's recipe (distilled from the dense model) and measured."""
    from nsc_prune.hf.train.heal import heal

    t0 = time.perf_counter()
    out = study.work / f"{ckpt.name}-healed"
    healed = heal(ckpt, study.heal_data, out, study.recipe, teacher=study.base_dir, progress=False)
    heal_s = time.perf_counter() - t0
    rec = json.loads((healed / "nsc_prune_extract.json").read_text())["recovery"]
    h = {
        **study.measure(healed),
        "heal_s": heal_s,
        "tokens": rec["tokens"],
        "steps": rec["steps"],
        "val_loss_before": rec["val_loss_before"],
        "val_loss_after": rec["val_loss_after"],
    }
    print(
        f"    healed ppl {h['ppl']:.2f} prose {h['ppl_prose']:.2f} avg8 {fmt_pct(h['avg8'], h['avg8_stderr'])} "
        f"({heal_s:.0f}s, {h['tokens']} tokens)",
        flush=True,
    )
    shutil.rmtree(healed)
    return h


def method_row(study: Study, pct: int, method: str, measured_plans: dict[tuple, dict[str, Any]]) -> dict[str, Any]:
    """One method at one budget: pruned, measured (or copied from an earlier row of ours with the same plan, whose
    checkpoint is the same: same channel order), recovered, measured again."""
    target = study.dense["params"] * pct // 100
    ckpt = study.work / f"{pct}-{method.replace(' ', '_').replace('+', 'p')}"
    row: dict[str, Any] = {"budget": pct, "method": method, "target": target}
    plans = None
    if method in TP_METHODS:
        prune_peer(study, method, ckpt, row)
    else:
        plans = prune_ours(study, method, ckpt, row)
    activation_cut = method not in TP_METHODS + (SUPER_ADAPTER,)
    same = measured_plans.get(tuple(plans)) if activation_cut else None
    if same is not None:
        row.update({k: same[k] for k in MEASURED_KEYS if k in same}, same_plan_as=same["method"])
    else:
        row.update(study.measure(ckpt))
        row["healed"] = None
        if activation_cut:
            measured_plans[tuple(plans)] = row
    if method == SUPER_ADAPTER:
        row["healed"] = recover_super(study, plans, ckpt)
    print(
        f"{study.elapsed()} {pct}% {method:22s} {row['params']:,} "
        f"({100 * (row['params'] / target - 1):+.2f}%) ppl {row['ppl']:.2f} prose {row['ppl_prose']:.2f} "
        f"avg8 {fmt_pct(row['avg8'], row['avg8_stderr'])} prune {row['prune_s']:.1f}s",
        flush=True,
    )
    if not study.args.no_heal and method != SUPER_ADAPTER and same is None:
        row["healed"] = heal_row(study, ckpt)
    shutil.rmtree(ckpt)
    return row


def run(args: argparse.Namespace) -> int:
    import torch

    from nsc_prune.hf.cut.selection import calibration_ids
    from nsc_prune.hf.weights.base import open_base
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

    start = time.perf_counter()
    methods = args.methods
    torch.manual_seed(0)
    base_dir = smollm2_checkpoint()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="compare-", dir=args.out))
    calib_file, train_file = work / "calib.txt", work / "train.txt"
    calib_file.write_text(studies.calibration_text())
    train_file.write_text(studies.calibration_text())
    calib_ids = calibration_ids(base_dir, studies.calibration_text(), args.calib_tokens)
    stack = contextlib.ExitStack()
    measure, siqa_note = make_measure(base_dir, args, stack)
    study = Study(args, methods, base_dir, open_base(base_dir), work, calib_ids, measure, siqa_note, start)
    study.dense = measure(base_dir)
    dense = study.dense
    print(
        f"{study.elapsed()} dense {dense['params']:,} params ppl {dense['ppl']:.2f} "
        f"avg8 {fmt_pct(dense['avg8'], dense['avg8_stderr'])}",
        flush=True,
    )
    search_fronts(study, calib_file)
    if args.super_adapter is not None:
        load_super_adapter(study, args.super_adapter)
    heal_setup(study, train_file)
    rows: list[dict[str, Any]] = []
    log = (args.out / "rows.jsonl").open("a")
    for pct in args.budgets:
        # a plan another of our methods already produced gives the same checkpoint (same channel order):
        # it is pruned and timed again, but measured and healed once
        measured_plans: dict[tuple, dict[str, Any]] = {}
        for method in methods:
            rows.append(method_row(study, pct, method, measured_plans))
            log.write(json.dumps(rows[-1]) + "\n")
            log.flush()
            write_results(study, rows, partial=True)  # an interrupted run keeps a results JSON with the rows so far
    write_results(study, rows, partial=False)
    stack.close()
    shutil.rmtree(work, ignore_errors=True)
    return 0


def compress_widths(widths: Iterable[int]) -> str:
    """``[1536, 1280, 1280, 1216]`` -> ``"1536, 1280 x2, 1216"``."""
    out: list[list[int]] = []
    for w in widths:
        if out and out[-1][0] == w:
            out[-1][1] += 1
        else:
            out.append([w, 1])
    return ", ".join(f"{w}" + (f" x{n}" if n > 1 else "") for w, n in out)


if __name__ == "__main__":
    raise SystemExit(run_script(main))
