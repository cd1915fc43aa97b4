"""Fixtures of the heal tests (``test_heal.py``, ``test_teacher_logits.py``), and transformers' bar setting."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

PLAN = [{"ffn": 96, "lora_rank": 8}, {"ffn": 40, "lora_rank": 3}, {"ffn": 17, "lora_rank": 0}]


@pytest.fixture
def transformers_bars_on():
    """transformers' own progress bars on, as in a fresh process (eval's quiet mode turns them off for good), and
    the setting restored afterwards; yields transformers' logging module."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    yield hf_logging
    (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


@pytest.fixture
def heal_inputs(tmp_path, tiny_llama, write_plan):
    """A tiny GQA base, a float32 checkpoint extracted from it (``PLAN``) and a learnable text: (tiny, ckpt, data)."""
    from nsc_prune.hf.extract import ExtractOptions, extract_subnet

    tiny = tiny_llama(gqa=True)
    plan = write_plan(tmp_path / "pareto.json", PLAN, tiny.config)
    out = extract_subnet(
        plan, tiny.base, tmp_path / "ckpt", point=0, adapter=tiny.adapter, options=ExtractOptions(dtype="float32")
    )
    data = tmp_path / "a.txt"
    data.write_text("\n\n".join(" ".join(f"w{3 + (i + k) % 7}" for k in range(20 + i % 5)) for i in range(40)))
    return tiny, out, data


def sigterm_at(step: int, signum: int = signal.SIGTERM) -> Any:
    """A ``TrainerCallback`` that sends its own process SIGTERM (``signum``) at the end of step ``step``."""
    import transformers

    class SigtermAt(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                os.kill(os.getpid(), signum)

    return SigtermAt()


@pytest.fixture
def sigterm_at_step(monkeypatch):
    """``sigterm_at_step(k)``: the next training run (``trainer.train``, as heal and train-supernet call it) sends
    itself SIGTERM at the end of step ``k``, as a preempted job's scheduler would (``sigterm_at_step(k, SIGHUP)``: a
    closed terminal); later runs are left alone."""
    from nsc_prune.hf.train import heal, trainer

    real = trainer.train

    def arm(step: int, signum: int = signal.SIGTERM) -> None:
        def once(*args, callbacks=(), **kwargs):
            for module in (heal, trainer):
                monkeypatch.setattr(module, "train", real)
            return real(*args, callbacks=[*callbacks, sigterm_at(step, signum)], **kwargs)

        for module in (heal, trainer):  # heal imported the name; train-supernet imports it when it runs
            monkeypatch.setattr(module, "train", once)

    return arm
