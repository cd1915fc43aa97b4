"""``nsc-prune eval``: zero-shot commonsense evaluation of checkpoints with lm-eval (thin wrapper)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from nsc_prune._io import existing_file, read_yaml
from nsc_prune.choices import EVAL_BACKENDS, EVAL_DTYPES
from nsc_prune.cli.parser import CommandParser, path_value, show_default
from nsc_prune.errors import ConfigError, InvalidInputError, require, require_installed
from nsc_prune.hf.progress import plain_bars, quiet_logger

EXAMPLES = """\
examples:
  nsc-prune eval base/ ckpt-a/ ckpt-b/ --tasks commonsense8 --out runs/eval
  nsc-prune eval base/ ckpt-a/ --tasks commonsense8_offline --limit 20 --device cpu
  nsc-prune eval ckpt/ --tasks boolq,piqa,arc_easy --batch-size auto --dtype bfloat16
  nsc-prune eval ckpt/ --tasks my_tasks/               # every task YAML in a folder (or one file, read alone)
  nsc-prune eval big/ --device-map auto                 # shard a model larger than one GPU
  accelerate launch --multi_gpu --num_processes 8 -m nsc_prune eval ckpt/   # one process per GPU
  nsc-prune eval ckpt-nas/ --backend vllm --tensor-parallel-size 2 --data-parallel-size 4   # vLLM (pip install vllm)

--tasks: commonsense8 (boolq, piqa, social_iqa, hellaswag, winogrande, arc_easy, arc_challenge,
openbookqa; datasets from the Hugging Face cache), commonsense8_offline (the project's small
offline sets in evals/), lm-eval task/group/tag names (comma-separated), a task YAML file or a
folder of them. Avg8 uses acc_norm for hellaswag, arc_challenge, openbookqa and acc for the rest;
recovery is Avg / Avg of the base (--base, or the folder the pruned checkpoints were extracted from).
Precedence: flags > --config YAML > defaults.
"""


def _limit(text: str) -> int | float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--limit must be a number; got {text!r}") from err
    return int(value) if value.is_integer() else value  # a bad whole number is shown as typed (-3, not -3.0)


def _batch(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def build_parser() -> argparse.ArgumentParser:
    from nsc_prune.eval.runner import EvalConfig  # torch-free: the defaults shown come from the dataclass

    defaults = {field.name: field.default for field in fields(EvalConfig)}
    parser = CommandParser(
        prog="nsc-prune eval",
        description="Evaluate checkpoints zero-shot on the eight commonsense tasks (or any lm-eval tasks); "
        "writes results.json and results.md (a table like the paper's Table 4).",
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "checkpoints",
        nargs="+",
        metavar="CKPT",
        type=path_value,
        help="checkpoint folders (pruned by nsc-prune, or a stock HF causal LM)",
    )
    parser.add_argument("--tasks", action="append", help="commonsense8 | commonsense8_offline | NAMES | PATH")
    parser.add_argument(
        "--limit", type=_limit, help="first N documents per task (or a fraction < 1); for tests and demos"
    )
    parser.add_argument(
        "--device", help="auto, cpu, cuda, cuda:N or mps (Apple); asking for one that is absent is an error"
    )
    parser.add_argument("--dtype", choices=EVAL_DTYPES, help="auto: bf16 on a GPU that computes it natively, else fp32")
    parser.add_argument("--batch-size", type=_batch, help="sequences per forward pass: an int, or auto / auto:N")
    parser.add_argument("--max-batch-size", type=int, help="upper bound for --batch-size auto")
    parser.add_argument(
        "--device-map", choices=("auto",), help="auto: spread the model over all visible GPUs (and CPU)"
    )
    parser.add_argument("--num-fewshot", type=int, help="few-shot examples")
    parser.add_argument("--seed", type=int, help="seed for lm-eval")
    parser.add_argument(
        "--bootstrap-iters",
        type=int,
        help="lm-eval's resamples for a stderr without a closed form (mcc, f1); 0: no stderr at all",
    )
    parser.add_argument("--base", help="which of the CKPT arguments is the base (its label or folder), for recovery")
    parser.add_argument("--config", type=path_value, help="YAML file with EvalConfig fields (flags override it)")
    parser.add_argument(
        "--out", type=path_value, default="out/eval", help="output folder for results.json and results.md"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument("--verbose", action="store_true", help="show lm-eval's logs and per-request progress bars")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    vllm = parser.add_argument_group("vLLM backend (--backend vllm; needs vllm and a CUDA GPU)")
    vllm.add_argument("--backend", choices=EVAL_BACKENDS, help="hf: in-process transformers; vllm: lm-eval's VLLM")
    vllm.add_argument("--tensor-parallel-size", type=int, help="GPUs one model is split over")
    vllm.add_argument("--data-parallel-size", type=int, help="model replicas, run by lm-eval with ray")
    vllm.add_argument("--gpu-memory-utilization", type=float, help="fraction of GPU memory vLLM may use")
    show_default(
        vllm.add_argument("--max-model-len", type=int, help="context length vLLM reserves KV cache for"), "the model's"
    )
    for action in parser._actions:  # the flags' None means "not given": --config, then EvalConfig's default
        if action.dest in defaults and action.default is None and not hasattr(action, "shown_default"):
            show_default(action, defaults[action.dest])
    return parser


def _config(args: argparse.Namespace):
    from nsc_prune.eval.runner import EvalConfig

    data = {}
    if args.config:
        path = existing_file(args.config, "--config", "pass a YAML file of EvalConfig fields")
        loaded = read_yaml(path, "--config") or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config {path} must hold a mapping of EvalConfig fields")
        data.update(loaded)
    for f in fields(EvalConfig):
        value = getattr(args, f.name, None)
        if value is not None:
            data[f.name] = value
    return EvalConfig.from_dict(data)


QUIET_LOGGERS = (
    "lm_eval",
    "transformers",
    "datasets",
    "accelerate",
    "huggingface_hub",
    "urllib3",
    "httpx",
    "filelock",
    "fsspec",
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the terminal to one progress bar and, on failure, one error line: library logs at ERROR while the
    command runs, and as they were afterwards (``main`` may be called in a notebook or a test process).

    huggingface_hub's "Retrying in Ns [Retry k/5]" warnings (a dataset that is neither cached nor
    reachable) go too. huggingface_hub and datasets set their loggers' level when imported, so they are
    imported first. The bars lm-eval opens without a ``disable`` argument are off (``plain_bars``; ours pass
    one).
    """
    transformers = require("transformers", "hf")
    require("huggingface_hub", "hf")
    datasets_logging = require("datasets", "eval").utils.logging  # "Generating test split" of a user task's JSON
    hf_logging = transformers.utils.logging
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    dataset_bars = datasets_logging.is_progress_bar_enabled()
    try:
        with contextlib.ExitStack() as quieted:  # the loggers' levels come back first, then transformers' verbosity
            quieted.enter_context(plain_bars(shown=False))
            for name in QUIET_LOGGERS:
                quieted.enter_context(quiet_logger(name, logging.ERROR))
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
            datasets_logging.disable_progress_bar()
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if dataset_bars:
            datasets_logging.enable_progress_bar()


@contextlib.contextmanager
def _lm_eval_logs() -> Iterator[None]:
    """``--verbose``: lm-eval's log records from INFO up on stderr while the command runs. lm-eval attaches no
    handler of its own outside its CLI, so Python's last resort showed its warnings and nothing else."""
    logger = logging.getLogger("lm_eval")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def run(args: argparse.Namespace) -> int:
    if args.verbose and args.quiet:  # --verbose showed every bar --quiet asked to hide
        raise InvalidInputError("--verbose shows lm-eval's logs and progress bars, --quiet hides them: pass one")
    if args.backend == "vllm":
        from nsc_prune.eval.runner import require_vllm

        require_vllm()  # before any other work
    require_installed("torch", "eval")
    require_installed("lm_eval", "eval")  # named before anything is imported
    with _lm_eval_logs() if args.verbose else _quiet():
        require("lm_eval", "eval")
        from nsc_prune.eval.report import RESULTS_JSON, RESULTS_MD, render_markdown
        from nsc_prune.eval.runner import evaluate_checkpoints

        config = _config(args)
        # stdout carries the table alone: lm-eval print()s ("Detecting largest batch size" with --batch-size auto)
        with contextlib.redirect_stdout(sys.stderr):
            doc = evaluate_checkpoints(
                args.checkpoints,
                config,
                out=args.out,
                overwrite=args.overwrite,
                progress=not args.quiet,  # a bar on a terminal, lines in a log (cli._output_streams)
                verbose=args.verbose,
            )
    if doc is None:  # a non-zero rank of a data-parallel run
        return 0
    sys.stdout.write(render_markdown(doc))
    total = sum(c["wall_s"] for c in doc["checkpoints"])
    reused = doc["provenance"].get("reused_checkpoints") or []
    print(
        f"\nwrote {Path(args.out) / RESULTS_JSON} and {RESULTS_MD} "
        f"({len(doc['checkpoints'])} checkpoint(s), {total:.1f} s"
        + (f"; {', '.join(reused)} finished by an earlier run of this command, read back" if reused else "")
        + ")"
    )
    return 0
