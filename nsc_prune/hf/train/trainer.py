"""Recovery training on ``transformers.Trainer``: CE or distillation, optional subnet sampling, resumable.

``train`` subclasses ``transformers.Trainer`` only to override ``compute_loss`` (the TRL distillation pattern):
the teacher's logits are computed once per batch (eval mode, no grad), then for each context manager that
``subnet_contexts(step)`` returns the student runs inside ``with ctx:`` and the step's loss is the mean over
subnets (each subnet's graph is backpropagated before the next forward, except under DeepSpeed). Everything
else - optimizer, schedule, gradient accumulation, checkpoints, resume, mixed precision, gradient
checkpointing, data parallelism under ``accelerate launch``/``torchrun``, FSDP and DeepSpeed through
``accelerate config`` - is the Trainer's own (the heal and train-supernet commands refuse FSDP and DeepSpeed:
``launch.refuse_sharded_launch``).

Checkpoints go to ``OUT/checkpoints/checkpoint-STEP`` (safetensors weights; optimizer and RNG state as the
Trainer writes them); ``OUT/checkpoints/nsc_prune_train.json`` holds the recipe and the data hashes a
resumed run must match. SIGTERM (or SIGHUP) makes the Trainer save a checkpoint and stop at the end of the current step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from pickle import UnpicklingError  # its error type only: torch files are read with weights_only=True
from typing import Any

from nsc_prune._deprecated import forward_moved
from nsc_prune._io import atomic_write_text, file_size_limit, safetensors_write_error, stop_signal, to_json
from nsc_prune._validation import must_be
from nsc_prune._warn import say_held_warnings
from nsc_prune.core.spec import fused_targets
from nsc_prune.errors import ConfigError, InterruptedRun, InvalidInputError, StoppedRun, require
from nsc_prune.hf.progress import bars_seen, is_quiet, library_bars, prints_log_lines, quiet_logger
from nsc_prune.hf.progress import progress as progress_bar  # train()'s own `progress` is a flag
from nsc_prune.hf.random_state import keeps_random_state
from nsc_prune.hf.ranks import Ranks, import_before_any_group, launched_processes
from nsc_prune.hf.train.budget import SizedRun, TimeBudget, probe, size_run
from nsc_prune.hf.train.callbacks import (
    BarOnStderr,
    LogLines,
    NoEvaluationAtStop,
    ResizeWhileRatesAllow,
    StopOnDivergence,
    StopOnSignal,
    sigterm_requests,
    tensors_finite,
)
from nsc_prune.hf.train.data import TextBlocks
from nsc_prune.hf.train.launch import agreed_budget, training_device
from nsc_prune.hf.train.losses import (
    TopKTeacher,
    causal_lm_loss,
    distill_from_teacher,
    distill_from_top_k,
    teacher_distribution,
)
from nsc_prune.hf.train.precision import resolve_auto, training_autocast, uses_bf16
from nsc_prune.hf.train.recipe import TrainConfig, is_cached_teacher, is_teacher_model
from nsc_prune.hf.train.resume import (
    CHECKPOINTS_DIR,
    RUN_RECORD,
    TRAINER_STATE,
    asked_warmup,
    checkpoint_to_resume,
    last_checkpoint,
    run_record,
    saved_checkpoints,
    stored_sizing,
)
from nsc_prune.hf.train.schedule import make_schedule
from nsc_prune.hf.weights.adapter import peft_wrapping

torch = require("torch", "hf")
transformers = require("transformers", "hf")

SubnetContexts = Callable[[int], Sequence[AbstractContextManager]]


@dataclass
class TrainResult:
    """What a run did: the trained model (a PEFT model when LoRA was added), steps, tokens, time and losses.

    ``train_loss`` and ``val_loss`` are ``(step, loss)`` pairs; ``interrupted`` is True when a stop signal
    (``stopped_by``: SIGTERM, SIGHUP) stopped the run early (its last checkpoint is ``checkpoint``; continue with
    ``resume=True``).
    """

    model: Any = field(repr=False)  # the module tree: pages of text for any model
    steps: int
    tokens: int
    seconds: float
    tokens_per_s: float
    train_loss: list[tuple[int, float]] = field(default_factory=list)
    val_loss: list[tuple[int, float]] = field(default_factory=list)
    interrupted: bool = False
    checkpoint: Path | None = None
    stopped_by: str | None = None  # the stop signal's name when ``interrupted``
    world_size: int = 1
    budget: SizedRun | None = None  # the time budget's sizing (``train(budget=...)``), stored with the run
    probe_seconds: float = 0.0  # the probe passes this process ran (0 when a resumed run read the sizing back)
    resumed_from_step: int = 0  # the checkpoint's step this process continued from: seconds and tokens/s are its own

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
            "resumed_from_step": self.resumed_from_step,
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

    @contextlib.contextmanager
    def kept_on_stop(self) -> Iterator[None]:
        """While the finished run's output is evaluated and written: a Ctrl-C or a stop signal says that the run's last
        checkpoint holds it, so that the same command with ``--resume`` writes the output without training again."""
        if self.checkpoint is None:
            yield
            return
        try:
            yield
        except KeyboardInterrupt:
            raise InterruptedRun(
                f"interrupted before the output was written; the finished run is in {self.checkpoint}: run the same "
                "command with --resume to write it without training again"
            ) from None
        except SystemExit as stop:
            signal_name = stop_signal(stop.code)
            if signal_name is None:
                raise
            raise StoppedRun(self.steps, self.checkpoint, signal_name) from None
        except Exception as err:  # a full disk: the OSError named no path and no way on
            fix = _write_failure_fix(err)
            if fix is None:
                raise
            shown = (
                f"{_first_line(err)}: {err.filename}" if isinstance(err, OSError) and err.filename else _first_line(err)
            )
            raise InvalidInputError(
                f"could not write the output ({shown}); the finished run is in {self.checkpoint}: {fix}, then run the "
                "same command with --resume to write it without training again"
            ) from err


def _write_failure_fix(err: BaseException) -> str | None:
    """What to do about ``err`` when it is a failure to write a file: ``make room`` (a full disk) or ``fix that``;
    None for any other error, which keeps its traceback. torch.save's zip writer (inline_container.cc) raises
    RuntimeError on a full disk ("failed writing file", or "unexpected pos" when the disk fills between two
    records), safetensors a SafetensorError."""
    torch_writer = isinstance(err, RuntimeError) and any(s in str(err) for s in ("writ", "inline_container"))
    if not (isinstance(err, OSError) or safetensors_write_error(err) or torch_writer):
        return None
    if (isinstance(err, OSError) and err.errno == errno.EFBIG) or f"(os error {errno.EFBIG})" in str(err):
        return "lift the file-size limit (ulimit -f), or pass a --work-dir on a file system that takes larger files"
    if isinstance(err, OSError) and err.errno not in (errno.ENOSPC, errno.EDQUOT):
        return "fix that"
    limit = file_size_limit()  # torch's zip writer says no more than a full disk does
    return "make room" if limit is None else f"make room, or lift the file-size limit (ulimit -f: {limit} bytes)"


def _first_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


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
            logits = forward_logits(model, ids)
            n = ids[:, 1:].numel()
            total += float(causal_lm_loss(logits, ids)) * n
            count += n
    finally:
        model.train(was_training)
    total, count = ranks.sum_floats([total, count])
    return total / count


def untrained_loss(model: Any, blocks: torch.Tensor, batch_size: int, name: str, ranks: Ranks = Ranks()) -> float:
    """``evaluate_loss`` of a model before any training; InvalidInputError naming it (``name``) when the loss is
    NaN or inf: its weights are finite (checked on loading), so its outputs overflow, and training would stop at
    step 1 blaming the learning rate."""
    loss = evaluate_loss(model, blocks, batch_size, ranks)
    if not math.isfinite(loss):
        raise InvalidInputError(
            f"{name}: its loss on the text is {loss} before any training, its weights finite but its "
            "outputs overflow float32; check its weights (a value near the float range's edge)"
        )
    return loss


def forward_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """A training or held-out forward's logits: no KV cache (``use_cache=False``; nothing reads one back)."""
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
        self._start_tokens = 0  # tokens seen when this process's run began (a resumed run's checkpoint's)
        self.schedule = make_schedule(recipe.schedule, recipe.warmup_steps, recipe.max_steps)  # a budget moves it
        if is_teacher_model(teacher):
            teacher.eval().requires_grad_(False)
            teacher.to(self.args.device)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """A checkpoint the disk cannot hold fails in one line that says how to go on, not in torch's traceback."""
        try:
            # "mtime may not be reliable": checkpoints under a second apart; the step order it falls back to is right
            with quiet_logger("transformers.trainer_utils", logging.ERROR):
                super()._save_checkpoint(model, trial)
        except Exception as err:
            fix = _write_failure_fix(err)
            if fix is None:
                raise
            folder = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
            then = (
                "run the same command with --resume: it continues from the last whole checkpoint"
                if last_checkpoint(Path(self.args.output_dir)) is not None
                else "run the same command again: no checkpoint was written whole, so it starts at the first step"
            )
            raise InvalidInputError(
                f"could not write the checkpoint {folder} ({_first_line(err)}); {fix}, then {then}"
            ) from err

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
            logits = forward_logits(model, ids)
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


def lora_targets_of(model: Any, targets: tuple[str, ...]) -> tuple[str, ...]:
    """``targets`` as the model's linear modules name them (``fused_targets``); ConfigError naming the model's linear
    modules when one is not among them (PEFT would fail with a traceback, or skip it silently)."""
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    found = fused_targets(targets, names)
    missing = [t for t in found if t not in names]
    if missing:
        raise ConfigError(must_be("lora_targets", f"linear modules of the model ({sorted(names)})", missing))
    return found


def lora_config_for(model: Any, config: TrainConfig) -> Any:
    """PEFT's ``LoraConfig`` of a recipe for ``model``: its targets as the model names them (``lora_targets_of``);
    ConfigError for a rank above every targeted matrix's (it adds nothing there, and a huge one failed in torch)."""
    peft = require("peft", "hf")
    targets = lora_targets_of(model, config.lora_targets)
    largest = max(
        min(module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    )
    if config.lora_rank > largest:
        raise ConfigError(
            must_be("lora_rank", f"at most {largest}, the largest rank of a targeted matrix", config.lora_rank)
        )
    return peft.LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        target_modules=list(targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def adapted_modules(model: Any) -> list[str] | None:
    """The modules ``model``'s LoRA adapters sit on, as the model names them (a fused family's ``q_proj`` is its
    whole ``qkv_proj``); None for a model without one (``--full``)."""
    lora = getattr(model, "peft_config", {}).get("default")
    if lora is None:
        return None
    targets = lora.target_modules  # PEFT also takes one regular expression as a string
    return [targets] if isinstance(targets, str) else sorted(targets)


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
    lora = lora_config_for(model, config)
    with peft_wrapping():
        return peft.get_peft_model(model, lora)


CHECKPOINTING_KWARGS = {"use_reentrant": False}


def _without_checkpointing(config: TrainConfig) -> TrainConfig:
    """``config`` for subnet contexts: checkpointing recomputes a layer's forward in the backward pass, after the
    subnet's context has exited, so it would run the full network (wrong gradients, or torch's CheckpointError):
    ``auto`` (on with CUDA) turns it off, ``True`` is refused."""
    if config.gradient_checkpointing is True:
        raise ConfigError(
            must_be(
                "gradient_checkpointing",
                "false or auto with subnet_contexts",
                True,
                "Subnet masks are not active when checkpointing recomputes the forward",
            )
        )
    if not uses_checkpointing(config):  # "auto" without CUDA: the run's record keeps the setting (resumes match)
        return config
    return dataclasses.replace(config, gradient_checkpointing=False)


def uses_checkpointing(config: TrainConfig) -> bool:
    """Whether ``config``'s steps recompute activations in the backward pass (``auto``: on with CUDA)."""
    return resolve_auto(config.gradient_checkpointing, torch.cuda.is_available())


def training_arguments(config: TrainConfig, out_dir: Path, progress: bool, has_val: bool) -> Any:
    """The ``transformers.TrainingArguments`` of a recipe."""
    import_before_any_group()  # under a launcher, TrainingArguments may make the process group
    cuda = torch.cuda.is_available()
    bf16 = uses_bf16(config)
    checkpointing = "activation_checkpointing"  # the name since transformers 5.x; "gradient_checkpointing" before
    if checkpointing not in transformers.TrainingArguments.__dataclass_fields__:
        checkpointing = "gradient_checkpointing"
    args = transformers.TrainingArguments(
        **{checkpointing: uses_checkpointing(config), f"{checkpointing}_kwargs": dict(CHECKPOINTING_KWARGS)},
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
        logging_nan_inf_filter=False,
        include_num_input_tokens_seen=True,  # the record's tokens: an epoch's last step may hold fewer blocks  # a NaN loss is logged as such (StopOnDivergence), not as the steps' mean
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=2,  # a resume needs the last; the one before it stands in if the last was cut short
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
        disable_tqdm=not _draws_bar(progress),  # a command off a terminal: LogLines' lines
        ddp_find_unused_parameters=False,
    )
    # not ACCELERATE_MIXED_PRECISION (accelerate launch sets it from the user's accelerate config), which transformers
    # reads when bf16 is off: the recipe's precision trains, as the record says
    args.mixed_precision = "bf16" if bf16 else "no"
    return args


@keeps_random_state
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
    inputs: dict[str, Any] | None = None,
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
    ``inputs``: fingerprints of what the run starts from (the model folders, the space), stored with the run and
    checked on ``resume`` (``nsc_prune.hf.train.resume.run_record``).
    """
    out_dir = Path(out_dir)
    if config.distill and teacher is None:
        raise ConfigError("distill=True needs a teacher model")
    config = config.for_model(getattr(model.config, "max_position_embeddings", None))
    config = _without_checkpointing(config) if subnet_contexts is not None else config
    check_blocks(blocks, config)
    folder = out_dir / CHECKPOINTS_DIR
    warmup = asked_warmup(config, budget)
    config, sized = stored_sizing(folder, config, budget, resume)
    minutes = budget.minutes if budget is not None else None
    record = run_record(config, blocks, teacher, minutes, sized, inputs, warmup)
    resume_from = checkpoint_to_resume(folder, record, resume)
    transformers.set_seed(config.seed)  # LoRA initialisation is seeded too
    model = prepare_model(model, config)
    probe_seconds = 0.0
    say_held_warnings()  # before the wait (a timed run's probe steps included), not after it
    if budget is not None and sized is None:  # before anything is written: a too small budget leaves nothing
        sized = agreed_budget(lambda: measure_budget(model, teacher, blocks, config, budget, subnet_contexts))
        probe_seconds = sized.probe_seconds
        config = dataclasses.replace(config, max_steps=sized.max_steps, warmup_steps=sized.warmup_steps)
        transformers.set_seed(config.seed)  # the run starts from the same random state as an untimed one
    record = run_record(config, blocks, teacher, minutes, sized, inputs, warmup)
    has_val = blocks.val.shape[0] > 0
    progress = progress and not is_quiet()  # --quiet (nsc_prune.hf.progress.quiet) silences the Trainer too
    steps, cap = (sized.max_steps, sized.step_cap) if sized is not None else (config.max_steps, config.max_steps)
    args = training_arguments(dataclasses.replace(config, max_steps=cap), out_dir, progress, has_val)
    stopper = StopOnSignal()
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
    resizer = None  # a timed run's callback sets the horizon from the sizing when training begins
    if sized is not None:
        resizer = ResizeWhileRatesAllow(trainer, sized, budget.clock, record, folder / RUN_RECORD)
        trainer.add_callback(resizer)
    _show_progress(trainer, progress, resizer)
    if not evaluate_at_stop:  # added last: it sees every other callback's stop
        trainer.add_callback(NoEvaluationAtStop())
    start_step, seconds = _run_trainer(trainer, resume_from, steps, stopper)
    result = _train_result(trainer, folder, start_step, seconds, stopper.signal_name)
    return dataclasses.replace(result, budget=resizer.sized if resizer else None, probe_seconds=probe_seconds)


def _draws_bar(progress: bool) -> bool:
    """Whether the Trainer draws its bar: ``progress`` asked for, seen (``bars_seen``), and not a log's lines."""
    return progress and not prints_log_lines() and bars_seen()


def _show_progress(trainer: RecoveryTrainer, progress: bool, resizer: ResizeWhileRatesAllow | None) -> None:
    """The Trainer's bar on a terminal (``training_arguments``; its logged dicts on stderr: ``BarOnStderr``), LogLines' lines in a log (``log_lines``: not the
    Trainer's dicts; a timed run's total as ``resizer`` sized it), nothing without ``progress`` or where no one
    sees a bar (a library call whose stderr is a file: neither the bar's redraws nor the Trainer's dicts)."""
    if _draws_bar(progress):
        if trainer.pop_callback(transformers.trainer_callback.ProgressCallback) is not None:  # a notebook's is not
            trainer.add_callback(BarOnStderr)
    else:
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    if progress and prints_log_lines():
        trainer.add_callback(LogLines(planned=(lambda: resizer.sized.max_steps) if resizer else None))


def check_blocks(blocks: TextBlocks, config: TrainConfig) -> None:
    """InvalidInputError unless the blocks are ``config.seq_len`` long and one step's batches fit in them (else the
    record would count tokens no step held)."""
    rows, length = blocks.train.shape
    if length != config.seq_len:
        raise InvalidInputError(must_be("the blocks' length", f"config.seq_len ({config.seq_len})", length))
    if config.batch_size > rows:
        raise InvalidInputError(
            must_be(
                "--batch-size",
                f"at most the {rows} training blocks of {config.seq_len} tokens the text gives",
                config.batch_size,
                "Pass a smaller --batch-size (or --seq-len), or more text",
            )
        )
    if config.batch_size * config.grad_accum > rows:  # the Trainer steps at the epoch's end with fewer batches
        raise InvalidInputError(
            must_be(
                "--grad-accum",
                f"at most {rows // config.batch_size} with --batch-size {config.batch_size}: a step takes "
                f"--batch-size x --grad-accum of the {rows} training blocks",
                config.grad_accum,
                "Pass a smaller --grad-accum, or more text",
            )
        )
    processes = launched_processes()  # each rank takes its own share of a step's blocks
    if config.batch_size * config.grad_accum * processes > rows:
        raise InvalidInputError(
            must_be(
                "--batch-size x --grad-accum x processes",
                f"at most the {rows} training blocks of {config.seq_len} tokens the text gives (one step's blocks, "
                "each held once)",
                f"{config.batch_size} x {config.grad_accum} x {processes}",
                "Pass a smaller --batch-size, fewer processes, or more text",
            ),
            every_rank=True,  # every rank reads the same text: said once
        )


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
    if uses_checkpointing(config):  # as the Trainer's steps will run (train() enables it): their memory and time
        if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x, as in the arguments
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=dict(CHECKPOINTING_KWARGS))
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(CHECKPOINTING_KWARGS))
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
        if device.type == "cuda":  # the clock reads the step done, not its kernels queued
            torch.cuda.synchronize(device)
        elif device.type == "mps":
            torch.mps.synchronize()

    seconds, per_step = probe(step, budget)
    warmup = config.warmup_steps if budget.warmup_steps is None else budget.warmup_steps
    return size_run(budget.minutes, seconds, per_step, config.tokens_per_step, warmup, budget.passes)


@contextlib.contextmanager
def _read_safely(checkpoint: str | None) -> Iterator[None]:
    """One line for a resumed checkpoint's torch file (``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth``) that
    the Trainer's ``torch.load(weights_only=True)`` refuses: it holds pickled objects, not plain state."""
    try:
        yield
    except UnpicklingError as err:
        if not checkpoint:
            raise
        raise InvalidInputError(
            f"--resume: a torch file in {checkpoint} holds objects that are not plain tensors and numbers, which "
            f"are not loaded ({type(err).__name__}); remove {checkpoint} to continue from the checkpoint before it"
        ) from err


def _run_trainer(
    trainer: RecoveryTrainer, resume_from: str | None, max_steps: int, stopper: StopOnSignal
) -> tuple[int, float]:
    """Run (or resume) ``trainer`` to ``max_steps``, SIGTERM (SIGHUP) asking it to stop at the next step, a NaN loss
    stopping it with an error. Returns the step it started from and the seconds it took."""
    saved_state = None
    if resume_from:
        saved_state = transformers.TrainerState.load_from_json(os.path.join(resume_from, TRAINER_STATE))
    start_step = saved_state.global_step if saved_state else 0
    trainer._start_tokens = saved_state.num_input_tokens_seen if saved_state else 0
    started = time.perf_counter()
    if resume_from and start_step >= max_steps:
        # A finished run (one that failed after its last checkpoint): Trainer.train would run one step more.
        trainer.state = saved_state
        with _read_safely(resume_from):
            trainer._load_from_checkpoint(resume_from)
    else:
        divergence = StopOnDivergence()
        trainer.add_callback(divergence)
        folder = Path(trainer.args.output_dir)
        with sigterm_requests(stopper), library_bars():  # the checkpoint saves' "Writing model shards" too
            try:
                with _read_safely(resume_from):
                    trainer.train(resume_from_checkpoint=resume_from)
            except KeyboardInterrupt:
                last = last_checkpoint(folder)  # not one the interrupt cut short
                if last is None:  # none to resume from: an unfinished first one would only refuse the next run
                    for unfinished in saved_checkpoints(folder):
                        shutil.rmtree(unfinished, ignore_errors=True)
                    raise
                raise InterruptedRun(
                    f"interrupted; the last checkpoint is {last}: run the same command with --resume to continue "
                    f"from it, or remove {folder.parent} to start again"
                ) from None
        if divergence.step is None and not tensors_finite(p for p in trainer.model.parameters() if p.requires_grad):
            divergence.step = trainer.state.global_step  # the last update overflowed: no step after it to see it
        if divergence.step is not None:
            kept = last_checkpoint(folder) is not None  # without one, a fresh run's folder is removed (resume.py)
            remove = f", and remove {folder.parent} (the run's checkpoints) first or pass another --work-dir"
            raise InvalidInputError(
                f"training diverged: the loss, its gradients or the weights were NaN or inf, or no gradient was "
                f"left, at step {divergence.step} (learning rate {trainer.args.learning_rate:g}); lower --learning-rate"
                + (remove if kept else "")
            )
    return start_step, time.perf_counter() - started


def _train_result(
    trainer: RecoveryTrainer, folder: Path, start_step: int, seconds: float, stopped_by: str | None
) -> TrainResult:
    """What a finished (or stopped) run gives back: the unwrapped model, steps, tokens, losses, last checkpoint."""
    steps = trainer.state.global_step
    world = trainer.args.world_size
    tokens = trainer.state.num_input_tokens_seen  # every process's, gathered at each step
    history = trainer.state.log_history
    last = last_checkpoint(folder)
    return TrainResult(
        model=trainer.model
        if not hasattr(trainer.accelerator, "unwrap_model")
        # without the bf16-autocast wrapper accelerate puts on forward: a heal's loss after ran in bf16
        else trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False),
        steps=steps,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=(tokens - trainer._start_tokens) / max(seconds, 1e-9),
        train_loss=[(h["step"], float(h["loss"])) for h in history if "loss" in h and math.isfinite(h["loss"])],
        val_loss=[(h["step"], float(h["eval_loss"])) for h in history if "eval_loss" in h],
        interrupted=stopped_by is not None,
        checkpoint=Path(last) if last else None,
        stopped_by=stopped_by,
        world_size=world,
        resumed_from_step=start_step,
    )


# Public names this module had before it was split by job: they resolve, with a DeprecationWarning, for one release.
__getattr__ = forward_moved(
    __name__,
    {
        "SHARDED_LAUNCHES": "nsc_prune.hf.train.launch",
        "agreed_sizing": "nsc_prune.hf.train.launch",
        "check_ranks_agree": "nsc_prune.hf.train.launch",
        "check_resume": "nsc_prune.hf.train.resume",
        "cpu_has_native_bf16": "nsc_prune.hf.train.precision",
        "refuse_sharded_launch": "nsc_prune.hf.train.launch",
        "trainer_ranks": "nsc_prune.hf.train.launch",
    },
)
