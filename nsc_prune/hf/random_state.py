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
    """Inside, seed at will; after, Python's, numpy's and torch's generators (the CPU's, and the current GPU's
    where CUDA is already initialised: forking every device would start CUDA on each) are as they were."""
    torch = require("torch", "hf")
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def keeps_random_state(function: F) -> F:
    """``function`` run under ``kept_random_state``."""

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with kept_random_state():
            return function(*args, **kwargs)

    return wrapped  # type: ignore[return-value]
