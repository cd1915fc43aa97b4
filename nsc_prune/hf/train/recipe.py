"""The training recipe (``TrainConfig``) and the two losses: causal-LM cross-entropy and distillation."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from nsc_prune._validation import is_int, is_number, must_be, name_list
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.train.schedule import SCHEDULES

torch = require("torch", "hf")
F = torch.nn.functional

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
    the loss is ``(1 - ce_weight) * T^2 * KL(teacher || student at T) + ce_weight * CE``. ``bf16`` and
    ``gradient_checkpointing``: ``"auto"`` (on with CUDA, bf16 only where supported), True or False.
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

    def for_model(self, max_positions: int | None) -> TrainConfig:
        """This recipe for a model whose context is ``max_positions`` tokens (None: unknown): an unset ``seq_len``
        becomes ``min(DEFAULT_SEQ_LEN, max_positions)``; a set one above the context raises InvalidInputError."""
        if self.seq_len is None:
            seq_len = DEFAULT_SEQ_LEN if not is_int(max_positions) else min(DEFAULT_SEQ_LEN, max_positions)
            return dataclasses.replace(self, seq_len=seq_len)
        if is_int(max_positions) and self.seq_len > max_positions:
            raise InvalidInputError(
                must_be(
                    "--seq-len",
                    f"at most the model's max_position_embeddings ({max_positions})",
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


def _shift(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Position t predicts token t+1: logits [N, V] and labels [N] of the predicted positions."""
    return logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the positions whose label is not -100 (computed in float32)."""
    flat, target = _shift(logits, labels)
    return F.cross_entropy(flat.float(), target, ignore_index=IGNORE_INDEX)


def teacher_distribution(teacher_logits: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's side of the distillation loss, once per batch and without autograd: ``p_teacher^T``
    [B, L-1, V] at the predicted positions and ``sum_v p log p`` [B, L-1] (float32)."""
    with torch.no_grad():
        z = teacher_logits[:, :-1].float()
        log_p = F.log_softmax(z if temperature == 1 else z / temperature, dim=-1)
        p = log_p.exp()
        return p, torch.linalg.vecdot(p, log_p)


def distill_from_teacher(
    student_logits: torch.Tensor,
    teacher: tuple[torch.Tensor, torch.Tensor],
    labels: torch.Tensor,
    temperature: float = 1.0,
    ce_weight: float = 0.0,
) -> torch.Tensor:
    """``distillation_loss`` with the teacher's side precomputed (``teacher_distribution``).

    Per predicted position, ``KL(p || q) = sum p log p - sum p log q`` and, as ``sum p = 1``,
    ``-sum p log q = logsumexp(z) - <p, z>`` with ``z`` the student's logits over ``T``: one logsumexp and one
    dot product over the vocabulary, no [N, V] log-softmax, no boolean-indexed copies of the logits; positions
    whose label is -100 are weighted 0. The gradient is the usual ``(softmax(z) - p) / T`` (``_KL``).
    """
    p, neg_entropy = teacher
    if student_logits[:, :-1].shape != p.shape:
        raise ConfigError(
            must_be(
                "the teacher's logits",
                f"shaped like the student's {list(student_logits.shape)}",
                [p.shape[0], p.shape[1] + 1, p.shape[2]],
                "The teacher must share the student's tokenizer and vocabulary",
            )
        )
    keep = (labels[:, 1:] != IGNORE_INDEX).float()
    weight = keep / keep.sum().clamp(min=1)  # [B, L-1]: the mean over the predicted positions
    loss = (1 - ce_weight) * temperature**2 * _KL.apply(student_logits, p, neg_entropy, weight, temperature)
    if ce_weight > 0:
        loss = loss + ce_weight * _weighted_ce(student_logits, labels, weight)
    return loss


def _weighted_ce(student_logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``sum_t w_t CE_t`` over the predicted positions (float32; labels -100 read as 0, their weight is 0)."""
    s = student_logits[:, :-1].float()
    target = labels[:, 1:].clamp(min=0).unsqueeze(-1)
    return ((torch.logsumexp(s, dim=-1) - s.gather(-1, target).squeeze(-1)) * weight).sum()


class _KL(torch.autograd.Function):
    """``sum_t w_t KL(p_t || softmax(z_t))`` with ``z = logits[:, :-1] / T``; the gradient
    ``w_t (softmax(z_t) - p_t) / T`` written straight into one [B, L, V] tensor (zero at the last position),
    instead of autograd's chain of [N, V] temporaries through logsumexp, the dot product and the slice."""

    @staticmethod
    def forward(ctx: Any, logits: Any, p: Any, neg_entropy: Any, weight: Any, temperature: float) -> Any:
        s = logits[:, :-1].float()  # a view (no copy) for float32 logits
        z = s if temperature == 1 else s / temperature
        lse = torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(logits, p, weight, lse)
        ctx.temperature = temperature
        return ((neg_entropy + lse - torch.linalg.vecdot(p, z)) * weight).sum()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        logits, p, weight, lse = ctx.saved_tensors
        t = ctx.temperature
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        body = out[:, :-1]
        s = logits[:, :-1].float()
        torch.sub(s if t == 1 else s / t, lse.unsqueeze(-1), out=body)
        body.exp_().sub_(p).mul_((weight * (grad / t)).unsqueeze(-1))
        out[:, -1].zero_()
        return out.to(logits.dtype), None, None, None, None


class TopKTeacher(NamedTuple):
    """A teacher's ``k`` most likely next tokens with the rest of its mass kept as one bucket (cached logits):
    ``indices`` [B, L-1, k] (long), their probabilities ``p`` [B, L-1, k] (at temperature 1, not renormalised),
    ``tail = 1 - sum p`` [B, L-1], and the teacher's side of the KL, ``sum p log p + tail log tail`` [B, L-1]."""

    indices: torch.Tensor
    p: torch.Tensor
    tail: torch.Tensor
    neg_entropy: torch.Tensor


def top_k_teacher(indices: torch.Tensor, log_p: torch.Tensor) -> TopKTeacher:
    """``TopKTeacher`` from the top-k token ids and their log-probabilities over the whole vocabulary."""
    log_p = log_p.float()
    p = log_p.exp()
    tail = (1 - p.sum(-1)).clamp(min=0)
    return TopKTeacher(indices.long(), p, tail, (p * log_p).sum(-1) + torch.xlogy(tail, tail))


def distill_from_top_k(
    student_logits: torch.Tensor, teacher: TopKTeacher, labels: torch.Tensor, ce_weight: float = 0.0
) -> torch.Tensor:
    """Distillation from a teacher's top k plus one bucket for the rest (temperature 1).

    Per predicted position, the exact KL between the teacher's and the student's distributions over ``k + 1``
    outcomes: each of the teacher's top ``k`` tokens, and "any other token". Renormalising the top k instead
    (``p`` zero elsewhere) would teach the student to put no mass outside them; the bucket keeps the tail's mass
    and lets the student spread it as it likes. Its gradient is ``softmax(z) - p'`` with ``p'`` the teacher's
    top k and, on every other token, the student's own share of its tail scaled to the teacher's tail mass.
    """
    if student_logits[:, :-1].shape[:2] != teacher.p.shape[:2]:
        raise ConfigError(
            must_be(
                "the teacher's top-k targets",
                f"one per predicted position of {list(student_logits.shape)}",
                list(teacher.p.shape),
            )
        )
    keep = (labels[:, 1:] != IGNORE_INDEX).float()
    weight = keep / keep.sum().clamp(min=1)
    loss = (1 - ce_weight) * _TopKKL.apply(student_logits, *teacher, weight)
    if ce_weight > 0:
        loss = loss + ce_weight * _weighted_ce(student_logits, labels, weight)
    return loss


_TINY_TAIL = 1e-6  # the student's tail mass is read as at least this much (float32 sums of k probabilities)


class _TopKKL(torch.autograd.Function):
    """``sum_t w_t KL_{k+1}(teacher_t || student_t)`` over the top k and the bucket; the gradient written into
    one [B, L, V] tensor, as ``_KL`` does."""

    @staticmethod
    def forward(ctx: Any, logits: Any, indices: Any, p: Any, tail: Any, neg_entropy: Any, weight: Any) -> Any:
        s = logits[:, :-1].float()
        lse = torch.logsumexp(s, dim=-1)
        q_top = (s.gather(-1, indices) - lse.unsqueeze(-1)).exp()
        q_tail = (1 - q_top.sum(-1)).clamp(min=_TINY_TAIL)
        kl = neg_entropy - (p * q_top.log()).sum(-1) - tail * q_tail.log()
        ctx.save_for_backward(logits, indices, p, tail, weight, lse, q_top, q_tail)
        return (kl * weight).sum()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        logits, indices, p, tail, weight, lse, q_top, q_tail = ctx.saved_tensors
        ratio = (tail / q_tail).unsqueeze(-1)
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        body = out[:, :-1]
        torch.sub(logits[:, :-1].float(), lse.unsqueeze(-1), out=body)
        body.exp_().mul_(1 - ratio)  # every token as if in the tail: q (1 - tail / q_tail)
        body.scatter_add_(-1, indices, q_top * ratio - p)  # the top k: q - p
        body.mul_((weight * grad).unsqueeze(-1))
        out[:, -1].zero_()
        return out.to(logits.dtype), None, None, None, None, None


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    ce_weight: float = 0.0,
) -> torch.Tensor:
    """``(1 - ce_weight) * T^2 * KL(p_teacher^T || p_student^T) + ce_weight * CE(student, labels)``.

    KL is summed over the vocabulary and averaged over the predicted positions (labels not -100); both
    distributions are softmaxes at temperature ``T``; everything in float32 (``distill_from_teacher``).
    """
    if student_logits.shape != teacher_logits.shape:
        raise ConfigError(
            must_be(
                "the teacher's logits",
                f"shaped like the student's {list(student_logits.shape)}",
                list(teacher_logits.shape),
                "The teacher must share the student's tokenizer and vocabulary",
            )
        )
    teacher = teacher_distribution(teacher_logits, temperature)
    return distill_from_teacher(student_logits, teacher, labels, temperature, ce_weight)


def is_cached_teacher(teacher: Any) -> bool:
    """Whether ``teacher`` is cached logits (``teacher_logits.TeacherLogits``: ``side(rows, T, device)`` and a
    ``key``) rather than a model; duck-typed, since that module imports this one."""
    return hasattr(teacher, "side") and hasattr(teacher, "key")


def is_teacher_model(teacher: Any) -> bool:
    """Whether ``teacher`` is a model to run (not None, a flag, a key or cached logits)."""
    return teacher is not None and not isinstance(teacher, (bool, dict)) and not is_cached_teacher(teacher)
