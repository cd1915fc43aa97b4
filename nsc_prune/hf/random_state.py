"""The caller's random state, kept: work that seeds its own generators (training, a profile's random weights)
leaves Python's, numpy's and torch's global generators as the caller had them, as a library should."""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from nsc_prune.errors import require

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def kept_random_state() -> Iterator[None]:
    """Inside, seed at will; after, Python's, numpy's and torch's generators are as they were: the CPU's, and the
    current GPU's where CUDA was initialised before (forking every device would start CUDA on each). Otherwise CUDA's
    generators are seeded as the caller's ``torch.manual_seed`` left them to be (it seeds CUDA lazily, when CUDA
    starts), which is their state for a caller that drew nothing on a GPU yet."""
    torch = require("torch", "hf")
    python_state, numpy_state = random.getstate(), np.random.get_state()
    cuda_before, seed = torch.cuda.is_initialized(), torch.initial_seed()
    devices = [torch.cuda.current_device()] if cuda_before else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        if not cuda_before:  # seeding CUDA is queued until it starts: the work's seed replaced the caller's there
            torch.cuda.manual_seed_all(seed)


def keeps_random_state(function: F) -> F:
    """``function`` run under ``kept_random_state``."""

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with kept_random_state():
            return function(*args, **kwargs)

    return wrapped  # type: ignore[return-value]
