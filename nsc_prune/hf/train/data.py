"""Training text: files or cached datasets -> tokenized, packed ``seq_len`` blocks with a held-out split.

Inputs (``load_text_blocks``):

- plain text (any other suffix): one text, read as written, blank lines and newlines kept; its paragraphs
  (separated by blank lines), or, in a file with no blank line but several lines, its lines are the units the
  held-out split draws (the record's ``documents_by`` says which), and EOS follows its end only: EOS in place of
  each blank line taught a model healed without a teacher to end its turn at paragraph breaks;
- ``.jsonl``: one JSON object a line, the ``text_field`` (default ``text``) of each, or an instruction record;
- ``.json``: a JSON list of such objects (the LoNAS/Alpaca instruction files);
- ``hf:NAME[:split]`` (``hf:NAME:CONFIG:SPLIT`` for a dataset with several configs; a split may be sliced,
  ``train[:1000]``): a ``datasets`` dataset already in the local cache (read offline; split default ``train``), a
  document a row, as a JSONL file's records (a dataset of lines, such as wikitext, gets EOS after each line: pass a
  text file to read text as written); its empty rows are left out.

Instruction records ``{instruction, input, output}`` are rendered with the Alpaca prompt template. Each document
(a record, a whole text file) is tokenized without special tokens and followed by EOS; documents (a text file's
paragraphs or lines) are split into train/validation (seeded,
by document, so no validation text is ever trained on) and each side is packed into full ``seq_len`` blocks
(the last partial block is dropped), each led by BOS when the tokenizer starts a text with one (LLaMA's, Gemma's:
``bos_token_added``), as every sequence a served model reads is (a document's own leading BOS, a chat template's,
is dropped). When whole documents cannot give both sides a block (one long document,
or a few), the text is packed first and seeded whole blocks are held out instead (``split`` in the record:
``documents`` or ``blocks``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsc_prune._io import parse_json, read_utf8, sha256_file
from nsc_prune._validation import is_int, is_number, must_be
from nsc_prune._warn import warn
from nsc_prune.errors import InvalidInputError, require
from nsc_prune.hf.progress import library_bars, progress
from nsc_prune.hf.weights.loading import bos_token_added, warn_if_mostly_unknown

torch = require("torch", "hf")

HF_PREFIX = "hf:"
RECORD_SUFFIXES = (".json", ".jsonl")  # files read as records (in any case), a field each; any other: plain text
ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n{output}"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n{output}"
)
INSTRUCTION_KEYS = ("instruction", "output")
_OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
EARLIER_READER = (
    "an earlier nsc-prune, which read text files, .JSONL files, byte-order marks or hf: datasets' blank rows, or led "
    "blocks with BOS, otherwise"
)
"""Why blocks stored by an earlier version differ from today's of the same files (said where they are refused)."""


@dataclass(frozen=True)
class TextBlocks:
    """Packed token blocks: ``train`` [n, seq_len] and ``val`` [m, seq_len] (int64), ``sha256`` of the inputs."""

    train: torch.Tensor
    val: torch.Tensor
    sha256: str
    sources: tuple[dict[str, Any], ...] = ()  # per input: name, format, documents, tokens, sha256
    seq_len: int = 0
    stats: dict[str, Any] = field(default_factory=dict)  # documents, tokens read, split (documents/blocks)

    def fingerprint(self) -> str:
        """sha256 of the packed blocks themselves (what a resumed run must see again)."""
        digest = hashlib.sha256()
        for tensor in (self.train, self.val):
            digest.update(str(tuple(tensor.shape)).encode())
            digest.update(tensor.contiguous().numpy().tobytes())
        return digest.hexdigest()

    def check_ids_fit(self, vocab_size: int, tokenizer: str | os.PathLike) -> None:
        """InvalidInputError when a token id is past the model's ``vocab_size`` embeddings: the ``tokenizer`` (its
        folder) is not the model's (an IndexError deep in the first forward pass)."""
        top = max(int(blocks.max()) for blocks in (self.train, self.val) if blocks.numel())
        if top >= vocab_size:
            raise InvalidInputError(
                f"the tokenizer in {tokenizer} gives token id {top}, but the model has vocab_size={vocab_size} "
                "embeddings: it is not this model's tokenizer; copy the model's own tokenizer files there"
            )

    @property
    def train_tokens(self) -> int:
        return int(self.train.numel())

    def describe(self) -> dict[str, Any]:
        """Files, formats and token counts (for records and logs)."""
        return {
            "sources": [dict(s) for s in self.sources],
            "formats": sorted({s["format"] for s in self.sources}),
            "seq_len": self.seq_len,
            "train_blocks": int(self.train.shape[0]),
            "val_blocks": int(self.val.shape[0]),
            "train_tokens": self.train_tokens,
            "val_tokens": int(self.val.numel()),
            **self.stats,
            "sha256": self.sha256,
        }


def render_instruction(record: dict[str, Any]) -> str:
    """An ``{instruction, input, output}`` record as one Alpaca-template text (LoNAS's fine-tuning format)."""
    values = {key: str(record.get(key) or "") for key in ("instruction", "input", "output")}
    template = ALPACA_PROMPT if values["input"].strip() else ALPACA_PROMPT_NO_INPUT
    return template.format(**values)


def _record_text(record: Any, text_field: str, where: str) -> str:
    if not isinstance(record, dict):
        raise InvalidInputError(must_be(where, "a JSON object", type(record).__name__))
    if text_field in record:
        text = record[text_field]
        if not isinstance(text, str):
            raise InvalidInputError(must_be(f"{where} field {text_field!r}", "a string", type(text).__name__))
        return text
    if all(key in record for key in INSTRUCTION_KEYS):
        for key in ("instruction", "input", "output"):  # str() turned 5 into "5" and a list into "['w4', 'w5']"
            if record.get(key) is not None and not isinstance(record[key], str):
                raise InvalidInputError(must_be(f"{where} field {key!r}", "a string", type(record[key]).__name__))
        return render_instruction(record)
    raise InvalidInputError(
        must_be(
            f"{where}",
            f"an object with a {text_field!r} field or {{instruction, input, output}} fields",
            sorted(record)[:8],
            "Pass text_field (--text-field) naming the field that holds the text",
        )
    )


def _json_documents(path: Path, text_field: str) -> tuple[str, list[str]]:
    text = read_utf8(path, "data file")
    if path.suffix.lower() == ".jsonl":
        docs = []
        # Lines end at "\n" only: str.splitlines also splits at U+2028, NEL and others, which a JSON string may hold raw
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                record = parse_json(line, unique_keys=False, constants=True)
            except ValueError as err:
                raise InvalidInputError(f"{path} line {number} is not valid JSON ({err})") from err
            docs.append(_record_text(record, text_field, f"{path} line {number}"))
        return "jsonl", docs
    try:
        data = parse_json(text, unique_keys=False, constants=True)
    except ValueError as err:
        raise InvalidInputError(f"{path} is not valid JSON ({err})") from err
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise InvalidInputError(must_be(f"the JSON in {path}", "a list of objects", type(data).__name__))
    return "json", [_record_text(record, text_field, f"{path} item {i}") for i, record in enumerate(data)]


@contextlib.contextmanager
def _offline(datasets: Any) -> Iterator[None]:
    """datasets and huggingface_hub offline while it is open, and as they were after: their flags (read from
    HF_HUB_OFFLINE when first imported, which heal has done through transformers before any dataset is read) and
    the variables themselves, which code that reads the environment at call time sees (and a child process)."""
    from huggingface_hub import constants  # imported before the variables change: its flags stay the caller's

    saved = (constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE)
    saved_env = {name: os.environ.get(name) for name in _OFFLINE_VARIABLES}
    os.environ.update(dict.fromkeys(_OFFLINE_VARIABLES, "1"))
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE = saved
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _dataset_parts(spec: str) -> tuple[str, str | None, str]:
    """``hf:NAME[:split]`` or ``hf:NAME:CONFIG:SPLIT`` as (name, config or None, split; default ``train``). A split
    may be sliced (``train[:1000]``): a colon inside brackets is the slice's."""
    parts = re.split(r":(?![^\[]*\])", spec[len(HF_PREFIX) :])
    if not parts[0] or len(parts) > 3 or len(parts) == 3 and not all(parts):
        raise InvalidInputError(must_be("a dataset input", "hf:NAME[:split] or hf:NAME:CONFIG:SPLIT", spec))
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    return parts[0], None, (parts[1] if len(parts) == 2 and parts[1] else "train")


def _hf_documents(spec: str, text_field: str) -> tuple[str, list[str], str]:
    """A cached ``datasets`` dataset, read offline: format, documents, its fingerprint."""
    name, config, split = _dataset_parts(spec)
    datasets = require("datasets", "eval")  # lm-eval brings it; heal alone does not need it
    try:
        with _offline(datasets), library_bars("datasets"):  # "Generating train split" into logs and under --quiet
            dataset = datasets.load_dataset(name, config, split=split)
    except Exception as err:  # datasets raises many types for "not cached", and others for a bad split or file
        said = str(err).splitlines()
        named = f"dataset {name!r} ({f'config {config!r}, ' if config else ''}split {split!r})"
        if said and said[0].startswith("Config name is missing"):  # cached, with several configs
            configs = next((line for line in said[1:] if "configs" in line), "")
            spelt = f"hf:{name}:{split}:train" if f"'{split}'" in configs else f"hf:{name}:CONFIG:{split}"
            raise InvalidInputError(
                f"{named} has several configs{f' ({configs.strip()})' if configs else ''}; name one: {spelt}"
            ) from err
        if said and said[0].startswith("Unknown split"):  # found, without that split
            raise InvalidInputError(f"{named}: {said[0]} Pass hf:{name}{f':{config}' if config else ''}:SPLIT") from err
        if said and said[0].startswith("BuilderConfig"):  # found, without that config
            raise InvalidInputError(f"{named}: {said[0]} Pass hf:{name}:CONFIG:{split}") from err
        if said and "save_to_disk" in said[0]:  # "download it" was no fix for a folder it can read
            raise InvalidInputError(
                f"{named}: the folder was written by Dataset.save_to_disk, which hf: does not read (it reads what "
                f"datasets.load_dataset reads); write the split as files, e.g. "
                f"load_from_disk({name!r}).to_parquet('DIR/{split.split('[')[0]}.parquet'), and pass "
                f"hf:DIR{f':{split}' if '[' in split else ''}"
            ) from err
        if said and said[0].startswith(("Unrecognized instruction format", "No instructions could be built")):
            raise InvalidInputError(
                f"{named}: the split does not read as one ({said[0]}); e.g. train, train[:1000] or train[:10%]"
            ) from err
        raise InvalidInputError(
            f"{named} could not be read offline ({type(err).__name__}: {said[0] if said else ''}); if it is not in "
            "the local datasets cache, download it on a machine with internet (datasets.load_dataset) and copy "
            "$HF_DATASETS_CACHE here"
        ) from err
    columns = set(dataset.column_names)
    if text_field not in columns and not set(INSTRUCTION_KEYS) <= columns:
        raise InvalidInputError(
            must_be(
                f"dataset {name!r}",
                f"a dataset with a {text_field!r} column or instruction/output columns",
                sorted(columns),
                "Pass text_field (--text-field) naming the text column",
            )
        )
    # a column some rows lack is None in theirs (datasets fills it): read as absent, as in a JSON file
    rows = ({key: value for key, value in row.items() if value is not None} for row in dataset)
    docs = [_record_text(row, text_field, f"{spec} row {i}") for i, row in enumerate(rows)]
    docs = [doc for doc in docs if doc.strip()]  # a raw-text dataset's blank lines: each was an EOS of its own
    if not docs:
        raise InvalidInputError(f"dataset {spec} holds no text in its {text_field!r} column; pass one with text")
    return "hf", docs, str(getattr(dataset, "_fingerprint", ""))


def read_documents(source: str | os.PathLike, text_field: str = "text") -> tuple[dict[str, Any], list[str]]:
    """One input's documents and a description (name, format, sha256)."""
    if isinstance(source, str) and source.startswith(HF_PREFIX):
        fmt, docs, fingerprint = _hf_documents(source, text_field)
        digest = hashlib.sha256(fingerprint.encode()).hexdigest()
        return {"name": source, "format": fmt, "documents_by": "records", "sha256": digest}, docs
    path = Path(source)
    if not path.is_file():
        raise InvalidInputError(
            must_be("a data file", "an existing file (or hf:NAME[:split], hf:NAME:CONFIG:SPLIT)", str(source))
        )
    if path.stat().st_size == 0:
        raise InvalidInputError(f"data file {path} is empty; pass a file with text")
    if reads_fields(path):
        fmt, docs = _json_documents(path, text_field)
        docs = [doc for doc in docs if doc.strip()]
    else:
        text = read_utf8(path, "data file")
        fmt, (docs, unit) = "text", text_documents(text)
    if not docs:
        raise InvalidInputError(f"data file {path} holds no text; pass a file with text")
    unit = unit if fmt == "text" else "records"
    return {"name": str(path), "format": fmt, "documents_by": unit, "sha256": sha256_file(path)}, docs


def reads_fields(source: str | os.PathLike) -> bool:
    """Whether an input is read as records with a ``text_field`` (JSON, JSONL, a dataset), not as plain text."""
    return str(source).startswith(HF_PREFIX) or Path(source).suffix.lower() in RECORD_SUFFIXES


BLANK_LINE = re.compile(r"\n[ \t]*\n")


def text_documents(text: str) -> tuple[list[str], str]:
    """A plain text's pieces and what they are: its paragraphs (blank-line separated), or, when it has no blank
    line but several lines (one sample a line), its lines; each with the blank line or newline that follows it, so
    that the pieces joined are the text (CRLF read as LF, blank space before the first piece dropped)."""
    text = text.replace("\r\n", "\n")
    paragraphs = _pieces(BLANK_LINE.split(text), BLANK_LINE.findall(text))  # a line of spaces is blank too
    lines = _pieces(text.split("\n"), ["\n"] * text.count("\n"))
    if len(paragraphs) == 1 and len(lines) > 1:
        return lines, "lines"
    return paragraphs, "paragraphs"


def _pieces(parts: list[str], separators: list[str]) -> list[str]:
    """``parts`` each with the separator after it; a part of blank space joins the piece before it."""
    pieces: list[list[str]] = []  # joined once at the end: a run of a million blank lines took minutes
    for part, separator in zip(parts, [*separators, ""], strict=True):
        if part.strip() or not pieces:
            pieces.append([part, separator])
        else:
            pieces[-1] += (part, separator)
    return [piece for piece in map("".join, pieces) if piece.strip()]


def _tokenize(docs: list[str], tokenizer: Any, budget: int | None, *, one_text: bool = False) -> Iterator[list[int]]:
    """Each document's ids and EOS (``one_text``: the pieces of one text, tokenized as that text and cut at the
    pieces' ends, EOS after the last only), until ``budget`` tokens: the document that reaches it is cut there."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise InvalidInputError(must_be("the tokenizer's eos_token", "set (documents are separated by EOS)", None))
    bos = bos_token_added(tokenizer)
    pieces = _text_piece_ids(docs, tokenizer, budget) if one_text else _each_ids(docs, tokenizer, budget)
    total = 0
    for index, ids in enumerate(pieces):
        doc = list(ids)
        if bos is not None and doc[:1] == [bos] and (not one_text or index == 0):
            del doc[0]  # a chat template's own BOS: each block starts with one (``_pack``), not twice or mid-block
        if not one_text or index == len(docs) - 1:
            doc.append(eos)
        if budget is not None and total + len(doc) >= budget:
            yield doc[: budget - total]
            return
        yield doc
        total += len(doc)


def _each_ids(texts: list[str], tokenizer: Any, budget: int | None = None) -> Iterator[list[int]]:
    """Each of ``texts`` tokenized on its own, without special tokens, 256 at a time (one longer than
    ``TEXT_WINDOW_CHARS`` a window at a time, ``_windowed_ids``)."""
    for start in range(0, len(texts), 256):
        batch = texts[start : start + 256]
        short = [text for text in batch if len(text) <= TEXT_WINDOW_CHARS]
        encoded = iter(tokenizer(short, add_special_tokens=False)["input_ids"] if short else ())
        for text in batch:
            yield next(encoded) if len(text) <= TEXT_WINDOW_CHARS else _windowed_ids(text, tokenizer, budget)


TEXT_WINDOW_CHARS = 1 << 20  # a text is tokenized a window of whole pieces at a time: its offsets take ~170 B a char


def _windowed_ids(text: str, tokenizer: Any, budget: int | None) -> list[int]:
    """The ids of one piece longer than ``TEXT_WINDOW_CHARS`` (a file of one line, a huge record), tokenized a
    window at a time, each cut before a space that follows a word (tokenizers split words there anyway; a window
    without one, such as unspaced CJK, is cut where it ends), until ``budget`` ids: tokenized whole, 8 MB of text
    took 2 GB, and a budget did not stop the work."""
    ids: list[int] = []
    start = 0
    while start < len(text) and (budget is None or len(ids) < budget):
        stop = min(start + TEXT_WINDOW_CHARS, len(text))
        if stop < len(text):
            cut = _space_after_a_word(text, start + TEXT_WINDOW_CHARS // 2, stop)
            stop = cut if cut > start else stop
        ids += tokenizer(text[start:stop], add_special_tokens=False, verbose=False)["input_ids"]
        start = stop
    return ids


def _space_after_a_word(text: str, low: int, high: int) -> int:
    """The last index in ``[low, high)`` of a space that follows a non-space (a cut there splits no word and no run
    of spaces); -1 when there is none."""
    cut = text.rfind(" ", low, high)
    while cut > 0 and text[cut - 1].isspace():
        cut = text.rfind(" ", low, cut)
    return cut if cut > 0 else -1


def _text_piece_ids(pieces: list[str], tokenizer: Any, budget: int | None = None) -> Iterator[list[int]]:
    """The token ids of the text ``pieces`` join, split where each piece ends (a token belongs to the piece its
    first character is in): tokenized piece by piece, a BPE merged a paragraph's blank line into one token the text
    never has, and a newline lost the next line's indent. The text goes in windows of whole pieces of about
    ``TEXT_WINDOW_CHARS`` (a budget stops the work; a window's end is a piece's, cut as before; a longer piece is
    tokenized alone, ``_windowed_ids``); a tokenizer without character offsets (a slow one) tokenizes piece by
    piece."""
    if not getattr(tokenizer, "is_fast", False):
        yield from _each_ids(pieces, tokenizer, budget)
        return
    start = 0
    while start < len(pieces):
        if len(pieces[start]) > TEXT_WINDOW_CHARS:
            yield _windowed_ids(pieces[start], tokenizer, budget)
            start += 1
            continue
        stop, size = start, 0
        while stop < len(pieces) and (stop == start or size + len(pieces[stop]) <= TEXT_WINDOW_CHARS):
            size += len(pieces[stop])
            stop += 1
        window = pieces[start:stop]
        # verbose=False: the text is longer than the model's context, and packed into blocks, not fed whole
        encoded = tokenizer("".join(window), add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ends = list(itertools.accumulate(len(piece) for piece in window))
        split: list[list[int]] = [[] for _ in window]
        index = 0
        for token, (first, _) in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True):
            while index < len(ends) - 1 and first >= ends[index]:
                index += 1
            split[index].append(token)
        yield from split
        start = stop


def document_ids(
    source: str | os.PathLike, tokenizer: Any, text_field: str = "text", budget: int | None = None
) -> tuple[dict[str, Any], list[list[int]]]:
    """One input's description (``read_documents``) and its documents' token ids as training reads them, EOS
    included, at most ``budget`` tokens."""
    info, texts = read_documents(source, text_field)
    ids = _tokenize(texts, tokenizer, budget, one_text=info["format"] == "text")
    # a bar: a 30 MB text tokenized for a minute in silence
    return info, list(progress(ids, f"tokenizing {info['name']}", info["documents_by"].rstrip("s"), total=len(texts)))


def _pack(docs: list[list[int]], seq_len: int, bos: int | None) -> torch.Tensor:
    """``docs`` one after another in full blocks of ``seq_len`` tokens, each led by ``bos`` when not None."""
    stream = torch.tensor([token for doc in docs for token in doc], dtype=torch.long)
    width = seq_len - (bos is not None)
    blocks = stream[: len(stream) // width * width].view(-1, width)
    return blocks if bos is None else torch.cat([torch.full((len(blocks), 1), bos), blocks], dim=1)


def _split_documents(
    docs: list[list[int]], seq_len: int, val_fraction: float, seed: int, bos: int | None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Hold out seeded whole documents (about ``val_fraction`` of the tokens, at least one block's worth, passing
    over a document that would take more than twice that): train and validation blocks, and the number of
    validation documents."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    val_ids: set[int] = set()
    if val_fraction > 0:
        want, held = max(val_fraction * sum(map(len, docs)), seq_len), 0
        for index in order:
            if held >= want:
                break
            if held + len(docs[index]) > 2 * want:  # a book among notes: it alone would be most of the text
                continue
            val_ids.add(index)
            held += len(docs[index])
    train_docs = [docs[i] for i in range(len(docs)) if i not in val_ids]
    val_docs = [docs[i] for i in sorted(val_ids)]
    return _pack(train_docs, seq_len, bos), _pack(val_docs, seq_len, bos), len(val_docs)


def _split_blocks(
    docs: list[list[int]], seq_len: int, val_fraction: float, seed: int, bos: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack every document first, then hold out seeded whole blocks (at least one, at least one left to train):
    for one long document, or too few documents to hold one out whole."""
    blocks = _pack(docs, seq_len, bos)
    count = blocks.shape[0]
    held = min(max(1, math.ceil(val_fraction * count)), count - 1) if val_fraction > 0 else 0
    val_ids = sorted(random.Random(seed).sample(range(count), held))
    keep = torch.ones(count, dtype=torch.bool)
    keep[val_ids] = False
    return blocks[keep], blocks[val_ids]


def _check_args(seq_len: int, val_fraction: float, max_tokens: int | None) -> None:
    if not is_int(seq_len) or seq_len < 2:
        raise InvalidInputError(must_be("seq_len", "an integer >= 2", seq_len))
    if not is_number(val_fraction) or not 0 <= val_fraction < 1:
        raise InvalidInputError(must_be("val_fraction", "a number in [0, 1)", val_fraction))
    if max_tokens is not None and (not is_int(max_tokens) or max_tokens < 1):  # its least: load_text_blocks
        raise InvalidInputError(must_be("max_tokens (--max-tokens)", "a positive integer or None", max_tokens))


def _file_identity(path: Path) -> str:
    """What names one file however it is reached: its device and inode (a hard link too), else its resolved path."""
    try:
        found = path.stat()
    except OSError:  # missing: read_documents names it
        return str(path.resolve())
    return f"{found.st_dev}:{found.st_ino}"


def _dataset_identity(spec: str) -> str:
    """What names one dataset split however it is written: ``hf:ds`` is ``hf:./ds:train`` and
    ``hf:./ds:default:train[:50%]`` (slices of one split overlap, or could: one is listed once)."""
    try:
        name, config, split = _dataset_parts(spec)
    except InvalidInputError:  # read_documents names it
        return spec
    where = Path(name)
    return repr((str(where.resolve()) if where.is_dir() else name, config or "default", split.split("[")[0]))


def check_outside_datasets(path: str | os.PathLike, files: Sequence[str | os.PathLike], flag: str) -> None:
    """InvalidInputError when ``path`` (an output or work folder) is inside the local folder of an ``hf:`` input:
    datasets reads every file there whose name matches a split (a checkpoint's ``nsc_prune_train.json``), so a
    resume read other data."""
    target = Path(path).resolve()
    for spec in (str(f) for f in files if str(f).startswith(HF_PREFIX)):
        try:
            folder = Path(_dataset_parts(spec)[0])
        except InvalidInputError:  # read_documents names it
            continue
        if folder.is_dir() and (target == folder.resolve() or folder.resolve() in target.parents):
            raise InvalidInputError(
                f"{flag} {path} is inside the folder of the dataset {spec}, whose files datasets would read as its "
                f"data; choose a {flag} outside it"
            )


def check_distinct_sources(files: Sequence[str | os.PathLike]) -> None:
    """InvalidInputError when ``files`` name one file twice (by path, link or hard link) or one dataset twice."""
    named = [_dataset_identity(str(f)) if str(f).startswith(HF_PREFIX) else _file_identity(Path(f)) for f in files]
    twice = next((i for i, name in enumerate(named) if named.count(name) > 1), None)
    if twice is not None:
        again = files[named.index(named[twice], twice + 1)]
        same = "" if str(again) == str(files[twice]) else f" (again as {again})"
        raise InvalidInputError(f"--data lists {files[twice]} twice{same}; name each file once")


def load_text_blocks(
    files: Sequence[str | os.PathLike],
    tokenizer: Any,
    seq_len: int,
    *,
    text_field: str = "text",
    val_fraction: float = 0.05,
    max_tokens: int | None = None,
    seed: int = 0,
) -> TextBlocks:
    """Read ``files`` (see the module docstring), tokenize, split by document and pack into blocks.

    ``max_tokens`` stops reading after that many tokens (train + validation; the document that reaches it is cut
    there). With ``val_fraction`` > 0 at
    least one whole validation block is held out. Raises InvalidInputError for missing/empty inputs, and for
    text (or a ``max_tokens``) too short to give one training block and, with ``val_fraction`` > 0, one
    validation block.
    """
    _check_args(seq_len, val_fraction, max_tokens)
    bos = bos_token_added(tokenizer)
    need = (seq_len - (bos is not None)) * (2 if val_fraction > 0 else 1)
    blocks = " (one training and one validation block)" if val_fraction > 0 else ""
    if max_tokens is not None and max_tokens < need:  # else the text was blamed for the cap's shortness
        raise InvalidInputError(
            must_be("max_tokens (--max-tokens)", f"at least {need} for seq_len {seq_len}{blocks}", max_tokens)
        )
    if isinstance(files, (str, os.PathLike)) or not files:
        raise InvalidInputError(must_be("files", "a non-empty list of data files", files))
    check_distinct_sources(files)  # a file's documents would be held out and trained on alike
    sources, docs, read = [], [], 0
    for source in files:
        left = None if max_tokens is None else max_tokens - read
        if left is not None and left <= 0:
            unread = ", ".join(str(f) for f in files[len(sources) :])
            warn(f"--max-tokens {max_tokens} was reached before {unread}: not read (--data is read in order)")
            break
        info, tokens = document_ids(source, tokenizer, text_field, left)
        sources.append({**info, "documents": len(tokens), "tokens": sum(map(len, tokens))})
        docs.extend(tokens)
        read += sources[-1]["tokens"]
    warn_if_mostly_unknown(tokenizer, docs, "the training text")
    digest = hashlib.sha256("\n".join(f"{s['format']}:{s['sha256']}" for s in sources).encode()).hexdigest()
    total = sum(map(len, docs))
    if total < need:
        raise InvalidInputError(
            must_be(
                "the training text",
                f"at least {need} tokens for seq_len {seq_len}{blocks}",
                f"{total} tokens in {len(docs)} document{'s' if len(docs) != 1 else ''}",
                "Pass more text or a smaller --seq-len",
            )
        )
    train, val, val_docs = _split_documents(docs, seq_len, val_fraction, seed, bos)
    split = "documents"
    if train.shape[0] == 0 or (val_fraction > 0 and val.shape[0] == 0):
        train, val, val_docs, split = *_split_blocks(docs, seq_len, val_fraction, seed, bos), 0, "blocks"
    stats = {"documents": len(docs), "val_documents": val_docs, "tokens_read": total, "split": split}
    if bos is not None:  # records of tokenizers without one read as before
        stats["bos_each_block"] = True
    return TextBlocks(train=train, val=val, sha256=digest, sources=tuple(sources), seq_len=seq_len, stats=stats)


@dataclass(frozen=True)
class TextData:
    """Where the training text comes from and how it is split (``heal --data`` and ``train-supernet --data``)."""

    files: tuple[str, ...]
    text_field: str = "text"
    val_fraction: float = 0.05
    max_tokens: int | None = None

    @classmethod
    def of(cls, data: TextData | str | os.PathLike | Sequence[str | os.PathLike]) -> TextData:
        """``data`` as is, or a file or list of files with the default field, split and cap (a bare path was read
        as a list of one-letter files)."""
        if isinstance(data, TextData):
            return data
        return cls((os.fspath(data),) if isinstance(data, str | os.PathLike) else tuple(str(f) for f in data))

    def settings(self) -> dict[str, Any]:
        """How the text is read and split, for records: the field, the held-out fraction and the token cap."""
        return {"text_field": self.text_field, "val_fraction": self.val_fraction, "max_tokens": self.max_tokens}

    def load(self, tokenizer: Any, seq_len: int, seed: int = 0) -> TextBlocks:
        """``load_text_blocks`` of these files with these settings."""
        return load_text_blocks(
            self.files,
            tokenizer,
            seq_len,
            text_field=self.text_field,
            val_fraction=self.val_fraction,
            max_tokens=self.max_tokens,
            seed=seed,
        )
