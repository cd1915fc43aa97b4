"""The tokenizer fingerprint in the keys of the sensitivity table and the teacher-logits cache."""

from __future__ import annotations

import hashlib

from nsc_prune.hf.weights.fingerprint import tokenizer_fingerprint


def _folder(path, **files: str):
    path.mkdir()
    for name, text in files.items():
        (path / name.replace("__", ".")).write_text(text)
    return path


def test_a_tokenizer_without_tokenizer_json_is_told_apart_by_its_vocabulary(tmp_path):
    """vocab.json and merges.txt hold a slow tokenizer's tokens: two such folders with one config had one
    fingerprint, and a table measured with one was read back for the other."""
    config = '{"tokenizer_class": "GPT2Tokenizer"}'
    one = _folder(tmp_path / "one", tokenizer_config__json=config, vocab__json='{"a": 0}', merges__txt="#\na b")
    other = _folder(tmp_path / "other", tokenizer_config__json=config, vocab__json='{"b": 0}', merges__txt="#\na b")
    added = _folder(tmp_path / "added", tokenizer_config__json=config, vocab__json='{"a": 0}', merges__txt="#\na b",
                    added_tokens__json='{"<x>": 1}')  # fmt: skip
    assert len({tokenizer_fingerprint(one), tokenizer_fingerprint(other), tokenizer_fingerprint(added)}) == 3


def test_beside_a_tokenizer_json_the_fingerprint_is_the_one_caches_already_hold(tmp_path):
    """The copies of the vocabulary beside tokenizer.json are left out, so no cached table is measured again."""
    files = {"tokenizer__json": '{"model": {}}', "tokenizer_config__json": "{}", "special_tokens_map__json": "{}"}
    fast = _folder(tmp_path / "fast", **files)
    with_copies = _folder(tmp_path / "copies", **files, vocab__json='{"a": 0}', merges__txt="#\na b")
    digest = hashlib.sha256()  # the fingerprint as it was made before
    for name in sorted(("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "tokenizer_config.json",
                        "special_tokens_map.json")):  # fmt: skip
        if (fast / name).is_file():
            digest.update(name.encode() + (fast / name).read_bytes())
    assert tokenizer_fingerprint(fast) == tokenizer_fingerprint(with_copies) == digest.hexdigest()
