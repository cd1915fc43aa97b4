"""``nsc-prune --model M --budget B``: data-free NSC-DP search from a config, no weights."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

from nsc_prune._files import PARETO_FILE, PLOT_FILE, user_path
from nsc_prune._io import atomic_files, check_output, naming_output, sha256_file
from nsc_prune._validation import must_be
from nsc_prune._version import __version__
from nsc_prune._warn import warn
from nsc_prune.choices import COST_KINDS, PHASES, SCORE_ALIASES, SCORES, SELECTIONS, SENSITIVITY_TARGETS
from nsc_prune.cli import USAGE
from nsc_prune.cli.parser import (
    CommandParser,
    add_compute_arguments,
    add_deprecated_flag,
    add_removed_flag,
    check_ranks_agree_on_flags,
    compute_settings,
    deprecated_values,
    field_default,
    is_main_process,
    parse_overrides,
    path_value,
    show_default,
)
from nsc_prune.core.budget import format_cost, format_count, full_name
from nsc_prune.core.capacity import parse_init
from nsc_prune.core.latency_table import describe_backend
from nsc_prune.core.spec import model_params
from nsc_prune.errors import ConfigError, MissingDependencyError
from nsc_prune.hf.progress import quiet
from nsc_prune.hf.score.sensitivity import SensitivityConfig
from nsc_prune.plan import ParetoDocument, point_label, score_reading
from nsc_prune.planning import LatencySettings, PlanSearch, ScoreSettings, resolve_space, search_plan
from nsc_prune.plot import require_matplotlib, summarize_layers, write_plot

EXAMPLES = """examples:
  nsc-prune --model llama-7b --budget 5.7B                 # LoNAS space, params budget
  nsc-prune --model llama-7b --budget 1.4T --cost macs     # MACs at 256 tokens
  nsc-prune --model ./my-model --budget 85% --adapter ./lonas-adapter --out runs/a
  nsc-prune --space txl-wt103 --budget 40.32M              # a NAS space, no model needed
  nsc-prune --model smollm2-135m --space ffn-grid --cost latency --latency-table lut.json --budget 80%
                                                           # a measured latency budget (nsc-prune profile)
  nsc-prune models                                         # list presets
sub-commands: models, extract, eval, rank, heal, train-supernet, profile (nsc-prune COMMAND --help)"""


# The measured table's flags: flag, SensitivityConfig field, argparse settings
_TABLE_FLAGS = (
    ("--selection", "selection", {
        "choices": SELECTIONS, "help": "the channels extraction will keep (use the same for extract)"
    }),
    ("--calib-tokens", "calib_tokens", {"type": int, "help": "calibration tokens (as extract)"}),
    ("--calib-seq-len", "seq_len", {"type": int, "help": "tokens per calibration block (forward pass)"}),
    ("--sensitivity-target", "target", {
        "choices": SENSITIVITY_TARGETS,
        "help": "what the probes measure: kl, the KL divergence from the dense model's next-token distribution "
        "(no labels; better held-out plans, docs/sensitivity.md); loss, the LM loss increase on the text's own "
        "labels",
    }),
    ("--probe-depth", "probe_depth", {
        "type": int,
        "help": "a probe costs at most this many layers of its 512 tokens (early layers' probes run on "
        "fewer tokens), so the probes grow as L, not L^2; 0: every probe on all 512 (docs/sensitivity.md)",
    }),
    ("--probe-widths", "probe_widths", {
        "type": int,
        "choices": (1, 2),
        "help": "FFN widths a layer whose damage is probed: 1, the narrowest; 2, also the middle one (the widths "
        "between follow the block error through both); default 2 with kl, 1 with loss",
    }),
    ("--probe-stride", "probe_stride", {
        "type": int,
        "help": "a probe's damage is averaged over every k-th of its positions (all are carried through the "
        "layers): 2 halves the LM-head evaluations; 1: every position (with --probe-depth 8: better plans at "
        "about 1.5x the table's cost; docs/sensitivity.md)",
    }),
)  # fmt: skip


PATH_FLAGS = ("model", "adapter", "weights", "calib", "latency_table", "sensitivity_table", "table", "out")
"""The search's flags that name files: ranks on several nodes may name their own copies (what they hold is compared
where it is read). Not ``--space``: psi_W does not compare a space YAML's content."""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="nsc-prune",
        usage=USAGE.replace("|", "\n      "),
        description="Search the per-layer architecture that maximises Neural Spectral Capacity under a budget; "
        "prints the plan and writes the whole Pareto front.",
        epilog=EXAMPLES,
    )
    _add_model_arguments(parser)
    _add_cost_arguments(parser)
    _add_score_arguments(parser)
    _add_output_arguments(parser)
    parser.add_argument("--version", action="version", version=f"nsc-prune {__version__}")
    return parser


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """What is searched: the model, the space and the settings that change it."""
    parser.add_argument(
        "--model", help="preset name (nsc-prune models), a folder with config.json, or a hub id in the local HF cache"
    )
    show_default(
        parser.add_argument("--space", help="space name (configs/spaces) or YAML path"), "lonas when --model is given"
    )
    parser.add_argument(
        "--adapter", type=path_value, help="PEFT LoRA adapter folder: read r, lora_alpha, target_modules from it"
    )
    parser.add_argument(
        "--init",
        help="override the space's init: xavier, kaiming or a std such as 0.02 (psi_MP's, and psi_w's comparison "
        "with it; refused with --score measured)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a space YAML key, e.g. --set ffn_step=64 --set protect_layers=[0] (repeatable)",
    )


def _add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    """What the budget counts: params, MACs over --macs-tokens tokens, or a measured latency table."""
    parser.add_argument(
        "--budget", required=True, help="5.7B, 5700M, 85%% (of the full model), 1.4T; latency: 25ms, 0.4s, 70%%"
    )
    parser.add_argument(
        "--cost",
        choices=COST_KINDS,
        default="params",
        help="what the budget counts; latency: a measured table (--latency-table)",
    )
    show_default(
        parser.add_argument("--macs-tokens", type=int, help="tokens the MACs are counted over (--cost macs)"),
        "256, the LoNAS convention; image spaces: their patch tokens",
    )
    add_removed_flag(
        parser,
        "--seq-len",
        "is the training block length of heal and train-supernet; the search counts MACs over --macs-tokens N "
        "(and measures sensitivity in --calib-seq-len blocks)",
    )
    parser.add_argument(
        "--allow-above-full",
        action="store_true",
        help="accept a budget above the full model's cost (returns the full model; otherwise an error)",
    )
    latency = parser.add_argument_group("--cost latency (docs/speed.md)")
    latency.add_argument(
        "--latency-table",
        type=path_value,
        help="the table nsc-prune profile wrote for this model and space, on your machine",
    )
    latency.add_argument(
        "--latency-phase",
        choices=PHASES,
        default=field_default(LatencySettings, "phase"),
        help="decode: one generated token; prefill: the prompt's forward pass",
    )


def _add_score_arguments(parser: argparse.ArgumentParser) -> None:
    """What the DP maximises: psi_MP (config only), psi_W (--weights) or measured damage (--weights, --calib)."""
    parser.add_argument(
        "--score",
        type=deprecated_values("--score", SCORE_ALIASES),
        choices=SCORES,
        default=field_default(ScoreSettings, "backend"),
        help="psi_mp: closed-form psi_MP from the config; psi_w: psi_W from the real weights (--weights); "
        "measured: each layer option's measured damage on calibration text (--weights, --calib; elastic spaces)",
    )
    parser.add_argument("--weights", type=path_value, help="safetensors model folder for --score psi_w or measured")
    measured = parser.add_argument_group("--score measured (docs/sensitivity.md)")
    measured.add_argument(
        "--calib",
        type=path_value,
        help="calibration text file (plain UTF-8 text, not JSON; the text extract --calib will use)",
    )
    for flag, name, settings in _TABLE_FLAGS:
        measured.add_argument(flag, default=field_default(SensitivityConfig, name), **settings)
    measured.add_argument(
        "--sensitivity-shrink",
        type=float,
        default=field_default(ScoreSettings, "shrink"),
        metavar="W",
        help="solve on the table shrunk toward the layers' mean: (1 - W) x measured + W x each option's mean over the "
        "layers that have it (0 to 1; 0: the table as measured; 0.25 was level with the hand rule over six calibration windows, "
        "docs/sensitivity.md)",
    )
    measured.add_argument(
        "--refine",
        type=int,
        default=field_default(ScoreSettings, "refine"),
        help="plan-conditioned refinement, at most this many tables: re-measure every layer with the others cut as "
        "the plan says (measuring the plan too), solve again at the budget, repeat on the new plan until it was "
        "measured already; returns the measured plan with the least damage, so 2 is the least that can change the "
        "plan (each round about one table; docs/sensitivity.md)",
    )
    add_compute_arguments(measured, "--score measured (psi_W: its factorisations, always float64)")
    show_default(
        measured.add_argument("--sensitivity-table", type=path_value, help="sensitivity table file to reuse or write"),
        "the cache, keyed by weights, text, selection, grid",
    )
    add_deprecated_flag(measured, "--table", "--sensitivity-table")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the front goes and what is printed."""
    parser.add_argument("--quiet", action="store_true", help="no progress bars (measuring, psi_W)")
    show_default(
        parser.add_argument(
            "--out",
            type=path_value,
            help="output folder for pareto.json and pareto.png (the default folder is rewritten by the same search; "
            "an --out holding pareto.json only with --overwrite, docs/outputs.md)",
        ),
        "out/<model>-<space>, plus a part per setting that changes the front (e.g. -macs, -psi_w, -init-X, "
        "-set-KEY-VALUE, -adapter-NAME; docs/search.md lists them)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace pareto.json (and pareto.png) in --out")
    show_default(
        parser.add_argument(
            "--plot",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="write pareto.png (needs matplotlib; adds ~1 s)",
        ),
        "on with --out, off otherwise",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print pareto.json to stdout instead of the summary (writes files only with --out)",
    )


DEFAULT_OUT_NAME_MAX = 128  # bytes of the default folder's name; a longer one ends in a digest of the whole


def default_out_dir(args: argparse.Namespace, model_name: str | None, space_name: str) -> Path:
    """``out/<model>-<space>`` plus one part per setting that changes the front, so runs never replace each other."""
    parts = [model_name.replace("/", "--") if model_name else None, space_name]
    parts += [
        "macs" if args.cost == "macs" else None,
        f"latency-{args.latency_phase}" if args.cost == "latency" else None,
        f"table-{Path(args.latency_table).stem}" if args.latency_table else None,  # each point records its times
        f"seq{args.macs_tokens}" if args.macs_tokens else None,
        args.score if args.score != "psi_mp" else None,
        f"{args.selection}" if args.score == "measured" else None,
        *_score_input_parts(args, model_name),
        f"refine{args.refine}" if args.refine else None,
        f"shrink{args.sensitivity_shrink:g}" if args.sensitivity_shrink else None,
        f"init-{args.init}" if args.init else None,
    ]
    parts += [f"set-{item}" for item in args.set]
    parts += [f"adapter-{Path(args.adapter).resolve().name}" if args.adapter else None]
    joined = "-".join(filter(None, parts)).replace("=", "-").replace(",", "_")
    name = re.sub(r"[^\w.+-]+", "", joined).strip("-.") or "search"  # \w: a model named 模型 keeps its name
    if len(name.encode()) > DEFAULT_OUT_NAME_MAX:  # a long model name or many --set: past the file system's 255 bytes
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        while len(name.encode()) > DEFAULT_OUT_NAME_MAX - len(digest) - 1:
            name = name[:-1]
        name = f"{name}-{digest}"
    return Path("out") / name


def score_text(score: str, value: float) -> str:
    """The selected plan's DP value in words (``score_reading``: the name its ``--score`` gives it)."""
    reading = score_reading(score)
    if reading.sign < 0:  # measured: the damage, in nats
        return f"{reading.name} {reading.shown(value):.4g} {reading.unit} (sum of the layers' measured damage)"
    return f"{reading.name} {value:,.1f}"


def _score_input_parts(args: argparse.Namespace, model_name: str | None) -> list[str]:
    """The default folder's parts for what a psi_W or measured front was computed from: the weights (when their
    folder is not named as the model), the calibration text and every table setting not at its default."""
    if args.score == "psi_mp":
        return []
    weights = Path(args.weights).resolve().name if args.weights else None
    parts = [f"weights-{weights}" if weights and weights != model_name else None]
    if args.score == "measured":
        parts += [f"calib-{Path(args.calib).stem}" if args.calib else None]
        for flag, name, _ in _TABLE_FLAGS:
            value = getattr(args, flag[2:].replace("-", "_"))
            if name != "selection" and value != field_default(SensitivityConfig, name):
                parts.append(f"{flag[2:]}-{value}")
        parts += [args.calib_dtype if args.calib_dtype != "float32" else None]
    return [part for part in parts if part]


def _refuse_measured_flags(args: argparse.Namespace) -> None:
    """ConfigError naming the ``--score measured`` flags given to another score, which would ignore them."""
    given = ["--calib"] if args.calib is not None else []
    given += [
        flag
        for flag, name, _ in _TABLE_FLAGS
        if getattr(args, flag[2:].replace("-", "_")) != field_default(SensitivityConfig, name)
    ]
    if args.calib_dtype != "float32":
        if args.score == "psi_w":
            raise ConfigError("--calib-dtype applies to --score measured; psi_W's spectra are always float64")
        given.append("--calib-dtype")
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        needs = "" if given[0] == "--calib" else " (with --calib)"
        raise ConfigError(f"{' and '.join(given)} {verb} to --score measured{needs}; got --score {args.score}")


def score_settings(args: argparse.Namespace) -> ScoreSettings:
    """``--score`` and its inputs as the library's ``ScoreSettings`` (hf is imported only for ``measured``)."""
    sensitivity = None
    compute = compute_settings(args)
    if args.score == "measured" and args.calib is not None:
        sensitivity = SensitivityConfig(
            args.calib,
            selection=args.selection,
            calib_tokens=args.calib_tokens,
            seq_len=args.calib_seq_len,
            compute=compute,
            target=args.sensitivity_target,
            probe_depth=args.probe_depth,
            probe_widths=args.probe_widths,
            probe_stride=args.probe_stride,
        )
    elif args.score != "measured":
        _refuse_measured_flags(args)
    return ScoreSettings(
        args.score,
        args.weights,
        sensitivity,
        args.sensitivity_table,
        progress=not args.quiet,
        device=compute.device,
        refine=args.refine,
        shrink=args.sensitivity_shrink,
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The space YAML keys ``--set`` and ``--init`` replace."""
    overrides = parse_overrides(args.set)
    if args.init is not None:
        overrides["init"] = parse_init(args.init)
    return overrides


def _search(args: argparse.Namespace) -> PlanSearch:
    """The library search the flags ask for."""
    with quiet(args.quiet):
        return search_plan(
            args.model,
            args.budget,
            args.space,
            args.cost,
            seq_len=args.macs_tokens,
            overrides=_overrides(args),
            adapter=args.adapter,
            score=score_settings(args),
            allow_above_full=args.allow_above_full,
            latency=LatencySettings(args.latency_table, args.latency_phase) if args.latency_table else None,
        )


def _write(args: argparse.Namespace, found: PlanSearch, want_plot: bool) -> tuple[Path, Path | None]:
    """pareto.json (and pareto.png when asked for and possible) in --out or the default folder."""
    model, result, doc = found.model, found.result, found.document
    out_dir = Path(args.out) if args.out else default_out_dir(args, model.name if model else None, found.space.name)
    overwrite = args.overwrite or not args.out  # the default folder is rewritten; an --out was checked in run()
    if not want_plot:
        return _write_without_plot(doc, out_dir, overwrite), None
    pair = out_dir / PARETO_FILE, out_dir / PLOT_FILE
    try:
        # Both files at once, the plot drawn first: a Ctrl-C while it drew left a new pareto.json beside the last
        # run's pareto.png.
        with atomic_files(*pair, overwrite=overwrite, checked=True) as (written, drawn):
            with naming_output(pair[1]):  # a full disk's OSError names no file, or the hidden temporary
                write_plot(
                    result, found.selected, drawn, model=model.name if model else None, budget=doc.budget,
                    score=args.score,
                )  # fmt: skip
            with naming_output(pair[0]):
                written.write_text(doc.to_json(), encoding="utf-8")
    except MissingDependencyError as err:
        warn(f"{PLOT_FILE} not written: {err}")
        return _write_without_plot(doc, out_dir, overwrite), None
    return pair


def _dig(doc: Any, *keys: str) -> Any:
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _calibration_sha256(path: str) -> str:
    from nsc_prune.hf.cut.selection import calibration_sha256  # torch: --score measured only

    return calibration_sha256(path)


def _check_default_folder(args: argparse.Namespace) -> None:
    """Before the search: ConfigError when the default folder holds the front of another model, latency table,
    weights folder or calibration text of this run's name (the folder's name has only names). The same search
    rewrites its default folder, also after an input changed in place; so does one that names the same content at
    another path (a folder and its config.json)."""
    if args.out or args.overwrite or args.json:  # --json alone writes nothing
        return
    resolved, built = resolve_space(args.model, args.space, _overrides(args), args.adapter)
    out_dir = default_out_dir(args, resolved.name if resolved else None, built.name)
    try:
        earlier = json.loads((out_dir / PARETO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none, or unreadable: written as before
        return

    def fingerprint() -> str | None:
        from nsc_prune.hf.weights.fingerprint import SCHEME, weights_fingerprint  # torch: psi_w, measured only

        stored = _dig(earlier, "score", "weights_fingerprint")  # an older nsc-prune's cannot be compared
        return weights_fingerprint(Path(args.weights)) if str(stored).startswith(f"{SCHEME}:") else None

    weights, calib, table = (args.weights, args.calib, args.latency_table) if resolved else (None, None, None)
    checks = (  # what, this run's path (None: not given, or missing: the search says so), its path and content
        # there, this run's content
        ("model", resolved and resolved.source, ("model", "source"), ("model", "config"),
         lambda: json.loads(json.dumps(resolved.config))),
        ("latency table", table if table and Path(table).is_file() else None, ("cost", "latency_table", "path"),
         ("cost", "latency_table", "sha256"), lambda: sha256_file(table)),
        ("weights folder", weights if weights and Path(weights).is_dir() else None, ("score", "weights"),
         ("score", "weights_fingerprint"), fingerprint),
        ("calibration text", calib if calib and Path(calib).is_file() else None, ("score", "calib"),
         ("score", "calib_sha256"), lambda: _calibration_sha256(calib)),
    )  # fmt: skip
    for what, ours, path, content, our_content in checks:
        before = _dig(earlier, *path)
        if ours is None or before is None or before == ours or before == str(Path(ours).resolve()):
            continue
        if content and _dig(earlier, *content) is not None and _dig(earlier, *content) == our_content():
            continue  # the same content named another way
        raise ConfigError(
            f"{out_dir} holds the front of another {what} ({before}), of this run's name; pass --out DIR for this "
            "one, or --overwrite to replace it"
        )


def _write_without_plot(doc: ParetoDocument, out_dir: Path, overwrite: bool) -> Path:
    """pareto.json alone; a pareto.png already in the folder (an earlier run's, or yours) is left, and said to be
    another front's."""
    written = doc.write(out_dir, overwrite, checked=True)  # checked in run(), before the search
    if (out_dir / PLOT_FILE).exists():
        warn(f"{out_dir / PLOT_FILE} is not this front's plot (an earlier run's, or yours); left as it is")
    return written


def _number_of(count: int) -> str:
    """``4.96e+75``: a count in three digits, also past a float's range (a space of 1,000 layers)."""
    if count < 1e300:
        return f"{float(count):.3g}"
    exponent = math.floor(math.log10(count))
    mantissa = float(f"{count / 10**exponent:.3g}")  # 9.9996 rounds to 10: one more power of ten
    if mantissa >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{mantissa:.3g}e+{exponent}"


def _widest_is_model(found: PlanSearch) -> bool:
    """Whether the front's full cost is the model's (pareto.json's ``cost.full_is_model``, as the search set it)."""
    return bool(found.document.cost["full_is_model"])


def _print_plan(args: argparse.Namespace, found: PlanSearch, seconds: float) -> None:
    """The selected plan, its cost and score, and the front, in words."""
    result, space, model, doc, selected = found.result, found.space, found.model, found.document, found.selected
    first, last = result.points[0], result.points[-1]
    point = result.points[selected]
    header = f"{model.name} ({model.config.get('model_type')}, {len(point.layers)} layers)" if model else space.name
    print(
        f"nsc-prune {__version__}: {header}; space {space.name!r}: {space.description} "
        f"({_number_of(space.size)} architectures)"
    )
    print(f"cost: {args.cost} = {doc.cost['convention']}")
    print(
        f"budget {args.budget} -> {format_cost(found.budget, args.cost)} {args.cost}; "
        f"{point_label(selected, len(result.points))} on the Pareto front"
    )
    if point.choice:
        print("network: " + ", ".join(f"{k} {v}" for k, v in point.choice.items()))
    print(f"plan: {summarize_layers(point.layers, space)}")
    full = format_count(found.full.params)
    if not _widest_is_model(found):  # a space whose widths stop below the model's: the percentage is of its widest plan
        full = f"the widest plan's {full}; the model has {format_count(model_params(model.config))}"
    macs = format_count(point.macs)
    if args.cost == "macs":  # the budget's own share beside the params' (the two differ)
        macs += f" ({100 * point.macs / found.full.macs:.1f}% of {format_count(found.full.macs)})"
    print(
        f"params {format_count(point.params)} ({100 * point.params / found.full.params:.1f}% of {full}), "
        f"MACs {macs} {space.macs_note(result.seq_len)}, {score_text(args.score, point.nsc)}"
    )
    reading = score_reading(args.score)
    print(
        f"front: {len(result.points)} points {reading.goal} {reading.name} "
        f"from {format_cost(result.cost_of(first), args.cost)} to "
        f"{format_cost(result.cost_of(last), args.cost)} "
        f"{args.cost}; "
        f"search {1000 * result.seconds:.0f} ms, total {1000 * seconds:.0f} ms"
    )


def _print_score_notes(args: argparse.Namespace, found: PlanSearch) -> None:
    """What the latency table predicts and where the non-default scores came from."""
    result = found.result
    point, full = result.points[found.selected], found.full
    if point.latency_us is not None:
        backend = describe_backend(found.document.cost["latency_table"].get("backend") or {})
        print(
            f"predicted {args.latency_phase} latency {format_cost(point.latency_us, 'latency')} "
            f"({100 * point.latency_us / full.latency_us:.1f}% of "
            f"{full_name(_widest_is_model(found))}'s "
            f"{format_cost(full.latency_us, 'latency')}; {backend}, table {args.latency_table})"
        )
    if args.score == "measured":
        info = found.score
        kept = "read from the file" if args.sensitivity_table else "read from the cache"  # yours, or the cache's
        how = kept if info["cache_hit"] else f"measured in {info['seconds']:.1f} s"
        processes = f", {info['processes']} processes" if info.get("processes", 1) > 1 else ""
        print(
            f"sensitivity table {info['table']}: {how}, {info['calib_tokens']} tokens of {info['calib']}, "
            f"selection {info['selection']}{processes}"
        )
        if "refinement" in info:
            refinement = info["refinement"]
            damage = " -> ".join(f"{r['plan_damage']:.4g}" for r in refinement["rounds"])
            state = "converged" if refinement["converged"] else "not converged"
            print(
                f"refinement: {len(refinement['rounds'])} rounds ({state}); measured damage of each round's plan "
                f"{damage} {score_reading(args.score).unit} on the probe tokens; kept the least"
            )
    if args.score == "psi_w":
        report = found.score["consistency_vs_psi_mp"]
        tau, rho = report["kendall_tau"], report["spearman_rho"]
        ranks = (
            f"Kendall tau {tau:.4f}, Spearman rho {rho:.4f}"
            if tau is not None and rho is not None
            else "Kendall tau and Spearman rho undefined (one score is constant over the front, or it has one point)"
        )
        print(
            f"psi_W vs psi_MP over {report['points']} psi_MP Pareto points: {ranks}, "
            f"histogram match {100 * report['histogram_match']:.1f}%, "
            f"psi_W-oracle regret mean {100 * report['regret_mean']:.3f}% max {100 * report['regret_max']:.3f}%"
        )


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    check_ranks_agree_on_flags("the search", args, PATH_FLAGS)  # before any rank takes a path the others do not
    if args.model is None and args.space is None:
        raise ConfigError("pass --model (a preset, folder or cached hub id) or --space (a NAS space such as txl-wt103)")
    want_plot = args.plot if args.plot is not None else args.out is not None
    if args.macs_tokens is not None and not args.macs_tokens > 0:  # 0 was read as the default, 256
        raise ConfigError(must_be("--macs-tokens", "a positive integer", args.macs_tokens))
    if args.plot and args.json and not args.out:
        raise ConfigError("--plot with --json writes pareto.png only into --out: add --out DIR, or drop --plot")
    if args.overwrite and args.json and not args.out:  # --json alone writes no file
        raise ConfigError("--overwrite with --json would be ignored: --json alone writes no file; add --out DIR")
    if args.latency_phase != field_default(LatencySettings, "phase") and not args.latency_table:
        raise ConfigError(f"--latency-phase {args.latency_phase} applies to --cost latency with --latency-table FILE")
    if args.plot:  # asked for explicitly: refuse before searching or writing anything
        require_matplotlib()
    if args.out:  # docs/outputs.md: the default folder is rewritten, a folder you name only with --overwrite
        read = (args.model, args.weights, args.calib, args.latency_table, args.adapter, args.sensitivity_table)
        space = user_path(args.space) if args.space else None  # read so (spaces.registry)
        read += (space,) if space and space.is_file() else ()  # a space YAML of yours
        for name in (PARETO_FILE, PLOT_FILE) if want_plot else (PARETO_FILE,):
            if (Path(args.out) / name).is_dir():
                raise ConfigError(f"--out {args.out} holds a folder named {name}, the file the search writes there")
            check_output(Path(args.out) / name, read, args.overwrite, marker=None)
    _check_default_folder(args)
    found = _search(args)
    if not is_main_process():  # every rank of a torchrun / accelerate launch run holds the same plan; one writes it
        return 0
    if found.above_full:
        full = found.result.cost_of(found.full)
        whole = full_name(_widest_is_model(found))
        warn(
            f"budget {format_cost(found.budget, args.cost)} {args.cost} is above {whole} "
            f"({format_cost(full, args.cost)}); returning {whole}"
        )
    if args.json and not args.out:
        sys.stdout.write(found.document.to_json())
        return 0
    pareto_path, plot_path = _write(args, found, want_plot)
    if args.json:
        sys.stdout.write(found.document.to_json())
        return 0
    _print_plan(args, found, time.perf_counter() - start)
    _print_score_notes(args, found)
    print(f"wrote {pareto_path}" + (f" and {plot_path}" if plot_path else ""))
    return 0
