"""Module paths of nsc-prune 0.1 before the sub-package layout, kept for one release.

Importing an old path (``nsc_prune.extract``, ``nsc_prune.space``, ...) still works and gives a module
holding the public names of its new home(s), with a DeprecationWarning naming them. One table, one finder.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

MOVED: dict[str, tuple[str, ...]] = {
    "nsc_prune.adapter": ("nsc_prune.hf.weights.adapter",),
    "nsc_prune.benchmarks": ("nsc_prune.ranking.benchmarks",),
    "nsc_prune.budget": ("nsc_prune.core.budget",),
    "nsc_prune.capacity": ("nsc_prune.core.capacity",),
    "nsc_prune.checkpoint": ("nsc_prune.hf.weights.safetensors_io", "nsc_prune._files"),
    "nsc_prune.elastic": ("nsc_prune.spaces.elastic",),
    "nsc_prune.evaluate": ("nsc_prune.eval.runner", "nsc_prune.eval.checkpoints", "nsc_prune.eval.report"),
    "nsc_prune.extract": (
        "nsc_prune.hf.extract",
        "nsc_prune.hf.cut.jobs",
        "nsc_prune.hf.export.pruned",
        "nsc_prune._io",
        "nsc_prune.hf.weights.base",
        "nsc_prune.hf.weights.loading",
        "nsc_prune.hf.cut.keep",
        "nsc_prune.plan",
    ),
    "nsc_prune.extract_files": ("nsc_prune.hf.model_card", "nsc_prune._files"),
    "nsc_prune.families": ("nsc_prune.ranking.families",),
    "nsc_prune.families.autoformer": ("nsc_prune.ranking.families.autoformer",),
    "nsc_prune.families.base": ("nsc_prune.ranking.families.base",),
    "nsc_prune.families.cnn": ("nsc_prune.ranking.families.cnn",),
    "nsc_prune.families.flexibert": ("nsc_prune.ranking.families.flexibert",),
    "nsc_prune.families.gpt2": ("nsc_prune.ranking.families.gpt2",),
    "nsc_prune.families.nas_spaces": ("nsc_prune.spaces.nas",),
    "nsc_prune.gguf": ("nsc_prune.hf.weights.gguf_import",),
    "nsc_prune.io": ("nsc_prune._io",),
    "nsc_prune.modeling": ("nsc_prune.hf.modeling",),
    "nsc_prune.models": ("nsc_prune.presets",),
    "nsc_prune.pareto": ("nsc_prune.plan", "nsc_prune.plot", "nsc_prune._files"),
    "nsc_prune.selection": ("nsc_prune.hf.cut.selection",),
    "nsc_prune.space": ("nsc_prune.core.front", "nsc_prune.spaces.registry", "nsc_prune._files"),
    "nsc_prune.spec": ("nsc_prune.core.spec",),
    "nsc_prune.subnet": ("nsc_prune.plan", "nsc_prune.hf.cut.keep"),
    "nsc_prune.supernets": (),
    "nsc_prune.supernets.lonas": ("nsc_prune.spaces.lonas",),
    "nsc_prune.tasks": ("nsc_prune.eval.tasks",),
    "nsc_prune.validation": ("nsc_prune._validation",),
    "nsc_prune.weight_score": ("nsc_prune.hf.score.psi_w",),
    # nsc-prune 0.2: hf/ by job, the latency table and the front renamed
    "nsc_prune.core.latency": ("nsc_prune.core.latency_table", "nsc_prune.choices"),
    "nsc_prune.core.search": ("nsc_prune.core.front", "nsc_prune.choices"),
    "nsc_prune.hf.adapter": ("nsc_prune.hf.weights.adapter",),
    "nsc_prune.hf.base": ("nsc_prune.hf.weights.base",),
    "nsc_prune.hf.gguf": ("nsc_prune.hf.weights.gguf_import",),
    "nsc_prune.hf.jobs": ("nsc_prune.hf.cut.jobs", "nsc_prune.hf.cut.request", "nsc_prune.choices"),
    "nsc_prune.hf.keep": ("nsc_prune.hf.cut.keep",),
    "nsc_prune.hf.latency_llamacpp": ("nsc_prune.hf.latency.llamacpp_backend",),
    "nsc_prune.hf.loading": ("nsc_prune.hf.weights.loading",),
    "nsc_prune.hf.profiling": ("nsc_prune.hf.latency.profiling",),
    "nsc_prune.hf.psi_w": ("nsc_prune.hf.score.psi_w",),
    "nsc_prune.hf.safetensors_io": ("nsc_prune.hf.weights.safetensors_io",),
    "nsc_prune.hf.selection": ("nsc_prune.hf.cut.selection", "nsc_prune.choices"),
    "nsc_prune.hf.sensitivity": ("nsc_prune.hf.score.sensitivity",),
    "nsc_prune.hf.streaming": ("nsc_prune.hf.weights.streaming",),
}


def warn_moved(old: str, new: tuple[str, ...] | str, stacklevel: int = 2) -> None:
    # a counted stacklevel, not nsc_prune._warn.warn: the route to an old name runs through the import system's
    # frames, which warnings.warn skips when it counts (an old module's import is reported at the importing line)
    where = new if isinstance(new, str) else " / ".join(new) or "its sub-modules"
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; import from {where}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def forward_moved(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` under which each public name that left ``module`` still resolves, with a
    DeprecationWarning, for one release; ``moved``: old name -> its home, ``"pkg.mod"`` or ``"pkg.mod:new_name"``."""

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, _, new = moved[name].partition(":")
        warn_moved(f"{module}.{name}", f"{home}.{new or name}")
        return getattr(importlib.import_module(home), new or name)

    return __getattr__


class _MovedLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        targets = MOVED[module.__name__]
        warn_moved(module.__name__, targets, stacklevel=2)  # at the importing line: warnings skips importlib's frames
        module.__path__ = []  # an old package: its old sub-modules resolve through this finder too
        forwarders = []  # the names a new home itself forwards (its own ``forward_moved``)
        for target in reversed(targets):
            found = vars(importlib.import_module(target))
            module.__dict__.update({k: v for k, v in found.items() if not k.startswith("__")})
            forwarders += [found["__getattr__"]] if "__getattr__" in found else []
        if forwarders:
            module.__getattr__ = _first_of(module.__name__, forwarders)


def _first_of(module: str, forwarders: list[Callable[[str], Any]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` asking each of ``forwarders`` in turn."""

    def __getattr__(name: str) -> Any:
        for forward in forwarders:
            with contextlib.suppress(AttributeError):
                return forward(name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedLoader(), is_package=True)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (after the regular finders: a real module always wins)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
