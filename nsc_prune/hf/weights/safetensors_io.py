"""Streaming safetensors I/O: read one tensor at a time, write shards whose headers are planned first.

The safetensors Python API reads through mmap (every page touched stays in the process's RSS until
the file is closed) and writes a shard only from a dict of tensors held in memory. Extraction
instead reads each tensor with positioned reads into its own buffer and writes each output tensor
as soon as it is computed, so peak memory is a few tensors, not a shard. The format itself
(https://github.com/huggingface/safetensors#format) is small: an 8-byte little-endian header length,
a JSON header ``{name: {dtype, shape, data_offsets}}`` and the data. Files are read strictly: the
ranges must tile the data exactly and end at the end of the file, so a truncated shard is caught
before anything is written. Nothing here ever unpickles.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._files import PICKLE_SUFFIXES, SHARD_PATTERN, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from nsc_prune._io import parse_json
from nsc_prune._warn import warn
from nsc_prune.errors import ConfigError, InvalidInputError, require

torch = require("torch", "hf")

MAX_HEADER_BYTES = 100 << 20  # the limit of the reference implementation

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: ``file``, absolute byte range ``[start, end)``, dtype name and shape."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def check_float_weights(tensors: Mapping[str, TensorInfo], where: str, names: Iterable[str] | None = None) -> None:
    """ConfigError naming the first weight or bias of ``tensors`` (of ``names``, the model's own tensors, when given:
    GPT-2's stored attention masks, ``attn.bias``, are U8 and BOOL) stored in an integer or bool dtype: the codes of
    a quantized checkpoint (int8 weights without a ``quantization_config``), which every reader takes as values."""
    for name in tensors if names is None else [n for n in names if n in tensors]:
        if name.endswith((".weight", ".bias")) and not DTYPES[tensors[name].dtype].is_floating_point:
            raise ConfigError(
                f"{where}: tensor {name} is {tensors[name].dtype}, the integer codes of a quantized checkpoint, not weights; "
                "dequantize it to bfloat16, float16 or float32 first"
            )


def stored_dtype(tensors: Mapping[str, TensorInfo]) -> str:
    """The torch name (``bfloat16``) of the float dtype that holds most of ``tensors``' bytes: what config.json's
    ``dtype`` says of a checkpoint whose norms may be float32 beside bfloat16 matrices."""
    sizes: dict[str, int] = {}
    for info in tensors.values():
        if DTYPES[info.dtype].is_floating_point:
            sizes[info.dtype] = sizes.get(info.dtype, 0) + info.nbytes
    return str(DTYPES[max(sizes, key=sizes.__getitem__, default="F32")]).removeprefix("torch.")


def with_stored_dtype(config: Mapping[str, Any], tensors: Mapping[str, TensorInfo]) -> dict[str, Any]:
    """``config`` whose ``dtype`` is ``stored_dtype(tensors)``: as it was when it said so, else set (and the old
    ``torch_dtype`` key dropped), so that a loader's ``dtype="auto"`` reads the tensors as they are stored."""
    stored = stored_dtype(tensors)
    if (config.get("dtype") or config.get("torch_dtype")) == stored:
        return dict(config)
    return {**{k: v for k, v in config.items() if k != "torch_dtype"}, "dtype": stored}


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check a safetensors header; raise InvalidInputError for a truncated or malformed file."""
    if sys.byteorder != "little":  # pragma: no cover
        raise InvalidInputError("safetensors streaming needs a little-endian machine")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise InvalidInputError(f"{path} is truncated ({size} bytes): not a safetensors file; re-download it")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise InvalidInputError(f"{path} is truncated or not a safetensors file (header of {header_len} bytes)")
        raw = handle.read(header_len)
    try:
        header = parse_json(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise InvalidInputError(f"{path} has a malformed safetensors header: {err}") from err
    if not isinstance(header, dict):
        raise InvalidInputError(
            f"{path} has a malformed safetensors header: a JSON {type(header).__name__}, not an object"
        )
    header.pop("__metadata__", None)
    base = 8 + header_len
    infos, cursor = [], 0
    try:
        # by (begin, end), as safetensors does: an empty tensor may be listed after a tensor starting where it does
        entries = sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"]))
        for name, entry in entries:
            begin, end = (int(v) for v in entry["data_offsets"])
            shape = tuple(int(v) for v in entry["shape"])
            dtype = entry["dtype"]
            if dtype not in DTYPES:
                raise InvalidInputError(
                    f"{path}: tensor {name} has dtype {dtype}, not one of {sorted(DTYPES)}"
                    + ("; a float8 checkpoint: dequantize it to bfloat16 first" if str(dtype).startswith("F8") else "")
                )
            if min(shape, default=0) < 0:
                raise InvalidInputError(
                    f"{path}: tensor {name} has a negative dimension in its shape {list(shape)}; re-download it"
                )
            if begin != cursor or end - begin != math.prod(shape) * DTYPES[dtype].itemsize:
                raise InvalidInputError(f"{path}: tensor {name} has inconsistent data_offsets {[begin, end]}")
            infos.append(TensorInfo(name, path, dtype, shape, base + begin, base + end))
            cursor = end
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, InvalidInputError):
            raise
        raise InvalidInputError(f"{path} has a malformed safetensors header: {err!r}") from err
    if base + cursor != size:
        raise InvalidInputError(
            f"{path} is truncated or padded: header says {base + cursor} bytes, file has {size}; re-download it"
        )
    return {info.name: info for info in infos}


def refuse_pickles(folder: Path, what: str, expected: str = f"{WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}") -> None:
    """Raise for a ``folder`` without its safetensors weights (``expected`` names them): it holds pickle-based ones
    (we never unpickle; say how to convert) or none."""
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise InvalidInputError(
            f"{what} {folder} holds pickle weights ({', '.join(pickles[:3])}) and no safetensors; nsc-prune reads "
            "safetensors only. If you trust the file, convert it once with transformers/peft "
            "(from_pretrained(...).save_pretrained(out, safe_serialization=True)) and pass the new folder"
        )
    raise InvalidInputError(f"{what} {folder} holds no safetensors weights ({expected})")


def _shard_series(name: str) -> tuple[str, str] | None:
    """The prefix and the count of a shard named as ``save_pretrained`` names them (``model-00001-of-00003``)."""
    found = re.fullmatch(r"(.*)-\d+-of-(\d+)\.safetensors", name)
    return (found[1], found[2]) if found else None


def index_model_dir(folder: Path) -> dict[str, TensorInfo]:
    """Every tensor of an HF model folder (single file or sharded with an index), headers checked. A folder holding
    both reads the single file, as transformers' ``from_pretrained`` does (the index is then stale: a model saved
    again into its own folder)."""
    index_path = folder / WEIGHTS_INDEX_NAME
    if (folder / WEIGHTS_NAME).is_file():
        if index_path.is_file():
            warn(
                f"{folder} holds both {WEIGHTS_NAME} and {WEIGHTS_INDEX_NAME}; reading {WEIGHTS_NAME}, as transformers "
                f"does. Remove the one that is stale",
            )
        return read_header(folder / WEIGHTS_NAME)
    if index_path.is_file():
        try:
            weight_map = parse_json(index_path.read_text(encoding="utf-8"), unique_keys=False)["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            raise InvalidInputError(f"{index_path} is not a valid safetensors index: {err!r}") from err
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InvalidInputError(
                f"{index_path} is not a valid safetensors index: its weight_map is not name -> file"
            )
        files = sorted(set(weight_map.values()))
        outside = [name for name in files if not name or Path(name).is_absolute() or ".." in Path(name).parts]
        if outside:  # as transformers: a shard may sit in a subfolder, never above the folder
            raise InvalidInputError(
                f"{index_path} names the shard {outside[0]!r}, which is not a file of {folder}; re-download the "
                "checkpoint"
            )
        missing = [name for name in files if not (folder / name).is_file()]
        if missing:
            raise InvalidInputError(
                f"shard(s) {', '.join(missing)} listed in {index_path} are missing; re-download the checkpoint"
            )
        series = {_shard_series(name) for name in files} - {None}
        unnamed = sorted(
            p.name for p in folder.glob("*.safetensors") if p.name not in files and _shard_series(p.name) in series
        )
        if unnamed:  # transformers reads only the shards the index names: the unnamed one's tensors would be missing
            raise InvalidInputError(
                f"{folder} holds the shard {unnamed[0]}, which {WEIGHTS_INDEX_NAME} does not name though it names "
                f"others of the same series; the index is stale: re-save or re-download the checkpoint"
            )
        tensors: dict[str, TensorInfo] = {}
        for name in files:
            for tensor, info in read_header(folder / name).items():
                if tensor in tensors or weight_map.get(tensor, name) != name:  # which copy would be read is a guess
                    holders = [tensors[tensor].file.name, name] if tensor in tensors else [name]
                    raise InvalidInputError(
                        f"{index_path}: tensor {tensor} is in {' and '.join(holders)}, where the index names "
                        f"{weight_map.get(tensor, 'no shard')}; the checkpoint is inconsistent: re-save or re-download it"
                    )
                tensors[tensor] = info
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise InvalidInputError(f"{index_path} lists tensors no shard holds (e.g. {absent[0]}); the index is stale")
        return tensors
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    if shards:
        raise InvalidInputError(
            f"model folder {folder} has safetensors shards "
            f"({', '.join(shards[:3])}{', ...' if len(shards) > 3 else ''}) "
            f"but no {WEIGHTS_INDEX_NAME} saying which tensor is in which shard (nor a single {WEIGHTS_NAME}); "
            f"copy the index from where the shards came from, or re-save the model with save_pretrained"
        )
    refuse_pickles(folder, "model folder")
    raise AssertionError("unreachable")  # pragma: no cover


def meta_shapes(build: Callable[[], Any]) -> tuple[dict[str, tuple[int, ...]], list[list[str]]]:
    """Every parameter's shape in the model ``build()`` returns, built on the meta device (no memory,
    no weights read), and the groups of names that share one tensor (tied embeddings)."""
    with torch.device("meta"):
        model = build()
    shapes, groups = {}, {}
    for name, param in model.named_parameters(remove_duplicate=False):
        shapes[name] = tuple(param.shape)
        groups.setdefault(id(param), []).append(name)
    return shapes, list(groups.values())


def shape_problems(
    expected: dict[str, tuple[int, ...]], tied: list[list[str]], found: dict[str, tuple[int, ...]]
) -> dict[str, list[str]]:
    """The names of the tensors that stop ``found`` (name -> shape) from loading into a model of
    ``expected`` shapes: ``missing`` (a tied group needs one of its names), ``unexpected`` and
    ``mis-shaped``. Empty lists are left out."""
    problems = {
        "missing": [names[0] for names in tied if not any(name in found for name in names)],
        "unexpected": sorted(set(found) - set(expected)),
        "mis-shaped": sorted(
            name for name, shape in found.items() if name in expected and tuple(shape) != expected[name]
        ),
    }
    return {kind: names for kind, names in problems.items() if names}


class TensorReader:
    """Reads tensors (or a leading block of rows) with positioned reads; keep one per run, then close."""

    def __init__(self) -> None:
        self._files: dict[Path, io.FileIO] = {}

    def read(self, info: TensorInfo, rows: int | None = None) -> torch.Tensor:
        """The tensor, or only its first ``rows`` rows (a contiguous prefix, so only those bytes are read)."""
        shape = info.shape
        nbytes = info.nbytes
        if rows is not None and shape and rows < shape[0]:
            nbytes = nbytes // shape[0] * rows
            shape = (rows, *shape[1:])
        dtype = DTYPES[info.dtype]
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        handle = self._files.get(info.file)
        if handle is None:
            handle = self._files[info.file] = io.FileIO(info.file, "r")
        # Unbuffered reads straight into the tensor's own storage: no mmap, no second copy.
        buffer = bytearray(nbytes)
        view, done = memoryview(buffer), 0
        handle.seek(info.start)
        while done < nbytes:
            got = handle.readinto(view[done:])
            if not got:
                raise InvalidInputError(f"{info.file} ended early while reading {info.name}; re-download it")
            done += got
        return torch.frombuffer(buffer, dtype=dtype).reshape(shape)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()


@dataclass(frozen=True)
class TensorSpec:
    """An output tensor announced before its data exists: name, dtype name and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize


def plan_shards(specs: list[TensorSpec], max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Group specs, in order, into shards of at most ``max_shard_bytes`` (a larger tensor gets its own)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def write_safetensors(path: Path, specs: list[TensorSpec], tensors: Iterator[torch.Tensor]) -> None:
    """Write one safetensors file: the header from ``specs``, then each tensor from ``tensors`` as it comes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as the reference writer does
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for spec in specs:
            tensor = next(tensors)
            if DTYPE_NAMES.get(tensor.dtype) != spec.dtype or tuple(tensor.shape) != spec.shape:
                raise RuntimeError(
                    f"{spec.name}: announced {spec.dtype}{list(spec.shape)}, got {tensor.dtype}{list(tensor.shape)}"
                )
            if spec.nbytes:
                handle.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)
        handle.flush()
        os.fsync(handle.fileno())


def write_sharded(
    folder: Path, specs: list[TensorSpec], tensors: Iterable[torch.Tensor], max_shard_bytes: int
) -> dict[str, object]:
    """Write ``tensors`` (in ``specs`` order) as HF shards plus index into ``folder``; return the index."""
    stream = iter(tensors)
    shards = plan_shards(specs, max_shard_bytes)
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, start=1):
        name = SHARD_PATTERN.format(index=number, count=len(shards))
        write_safetensors(folder / name, shard, stream)
        weight_map.update({spec.name: name for spec in shard})
    if next(stream, None) is not None:
        raise RuntimeError("more tensors produced than announced")
    index = {
        "metadata": {"total_size": sum(spec.nbytes for spec in specs)},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (folder / WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return index
