"""Cheap fingerprints of a model folder's weights and tokenizer: what a cached result (a sensitivity table,
cached teacher logits) was computed from, checked before it is reused."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nsc_prune import _files

SAMPLED_BLOCKS = 16  # the blocks of a tensor's bytes a fingerprint reads, from its first byte to its last
SCHEME = "blocks16"  # begins every weights fingerprint; those of nsc-prune before it (first 4 KiB) were bare sha256


def weights_fingerprint(folder: Path, tensors: Mapping[str, Any] | None = None, sample_bytes: int = 4096) -> str:
    """sha256 of config.json, every tensor's name, dtype, shape and byte range, and ``sample_bytes`` of each tensor
    in ``SAMPLED_BLOCKS`` blocks spread over it (its first and last bytes included): cheap on a 7B folder (no full
    read), and different for other or fine-tuned weights, also where an edit spares a tensor's first rows; with an
    extraction's record (``nsc_prune_extract.json``, its plan) when the folder has one, since two ``padded``
    extractions of one base differ only in the channels they zero; and with a kept adapter (``adapter/``: its config
    and sampled bytes of its weights file), which loading the folder attaches. ``tensors``: the folder's
    ``index_model_dir``, when the caller has it already. Returns ``SCHEME:hexdigest``."""
    folder = Path(folder)
    if tensors is None:
        from nsc_prune.hf.weights.safetensors_io import index_model_dir  # torch: not on the search's import path

        tensors = index_model_dir(folder)
    digest = hashlib.sha256((folder / _files.CONFIG_NAME).read_bytes())
    if (folder / _files.RECORD_NAME).is_file():
        digest.update((folder / _files.RECORD_NAME).read_bytes())
    by_file: dict[Path, list[str]] = {}
    for name, info in tensors.items():
        by_file.setdefault(info.file, []).append(name)
    samples: dict[str, bytes] = {}
    for file, names in by_file.items():  # one open file at a time, whatever the shards
        with open(file, "rb") as handle:
            for name in names:
                samples[name] = _samples(handle, tensors[name].start, tensors[name].nbytes, sample_bytes)
    for name in sorted(tensors):
        info = tensors[name]
        digest.update(f"{name}|{info.dtype}|{info.shape}|{info.file.name}|{info.start}|{info.end}".encode())
        digest.update(samples[name])
    _add_adapter(digest, folder / _files.ADAPTER_DIR, SAMPLED_BLOCKS * sample_bytes)
    return f"{SCHEME}:{digest.hexdigest()}"


def _add_adapter(digest: Any, adapter: Path, sample_bytes: int) -> None:
    """Add a kept adapter's config and ``sample_bytes`` of its weights file to ``digest`` (folders without one keep
    the fingerprint they had)."""
    if not (adapter / _files.ADAPTER_CONFIG_NAME).is_file():
        return
    digest.update(b"adapter|" + (adapter / _files.ADAPTER_CONFIG_NAME).read_bytes())
    weights = adapter / _files.ADAPTER_WEIGHTS_NAME
    if weights.is_file():
        size = weights.stat().st_size
        digest.update(f"|{size}|".encode())
        with open(weights, "rb") as handle:
            digest.update(_samples(handle, 0, size, sample_bytes))


def _samples(handle: Any, start: int, nbytes: int, sample_bytes: int) -> bytes:
    """``sample_bytes`` of the ``nbytes`` from ``start`` of the open file ``handle`` (``_sampled_blocks``)."""
    read = []
    for offset, length in _sampled_blocks(nbytes, sample_bytes):
        handle.seek(start + offset)
        read.append(handle.read(length))
    return b"".join(read)


def older_fingerprint_note(*stored: Any) -> str:
    """What to add to a message refusing stored inputs whose weights fingerprints (``stored``: strings, or lists
    and dicts of them) differ from this run's: that an older nsc-prune made them (no ``SCHEME``), whose fingerprints
    read other bytes, so even the same weights differ; "" when none is older."""

    def older(value: Any) -> bool:
        if isinstance(value, str):
            return not value.startswith(f"{SCHEME}:")
        values = value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else ()
        return any(older(v) for v in values)

    if not any(older(value) for value in stored if value is not None):
        return ""
    return " (it was made by an older nsc-prune, whose weights fingerprints read other bytes: even the same weights differ)"


def _sampled_blocks(nbytes: int, sample_bytes: int) -> list[tuple[int, int]]:
    """(offset, size) of the blocks read from a tensor of ``nbytes``: all of it when it is no larger than
    ``sample_bytes``, else ``SAMPLED_BLOCKS`` equal blocks evenly spread from its start to its end."""
    if nbytes <= sample_bytes:
        return [(0, nbytes)]
    size = max(1, sample_bytes // SAMPLED_BLOCKS)
    step = (nbytes - size) / (SAMPLED_BLOCKS - 1)
    return [(round(i * step), size) for i in range(SAMPLED_BLOCKS)]


def tokenizer_fingerprint(folder: Path) -> str:
    """sha256 of the tokenizer files a folder holds (names and bytes): those that decide its tokens. Without a
    ``tokenizer.json`` the tokens come from ``vocab.json``, ``merges.txt`` and ``added_tokens.json``, hashed then
    (beside a ``tokenizer.json`` they are copies, left out so that the fingerprints of such folders stay as they were).
    """
    digest = hashlib.sha256()
    # (tokenizer_config.json is hashed twice, as the fingerprints already in caches were made)
    names = sorted(_files.TOKENIZER_CORE_FILES + ("tokenizer_config.json", "special_tokens_map.json"))
    if not (Path(folder) / "tokenizer.json").is_file():
        names += ["vocab.json", "merges.txt", "added_tokens.json"]
    for name in names:
        if (Path(folder) / name).is_file():
            digest.update(name.encode() + (Path(folder) / name).read_bytes())
    return digest.hexdigest()
