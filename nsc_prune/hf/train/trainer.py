"""Recovery training on ``transformers.Trainer``: CE or distillation, optional subnet sampling, resumable.

``train`` subclasses ``transformers.Trainer`` only to override ``compute_loss`` (the TRL distillation pattern):
the teacher's logits are computed once per batch (eval mode, no grad), then for each context manager that
``subnet_contexts(step)`` returns the student runs inside ``with ctx:`` and the step's loss is the mean over
subnets (each subnet's graph is backpropagated before the next forward, except under DeepSpeed). Everything
else - optimizer, schedule, gradient accumulation, checkpoints, resume, mixed precision, gradient
checkpointing, data parallelism under ``accelerate launch``/``torchrun``, FSDP and DeepSpeed through
``accelerate config`` - is the Trainer's own (the heal and train-supernet commands refuse FSDP and DeepSpeed:
``refuse_sharded_launch``).

Checkpoints go to ``OUT/checkpoints/checkpoint-STEP`` (safetensors weights; optimizer and RNG state as the
Trainer writes them); ``OUT/checkpoints/nsc_prune_train.json`` holds the recipe and the data hashes a
resumed run must match. SIGTERM makes the Trainer save a checkpoint and stop at the end of the current step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsc_prune._io import atomic_write_text, read_json_object, to_json
from nsc_prune._validation import must_be
from nsc_prune.core.spec import FUSED
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.progress import is_quiet, library_bars
from nsc_prune.hf.progress import progress as progress_bar  # train()'s own `progress` is a flag
from nsc_prune.hf.ranks import Ranks, current_ranks
from nsc_prune.hf.train.budget import BudgetTooSmall, SizedRun, TimeBudget, probe, resize, size_run
from nsc_prune.hf.train.data import TextBlocks
from nsc_prune.hf.train.recipe import (
    AUTO,
    TopKTeacher,
    TrainConfig,
    causal_lm_loss,
    distill_from_teacher,
    distill_from_top_k,
    teacher_distribution,
)
from nsc_prune.hf.train.schedule import make_schedule
from nsc_prune.hf.weights.adapter import peft_wrapping
from nsc_prune.hf.weights.compute import gpu_has_native_bf16

torch = require("torch", "hf")
transformers = require("transformers", "hf")

CHECKPOINTS_DIR = "checkpoints"
RUN_RECORD = "nsc_prune_train.json"
SubnetContexts = Callable[[int], Sequence[AbstractContextManager]]


@dataclass
class TrainResult:
    """What a run did: the trained model (a PEFT model when LoRA was added), steps, tokens, time and losses.

    ``train_loss`` and ``val_loss`` are ``(step, loss)`` pairs; ``interrupted`` is True when SIGTERM stopped the
    run early (its last checkpoint is ``checkpoint``; continue with ``resume=True``).
    """

    model: Any
    steps: int
    tokens: int
    seconds: float
    tokens_per_s: float
    train_loss: list[tuple[int, float]] = field(default_factory=list)
    val_loss: list[tuple[int, float]] = field(default_factory=list)
    interrupted: bool = False
    checkpoint: Path | None = None
    world_size: int = 1
    budget: SizedRun | None = None  # the time budget's sizing (``train(budget=...)``), stored with the run
    probe_seconds: float = 0.0  # the probe passes this process ran (0 when a resumed run read the sizing back)

    def to_dict(self) -> dict[str, Any]:
        """The run as the recovery record holds it (JSON types, seconds rounded)."""
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "train_loss": [list(p) for p in self.train_loss],
            "val_loss": [list(p) for p in self.val_loss],
            "interrupted": self.interrupted,
            "world_size": self.world_size,
            "budget": self.budget.to_dict() if self.budget is not None else None,
        }

    def recipe(self, config: TrainConfig) -> dict[str, Any]:
        """The recipe this run trained with: ``config``, with a timed run's (``--minutes``) steps and warm-up as run
        (the config holds the probe's sizing)."""
        data = config.to_dict()
        if self.budget is not None:
            data.update(max_steps=self.budget.max_steps, warmup_steps=self.budget.warmup_steps)
        return data


class _Blocks(torch.utils.data.Dataset):
    def __init__(self, blocks: torch.Tensor) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    def __getitem__(self, index: int) -> dict[str, Any]:
        # block_index: the row of cached teacher logits (TeacherLogits) that belongs to this block
        return {"input_ids": self.blocks[index], "labels": self.blocks[index], "block_index": index}


def _model_device(model: Any) -> torch.device:
    return next(iter(model.parameters())).device


@torch.no_grad()
def evaluate_loss(model: Any, val_blocks: torch.Tensor, batch_size: int = 8, ranks: Ranks = Ranks()) -> float:
    """Mean next-token cross-entropy (nats) of ``model`` over ``val_blocks`` [m, seq_len]; exp() is perplexity.
    ``ranks`` (a launcher's processes, a collective): each runs every ``ranks.count``-th batch and every rank gets
    the mean over all of them."""
    if val_blocks.ndim != 2 or val_blocks.shape[0] == 0:
        raise InvalidInputError(must_be("val_blocks", "a non-empty [blocks, seq_len] tensor", tuple(val_blocks.shape)))
    was_training = model.training
    model.eval()
    device = _model_device(model)
    starts = range(0, val_blocks.shape[0], batch_size)
    total, count = 0.0, 0
    try:
        for batch in progress_bar(ranks.mine(len(starts)), "held-out loss", "batch"):
            ids = val_blocks[starts[batch] : starts[batch] + batch_size].to(device)
            logits = model(input_ids=ids).logits
            n = ids[:, 1:].numel()
            total += float(causal_lm_loss(logits, ids)) * n
            count += n
    finally:
        model.train(was_training)
    total, count = ranks.sum_floats([total, count])
    return total / count


class _StopOnSignal(transformers.TrainerCallback):
    """Turns a SIGTERM (flag set by the handler) into "save a checkpoint and stop" at the end of the step."""

    def __init__(self) -> None:
        self.requested = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


class _ResizeWhileRatesAllow(transformers.TrainerCallback):
    """``--minutes``: re-size the run from its own steps' seconds (``budget.resize``) after every step whose rates,
    and the next one's, are those of any horizon (``schedule.resizable``: the warm-up's end under ``cosine``, every
    step from there to the decay's first under ``wsd``); the schedule's horizon, the Trainer's stop and the stored
    run record follow, and the sizing is settled at the last such step. A step costs the budget's clock from the
    end of the step before to its own end, so the periodic evaluation and checkpoint writes between steps are
    charged, spread over the steps; the first step this process runs also allocates and sets no rate. The
    scheduler has already set the next step's rate when this runs, so the run's rates are those of a run planned
    with the final horizon from its start."""

    def __init__(
        self, trainer: RecoveryTrainer, sized: SizedRun, clock: Callable[[], float], record: dict[str, Any], path: Path
    ) -> None:
        self.trainer, self.sized, self.clock, self.record, self.path = trainer, sized, clock, record, path
        self.first_step: int | None = None
        self.began: float | None = None  # this process's first step began
        self.first_end: float | None = None  # ... and ended
        self.timed = 0  # steps this process ran

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # A resumed run's checkpoint holds the horizon of its save; the stored sizing may be later (it is rewritten
        # at every re-size, a checkpoint only every --save-steps): the sizing wins, and the next rate follows it.
        self.trainer.schedule.horizon = self.sized.max_steps
        scheduler = self.trainer.lr_scheduler
        for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True):
            group["lr"] = base * self.trainer.schedule(state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.began is None:
            self.first_step = state.global_step
            self.began = self.clock()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        now = self.clock()
        self.timed += 1
        if self.first_end is None:
            self.first_end = now
        schedule, step = self.trainer.schedule, state.global_step
        if self.sized.settled or step < schedule.warmup:
            return control
        sized = self.sized
        if schedule.resizable(step) and self.timed >= 2:  # one step (it also allocated) times nothing
            step_seconds = (now - self.first_end) / (self.timed - 1)
            untimed = self.first_step or 0  # the steps a stopped run did before this process resumed it
            sized = resize(sized, step, now - self.began + untimed * step_seconds, step_seconds)
            sized = dataclasses.replace(sized, max_steps=schedule.fit_horizon(step, sized.max_steps))
        self.sized = agreed_sizing(dataclasses.replace(sized, settled=not schedule.resizable(step + 1)))
        schedule.horizon = self.sized.max_steps
        state.max_steps = self.sized.max_steps
        if self.trainer.is_world_process_zero():  # what a resume reads
            atomic_write_text(self.path, to_json({**self.record, "budget": self.sized.to_dict()}))
        for callback in self.trainer.callback_handler.callbacks:  # the progress bar's total, when one shows
            bar = getattr(callback, "training_bar", None)
            if bar is not None and bar.total != self.sized.max_steps:
                bar.total = self.sized.max_steps
                bar.refresh()
        if step >= state.max_steps:  # the steps so far used the budget
            control.should_training_stop = control.should_save = True
        return control


class _NoEvaluationAtStop(transformers.TrainerCallback):
    """Drops the held-out evaluation the Trainer runs at the step training stops at (the last step, a SIGTERM or
    a spent time budget): for a caller that measures the final model on the same blocks itself (``heal``)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if control.should_training_stop:
            control.should_evaluate = False
        return control


@contextlib.contextmanager
def _sigterm_requests(stopper: _StopOnSignal) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        stopper.requested = True

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if old is None else old)


def forward_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """A training forward's logits: no KV cache (``use_cache=False``; a training step never reads one back)."""
    return model(input_ids=ids, use_cache=False).logits


# teacher_distribution's (p_teacher^T, sum p log p), or cached logits' top k and tail bucket
TeacherSide = tuple[torch.Tensor, torch.Tensor] | TopKTeacher


def teacher_side(
    teacher: Any, ids: torch.Tensor, recipe: TrainConfig, rows: torch.Tensor | None = None
) -> TeacherSide | None:
    """The teacher's share of the distillation loss for one batch (None without distillation): its forward
    under ``torch.inference_mode`` (no autograd state at all), its softmax once per batch, not per subnet. A
    ``TeacherLogits`` teacher reads training blocks ``rows`` from the cache instead of running a forward."""
    if teacher is None or not recipe.distill:
        return None
    if is_cached_teacher(teacher):
        if rows is None:
            raise ConfigError("cached teacher logits need the batch's block indices (the trainer's block_index)")
        return teacher.side(rows, recipe.temperature, ids.device)
    with torch.inference_mode(), training_autocast(recipe, ids.device):
        logits = forward_logits(teacher, ids)
    return teacher_distribution(logits, recipe.temperature)  # no_grad; a normal tensor autograd may save


def recipe_loss(logits: torch.Tensor, labels: torch.Tensor, teacher: TeacherSide | None, recipe: TrainConfig) -> Any:
    """The training loss of one forward: CE, or distillation against ``teacher_side``'s targets."""
    if teacher is None:
        return causal_lm_loss(logits, labels)
    if isinstance(teacher, TopKTeacher):
        return distill_from_top_k(logits, teacher, labels, recipe.ce_weight)
    return distill_from_teacher(logits, teacher, labels, recipe.temperature, recipe.ce_weight)


class RecoveryTrainer(transformers.Trainer):
    """``transformers.Trainer`` with CE/distillation loss, a teacher and per-step subnet contexts."""

    def __init__(
        self,
        *args: Any,
        recipe: TrainConfig,
        teacher: Any = None,
        subnet_contexts: SubnetContexts | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.recipe = recipe
        self.teacher = teacher
        self.subnet_contexts = subnet_contexts
        self.model_accepts_loss_kwargs = False  # compute_loss returns a per-batch mean: the Trainer divides by GA
        self.loss_is_scaled_for_ga = False
        self._started = time.perf_counter()
        self._start_step = 0
        self.schedule = make_schedule(recipe.schedule, recipe.warmup_steps, recipe.max_steps)  # a budget moves it
        if is_teacher_model(teacher):
            teacher.eval().requires_grad_(False)
            teacher.to(self.args.device)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """The recipe's schedule over its steps (the Trainer's ``max_steps`` may be a timed run's cap)."""
        if self.lr_scheduler is None:
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, self.schedule)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    @property
    def backward_per_subnet(self) -> bool:
        """Backpropagate each subnet before the next forward (memory of one graph), unless DeepSpeed runs: its
        engine takes one backward per micro-step, so there the subnets of a step share one graph."""
        return not self.is_deepspeed_enabled

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, teacher: TeacherSide | None) -> torch.Tensor:
        return recipe_loss(logits, labels, teacher, self.recipe)

    def compute_loss(
        self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """Held-out: the model's cross-entropy as it is. Training: the teacher's side once per batch (live, cached
        or none), then the recipe's loss per subnet context, each backpropagated before the next (the Python API
        in docs/recovery.md); the step's loss is their mean."""
        ids, labels = inputs["input_ids"], inputs["labels"]
        if not model.training:  # evaluation: held-out CE of the model as it is
            logits = model(input_ids=ids).logits
            loss = causal_lm_loss(logits, labels)
            return (loss, {"logits": logits}) if return_outputs else loss
        targets = teacher_side(self.teacher, ids, self.recipe, inputs.get("block_index"))
        contexts = self.subnet_contexts(self.state.global_step) if self.subnet_contexts else [contextlib.nullcontext()]
        if not contexts:
            raise ConfigError(must_be("subnet_contexts(step)", "a non-empty list of context managers", contexts))
        # One autograd graph alive at a time: every subnet but one is backpropagated here (gradients accumulate,
        # no sync), and the last one's loss goes back to the Trainer, whose backward syncs. The first context
        # (the largest subnet, which uses every weight, as DDP's reduction expects) runs last.
        per_subnet = self.backward_per_subnet
        ordered = [*contexts[1:], contexts[0]] if per_subnet else list(contexts)
        losses, logits = [], None
        for i, context in enumerate(ordered):
            early = per_subnet and i < len(ordered) - 1
            with self.accelerator.no_sync(model) if early else contextlib.nullcontext(), context:
                logits = forward_logits(model, ids)
                loss = self._loss(logits, labels, targets) / len(ordered)
                if early:
                    self.accelerator.backward(loss / self.current_gradient_accumulation_steps)
                    loss = loss.detach()
            losses.append(loss)
        loss = torch.stack(losses).sum()  # the mean over subnets; only the last one still carries a graph
        return (loss, {"logits": logits}) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs:  # training logs: add the token count and throughput of this run
            steps = self.state.global_step - self._start_step
            tokens = steps * self.recipe.tokens_per_step * self.args.world_size
            logs["tokens"] = self.state.global_step * self.recipe.tokens_per_step * self.args.world_size
            logs["tokens_per_s"] = round(tokens / max(time.perf_counter() - self._started, 1e-9), 1)
        super().log(logs, *args, **kwargs)


def fused_targets(targets: tuple[str, ...], names: set[str]) -> tuple[str, ...]:
    """``targets`` with each part a model holds only fused (Phi-3's q/k/v_proj, gate/up_proj) replaced by its fused
    module (qkv_proj, gate_up_proj), once."""
    fused = {part.rsplit(".", 1)[-1]: module.rsplit(".", 1)[-1] for module, parts in FUSED.items() for part in parts}
    out = [fused[t] if t not in names and fused.get(t) in names else t for t in targets]
    return tuple(dict.fromkeys(out))


def lora_targets_of(model: Any, targets: tuple[str, ...]) -> tuple[str, ...]:
    """``targets`` as the model's linear modules name them (``fused_targets``); ConfigError naming the model's linear
    modules when one is not among them (PEFT would fail with a traceback, or skip it silently)."""
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    found = fused_targets(targets, names)
    missing = [t for t in found if t not in names]
    if missing:
        raise ConfigError(must_be("lora_targets", f"linear modules of the model ({sorted(names)})", missing))
    return found


def prepare_model(model: Any, config: TrainConfig) -> Any:
    """The model to train: all weights with ``config.full``, else LoRA adapters (``lora_rank``, ``lora_alpha``,
    ``lora_targets``) added with PEFT - unless ``model`` already is a PEFT model, whose adapters are trained."""
    peft = require("peft", "hf")
    if isinstance(model, peft.PeftModel):
        if config.full:
            raise ConfigError("full=True trains every weight, but the model is a PEFT model; merge its adapter first")
        return model
    if config.full:
        model.requires_grad_(True)
        return model
    targets = lora_targets_of(model, config.lora_targets)
    lora = peft.LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        target_modules=list(targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with peft_wrapping():
        return peft.get_peft_model(model, lora)


def _auto(value: bool | str, default: bool) -> bool:
    return default if value == AUTO else bool(value)


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX), where bf16 autocast trains about
    1.7x faster than float32 (scripts/bench_heal.py); without it, bf16 on the CPU is emulated and slower."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's own probes (private API)
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def uses_bf16(config: TrainConfig) -> bool:
    """``config.bf16`` resolved: ``"auto"`` is on with a CUDA GPU that computes bf16 natively, or, without CUDA, on a CPU
    with native bf16 (``cpu_has_native_bf16``); off otherwise (MPS included)."""
    if torch.cuda.is_available():
        default = gpu_has_native_bf16()
    else:
        default = not torch.backends.mps.is_available() and cpu_has_native_bf16()
    return _auto(config.bf16, default)


def training_autocast(config: TrainConfig, device: torch.device) -> AbstractContextManager:
    """bf16 autocast on ``device`` when the recipe trains in bf16 (``uses_bf16``), else a no-op: the context
    the Trainer runs the student in, used for the teacher's forward and the time budget's probe passes too."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(config))


def training_arguments(config: TrainConfig, out_dir: Path, progress: bool, has_val: bool) -> Any:
    """The ``transformers.TrainingArguments`` of a recipe."""
    cuda = torch.cuda.is_available()
    bf16 = uses_bf16(config)
    checkpointing = "activation_checkpointing"  # the name since transformers 5.x; "gradient_checkpointing" before
    if checkpointing not in transformers.TrainingArguments.__dataclass_fields__:
        checkpointing = "gradient_checkpointing"
    return transformers.TrainingArguments(
        **{
            checkpointing: _auto(config.gradient_checkpointing, cuda),
            f"{checkpointing}_kwargs": {"use_reentrant": False},
        },
        output_dir=str(out_dir / CHECKPOINTS_DIR),
        # Without CUDA, only use_cpu makes accelerate's state multi-CPU (gloo) under ``accelerate launch``;
        # otherwise every process trains alone at world size 1.
        use_cpu=not (cuda or torch.backends.mps.is_available()),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        lr_scheduler_type="cosine",  # unused: RecoveryTrainer.create_scheduler sets the recipe's schedule
        max_grad_norm=1.0,
        bf16=bf16,
        logging_steps=config.logging_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        eval_strategy="steps" if has_val else "no",
        eval_steps=config.eval_steps if has_val else None,
        prediction_loss_only=True,
        label_names=["labels"],
        remove_unused_columns=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=cuda,
        seed=config.seed,
        data_seed=config.seed,
        report_to="none",
        disable_tqdm=not progress,
        ddp_find_unused_parameters=False,
    )


def is_cached_teacher(teacher: Any) -> bool:
    """Whether ``teacher`` is cached logits (``teacher_logits.TeacherLogits``: ``side(rows, T, device)`` and a
    ``key``) rather than a model; duck-typed, so this module and that one (which runs the teacher with this
    module's forward) do not import each other."""
    return hasattr(teacher, "side") and hasattr(teacher, "key")


def is_teacher_model(teacher: Any) -> bool:
    """Whether ``teacher`` is a model to run (not None, a flag, a key or cached logits)."""
    return teacher is not None and not isinstance(teacher, (bool, dict)) and not is_cached_teacher(teacher)


def _logits_digest(teacher: Any) -> str | None:
    """sha256 of the cached teacher logits' key (a ``TeacherLogits`` or its key), None for a live teacher."""
    key = teacher.key if is_cached_teacher(teacher) else teacher if isinstance(teacher, dict) else None
    return None if key is None else hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _run_record(
    config: TrainConfig, blocks: TextBlocks, teacher: Any, minutes: float | None = None, sized: SizedRun | None = None
) -> dict[str, Any]:
    return {
        "config": config.to_dict(),
        "data_sha256": blocks.sha256,
        "blocks_sha256": blocks.fingerprint(),
        "teacher": bool(teacher is not None and teacher is not False),
        "teacher_logits": _logits_digest(teacher),
        "minutes": minutes,
        "budget": sized.to_dict() if sized is not None else None,
    }


def _stored_sizing(folder: Path, config: TrainConfig, budget: TimeBudget | None, resume: bool) -> tuple[Any, Any]:
    """A resumed timed run's recipe: the stored sized steps (never measured again, so it reaches the weights of
    the uninterrupted run) and the warm-up they give. Returns (config, the stored SizedRun or None)."""
    if budget is None or not resume or not (folder / RUN_RECORD).is_file():
        return config, None
    stored = read_json_object(folder / RUN_RECORD).get("budget")
    if not stored:
        return config, None  # a run without --minutes: the minutes compare as changed
    sized = SizedRun.from_dict(stored)
    return dataclasses.replace(config, max_steps=sized.probe_max_steps, warmup_steps=sized.warmup_steps), sized


def agreed_sizing(sized: SizedRun) -> SizedRun:
    """Rank 0's sizing on every rank of a launcher's run: each rank times its own steps, and all must stop at the
    same step (a collective: every rank calls it at the same points)."""
    return SizedRun.from_dict(trainer_ranks().from_main(sized.to_dict()))


def agreed_budget(measure: Callable[[], SizedRun]) -> SizedRun:
    """Rank 0's verdict on a time budget on every rank: each rank runs ``measure`` (its own probe), then all take
    rank 0's sizing, or all refuse with rank 0's one line (BudgetTooSmall). A rank whose probe alone finds the
    budget too small runs rank 0's steps: failing it would fail the run rank 0 sized (a collective)."""
    try:
        outcome: dict[str, Any] | str = measure().to_dict()
    except BudgetTooSmall as err:
        outcome = str(err)
    outcome = trainer_ranks().from_main(outcome)
    if isinstance(outcome, str):
        raise BudgetTooSmall(outcome, every_rank=True)
    return SizedRun.from_dict(outcome)


def trainer_ranks() -> Ranks:
    """The processes of this run in the process group accelerate (so the Trainer) uses, joined here if it is not
    yet; ``Ranks()`` without a launcher."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        require("accelerate", "hf").PartialState()
    return current_ranks()


def check_ranks_agree(job: str, blocks: TextBlocks, config: TrainConfig, *models: Path | None) -> None:
    """ConfigError on every rank of a launcher's run unless all ranks read the same weights (``models``' folders;
    None: none), text blocks and recipe: ranks that disagree would train apart or hang in a collective."""
    ranks = trainer_ranks()
    if ranks.count == 1:
        return
    from nsc_prune.hf.weights.fingerprint import weights_fingerprint

    inputs = {
        "weights": [weights_fingerprint(Path(m)) if m is not None else None for m in models],
        "blocks": blocks.fingerprint(),
        "recipe": config.to_dict(),
    }
    ranks.check_same(f"the inputs of {job} (weights, text, recipe)", inputs)


SHARDED_LAUNCHES = {"ACCELERATE_USE_FSDP": "FSDP", "ACCELERATE_USE_DEEPSPEED": "DeepSpeed"}
"""The variables ``accelerate launch`` sets for a sharded (or engine-run) training, and the plugin's name."""


def refuse_sharded_launch(job: str) -> None:
    """ConfigError under an FSDP or DeepSpeed launch: ``job`` (heal, train-supernet) trains with plain data
    parallelism and merges and writes the unwrapped model, whose weights such a launch may leave sharded."""
    parse_flag = require("accelerate", "hf").utils.parse_flag_from_env
    for variable, plugin in SHARDED_LAUNCHES.items():
        if parse_flag(variable):
            raise ConfigError(
                f"{job} runs plain data parallelism only (every process holds the whole model): this launch asks "
                f"for {plugin} ({variable} is set), which leaves the weights {job} merges and writes sharded. Launch "
                "with `accelerate launch --multi_gpu` or torchrun (docs/recovery.md, 'Several GPUs')",
                every_rank=True,
            )


def check_resume(
    out_dir: str | os.PathLike,
    config: TrainConfig,
    blocks: TextBlocks,
    teacher: bool | dict[str, Any],
    resume: bool,
    budget: TimeBudget | None = None,
) -> str | bool:
    """Before loading any model: the checkpoint ``train`` would resume from (False for none), or the one-line
    refusal of a resume with other settings / of a fresh run over existing checkpoints. ``teacher``: whether a
    teacher is used, or the key of the cached teacher logits (``teacher_logits.logits_key``)."""
    folder = Path(out_dir) / CHECKPOINTS_DIR
    config, _ = _stored_sizing(folder, config, budget, resume)
    minutes = budget.minutes if budget is not None else None
    return _check_resume(folder, _run_record(config, blocks, teacher, minutes), resume)


def _check_resume(folder: Path, record: dict[str, Any], resume: bool) -> str | bool:
    """What to pass as ``resume_from_checkpoint``; refuses a resume with other settings, and a fresh run over
    existing checkpoints."""
    last = transformers.trainer_utils.get_last_checkpoint(str(folder)) if folder.is_dir() else None
    if not resume:
        if last is not None:
            raise InvalidInputError(
                f"{folder} already holds checkpoints of a run; pass --resume to continue it, or remove the folder"
            )
        return False
    if (folder / RUN_RECORD).is_file():
        saved = read_json_object(folder / RUN_RECORD)
        changed = sorted(k for k in record["config"] if saved.get("config", {}).get(k) != record["config"][k])
        keys = ("data_sha256", "blocks_sha256", "teacher", "teacher_logits", "minutes")
        changed += [k for k in keys if saved.get(k) != record[k]]
        if changed:
            raise InvalidInputError(
                f"--resume continues the run in {folder}, which used other settings ({', '.join(changed)} differ); "
                "pass the same settings and data, or drop --resume and use a new output folder"
            )
    return last or False


def train(
    model: Any,
    blocks: TextBlocks,
    config: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    teacher: Any = None,
    subnet_contexts: SubnetContexts | None = None,
    resume: bool = False,
    progress: bool = True,
    callbacks: Sequence[Any] = (),
    budget: TimeBudget | None = None,
    evaluate_at_stop: bool = True,
) -> TrainResult:
    """Train ``model`` on ``blocks`` with the recipe ``config``; checkpoints under ``out_dir/checkpoints``.

    ``model`` is prepared by ``prepare_model`` (LoRA unless ``config.full``; a PEFT model is trained as is).
    ``teacher`` (with ``config.distill``) gives the distillation targets: a model run on every batch, or cached
    ``TeacherLogits`` of ``blocks``. ``subnet_contexts(step)`` returns the
    context managers of the subnets to train at ``step`` (loss = mean over them). ``resume`` continues from the
    last checkpoint of a run with the same recipe and data. ``callbacks``: extra ``TrainerCallback``s.
    ``budget`` (a ``TimeBudget``) replaces ``max_steps`` and caps ``warmup_steps``: they are sized from probe
    passes before the run, the steps re-sized from the warm-up's own steps (``nsc_prune.hf.train.budget``), and
    stored with it; a resumed run reads them back. ``evaluate_at_stop=False`` skips the held-out evaluation at the
    step training stops at (the caller evaluates the final model itself); the periodic ones before it stay.
    """
    out_dir = Path(out_dir)
    if config.distill and teacher is None:
        raise ConfigError("distill=True needs a teacher model")
    config = config.for_model(getattr(model.config, "max_position_embeddings", None))
    if blocks.train.shape[1] != config.seq_len:
        raise InvalidInputError(
            must_be("the blocks' length", f"config.seq_len ({config.seq_len})", blocks.train.shape[1])
        )
    folder = out_dir / CHECKPOINTS_DIR
    config, sized = _stored_sizing(folder, config, budget, resume)
    minutes = budget.minutes if budget is not None else None
    resume_from = _check_resume(folder, _run_record(config, blocks, teacher, minutes, sized), resume)
    transformers.set_seed(config.seed)  # LoRA initialisation is seeded too
    model = prepare_model(model, config)
    probe_seconds = 0.0
    if budget is not None and sized is None:  # before anything is written: a too small budget leaves nothing
        sized = agreed_budget(lambda: measure_budget(model, teacher, blocks, config, budget, subnet_contexts))
        probe_seconds = sized.probe_seconds
        config = dataclasses.replace(config, max_steps=sized.max_steps, warmup_steps=sized.warmup_steps)
        transformers.set_seed(config.seed)  # the run starts from the same random state as an untimed one
    record = _run_record(config, blocks, teacher, minutes, sized)
    has_val = blocks.val.shape[0] > 0
    progress = progress and not is_quiet()  # --quiet (nsc_prune.hf.progress.quiet) silences the Trainer too
    steps, cap = (sized.max_steps, sized.step_cap) if sized is not None else (config.max_steps, config.max_steps)
    args = training_arguments(dataclasses.replace(config, max_steps=cap), out_dir, progress, has_val)
    stopper = _StopOnSignal()
    trainer = RecoveryTrainer(
        model=model,
        args=args,
        train_dataset=_Blocks(blocks.train),
        eval_dataset=_Blocks(blocks.val) if has_val else None,
        data_collator=transformers.default_data_collator,
        callbacks=[*callbacks, stopper],
        recipe=config,
        teacher=teacher,
        subnet_contexts=subnet_contexts,
    )
    if trainer.is_world_process_zero():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / RUN_RECORD, to_json(record))
    if not progress:
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    resizer = None  # a timed run's callback sets the horizon from the sizing when training begins
    if sized is not None:
        resizer = _ResizeWhileRatesAllow(trainer, sized, budget.clock, record, folder / RUN_RECORD)
        trainer.add_callback(resizer)
    if not evaluate_at_stop:  # added last: it sees every other callback's stop
        trainer.add_callback(_NoEvaluationAtStop())
    start_step, seconds = _run_trainer(trainer, resume_from, steps, stopper)
    result = _train_result(trainer, config, folder, start_step, seconds, stopper.requested)
    return dataclasses.replace(result, budget=resizer.sized if resizer else None, probe_seconds=probe_seconds)


def training_device() -> torch.device:
    """The device the Trainer of ``training_arguments`` trains on in this process: the GPU of the launcher's
    ``LOCAL_RANK`` (accelerate's choice; the first GPU without a launcher), else MPS or the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("mps" if torch.backends.mps.is_available() else "cpu")


def measure_budget(
    model: Any,
    teacher: Any,
    blocks: TextBlocks,
    config: TrainConfig,
    budget: TimeBudget,
    subnet_contexts: SubnetContexts | None = None,
) -> SizedRun:
    """Size a timed run: ``budget.passes`` probe passes (forward and backward of one optimizer step's batches,
    as ``RecoveryTrainer.compute_loss`` computes them: teacher, every subnet of step 0) on the training device,
    gradients dropped, no weight or optimizer state touched; then ``size_run``. Raises InvalidInputError when
    no step fits the budget."""
    device = training_device()
    model.to(device).train()
    if is_teacher_model(teacher):
        teacher.eval().requires_grad_(False)
        teacher.to(device)
    rows = blocks.train.shape[0]

    def step(i: int) -> None:
        for micro in range(config.grad_accum):
            index = (torch.arange(config.batch_size) + (i * config.grad_accum + micro) * config.batch_size) % rows
            ids = blocks.train[index].to(device)
            targets = teacher_side(teacher, ids, config, index)
            contexts = subnet_contexts(0) if subnet_contexts else [contextlib.nullcontext()]
            for context in contexts:
                with context, training_autocast(config, device):
                    logits = forward_logits(model, ids)
                (recipe_loss(logits.float(), ids, targets, config) / len(contexts)).backward()
        model.zero_grad(set_to_none=True)

    seconds, per_step = probe(step, budget)
    return size_run(budget.minutes, seconds, per_step, config.tokens_per_step, config.warmup_steps, budget.passes)


def _run_trainer(
    trainer: RecoveryTrainer, resume_from: str | bool, max_steps: int, stopper: _StopOnSignal
) -> tuple[int, float]:
    """Run (or resume) ``trainer`` to ``max_steps``, SIGTERM asking it to stop at the next step. Returns the step
    it started from and the seconds it took."""
    saved_state = None
    if resume_from:
        saved_state = transformers.TrainerState.load_from_json(os.path.join(resume_from, "trainer_state.json"))
    start_step = saved_state.global_step if saved_state else 0
    trainer._start_step = start_step
    started = time.perf_counter()
    trainer._started = started
    if resume_from and start_step >= max_steps:
        # A finished run (one that failed after its last checkpoint): Trainer.train would run one step more.
        trainer.state = saved_state
        trainer._load_from_checkpoint(resume_from)
    else:
        with _sigterm_requests(stopper), library_bars():  # the checkpoint saves' "Writing model shards" too
            trainer.train(resume_from_checkpoint=resume_from or None)
    return start_step, time.perf_counter() - started


def _train_result(
    trainer: RecoveryTrainer, config: TrainConfig, folder: Path, start_step: int, seconds: float, interrupted: bool
) -> TrainResult:
    """What a finished (or stopped) run gives back: the unwrapped model, steps, tokens, losses, last checkpoint."""
    steps = trainer.state.global_step
    world = trainer.args.world_size
    tokens = steps * config.tokens_per_step * world
    history = trainer.state.log_history
    last = transformers.trainer_utils.get_last_checkpoint(str(folder)) if folder.is_dir() else None
    return TrainResult(
        model=trainer.model
        if not hasattr(trainer.accelerator, "unwrap_model")
        else trainer.accelerator.unwrap_model(trainer.model),
        steps=steps,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=(steps - start_step) * config.tokens_per_step * world / max(seconds, 1e-9),
        train_loss=[(h["step"], float(h["loss"])) for h in history if "loss" in h and math.isfinite(h["loss"])],
        val_loss=[(h["step"], float(h["eval_loss"])) for h in history if "eval_loss" in h],
        interrupted=interrupted,
        checkpoint=Path(last) if last else None,
        world_size=world,
    )
