"""nsc-prune: data-free LLM pruning to a budget with Neural Spectral Capacity (NSC) and NSC-DP.

The core (``psi_mp``, specs, spaces, ``solver``) needs only numpy; Hugging Face-facing functions
(``extract_subnet``, ``load_pruned``, ``evaluate_checkpoints``) import torch when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from nsc_prune import solver
from nsc_prune._version import __version__
from nsc_prune.capacity import init_std, psi_mp, psi_weights
from nsc_prune.space import build_space, search
from nsc_prune.spec import score

_LAZY = {
    "extract_subnet": "nsc_prune.extract",
    "load_pruned": "nsc_prune.extract",
    "evaluate_checkpoints": "nsc_prune.evaluate",
}

__all__ = ["__version__", "build_space", "init_std", "psi_mp", "psi_weights", "score", "search", "solver", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nsc_prune' has no attribute {name!r}")
