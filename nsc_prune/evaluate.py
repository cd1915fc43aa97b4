"""Zero-shot evaluation of checkpoints with lm-evaluation-harness: per-task metrics, Avg8, recovery.

Two levels, as in lm-eval (``simple_evaluate`` over ``evaluate``):

- pure parts: ``task_record`` (one lm-eval result -> our record), ``summarise`` (Avg and recovery),
  ``render_markdown`` (the paper's Table 4 shape), ``find_base``;
- ``evaluate_model`` runs built tasks on one in-memory model through ``HFLM``;
- ``check_checkpoint`` preflights a folder (config, model_type, safetensors shapes against the config)
  without loading it; ``load_checkpoint`` loads a pruned checkpoint with ``nsc_prune.extract.load_pruned``
  (no remote code) and a stock one with ``AutoModelForCausalLM`` (``trust_remote_code=False``);
- ``evaluate_checkpoints`` resolves tasks, preflights every checkpoint, then loads and evaluates each
  in turn, and writes ``results.json`` + ``results.md``.

Avg8 convention: acc_norm for hellaswag, arc_challenge and openbookqa, acc for the other five
(``nsc_prune.tasks.headline_metric``); recovery = Avg(checkpoint) / Avg(base). The results schema is
documented in docs/evaluate.md.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from nsc_prune.budget import format_count
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError, require
from nsc_prune.extract_files import RECORD_NAME
from nsc_prune.io import atomic_dir, atomic_write_text, provenance, read_json_object, to_json
from nsc_prune.tasks import (
    SHORT_NAMES, TaskSet, average, avg_label, canonical_task, describe_tasks, headline_metric, resolve_tasks,
)  # fmt: skip

SCHEMA = "nsc-prune/eval-results/1"
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
DTYPES = ("auto", "float32", "bfloat16", "float16")
METRICS = ("acc", "acc_norm")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def _check(ok: bool, name: str, expected: str, got: Any) -> None:
    if not ok:
        raise InvalidInputError(f"The {name!r} parameter must be {expected}. Got {got!r} instead.")


@dataclass(frozen=True)
class EvalConfig:
    """Options of one evaluation run (flags > --config YAML > these defaults)."""

    tasks: tuple[str, ...] = ("commonsense8",)  # names, aliases, YAML files or folders (nsc_prune.tasks)
    limit: int | float | None = None  # first N documents per task (or a fraction < 1); None: all
    device: str = "auto"  # auto (cuda when present), cpu, cuda, cuda:N
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    batch_size: int | str = 8  # an int, or "auto" / "auto:N" (lm-eval finds the largest that fits)
    max_batch_size: int = 64  # upper bound for "auto"
    device_map: str | None = None  # "auto": shard a model larger than one GPU across the visible GPUs
    num_fewshot: int = 0  # zero-shot, as in the paper
    seed: int = 1234  # python, numpy, torch and few-shot seeds given to lm-eval
    base: str | None = None  # label or path of the unpruned base among the checkpoints (default: detected)

    def __post_init__(self) -> None:
        tasks = (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks)
        object.__setattr__(self, "tasks", tasks)
        limit, batch = self.limit, self.batch_size
        _check(bool(tasks) and all(isinstance(t, str) and t.strip() for t in tasks), "tasks", "non-empty task names or paths", self.tasks)
        _check(limit is None or isinstance(limit, int | float) and (limit >= 1 and float(limit).is_integer() or 0 < limit < 1),
               "limit", "a whole number >= 1 or a fraction in (0, 1)", limit)  # fmt: skip
        if limit is not None and limit >= 1:
            object.__setattr__(self, "limit", int(limit))
        _check(isinstance(self.device, str) and bool(re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device)), "device", "auto, cpu, cuda or cuda:N", self.device)
        _check(self.dtype in DTYPES, "dtype", f"one of {DTYPES}", self.dtype)
        _check(isinstance(batch, int) and batch >= 1 or isinstance(batch, str) and bool(re.fullmatch(r"auto(:\d+)?", batch)),
               "batch_size", "an int >= 1, 'auto' or 'auto:N'", batch)  # fmt: skip
        _check(self.device_map in (None, "auto"), "device_map", "None or 'auto'", self.device_map)
        _check(isinstance(self.max_batch_size, int) and self.max_batch_size >= 1, "max_batch_size", "an int >= 1", self.max_batch_size)
        for name in ("num_fewshot", "seed"):
            _check(isinstance(getattr(self, name), int) and getattr(self, name) >= 0, name, "an int >= 0", getattr(self, name))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalConfig:
        """Build from a mapping (a --config YAML); unknown keys are refused with the known ones listed."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown eval config keys {unknown}; known keys: {sorted(known)}")
        return cls(**dict(data))


# ----------------------------------------------------------------------------------------- pure parts


def task_record(raw: Mapping[str, Any], task: str) -> dict[str, Any]:
    """One task's entry from an lm-eval results dict (``evaluate``, ``simple_evaluate``): acc/acc_norm (+stderr), n, version."""
    metrics = raw["results"][task]
    record: dict[str, Any] = {}
    for key, value in metrics.items():
        name, _, filt = key.partition(",")
        if filt != "none" or name in ("alias", "name", "sample_len"):
            continue
        record[name] = None if value in ("N/A", None) else float(value)
    reported = [m for m in record if not m.endswith("_stderr")]
    n = raw.get("n-samples", {}).get(task, {})
    record.update(
        metric=headline_metric(task, reported),
        n=n.get("effective"),
        n_total=n.get("original"),
        version=raw.get("versions", {}).get(task),
    )
    return record


def summarise(checkpoints: list[dict[str, Any]], base: int | None) -> list[dict[str, Any]]:
    """Add ``avg`` and ``recovery`` (= avg / base avg; None without a base) to each checkpoint record."""
    out = [{**c, "avg": average(c["results"])} for c in checkpoints]
    base_avg = out[base]["avg"] if base is not None else None
    for record in out:
        ok = base_avg not in (None, 0) and record["avg"] is not None
        record["recovery"] = record["avg"] / base_avg if ok else None
    return out


def find_base(paths: Sequence[Path], labels: Sequence[str], explicit: str | None = None) -> int | None:
    """Index of the base model: ``explicit`` (a label or path), else the folder that the pruned
    checkpoints name as their base in ``nsc_prune_extract.json``; None when neither applies."""
    resolved = [p.resolve() for p in paths]
    if explicit is not None:
        if explicit in labels:
            return list(labels).index(explicit)
        if Path(explicit).resolve() in resolved:
            return resolved.index(Path(explicit).resolve())
        raise InvalidInputError(f"The 'base' parameter must be one of the checkpoints {list(labels)}. Got {explicit!r} instead.")
    named = set()
    for path in paths:
        record = path / RECORD_NAME
        if record.is_file():
            base = json.loads(record.read_text()).get("provenance", {}).get("base")
            if base and Path(base).resolve() in resolved:
                named.add(resolved.index(Path(base).resolve()))
    return named.pop() if len(named) == 1 else None


def checkpoint_labels(paths: Sequence[Path]) -> list[str]:
    """Folder names, made unique with their parent folder (then an index) where they clash."""
    names = [p.name or p.resolve().name for p in paths]  # as given (a symlink keeps its own name)
    labels = [f"{p.absolute().parent.name}/{n}" if names.count(n) > 1 else n for p, n in zip(paths, names)]
    return [f"{lab}#{i}" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels)]


def _pct(value: float | None, stderr: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.2f}" + (f" ± {100 * stderr:.2f}" if stderr is not None else "")


def render_markdown(doc: Mapping[str, Any]) -> str:
    """results.md: a table shaped like the paper's Table 4, then acc/acc_norm ± stderr per task."""
    tasks, label = doc["tasks"], doc["avg_label"]
    heads = [SHORT_NAMES.get(canonical_task(t) or "", t) for t in tasks]
    lines = [
        "| Model | Params | " + " | ".join(heads) + f" | {label} | Recovery |",
        "|---|---:|" + "---:|" * (len(tasks) + 2),
    ]
    base = doc.get("base")
    for c in doc["checkpoints"]:
        name = c["label"] + (" (base)" if c["label"] == base else "")
        cells = [_pct(c["results"][t].get(c["results"][t]["metric"])) for t in tasks]
        rec = f"{100 * c['recovery']:.2f}%" if c["recovery"] is not None else "-"
        lines.append(f"| {name} | {format_count(c['params'])} | " + " | ".join(cells) + f" | {_pct(c['avg'])} | {rec} |")
    metrics = ", ".join(f"{t}: {doc['task_info'][t]['metric']}" for t in tasks)
    run = doc["config"]
    lines += [
        "",
        (
            f"Zero-shot accuracy in %. {label} = unweighted mean of the per-task metric ({metrics}); "
            "recovery = Avg / Avg of the base."
        ),
        (
            f"lm-eval {doc['provenance']['lm_eval_version']}, limit {run['limit']}, device {doc['device']}, "
            f"dtype {doc['dtype']}, batch size {run['batch_size']}, seed {run['seed']}."
        ),
        "",
        "| Model | Task | acc | acc_norm | n | s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for c in doc["checkpoints"]:
        for t in tasks:
            r = c["results"][t]
            cells = [_pct(r.get(m), r.get(f"{m}_stderr")) for m in METRICS]
            lines.append(f"| {c['label']} | {t} | {cells[0]} | {cells[1]} | {r['n']} | {r['wall_s']:.1f} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- model side


def world_size() -> int:
    """Processes of a data-parallel run (``WORLD_SIZE``, set by ``accelerate launch`` and ``torchrun``); 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_device(device: str) -> str:
    """'auto' -> cuda when available else cpu; a CUDA device that is absent is an error, not a fallback."""
    torch = require("torch", "hf")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "mps" and not torch.backends.mps.is_available():
        raise InvalidInputError("--device mps was asked for but MPS is not available; pass --device cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InvalidInputError(
                f"--device {device} was asked for but CUDA is not available (torch {torch.__version__}, "
                f"built for CUDA {torch.version.cuda}); pass --device cpu or install a CUDA build of torch"
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise InvalidInputError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        local = os.environ.get("LOCAL_RANK")
        if device == "cuda" and local is not None and world_size() > 1:
            device = f"cuda:{local}"  # one GPU per process under accelerate launch
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """'auto' -> bfloat16 on a GPU that supports it, float32 otherwise."""
    torch = require("torch", "hf")
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") and torch.cuda.is_bf16_supported() else "float32"


PRUNED, STOCK = "pruned", "stock"  # how a checkpoint loads: nsc_prune.load_pruned, or AutoModelForCausalLM


def read_config(path: Path) -> dict[str, Any]:
    """A checkpoint's config.json as a dict (a typed error when it is absent or not a JSON object)."""
    if not path.is_dir():
        raise InvalidInputError(f"checkpoint {path} does not exist or is not a folder")
    if not (path / "config.json").is_file():
        raise InvalidInputError(f"checkpoint {path} is not a model folder (no config.json)")
    return read_json_object(path / "config.json")


def checkpoint_kind(path: Path, config: Mapping[str, Any]) -> str:
    """PRUNED for a folder written by ``nsc-prune extract`` (its record file, or ``auto_map`` naming the
    shipped modeling file), STOCK for a causal LM whose ``model_type`` transformers ships; anything else
    is refused, naming the model_type."""
    from nsc_prune.modeling import MODELING_FILE

    model_type = config.get("model_type")
    shipped = str((config.get("auto_map") or {}).get("AutoModelForCausalLM", "")).startswith(f"{MODELING_FILE.stem}.")
    if (path / RECORD_NAME).is_file() or shipped:
        from nsc_prune.modeling.modeling_nsc_llama import MODEL_CLASSES

        if model_type not in MODEL_CLASSES:
            raise UnsupportedArchitectureError(
                f"checkpoint {path} was written by nsc-prune but has model_type {model_type!r}; expected one of "
                f"{sorted(MODEL_CLASSES)}. Fix config.json or re-extract the checkpoint"
            )
        return PRUNED
    transformers = require("transformers", "hf")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal_lms

    if model_type not in causal_lms:
        close = difflib.get_close_matches(str(model_type), list(causal_lms), n=3, cutoff=0.6)
        raise UnsupportedArchitectureError(
            f"checkpoint {path} has model_type {model_type!r}, which is not a causal LM that transformers "
            f"{transformers.__version__} ships{f' (close matches: {close})' if close else ''}. nsc-prune eval loads "
            "checkpoints written by nsc-prune extract and stock Hugging Face causal LMs (e.g. 'llama', 'qwen2', "
            "'mistral'); it never runs a checkpoint's remote code"
        )
    return STOCK


def check_shapes(path: Path, kind: str, found: Mapping[str, Any]) -> None:
    """Fail on the first tensor the model config.json implies (built on the meta device: no memory)
    that the safetensors headers ``found`` lack, hold with another shape, or hold in excess."""
    transformers = require("transformers", "hf")
    from nsc_prune.checkpoint import meta_shapes, shape_problems

    try:
        config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False)
        if kind == PRUNED:
            from nsc_prune.modeling.modeling_nsc_llama import MODEL_CLASSES

            expected, tied = meta_shapes(lambda: MODEL_CLASSES[config.model_type](config))
        else:
            expected, tied = meta_shapes(lambda: transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False))
    except Exception as err:
        raise ConfigError(f"checkpoint {path}: transformers cannot build a model from config.json: {type(err).__name__}: {err}") from err
    problems = shape_problems(expected, tied, {name: tuple(info.shape) for name, info in found.items()})
    if "mis-shaped" in problems:
        name = problems["mis-shaped"][0]
        raise ConfigError(
            f"checkpoint {path} does not match its config.json: tensor {name} should be {list(expected[name])} "
            f"but the weights hold {list(found[name].shape)} ({len(problems['mis-shaped'])} mismatching tensor(s)); "
            "re-extract the checkpoint or fix config.json"
        )
    if "missing" in problems:
        name = problems["missing"][0]
        raise ConfigError(
            f"checkpoint {path} lacks tensor {name} (shape {list(expected[name])}) that its config.json "
            f"implies ({len(problems['missing'])} missing); the checkpoint is incomplete"
        )
    if "unexpected" in problems and kind == PRUNED:  # stock checkpoints may carry tensors transformers ignores
        raise ConfigError(
            f"checkpoint {path} holds tensor {problems['unexpected'][0]} that its config.json does not describe "
            f"({len(problems['unexpected'])} extra); re-extract the checkpoint or fix config.json"
        )


def check_checkpoint(path: Path) -> str:
    """Preflight before anything loads; returns the checkpoint's kind (PRUNED or STOCK).

    config.json readable and of a supported model_type, safetensors present and whole (pickles refused),
    every tensor's shape in the safetensors headers as config.json implies, tokenizer files present.
    """
    from nsc_prune.checkpoint import index_model_dir

    config = read_config(path)
    kind = checkpoint_kind(path, config)
    found = index_model_dir(path)  # safetensors present and whole; refuses pickles
    if not config.get("quantization_config"):  # packed quantized weights do not have the config's shapes
        check_shapes(path, kind, found)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise InvalidInputError(f"checkpoint {path} has no tokenizer ({' or '.join(TOKENIZER_FILES)}); copy it from the base model")
    return kind


def load_checkpoint(path: Path, kind: str, dtype: str, device: str, device_map: str | None = None) -> tuple[Any, Any]:
    """Model and tokenizer of a checkpoint folder that passed ``check_checkpoint``, on ``device``.

    PRUNED: ``nsc_prune.load_pruned`` (the package's own class, no remote code). STOCK:
    ``AutoModelForCausalLM`` from safetensors with ``trust_remote_code=False``; a missing or mis-shaped
    tensor is an error, never silently re-initialised.
    """
    torch = require("torch", "hf")
    transformers = require("transformers", "hf")
    from nsc_prune.extract import load_pruned

    try:
        if kind == PRUNED:
            model = load_pruned(path, dtype=getattr(torch, dtype), device_map=device_map)
        else:
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, dtype), device_map=device_map, use_safetensors=True, trust_remote_code=False,
                output_loading_info=True,
            )  # fmt: skip
            problems = {k: sorted(map(str, info[k])) for k in ("missing_keys", "mismatched_keys", "error_msgs") if info.get(k)}
            if problems:
                raise ConfigError(f"checkpoint {path} does not match its config.json: {problems}")
            model.eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    except (InvalidInputError, ConfigError):
        raise
    except Exception as err:
        raise ConfigError(f"checkpoint {path} could not be loaded: {type(err).__name__}: {err}") from err
    return (model if device_map else model.to(device)), tokenizer


def _distribute(lm: Any) -> None:
    """Data parallelism under ``accelerate launch``: lm-eval shards requests by ``lm.rank``."""
    if world_size() <= 1:
        return
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=lm.device.type == "cpu")  # cpu=True: gloo process group (torchrun on CPU)
    lm.accelerator, lm._rank, lm._world_size = accelerator, accelerator.process_index, accelerator.num_processes


def _total(lm: Any, count: int) -> int:
    """Sum of ``count`` over the ranks of a data-parallel run (``count`` itself otherwise)."""
    if lm.world_size <= 1:
        return count
    torch = require("torch", "hf")
    return int(lm.all_gather(torch.tensor([count], device=lm.device)).sum())


def evaluate_model(
    model: Any,
    tokenizer: Any,
    tasks: TaskSet,
    config: EvalConfig,
    on_task: Callable[[str], None] | None = None,
    request_bars: bool = False,
) -> dict[str, dict[str, Any]] | None:
    """Run every task of ``tasks`` on an in-memory model through ``HFLM`` and ``lm_eval.evaluator.evaluate``.

    One task at a time (for the progress bar and per-task wall time), with the set-up that
    ``simple_evaluate`` does (seeds, num_fewshot, few-shot seed) but without its per-call environment
    report (~0.5 s of subprocesses each). Returns ``{task: record}`` (``task_record`` plus ``wall_s``
    and ``requests``), or None on the non-zero ranks of a data-parallel run.
    """
    require("lm_eval", "eval")
    from lm_eval.evaluator import evaluate
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=config.batch_size, max_batch_size=config.max_batch_size)
    _distribute(lm)
    if not request_bars:  # lm-eval's per-request bars; the caller shows one bar over checkpoints x tasks
        lm.loglikelihood = functools.partial(lm.loglikelihood, disable_tqdm=True)
    results: dict[str, dict[str, Any]] = {}
    for name, task in tasks.tasks.items():
        start = time.perf_counter()
        _seed_and_shots(task, config)
        raw = evaluate(lm=lm, task_dict={"tasks": {name: task}, "groups": {}, "group_map": {}}, limit=config.limit, log_samples=False)
        requests = _total(lm, len(task.instances))  # a collective call: every rank takes part
        if raw is not None:
            results[name] = {**task_record(raw, name), "wall_s": time.perf_counter() - start, "requests": requests}
        if on_task is not None:
            on_task(name)
    return results if lm.rank == 0 else None


def _seed_and_shots(task: Any, config: EvalConfig) -> None:
    """What ``simple_evaluate`` does before evaluating: seeds, num_fewshot (a YAML's 0 stays 0), few-shot seed."""
    import random

    import numpy as np

    torch = require("torch", "hf")
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    if task.get_config("num_fewshot") != 0:
        task.set_config(key="num_fewshot", value=config.num_fewshot)
    task.set_fewshot_seed(seed=config.seed)


# ------------------------------------------------------------------------------------ convenience


def evaluate_checkpoints(
    checkpoints: Sequence[str | os.PathLike],
    config: EvalConfig | None = None,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    progress: bool = True,
    verbose: bool = False,
) -> dict[str, Any] | None:
    """Evaluate checkpoint folders on ``config.tasks``; write results.json + results.md into ``out``.

    Everything that can fail fast (paths, output folder, device, task names, datasets) is checked
    before the first model loads. ``progress`` shows a bar over checkpoints x tasks, ``verbose``
    lm-eval's per-request bars too. Returns the results document (None on non-zero data-parallel ranks).
    """
    config = config or EvalConfig()
    paths = [Path(c) for c in checkpoints]
    if not paths:
        raise InvalidInputError("The 'checkpoints' parameter must name at least one checkpoint folder. Got none.")
    kinds = [check_checkpoint(path) for path in paths]  # every checkpoint, before the first evaluation
    if out is not None and Path(out).exists() and not overwrite:
        raise InvalidInputError(f"output directory {out} already exists; pass --overwrite to replace it")
    labels = checkpoint_labels(paths)
    base = find_base(paths, labels, config.base)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if config.device_map and world_size() > 1:
        raise InvalidInputError("--device-map auto spreads one model over all GPUs; it cannot be combined with a data-parallel launch")
    versions = _versions()
    tqdm = require("tqdm", "eval").tqdm
    with resolve_tasks(config.tasks) as tasks:
        info = describe_tasks(tasks)
        bar = tqdm(total=len(paths) * len(tasks.tasks), desc="eval", unit="task", disable=not progress)
        records = []
        for path, label, kind in zip(paths, labels, kinds):
            start = time.perf_counter()
            bar.set_description(f"load {label}")
            model, tokenizer = load_checkpoint(path, kind, dtype, device, config.device_map)
            load_s = time.perf_counter() - start
            params = sum(p.numel() for p in model.parameters())
            results = evaluate_model(
                model, tokenizer, tasks, config, request_bars=verbose,
                on_task=lambda t, label=label: (bar.update(), bar.set_description(f"{label}:{t}")),
            )  # fmt: skip
            del model
            if results is None:
                continue
            records.append({"label": label, "path": str(path.resolve()), "params": params, "load_s": load_s,
                            "wall_s": time.perf_counter() - start, "results": results})  # fmt: skip
        bar.close()
    if not records:
        return None
    doc = {
        "schema": SCHEMA,
        "provenance": provenance(**versions),
        "config": asdict(config),
        "device": device,
        "dtype": dtype,
        "world_size": world_size(),
        "tasks": list(info),
        "task_info": info,
        "avg_label": avg_label(list(info)),
        "base": labels[base] if base is not None else None,
        "checkpoints": summarise(records, base),
    }
    if out is not None:
        write_results(doc, out, overwrite=overwrite)
    return doc


def write_results(doc: Mapping[str, Any], out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write results.json and results.md into ``out`` atomically (both appear, or neither)."""
    with atomic_dir(out, overwrite=overwrite) as tmp:
        atomic_write_text(tmp / RESULTS_JSON, to_json(doc))
        atomic_write_text(tmp / RESULTS_MD, render_markdown(doc))
    return Path(out)


def _versions() -> dict[str, Any]:
    import importlib.metadata as md

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    return {f"{d.replace('-', '_')}_version": version(d) for d in ("lm-eval", "transformers", "torch", "datasets")}
