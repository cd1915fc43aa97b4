"""The training recipe: ``TrainConfig`` and its defaults (no torch: ``--help`` reads it; the losses are in
``nsc_prune.hf.train.losses``)."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from nsc_prune._deprecated import forward_moved
from nsc_prune._validation import is_int, is_number, must_be, name_list
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.hf.train.schedule import SCHEDULES

IGNORE_INDEX = -100
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AUTO = "auto"
DEFAULT_SEQ_LEN = 512  # tokens per block when seq_len is unset and the model's context is at least this long
WARMUP_FRACTION = 0.1  # warm-up is at most this share of a run: no run is shorter than its warm-up
# Peak learning rates when none is given (docs/recovery.md, "The learning rate matters most"; recovery_study.md,
# "Half the LoRA rate"): LoRA at 2e-4 recovered least in 6-60 steps; in runs of ~900 steps (rank 64, `wsd`) 5e-4
# was ahead of 1e-3 on both texts tried, and 0-3 % behind it in runs of 20-60 steps. Full fine-tuning needs a
# smaller rate.
LORA_LEARNING_RATE = 5e-4
FULL_LEARNING_RATE = 1e-4
MAX_TEMPERATURE = 100.0
_HOT = "Distillation uses 1 to 10; at 100 softened logits are already near uniform"


def capped_warmup(warmup_steps: int, max_steps: int) -> int:
    """The warm-up a run of ``max_steps`` gets: ``warmup_steps``, at most ``WARMUP_FRACTION`` of the run."""
    return min(int(warmup_steps), math.floor(WARMUP_FRACTION * max_steps))


@dataclass(frozen=True)
class TrainConfig:
    """One recovery-training recipe. Defaults: LoRA r=64 (alpha 128) on every linear, CE (``distill`` for KD),
    the learning rate rising to ``LORA_LEARNING_RATE`` (``FULL_LEARNING_RATE`` with ``full``) over a warm-up of at
    most a tenth of the run, held, and decayed to 0 over the run's last fifth (``schedule``: ``wsd``).

    ``batch_size`` is per process; the global batch is ``batch_size * grad_accum * processes``. With ``distill``
    the loss is ``(1 - ce_weight) * T^2 * KL(teacher || student at T) + ce_weight * CE``. ``bf16``: ``"auto"`` (on
    where the device computes in bf16: a CUDA GPU that supports it, a CPU with AVX512-BF16 or AMX), True or False;
    ``gradient_checkpointing``: ``"auto"`` (on with CUDA), True or False.
    ``seq_len`` None follows the model (``for_model``); a given one must fit the model's context.
    """

    max_steps: int = 1000
    seq_len: int | None = None  # None: min(DEFAULT_SEQ_LEN, the model's max_position_embeddings)
    batch_size: int = 8
    grad_accum: int = 1
    learning_rate: float | None = None  # None: LORA_LEARNING_RATE, or FULL_LEARNING_RATE with ``full``
    warmup_steps: int = 20
    schedule: str = "wsd"  # warm-up, the peak, a decay over the last fifth; "cosine" (schedule.py)
    weight_decay: float = 0.0
    lora_rank: int = 64  # 64 recovered more than 16 at equal minutes on SmolLM2 (docs/recovery.md)
    lora_alpha: int = 128
    lora_targets: tuple[str, ...] = LORA_TARGETS
    full: bool = False
    distill: bool = False
    temperature: float = 1.0
    ce_weight: float = 0.0
    save_steps: int = 200
    eval_steps: int = 200
    seed: int = 0
    bf16: bool | str = AUTO
    gradient_checkpointing: bool | str = AUTO
    logging_steps: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_targets", name_list(self.lora_targets, "lora_targets"))
        if self.seq_len is not None and (not is_int(self.seq_len) or self.seq_len < 2):
            raise ConfigError(
                must_be("seq_len", "an integer >= 2 (unset: the model's context, at most 512)", self.seq_len)
            )
        positive = (
            "max_steps",
            "batch_size",
            "grad_accum",
            "lora_rank",
            "save_steps",
            "eval_steps",
            "logging_steps",
        )
        for name in positive:
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(must_be(name, "an integer >= 1", value))
        for name in ("warmup_steps", "seed"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ConfigError(must_be(name, "an integer >= 0", value))
        if self.seed >= 2**32:  # numpy's seeds are 32-bit
            raise ConfigError(must_be("seed", "below 2**32", self.seed))
        object.__setattr__(self, "warmup_steps", capped_warmup(self.warmup_steps, self.max_steps))
        if self.learning_rate is None:
            default = FULL_LEARNING_RATE if self.full is True else LORA_LEARNING_RATE
            object.__setattr__(self, "learning_rate", default)
        for name in ("learning_rate", "lora_alpha", "temperature"):
            value = getattr(self, name)
            if not (is_number(value) and 0 < value < math.inf):  # NaN and inf failed when the record was written
                raise ConfigError(must_be(name, "a finite number > 0", value))
        if self.temperature > MAX_TEMPERATURE:  # T^2 scales the loss: 1e200 overflowed in the first step
            raise ConfigError(must_be("temperature", f"at most {MAX_TEMPERATURE:g}", self.temperature, _HOT))
        if self.schedule not in SCHEDULES:
            raise ConfigError(must_be("schedule", f"one of {', '.join(SCHEDULES)}", self.schedule))
        if not (is_number(self.weight_decay) and 0 <= self.weight_decay < math.inf):
            raise ConfigError(must_be("weight_decay", "a finite number >= 0", self.weight_decay))
        if not is_number(self.ce_weight) or not 0 <= self.ce_weight <= 1:
            raise ConfigError(must_be("ce_weight", "a number in [0, 1]", self.ce_weight))
        for name in ("full", "distill"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(must_be(name, "true or false", getattr(self, name)))
        for name in ("bf16", "gradient_checkpointing"):
            if getattr(self, name) not in (True, False, AUTO) or is_int(getattr(self, name)):
                raise ConfigError(must_be(name, f"true, false or {AUTO!r}", getattr(self, name)))

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step sees in one process (``seq_len`` resolved by ``for_model``)."""
        return self.batch_size * self.grad_accum * (self.seq_len or DEFAULT_SEQ_LEN)

    def for_model(self, max_positions: int | None, whose: str = "the model's") -> TrainConfig:
        """This recipe for a model whose context is ``max_positions`` tokens (None: unknown): an unset ``seq_len``
        becomes ``min(DEFAULT_SEQ_LEN, max_positions)``; a set one above the context raises InvalidInputError
        naming ``whose`` context it is."""
        if self.seq_len is None:
            seq_len = DEFAULT_SEQ_LEN if not is_int(max_positions) else min(DEFAULT_SEQ_LEN, max_positions)
            return dataclasses.replace(self, seq_len=seq_len)
        if is_int(max_positions) and self.seq_len > max_positions:
            raise InvalidInputError(
                must_be(
                    "--seq-len",
                    f"at most {whose} max_position_embeddings ({max_positions})",
                    self.seq_len,
                    "Pass a smaller --seq-len, or leave it out to follow the model",
                )
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lora_targets"] = list(self.lora_targets)
        return data

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> TrainConfig:
        """A recipe from flags and ``--set`` pairs: unknown keys raise (naming the close ones), a float field's
        string (YAML reads ``3e-3`` as one) is read as a number."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            close = sorted({m for key in unknown for m in difflib.get_close_matches(key, known, n=1)})
            hint = f"Did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(
                must_be("--set KEY", "a TrainConfig field", ", ".join(unknown), f"{hint}Known: {', '.join(known)}")
            )
        floats = {f.name for f in fields(cls) if "float" in str(f.type)}  # annotations are strings here
        data = dict(settings)
        for key in floats & set(data):
            if isinstance(data[key], str):
                with contextlib.suppress(ValueError):
                    data[key] = float(data[key])
        config = cls(**data)
        unused = {  # settings the recipe would ignore: said, as a flag given twice would be
            "--full trains every weight, and no LoRA adapter": config.full
            and ("lora_rank", "lora_alpha", "lora_targets"),
            "distillation settings need a teacher (--teacher)": not config.distill and ("temperature", "ce_weight"),
        }
        for why, keys in unused.items():
            given = [f"--{key.replace('_', '-')}" for key in keys or () if key in settings]
            if given:
                raise ConfigError(f"{' and '.join(given)} would be ignored: {why}; drop {' and '.join(given)}")
        return config

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def is_cached_teacher(teacher: Any) -> bool:
    """Whether ``teacher`` is cached logits (``teacher_logits.TeacherLogits``: ``side(rows, T, device)`` and a
    ``key``) rather than a model; duck-typed, since that module imports this one."""
    return hasattr(teacher, "side") and hasattr(teacher, "key")


def is_teacher_model(teacher: Any) -> bool:
    """Whether ``teacher`` is a model to run (not None, a flag, a key or cached logits)."""
    return teacher is not None and not isinstance(teacher, (bool, dict)) and not is_cached_teacher(teacher)


_LOSSES = (
    "TopKTeacher",
    "causal_lm_loss",
    "distill_from_teacher",
    "distill_from_top_k",
    "distillation_loss",
    "teacher_distribution",
    "top_k_teacher",
)
__getattr__ = forward_moved(
    __name__, dict.fromkeys(_LOSSES, "nsc_prune.hf.train.losses")
)  # moved: this module is torch-free
