"""Recipe and losses (issue 13): distillation_loss equals a hand computation; TrainConfig validation."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from nsc_prune.errors import ConfigError, InvalidInputError  # noqa: E402
from nsc_prune.hf.train.recipe import (  # noqa: E402
    DEFAULT_SEQ_LEN,
    TrainConfig,
    causal_lm_loss,
    distillation_loss,
)


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
    assert config.tokens_per_step == config.batch_size * config.grad_accum * config.seq_len
    for bad, match in (
        ({"max_steps": 0}, "max_steps must be an integer >= 1"),
        ({"ce_weight": 1.5}, "ce_weight must be"),
        ({"learning_rate": -1.0}, "learning_rate must be"),
        ({"bf16": "yes"}, "bf16 must be"),
        ({"bf16": 1}, "bf16 must be"),
        ({"full": 1}, "full must be"),
        ({"lora_targets": ()}, "lora_targets"),
        ({"seq_len": 2.5}, "seq_len must be"),
    ):
        with pytest.raises(ConfigError, match=match):
            TrainConfig(**bad)
