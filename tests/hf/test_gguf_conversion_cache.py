"""The SmolLM2 conversion cache hands out only a whole conversion, of this nsc-prune."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from nsc_prune.hf.weights import gguf_import  # noqa: E402
from nsc_prune.hf.weights.synthetic import llama_config, write_random_base  # noqa: E402


@pytest.mark.parametrize("damage", ["no-marker", "config-not-json"])
def test_a_conversion_without_its_marker_or_config_is_converted_again(tmp_path, monkeypatch, damage):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))
    monkeypatch.setattr(gguf_import, "smollm2_gguf_path", lambda: fake)
    calls = []
    monkeypatch.setattr(gguf_import, "prepare_gguf_model", lambda *args, **kwargs: calls.append(kwargs))
    target = tmp_path / "cache" / f"smollm2-135m-instruct-{gguf_import.conversion_key(fake)}"
    write_random_base(target, llama_config(1, 16, 24, 2, 20), shard_bytes=1 << 30)
    if damage == "no-marker":  # an interrupted conversion of another nsc-prune, or a folder copied by hand
        gguf_import.smollm2_checkpoint(tmp_path / "cache")
    else:
        (target / gguf_import.COMPLETE_MARKER).write_text("{}")
        (target / "config.json").write_text("{not json")
        with pytest.warns(UserWarning, match="is damaged"):
            gguf_import.smollm2_checkpoint(tmp_path / "cache")
    assert calls == [{"dtype": "bfloat16", "overwrite": True}]


def test_the_conversion_key_changes_with_the_package_version(tmp_path, monkeypatch):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF")
    key = gguf_import.conversion_key(fake)
    monkeypatch.setattr(gguf_import, "__version__", "0.0.0-other")
    assert gguf_import.conversion_key(fake) != key
