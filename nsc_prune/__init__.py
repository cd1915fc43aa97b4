"""nsc-prune: data-free LLM pruning to a budget with Neural Spectral Capacity (NSC) and NSC-DP.

The core (``psi_mp``, specs, spaces, ``solver``) needs only numpy; Hugging Face-facing functions
(``extract_subnet``, ``load_pruned``, ``evaluate_checkpoints``) import torch when first used.
Parts and the direction of their imports: docs/architecture.md.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from nsc_prune import _deprecated
from nsc_prune._version import __version__
from nsc_prune.core import solver
from nsc_prune.core.capacity import init_std, psi_mp, psi_weights
from nsc_prune.core.front import search
from nsc_prune.core.spec import score
from nsc_prune.planning import search_plan
from nsc_prune.spaces.registry import build_space

if TYPE_CHECKING:  # their signatures for type checkers; at run time __getattr__ imports them (torch) when first used
    from nsc_prune.eval.runner import evaluate_checkpoints as evaluate_checkpoints
    from nsc_prune.hf.extract import extract_subnet as extract_subnet
    from nsc_prune.hf.weights.loading import load_pruned as load_pruned

_deprecated.install()
# ``solver`` is public here, so ``import nsc_prune.solver`` names the same module (not a moved 0.1 path).
sys.modules.setdefault(f"{__name__}.solver", solver)

_LAZY = {
    "extract_subnet": "nsc_prune.hf.extract",
    "load_pruned": "nsc_prune.hf.weights.loading",
    "evaluate_checkpoints": "nsc_prune.eval.runner",
}

# The torch-free names: ``from nsc_prune import *`` works on the core install. The _LAZY ones are imported by name.
__all__ = [
    "__version__",
    "build_space",
    "init_std",
    "psi_mp",
    "psi_weights",
    "score",
    "search",
    "search_plan",
    "solver",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nsc_prune' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names and the submodules imported so far (not this module's own imports: ``sys``, ``Any``)."""
    submodules = {
        name
        for name, value in globals().items()
        if isinstance(value, ModuleType) and value.__name__ == f"{__name__}.{name}" and not name.startswith("_")
    }
    return sorted({*__all__, *_LAZY, *submodules})
