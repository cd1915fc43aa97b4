"""Channel selection: WHICH FFN channels and KV groups a pruned layer keeps (the search decides HOW MANY).

Each method returns one ``LayerOrder`` per layer: the FFN channels and the KV groups ranked most
important first (permutations). Extraction keeps the first ``k`` of each (``nsc_prune.subnet``).

- ``first``: the identity, i.e. supernet order (LoNAS trains its supernet so the first channels matter most).
- ``magnitude``: data-free weight norms. FFN channel j: ``|gate[j]| |up[j]| |down[:, j]|``; KV group g:
  ``|v[rows of g]| |o[:, columns of g's query heads]|`` (Frobenius norms).
- ``activation``: calibration on a text file. FFN channel j: mean |input of down_proj| (the SwiGLU hidden
  unit); KV group g: mean |input of o_proj| over the head dimensions of g's query heads (the head
  outputs); both averaged over the calibration tokens, from forward hooks on a CPU float32 model.

Issue 6 measured on SmolLM2 at 75 % FFN width (pydoc perplexity, dense 14.9): first 2106, random 332,
magnitude 4.6e6, activation 26.4; hence ``activation`` is the default for plain models.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsc_prune.errors import InvalidInputError, require
from nsc_prune.subnet import LayerOrder

if TYPE_CHECKING:
    from nsc_prune.extract import BaseModel

SELECTIONS = ("first", "magnitude", "activation")


@dataclass(frozen=True)
class SelectionConfig:
    """How extraction picks the kept channels. Validated on construction."""

    method: str = "first"  # one of SELECTIONS
    calib: str | None = None  # UTF-8 text file for "activation"
    calib_tokens: int = 4096  # calibration tokens (fewer if the file is shorter)
    seq_len: int = 512  # tokens per forward pass during calibration

    def __post_init__(self) -> None:
        if self.method not in SELECTIONS:
            raise InvalidInputError(f"The 'selection' parameter must be one of {SELECTIONS}. Got {self.method!r} instead.")
        if self.method == "activation" and self.calib is None:
            raise InvalidInputError("selection 'activation' needs a calibration text: pass --calib FILE")
        if self.calib_tokens < 1 or self.seq_len < 1:
            raise InvalidInputError(f"calib_tokens and seq_len must be >= 1. Got {self.calib_tokens}, {self.seq_len}.")


def read_calibration_text(path: str | os.PathLike) -> str:
    """The text of a calibration file; InvalidInputError when it is missing, empty or not UTF-8 text."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"The 'calib' file {path} does not exist; pass a UTF-8 text file.")
    data = path.read_bytes()
    if b"\x00" in data[:65536]:
        raise InvalidInputError(f"The 'calib' file {path} is binary (it has NUL bytes); pass a UTF-8 text file.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidInputError(f"The 'calib' file {path} is not UTF-8 text ({err.reason} at byte {err.start}).") from err
    if not text.strip():
        raise InvalidInputError(f"The 'calib' file {path} is empty; pass a text with at least a few hundred tokens.")
    return text


def _ranked(scores) -> tuple[int, ...]:
    """Indices by decreasing score; ties keep the lower index first (stable)."""
    torch = require("torch", "hf")
    return tuple(torch.sort(torch.as_tensor(scores, dtype=torch.float64), descending=True, stable=True).indices.tolist())


def first_orders(base: BaseModel) -> list[LayerOrder]:
    return [LayerOrder.identity(w, kv) for w, kv in zip(base.widths, base.kv_heads, strict=True)]


def magnitude_orders(base: BaseModel) -> list[LayerOrder]:
    """Data-free: rank by products of weight norms (see the module docstring), streamed layer by layer."""
    from nsc_prune.checkpoint import TensorReader

    reader = TensorReader()
    dim, group = base.head_dim, base.group_size
    orders = []
    try:
        for i in range(base.num_layers):
            def weight(module: str):
                return reader.read(base.tensors[f"model.layers.{i}.{module}.weight"]).float()

            ffn = weight("mlp.gate_proj").norm(dim=1) * weight("mlp.up_proj").norm(dim=1) * weight("mlp.down_proj").norm(dim=0)
            kv = base.kv_heads[i]
            v = weight("self_attn.v_proj").reshape(kv, dim, -1).flatten(1).norm(dim=1)
            o = weight("self_attn.o_proj").reshape(-1, kv, group * dim).permute(1, 0, 2).flatten(1).norm(dim=1)
            orders.append(LayerOrder(_ranked(ffn), _ranked(v * o)))
    finally:
        reader.close()
    return orders


def activation_scores(model: Any, input_ids: Any, seq_len: int) -> list[tuple[Any, Any]]:
    """Per layer (mean |down_proj input| per FFN channel, mean |o_proj input| per query head) over the
    tokens of ``input_ids`` (1-D), run in chunks of ``seq_len`` tokens."""
    torch = require("torch", "hf")
    layers = model.model.layers
    sums = [[None, None] for _ in layers]
    handles = []

    def hook(i: int, slot: int, heads: int | None):
        def record(module, args):
            x = args[0].detach().abs().flatten(0, -2).double().sum(0)  # (features,)
            if heads is not None:
                x = x.reshape(heads, -1).sum(1)
            sums[i][slot] = x if sums[i][slot] is None else sums[i][slot] + x

        return record

    for i, layer in enumerate(layers):
        heads = layer.self_attn.o_proj.in_features // layer.self_attn.head_dim
        handles.append(layer.mlp.down_proj.register_forward_pre_hook(hook(i, 0, None)))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(hook(i, 1, heads)))
    try:
        with torch.no_grad():
            for start in range(0, len(input_ids), seq_len):
                model(input_ids[start : start + seq_len][None], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    n = len(input_ids)
    return [(ffn / n, head / (n * layers[i].self_attn.head_dim)) for i, (ffn, head) in enumerate(sums)]


def calibration_ids(folder: str | os.PathLike, text: str, tokens: int) -> Any:
    """The first ``tokens`` token ids of ``text`` with the base's tokenizer (1-D tensor)."""
    transformers = require("transformers", "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0][:tokens]
    if len(ids) == 0:
        raise InvalidInputError("the calibration text has no tokens; pass a longer UTF-8 text file")
    return ids


def activation_orders(base: BaseModel, config: SelectionConfig) -> tuple[list[LayerOrder], dict[str, Any]]:
    """Calibration orders (module docstring) and what was used: tokens, file hash."""
    from nsc_prune.extract import load_pruned
    from nsc_prune.io import sha256_file

    text = read_calibration_text(config.calib)
    ids = calibration_ids(base.folder, text, config.calib_tokens)
    model = load_pruned(base.folder, dtype="float32", adapter=False)
    scores = activation_scores(model, ids, min(config.seq_len, int(base.config.get("max_position_embeddings") or 2048)))
    del model
    group = base.group_size
    orders = [LayerOrder(_ranked(ffn), _ranked(head.reshape(-1, group).sum(1))) for ffn, head in scores]
    used = {"calib": str(Path(config.calib).resolve()), "calib_sha256": sha256_file(Path(config.calib)), "calib_tokens": len(ids)}
    return orders, used


def channel_orders(base: BaseModel, config: SelectionConfig) -> tuple[list[LayerOrder], dict[str, Any]]:
    """One ``LayerOrder`` per layer of ``base`` for ``config.method``, and the record for provenance."""
    record: dict[str, Any] = {"method": config.method}
    if config.method == "first":
        return first_orders(base), record
    if config.method == "magnitude":
        return magnitude_orders(base), record
    orders, used = activation_orders(base, config)
    return orders, record | used | {"seq_len": config.seq_len}
