"""Latency profiling (``nsc-prune profile``): backend-neutral timing in rounds (``profiling``), one module per
backend (``transformers_backend``, ``llamacpp_backend``) and the entry point ``profile.profile_latency``. The table
they write, which the DP reads as a cost, is ``nsc_prune.core.latency_table`` (torch-free).

``nsc_prune.hf.latency`` was one module in nsc-prune 0.2; its public names still resolve here for one release, with
a DeprecationWarning naming their new home."""

from __future__ import annotations

from nsc_prune._deprecated import forward_moved

_OLD_NAMES = {
    "profile_latency": "nsc_prune.hf.latency.profile",
    **{
        name: "nsc_prune.hf.latency.transformers_backend"
        for name in (
            "check_device",
            "prefill_seconds",
            "decode_seconds",
            "timer",
            "torch_threads",
            "option_config",
            "build_timed_model",
            "build_dense_model",
        )
    },
}

__getattr__ = forward_moved(__name__, _OLD_NAMES)
