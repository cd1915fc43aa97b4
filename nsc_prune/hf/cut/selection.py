"""Channel selection: WHICH FFN channels and KV groups a pruned layer keeps (the search decides HOW MANY).

Each method returns one ``LayerOrder`` per layer: the FFN channels and the KV groups ranked most
important first (permutations). Extraction keeps the first ``k`` of each (``nsc_prune.hf.cut.keep``).

- ``first``: the identity, i.e. supernet order (LoNAS trains its supernet so the first channels matter most).
- ``magnitude``: data-free weight norms. FFN channel j: ``|gate[j]| |up[j]| |down[:, j]|``; KV group g:
  ``|v[rows of g]| |o[:, columns of g's query heads]|`` (Frobenius norms).
- ``activation``: calibration on a text file. FFN channel j: mean |input of down_proj| (the SwiGLU hidden
  unit); KV group g: mean |input of o_proj| over the head dimensions of g's query heads (the head
  outputs); both averaged over the calibration tokens, from forward hooks in float32 on CPU. The base is
  streamed: one decoder layer at a time is read, cast to float32 and run over every calibration chunk, so
  memory is one float32 layer plus the hidden states of the calibration tokens, not the whole model
  (the scores equal those of a whole float32 model: the same operations on the same inputs).

``activation`` is the default for plain models: on a pretrained model it keeps far more of the quality
than the other orders (measured figures: docs/extract.md).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsc_prune._files import TOKENIZER_CORE_FILES, has_tokenizer
from nsc_prune._io import existing_file, read_utf8
from nsc_prune._validation import is_int, must_be
from nsc_prune.choices import SELECTIONS
from nsc_prune.core.spec import decoder_dims
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.cut.keep import LayerOrder, identity_orders
from nsc_prune.hf.weights.compute import Compute
from nsc_prune.hf.weights.values import all_finite

if TYPE_CHECKING:
    from nsc_prune.hf.weights.base import BaseModel

MIN_CALIB_TOKENS = 64  # fewer calibration tokens rank channels by noise; a few thousand are better


@dataclass(frozen=True)
class SelectionConfig:
    """How extraction picks the kept channels. Validated on construction."""

    method: str = "first"  # one of SELECTIONS
    calib: str | None = None  # UTF-8 text file for "activation"
    calib_tokens: int = 4096  # calibration tokens (fewer if the file is shorter; at least MIN_CALIB_TOKENS)
    seq_len: int = 512  # tokens per forward pass during calibration
    tokenizer: str | None = None  # folder with the tokenizer files for "activation"; None: the base folder's
    compute: Compute = field(default_factory=Compute)  # where "activation" runs the base, and in which dtype

    def __post_init__(self) -> None:
        if self.method not in SELECTIONS:
            raise InvalidInputError(must_be("selection", f"one of {SELECTIONS}", self.method))
        if self.method == "activation" and self.calib is None:
            raise InvalidInputError("selection 'activation' needs a calibration text: pass --calib FILE")
        for name, flag, low in (
            ("calib_tokens", "--calib-tokens", MIN_CALIB_TOKENS),
            ("seq_len", "--calib-seq-len", 1),
        ):
            value = getattr(self, name)
            if not is_int(value) or value < low:
                raise InvalidInputError(must_be(flag, f"an integer >= {low}", value))


def read_calibration_text(path: str | os.PathLike, role: str = "calib") -> str:
    """The text of a calibration file (``role`` names it in errors), read as written; InvalidInputError when it is
    missing, empty, not UTF-8 text, a ``.json``/``.jsonl`` file or an ``hf:`` dataset."""
    if str(path).startswith("hf:"):  # a dataset is --data's (heal, train-supernet) input
        raise InvalidInputError(f"The '{role}' file must be a text file; got the dataset {path}. Write its text to one")
    path = existing_file(path, f"The '{role}' file", "pass a UTF-8 text file")
    if path.suffix.lower() in (".json", ".jsonl"):  # its JSON syntax would be ranked on as text
        raise InvalidInputError(
            f"The '{role}' file {path} is JSON; calibration reads plain text as written. Write the records' text "
            "to a .txt file (heal's --data reads the records themselves)"
        )
    text = read_utf8(path, f"The '{role}' file")
    if not text.strip():
        raise InvalidInputError(f"The '{role}' file {path} is empty; pass a text with at least a few hundred tokens.")
    return text


def calibration_sha256(path: str | os.PathLike) -> str:
    """sha256 of a calibration file's text as read (a byte-order mark left out, CRLF as LF: a file with neither has
    its bytes' digest): what the measured table's cache key holds."""
    return hashlib.sha256(read_calibration_text(path).encode("utf-8")).hexdigest()


def _ranked(scores) -> tuple[int, ...]:
    """Indices by decreasing score; ties keep the lower index first (stable)."""
    torch = require("torch", "hf")
    return tuple(
        torch.sort(torch.as_tensor(scores, dtype=torch.float64), descending=True, stable=True).indices.tolist()
    )


def magnitude_orders(base: BaseModel) -> list[LayerOrder]:
    """Data-free: rank by products of weight norms (see the module docstring), streamed layer by layer."""
    from nsc_prune.hf.weights.safetensors_io import TensorReader

    reader = TensorReader()
    dim, group = base.head_dim, base.group_size
    orders = []
    try:
        for i in range(base.num_layers):

            def weight(module: str, i: int = i):
                info, rows = base.part(i, module)
                return reader.read(info)[rows].float()

            ffn = (
                weight("mlp.gate_proj").norm(dim=1)
                * weight("mlp.up_proj").norm(dim=1)
                * weight("mlp.down_proj").norm(dim=0)
            )
            kv = base.kv_heads[i]
            v = weight("self_attn.v_proj").reshape(kv, dim, -1).flatten(1).norm(dim=1)
            o = weight("self_attn.o_proj").reshape(-1, kv, group * dim).permute(1, 0, 2).flatten(1).norm(dim=1)
            orders.append(LayerOrder(_ranked(ffn), _ranked(v * o)))
    finally:
        reader.close()
    return orders


def record_hooks(layer: Any, sums: list[Any]) -> list[Any]:
    """Forward pre-hooks adding |down_proj input| per channel into ``sums[0]`` and |o_proj input| per
    query head into ``sums[1]`` (float64)."""
    heads = layer.self_attn.o_proj.in_features // layer.self_attn.head_dim

    def hook(slot: int, groups: int | None):
        def record(module, args):
            x = args[0].detach().abs().flatten(0, -2).double().sum(0)  # (features,)
            if groups is not None:
                x = x.reshape(groups, -1).sum(1)
            sums[slot] = x if sums[slot] is None else sums[slot] + x

        return record

    return [
        layer.mlp.down_proj.register_forward_pre_hook(hook(0, None)),
        layer.self_attn.o_proj.register_forward_pre_hook(hook(1, heads)),
    ]


def activation_scores(
    base: BaseModel, input_ids: Any, seq_len: int, compute: Compute | None = None
) -> list[tuple[Any, Any]]:
    """Per layer (mean |down_proj input| per FFN channel, mean |o_proj input| per query head) over the
    tokens of ``input_ids`` (1-D), run in chunks of ``seq_len`` tokens on ``compute`` (default float32 on the CPU;
    the sums in float64), streamed layer by layer (``stream_layers``)."""
    scores = []

    def visit(i: int, layer: Any, inputs: list[Any], run: Callable[[Any], Any]) -> list[Any]:
        if i == 0 and not all(map(all_finite, inputs)):
            raise ConfigError(
                f"{base.folder}: the token embeddings hold NaN or inf values; no activation can be scored"
            )
        sums = [None, None]
        outputs = run_hooked(record_hooks(layer, sums), run, inputs)
        if not all(map(all_finite, [*sums, *outputs])):  # NaN scores would sort as the first channels
            _refuse_non_finite(base, i, layer, compute)
        scores.append(mean_scores(sums, len(input_ids), layer))
        return outputs

    from nsc_prune.hf.weights.streaming import stream_layers

    stream_layers(base, input_ids, seq_len, visit, bar="calibration", compute=compute)
    return scores


def _refuse_non_finite(base: BaseModel, i: int, layer: Any, compute: Compute | None) -> None:
    """ConfigError for layer ``i`` whose activations are not finite: naming its weight that holds NaN or inf, else
    the compute dtype that overflowed (the measured search's check says the same: ``probes._check_finite``)."""
    from nsc_prune.hf.weights.loading import non_finite_parameter

    if (spoilt := non_finite_parameter(layer)) is not None:
        raise ConfigError(
            f"{base.folder}: model.layers.{i}.{spoilt} holds NaN or inf values; no activation can be scored"
        )
    dtype = (compute or Compute()).dtype
    raise ConfigError(
        f"the model's activations on the calibration text are not finite (NaN or inf) in {dtype} at layer {i}: "
        "check the weights for NaN or inf values"
        + ("" if dtype == "float32" else ", or calibrate in float32 (--calib-dtype float32)")
    )


def run_hooked(handles: list[Any], run: Callable[[Any], Any], inputs: list[Any]) -> list[Any]:
    """``run`` on every chunk of ``inputs`` while the hooks ``handles`` are registered; they are removed after, also
    on error."""
    try:
        return [run(h) for h in inputs]
    finally:
        for handle in handles:
            handle.remove()


def mean_scores(sums: list[Any], tokens: int, layer: Any) -> tuple[Any, Any]:
    """The hooks' sums (``record_hooks``) as means per token (and per head dimension for the heads)."""
    return (sums[0] / tokens).cpu(), (sums[1] / (tokens * layer.self_attn.head_dim)).cpu()


def orders_from_scores(scores: list[tuple[Any, Any]], group_size: int) -> list[LayerOrder]:
    """Channel orders from ``activation_scores``: FFN channels by score, KV groups by their query heads' sum."""
    return [LayerOrder(_ranked(ffn), _ranked(head.reshape(-1, group_size).sum(1))) for ffn, head in scores]


def calibration_seq_len(base: BaseModel, seq_len: int) -> int:
    """``seq_len`` capped at the model's context (``max_position_embeddings``, 2048 when absent)."""
    return min(seq_len, int(base.config.get("max_position_embeddings") or 2048))


def tokenizer_folder(
    base: BaseModel, config: SelectionConfig, job: str = "activation selection", flag: str = "--base"
) -> Path:
    """Where the calibration tokenizer comes from: ``config.tokenizer``, else the base folder. ``job`` and ``flag``
    (the option that gave the base) name the command in the refusal of a folder without one; ``--tokenizer`` is
    suggested only beside ``--base`` (extract's: the search reads ``--weights`` and has no ``--tokenizer``)."""
    folder = Path(config.tokenizer) if config.tokenizer is not None else base.folder
    if not has_tokenizer(folder):
        raise InvalidInputError(
            f"{job} tokenizes --calib with the model's tokenizer, but the "
            f"{'--tokenizer' if config.tokenizer is not None else flag} folder {folder} has no tokenizer files (one "
            f"of {', '.join(TOKENIZER_CORE_FILES)}); copy the original model's tokenizer files into it"
            + (", or pass --tokenizer DIR (a folder holding them)" if flag == "--base" else "")
        )
    return folder


CHARS_PER_TOKEN = 8  # the first prefix tokenized: about twice the characters a token of English text takes
PREFIX_SLACK_TOKENS = 64


TOKENIZER_FIX = "pass --tokenizer DIR with working tokenizer files"


def calibration_ids(folder: str | os.PathLike, text: str, tokens: int) -> Any:
    """The first ``tokens`` token ids of ``text`` with the tokenizer in ``folder`` (1-D tensor)."""
    from nsc_prune.hf.weights.loading import load_tokenizer

    return _text_ids(load_tokenizer(folder, TOKENIZER_FIX), text, tokens)


def calibration_bos(folder: str | os.PathLike, window: int) -> int | None:
    """The BOS id that leads each calibration chunk of ``window`` tokens (``calibration_tokens``), or None."""
    from nsc_prune.hf.weights.loading import load_tokenizer

    return _chunk_bos(load_tokenizer(folder, TOKENIZER_FIX), window)


def _chunk_bos(tokenizer: Any, window: int) -> int | None:
    from nsc_prune.hf.weights.loading import bos_token_added

    return bos_token_added(tokenizer) if window >= 2 else None


def _bos_led(text_ids: Any, bos: int, window: int) -> Any:
    """``text_ids`` in chunks of ``window`` tokens, each BOS and the next ``window - 1`` ids (1-D tensor)."""
    torch = require("torch", "hf")
    lead = torch.tensor([bos], dtype=text_ids.dtype)
    return torch.cat([torch.cat([lead, chunk]) for chunk in text_ids.split(window - 1)])


def _text_ids(tokenizer: Any, text: str, tokens: int) -> Any:
    # A prefix, grown until it holds more tokens than asked: the whole file (a training corpus, say) took about 150
    # bytes of memory a character. A cut changes the merges of its last few words only, past the tokens kept.
    chars = CHARS_PER_TOKEN * tokens
    while True:
        ids = tokenizer(text[:chars], return_tensors="pt", add_special_tokens=False)["input_ids"][0]
        if chars >= len(text) or len(ids) >= tokens + PREFIX_SLACK_TOKENS:
            break
        chars *= 2
    ids = ids[:tokens]
    if len(ids) == 0:
        raise InvalidInputError("the calibration text has no tokens; pass a longer UTF-8 text file")
    return ids


def activation_orders_from_ids(
    base: BaseModel, ids: Any, seq_len: int, compute: Compute | None = None
) -> list[LayerOrder]:
    """Calibration orders (module docstring) over the token ids ``ids`` (1-D), in chunks of ``seq_len``."""
    scores = activation_scores(base, ids, calibration_seq_len(base, seq_len), compute)
    return orders_from_scores(scores, base.group_size)


def calibration_tokens(base: BaseModel, config: SelectionConfig) -> tuple[Any, dict[str, Any]]:
    """The calibration token ids of ``config.calib`` (1-D, at most ``config.calib_tokens``) and what was used: file,
    sha256, tokens. Where the tokenizer starts a text with BOS (LLaMA's, Gemma's), each chunk of the capped
    ``config.seq_len`` is BOS and the text's next tokens, as every forward pass of a served prompt starts: without
    it the model's first position (its attention sink) held a text token it never holds when served. InvalidInputError
    for a text of fewer than MIN_CALIB_TOKENS tokens."""
    from nsc_prune.hf.weights.loading import load_tokenizer, warn_if_mostly_unknown

    text = read_calibration_text(config.calib)
    folder = tokenizer_folder(base, config)
    tokenizer = load_tokenizer(folder, TOKENIZER_FIX)
    window = calibration_seq_len(base, config.seq_len)
    bos = _chunk_bos(tokenizer, window)
    wanted = config.calib_tokens - (math.ceil(config.calib_tokens / window) if bos is not None else 0)
    ids = _text_ids(tokenizer, text, wanted + 1)
    ids = ids[1:] if bos is not None and int(ids[0]) == bos else ids  # a text that starts with the BOS string
    ids = ids[:wanted]
    vocab = decoder_dims(base.config).vocab_size
    top = max(int(ids.max()) if len(ids) else 0, bos or 0)
    if top >= vocab:  # another model's tokenizer: the embedding lookup would fail
        raise InvalidInputError(
            f"the tokenizer in {folder} gives token id {top}, but the base's vocabulary has {vocab} "
            "tokens: pass the base's own tokenizer (--tokenizer)"
        )
    if len(ids) < min(wanted, MIN_CALIB_TOKENS):
        raise InvalidInputError(
            f"The 'calib' file {config.calib} has only {len(ids)} tokens; calibration needs at least "
            f"{MIN_CALIB_TOKENS} (a few thousand rank channels better): pass a longer UTF-8 text file"
        )
    warn_if_mostly_unknown(tokenizer, [ids.tolist()], f"the calibration text {config.calib}")
    ids = _bos_led(ids, bos, window) if bos is not None else ids
    used = {
        "calib": str(Path(config.calib).resolve()),
        "calib_sha256": calibration_sha256(config.calib),  # of the text as read, as the measured table's key
        "calib_tokens": len(ids),
        **({"bos_each_window": True} if bos is not None else {}),  # records without it read as before
    }
    if config.tokenizer is not None:
        used["tokenizer"] = str(Path(config.tokenizer).resolve())
    return ids, used


def activation_orders(base: BaseModel, config: SelectionConfig) -> tuple[list[LayerOrder], dict[str, Any]]:
    """Calibration orders (module docstring) and what was used: tokens, file hash."""
    config.compute.check()  # before tokenising: a device this machine lacks is one line, not a late failure
    ids, used = calibration_tokens(base, config)
    return activation_orders_from_ids(base, ids, config.seq_len, config.compute), used


def channel_orders(base: BaseModel, config: SelectionConfig) -> tuple[list[LayerOrder], dict[str, Any]]:
    """One ``LayerOrder`` per layer of ``base`` for ``config.method``, and the record for provenance."""
    record: dict[str, Any] = {"method": config.method}
    if config.method == "first":
        return identity_orders(base.widths, base.kv_heads), record
    if config.method == "magnitude":
        return magnitude_orders(base), record
    orders, used = activation_orders(base, config)
    return orders, record | used | {
        "seq_len": calibration_seq_len(base, config.seq_len),
        "compute": config.compute.record(),
    }


# ---------------------------------------------------------------------------------------------- stored orders


CHANNEL_ORDER_FORMAT = 1


def channel_order_document(orders: list[LayerOrder], base: BaseModel, record: dict[str, Any]) -> dict[str, Any]:
    """The JSON a super-adapter stores as ``CHANNEL_ORDER_NAME``: per layer the FFN and KV-group orders."""
    return {
        "format": CHANNEL_ORDER_FORMAT,
        "selection": record,
        "base_shape": {"widths": list(base.widths), "kv_heads": list(base.kv_heads)},
        "layers": [{"ffn": list(order.ffn), "kv_groups": list(order.kv_groups)} for order in orders],
    }


def adapter_channel_orders(
    folder: str | os.PathLike, base: BaseModel
) -> tuple[list[LayerOrder], dict[str, Any]] | None:
    """The channel orders an adapter folder carries (``CHANNEL_ORDER_NAME``, written by ``nsc-prune train-supernet``)
    and the selection record for provenance; None when it carries none. ConfigError when they do not fit ``base``."""
    from nsc_prune._files import CHANNEL_ORDER_NAME
    from nsc_prune._io import read_json_object, sha256_file

    path = Path(folder) / CHANNEL_ORDER_NAME
    if not path.is_file():
        return None
    data = read_json_object(path, unique_keys=True)
    if data.get("format") != CHANNEL_ORDER_FORMAT:
        raise ConfigError(
            must_be(f"{path} 'format'", f"{CHANNEL_ORDER_FORMAT}, the one this nsc-prune reads", data.get("format"),
                    "A newer nsc-prune wrote it, or it was edited")
        )  # fmt: skip
    layers = data.get("layers")
    if not isinstance(layers, list) or len(layers) != base.num_layers:
        got = len(layers) if isinstance(layers, list) else layers
        raise ConfigError(
            must_be(
                f"{path} 'layers'",
                f"a list of {base.num_layers} layers (the base's)",
                got,
                "Was the adapter trained on another base model?",
            )
        )
    orders = []
    for i, (layer, width, kv) in enumerate(zip(layers, base.widths, base.kv_heads, strict=True)):
        ffn, groups = (layer.get("ffn"), layer.get("kv_groups")) if isinstance(layer, dict) else (None, None)
        for name, order, size in (("ffn", ffn, width), ("kv_groups", groups, kv)):
            whole = isinstance(order, list) and all(is_int(index) for index in order)  # sorted() of "a", 1 raises
            if not whole or sorted(order) != list(range(size)):
                raise ConfigError(
                    must_be(
                        f"{path} layer {i} {name!r}",
                        f"a permutation of 0..{size - 1} (the base's)",
                        order if not isinstance(order, list) else f"{len(order)} entries",
                        "Was the adapter trained on another base model?",
                    )
                )
        orders.append(LayerOrder(tuple(ffn), tuple(groups)))
    record = {
        "method": "adapter",
        "order": str(path.resolve()),
        "order_sha256": sha256_file(path),
        "trained_with": data.get("selection"),
    }
    return orders, record
