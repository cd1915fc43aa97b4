"""The two training losses: causal-LM cross-entropy and distillation from a teacher's logits (whole, or its top k
and a tail bucket, as ``teacher_logits`` caches them)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from nsc_prune._validation import must_be
from nsc_prune.errors import ConfigError, require
from nsc_prune.hf.train.recipe import IGNORE_INDEX

torch = require("torch", "hf")
F = torch.nn.functional


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
    ``indices`` [B, L-1, k] (long), their probabilities ``p`` [B, L-1, k] (at temperature 1, divided by their sum only
    where float16 storage rounded it above 1),
    ``tail = 1 - sum p`` [B, L-1], and the teacher's side of the KL, ``sum p log p + tail log tail`` [B, L-1]."""

    indices: torch.Tensor
    p: torch.Tensor
    tail: torch.Tensor
    neg_entropy: torch.Tensor


def top_k_teacher(indices: torch.Tensor, log_p: torch.Tensor) -> TopKTeacher:
    """``TopKTeacher`` from the top-k token ids and their log-probabilities over the whole vocabulary."""
    log_p = log_p.float()
    p = log_p.exp()
    p = p / p.sum(-1, keepdim=True).clamp(min=1)  # a stored mass over 1 (float16 rounding) would bias the gradient
    tail = (1 - p.sum(-1)).clamp(min=0)
    return TopKTeacher(indices.long(), p, tail, torch.xlogy(p, p).sum(-1) + torch.xlogy(tail, tail))  # 0 log 0 = 0


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


_TINY_TAIL = 1e-6  # at k = V the tail is float32 rounding: the student's is read as at least this much
_EXACT_TAIL = 1e-3  # below this, 1 - sum(q_top) in float32 loses the student's tail: summed over its tokens instead
_EXACT_ROWS = 64  # positions whose tail is summed at a time (a copy of their logits each)
_LEAST_LOG_TAIL = -1e4  # the log of a student tail is read as at least this (it is -inf only for -inf logits)


class _TopKKL(torch.autograd.Function):
    """``sum_t w_t KL_{k+1}(teacher_t || student_t)`` over the top k and the bucket; the gradient written into
    one [B, L, V] tensor, as ``_KL`` does. The student's side is kept in log space: its top-k log-probabilities
    (one far below its top underflowed to log 0, an infinite loss) and, where its tail mass is under
    ``_EXACT_TAIL``, the log of the tail summed over the tail's tokens (as ``1 - sum q_top`` it was lost to rounding
    and floored, which hid the gradient that moves mass back into it)."""

    @staticmethod
    def forward(ctx: Any, logits: Any, indices: Any, p: Any, tail: Any, neg_entropy: Any, weight: Any) -> Any:
        s = logits[:, :-1].float()
        lse = torch.logsumexp(s, dim=-1)
        log_q_top = s.gather(-1, indices) - lse.unsqueeze(-1)
        q_top = log_q_top.exp()
        q_tail = 1 - q_top.sum(-1)
        log_q_tail = q_tail.clamp(min=_TINY_TAIL).log()
        if indices.shape[-1] < s.shape[-1]:
            rows = (q_tail < _EXACT_TAIL).nonzero()
            for at in rows.split(_EXACT_ROWS):
                b, t = at[:, 0], at[:, 1]
                rest = s[b, t].scatter(-1, indices[b, t], -math.inf)
                log_q_tail[b, t] = torch.logsumexp(rest, dim=-1) - lse[b, t]
            log_q_tail = log_q_tail.clamp(min=_LEAST_LOG_TAIL)  # a tail of -inf logits: finite, as the others
        kl = neg_entropy - (p * log_q_top).sum(-1) - tail * log_q_tail
        ctx.save_for_backward(logits, indices, p, tail, weight, lse, q_top, log_q_tail)
        return (kl * weight).sum()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        logits, indices, p, tail, weight, lse, q_top, log_q_tail = ctx.saved_tensors
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        body = out[:, :-1]
        # a tail token j: q_j - tail q_j / q_tail = exp(s_j - lse_tail) (q_tail - tail), lse_tail = lse + log q_tail
        torch.sub(logits[:, :-1].float(), (lse + log_q_tail).unsqueeze(-1), out=body)
        body.exp_().mul_((log_q_tail.exp() - tail).unsqueeze(-1))
        body.scatter_(-1, indices, q_top - p)  # the top k: q - p (written over whatever the line above made there)
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
