"""scripts/sample_text.py on a tiny random LLaMA with a word-level tokenizer (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from nsc_prune._io import STOP_SIGNALS
from tests.conftest import load_script

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def sample_text():
    return load_script("sample_text")


def run(script, base, out, *extra: str) -> int:
    argv = [str(base), "--tokens", "100", "--out", str(out), "--batch-size", "4", "--new-tokens", "16"]
    return script.main([*argv, "--dtype", "float32", *extra])


def test_writes_the_tokens_it_counts_one_sample_a_paragraph(sample_text, tiny_llama, tmp_path):
    tiny = tiny_llama(lora=False)
    out = tmp_path / "sampled.txt"
    assert run(sample_text, tiny.base, out) == 0
    record = json.loads((tmp_path / "sampled.txt.json").read_text())
    paragraphs = out.read_text().strip().split("\n\n")
    counted = sum(len(text.split()) for text in paragraphs)  # the word-level tokenizer: one token a word
    assert record["samples"] == len(paragraphs) and record["tokens"] == counted
    assert 100 <= counted < 100 + 4 * 16  # it stops after the batch that reached --tokens
    assert all(len(text.split()) <= 16 for text in paragraphs)
    assert record["settings"]["dtype"] == "float32" and record["settings"]["top_p"] == 0.95
    assert "provenance" in record


def test_a_jsonl_output_holds_one_record_a_sample_which_heal_ends_with_eos(sample_text, tiny_llama, tmp_path):
    """heal reads a .txt as one text (no EOS between its paragraphs); a .jsonl keeps the samples apart."""
    tiny = tiny_llama(lora=False)
    assert (
        run(sample_text, tiny.base, tmp_path / "s.txt") == 0 and run(sample_text, tiny.base, tmp_path / "s.jsonl") == 0
    )
    paragraphs = (tmp_path / "s.txt").read_text().strip().split("\n\n")
    records = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [record["text"] for record in records] == paragraphs  # the same samples, the same seed


def test_the_seed_decides_the_text(sample_text, tiny_llama, tmp_path):
    tiny = tiny_llama(lora=False)
    texts = []
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        run(sample_text, tiny.base, tmp_path / name, "--seed", seed)
        texts.append((tmp_path / name).read_text())
    assert texts[0] == texts[1] != texts[2]


def test_an_existing_output_is_refused_and_kept(sample_text, tiny_llama, tmp_path, capsys):
    tiny = tiny_llama(lora=False)
    out = tmp_path / "sampled.txt"
    out.write_text("mine")
    assert run(sample_text, tiny.base, out) == 2 and "already exists" in capsys.readouterr().err
    assert out.read_text() == "mine" and not (tmp_path / "sampled.txt.json").exists()
    assert run(sample_text, tiny.base, out, "--overwrite") == 0 and out.read_text() != "mine"


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, 130), *((signum, 128 + signum) for signum in STOP_SIGNALS)]
)
def test_a_stop_keeps_the_whole_batches_sampled(
    sample_text, tiny_llama, tmp_path, monkeypatch, capsys, signals_as_in_a_terminal, signum, status
):
    tiny = tiny_llama(lora=False)
    generate, calls, handler = sample_text.generate, [], signal.getsignal(signal.SIGTERM)

    def stopped_in_the_second_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signum)
        return generate(*args, **kwargs)

    monkeypatch.setattr(sample_text, "generate", stopped_in_the_second_batch)
    out = tmp_path / "sampled.txt"
    assert run(sample_text, tiny.base, out, "--tokens", "1000") == status
    record = json.loads((tmp_path / "sampled.txt.json").read_text())
    paragraphs = out.read_text().strip().split("\n\n")
    assert record["stopped_by"] == signal.Signals(signum).name and record["samples"] == len(paragraphs) <= 4
    assert record["tokens"] == sum(len(text.split()) for text in paragraphs) < 1000
    assert "short of --tokens 1,000" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == handler and len(calls) == 2  # the handler it found is back
    # The same command again (a requeued job) is told that the text is a stopped run's, which it does not resume.
    assert run(sample_text, tiny.base, out, "--tokens", "1000") == 2
    stopped = f"holds a run that {signal.Signals(signum).name} stopped after {record['tokens']:,} tokens"
    assert stopped in capsys.readouterr().err and len(calls) == 2


def test_a_stop_before_the_first_batch_writes_nothing(sample_text, tiny_llama, tmp_path, monkeypatch, capsys):
    tiny = tiny_llama(lora=False)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sample_text, "generate", interrupted)
    out = tmp_path / "sampled.txt"
    assert run(sample_text, tiny.base, out) == 130
    assert "nothing was written" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_bad_settings_exit_2(sample_text, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sample_text.main(["base", "--tokens", "0", "--out", str(tmp_path / "x.txt")])
    assert exit_info.value.code == 2 and "--tokens" in capsys.readouterr().err


def test_one_paragraph_removes_blank_lines(sample_text):
    assert sample_text.one_paragraph("a\n\n\nb\n \nc\nd\n\n") == "a\nb\nc\nd"


def test_cuda_without_a_gpu_is_one_line_and_nothing_written(sample_text, tiny_llama, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "sampled.txt"
    assert run(sample_text, tiny_llama(lora=False).base, out, "--device", "cuda") == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err and not out.exists()


# A word-level chat template: w3 opens a user turn, w2 (the end-of-text token) ends it, w4 opens the answer.
CHAT_TEMPLATE = (
    "{% for m in messages %}w3 {{ m['content'] }} w2 {% endfor %}{% if add_generation_prompt %}w4{% endif %}"
)


def with_chat_template(base, template: str = CHAT_TEMPLATE):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(base)
    return tokenizer


def test_chat_turns_split_the_template_around_the_question(sample_text, tiny_llama):
    tokenizer = with_chat_template(tiny_llama(lora=False).base)
    assert sample_text.chat_turns(tokenizer) == ([3], [2, 4])


def test_chat_samples_are_a_question_and_its_answer(sample_text, tiny_llama, tmp_path):
    tiny = tiny_llama(lora=False)
    with_chat_template(tiny.base)
    out = tmp_path / "chats.txt"
    assert run(sample_text, tiny.base, out, "--chat", "--question-tokens", "64") == 0
    record = json.loads((tmp_path / "chats.txt.json").read_text())
    paragraphs = out.read_text().strip().split("\n\n")
    questions, answers = zip(*(text.split("\n") for text in paragraphs))  # each exactly two lines
    assert all(0 < len(q.split()) <= 64 and 0 < len(a.split()) <= 16 for q, a in zip(questions, answers))
    assert "w2" not in {word for text in paragraphs for word in text.split()}  # each turn cut at its end
    assert record["tokens"] == sum(len(text.split()) for text in paragraphs) >= 100
    assert record["settings"]["chat"] is True and len(set(questions)) == len(questions)


@pytest.mark.parametrize(
    ("template", "message"),
    [(None, "has none"), ("{% for m in messages %}w3 {{ m['content'] }} w5 {% endfor %}", "special token")],
)
def test_chat_without_a_usable_template_is_one_line_and_nothing_written(
    sample_text, tiny_llama, tmp_path, capsys, template, message
):
    tiny = tiny_llama(lora=False)
    if template:
        with_chat_template(tiny.base, template)
    out = tmp_path / "chats.txt"
    assert run(sample_text, tiny.base, out, "--chat") == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_chat_whose_questions_never_end_is_one_line_and_nothing_written(sample_text, tiny_llama, tmp_path, capsys):
    tiny = tiny_llama(lora=False)
    with_chat_template(tiny.base)
    out = tmp_path / "chats.txt"
    # one token a question: it ends only on the end token itself, which leaves no question to answer
    assert run(sample_text, tiny.base, out, "--chat", "--question-tokens", "1") == 2
    assert "no finished question" in capsys.readouterr().err and not out.exists()


def test_each_generate_call_runs_on_a_cache_sized_to_it(sample_text, tiny_llama):
    # transformers' own static cache keeps the longest length of any earlier call: after an answer, every question
    # would attend over an answer's length
    import argparse

    from transformers import AutoModelForCausalLM

    from nsc_prune.hf.weights.loading import from_pretrained

    model = from_pretrained(AutoModelForCausalLM, tiny_llama(lora=False).base).eval()
    caches, generate = [], model.generate

    def spy(*args, **kwargs):
        caches.append(kwargs["cache"])
        return generate(*args, **kwargs)

    model.generate = spy
    settings = argparse.Namespace(top_p=0.95, top_k=50)
    sample_text.generate(model, [[5, 6, 7, 8, 9, 10], [5]], pad=2, stop=[2], new_tokens=16, args=settings)
    sample_text.generate(model, [[5]], pad=2, stop=[2], new_tokens=4, args=settings)
    assert [cache.get_max_length() for cache in caches] == [6 + 16, 1 + 4]
    assert all(cache.get_seq_length() > 0 for cache in caches)  # generate filled the cache it was given


def test_the_record_beside_the_text_and_the_model_folder_are_never_written_over(
    sample_text, tiny_llama, tmp_path, capsys
):
    tiny = tiny_llama(lora=False)
    (tmp_path / "sampled.txt.json").write_text("mine")  # the record was replaced without --overwrite
    assert run(sample_text, tiny.base, tmp_path / "sampled.txt") == 2
    assert "sampled.txt.json already exists" in capsys.readouterr().err
    config = (tiny.base / "config.json").read_text()
    assert run(sample_text, tiny.base, tiny.base / "config") == 2  # its record would have been config.json
    assert "inside the model folder" in capsys.readouterr().err and (tiny.base / "config.json").read_text() == config
    assert run(sample_text, tmp_path / "no-such-model", tmp_path / "x.txt") == 2  # went to the Hub
    assert "(it does not exist)" in capsys.readouterr().err
    assert (tmp_path / "sampled.txt.json").read_text() == "mine" and not (tmp_path / "x.txt").exists()


def test_the_sampling_bounds_are_inclusive_where_documented(sample_text, capsys):
    args = sample_text.parse_args(
        ["base", "--tokens", "9", "--out", "x.txt", "--top-p", "1", "--top-k", "0"]
    )  # 0: every token
    assert (args.top_p, args.top_k) == (1.0, 0)
    with pytest.raises(SystemExit) as exit_info:
        sample_text.parse_args(["base", "--tokens", "9", "--out", "x.txt", "--top-p", "0"])
    assert exit_info.value.code == 2 and "--top-p in (0, 1]" in capsys.readouterr().err
