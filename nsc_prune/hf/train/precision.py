"""Whether a recovery run trains in bf16, and the autocast it runs under: on a GPU that computes bf16 natively,
and on a CPU with native bf16 (AVX512-BF16 or AMX)."""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager

from nsc_prune.errors import require
from nsc_prune.hf.train.recipe import AUTO, TrainConfig
from nsc_prune.hf.weights.compute import gpu_has_native_bf16

torch = require("torch", "hf")


def resolve_auto(value: bool | str, default: bool) -> bool:
    """A recipe flag that may be ``"auto"``: ``default`` then, else the flag."""
    return default if value == AUTO else bool(value)


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX), where bf16 autocast trains about
    1.7x faster than float32 (scripts/bench_heal.py); without it, bf16 on the CPU is emulated and slower."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's own probes (private API)
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def uses_bf16(config: TrainConfig) -> bool:
    """``config.bf16`` resolved: ``"auto"`` is on with a CUDA GPU that computes bf16 natively, or, without CUDA, on a CPU
    with native bf16 (``cpu_has_native_bf16``); off otherwise (MPS included)."""
    if torch.cuda.is_available():
        default = gpu_has_native_bf16()
    else:
        default = not torch.backends.mps.is_available() and cpu_has_native_bf16()
    return resolve_auto(config.bf16, default)


def precision_name(config: TrainConfig) -> str:
    """What a record says the recipe trains in on this machine: ``bf16 autocast`` or ``float32`` (``bf16`` "auto"
    resolved)."""
    return "bf16 autocast" if uses_bf16(config) else "float32"


def training_autocast(config: TrainConfig, device: torch.device) -> AbstractContextManager:
    """bf16 autocast on ``device`` when the recipe trains in bf16 (``uses_bf16``), else a no-op: the context
    the Trainer runs the student in, used for the teacher's forward and the time budget's probe passes too."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(config))
