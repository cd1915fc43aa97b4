"""nsc_prune.hf.random_state: work that seeds its own generators leaves the caller's as they were."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nsc_prune.hf.random_state import kept_random_state  # noqa: E402


def test_the_callers_generators_are_as_they_were_whatever_the_work_seeds():
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    expected = random.random(), float(np.random.rand()), torch.rand(2).tolist()
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    with pytest.raises(KeyboardInterrupt), kept_random_state():  # a stopped run too
        random.seed(0), np.random.seed(0), torch.manual_seed(0)
        raise KeyboardInterrupt
    assert (random.random(), float(np.random.rand()), torch.rand(2).tolist()) == expected


def test_a_gpu_not_started_before_is_seeded_as_the_callers_seed_left_it(monkeypatch):
    """torch.manual_seed seeds CUDA lazily, when it starts: work that seeds its own (on the CPU, or starting CUDA
    itself) left the caller's first GPU draws at the run's seed. (No GPU here: CUDA's seeding is recorded.)"""
    seeded = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    torch.manual_seed(5)
    with kept_random_state():
        torch.manual_seed(0)
    assert seeded == [5, 0, 5]  # torch.manual_seed's own (the caller's, the work's), then the caller's again
