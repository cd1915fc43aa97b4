"""Recipe and losses (issue 13): distillation_loss equals a hand computation; top-k distillation with a tail
bucket is the exact KL over k + 1 outcomes (issue 31); TrainConfig validation."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from nsc_prune.errors import ConfigError, InvalidInputError  # noqa: E402
from nsc_prune.hf.train.losses import causal_lm_loss, distill_from_top_k, distillation_loss, top_k_teacher  # noqa: E402
from nsc_prune.hf.train.recipe import DEFAULT_SEQ_LEN, TrainConfig  # noqa: E402


def hand_losses(student, teacher, labels, t):
    """Per-token KL(p_t || p_s) at temperature t and CE, by explicit loops over positions and the vocabulary."""
    kls, ces = [], []
    for b in range(student.shape[0]):
        for pos in range(student.shape[1] - 1):
            target = int(labels[b, pos + 1])
            if target == -100:
                continue
            zs, zt = student[b, pos].tolist(), teacher[b, pos].tolist()
            ps = [math.exp(z / t) / sum(math.exp(y / t) for y in zs) for z in zs]
            pt = [math.exp(z / t) / sum(math.exp(y / t) for y in zt) for z in zt]
            kls.append(sum(q * math.log(q / p) for q, p in zip(pt, ps, strict=True)))
            ce_p = math.exp(zs[target]) / sum(math.exp(y) for y in zs)
            ces.append(-math.log(ce_p))
    return sum(kls) / len(kls), sum(ces) / len(ces)


@pytest.mark.parametrize("t, w", [(1.0, 0.0), (2.0, 0.0), (2.0, 0.3), (0.5, 1.0)])
def test_distillation_loss_equals_hand_computation(t, w):
    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 6, 9, generator=gen), torch.randn(2, 6, 9, generator=gen) * 2
    labels = torch.randint(0, 9, (2, 6), generator=gen)
    labels[0, 3] = labels[1, 5] = -100
    kl, ce = hand_losses(student, teacher, labels, t)
    got = distillation_loss(student, teacher, labels, temperature=t, ce_weight=w)
    assert got.item() == pytest.approx((1 - w) * t * t * kl + w * ce, rel=1e-5)
    assert causal_lm_loss(student, labels).item() == pytest.approx(ce, rel=1e-5)


def test_distillation_is_zero_for_the_teacher_itself_and_has_gradients():
    logits = torch.randn(1, 5, 7, requires_grad=True)
    labels = torch.randint(0, 7, (1, 5))
    assert distillation_loss(logits, logits.detach(), labels).item() == pytest.approx(0.0, abs=1e-6)
    distillation_loss(logits, torch.randn(1, 5, 7), labels, 2.0, 0.5).backward()
    assert logits.grad is not None and logits.grad[:, -1].abs().sum() == 0  # the last position predicts nothing


def reference_distillation_loss(student, teacher, labels, t, w):
    """The textbook form (and the code before issue 31): boolean-indexed log-softmaxes, kl_div, cross_entropy."""
    F = torch.nn.functional
    s, tt = student[:, :-1].reshape(-1, student.shape[-1]), teacher[:, :-1].reshape(-1, teacher.shape[-1])
    target = labels[:, 1:].reshape(-1)
    keep = target != -100
    log_p_s, log_p_t = F.log_softmax(s[keep] / t, dim=-1), F.log_softmax(tt[keep] / t, dim=-1)
    kd = F.kl_div(log_p_s, log_p_t, log_target=True, reduction="sum") / keep.sum()
    return (1 - w) * t * t * kd + w * F.cross_entropy(s, target, ignore_index=-100)


@pytest.mark.parametrize("t, w", [(1.0, 0.0), (2.0, 0.0), (2.0, 0.3), (0.5, 1.0)])
def test_distillation_gradient_equals_the_textbook_form(t, w):
    gen = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(3, 7, 11, generator=gen, dtype=torch.float64), torch.randn(3, 7, 11, generator=gen)
    labels = torch.randint(0, 11, (3, 7), generator=gen)
    labels[0, 2] = labels[2, 6] = labels[1, 1] = -100
    grads = []
    for loss_fn in (distillation_loss, reference_distillation_loss):
        x = student.clone().float().requires_grad_(True)
        loss = loss_fn(x, teacher, labels, t, w)
        (3.0 * loss).backward()
        grads.append((loss.detach(), x.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-6, rtol=1e-5)


def test_distillation_refuses_other_vocabularies():
    with pytest.raises(ConfigError, match="share the student's tokenizer"):
        distillation_loss(torch.randn(1, 4, 7), torch.randn(1, 4, 8), torch.zeros(1, 4, dtype=torch.long))


def bucketed_kl(student, teacher, indices, labels, w):
    """The KL over the teacher's top k tokens and one "any other token" outcome, by autograd-able float64 algebra
    on full softmaxes, averaged over the labelled positions; plus ``w`` CE."""
    log_q = torch.log_softmax(student[:, :-1], dim=-1)  # the tail as a sum over its tokens: 1 - sum q_top is 0 in
    log_q_tail = log_q.scatter(-1, indices, -math.inf).logsumexp(-1, keepdim=True)  # float64 at e^-300
    big_log_q = torch.cat([log_q.gather(-1, indices), log_q_tail], -1)
    p_top = torch.softmax(teacher[:, :-1], dim=-1).gather(-1, indices)
    big_p = torch.cat([p_top, 1 - p_top.sum(-1, keepdim=True)], -1)
    kl = (torch.xlogy(big_p, big_p) - big_p * big_log_q).sum(-1)
    keep = (labels[:, 1:] != -100).double()
    ce = torch.nn.functional.cross_entropy(
        student[:, :-1].reshape(-1, student.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    return (1 - w) * (kl * keep).sum() / keep.sum() + w * ce


@pytest.mark.parametrize("k, w", [(1, 0.0), (3, 0.0), (3, 0.3), (10, 0.0)])
def test_top_k_distillation_is_the_exact_kl_over_the_top_k_and_a_tail_bucket(k, w):
    gen = torch.Generator().manual_seed(2)
    student = torch.randn(2, 6, 11, generator=gen, dtype=torch.float64) * 2
    teacher = torch.randn(2, 6, 11, generator=gen, dtype=torch.float64) * 2
    labels = torch.randint(0, 11, (2, 6), generator=gen)
    labels[0, 2] = labels[1, 5] = -100
    log_p, indices = torch.log_softmax(teacher[:, :-1], dim=-1).topk(k, dim=-1)
    targets = top_k_teacher(indices, log_p)
    assert torch.allclose(targets.p.sum(-1) + targets.tail, torch.ones(()))  # float32 targets
    got_x, ref_x = student.clone().requires_grad_(True), student.clone().requires_grad_(True)
    got, ref = distill_from_top_k(got_x, targets, labels, w), bucketed_kl(ref_x, teacher, indices, labels, w)
    (2.0 * got).backward()
    (2.0 * ref).backward()
    assert got.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(got_x.grad, ref_x.grad, atol=1e-6, rtol=1e-5)  # float32 inside the loss
    assert got_x.grad[:, -1].abs().sum() == 0  # the last position predicts nothing


@pytest.mark.parametrize("case", ["a top token far below", "a confident student", "a tail 300 nats down"])
def test_top_k_distillation_stays_exact_where_the_student_is_extreme(case):
    """A teacher's top token 200 nats below the student's top underflowed to log 0 (an infinite loss: the heal
    stopped as diverged); a student whose tail is 1e-13 was read as 1e-6 (the loss 8 nats low, and the gradient that
    moves mass back into the tail 1e7 times too small)."""
    gen = torch.Generator().manual_seed(5)
    student = torch.randn(2, 6, 11, generator=gen, dtype=torch.float64)
    teacher = torch.randn(2, 6, 11, generator=gen, dtype=torch.float64) * 2
    labels = torch.randint(0, 11, (2, 6), generator=gen)
    log_p, indices = torch.log_softmax(teacher[:, :-1], dim=-1).topk(4, dim=-1)
    if case == "a top token far below":
        student[0, 1, indices[0, 1, 0]] -= 200.0
    else:  # every token outside the teacher's top 4 e^-30 (or e^-300) less likely
        outside = torch.ones_like(student[:, :-1]).scatter(-1, indices, 0.0)
        student[:, :-1] -= (30.0 if case == "a confident student" else 300.0) * outside
    got_x, ref_x = student.clone().requires_grad_(True), student.clone().requires_grad_(True)
    got = distill_from_top_k(got_x, top_k_teacher(indices, log_p), labels)
    ref = bucketed_kl(ref_x, teacher, indices, labels, 0.0)
    got.backward()
    ref.backward()
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(got_x.grad, ref_x.grad, atol=1e-5, rtol=1e-2)  # a tail token's: float32 exp(-30)s


def test_top_k_distillation_of_a_student_with_no_tail_or_a_teacher_over_one_is_finite():
    """A student whose every other logit is -inf (log of its tail -inf: NaN in the loss and the gradient) and stored
    top-k log-probabilities whose mass is over 1 (float16 rounding; the gradient assumed p + tail = 1)."""
    gen = torch.Generator().manual_seed(6)
    teacher, student = torch.randn(2, 5, 9, generator=gen), torch.randn(2, 5, 9, generator=gen)
    labels = torch.randint(0, 9, (2, 5), generator=gen)
    log_p, indices = torch.log_softmax(teacher[:, :-1], dim=-1).topk(4, dim=-1)
    x = student.clone()
    x[:, :-1] = x[:, :-1].scatter(-1, indices, 0.0) + torch.full_like(x[:, :-1], -math.inf).scatter(-1, indices, 0.0)
    x.requires_grad_(True)
    loss = distill_from_top_k(x, top_k_teacher(indices, log_p), labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    over = top_k_teacher(indices, log_p.clamp(min=-1.0) + 0.5)  # a mass well over 1
    assert (over.p.sum(-1) <= 1 + 1e-6).all() and (over.tail >= 0).all()


def test_top_k_distillation_keeps_the_tails_mass_and_equals_full_distillation_at_k_equal_to_the_vocabulary():
    """The student that is the teacher is a minimum (loss and gradient 0): the tail's mass is a target, not
    something to squeeze out as the renormalised top k would; at k = V it is ``distillation_loss``."""
    gen = torch.Generator().manual_seed(3)
    teacher, student = torch.randn(2, 5, 9, generator=gen), torch.randn(2, 5, 9, generator=gen)
    labels = torch.randint(0, 9, (2, 5), generator=gen)
    log_p, indices = torch.log_softmax(teacher[:, :-1], dim=-1).topk(4, dim=-1)
    x = teacher.clone().requires_grad_(True)
    loss = distill_from_top_k(x, top_k_teacher(indices, log_p), labels)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-6) and x.grad.abs().max() < 1e-6
    log_p, indices = torch.log_softmax(teacher[:, :-1], dim=-1).topk(9, dim=-1)
    full = distill_from_top_k(student, top_k_teacher(indices, log_p), labels)
    assert full.item() == pytest.approx(distillation_loss(student, teacher, labels).item(), rel=1e-5)


def test_a_cached_log_probability_of_minus_inf_is_a_zero_probability_not_a_nan_loss():
    """float16 stores a log-probability below -65504 as -inf: p log p was 0 x -inf = NaN, and the run stopped at its
    first logged loss as a divergence ("lower --learning-rate")."""
    gen = torch.Generator().manual_seed(4)
    teacher, student = torch.randn(2, 5, 9, generator=gen), torch.randn(2, 5, 9, generator=gen)
    labels = torch.randint(0, 9, (2, 5), generator=gen)
    log_p, indices = torch.log_softmax(teacher[:, :-1], dim=-1).topk(4, dim=-1)
    underflow = log_p.clone()
    underflow[..., -1] = -math.inf
    targets = top_k_teacher(indices, underflow)
    assert torch.isfinite(targets.neg_entropy).all() and torch.isfinite(distill_from_top_k(student, targets, labels))


def test_seq_len_follows_the_model_unless_given():
    """Unset, seq_len is min(512, the model's context); a given one above the context is refused."""
    assert TrainConfig().for_model(128).seq_len == 128 and TrainConfig().for_model(4096).seq_len == DEFAULT_SEQ_LEN
    assert TrainConfig().for_model(None).seq_len == DEFAULT_SEQ_LEN
    assert TrainConfig(seq_len=64).for_model(128).seq_len == 64
    with pytest.raises(InvalidInputError, match=r"--seq-len must be at most the model's max_position_embeddings"):
        TrainConfig(seq_len=256).for_model(128)


def test_train_config_validation_and_round_trip():
    config = TrainConfig(max_steps=5, seq_len=64, lora_targets=["q_proj"], bf16=False)
    assert config.lora_targets == ("q_proj",) and TrainConfig.from_dict(config.to_dict()) == config
    assert TrainConfig.from_dict({"lora_targets": "q_proj"}).lora_targets == ("q_proj",)  # --set lora_targets=q_proj
    assert config.tokens_per_step == config.batch_size * config.grad_accum * config.seq_len
    assert TrainConfig(batch_size=2, grad_accum=4, seq_len=16).tokens_per_step == 128
    edges = TrainConfig(distill=True, ce_weight=1.0, temperature=100.0, seq_len=64).for_model(64)  # all accepted
    assert (edges.ce_weight, edges.temperature, edges.seq_len) == (1.0, 100.0, 64)
    for bad, match in (
        ({"max_steps": 0}, "max_steps must be an integer >= 1"),
        ({"ce_weight": 1.5}, "ce_weight must be"),
        ({"learning_rate": -1.0}, "learning_rate must be"),
        ({"bf16": "yes"}, "bf16 must be"),
        ({"bf16": 1}, "bf16 must be"),
        ({"full": 1}, "full must be"),
        ({"lora_targets": ()}, "lora_targets"),
        ({"lora_targets": ["q_proj", ""]}, "lora_targets must be a non-empty list of module names"),
        ({"seq_len": 2.5}, "seq_len must be"),
        # NaN and inf trained, then failed writing the record (JSON has no NaN), leaving the checkpoints behind
        ({"learning_rate": float("nan")}, "learning_rate must be a finite number > 0; got nan"),
        ({"lora_alpha": float("inf")}, "lora_alpha must be a finite number > 0; got inf"),
        ({"temperature": float("nan")}, "temperature must be a finite number > 0"),
        ({"temperature": 1e200}, "temperature must be at most 100; got 1e\\+200"),  # T^2: an OverflowError at step 1
        ({"weight_decay": float("inf")}, "weight_decay must be a finite number >= 0"),
        ({"seed": 2**64}, "seed must be below 2\\*\\*32"),  # a numpy ValueError (heal), a torch overflow (supernet)
    ):
        with pytest.raises(ConfigError, match=match):
            TrainConfig(**bad)
