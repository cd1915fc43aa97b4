"""scripts/token_gap.py on tiny random LLaMAs with a word-level tokenizer (one token a word; tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def token_gap():
    return load_script("token_gap")


@pytest.fixture
def setup(tiny_llama, tmp_path):
    """Three models of one shape and tokenizer, a training text where w3 never occurs, w4 occurs 5 times and w5
    20 times, and a held-out text of those words."""
    base, pruned, healed = (tiny_llama(lora=False, layers=2, seed=seed).base for seed in (0, 1, 2))
    train = tmp_path / "train.txt"
    train.write_text("\n\n".join(["w4 w5 w5 w5 w5"] * 5) + "\n")
    heldout = tmp_path / "served.txt"
    heldout.write_text(" ".join(["w3", "w4", "w5", "w5", "w4", "w3", "w5", "w4"] * 4) + "\n")
    return base, pruned, healed, train, heldout


def test_each_bucket_holds_its_tokens_and_their_share_of_the_gap(token_gap, setup, tmp_path):
    from nsc_prune.eval.perplexity import token_losses
    from nsc_prune.hf.cut.selection import calibration_ids
    from nsc_prune.hf.weights.loading import load_pruned

    base, pruned, healed, train, heldout = setup
    out = tmp_path / "gap.json"
    argv = [str(base), str(healed), "--pruned", str(pruned), "--data", str(train), "--heldout", str(heldout)]
    assert token_gap.main([*argv, "--seq-len", "8", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["training_tokens"] == 5 * 5 + 1  # five paragraphs of five words and one EOS, as heal reads them
    domain = result["domains"]["served"]
    rows = {row["occurrences"]: row for row in domain["buckets"]}
    assert {name: row["tokens"] for name, row in rows.items()} == {"0-0": 7, "1-9": 12, "10-99": 12}
    assert sum(row["tokens"] for row in rows.values()) == domain["tokens"] == 31
    assert sum(row["gap_share"] for row in rows.values()) == pytest.approx(1.0, abs=1e-3)

    ids = calibration_ids(base, heldout.read_text(), 4096)
    targets = ids[1:].tolist()
    losses = {name: token_losses(load_pruned(folder), ids, 8) for name, folder in
              (("base", base), ("pruned", pruned), ("healed", healed))}  # fmt: skip
    for bucket, word in (("0-0", 3), ("1-9", 4), ("10-99", 5)):
        at = [i for i, token in enumerate(targets) if token == word]
        for name, loss in losses.items():
            assert rows[bucket][name] == pytest.approx(float(loss[at].mean()), abs=1e-4)
        damage = float((losses["pruned"] - losses["base"])[at].sum())
        removed = float((losses["pruned"] - losses["healed"])[at].sum())
        assert rows[bucket]["recovered"] == pytest.approx(removed / damage, abs=1e-4)
    assert domain["mean_loss"]["healed"] == pytest.approx(float(losses["healed"].mean()), abs=1e-4)


def test_a_heal_that_changed_nothing_recovers_nothing_and_has_no_gap_to_share(token_gap, setup, tmp_path):
    base, pruned, _, train, heldout = setup
    out = tmp_path / "gap.json"
    argv = [str(base), str(pruned), "--pruned", str(pruned), "--data", str(train), "--heldout", str(heldout)]
    assert token_gap.main([*argv, "--out", str(out)]) == 0
    assert all(row["recovered"] == 0.0 for row in json.loads(out.read_text())["domains"]["served"]["buckets"])
    assert token_gap.main([str(base), str(base), "--data", str(train), "--heldout", str(heldout), "--out",
                           str(out), "--overwrite"]) == 0  # fmt: skip
    rows = json.loads(out.read_text())["domains"]["served"]["buckets"]
    assert all(row["gap_share"] is None and "recovered" not in row for row in rows)


def test_bad_input_exits_2_and_writes_nothing(token_gap, setup, tmp_path, capsys):
    base, _, healed, train, heldout = setup
    out = tmp_path / "gap.json"
    out.write_text("mine")
    argv = [str(base), str(healed), "--data", str(train), "--heldout", str(heldout), "--out", str(out)]
    assert token_gap.main(argv) == 2 and "already exists" in capsys.readouterr().err
    assert out.read_text() == "mine"
    missing = [str(base), str(healed), "--data", str(train), "--heldout", str(tmp_path / "no.txt")]
    assert token_gap.main([*missing, "--out", str(tmp_path / "new.json")]) == 2
    err = capsys.readouterr().err
    assert "'heldout' file" in err and err.count("\n") == 1 and not (tmp_path / "new.json").exists()
    twice = [str(base), str(healed), "--data", str(train), str(train), "--heldout", str(heldout)]
    assert token_gap.main([*twice, "--out", str(tmp_path / "new.json")]) == 2  # counted twice, every count doubled
    assert f"--data lists {train} twice" in capsys.readouterr().err and not (tmp_path / "new.json").exists()
    with pytest.raises(SystemExit) as exit_info:
        token_gap.main([*argv[:-1], str(tmp_path / "x.json"), "--tokens", "1"])
    assert exit_info.value.code == 2 and "--tokens" in capsys.readouterr().err


def test_a_model_of_another_tokenizer_is_refused(token_gap, setup, tiny_llama, tmp_path, capsys):
    base, _, _, train, heldout = setup
    other = tiny_llama(lora=False, layers=2, vocab=96).base  # scored on the base's token ids, or an IndexError
    argv = [str(base), str(other), "--data", str(train), "--heldout", str(heldout), "--seq-len", "8"]
    assert token_gap.main([*argv, "--out", str(tmp_path / "gap.json")]) == 2
    assert "the healed model's vocab_size must be the base's (128); got 96" in capsys.readouterr().err
    assert not (tmp_path / "gap.json").exists()


def test_held_out_files_of_one_name_are_each_reported(token_gap, setup, tmp_path):
    base, _, healed, train, heldout = setup
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "x.txt", tmp_path / "b" / "x.txt"
    first.write_text(heldout.read_text())
    second.write_text("w5 w5 w4 w4 " * 8)
    out = tmp_path / "gap.json"
    argv = [str(base), str(healed), "--data", str(train), "--heldout", str(first), str(second), "--seq-len", "8"]
    assert token_gap.main([*argv, "--out", str(out)]) == 0
    domains = json.loads(out.read_text())["domains"]  # by stem the second replaced the first
    assert list(domains) == [str(first), str(second)] and domains[str(first)]["tokens"] == 31


def test_bucket_rows_count_a_token_seen_1000_times_in_the_open_bucket(token_gap):
    occurrences = torch.tensor([0, 5, 999, 1000, 5000])
    losses = {"base": torch.ones(5), "healed": torch.tensor([2.0, 1.0, 1.0, 1.5, 1.5])}
    rows = token_gap.bucket_rows(losses, occurrences)
    assert [(r["occurrences"], r["tokens"]) for r in rows] == [("0-0", 1), ("1-9", 1), ("100-999", 1), (">=1000", 2)]
    assert [r["gap_share"] for r in rows] == [0.5, 0.0, 0.0, 0.5]


def test_a_held_out_file_named_twice_is_refused(token_gap, tmp_path):
    from nsc_prune.errors import InvalidInputError

    text = tmp_path / "x.txt"
    text.write_text("w3 w4")
    with pytest.raises(InvalidInputError, match="--heldout names a file twice"):  # one domain, silently
        token_gap.heldout_texts([text, text])


def test_an_out_inside_a_model_folder_and_a_zero_seq_len_are_refused(token_gap, setup, tmp_path, capsys):
    base, _, healed, train, heldout = setup
    argv = [str(base), str(healed), "--data", str(train), "--heldout", str(heldout)]
    assert token_gap.main([*argv, "--out", str(healed / "gap.json")]) == 2  # nsc-prune's own files sit there
    assert "is inside the model folder" in capsys.readouterr().err and not (healed / "gap.json").exists()
    with pytest.raises(SystemExit) as exit_info:
        token_gap.main([*argv, "--seq-len", "0", "--out", str(tmp_path / "gap.json")])
    assert exit_info.value.code == 2 and "--seq-len positive" in capsys.readouterr().err
