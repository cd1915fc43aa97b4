"""``profile_latency``: the entry point of every latency backend (``nsc-prune profile``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nsc_prune.core.front import SearchSpace
from nsc_prune.core.latency_table import LatencyTable, ProfileSettings
from nsc_prune.core.spec import require_weights_support
from nsc_prune.hf.random_state import keeps_random_state


@keeps_random_state
def profile_latency(
    space: SearchSpace, config: Mapping[str, Any], model_name: str, settings: ProfileSettings
) -> LatencyTable:
    """Time every option of every layer of ``space`` (a one-model per-layer space of ``config``) and the fixed
    part, under ``settings``, with ``settings.backend``: the table ``--cost latency`` reads (the method:
    ``nsc_prune.hf.latency.transformers_backend``)."""
    require_weights_support(config, f"profile (--backend {settings.backend})")
    if settings.backend == "llama.cpp":
        from nsc_prune.hf.latency.llamacpp_backend import profile_llamacpp

        return profile_llamacpp(space, config, model_name, settings)
    from nsc_prune.hf.latency.transformers_backend import profile_transformers

    return profile_transformers(space, config, model_name, settings)
