"""Training data (issue 13): every input format, packing and held-out split properties, bad input."""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import sys
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from nsc_prune.errors import InvalidInputError  # noqa: E402
from nsc_prune.hf.train.data import (  # noqa: E402
    ALPACA_PROMPT,
    ALPACA_PROMPT_NO_INPUT,
    load_text_blocks,
    read_documents,
    render_instruction,
)
from tests.conftest import _tokenizer  # noqa: E402

EOS = 2


@pytest.fixture(scope="module")
def tok():
    return _tokenizer(128)


def doc(i: int, n: int = 12) -> str:
    """Document i: n words, the first one marks the document (w3..w9 are single tokens of the tiny tokenizer)."""
    return " ".join(f"w{3 + (i + k) % 7}" for k in range(n))


def _byte_tokenizer() -> Any:
    """A byte-level BPE whose merges join a newline to the next paragraph's first letter: tokenized piece by piece,
    the text would have other tokens than as a whole (the word-level tokenizer drops newlines)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("Ċ", "A"), ("Ċ", "L")]
    vocab |= {a + b: len(vocab) + i for i, (a, b) in enumerate(merges)}
    tokenizer = Tokenizer(models.BPE(vocab={**vocab, "<eos>": len(vocab)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")


def test_plain_text_is_read_as_written_and_its_paragraphs_are_the_held_out_units(tmp_path, tok):
    """Each paragraph was a document ending in EOS, so the blank lines were gone from training and EOS stood in
    their place: a model healed on a .txt without a teacher learned to end its turn at paragraph breaks (SmolLM2's
    EOS is <|im_end|>; P(EOS) 0.16 at a docstring's paragraph break, docs/recovery_study.md)."""
    path = tmp_path / "a.txt"
    text = "First line.\nSecond line.\n\nA paragraph:\n    indented code\n \t\nLast.\n"
    path.write_text(text)
    byte_tok = _byte_tokenizer()
    blocks = load_text_blocks([path], byte_tok, 4, val_fraction=0.0)
    whole = [*byte_tok(text, add_special_tokens=False)["input_ids"], byte_tok.eos_token_id]
    assert blocks.train.flatten().tolist() == whole[: len(whole) // 4 * 4]  # the text as written, then one EOS
    for across in ("ĊA", "ĊL"):  # a token across a paragraph's end, as the text has it
        assert byte_tok.convert_tokens_to_ids(across) in whole
    source = blocks.describe()["sources"][0]
    assert source["documents"] == 3 and source["documents_by"] == "paragraphs" and source["tokens"] == len(whole)
    path.write_text("\n\n".join(doc(i) for i in range(20)))
    blocks = load_text_blocks([path], tok, 16, val_fraction=0.0)
    stream = blocks.train.flatten().tolist()
    assert blocks.train.dtype == torch.long and blocks.train.shape == (20 * 12 // 16, 16) and EOS not in stream
    assert stream[:12] == tok(doc(0), add_special_tokens=False)["input_ids"]
    assert blocks.val.shape == (0, 16)
    info = blocks.describe()
    assert info["formats"] == ["text"] and info["sources"][0]["documents"] == 20 and info["sources"][0]["tokens"] == 241
    spaced = tmp_path / "spaced.txt"  # a line of spaces between paragraphs is a blank line: not one document a line
    spaced.write_text("\n \t\n".join(f"{doc(i, 6)}\n{doc(i + 1, 6)}" for i in range(0, 20, 2)))
    source = load_text_blocks([spaced], tok, 16, val_fraction=0.0).describe()["sources"][0]
    assert source["documents"] == 10 and source["documents_by"] == "paragraphs"


def test_a_text_is_tokenized_a_window_at_a_time_and_a_budget_stops_the_work(tmp_path, monkeypatch):
    """The whole text was tokenized at once with its offsets (~170 bytes of memory a character) before the budget
    was looked at: 10 MB of text took 2 GB and 12 s for --max-tokens 2048."""
    from nsc_prune.hf.train import data

    byte_tok = _byte_tokenizer()
    calls = []
    real_call = type(byte_tok).__call__

    def call(self, text, **kw):
        if text not in ("a", ""):  # bos_token_added's probes
            calls.append(text)
        return real_call(self, text, **kw)

    monkeypatch.setattr(type(byte_tok), "__call__", call)
    monkeypatch.setattr(data, "TEXT_WINDOW_CHARS", 64)
    path = tmp_path / "a.txt"
    text = "\n\n".join(f"Paragraph {i} of the text." for i in range(40)) + "\n"  # 26-27 bytes a paragraph
    path.write_text(text)
    whole = load_text_blocks([path], byte_tok, 4, val_fraction=0.0)
    ids = [*real_call(byte_tok, text, add_special_tokens=False)["input_ids"], byte_tok.eos_token_id]
    assert whole.train.flatten().tolist() == ids[: whole.train.numel()]  # no merge crosses these paragraphs' ends
    assert all(len(window) <= 64 for window in calls) and "".join(calls) == text  # windows of whole paragraphs
    calls.clear()
    load_text_blocks([path], byte_tok, 4, val_fraction=0.0, max_tokens=40)
    assert len(calls) <= 2  # the windows the 40 tokens need, not the 17 of the whole text


@pytest.mark.parametrize("name", ["one-line.txt", "one-record.jsonl"])
def test_one_piece_longer_than_a_window_is_tokenized_a_window_at_a_time(tmp_path, monkeypatch, tok, name):
    """A file of one line (or one huge record) was tokenized whole whatever --max-tokens said: 8 MB took 2 GB,
    a 40 MB line aborted. Windows are cut before a space, where the tokenizer splits words anyway."""
    from nsc_prune.hf.train import data

    calls = []
    real_call = type(tok).__call__

    def call(self, text, **kw):
        calls.extend([text] if isinstance(text, str) else text)
        return real_call(self, text, **kw)

    monkeypatch.setattr(type(tok), "__call__", call)
    monkeypatch.setattr(data, "TEXT_WINDOW_CHARS", 64)
    text = "".join(f"w{3 + k % 7}" + " " * (1 + k % 2) for k in range(400))  # one or two spaces, no newline
    path = tmp_path / name
    path.write_text(json.dumps({"text": text}) if name.endswith(".jsonl") else text)
    blocks = load_text_blocks([path], tok, 4, val_fraction=0.0)
    ids = [*real_call(tok, text, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    assert blocks.train.flatten().tolist() == ids[: blocks.train.numel()] and blocks.train.numel() > len(ids) - 4
    long = [c for c in calls if len(c) > 2]  # bos_token_added's probes aside
    assert all(len(c) <= 64 for c in long) and "".join(long) == text
    assert all(c[-1] != " " and after[0] == " " for c, after in zip(long, long[1:]))  # cut before a word's space
    calls.clear()
    assert load_text_blocks([path], tok, 4, val_fraction=0.0, max_tokens=40).train.numel() == 40
    assert sum(len(c) for c in calls if len(c) > 2) <= 3 * 64  # the windows 40 tokens need, not the whole line


def test_split_is_by_document_seeded_and_holds_a_block(tmp_path, tok):
    path = tmp_path / "a.txt"
    path.write_text("\n\n".join(doc(i, 5 + i % 9) for i in range(80)))
    one = load_text_blocks([path], tok, 8, val_fraction=0.1, seed=0)
    again = load_text_blocks([path], tok, 8, val_fraction=0.1, seed=0)
    other = load_text_blocks([path], tok, 8, val_fraction=0.1, seed=1)
    assert torch.equal(one.train, again.train) and torch.equal(one.val, again.val)
    assert not torch.equal(one.val, other.val)
    assert one.val.shape[0] >= 1 and one.describe()["val_documents"] >= 1
    total = one.describe()["tokens_read"]
    assert one.val.numel() <= total * 0.1 + 8 + 14 and one.train.numel() + one.val.numel() > total - 16
    assert one.sha256 == other.sha256  # the inputs' hash, not the split's


@pytest.mark.parametrize("seed", range(4))
def test_a_long_document_is_not_held_out_whole_when_it_would_be_most_of_the_text(tmp_path, tok, seed):
    """A book among notes: under seed 0 the book came first in the shuffle and was held out, 250 validation blocks
    against 77 to train on where 5 % was asked."""
    (tmp_path / "book.txt").write_text(" ".join(f"w{3 + k % 7}" for k in range(4000)))  # one line, one document
    (tmp_path / "notes.txt").write_text("\n\n".join(doc(i, 30) for i in range(40)))
    blocks = load_text_blocks([tmp_path / "book.txt", tmp_path / "notes.txt"], tok, 16, val_fraction=0.05, seed=seed)
    info = blocks.describe()
    assert 16 <= blocks.val.numel() <= 2 * 0.05 * info["tokens_read"] and info["split"] == "documents"
    assert 1 <= info["val_documents"] <= 40  # notes, not the book


def test_val_documents_never_appear_in_training(tmp_path, tok):
    words = [f"w{i}" for i in range(3, 10)]
    # Each document is one word repeated: a document's tokens are all one id, so the sets must be disjoint.
    path = tmp_path / "a.txt"
    path.write_text("\n\n".join(" ".join([words[i]] * 20) for i in range(7)))
    blocks = load_text_blocks([path], tok, 10, val_fraction=0.2)
    val_ids, train_ids = set(blocks.val.flatten().tolist()) - {EOS}, set(blocks.train.flatten().tolist()) - {EOS}
    assert val_ids and train_ids and not val_ids & train_ids


def test_jsonl_text_field_and_custom_field(tmp_path, tok):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": doc(i), "id": i}) for i in range(10)) + "\n\n")
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"body": doc(i)}) for i in range(10)))
    a = load_text_blocks([tmp_path / "a.jsonl"], tok, 13, val_fraction=0.0)
    b = load_text_blocks([tmp_path / "b.jsonl"], tok, 13, text_field="body", val_fraction=0.0)
    assert torch.equal(a.train, b.train) and a.train.shape == (10, 13) and (a.train[:, -1] == EOS).all()
    with pytest.raises(InvalidInputError, match=r"'text' field .*--text-field"):
        load_text_blocks([tmp_path / "b.jsonl"], tok, 13)


def test_each_block_starts_with_bos_where_the_tokenizer_adds_one(tmp_path, tok):
    """LLaMA's and Gemma's tokenizers start a text with BOS, and lm-eval and a served prompt do: a block without it
    put a text token at the model's first position (its attention sink; Gemma's outputs break there). Each block is
    BOS and the packed stream's next tokens; a document's own leading BOS (a chat template's) is not read twice."""
    bos_tok = _tokenizer(128, bos=True)
    texts = [doc(i, 12 + i % 5) for i in range(30)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts))
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": f"w1 {t}"}) for t in texts))  # {{ bos_token }}
    stream = [t for text in texts for t in [*tok(text)["input_ids"], EOS]]
    for name in ("a.jsonl", "b.jsonl"):
        blocks = load_text_blocks([tmp_path / name], bos_tok, 14, val_fraction=0.0)
        assert (blocks.train[:, 0] == 1).all() and (blocks.train[:, 1:] != 1).all()
        assert blocks.train[:, 1:].flatten().tolist() == stream[: blocks.train[:, 1:].numel()]
        assert blocks.describe()["bos_each_block"] is True
    plain = load_text_blocks([tmp_path / "a.jsonl"], tok, 13, val_fraction=0.0)
    assert plain.train.flatten().tolist() == stream[: plain.train.numel()] and "bos_each_block" not in plain.describe()
    held = load_text_blocks([tmp_path / "a.jsonl"], bos_tok, 14, val_fraction=0.2)
    assert (held.val[:, 0] == 1).all() and (held.train[:, 0] == 1).all()  # the held-out loss reads the same layout
    assert blocks.train.shape[1] == held.val.shape[1] == 14  # BOS and 13 text tokens: --seq-len, not one more


def test_the_held_out_split_at_its_edges(tmp_path, tok):
    """A budget ending on a record's end reads no empty document; one document of two blocks keeps a training block
    whatever --val-fraction asks; a text of exactly one block trains with --val-fraction 0; --max-tokens one short
    of two blocks names --max-tokens, not the text."""
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps({"text": "w3 w4 w5 w6 w7"}) for _ in range(10)))
    capped = load_text_blocks([tmp_path / "r.jsonl"], tok, 4, val_fraction=0.0, max_tokens=12)  # 6 tokens a record
    assert capped.describe()["documents"] == 2
    (tmp_path / "one.txt").write_text(" ".join(["w3"] * 15))  # 16 tokens with EOS: two blocks of 8
    split = load_text_blocks([tmp_path / "one.txt"], tok, 8, val_fraction=0.6).describe()
    assert (split["train_blocks"], split["val_blocks"]) == (1, 1)
    (tmp_path / "eight.txt").write_text(" ".join(["w3"] * 7))
    assert load_text_blocks([tmp_path / "eight.txt"], tok, 8, val_fraction=0.0).train.shape == (1, 8)
    with pytest.raises(InvalidInputError, match="--max-tokens"):
        load_text_blocks([tmp_path / "r.jsonl"], tok, 8, val_fraction=0.1, max_tokens=15)


def test_the_blocks_fingerprint_holds_the_split():
    from nsc_prune.hf.train.data import TextBlocks

    same = torch.full((4, 8), 3)
    assert TextBlocks(same[:3], same[3:], "x").fingerprint() != TextBlocks(same[:2], same[2:], "x").fingerprint()
    TextBlocks(same[:3], same[3:], "x").check_ids_fit(4, "tok")
    with pytest.raises(InvalidInputError):
        TextBlocks(torch.tensor([[1, 128]]), same[3:], "x").check_ids_fit(128, "tok")  # an id equal to the vocabulary


@pytest.mark.parametrize("bos", [True, False])
def test_a_closed_vocabulary_without_unk_reads_its_text(tmp_path, bos):
    """Probing a word-level tokenizer without <unk> with "a" raised (a traceback in heal, extract --calib and the
    search's table key); its BOS is read from an empty text instead."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from nsc_prune.hf.weights.loading import bos_token_added

    backend = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(1, 40)}))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="w1 $A", special_tokens=[("w1", 1)])
    closed = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="w1", eos_token="w2")
    assert bos_token_added(closed) == (1 if bos else None)
    (tmp_path / "a.txt").write_text("\n\n".join(doc(i) for i in range(20)))
    blocks = load_text_blocks([tmp_path / "a.txt"], closed, 8)
    assert bool((blocks.train[:, 0] == 1).all()) == bos


def test_a_text_the_tokenizer_reads_as_unknown_tokens_is_named(tmp_path, tok):
    """Text a word-level tokenizer (or SentencePiece without byte fallback) cannot read trained on one token, <unk>,
    without a word; a text it reads does not warn."""
    (tmp_path / "a.txt").write_text("\n\n".join(f"Paragraph {i} of prose this vocabulary lacks." for i in range(40)))
    with pytest.warns(UserWarning, match=r"100% of the [\d,]+ tokens of the training text are the tokenizer's unknown"):
        load_text_blocks([tmp_path / "a.txt"], tok, 8)
    (tmp_path / "b.txt").write_text("\n\n".join(doc(i) for i in range(20)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_text_blocks([tmp_path / "b.txt"], tok, 8)


def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path, tok):
    """json.dumps(ensure_ascii=False) writes U+2028, U+2029 and NEL raw; str.splitlines split the records there."""
    texts = [f"{doc(i)}{sep}{doc(i + 1)}" for i, sep in enumerate(("\u2028", "\u2029", "\x85", "\x1e"))]
    path = tmp_path / "d.jsonl"
    path.write_text("\r\n".join(json.dumps({"text": t}, ensure_ascii=False) for t in texts), encoding="utf-8")
    assert read_documents(path, "text")[1] == texts


@pytest.mark.filterwarnings("ignore:.*unknown token")  # the template's English words, to the tiny tokenizer
def test_alpaca_json_and_jsonl_use_the_prompt_template(tmp_path, tok):
    records = [{"instruction": "w3 w4", "input": "w5" if i % 2 else "", "output": doc(i)} for i in range(6)]
    (tmp_path / "a.json").write_text(json.dumps(records))
    (tmp_path / "a.jsonl").write_text("\n".join(map(json.dumps, records)))
    assert render_instruction(records[1]) == ALPACA_PROMPT.format(**records[1])
    assert render_instruction(records[0]) == ALPACA_PROMPT_NO_INPUT.format(**records[0])
    assert "### Response:\n" in render_instruction(records[0])
    j = load_text_blocks([tmp_path / "a.json"], tok, 8, val_fraction=0.0)
    jl = load_text_blocks([tmp_path / "a.jsonl"], tok, 8, val_fraction=0.0)
    expected = [t for r in records for t in [*tok(render_instruction(r), add_special_tokens=False)["input_ids"], EOS]]
    assert torch.equal(j.train, jl.train) and j.train.flatten().tolist() == expected[: j.train.numel()]
    assert j.describe()["formats"] == ["json"] and jl.describe()["formats"] == ["jsonl"]


def test_cached_dataset_input(tmp_path, tok, monkeypatch, capsys):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(json.dumps({"text": doc(i)}) for i in range(10)))
    capsys.readouterr()
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # a process that is online stays online after reading
        monkeypatch.delenv(name, raising=False)
    blocks = load_text_blocks([f"hf:{folder}:train"], tok, 13, val_fraction=0.0)
    assert "HF_HUB_OFFLINE" not in os.environ and "HF_DATASETS_OFFLINE" not in os.environ  # were set for good
    assert capsys.readouterr().err == ""  # datasets' "Generating train split" bar went into logs, --quiet or not
    assert blocks.train.shape == (10, 13) and blocks.describe()["formats"] == ["hf"]
    with pytest.raises(InvalidInputError, match="could not be read offline .*not in the local datasets cache"):
        load_text_blocks(["hf:nsc-prune/surely-not-cached-xyz"], tok, 13)
    saved = tmp_path / "saved"  # "download it" was no fix for a folder it can read
    datasets_module = pytest.importorskip("datasets")
    datasets_module.load_dataset(str(folder), split="train").save_to_disk(str(saved))
    with pytest.raises(
        InvalidInputError, match=r"written by Dataset.save_to_disk, .*\.to_parquet\('DIR/train.parquet'\)"
    ):
        load_text_blocks([f"hf:{saved}"], tok, 13)
    # huggingface_hub read HF_HUB_OFFLINE when transformers imported it, before heal set it: it went to the Hub
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with pytest.raises(InvalidInputError, match=r"could not be read offline .*OfflineModeIsEnabled"):
        load_text_blocks(["hf:nsc-prune/surely-not-cached-xyz"], tok, 13)
    assert constants.HF_HUB_OFFLINE is False  # restored for the rest of the process


def test_a_cached_dataset_reads_as_its_json_file_does_and_names_a_config(tmp_path, tok, monkeypatch):
    """Its blank rows were each a document of one EOS (a raw-text dataset is a third blank lines), an all-blank
    one trained on EOS alone; a dataset with several configs could not be named, and the line sent the user to
    download what was cached."""
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    rows = [row for i in range(30) for row in ({"text": doc(i)}, {"text": ""}, {"text": " \n"})]
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    as_json = load_text_blocks([folder / "train.jsonl"], tok, 13, val_fraction=0.0)
    as_dataset = load_text_blocks([f"hf:{folder}"], tok, 13, val_fraction=0.0)
    assert torch.equal(as_dataset.train, as_json.train) and as_dataset.describe()["sources"][0]["documents"] == 30
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "train.jsonl").write_text('{"text": ""}\n{"text": "  "}\n')
    with pytest.raises(InvalidInputError, match="blank holds no text in its 'text' column"):
        load_text_blocks([f"hf:{tmp_path / 'blank'}"], tok, 13)

    configs = tmp_path / "configs"
    for name in ("one", "two"):
        (configs / name).mkdir(parents=True)
        (configs / name / "train.jsonl").write_text("\n".join(json.dumps({"text": doc(i)}) for i in range(10)))
    (configs / "README.md").write_text(
        "---\nconfigs:\n- config_name: one\n  data_files: one/train.jsonl\n"
        "- config_name: two\n  data_files: two/train.jsonl\n---\n"
    )
    with pytest.raises(
        InvalidInputError,
        match=rf"split 'train'\) has several configs .*'one', 'two'.*; name one: hf:{configs}:CONFIG:train$",
    ):
        load_text_blocks([f"hf:{configs}"], tok, 13)
    assert load_text_blocks([f"hf:{configs}:two:train"], tok, 13, val_fraction=0.0).train.shape == (10, 13)
    for spec in (f"hf:{configs}::train", f"hf:{configs}:a:b:c", "hf:"):
        with pytest.raises(InvalidInputError, match=r"hf:NAME\[:split\] or hf:NAME:CONFIG:SPLIT"):
            load_text_blocks([spec], tok, 13)
    with pytest.raises(
        InvalidInputError, match=rf"\(split 'two'\) has several configs .*; name one: hf:{configs}:two:train$"
    ):
        load_text_blocks([f"hf:{configs}:two"], tok, 13)  # a config where the split goes: it said CONFIG:two
    three = rf"config 'three', split 'train'\): BuilderConfig 'three' not found.* Pass hf:{configs}:CONFIG:train$"
    with pytest.raises(InvalidInputError, match=three):  # was "download it": the dataset is cached
        load_text_blocks([f"hf:{configs}:three:train"], tok, 13)
    with pytest.raises(InvalidInputError, match=r"the split does not read as one .*; e.g. train, train\[:1000\]"):
        load_text_blocks([f"hf:{configs}:two:train[:abc]"], tok, 13)


def test_a_cached_dataset_split_may_be_sliced_and_is_one_source_however_named(tmp_path, tok, monkeypatch):
    """``train[:4]`` parsed as config ``train[`` and split ``4]``; one dataset named two ways (``hf:ds`` and
    ``hf:./ds:train``) was read twice, its held-out documents trained on."""
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "train.jsonl").write_text("\n".join(json.dumps({"text": doc(i)}) for i in range(10)))
    sliced = load_text_blocks(["hf:ds:train[:4]"], tok, 13, val_fraction=0.0)
    assert sliced.describe()["sources"][0]["documents"] == 4
    for twice in (["hf:ds", "hf:./ds:train"], ["hf:ds", f"hf:{tmp_path / 'ds'}"], ["hf:ds", "hf:ds:train[:100%]"],
                  ["hf:ds:train[:5]", "hf:ds:default:train[3:]"]):  # fmt: skip
        with pytest.raises(
            InvalidInputError, match=f"--data lists {re.escape(twice[0])} twice \\(again as {re.escape(twice[1])}\\)"
        ):
            load_text_blocks(twice, tok, 13)
    with pytest.raises(
        InvalidInputError, match=r"Unknown split \"test\"\. Should be one of \['train'\]\. Pass hf:ds:SPLIT$"
    ):
        load_text_blocks(["hf:ds:test"], tok, 13)


def test_rows_that_lack_the_text_field_read_alike_from_a_file_and_a_dataset(tmp_path, tok, monkeypatch):
    """datasets fills a column some rows lack with None: an instruction row beside text rows was refused as
    "field 'text' must be a string; got 'NoneType'" where the JSONL file renders it."""
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "mix").mkdir()
    rows = [{"text": doc(i)} for i in range(10)] + [{"instruction": "w3 w4", "input": "", "output": "w5 w6"}] * 3
    (tmp_path / "mix" / "train.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    (tmp_path / "TRAIN.JSONL").write_text((tmp_path / "mix" / "train.jsonl").read_text())  # was read as plain text
    (tmp_path / "bom.jsonl").write_bytes(codecs.BOM_UTF8 + (tmp_path / "TRAIN.JSONL").read_bytes())  # was refused
    read = [load_text_blocks([source], tok, 13, val_fraction=0.0) for source in
            (tmp_path / "mix" / "train.jsonl", f"hf:{tmp_path / 'mix'}", tmp_path / "TRAIN.JSONL", tmp_path / "bom.jsonl")]  # fmt: skip
    assert all(torch.equal(blocks.train, read[0].train) for blocks in read)
    assert [blocks.describe()["sources"][0]["documents"] for blocks in read] == [13] * 4


def test_a_dataset_input_without_datasets_names_the_extra_that_brings_it(tok, monkeypatch):
    """``datasets`` comes with lm-eval (``[eval]``), not with ``[hf]``: naming ``[hf]`` sent a user in a loop."""
    from nsc_prune.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "datasets", None)  # an import of it raises ImportError
    with pytest.raises(MissingDependencyError, match=r"'datasets' is required .*pip install 'nsc-prune\[eval\]'"):
        load_text_blocks(["hf:wikitext"], tok, 13)


def test_max_tokens_and_several_files(tmp_path, tok):
    (tmp_path / "a.txt").write_text("\n\n".join(doc(i) for i in range(10)))  # 121 tokens: one EOS, at its end
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": doc(i)}) for i in range(10, 20)))
    both = load_text_blocks([tmp_path / "a.txt", tmp_path / "b.jsonl"], tok, 13, val_fraction=0.0)
    assert both.train.shape == (19, 13) and both.describe()["formats"] == ["jsonl", "text"]
    with pytest.warns(UserWarning, match=r"--max-tokens 52 was reached before \S*b\.jsonl: not read \(--data is read"):
        capped = load_text_blocks([tmp_path / "a.txt", tmp_path / "b.jsonl"], tok, 13, val_fraction=0.0, max_tokens=52)
    assert capped.train.shape == (4, 13) and len(capped.describe()["sources"]) == 1
    assert both.sha256 != load_text_blocks([tmp_path / "a.txt"], tok, 13, val_fraction=0.0).sha256


def test_max_tokens_cuts_the_document_that_reaches_it(tmp_path, tok):
    """A long document was read whole past the cap (20,000 tokens read for --max-tokens 1000)."""
    (tmp_path / "one.txt").write_text(" ".join(f"w{3 + k % 120}" for k in range(2000)))
    assert load_text_blocks([tmp_path / "one.txt"], tok, 16, max_tokens=100).describe()["tokens_read"] == 100
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": doc(i)}) for i in range(10)))  # 13 tokens each
    capped = load_text_blocks([tmp_path / "a.jsonl"], tok, 13, val_fraction=0.0, max_tokens=45)
    assert capped.describe()["tokens_read"] == 45 and capped.sources[0]["tokens"] == 45
    assert capped.train.flatten().tolist()[:39].count(EOS) == 3  # three whole documents, then 6 tokens of the 4th


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda p: None, "must be an existing file"),
        (lambda p: p.write_text(""), "is empty"),
        (lambda p: p.write_text("\n\n  \n"), "holds no text"),
        (lambda p: p.write_text(doc(0, 5)), "at least 32 tokens"),
    ],
    ids=["missing", "empty", "blank", "too-short"],
)
def test_bad_text_files(tmp_path, tok, setup, match):
    path = tmp_path / "a.txt"
    setup(path)
    with pytest.raises(InvalidInputError, match=match):
        load_text_blocks([path], tok, 16)


def test_bad_json_and_arguments(tmp_path, tok):
    (tmp_path / "a.jsonl").write_text('{"text": "w3"}\nnot json\n')
    (tmp_path / "b.json").write_text('{"text": "w3"}')
    (tmp_path / "c.txt").write_text("\n\n".join(doc(i) for i in range(20)))
    with pytest.raises(InvalidInputError, match="line 2 is not valid JSON"):
        load_text_blocks([tmp_path / "a.jsonl"], tok, 4)
    with pytest.raises(InvalidInputError, match="must be a list of objects"):
        load_text_blocks([tmp_path / "b.json"], tok, 4)
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError traceback
    with pytest.raises(InvalidInputError, match="deep.json is not valid JSON .arrays or objects nested too deeply"):
        load_text_blocks([tmp_path / "deep.json"], tok, 4)
    for field, value, kind in (("input", 5, "int"), ("output", ["w4", "w5"], "list")):  # str() made text of them
        record = {"instruction": "w3", "input": "", "output": "w4", field: value}
        (tmp_path / "i.jsonl").write_text(json.dumps(record) + "\n")
        with pytest.raises(InvalidInputError, match=f"line 1 field '{field}' must be a string; got '{kind}'"):
            load_text_blocks([tmp_path / "i.jsonl"], tok, 4)
    for name in ("latin1.jsonl", "latin1.json", "latin1.txt"):  # the JSON ones were a UnicodeDecodeError traceback
        (tmp_path / name).write_bytes('{"text": "caf\u00e9"}\n'.encode("latin-1"))
        with pytest.raises(InvalidInputError, match=f"{name} is not UTF-8 text: byte 13 is not"):
            load_text_blocks([tmp_path / name], tok, 4)
    (tmp_path / "mac.txt").write_bytes(b"w3 w4 w5\rw6 w7\r\rw8 w9 w10\rw11\r")  # old Mac lines: as read_text read them
    assert load_text_blocks([tmp_path / "mac.txt"], tok, 4, val_fraction=0.0).describe()["sources"][0]["documents"] == 2
    (tmp_path / "utf16.txt").write_bytes("w3 w4 w5\n\nw6 w7".encode("utf-16-le"))  # no BOM: trained on NUL pairs
    with pytest.raises(InvalidInputError, match="utf16.txt is binary or UTF-16 .it has NUL bytes."):
        load_text_blocks([tmp_path / "utf16.txt"], tok, 4)
    for kwargs, match in (
        ({"seq_len": 1}, "seq_len must be"),
        ({"seq_len": 8, "val_fraction": 1.0}, "val_fraction must be"),
        ({"seq_len": 8, "max_tokens": 4}, r"max_tokens \(--max-tokens\) must be at least 16 for seq_len 8"),
        ({"seq_len": 8, "max_tokens": 0}, r"max_tokens \(--max-tokens\) must be a positive integer"),
        # was "the training text must be at least 16 tokens ... got '8 tokens in 1 document'"
        ({"seq_len": 8, "max_tokens": 8}, r"max_tokens \(--max-tokens\) must be at least 16 for seq_len 8 \(one"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            load_text_blocks([tmp_path / "c.txt"], tok, **kwargs)
    with pytest.raises(InvalidInputError, match="non-empty list"):
        load_text_blocks(str(tmp_path / "c.txt"), tok, 8)


def test_one_sample_a_line_text_has_one_document_a_line(tmp_path, tok):
    """A text with no blank line (one sample a line) splits into line documents; the record says so."""
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(doc(i) for i in range(40)) + "\n")
    blocks = load_text_blocks([path], tok, 16, val_fraction=0.1)
    info = blocks.describe()
    assert info["sources"][0]["documents_by"] == "lines" and info["documents"] == 40
    assert info["split"] == "documents" and blocks.val.shape[0] >= 1 and blocks.train.shape[0] >= 1
    paragraphs = tmp_path / "paragraphs.txt"
    paragraphs.write_text("\n\n".join(f"{doc(i)}\n{doc(i + 1)}" for i in range(20)))
    assert load_text_blocks([paragraphs], tok, 16).describe()["sources"][0]["documents_by"] == "paragraphs"


def test_one_long_document_is_split_by_blocks(tmp_path, tok):
    """One document too long to hold out whole: seeded whole blocks are held out instead, never trained on."""
    path = tmp_path / "one.txt"
    path.write_text(" ".join(f"w{3 + k % 120}" for k in range(400)))  # one line, one document
    blocks = load_text_blocks([path], tok, 16, val_fraction=0.1, seed=0)
    info = blocks.describe()
    assert info["documents"] == 1 and info["split"] == "blocks" and info["val_documents"] == 0
    count = info["tokens_read"] // 16
    assert blocks.val.shape[0] == math.ceil(0.1 * count) and blocks.train.shape[0] + blocks.val.shape[0] == count
    packed = load_text_blocks([path], tok, 16, val_fraction=0.0).train.tolist()
    assert sorted(blocks.train.tolist() + blocks.val.tolist()) == sorted(packed)  # whole blocks, each used once
    again = load_text_blocks([path], tok, 16, val_fraction=0.1, seed=0)
    assert torch.equal(blocks.val, again.val)
    other = load_text_blocks([path], tok, 16, val_fraction=0.1, seed=1)
    assert not torch.equal(blocks.val, other.val)


def test_too_short_text_names_the_length_and_the_fix(tmp_path, tok):
    path = tmp_path / "short.txt"
    path.write_text(" ".join(["w3"] * 20))  # 21 tokens with EOS
    with pytest.raises(InvalidInputError, match=r"at least 32 tokens .*got '21 tokens in 1 document'\. Pass more text"):
        load_text_blocks([path], tok, 16)


def test_a_file_given_twice_is_refused(tmp_path, tok):
    (tmp_path / "a.txt").write_text("\n\n".join(doc(i) for i in range(10)))  # held out and trained on alike
    with pytest.raises(
        InvalidInputError, match="--data lists .*a.txt twice \\(again as .*/a.txt\\); name each file once"
    ):
        load_text_blocks([tmp_path / "a.txt", str(tmp_path / ".." / tmp_path.name / "a.txt")], tok, 13)
    os.link(tmp_path / "a.txt", tmp_path / "b.txt")  # another name of the same file: its documents counted twice
    with pytest.raises(InvalidInputError, match=r"--data lists \S+a.txt twice \(again as \S+b.txt\); name each file"):
        load_text_blocks([tmp_path / "a.txt", tmp_path / "b.txt"], tok, 13)


def test_one_path_is_one_file_not_a_list_of_letters(tmp_path):
    """heal(ckpt, "corpus.txt", ...) said "--data lists / twice" (the string read as one-letter files), and a Path
    raised a bare TypeError."""
    from nsc_prune.hf.train.data import TextData

    corpus = tmp_path / "corpus.txt"
    assert TextData.of(str(corpus)).files == TextData.of(corpus).files == TextData.of([corpus]).files == (str(corpus),)
    data = TextData((str(corpus),), text_field="body")
    assert TextData.of(data) is data


def test_an_instruction_whose_input_is_blank_space_is_rendered_without_an_input_section():
    """An Alpaca record whose ``input`` is only blank space has no input: rendered with the input template, every
    such record trained on an empty "### Input:" section the no-input prompts at serving time never show."""
    record = {"instruction": "w3 w4", "input": "  \n", "output": "w5"}
    assert render_instruction(record) == ALPACA_PROMPT_NO_INPUT.format(**record)
    assert "### Input:" not in render_instruction(record)


def test_a_json_file_holding_its_records_under_data_is_read_as_the_list(tmp_path, tok):
    """``{"data": [...]}`` (the layout of several instruction sets) reads as the bare list does; without the unwrap
    it was refused as "must be a list of objects"."""
    records = [{"text": doc(i)} for i in range(10)]
    (tmp_path / "list.json").write_text(json.dumps(records))
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": records, "version": 1}))
    bare = load_text_blocks([tmp_path / "list.json"], tok, 13, val_fraction=0.0)
    wrapped = load_text_blocks([tmp_path / "wrapped.json"], tok, 13, val_fraction=0.0)
    assert torch.equal(bare.train, wrapped.train) and wrapped.describe()["sources"][0]["documents"] == 10


@pytest.mark.parametrize("where", ["itself", "inside"])
def test_an_output_that_is_the_datasets_folder_itself_is_refused(tmp_path, where):
    """``datasets`` reads every file of an ``hf:`` input's local folder whose name matches a split: a work folder
    that IS that folder (not only one inside it) put the run's own ``nsc_prune_train.json`` among its data."""
    from nsc_prune.hf.train.data import check_outside_datasets

    folder = tmp_path / "ds"
    folder.mkdir()
    target = folder if where == "itself" else folder / "run"
    with pytest.raises(InvalidInputError, match=r"--work-dir \S+ is inside the folder of the dataset hf:"):
        check_outside_datasets(target, [f"hf:{folder}:train"], "--work-dir")
    check_outside_datasets(tmp_path / "elsewhere", [f"hf:{folder}:train"], "--work-dir")  # a sibling is fine


def test_a_text_of_two_lines_and_no_blank_line_is_two_line_documents():
    """One sample a line holds from two lines on: a two-line file read as one paragraph could not hold a line out."""
    from nsc_prune.hf.train.data import text_documents

    assert text_documents("w3 w4\nw5 w6\n") == (["w3 w4\n", "w5 w6\n"], "lines")
    assert text_documents("w3 w4\n") == (["w3 w4\n"], "paragraphs")


def test_a_document_over_twice_the_held_out_share_is_never_held_out(tmp_path, tok):
    """The held-out split passes over a document longer than twice the share it wants (``_split_documents``): one
    that comes first in the shuffle would otherwise be most of the validation text, whatever val_fraction said.
    Here the share is 27 tokens and the long document 70 (between two and three shares)."""
    import random

    small = [" ".join(f"w{3 + (i + k) % 6}" for k in range(19)) for i in range(10)]  # 20 tokens each with EOS
    long = " ".join(["w9"] * 69)  # 70 with EOS, of a word no small document has
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in [*small, long]))

    def first(seed: int) -> int:
        order = list(range(11))
        random.Random(seed).shuffle(order)
        return order[0]

    firsts = [seed for seed in range(100) if first(seed) == 10]
    assert firsts  # seeds whose shuffle offers the long document first (as ``_split_documents`` shuffles)
    for seed in [0, 1, *firsts]:
        blocks = load_text_blocks([tmp_path / "a.jsonl"], tok, 8, val_fraction=0.1, seed=seed)
        assert blocks.describe()["split"] == "documents"
        assert 9 not in blocks.val.flatten().tolist(), seed


def test_a_dataset_spec_with_an_empty_split_reads_the_train_split():
    """``hf:NAME:`` (a trailing colon, as a script that appends ``:$SPLIT`` writes it with SPLIT unset) reads the
    default split, ``train``; an empty split name went to datasets as ``split=""``."""
    from nsc_prune.hf.train.data import _dataset_parts

    assert _dataset_parts("hf:./ds:") == ("./ds", None, "train")
    assert _dataset_parts("hf:./ds") == ("./ds", None, "train")
