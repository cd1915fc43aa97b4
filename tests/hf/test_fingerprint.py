"""The weights and tokenizer fingerprints in the keys of resumed runs and caches (sensitivity table, teacher logits)."""

from __future__ import annotations

import hashlib
import json

import pytest

from nsc_prune.hf.weights.fingerprint import SCHEME, older_fingerprint_note, tokenizer_fingerprint, weights_fingerprint


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


def test_two_extractions_that_differ_past_the_sampled_bytes_have_two_fingerprints(tmp_path):
    """Two padded extractions of one base hold the same shapes and differ in zeroed channels past the first 4 KiB of
    a tensor: one fingerprint, so heal --resume continued the other's run and caches were shared."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    folders = []
    for name, zeroed in (("a", 1500), ("b", 1200)):
        folder = tmp_path / name
        folder.mkdir()
        weight = torch.ones(2048, 4)
        weight[zeroed:] = 0  # past the first 4 KiB (256 rows of 4 float32)
        save_file({"w": weight}, folder / "model.safetensors")
        (folder / "config.json").write_text("{}")
        (folder / "nsc_prune_extract.json").write_text(json.dumps({"point": {"ffn": zeroed}}))
        folders.append(folder)
    assert weights_fingerprint(folders[0]) != weights_fingerprint(folders[1])
    for folder in folders:
        (folder / "nsc_prune_extract.json").unlink()
    assert weights_fingerprint(folders[0]) != weights_fingerprint(folders[1])  # the blocks spread over each tensor


def test_an_edit_past_a_tensors_first_bytes_changes_the_fingerprint(tmp_path):
    """Only the first 4 KiB of each tensor were read: weights scaled after them (a fine-tune of the later rows, new
    token embeddings) kept the fingerprint, and a cached sensitivity table of the old weights was reused."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from nsc_prune.hf.weights.fingerprint import SAMPLED_BLOCKS, _sampled_blocks

    assert _sampled_blocks(100, 4096) == [(0, 100)]
    blocks = _sampled_blocks(10**6, 4096)
    assert len(blocks) == SAMPLED_BLOCKS and blocks[0][0] == 0 and sum(blocks[-1]) == 10**6  # first and last bytes
    weight = torch.randn(1024, 64)
    fingerprints = []
    for name, rows in (("dense", slice(0, 0)), ("tail", slice(1000, 1024)), ("middle", slice(500, 600))):
        folder = tmp_path / name
        folder.mkdir()
        edited = weight.clone()
        edited[rows] *= 3
        save_file({"w": edited}, folder / "model.safetensors")
        (folder / "config.json").write_text("{}")
        fingerprints.append(weights_fingerprint(folder))
    assert len(set(fingerprints)) == 3


def test_a_kept_adapter_is_part_of_the_fingerprint(tmp_path):
    """Loading a folder attaches its ``adapter/``: another adapter there kept the fingerprint, and cached teacher
    logits (or a resumed heal) of the old one were read without a word. A folder without one keeps its own."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    folder = tmp_path / "m"
    folder.mkdir()
    save_file({"w": torch.randn(64, 64)}, folder / "model.safetensors")
    (folder / "config.json").write_text("{}")
    bare = weights_fingerprint(folder)
    (folder / "adapter").mkdir()
    fingerprints = {bare}
    for seed in (0, 1):
        lora = torch.randn(4096, 16, generator=torch.Generator().manual_seed(seed))
        save_file({"lora_A": lora}, folder / "adapter" / "adapter_model.safetensors")
        (folder / "adapter" / "adapter_config.json").write_text('{"r": 16}')
        fingerprints.add(weights_fingerprint(folder))
    (folder / "adapter" / "adapter_config.json").write_text('{"r": 16, "lora_alpha": 8}')
    fingerprints.add(weights_fingerprint(folder))
    assert len(fingerprints) == 4
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (folder / "adapter" / name).unlink()
    assert weights_fingerprint(folder) == bare


def test_a_mismatch_with_an_older_fingerprint_says_so(tmp_path):
    """Files made before the fingerprint read spread blocks (a bare sha256) were refused as "different weights"
    for the very same weights: the refusal now says that an older nsc-prune made them."""
    from nsc_prune.errors import ConfigError
    from nsc_prune.hf.score.sensitivity_cache import cached_table, write_table
    from nsc_prune.hf.weights.fingerprint import SCHEME, older_fingerprint_note
    from nsc_prune.plan import LayerPlan

    old, new = "ab" * 32, f"{SCHEME}:" + "ab" * 32
    assert older_fingerprint_note(new, None, [new, None]) == ""
    assert "older nsc-prune" in older_fingerprint_note(old) and "older nsc-prune" in older_fingerprint_note([None, old])
    cuts = [[LayerPlan(ffn=8)]]
    record = {"calib": "c.txt", "calib_tokens": 64, "selection": "first"}
    write_table(tmp_path / "t.json", {"weights": old}, cuts, [[0.0]], record)
    with pytest.raises(ConfigError, match=r"different weights\) \(it was made by an older nsc-prune"):
        cached_table(tmp_path / "t.json", {"weights": new}, cuts, explicit=True)
    write_table(tmp_path / "t.json", {"weights": f"{SCHEME}:" + "cd" * 32}, cuts, [[0.0]], record)
    with pytest.raises(ConfigError, match=r"different weights\); pass another"):  # other weights: no such note
        cached_table(tmp_path / "t.json", {"weights": new}, cuts, explicit=True)


def test_the_records_tell_apart_two_weights_of_one_shape_at_one_path(tmp_path, tiny_llama, monkeypatch):
    """The extraction record and pareto.json (psi_W) named the weights by path, config hash and shard sizes only:
    other weights of the same shapes at the same path gave records equal but for the time."""
    import shutil

    from nsc_prune.cli import main

    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    found = []
    for seed in (0, 1):
        shutil.copytree(tiny_llama(lora=False, seed=seed).base, "base", dirs_exist_ok=True)
        search = ["--model", "base", "--space", "ffn-grid", "--set", "ffn_step=16", "--budget", "80%", "--quiet"]
        assert main([*search, "--score", "psi_w", "--weights", "base", "--out", f"s{seed}", "--no-plot"]) == 0
        assert main(["extract", "--pareto", f"s{seed}", "--base", "base", "--selection", "magnitude", "--quiet",
                     "--out", f"e{seed}"]) == 0  # fmt: skip
        score = json.loads((tmp_path / f"s{seed}" / "pareto.json").read_text())["score"]
        record = json.loads((tmp_path / f"e{seed}" / "nsc_prune_extract.json").read_text())["provenance"]
        assert score["weights_fingerprint"] == record["base_weights"] == weights_fingerprint(tmp_path / "base")
        found.append(record["base_weights"])
    assert found[0] != found[1]


def test_the_fingerprint_reads_one_shard_at_a_time_and_keeps_its_value(tmp_path, monkeypatch):
    """It held every shard open at once: extract (whose reader holds them too) ran out of file handles at the end
    of a many-shard base, and left its hidden temporary. The value is the one caches and records already hold."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from nsc_prune.hf.weights import fingerprint

    folder = tmp_path / "sharded"
    folder.mkdir()
    names = {}
    for shard in range(3):  # tensor names interleave the shards, as a sorted walk reads them
        tensors = {f"t{i}": torch.arange(4096, dtype=torch.float32) * (i + 1) for i in range(shard, 9, 3)}
        save_file(tensors, folder / f"model-0000{shard + 1}-of-00003.safetensors")
        names.update(dict.fromkeys(tensors, f"model-0000{shard + 1}-of-00003.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": names}))
    (folder / "config.json").write_text("{}")
    real_open, live, most = open, [], []

    def counted(*args, **kwargs):
        handle = real_open(*args, **kwargs)
        live.append(handle)
        most.append(sum(not h.closed for h in live))
        return handle

    monkeypatch.setattr(fingerprint, "open", counted, raising=False)
    assert (
        fingerprint.weights_fingerprint(folder)
        == "blocks16:8e946d141e630a3af4755ccd1c36952eac9fc482d6517b53020cb066767fb144"
    )
    assert len(most) == 3 and max(most) == 1


def test_the_extraction_record_and_config_are_part_of_the_fingerprint(tmp_path):
    """Two padded extractions of one base may hold the same sampled bytes: the record (their plans) tells them
    apart; and config.json decides the model the same tensors make."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    save_file({"w": torch.ones(8, 4)}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text("{}")
    bare = weights_fingerprint(tmp_path)
    (tmp_path / "nsc_prune_extract.json").write_text(json.dumps({"point": {"ffn": 1}}))
    one = weights_fingerprint(tmp_path)
    (tmp_path / "nsc_prune_extract.json").write_text(json.dumps({"point": {"ffn": 2}}))
    assert len({bare, one, weights_fingerprint(tmp_path)}) == 3
    (tmp_path / "nsc_prune_extract.json").unlink()
    (tmp_path / "config.json").write_text('{"rms_norm_eps": 1e-5}')
    assert weights_fingerprint(tmp_path) != bare


def test_the_same_bytes_as_another_dtype_are_other_weights(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    found = []
    for dtype in (torch.float16, torch.bfloat16):
        folder = tmp_path / str(dtype)
        folder.mkdir()
        save_file({"w": torch.zeros(8, 4, dtype=dtype)}, folder / "model.safetensors")  # zeros: the same bytes
        (folder / "config.json").write_text("{}")
        found.append(weights_fingerprint(folder))
    assert found[0] != found[1]


def test_one_older_fingerprint_among_new_ones_is_noted():
    new, old = f"{SCHEME}:" + "ab" * 32, "ab" * 32
    assert "older nsc-prune" in older_fingerprint_note([new, old])
    assert "older nsc-prune" in older_fingerprint_note({"base": new, "teacher": old})
