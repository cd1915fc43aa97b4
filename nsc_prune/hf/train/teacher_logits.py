"""Cached teacher logits: the teacher's top-k next-token log-probabilities for every training position, computed
once and reused by every distillation run on the same teacher, text and tokenizer (``heal --teacher-logits``).

A distillation step spends a share of its time on the teacher's forward pass (a third of a LoRA step on
SmolLM2-135M). Healing every point of a front from one base, or trying recipes on one text, repeats that forward
for the same tokens; a cache pays it once. What is stored per position: the indices and float16 log-probabilities
(at temperature 1, over the whole vocabulary) of the teacher's ``top_k`` most likely tokens. At training time the
targets are those ``k`` probabilities and the rest of the teacher's mass as one bucket ("any other token",
``losses.distill_from_top_k``): renormalising the top k instead teaches the student to put no mass outside them,
and recovered markedly less per step (docs/recovery.md). The bucket's mass is known only at temperature 1, so
cached logits train at temperature 1. Disk and memory: ``6 k`` bytes a training token (384 at k = 64).

The file is a safetensors file (``indices`` int32 and ``logprobs`` float16, [blocks, seq_len - 1, k]) whose
metadata holds ``key``: the teacher's weights fingerprint, the student tokenizer's fingerprint, the packed blocks'
fingerprint (text, tokenizer, sequence length, split), ``top_k`` and the vocabulary size. A file whose key differs
from the run's is refused in one line that names what differs; it is written atomically, so it is never partial.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._io import atomic_file, parse_json, provenance, safetensors_write_error
from nsc_prune._validation import is_int, is_number, must_be
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.progress import progress as progress_bar
from nsc_prune.hf.ranks import Ranks
from nsc_prune.hf.train.data import EARLIER_READER, TextBlocks
from nsc_prune.hf.train.losses import TopKTeacher, top_k_teacher
from nsc_prune.hf.train.recipe import TrainConfig
from nsc_prune.hf.weights.fingerprint import older_fingerprint_note, tokenizer_fingerprint, weights_fingerprint

torch = require("torch", "hf")

CACHE_FORMAT = 1
DEFAULT_TOP_K = 64
METADATA_KEY = "nsc_prune_teacher_logits"
_SHARED_BLOCKS = 256  # training blocks summed over ranks at a time
_KEY_NAMES = {
    "format": "file format",
    "teacher": "teacher weights",
    "tokenizer": "tokenizer",
    "blocks": "training text (the packed blocks: text, tokenizer, --seq-len, split)",
    "top_k": "top_k",
}


def logits_key(teacher: Path, tokenizer: Path, blocks: TextBlocks, top_k: int) -> dict[str, Any]:
    """What cached logits depend on: equal keys mean the same targets (the vocabulary size is checked apart)."""
    if not is_int(top_k) or top_k < 1:
        raise ConfigError(must_be("--teacher-top-k", "an integer >= 1", top_k))
    return {
        "format": CACHE_FORMAT,
        "teacher": weights_fingerprint(teacher),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "blocks": blocks.fingerprint(),
        "top_k": int(top_k),
    }


@dataclass(frozen=True)
class TeacherLogits:
    """The teacher's top-k log-probabilities of every training block: ``indices`` (int32) and ``logprobs``
    (float16), both [blocks, seq_len - 1, k]; ``key`` as ``logits_key``; ``vocab_size``; ``record`` (provenance,
    the teacher's held-out loss, the probability mass the top k cover)."""

    indices: torch.Tensor
    logprobs: torch.Tensor
    key: dict[str, Any]
    vocab_size: int
    record: dict[str, Any]

    def side(self, rows: torch.Tensor, temperature: float, device: torch.device) -> TopKTeacher:
        """The distillation targets of training blocks ``rows``: their top k and the rest of the teacher's mass
        as one bucket (``losses.distill_from_top_k``)."""
        check_temperature(temperature)
        rows = rows.cpu().long()
        return top_k_teacher(self.indices[rows].to(device), self.logprobs[rows].to(device))


def check_temperature(temperature: float) -> None:
    """Cached logits are temperature-1 probabilities: the tail's mass at another temperature is not known."""
    if temperature != 1:
        raise ConfigError(
            must_be(
                "--temperature with --teacher-logits",
                "1 (the cache holds temperature-1 probabilities; distil from the live teacher at another)",
                temperature,
            )
        )


def compute_teacher_logits(
    teacher: Any, blocks: TextBlocks, key: dict[str, Any], config: TrainConfig, ranks: Ranks = Ranks()
) -> TeacherLogits:
    """Run ``teacher`` once over ``blocks.train`` (``torch.inference_mode``, in the recipe's precision, batches of
    ``config.batch_size``) and keep each position's ``key["top_k"]`` largest log-probabilities; also the teacher's
    held-out loss. ``ranks`` (a launcher's processes): each computes every ``ranks.count``-th batch (of the training
    blocks, then of the held-out ones) and every rank gets the whole cache and the loss."""
    from nsc_prune.hf.train.precision import precision_name, training_autocast
    from nsc_prune.hf.train.trainer import forward_logits, untrained_loss

    device = next(iter(teacher.parameters())).device
    train = blocks.train
    k = key["top_k"]
    vocab = int(teacher.get_output_embeddings().weight.shape[0])
    if k > vocab:
        raise ConfigError(must_be("--teacher-top-k", f"at most the vocabulary size ({vocab})", k))
    # zeros where another rank computes: the sum over ranks below is then each row exactly as its rank computed it
    indices = torch.zeros((*train[:, :-1].shape, k), dtype=torch.int32)
    logprobs = torch.zeros((*train[:, :-1].shape, k), dtype=torch.float16)
    covered = 0.0
    teacher.eval()
    starts = range(0, train.shape[0], config.batch_size)
    for batch in progress_bar(ranks.mine(len(starts)), "teacher logits", "batch"):
        start = starts[batch]
        ids = train[start : start + config.batch_size].to(device)
        with torch.inference_mode(), training_autocast(config, device):
            logits = forward_logits(teacher, ids)[:, :-1].float()
        top, where = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
        indices[start : start + ids.shape[0]] = where.to("cpu", torch.int32)
        logprobs[start : start + ids.shape[0]] = top.to("cpu", torch.float16)
        covered += float(top.exp().sum())
    for start in range(0, train.shape[0], _SHARED_BLOCKS):  # in slices: NCCL reduces a copy on the GPU
        ranks.sum(indices[start : start + _SHARED_BLOCKS])
        ranks.sum(logprobs[start : start + _SHARED_BLOCKS])
    (covered,) = ranks.sum_floats([covered])
    if not math.isfinite(covered):  # one NaN log-probability makes the sum NaN; a cache of them would train on NaN
        raise InvalidInputError(
            "the teacher's log-probabilities on the training text are NaN or inf: its weights are finite but its "
            "outputs overflow float32; check its weights (a value near the float range's edge)"
        )
    positions = max(int(train[:, :-1].numel()), 1)
    val_loss = untrained_loss(teacher, blocks.val, config.batch_size, "the teacher", ranks) if len(blocks.val) else None
    record = {
        "top_k_mass": round(covered / positions, 6),
        "precision": precision_name(config),  # not in the key: a float32 run may read bf16 targets, and says so
        "val_loss_teacher": val_loss,
        "provenance": provenance(),
    }
    return TeacherLogits(indices, logprobs, key, vocab, record)


def save_teacher_logits(
    logits: TeacherLogits, path: str | os.PathLike, overwrite: bool = True, checked: bool = False
) -> Path:
    """Write ``logits`` to ``path`` atomically (safetensors; key and record in its metadata; ``overwrite`` and
    ``checked`` as ``publish_text``)."""
    save_file = require("safetensors.torch", "hf").save_file
    record = {"key": logits.key, "vocab_size": logits.vocab_size, **logits.record}
    metadata = {METADATA_KEY: json.dumps(record, allow_nan=False)}  # a NaN is no JSON number: the reader refuses it
    with atomic_file(path, overwrite=overwrite, checked=checked) as tmp:
        try:
            save_file({"indices": logits.indices, "logprobs": logits.logprobs}, str(tmp), metadata=metadata)
        except Exception as err:  # a full disk: safetensors' own error, which names no file
            if not safetensors_write_error(err):
                raise
            raise InvalidInputError(f"could not write --teacher-logits {path} ({err}); nothing was written") from err
    return Path(path)


def stored_key(path: str | os.PathLike) -> dict[str, Any] | None:
    """The key a teacher-logits file was computed for (its metadata only), or None when it is not such a file."""
    safetensors = require("safetensors", "hf")
    try:
        with safetensors.safe_open(str(path), framework="pt") as handle:
            key = parse_json((handle.metadata() or {})[METADATA_KEY])["key"]
    except (OSError, ValueError, KeyError, TypeError, safetensors.SafetensorError):
        return None
    return key if isinstance(key, dict) else None


def load_teacher_logits(path: str | os.PathLike, key: dict[str, Any], blocks: TextBlocks) -> TeacherLogits:
    """Read cached logits and check them against the run's ``key``; InvalidInputError (one line, naming what
    differs) for another teacher, text, tokenizer or top_k, or a file that is not cached teacher logits."""
    safetensors = require("safetensors", "hf")
    path = Path(path)
    try:
        with safetensors.safe_open(str(path), framework="pt") as handle:
            stored = parse_json((handle.metadata() or {})[METADATA_KEY])
            indices, logprobs = handle.get_tensor("indices"), handle.get_tensor("logprobs")
        stored_key, vocab, teacher_loss = stored["key"], stored["vocab_size"], stored["val_loss_teacher"]
        if not isinstance(stored_key, dict) or not is_int(vocab) or vocab < 1 or not is_number(teacher_loss):
            raise ValueError("its key, vocab_size or val_loss_teacher is of another type")
    except (OSError, ValueError, KeyError, TypeError, safetensors.SafetensorError) as err:
        raise InvalidInputError(
            f"--teacher-logits {path} is not a teacher-logits file written by nsc-prune heal ({err!s:.80}); "
            "pass another path to compute them anew"
        ) from err
    differ = [name for name, label in _KEY_NAMES.items() if stored_key.get(name) != key[name]]
    if differ:
        what = ", ".join(_KEY_NAMES[name] for name in differ)
        older = older_fingerprint_note(stored_key.get("teacher")) if "teacher" in differ else ""
        older += f" (or by {EARLIER_READER})" if differ == ["blocks"] else ""  # the files are not in the key
        raise InvalidInputError(
            f"--teacher-logits {path} was computed for another {what}{older}; pass the teacher, data and settings it "
            "was computed with, or another path to compute them for this run"
        )
    shape = (*blocks.train[:, :-1].shape, key["top_k"])
    if tuple(indices.shape) != shape or tuple(logprobs.shape) != shape:
        raise InvalidInputError(
            must_be(f"--teacher-logits {path}'s tensors", f"shaped {list(shape)}", list(indices.shape))
        )
    # an edited or damaged file whose key still matches: out-of-range tokens, or NaN, failed deep in training
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= vocab):
        raise InvalidInputError(f"--teacher-logits {path} holds token ids outside the vocabulary of {vocab}; recompute")
    if bool(torch.isnan(logprobs).any()) or bool((logprobs > 0).any()):  # a log-probability is at most 0
        raise InvalidInputError(f"--teacher-logits {path} holds log-probabilities that are NaN or above 0; recompute")
    _check_distributions(path, indices, logprobs)
    record = {k: v for k, v in stored.items() if k not in ("key", "vocab_size")}
    return TeacherLogits(indices, logprobs, stored_key, vocab, record)


MASS_SLACK = 0.01  # float16 log-probabilities: the top k of a distribution sum to 1 within about 1e-3


def _check_distributions(path: Path, indices: Any, logprobs: Any) -> None:
    """Each position's top k must be part of one distribution: k distinct tokens, at least one possible, their
    probabilities summing to at most 1. An edited file broke these silently (the tail's mass was clamped to 0).
    Checked a slice of blocks at a time: over the whole file, the sort and the float copy doubled its memory."""
    torch = require("torch", "hf")
    if not indices.numel():
        return
    for start in range(0, indices.shape[0], _CHECKED_BLOCKS):
        mass = torch.logsumexp(logprobs[start : start + _CHECKED_BLOCKS].float(), dim=-1)
        if bool(torch.isneginf(mass).any()) or float(mass.max()) > math.log1p(MASS_SLACK):
            raise InvalidInputError(
                f"--teacher-logits {path} holds positions whose top-k probabilities sum to more than 1, or are all "
                "0; recompute"
            )
        ordered = indices[start : start + _CHECKED_BLOCKS].sort(dim=-1).values
        if bool((ordered[..., 1:] == ordered[..., :-1]).any()):
            raise InvalidInputError(f"--teacher-logits {path} names a token twice at one position; recompute")


_CHECKED_BLOCKS = 64
