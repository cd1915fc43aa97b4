"""scripts/prepare_bigbench_siqa.py on a tiny BIG-bench task.json written here (no network, no sdist)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from nsc_prune.errors import InvalidInputError
from tests.conftest import load_script

TASK = {
    "canary": "test canary",
    "examples": [
        {
            "input": "Tracy went to the shop. What does Tracy need to do before this?",
            "target_scores": {"grab a wallet": 1, "sleep": 0, "cry": 0},
        },
        {"input": "Jan smiled", "target_scores": {"be rude": 0, "be kind": 1, "be late": 0}},
        {"input": "Two answers only?", "target_scores": {"yes": 1, "no": 0}},  # dropped: SIQA is 3-way
        {"input": "No gold?", "target_scores": {"a": 0, "b": 0, "c": 0}},  # dropped: no single gold answer
    ],
}


@pytest.fixture(scope="module")
def siqa():
    return load_script("prepare_bigbench_siqa")


def write_sdist(path: Path, member: str, task: dict) -> Path:
    data = json.dumps(task).encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_convert_splits_context_question_and_label(siqa):
    rows = siqa.convert_task(TASK)
    assert rows == [
        {
            "context": "Tracy went to the shop.",
            "question": "What does Tracy need to do before this?",
            "answerA": "grab a wallet",
            "answerB": "sleep",
            "answerC": "cry",
            "label": "1",
        },
        {
            "context": "Jan",
            "question": "smiled",
            "answerA": "be rude",
            "answerB": "be kind",
            "answerC": "be late",
            "label": "2",
        },
    ]


def test_malformed_examples_are_named(siqa):
    with pytest.raises(InvalidInputError, match=r"example #1: a BIG-bench example must be an object with 'input'"):
        siqa.convert_task({"examples": [TASK["examples"][0], {"input": "no scores"}]})
    with pytest.raises(InvalidInputError, match="must be an object with an 'examples' list"):
        siqa.convert_task({"questions": []})


def test_main_writes_task_into_the_cache(siqa, tmp_path, capsys, monkeypatch):
    sdist = write_sdist(tmp_path / siqa.SDIST, siqa.MEMBER, TASK)
    assert siqa.main(["--sdist", str(sdist), "--cache", str(tmp_path / "cache")]) == 0
    out = tmp_path / "cache" / siqa.OUT_NAME
    lines = (out / f"{siqa.TASK}.jsonl").read_text().splitlines()
    assert [json.loads(line)["label"] for line in lines] == ["1", "2"]
    assert str(out / f"{siqa.TASK}.jsonl") in (out / f"{siqa.TASK}.yaml").read_text()
    source = json.loads((out / "source.json").read_text())
    assert (source["examples"], source["kept"], source["dropped"], source["canary"]) == (4, 2, 2, "test canary")
    assert "wrote 2 of 4 questions" in capsys.readouterr().out
    # a second run refuses to overwrite: one line on stderr, exit 2
    assert siqa.main(["--sdist", str(sdist), "--cache", str(tmp_path / "cache")]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    # ... before it downloads the 358 MB sdist it would convert
    monkeypatch.setattr(siqa, "download", lambda dest: pytest.fail("downloaded before the refusal"))
    assert siqa.main(["--cache", str(tmp_path / "cache")]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    # --overwrite replaces its own conversion (source.json is a provenance record)
    assert siqa.main(["--sdist", str(sdist), "--cache", str(tmp_path / "cache"), "--overwrite"]) == 0


def test_wrong_archive_is_a_clear_error(siqa, tmp_path, capsys):
    other = write_sdist(tmp_path / "other.tar.gz", "bigbench-1.0.0/README.md", {})
    with pytest.raises(
        InvalidInputError, match=r"other.tar.gz has no bigbench-1.0.0/bigbench/benchmark_tasks/social_iqa/task.json"
    ):
        siqa.read_task(other)
    not_tar = tmp_path / "plain.txt"
    not_tar.write_text("hello")
    assert siqa.main(["--sdist", str(not_tar), "--cache", str(tmp_path / "cache")]) == 2
    assert "cannot read bigbench-1.0.0/bigbench/benchmark_tasks/social_iqa/task.json from" in capsys.readouterr().err


def test_only_one_answer_scored_exactly_1_is_gold_and_a_bare_input_splits_at_its_last_word(siqa):
    assert siqa.convert({"input": "x", "target_scores": {"a": 1, "b": 1, "c": 0}}) is None  # two gold answers
    assert siqa.convert({"input": "x", "target_scores": {"a": 0.5, "b": 0, "c": 0}}) is None  # no gold one
    row = siqa.convert({"input": "Jan smiled at Tom", "target_scores": {"a": 0, "b": 0, "c": 1}})
    assert (row["context"], row["question"], row["label"]) == ("Jan smiled at", "Tom", "3")
