"""A base checkpoint folder, read and checked once: config.json, every tensor's location, per-layer widths.

``check_projections`` is the one check that a folder's weights are the model its config describes; extraction
(``open_base``), calibration and psi_W (``--score psi_w``) all use it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._files import ADAPTER_CONFIG_NAME, ADAPTER_DIR, CONFIG_NAME
from nsc_prune._io import read_json_object
from nsc_prune._validation import must_be
from nsc_prune.core.spec import (
    FUSED,
    FUSED_TYPES,
    config_head_dim,
    config_kv_heads,
    config_tied,
    decoder_dims,
    layer_value,
    projection_shapes,
    require_weights_support,
)
from nsc_prune.errors import ConfigError, UnsupportedArchitectureError, require
from nsc_prune.hf.modeling import ARCHITECTURES, DECILM_TYPE
from nsc_prune.hf.weights.loading import is_rotary_buffer, parse_config
from nsc_prune.hf.weights.safetensors_io import TensorInfo, check_float_weights, index_model_dir
from nsc_prune.presets import read_model_config

_DIM_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


@dataclass(frozen=True)
class BaseModel:
    """A base checkpoint folder: raw config.json, every tensor's location, and per-layer FFN widths and KV heads."""

    folder: Path
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    widths: tuple[int, ...]
    kv_heads: tuple[int, ...]
    head_is_embedding: bool = False  # a tied model's lm_head.weight is stored too, the embedding's bytes again

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def group_size(self) -> int:
        """Query heads per KV group (the GQA ratio, the same in every layer)."""
        return int(self.config["num_attention_heads"]) // config_kv_heads(self.config)

    @property
    def head_dim(self) -> int:
        return config_head_dim(self.config)

    def is_model_tensor(self, name: str) -> bool:
        """Whether the stored tensor ``name`` is one of the model's: not a rotary buffer some old checkpoints carry
        (non-persistent: transformers recomputes it), nor a tied ``lm_head``'s stored copy of the embedding (the
        model ties them; a copy that differs is loaded untied by transformers 5, so it is the model's head)."""
        return not is_rotary_buffer(name) and not (name == "lm_head.weight" and self.head_is_embedding)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: info.shape for name, info in self.tensors.items()}

    def part(self, i: int, module: str) -> tuple[TensorInfo, slice]:
        """The tensor that holds ``module``'s weight of layer ``i`` (``self_attn.q_proj``, ...) and its rows there:
        all of them, or the part's block of a ``FUSED`` one (Phi-3)."""
        return weight_part(self.tensors, self.config, i, module)


def _part_shapes(config: Mapping[str, Any], i: int) -> dict[str, tuple[int, int]]:
    heads = layer_value(config, i, "num_attention_heads")
    kv = layer_value(config, i, "num_key_value_heads") or heads
    width = layer_value(config, i, "intermediate_size")
    return projection_shapes(config["hidden_size"], config_head_dim(config), heads, kv, width)


def layer_shapes(config: Mapping[str, Any], i: int) -> dict[str, tuple[int, int]]:
    """``(out, in)`` of each projection of layer ``i`` as the checkpoint stores it: the ``FUSED`` ones (Phi-3) as
    their parts stacked along the rows."""
    shapes = _part_shapes(config, i)
    if config.get("model_type") not in FUSED_TYPES:
        return shapes
    for fused, parts in FUSED.items():
        rows = sum(shapes.pop(part)[0] for part in parts)
        shapes[fused] = (rows, config["hidden_size"])
    return shapes


def weight_part(
    tensors: Mapping[str, TensorInfo], config: Mapping[str, Any], i: int, module: str
) -> tuple[TensorInfo, slice]:
    """``BaseModel.part`` for any folder's ``tensors`` and ``config``."""
    for fused, parts in FUSED.items() if config.get("model_type") in FUSED_TYPES else ():
        if module in parts:
            shapes = _part_shapes(config, i)
            start = sum(shapes[p][0] for p in parts[: parts.index(module)])
            return tensors[f"model.layers.{i}.{fused}.weight"], slice(start, start + shapes[module][0])
    info = tensors[f"model.layers.{i}.{module}.weight"]
    return info, slice(0, info.shape[0])


def check_projections(
    tensors: Mapping[str, Any], config: Mapping[str, Any], where: str, fix: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Raise ConfigError unless every projection (and bias) of every layer in ``tensors`` has the shape ``config``
    implies; returns the per-layer FFN widths and KV heads. ``where`` names the folder, ``fix`` says what to do.
    Integer weights (a quantized checkpoint's codes) are refused first."""
    check_float_weights(tensors, where)
    widths, kv_heads = [], []
    for i in range(config["num_hidden_layers"]):
        width, heads = layer_value(config, i, "intermediate_size"), layer_value(config, i, "num_attention_heads")
        kv = layer_value(config, i, "num_key_value_heads") or heads
        for module, shape in layer_shapes(config, i).items():
            name = f"model.layers.{i}.{module}.weight"
            if name not in tensors:
                raise ConfigError(
                    f"{where} has no tensor {name} (the model config has {config['num_hidden_layers']} layers); {fix}"
                )
            if tuple(tensors[name].shape) != shape:
                raise ConfigError(
                    f"{where}: tensor {name} is {list(tensors[name].shape)} but the model config implies "
                    f"{list(shape)}; {fix}"
                )
            bias = tensors.get(f"model.layers.{i}.{module}.bias")
            if bias is not None and tuple(bias.shape) != shape[:1]:
                raise ConfigError(
                    f"{where}: tensor {bias.name} is {list(bias.shape)}, its weight implies {list(shape[:1])}; {fix}"
                )
        widths.append(width)
        kv_heads.append(kv)
    return tuple(widths), tuple(kv_heads)


def check_no_kept_adapter(
    folder: Path, flag: str, adapter: str | os.PathLike | None = None, takes_adapter: bool = False
) -> None:
    """ConfigError when ``folder`` holds a kept adapter (``extract --keep-adapter``'s ``adapter/``, which loading the
    folder attaches) that the job reading its weights would leave out: they alone are another model. A job that
    ``takes_adapter`` (extraction) applies the ``adapter`` it is given, so passing that one merges it."""
    kept = folder / ADAPTER_DIR
    if not (kept / ADAPTER_CONFIG_NAME).is_file():
        return
    if adapter is not None and Path(adapter).resolve() == kept.resolve():
        return
    merge = f"merge it first: extract the folder again with --adapter {kept}, without --keep-adapter"
    if takes_adapter and adapter is None:
        fix = f"pass --adapter {kept} to merge it"
    elif takes_adapter:  # its own first, then the one asked for: one extraction applies one adapter
        fix = f"{merge}, then extract that with --adapter {adapter}"
    else:
        fix = merge
    raise ConfigError(
        f"{flag} {folder} holds a kept adapter ({kept}), part of its model, which would be left out; {fix}"
    )


def open_base(
    folder: str | os.PathLike, job: str = "extraction", flag: str = "--base", adapter: str | os.PathLike | None = None
) -> BaseModel:
    """Read and check a LLaMA-family base folder: config, shard headers, every projection's (and bias's) shape.
    ``job`` names the command in the one-line refusal of a search-only model type (gemma2, phi3, ...), ``flag`` the
    option that gave the folder; ``adapter``: the one the job applies to it (``check_no_kept_adapter``)."""
    folder = Path(folder)
    config = read_model_config(folder, flag)
    check_no_kept_adapter(folder, flag, adapter, takes_adapter=job == "extraction")
    require_weights_support(config, job)
    if config.get("model_type") not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            must_be(
                f"the base's model_type ({folder / CONFIG_NAME})",
                f"one of {sorted(ARCHITECTURES)} (LLaMA-family decoders)",
                config.get("model_type"),
                "Extraction cannot prune this architecture",
            )
        )
    try:  # the search's checks of the sizes (positive integers, heads that divide), then transformers' own
        decoder_dims(config)
        parse_config(require("transformers", "hf").CONFIG_MAPPING[config["model_type"]], config)
    except ConfigError as err:
        raise ConfigError(f"base {folder}: {err}") from err
    if config.get("quantization_config"):
        raise ConfigError(
            f"base {folder} is quantized; extract from float weights (see nsc_prune.hf.weights.gguf_import for GGUF)"
        )
    tensors = index_model_dir(folder)
    widths, kv_heads = check_projections(
        tensors, config, f"base {folder}", "the checkpoint does not match its config.json"
    )
    head_is_embedding = config_tied(config) and _head_copies_embedding(tensors)
    return BaseModel(folder, config, tensors, widths, kv_heads, head_is_embedding)


def stores_own_head(
    config: Mapping[str, Any], tensors: Mapping[str, TensorInfo], copies_embedding: bool | None = None
) -> bool:
    """Whether ``config`` ties the embeddings but the stored ``tensors`` hold a head of its own (not a copy of the
    embedding): transformers 5 loads such a model untied. ``config`` may be a nemotron-nas one (heal's input);
    ``copies_embedding``: whether the head copies the embedding, where the caller compared them already."""
    if "lm_head.weight" not in tensors:
        return False
    if config.get("model_type") == DECILM_TYPE:  # DeciLM's config is LlamaConfig's: untied unless it says so
        tied = config.get("tie_word_embeddings") is True
    else:
        tied = config_tied(config)
    return tied and not (_head_copies_embedding(tensors) if copies_embedding is None else copies_embedding)


def _head_copies_embedding(tensors: Mapping[str, TensorInfo]) -> bool:
    """Whether the stored ``lm_head.weight`` holds the embedding's values: byte for byte, or in another float type
    (transformers compares the values when it decides to tie them)."""
    head, embedding = tensors.get("lm_head.weight"), tensors.get("model.embed_tokens.weight")
    if head is None or embedding is None or head.shape != embedding.shape:
        return False
    if head.dtype == embedding.dtype:
        return _same_bytes(tensors, "lm_head.weight", "model.embed_tokens.weight")
    torch, safetensors = require("torch", "hf"), require("safetensors", "hf")
    values = []
    for name, info in (("lm_head.weight", head), ("model.embed_tokens.weight", embedding)):
        with safetensors.safe_open(str(info.file), framework="pt") as handle:
            values.append(handle.get_tensor(name).float())
    return bool(torch.equal(*values))


def _same_bytes(tensors: Mapping[str, TensorInfo], first: str, second: str, chunk: int = 1 << 24) -> bool:
    """Whether the stored tensors ``first`` and ``second`` both exist and hold the same dtype, shape and bytes."""
    a, b = tensors.get(first), tensors.get(second)
    if a is None or b is None or (a.dtype, a.shape) != (b.dtype, b.shape):
        return False
    with open(a.file, "rb") as file_a, open(b.file, "rb") as file_b:
        file_a.seek(a.start)
        file_b.seek(b.start)
        for done in range(0, a.nbytes, chunk):
            size = min(chunk, a.nbytes - done)
            if file_a.read(size) != file_b.read(size):
                return False
    return True


def check_weights_match(model_dir: Path, tensors: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Raise ConfigError when the weights folder is another model than ``config`` (``--score psi_w``): its own
    config.json (when it has one) disagrees on a dimension, or a projection is missing or has another shape."""
    fix = "pass --weights of the model given to --model (or the --model that matches these weights)"
    dims = decoder_dims(config)
    config_path = model_dir / CONFIG_NAME
    if config_path.is_file():
        try:
            theirs = decoder_dims(read_json_object(config_path))
        except ConfigError:
            theirs = None  # unreadable or another family: the tensor shapes below still decide
        for field in _DIM_FIELDS if theirs is not None else ():
            if getattr(theirs, field) != getattr(dims, field):
                raise ConfigError(
                    f"--weights {model_dir} is another model: its config.json has {field}={getattr(theirs, field)} "
                    f"but the model config has {field}={getattr(dims, field)}; {fix}"
                )
    check_projections(tensors, config, f"--weights {model_dir}", fix)
