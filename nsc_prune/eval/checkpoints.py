"""Checkpoints to evaluate: the preflight (config, model type, safetensors shapes against the config, tokenizer)
that runs on every folder before anything loads, and loading without remote code."""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nsc_prune._files import CONFIG_NAME, RECORD_NAME, TOKENIZER_CORE_FILES, has_tokenizer
from nsc_prune._io import read_json_object
from nsc_prune._validation import must_be
from nsc_prune.core.spec import PER_LAYER_HEADS_KEY
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError, require
from nsc_prune.hf.modeling import (
    ARCHITECTURES,
    DECILM_AUTO_MAP,
    DECILM_FILES,
    DECILM_TYPE,
    EARLIER_DECILM_MODELING_SHA256,
    MODELING_FILE,
)
from nsc_prune.presets import read_model_config

PRUNED, STOCK = "pruned", "stock"  # how a checkpoint loads: nsc_prune.load_pruned, or AutoModelForCausalLM


def checkpoint_kind(path: Path, config: Mapping[str, Any]) -> str:
    """PRUNED for a folder written by ``nsc-prune extract`` (its record file, or ``auto_map`` naming the
    shipped modeling file), STOCK for a causal LM whose ``model_type`` transformers ships; anything else
    is refused, naming the model_type."""

    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise UnsupportedArchitectureError(must_be(f"the model_type of {path / CONFIG_NAME}", "a string", model_type))
    auto_map = {} if config.get("auto_map") is None else config["auto_map"]
    if not isinstance(auto_map, Mapping):  # a string or list ("" and [] too): .get raised, and falsy ones read as none
        raise InvalidInputError(
            must_be(f"the auto_map of {path / CONFIG_NAME}", "a JSON object", auto_map, "Fix config.json")
        )
    shipped = str(auto_map.get("AutoModelForCausalLM", "")).startswith(f"{MODELING_FILE.stem}.")
    if (path / RECORD_NAME).is_file() or shipped or model_type == DECILM_TYPE:
        if model_type not in (*ARCHITECTURES, DECILM_TYPE):
            raise UnsupportedArchitectureError(
                f"checkpoint {path} was written by nsc-prune but has model_type {model_type!r}; expected one of "
                f"{sorted((*ARCHITECTURES, DECILM_TYPE))}. Fix config.json or re-extract the checkpoint"
            )
        return PRUNED
    transformers = require("transformers", "hf")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal_lms

    if model_type not in causal_lms:
        close = difflib.get_close_matches(str(model_type), list(causal_lms), n=3, cutoff=0.6)
        raise UnsupportedArchitectureError(
            f"checkpoint {path} has model_type {model_type!r}, which is not a causal LM that transformers "
            f"{transformers.__version__} ships{f' (close matches: {close})' if close else ''}. nsc-prune eval loads "
            "checkpoints written by nsc-prune extract and stock Hugging Face causal LMs (e.g. 'llama', 'qwen2', "
            "'mistral'); it never runs a checkpoint's remote code"
        )
    return STOCK


def check_checkpoint(path: str | os.PathLike) -> str:
    """Preflight of the folder ``path`` before anything loads; returns the checkpoint's kind (PRUNED or STOCK).

    config.json readable and of a supported model_type, safetensors present and whole (pickles refused),
    every tensor's shape in the safetensors headers as config.json implies, tokenizer files present.
    """
    from nsc_prune.hf.weights.loading import check_checkpoint_shapes
    from nsc_prune.hf.weights.safetensors_io import index_model_dir

    path = Path(path)
    config = read_model_config(path, "checkpoint")
    kind = checkpoint_kind(path, config)
    found = index_model_dir(path)  # safetensors present and whole; refuses pickles
    if not config.get("quantization_config"):  # packed quantized weights do not have the config's shapes
        check_checkpoint_shapes(path, config, found, pruned=kind == PRUNED)
    if not has_tokenizer(path):
        raise InvalidInputError(
            f"checkpoint {path} has no tokenizer ({' or '.join(TOKENIZER_CORE_FILES)}); copy it from the base model"
        )
    return kind


def vllm_remote_code(path: Path) -> bool:
    """Whether vLLM needs ``trust_remote_code`` for checkpoint ``path`` (which passed ``check_checkpoint``): True only
    for a nemotron-nas checkpoint whose shipped config/modeling files are this nsc-prune's or earlier ones' (vLLM
    reads its config class from there). A checkpoint vLLM cannot load (per-layer widths or heads of the default
    format, other shipped code) is refused."""
    config = read_model_config(path, "checkpoint")
    if config.get("model_type") == DECILM_TYPE:
        changed = [f.name for f in DECILM_FILES if not _own_decilm_file(path / f.name, f)]
        if changed:
            raise InvalidInputError(
                f"checkpoint {path}: {', '.join(changed)} is missing or not nsc-prune's; --backend vllm runs only "
                f"nsc-prune's own remote code. Copy {' and '.join(changed)} from {DECILM_FILES[0].parent} into it"
            )
        _check_only_own_code(path, config)
        return True
    if config.get("per_layer_config") or config.get(PER_LAYER_HEADS_KEY):
        raise InvalidInputError(
            f"checkpoint {path} has per-layer FFN widths or heads, which vLLM's {config.get('model_type')} "
            "model cannot "
            "load; re-extract it with nsc-prune extract --format nemotron-nas (or evaluate it with --backend hf)"
        )
    return False


def _own_decilm_file(shipped: Path, own: Path) -> bool:
    """Whether the checkpoint's ``shipped`` file is this nsc-prune's ``own``, or a modeling file an earlier release
    shipped (a fix to the model class must not strand the checkpoints written before it)."""
    if not shipped.is_file():
        return False
    data = shipped.read_bytes()
    return data == own.read_bytes() or (
        own.name == "modeling_nsc_decilm.py" and hashlib.sha256(data).hexdigest() in EARLIER_DECILM_MODELING_SHA256
    )


def _check_only_own_code(path: Path, config: Mapping[str, Any]) -> None:
    """InvalidInputError unless the remote code ``trust_remote_code`` would run in ``path`` is nsc-prune's alone:
    config.json's ``auto_map`` names the shipped DeciLM files, the tokenizer's config names none (vLLM passes the flag
    to the tokenizer too), and no other Python file lies beside them."""
    names = {f.name for f in DECILM_FILES}
    other = sorted(p.name for p in path.glob("*.py") if p.name not in names)
    tokenizer = path / "tokenizer_config.json"
    tokenizer_map = read_json_object(tokenizer).get("auto_map") if tokenizer.is_file() else None
    problem = (
        f"config.json's auto_map is {config.get('auto_map')!r}, not the shipped DeciLM classes"
        if config.get("auto_map") != DECILM_AUTO_MAP
        else f"tokenizer_config.json has an auto_map ({tokenizer_map!r})"
        if tokenizer_map
        else f"it holds other Python files ({', '.join(other)})"
        if other
        else None
    )
    if problem:
        raise InvalidInputError(
            f"checkpoint {path}: {problem}; --backend vllm trusts only nsc-prune's own remote code. Re-extract it with "
            "nsc-prune extract --format nemotron-nas"
        )


def check_tensor_parallel(path: Path, size: int) -> None:
    """InvalidInputError unless vLLM can split nemotron-nas checkpoint ``path`` over ``size`` GPUs: the query heads
    and every kept layer's FFN width divisible by ``size``, its KV heads divisible by it or dividing it (vLLM then
    replicates them). Other checkpoints are vLLM's own to check."""
    config = read_model_config(path, "checkpoint")
    if size <= 1 or config.get("model_type") != DECILM_TYPE:
        return
    heads = int(config["num_attention_heads"])
    problems = [f"{heads} query heads"] if heads % size else []
    for i, block in enumerate(config.get("block_configs") or []):
        ffn, attention = block.get("ffn") or {}, block.get("attention") or {}
        if not ffn.get("no_op") and int(ffn.get("intermediate_size", 0)) % size:
            problems.append(f"layer {i}'s FFN width {ffn['intermediate_size']}")
        kv = heads // int(attention.get("n_heads_in_group") or heads)
        if not attention.get("no_op") and kv % size and size % kv:
            problems.append(f"layer {i}'s {kv} KV heads")
    if problems:
        raise InvalidInputError(
            f"checkpoint {path} cannot be split over --tensor-parallel-size {size}: {', '.join(problems[:3])}"
            f"{f' (+{len(problems) - 3} more)' if len(problems) > 3 else ''} (widths and head counts must divide "
            "evenly); use a size that divides them, 1, or a width grid whose step it divides"
        )


def checkpoint_params(path: Path) -> int:
    """Parameters stored in a checkpoint's safetensors (from the headers; nothing is loaded)."""
    from math import prod

    from nsc_prune.hf.weights.safetensors_io import index_model_dir

    return sum(prod(info.shape) for info in index_model_dir(path).values())


def deployed_params(model: Any) -> int:
    """Parameters of ``model`` as deployed: a PEFT model's adapter (a ``--keep-adapter`` checkpoint's, attached
    unmerged) counts as merged, that is not at all, as ``checkpoint_params`` counts the same folder."""
    prefix = getattr(getattr(model, "base_model", None), "prefix", None)  # PEFT's tuner: "lora_"
    return sum(p.numel() for name, p in model.named_parameters() if not (prefix and prefix in name))


def load_checkpoint(
    path: str | os.PathLike, kind: str, dtype: str, device: str, device_map: str | None = None
) -> tuple[Any, Any]:
    """Model and tokenizer of a checkpoint folder that passed ``check_checkpoint``, on ``device``.

    PRUNED: ``nsc_prune.load_pruned`` (the package's own class, no remote code). STOCK:
    ``AutoModelForCausalLM`` from safetensors with ``trust_remote_code=False``; a missing or mis-shaped
    tensor is an error, never silently re-initialised.
    """
    torch = require("torch", "hf")
    transformers = require("transformers", "hf")
    from nsc_prune.hf.weights.loading import from_pretrained, load_pruned, load_tokenizer, non_finite_parameter

    try:
        if kind == PRUNED:
            model = load_pruned(path, dtype=getattr(torch, dtype), device_map=device_map)
        else:
            model, info = from_pretrained(
                transformers.AutoModelForCausalLM,
                path,
                dtype=getattr(torch, dtype),
                device_map=device_map,
                use_safetensors=True,
                output_loading_info=True,
            )
            problems = {
                k: sorted(map(str, info[k])) for k in ("missing_keys", "mismatched_keys", "error_msgs") if info.get(k)
            }
            if problems:
                raise ConfigError(f"checkpoint {path} does not match its config.json: {problems}")
            model.eval()
        # the one loader (never remote code: a nemotron-nas config's auto_map made transformers ask to run its own)
        tokenizer = load_tokenizer(path, "copy the base's tokenizer files into the checkpoint")
    except (InvalidInputError, ConfigError):
        raise
    except Exception as err:
        message = " ".join(str(err).split())  # one line, as every error
        raise ConfigError(f"checkpoint {path} could not be loaded: {type(err).__name__}: {message}") from err
    spoilt = non_finite_parameter(model)
    if spoilt is not None:  # every log-likelihood would be NaN, and every choice scored as the first
        raise ConfigError(
            f"checkpoint {path}: {spoilt} holds NaN or inf values (in {dtype}); its scores would mean nothing"
        )
    return (model if device_map else model.to(device)), tokenizer
