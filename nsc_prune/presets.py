"""Resolve ``--model``: a bundled preset, a local folder or config.json, or a hub id already in
the local Hugging Face cache. Never touches the network."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._files import CONFIG_NAME, PRESETS_DIR, SOURCE_RECORD_NAME, user_path
from nsc_prune._io import checkpoint_record, read_json_object
from nsc_prune._validation import must_be
from nsc_prune._warn import warn
from nsc_prune.errors import ConfigError, InvalidInputError


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: display name, the config dict, and where it came from."""

    name: str
    config: dict[str, Any]
    source: str


# a GGUF file's quantisation suffix: SmolLM2-135M-Instruct.Q4_1, Llama-3.2-1B-Instruct-Q4_K_M, model.BF16
_GGUF_TYPE = re.compile(
    r"(?:[.-](?:UD-)?(?:I?Q\d\w*|TQ\d_\d|MXFP4(?:_MOE)?|BF16|FP?16|FP?32))?(?:-\d{5}-of-\d{5})?$", re.IGNORECASE
)


def gguf_model_name(file_name: str) -> str:
    """The model's name in a GGUF file's name: ``.gguf`` and the quantisation type after it dropped, the version
    dots kept (``Llama-3.2-1B-Instruct-Q4_K_M.gguf`` -> ``Llama-3.2-1B-Instruct``, not ``Llama-3``)."""
    stem = file_name[: -len(".gguf")] if file_name.lower().endswith(".gguf") else file_name
    return _GGUF_TYPE.sub("", stem)


def folder_model_name(folder: str | os.PathLike) -> str | None:
    """A model folder's own name for people, or None when it states none: config.json's ``_name_or_path`` (its
    last part: ``HuggingFaceTB/SmolLM2-135M`` -> ``SmolLM2-135M``), else the GGUF file ``nsc-prune models
    --prepare`` converted it from (``SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``SmolLM2-135M-Instruct``), else, for a
    checkpoint nsc-prune wrote (pruned, healed, pruned again), the name of the model it was first cut from (its
    record's ``base_name``), else the repository of a hub cache snapshot (``hub_repo_id``). Never the folder's own
    name, which may be a cache key."""
    folder = Path(folder)
    config = folder / CONFIG_NAME
    name = str(read_json_object(config).get("_name_or_path") or "") if config.is_file() else ""
    if name.strip("/"):
        return Path(name.rstrip("/")).name
    source = folder / SOURCE_RECORD_NAME
    if source.is_file():
        converted = str(read_json_object(source, unique_keys=True).get("source") or "")
        return gguf_model_name(Path(converted).name) or None
    try:
        name = checkpoint_record(folder).get("base_name")
    except ConfigError:  # a record that does not read names nothing (a name is no reason to fail)
        name = None
    if isinstance(name, str) and name:
        return name
    repo = hub_repo_id(folder)
    return repo.rsplit("/", 1)[-1] if repo else None


def hub_repo_id(folder: str | os.PathLike) -> str | None:
    """``org/name`` of a Hugging Face cache snapshot folder (``.../models--org--name/snapshots/<commit>``), whose own
    name is a commit hash; None for any other folder."""
    path = Path(os.path.abspath(folder))
    repo = path.parent.parent.name
    if path.parent.name != "snapshots" or not repo.startswith("models--") or repo == "models--":
        return None
    return repo.removeprefix("models--").replace("--", "/")


def read_model_config(
    folder: str | os.PathLike, name: str, what: str = "a model folder", fix: str = ""
) -> dict[str, Any]:
    """``folder``'s config.json as a dict; InvalidInputError in one line, naming ``name`` (the flag or argument that
    gave the folder) and why, for a path that is not ``what`` with a config.json."""
    given, folder = os.fspath(folder), Path(folder)
    if not (folder / CONFIG_NAME).is_file():
        why = (
            f"it has no {CONFIG_NAME}"
            if folder.is_dir()
            else "it is a file"
            if folder.exists()
            else "it does not exist"
        )
        cached = _cached_hub_config(given) if why == "it does not exist" else None
        if cached is not None:  # --model takes a cached hub id; a weights input takes its folder
            why += f"; the hub id is cached at {cached.parent}: pass that folder"
        raise InvalidInputError(
            must_be(name, f"{what} with {CONFIG_NAME}", str(folder)) + f" ({why})" + (fix and f". {fix}")
        )
    return read_json_object(folder / CONFIG_NAME)


def presets() -> list[str]:
    """The bundled model presets' names (``--model llama-7b``), sorted."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.json"))


def preset_source(name: str) -> ModelSource:
    """The bundled preset ``name`` (one of ``presets()``)."""
    return ModelSource(name, read_json_object(PRESETS_DIR / f"{name}.json"), f"preset {name}")


def hf_cache_dir() -> Path:
    """The hub cache folder as huggingface_hub finds it: HF_HUB_CACHE, its old name HUGGINGFACE_HUB_CACHE, HF_HOME's
    ``hub``, then ``$XDG_CACHE_HOME/huggingface/hub`` (``~`` and ``$VARS`` expanded)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return user_path(os.path.expandvars(os.environ[name]))
    home = os.environ.get("HF_HOME")
    if home:
        return user_path(os.path.expandvars(home)) / "hub"
    cache = os.environ.get("XDG_CACHE_HOME")
    return (user_path(os.path.expandvars(cache)) if cache else Path.home() / ".cache") / "huggingface" / "hub"


def _cached_hub_config(repo_id: str) -> Path | None:
    repo = hf_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = repo / "snapshots" / ref.read_text().strip() / "config.json"
        if candidate.is_file():
            return candidate
    snapshots = sorted((repo / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return snapshots[-1] if snapshots else None


def resolve_model(model: str) -> ModelSource:
    """Find the config for ``model``: preset name, folder with config.json, a config.json file,
    or an ``org/name`` hub id in the local HF cache."""
    if not str(model).strip():
        raise ConfigError(f"--model must name a preset, a folder with config.json, or a cached hub id; got {model!r}")
    model = os.fspath(model) if isinstance(model, os.PathLike) else model  # a Path from Python: its text
    bare = (
        isinstance(model, str) and not any(mark in model for mark in ("/", "\\")) and not model.startswith((".", "~"))
    )
    preset = PRESETS_DIR / f"{model}.json"
    if bare and preset.is_file():  # ./llama-7b and /p/llama-7b are paths: joined onto the presets they named a preset
        if Path(model).is_dir():
            warn(f"{model} names a preset and a folder here; reading the preset (pass ./{model} for the folder)")
        return preset_source(model)
    path = user_path(model)
    named = Path(os.path.abspath(path))  # "." and ".." by their names; a link (a hub snapshot) by its own
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path} has no config.json; --model takes a preset, a model folder, or a cached hub id")
        return ModelSource(
            hub_repo_id(named) or named.name, read_json_object(path / "config.json"), str(path.resolve())
        )
    if path.is_file() and path.suffix.lower() == ".json":  # named by its folder: --model ./config.json too
        name = hub_repo_id(named.parent) or named.parent.name or path.stem
        return ModelSource(name, read_json_object(path), str(path.resolve()))
    if path.is_file():
        raise ConfigError(f"{path} is not a config.json; --model takes a preset, a model folder, or a cached hub id")
    looks_local = model.startswith((".", "/", "~")) or path.suffix.lower() == ".json"
    if looks_local and not path.exists():
        raise ConfigError(
            f"{model} does not exist; --model takes a preset, a folder with config.json, or a cached hub id"
        )
    if model.count("/") == 1 and not path.exists():
        cached = _cached_hub_config(model)
        if cached is None:
            raise ConfigError(
                f"{model!r} is not in the local Hugging Face cache ({hf_cache_dir()}); nsc-prune never downloads. "
                f"Fetch it first with `hf download {model} config.json`, or pass a local folder"
            )
        return ModelSource(model, read_json_object(cached), str(cached))
    close = difflib.get_close_matches(model, presets(), n=3, cutoff=0.5)
    hint = f"Did you mean {', '.join(close)}? " if close else ""
    raise ConfigError(
        f"unknown model {model!r}. {hint}Presets: {', '.join(presets())}; or pass a folder with config.json"
    )
