"""The space registry: every space kind registers a config dataclass (YAML keys equal its field names)
and a builder ``(config, model_config) -> SearchSpace``; ``build_space`` reads a bundled or given YAML."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from nsc_prune._files import SPACES_DIR, user_path
from nsc_prune._io import read_yaml
from nsc_prune._validation import config_from_dict, must_be
from nsc_prune.core.front import SearchSpace
from nsc_prune.errors import ConfigError

SpaceBuilder = Callable[[Any, Mapping[str, Any] | None], SearchSpace]
_KINDS: dict[str, tuple[type, SpaceBuilder]] = {}
_MODEL_FREE_KINDS: set[str] = set()  # kinds that define the whole network themselves (NAS spaces)
# Built-in kinds register themselves when their module is imported.
_BUILTIN_KIND_MODULES = {
    "lonas": "nsc_prune.spaces.lonas",
    "elastic": "nsc_prune.spaces.elastic",
    "txl": "nsc_prune.spaces.nas",
    "autoformer": "nsc_prune.spaces.nas",
}


def register_space_kind(kind: str, config_class: type, builder: SpaceBuilder, *, takes_model: bool = True) -> None:
    """Register a space ``kind``: its config dataclass and builder. Duplicates are refused.

    ``takes_model=False`` marks spaces that define the whole network (NAS spaces): giving them a
    model config is an error rather than silently ignored.
    """
    if kind in _KINDS:
        raise ValueError(f"space kind {kind!r} is already registered")
    _KINDS[kind] = (config_class, builder)
    if not takes_model:
        _MODEL_FREE_KINDS.add(kind)


def _kind(kind: str) -> tuple[type, SpaceBuilder]:
    if kind not in _KINDS and kind in _BUILTIN_KIND_MODULES:
        importlib.import_module(_BUILTIN_KIND_MODULES[kind])
    if kind not in _KINDS:
        known = sorted(set(_KINDS) | set(_BUILTIN_KIND_MODULES))
        raise ConfigError(f"unknown space kind {kind!r}; known kinds: {', '.join(known)}")
    return _KINDS[kind]


def bundled_spaces() -> list[str]:
    """The bundled spaces' names (``--space ffn-grid``), sorted."""
    return sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))


def load_space_yaml(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """Read a bundled space by name or a YAML file by path; returns ``(name, mapping)``."""
    path = user_path(name_or_path)  # '~/my.yaml', quoted
    is_file_name = path.suffix.lower() in (".yaml", ".yml")  # My.YAML too
    if is_file_name and not path.is_file():
        state = "is a folder" if path.is_dir() else "is not a regular file" if path.exists() else "does not exist"
        bundled = f"; did you mean --space {path.stem} (bundled)?" if path.stem in bundled_spaces() else ""
        raise ConfigError(f"space file {path} {state}{bundled}")
    if not is_file_name and len(path.parts) > 1:  # an absolute one read <path>.yaml, a relative one was unknown
        raise ConfigError(
            f"space file {name_or_path} must end in .yaml or .yml; a bundled space is a bare name "
            f"({', '.join(bundled_spaces())})"
        )
    if not is_file_name:
        path = SPACES_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            names = bundled_spaces()
            close = difflib.get_close_matches(str(name_or_path), names, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown space {name_or_path!r}.{hint} Bundled spaces: {', '.join(names)}; "
                "or pass a path to a .yaml file"
            )
    data = read_yaml(path, "space")
    if not isinstance(data, dict) or "kind" not in data:
        raise ConfigError(f"{path}: a space YAML must be a mapping with a 'kind' key")
    if not isinstance(data["kind"], str):  # a list was looked up in the kinds' dict: TypeError, unhashable
        raise ConfigError(f"{path}: " + must_be("its 'kind'", "the name of a space kind", data["kind"]))
    return path.stem, data


def build_space(
    name_or_path: str | os.PathLike, model_config: Mapping[str, Any] | None = None, **overrides: Any
) -> SearchSpace:
    """Load a space YAML and build it (for ``model_config`` where the kind needs one).

    ``overrides`` replace YAML keys (flags > YAML > dataclass defaults); an override of ``None`` keeps the YAML's
    value (an unset flag), so ``None`` cannot unset a key.
    """
    name, data = load_space_yaml(name_or_path)
    kind = data.pop("kind")
    data.pop("description", None)
    config_class, builder = _kind(kind)
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(overrides) - known)  # whatever its value: --set bogus=null was accepted and dropped
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if unknown:
        raise ConfigError(
            f"space {name!r} (kind {kind!r}) has no setting {', '.join(unknown)}; "
            f"its settings: {', '.join(sorted(known))}"
        )
    data = {**data, **overrides}
    if model_config is not None and kind in _MODEL_FREE_KINDS:
        raise ConfigError(f"space {name!r} defines its whole network (kind {kind!r}); it takes no model: drop --model")
    config = config_from_dict(config_class, data, f"space {name!r}")
    space = builder(config, model_config)
    return dataclasses.replace(space, name=name, settings={"kind": kind, **dataclasses.asdict(config)})
