"""Zero-shot evaluation of checkpoints with lm-evaluation-harness: per-task metrics, Avg8, recovery.

Two levels, as in lm-eval (``simple_evaluate`` over ``evaluate``):

- ``evaluate_model`` runs built tasks on one in-memory model through ``HFLM``;
- ``evaluate_checkpoints`` resolves tasks, preflights every checkpoint, then loads and evaluates each
  in turn, and writes ``results.json`` + ``results.md``.

The preflight and loading are in ``nsc_prune.eval.checkpoints``, the report (records, Avg, recovery,
results.md) in ``nsc_prune.eval.report``, task resolution in ``nsc_prune.eval.tasks``.
Avg8 convention: acc_norm for hellaswag, arc_challenge and openbookqa, acc for the other five
(``nsc_prune.eval.tasks.headline_metric``); recovery = Avg(checkpoint) / Avg(base). The results schema is
documented in docs/evaluate.md.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from nsc_prune._io import check_output, provenance, stop_signal
from nsc_prune._validation import config_from_dict, is_int, is_number, must_be
from nsc_prune._warn import say_held_warnings
from nsc_prune.choices import EVAL_DTYPES
from nsc_prune.errors import InterruptedRun, InvalidInputError, MissingDependencyError, Stopped, require
from nsc_prune.eval import report
from nsc_prune.eval.checkpoints import (
    check_checkpoint,
    check_tensor_parallel,
    checkpoint_params,
    deployed_params,
    load_checkpoint,
    vllm_remote_code,
)
from nsc_prune.eval.finished import (
    checkpoint_key,
    finished_dir,
    finished_path,
    load_finished,
    remove_finished,
    save_finished,
    task_files_sha256,
)
from nsc_prune.eval.report import (
    RESULTS_JSON,
    RESULTS_OWNER,
    checkpoint_labels,
    find_base,
    other_bases,
    summarise,
    task_record,
    write_results,
)
from nsc_prune.eval.tasks import (
    TaskSet,
    avg_label,
    describe_tasks,
    resolve_tasks,
    task_config_sha256,
    task_metric,
)
from nsc_prune.hf.progress import bar_settings, prints_log_lines, quiet, quiet_logger
from nsc_prune.hf.random_state import keeps_random_state
from nsc_prune.hf.ranks import launched_processes
from nsc_prune.hf.weights.compute import require_cuda

BACKENDS = ("hf", "vllm")
VLLM_FIELDS = ("tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization", "max_model_len")


def _check(ok: bool, name: str, expected: str, got: Any) -> None:
    if not ok:
        raise InvalidInputError(must_be(name, expected, got))


@dataclass(frozen=True)
class EvalConfig:
    """Options of one evaluation run (flags > --config YAML > these defaults)."""

    tasks: tuple[str, ...] = ("commonsense8",)  # names, aliases, YAML files or folders (nsc_prune.eval.tasks)
    limit: int | float | None = None  # first N documents per task (or a fraction < 1); None: all
    device: str = "auto"  # auto (cuda when present), cpu, cuda, cuda:N
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    batch_size: int | str = 8  # an int, or "auto" / "auto:N" (lm-eval finds the largest that fits)
    max_batch_size: int = 64  # upper bound for "auto"
    device_map: str | None = None  # "auto": shard a model larger than one GPU across the visible GPUs
    num_fewshot: int = 0  # zero-shot, as in the paper
    seed: int = 1234  # python, numpy, torch and few-shot seeds given to lm-eval
    bootstrap_iters: int = 100_000  # lm-eval's resamples for a stderr without a closed form (mcc, f1); 0: none at all
    base: str | None = None  # label or path of the unpruned base among the checkpoints (default: detected)
    backend: str = "hf"  # hf: in-process transformers model (lm-eval HFLM); vllm: lm-eval's VLLM (a CUDA GPU)
    tensor_parallel_size: int = 1  # vllm: GPUs one model is split over
    data_parallel_size: int = 1  # vllm: model replicas (lm-eval runs them with ray)
    gpu_memory_utilization: float = 0.9  # vllm: fraction of each GPU's memory for weights + KV cache
    max_model_len: int | None = None  # vllm: context length (default: the model's)

    def __post_init__(self) -> None:
        given = self.tasks
        tasks = (given,) if isinstance(given, str) else tuple(given) if isinstance(given, list | tuple) else ()
        object.__setattr__(self, "tasks", tasks)
        limit = self.limit
        _check(
            bool(tasks) and all(isinstance(t, str) and t.strip() for t in tasks),
            "tasks",
            "non-empty task names or paths",
            list(tasks) if tasks else given,  # as the names were given (--tasks '' shows [''])
        )
        _check(
            limit is None
            or is_number(limit)
            and (1 <= limit <= sys.maxsize and float(limit).is_integer() or 0 < limit < 1),
            "limit",
            "a whole number in [1, 2**63) or a fraction in (0, 1)",
            limit,
        )
        if limit is not None and limit >= 1:
            object.__setattr__(self, "limit", int(limit))
        self._check_run()
        self._check_backend()

    def _check_run(self) -> None:
        """Device, dtype, batch sizes, few-shot count, seed and bootstrap resamples."""
        batch = self.batch_size
        _check(
            isinstance(self.device, str) and bool(re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device)),
            "device",
            "auto, cpu, cuda, cuda:N or mps",
            self.device,
        )
        _check(self.dtype in EVAL_DTYPES, "dtype", f"one of {EVAL_DTYPES}", self.dtype)
        _check(
            is_int(batch) and batch >= 1 or isinstance(batch, str) and bool(re.fullmatch(r"auto(:[1-9]\d*)?", batch)),
            "batch_size",
            "an int >= 1, 'auto' or 'auto:N' (N >= 1: how many times lm-eval looks for a larger batch)",
            batch,
        )
        _check(self.device_map in (None, "auto"), "device_map", "None or 'auto'", self.device_map)
        _check(  # accelerate spreads the model over every visible GPU: another device would be ignored, and recorded
            self.device_map is None or self.device in ("auto", "cuda"),
            "device with device_map 'auto'",
            "auto or cuda",
            self.device,
        )
        _check(
            self.base is None or isinstance(self.base, str) and bool(self.base.strip()),
            "base",
            "a checkpoint's label or path",
            self.base,
        )
        _check(
            is_int(self.max_batch_size) and self.max_batch_size >= 1,
            "max_batch_size",
            "an int >= 1",
            self.max_batch_size,
        )
        _check(is_int(self.num_fewshot) and self.num_fewshot >= 0, "num_fewshot", "an int >= 0", self.num_fewshot)
        _check(is_int(self.seed) and 0 <= self.seed < 2**32, "seed", "an int in [0, 2**32)", self.seed)  # numpy's
        _check(
            is_int(self.bootstrap_iters) and self.bootstrap_iters >= 0,
            "bootstrap_iters",
            "an int >= 0",
            self.bootstrap_iters,
        )

    def _check_backend(self) -> None:
        """The backend, and vLLM's settings only with it (they would be silently ignored by hf)."""
        _check(self.backend in BACKENDS, "backend", f"one of {BACKENDS}", self.backend)
        for name in ("tensor_parallel_size", "data_parallel_size"):
            _check(
                is_int(getattr(self, name)) and getattr(self, name) >= 1,
                name,
                "an int >= 1",
                getattr(self, name),
            )
        _check(
            is_number(self.gpu_memory_utilization) and 0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            "a fraction in (0, 1]",
            self.gpu_memory_utilization,
        )
        _check(
            self.max_model_len is None or is_int(self.max_model_len) and self.max_model_len >= 1,
            "max_model_len",
            "None or an int >= 1",
            self.max_model_len,
        )
        if self.backend == "hf":  # vLLM settings that would be silently ignored
            defaults = {f.name: f.default for f in fields(EvalConfig)}
            given = [name for name in VLLM_FIELDS if getattr(self, name) != defaults[name]]
            _check(not given, f"backend (for {', '.join(given)})", "'vllm'", self.backend)
        else:
            _check(
                self.device_map is None,
                "device_map with backend 'vllm'",
                "None (use tensor_parallel_size)",
                self.device_map,
            )
            _check(  # vLLM places the model on its own GPUs (tensor_parallel_size): another device is not honoured
                self.device in ("auto", "cuda"), "device with backend 'vllm'", "auto or cuda", self.device
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalConfig:
        """Build from a mapping (a --config YAML); unknown keys warn, as for every file nsc-prune reads."""
        return config_from_dict(cls, data, "eval config")


# ------------------------------------------------------------------------------------- model side


def resolve_device(device: str) -> str:
    """'auto' -> cuda when available else cpu; a CUDA device that is absent is an error, not a fallback."""
    torch = require("torch", "hf")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "mps" and not torch.backends.mps.is_available():
        raise InvalidInputError("--device mps was asked for but MPS is not available; pass --device cpu")
    if device.startswith("cuda"):
        require_cuda(device)
        asked, local = device, os.environ.get("LOCAL_RANK")
        if local is not None and launched_processes() > 1:  # one GPU per process under accelerate launch
            if device != "cuda":
                raise InvalidInputError(
                    f"--device {device} under a launcher would put every process on one GPU; pass --device cuda "
                    "(each process takes the GPU of its LOCAL_RANK)"
                )
            device = f"cuda:{local}"
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            rank = f" (LOCAL_RANK {local} takes {device})" if device != asked else ""
            raise InvalidInputError(
                f"--device {asked}: only {torch.cuda.device_count()} CUDA device(s) are visible{rank}"
            )
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """'auto' -> bfloat16 on a GPU that computes it natively, float32 otherwise."""
    from nsc_prune.hf.weights.compute import gpu_has_native_bf16

    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") and gpu_has_native_bf16(device) else "float32"


def _distribute(lm: Any) -> None:
    """Data parallelism under ``accelerate launch``: lm-eval shards requests by ``lm.rank``."""
    if launched_processes() <= 1:
        return
    from accelerate import Accelerator

    from nsc_prune.hf.ranks import import_before_any_group

    import_before_any_group()
    accelerator = Accelerator(cpu=lm.device.type == "cpu")  # cpu=True: gloo process group (torchrun on CPU)
    lm.accelerator, lm._rank, lm._world_size = accelerator, accelerator.process_index, accelerator.num_processes


def _total(lm: Any, count: int) -> int:
    """Sum of ``count`` over the ranks of a data-parallel run (``count`` itself otherwise)."""
    if lm.world_size <= 1:
        return count
    torch = require("torch", "hf")
    return int(lm.all_gather(torch.tensor([count], device=lm.device)).sum())


@keeps_random_state  # lm-eval's seeds (_seed_and_shots) stay inside
def evaluate_model(
    model: Any,
    tokenizer: Any,
    tasks: TaskSet,
    config: EvalConfig,
    on_task: Callable[[str], None] | None = None,
    request_bars: bool = False,
    label: str | None = None,
) -> dict[str, dict[str, Any]] | None:
    """Run every task of ``tasks`` on an in-memory model through ``HFLM`` and ``lm_eval.evaluator.evaluate``.

    One task at a time (for the progress bar and per-task wall time), with the set-up that
    ``simple_evaluate`` does (seeds, num_fewshot, few-shot seed) but without its per-call environment
    report (~0.5 s of subprocesses each). Returns ``{task: record}`` (``task_record`` plus ``wall_s``
    and ``requests``), or None on the non-zero ranks of a data-parallel run.
    """
    require("lm_eval", "eval")
    from lm_eval.models.huggingface import HFLM

    # HFLM puts every module in eval mode and gives the tokenizer a pad token (lm-eval's configure_pad_token); both
    # go back as they were. (A tokenizer with neither unk nor eos gets one added to its vocabulary, which stays.)
    modes = {module: module.training for module in model.modules()}
    pad, side = tokenizer.pad_token, tokenizer.padding_side
    try:
        # its warnings that an in-memory model forgoes accelerate: _distribute sets the ranks up for it
        with quiet_logger("lm_eval.models.huggingface", logging.ERROR):
            lm = HFLM(
                pretrained=model,
                tokenizer=tokenizer,
                batch_size=config.batch_size,
                max_batch_size=config.max_batch_size,
            )
        _distribute(lm)
        return evaluate_lm(lm, tasks, config, on_task, request_bars, label)
    finally:
        for module, training in modes.items():
            module.training = training
        tokenizer.pad_token, tokenizer.padding_side = pad, side


VLLM_MIN = "0.14"
"""The first vLLM whose ``DeciLMForCausalLM`` reads ``ffn.intermediate_size`` (nemotron-nas FFN widths as written)."""


def require_vllm() -> None:
    """Fail in one line, naming how to install it, unless vllm >= ``VLLM_MIN`` is installed (checked without
    importing it; a vllm without package metadata is taken as it is)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise MissingDependencyError(
            "--backend vllm needs vllm, which is not installed: pip install 'nsc-prune[vllm]' (or pip install vllm; "
            "vLLM runs on CUDA GPUs), or use the default --backend hf"
        )
    from packaging.version import Version  # vllm brings it; the core install does not

    try:
        found = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return
    if Version(found) < Version(VLLM_MIN):
        raise MissingDependencyError(
            f"--backend vllm needs vllm >= {VLLM_MIN} (older ones cannot read the FFN widths of a nemotron-nas "
            f"checkpoint); found {found}: pip install -U 'vllm>={VLLM_MIN}'"
        )


def vllm_class() -> type:
    """lm-eval's vLLM model class (``lm_eval.models.vllm_causallms.VLLM``; importing it imports vllm)."""
    from lm_eval.models.vllm_causallms import VLLM

    return VLLM


def vllm_model(path: Path, config: EvalConfig, trust_remote_code: bool) -> Any:
    """lm-eval's vLLM model for checkpoint folder ``path``, with the parallelism and memory settings of ``config``.

    ``trust_remote_code`` only for a nemotron-nas checkpoint whose shipped code is this nsc-prune's own
    (``nsc_prune.eval.checkpoints.vllm_remote_code``)."""
    options = {"max_model_len": config.max_model_len} if config.max_model_len else {}
    return vllm_class()(
        pretrained=str(path),
        dtype=config.dtype,
        trust_remote_code=trust_remote_code,
        batch_size=config.batch_size,
        max_batch_size=config.max_batch_size,
        seed=config.seed,
        tensor_parallel_size=config.tensor_parallel_size,
        data_parallel_size=config.data_parallel_size,
        gpu_memory_utilization=config.gpu_memory_utilization,
        **options,
    )


def evaluate_lm(
    lm: Any,
    tasks: TaskSet,
    config: EvalConfig,
    on_task: Callable[[str], None] | None = None,
    request_bars: bool = False,
    label: str | None = None,
) -> dict[str, dict[str, Any]] | None:
    """Run every task of ``tasks`` on an lm-eval model (``HFLM`` or ``VLLM``); see ``evaluate_model``. ``label``
    names the checkpoint in a refusal its own tokenizer brought (one of several evaluated)."""
    from lm_eval.evaluator import evaluate

    quieted = () if request_bars else ("loglikelihood", "generate_until")  # lm-eval's per-request bars
    for kind in quieted:  # the caller shows one bar over checkpoints x tasks
        setattr(lm, kind, functools.partial(getattr(lm, kind), disable_tqdm=True))
    results: dict[str, dict[str, Any]] = {}
    try:
        for name, task in tasks.tasks.items():
            start = time.perf_counter()
            _seed_and_shots(task, config)
            with _document_bars(request_bars):
                try:
                    raw = evaluate(
                        lm=lm,
                        task_dict={"tasks": {name: task}, "groups": {}, "group_map": {}},
                        limit=config.limit,
                        bootstrap_iters=config.bootstrap_iters,
                        log_samples=False,
                    )
                except ValueError as err:  # random.sample's, when the few-shot pool is smaller than asked
                    if "larger than population" not in str(err):
                        raise
                    raise InvalidInputError(
                        f"--num-fewshot {config.num_fewshot}: task {name} has fewer examples to draw the few-shot "
                        "context from; pass a smaller --num-fewshot"
                    ) from err
                except AssertionError as err:  # HFLM's bare check of each request's tokens
                    if traceback.extract_tb(err.__traceback__)[-1].name != "_loglikelihood_tokens":
                        raise
                    whose = f" of checkpoint {label}" if label else ""
                    raise InvalidInputError(
                        f"task {name}: the tokenizer{whose} encodes a request's context or answer to no tokens, or "
                        "its answer to more than the model's context (lm-eval's check of every request); it does not "
                        "fit the task's text"
                    ) from err
                except ZeroDivisionError as err:  # HFLM's batch scheduler: fewer requests than auto:N's N
                    if not str(config.batch_size).startswith("auto:"):
                        raise
                    # not len(task.instances): lm-eval schedules one request per context its choices share
                    raise InvalidInputError(
                        f"--batch-size {config.batch_size}: lm-eval looks for a larger batch "
                        f"{str(config.batch_size)[5:]} times over a task's batches of requests, and task {name} has "
                        f"fewer here (--limit {config.limit}); pass a smaller auto:N, or auto"
                    ) from err
            requests = _total(lm, len(task.instances))  # a collective call: every rank takes part
            if raw is not None:
                record = task_record(raw, name, task_metric(name, task))
                results[name] = {**record, "wall_s": time.perf_counter() - start, "requests": requests}
            if on_task is not None:
                on_task(name)
    finally:
        # The partial holds ``lm`` and is held by it: without this the model (or vLLM engine) outlives ``del`` and
        # the next checkpoint loads beside it on the GPU.
        for kind in quieted:
            vars(lm).pop(kind, None)
    return results if lm.rank == 0 else None


@contextlib.contextmanager
def _document_bars(shown: bool) -> Iterator[None]:
    """lm-eval's bar over a task's documents (``build_all_requests`` opens it with no ``disable``), drawn only with
    its per-request bars (``--verbose``): ours counts the tasks, and ``progress=False`` drew it anyway."""
    import lm_eval.api.task as task_module

    drawn = task_module.tqdm
    if not shown:
        task_module.tqdm = functools.partial(drawn, disable=True)
    try:
        yield
    finally:
        task_module.tqdm = drawn


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


@dataclass(frozen=True)
class _Preflight:
    """What ``evaluate_checkpoints`` checked before the first model loads: the folders, their kinds and labels, the
    base's index, where and in which dtype the models run, and (vLLM) whether each needs remote code."""

    paths: list[Path]
    kinds: list[Any]
    labels: list[str]
    base: int | None
    device: str
    dtype: str
    trusted: list[bool]


def _preflight(
    checkpoints: Sequence[str | os.PathLike], config: EvalConfig, out: str | os.PathLike | None, overwrite: bool
) -> _Preflight:
    """Every check that can fail fast: paths, output folder, device, the launch."""
    if config.backend == "vllm":
        require_vllm()
    if isinstance(checkpoints, (str, bytes, os.PathLike)):  # a string would be read a character at a time
        raise InvalidInputError(must_be("checkpoints", "a list of checkpoint folders", checkpoints, "Pass [path]"))
    paths = [Path(c) for c in checkpoints]
    if not paths:
        raise InvalidInputError(must_be("checkpoints", "at least one checkpoint folder", []))
    kinds = [check_checkpoint(path) for path in paths]  # every checkpoint, before the first evaluation
    vllm = config.backend == "vllm"
    trusted = [vllm_remote_code(path) for path in paths] if vllm else []  # refuses what vLLM cannot load
    for path in paths if vllm else ():
        check_tensor_parallel(path, config.tensor_parallel_size)
    if out is not None:
        check_output(out, paths, overwrite, marker=RESULTS_JSON, owner=RESULTS_OWNER)
    labels = checkpoint_labels(paths)
    base = find_base(paths, labels, config.base)
    device = "vllm" if vllm else resolve_device(config.device)  # vLLM places the model itself (CUDA)
    dtype = config.dtype if vllm else resolve_dtype(config.dtype, device)
    if vllm and launched_processes() > 1:
        raise InvalidInputError(
            "--backend vllm runs its own data parallelism (--data-parallel-size); "
            "do not launch it with accelerate/torchrun"
        )
    if config.device_map and launched_processes() > 1:
        raise InvalidInputError(
            "--device-map auto spreads one model over all GPUs; it cannot be combined with a data-parallel launch"
        )
    return _Preflight(paths, kinds, labels, base, device, dtype, trusted)


def _evaluate_one(
    plan: _Preflight, i: int, tasks: Any, config: EvalConfig, on_task: Any, verbose: bool
) -> dict[str, Any] | None:
    """Load checkpoint ``i`` of ``plan``, evaluate it on ``tasks``, free it; its record (None on non-zero
    data-parallel ranks)."""
    path, start = plan.paths[i], time.perf_counter()
    label = plan.labels[i] if len(plan.paths) > 1 else None  # named where its own tokenizer is at fault
    if config.backend == "vllm":
        lm = vllm_model(path, config, plan.trusted[i])
        load_s, params = time.perf_counter() - start, checkpoint_params(path)
        results = evaluate_lm(lm, tasks, config, on_task=on_task, request_bars=verbose, label=label)
        del lm
    else:
        model, tokenizer = load_checkpoint(path, plan.kinds[i], plan.dtype, plan.device, config.device_map)
        load_s = time.perf_counter() - start
        params = deployed_params(model)
        results = evaluate_model(model, tokenizer, tasks, config, request_bars=verbose, on_task=on_task, label=label)
        del model
    if results is None:
        return None
    return {
        "label": plan.labels[i],
        "path": str(path.resolve()),
        "params": params,
        "load_s": load_s,
        "wall_s": time.perf_counter() - start,
        "results": results,
    }


@keeps_random_state
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
    plan = _preflight(checkpoints, config, out, overwrite)
    kept = finished_dir(out) if out is not None and launched_processes() == 1 else None
    versions = _versions()
    with resolve_tasks(config.tasks) as tasks:
        info = describe_tasks(tasks)
        if launched_processes() > 1:
            _check_ranks_agree(config, plan, info, versions, tasks)
        run = _run_key(config, plan, info, versions, tasks) if kept is not None else {}
        with quiet(not progress):  # the checkpoints' "Loading weights" bars too
            records, reused = _evaluate_all(plan, tasks, config, kept, run, progress, verbose)
    if not records:
        return None
    labels, base, device, dtype = plan.labels, plan.base, plan.device, plan.dtype
    doc = {
        "schema": report.SCHEMA,
        "provenance": provenance(**versions, **({"reused_checkpoints": reused} if reused else {})),
        "config": asdict(config),
        "device": device,
        "dtype": dtype,
        "world_size": launched_processes(),
        "tasks": list(info),
        "task_info": info,
        "avg_label": avg_label(list(info)),
        "base": labels[base] if base is not None else None,
        "checkpoints": summarise(records, base, other_bases(plan.paths, base) if config.base is None else ()),
    }
    if out is not None:
        try:
            write_results(doc, out, overwrite=overwrite, checked=True)
        except (KeyboardInterrupt, SystemExit) as err:
            what = f"every checkpoint's are kept in {kept}: the same command writes them"
            stop = _kept_at_stop(err, kept, what, " while writing the results")
            if stop is None:
                raise
            raise stop from err
    if out is not None:  # a launched run keeps none, but an earlier run's records go with the results too
        remove_finished(finished_path(out))  # unchecked: a file put there meanwhile must not fail a finished run
    return doc


def _run_key(
    config: EvalConfig, plan: _Preflight, info: Mapping[str, Any], versions: Mapping[str, Any], tasks: TaskSet
) -> dict[str, Any]:
    """What, besides the checkpoint itself, decides its results (``nsc_prune.eval.finished``): every setting that
    changes a number (not ``base``, nor the device and tasks as typed, nor ``max_batch_size`` beside a fixed batch
    size), the tasks (their data's sha256, the text of user task files, each task's resolved config), the versions,
    the resolved device and dtype."""
    from nsc_prune._version import __version__

    torch = require("torch", "hf")
    on_gpu = plan.device.startswith("cuda") or plan.device == "vllm" and torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(plan.device if plan.device != "vllm" else 0) if on_gpu else None
    sources = [str(task["source"]) for task in info.values() if task.get("source")]
    # not what changes no result: the base (recovery is computed after), the device and tasks as typed (resolved
    # below), a bound on a batch size that is not searched
    settings = {key: value for key, value in asdict(config).items() if key not in ("base", "device", "tasks")}
    if not str(config.batch_size).startswith("auto"):
        settings.pop("max_batch_size")
    return {
        "config": settings,
        "tasks": info,
        "task_files": task_files_sha256(sources),
        "task_configs": task_config_sha256(tasks),
        "versions": {
            **versions,
            "nsc_prune": __version__,
            "vllm": _version("vllm") if config.backend == "vllm" else None,
        },
        "device": plan.device,
        "gpu": gpu,
        "dtype": plan.dtype,
    }


def _check_ranks_agree(
    config: EvalConfig, plan: _Preflight, info: Mapping[str, Any], versions: Mapping[str, Any], tasks: TaskSet
) -> None:
    """Under a data-parallel launch, ConfigError on every rank unless all of them evaluate the same weights with the
    same settings and task data: rank 0 writes what every rank scored as the numbers of one run. Compared by content,
    since the paths may differ (each node's own copy of the checkpoints, of nsc-prune's or lm-eval's task files, a
    relative task file read from another folder), and so may each rank's GPU."""
    from nsc_prune.hf.ranks import current_ranks
    from nsc_prune.hf.weights.fingerprint import weights_fingerprint

    run = _run_key(config, plan, info, versions, tasks)
    key = {
        "config": run["config"],
        "versions": run["versions"],
        "dtype": run["dtype"],
        "tasks": {
            name: {
                **{k: task[k] for k in ("canonical", "metric", "version")},
                "dataset": task["dataset"]["name"],
                "data": sorted(task["data_sha256"].values()),
            }
            for name, task in info.items()
        },
        "task_files": sorted(run["task_files"].values()),
        "task_configs": task_config_sha256(tasks, without_paths=True),  # an included template's text
        "checkpoints": [weights_fingerprint(path) for path in plan.paths],
    }
    ranks = current_ranks("cuda" if plan.device.startswith("cuda") else "cpu")
    ranks.check_same("the inputs of eval (checkpoints' weights, settings, task data)", key)


def _evaluate_all(
    plan: _Preflight,
    tasks: TaskSet,
    config: EvalConfig,
    kept: Path | None,
    run: Mapping[str, Any],
    progress: bool,
    verbose: bool,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every checkpoint's record, and the labels of those read back from ``kept`` (finished by an earlier run of the
    same command, ``nsc_prune.eval.finished``); each one evaluated here is stored there as it finishes."""
    tqdm = require("tqdm", "eval").tqdm
    shown = bar_settings() if progress else {"disable": True}  # a terminal's bar, a log's lines, else none
    say_held_warnings()  # before the wait, not after it
    bar = tqdm(total=len(plan.paths) * len(tasks.tasks), desc="eval", unit="task", **shown)
    records, reused = [], []
    try:
        for i, label in enumerate(plan.labels):
            key = checkpoint_key(plan.paths[i], label, run) if kept is not None else ""
            record = load_finished(kept, key, label, tasks.names) if kept is not None else None
            if record is not None:  # found under the same content: only the folder may have moved
                bar.update(len(tasks.tasks))
                records.append({**record, "path": str(plan.paths[i].resolve())})
                reused.append(label)
                continue
            redraw = not prints_log_lines()  # a log's line comes at most a minute apart, not with each task
            bar.set_description_str(f"load {label}", refresh=redraw)
            on_task = lambda t, label=label: (bar.update(), bar.set_description_str(f"{label}:{t}", refresh=redraw))
            record = _evaluate_one(plan, i, tasks, config, on_task, verbose)
            if record is not None:
                if kept is not None:
                    save_finished(kept, key, record)
                records.append(record)  # after it is kept: a stop says which results are
    except (KeyboardInterrupt, SystemExit) as err:
        done = ", ".join(record["label"] for record in records)
        what = f"the results of {done} are kept in {kept}: the same command evaluates the rest"
        stop = _kept_at_stop(err, kept if records else None, what)
        if stop is None:
            raise
        raise stop from err
    finally:
        bar.close()
    return records, reused


def _kept_at_stop(err: BaseException, kept: Path | None, what: str, when: str = "") -> BaseException | None:
    """A Ctrl-C or a stop signal (SIGTERM, SIGHUP) that ended a run ``when`` it had kept results in ``kept``, as the
    error that says ``what`` was kept; None for another exception or when nothing was kept."""
    if kept is None:
        return None
    if isinstance(err, KeyboardInterrupt):
        return InterruptedRun(f"interrupted{when}; {what}")
    signal_name = stop_signal(err.code) if isinstance(err, SystemExit) else None
    return Stopped(f"stopped by {signal_name}{when}; {what}", signal_name) if signal_name else None


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _versions() -> dict[str, Any]:
    return {f"{d.replace('-', '_')}_version": _version(d) for d in ("lm-eval", "transformers", "torch", "datasets")}
