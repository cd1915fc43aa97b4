"""The base's tokenizer as GGUF keys, for ``--format gguf`` (every architecture it writes).

``tokenizer.json`` is read as llama.cpp's converter reads it: byte-level BPE becomes the ``gpt2`` model (with the
pre-tokenizer llama.cpp knows by that structure), SentencePiece-style BPE with byte fallback the ``llama`` model;
padded with unused tokens to ``vocab_size``; special ids, add_bos/eos and the chat template from ``gguf.SpecialVocab``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._io import parse_json
from nsc_prune._validation import is_int, must_be
from nsc_prune._warn import warn
from nsc_prune.errors import InvalidInputError, require

gguf = require("gguf", "hf")

# Byte-level BPE pre-tokenizers llama.cpp knows, told apart by their structure (llama.cpp itself hashes a
# tokenization of a test text). Anything else gets "default" with a warning.
_LLAMA3_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"


@dataclass
class GgufVocab:
    """A tokenizer as GGUF keys: model (``gpt2`` / ``llama``), pre-tokenizer, tokens, types, scores, specials."""

    model: str
    pre: str | None
    tokens: list[str | bytes]
    types: list[int]
    scores: list[float] | None
    special: Any  # gguf.SpecialVocab: merges, special token ids, add_bos/eos, chat template; or None
    add_space_prefix: bool | None = None  # llama (SPM) vocabularies: whether text starts with "▁" (Gemma's does not)


def _bad_tokenizer(folder: Path, got: Any, why: str) -> InvalidInputError:
    return InvalidInputError(
        must_be(
            f"the base's tokenizer ({folder / 'tokenizer.json'}) for --format gguf",
            "a BPE tokenizer.json (byte-level, or with byte fallback)",
            got,
            why,
        )
    )


def _pre_tokenizer(tokenizer: Mapping[str, Any]) -> str:
    """llama.cpp's name for a byte-level BPE pre-tokenizer, from the structure of ``pre_tokenizer``."""
    pre = tokenizer.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [part.get("type") for part in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and str(parts[0].get("pattern", {}).get("Regex", "")).startswith(_LLAMA3_SPLIT):
        return "llama-bpe"
    warn(
        f"unknown byte-level BPE pre-tokenizer {kinds}: the GGUF says 'default', so llama.cpp may split text "
        "differently from transformers (the weights are unaffected)",
    )
    return "default"


def tokenizer_vocab(folder: Path, vocab_size: int) -> GgufVocab:
    """The base's tokenizer as GGUF tokens; InvalidInputError when llama.cpp could not use it.

    Byte-level BPE (GPT-2, LLaMA-3, SmolLM) is read from ``tokenizer.json`` the way llama.cpp's converter
    does (ids without a token become ``[PADi]``, unused); BPE with byte fallback (LLaMA-2, Mistral) goes
    through ``gguf.LlamaHfVocab``. Merges, special ids and the chat template come from ``gguf.SpecialVocab``.
    """
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise _bad_tokenizer(folder, "no tokenizer.json", "Add the original model's tokenizer.json to the base folder")
    try:
        tokenizer = parse_json(path.read_text(encoding="utf-8"), unique_keys=False, constants=True)
        model = tokenizer["model"]
        kind, byte_fallback = model.get("type"), bool(model.get("byte_fallback"))
        decoder = (tokenizer.get("decoder") or {}).get("type")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise _bad_tokenizer(folder, f"an unreadable file ({err})", "Re-download it") from err
    if kind != "BPE":
        raise _bad_tokenizer(folder, f"a {kind} model", "llama.cpp needs BPE or SentencePiece; use --format pruned")
    if byte_fallback:
        return _spm_vocab(folder, vocab_size)
    if decoder != "ByteLevel":
        raise _bad_tokenizer(folder, f"a BPE model with a {decoder} decoder", "Use --format pruned")
    try:
        added = {item["id"]: item for item in tokenizer.get("added_tokens") or []}
        reverse = {i: text for text, i in model["vocab"].items()} | {i: item["content"] for i, item in added.items()}
    except (KeyError, TypeError, AttributeError) as err:
        raise _bad_tokenizer(
            folder, f"an unreadable vocabulary ({type(err).__name__}: {err})", "Re-download it"
        ) from err
    if not reverse or not all(is_int(i) and i >= 0 and isinstance(text, str) for i, text in reverse.items()):
        raise _bad_tokenizer(folder, "a vocabulary that is not token -> id >= 0", "Re-download it")
    if max(reverse) >= vocab_size:
        raise _bad_tokenizer(
            folder, f"token id {max(reverse)}", f"The model has only vocab_size={vocab_size} embeddings"
        )
    tokens: list[str | bytes] = []
    types: list[int] = []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    special = _special_vocab(folder, vocab_size, load_merges=True)
    if not special.merges:
        raise _bad_tokenizer(folder, "a BPE model without merges", "Re-download tokenizer.json")
    return GgufVocab("gpt2", _pre_tokenizer(tokenizer), tokens, types, None, special)


def _special_vocab(folder: Path, vocab_size: int, load_merges: bool) -> Any:
    """``gguf.SpecialVocab``, with ``add_bos``/``add_eos`` always set: when neither tokenizer_config.json nor the
    post-processor template says, they are what the tokenizer does when encoding (llama.cpp's own default
    for a missing key may differ, e.g. a BOS that transformers never adds)."""
    special = gguf.SpecialVocab(folder, load_merges=load_merges, n_vocab=vocab_size)
    if "bos" not in special.add_special_token or "eos" not in special.add_special_token:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        plain = backend.encode("a", add_special_tokens=False).ids
        full = backend.encode("a", add_special_tokens=True).ids
        special.add_special_token.setdefault("bos", len(full) > len(plain) and full[0] != plain[0])
        special.add_special_token.setdefault("eos", len(full) > len(plain) and full[-1] != plain[-1])
    return special


def _spm_vocab(folder: Path, vocab_size: int) -> GgufVocab:
    try:
        vocab = gguf.LlamaHfVocab(folder)
    except (FileNotFoundError, TypeError, ValueError, OSError) as err:
        raise _bad_tokenizer(folder, f"a byte-fallback BPE gguf cannot read ({err})", "Use --format pruned") from err
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(kind)
    if len(tokens) > vocab_size:
        raise _bad_tokenizer(folder, f"{len(tokens)} tokens", f"The model has only vocab_size={vocab_size} embeddings")
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    special = _special_vocab(folder, vocab_size, load_merges=False)
    return GgufVocab("llama", "default", tokens, types, scores, special, _adds_space_prefix(folder))


def _adds_space_prefix(folder: Path) -> bool:
    """Whether the tokenizer puts "▁" before a text's first word, as LLaMA-2's does and Gemma's does not: llama.cpp's
    SPM tokenizer adds it unless told otherwise (``tokenizer.ggml.add_space_prefix``)."""
    from tokenizers import Tokenizer

    pieces = Tokenizer.from_file(str(folder / "tokenizer.json")).encode("a", add_special_tokens=False).tokens
    return bool(pieces) and pieces[0].startswith("▁")


def add_vocab(writer: Any, vocab: GgufVocab) -> None:
    """The tokenizer keys (``special``, when there is one: merges, special ids, chat template)."""
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    if vocab.special is not None:
        vocab.special.add_to_gguf(writer, quiet=True)
