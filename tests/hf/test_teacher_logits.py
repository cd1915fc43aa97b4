"""Cached teacher logits (``heal --teacher-logits``, issue 31): at k = vocabulary they train like the live teacher,
below it the rest of the teacher's mass stays as one bucket; a cache computed once is read back by the next heal
without running the teacher and trains to the same weights; a file made for another teacher, text, tokenizer or k,
or a temperature other than 1, is refused in one line, nothing written."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from nsc_prune._files import RECORD_NAME  # noqa: E402
from nsc_prune.cli import heal as heal_command  # noqa: E402
from nsc_prune.errors import InvalidInputError  # noqa: E402
from nsc_prune.hf.train import heal as heal_module  # noqa: E402
from nsc_prune.hf.train import teacher_logits  # noqa: E402
from nsc_prune.hf.train.recipe import TrainConfig  # noqa: E402
from nsc_prune.hf.train.teacher_logits import compute_teacher_logits, load_teacher_logits, logits_key  # noqa: E402
from nsc_prune.hf.train.trainer import recipe_loss, teacher_side  # noqa: E402
from nsc_prune.hf.weights.safetensors_io import index_model_dir  # noqa: E402
from tests.conftest import run_two_processes  # noqa: E402
from tests.hf.test_heal import heal_cli  # noqa: E402

VOCAB = 128  # tests.conftest's tiny_llama


def _blocks(ckpt: Path, data: Path, seq_len: int = 16, val_fraction: float = 0.05):
    from nsc_prune.hf.train.data import TextData

    return TextData((str(data),), val_fraction=val_fraction).load(heal_module._tokenizer(ckpt), seq_len, 0)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_at_k_equal_to_the_vocabulary_the_cached_targets_train_like_the_live_teacher(heal_inputs):
    """At k = V the cache's loss and gradient are the live teacher's (float16 log-probabilities); at k = 4 the
    top 4 keep their probabilities and the rest of the mass stays as the tail bucket."""
    tiny, ckpt, data = heal_inputs
    blocks = _blocks(ckpt, data)
    teacher = heal_module.load_teacher(tiny.base, torch.float32)
    config = TrainConfig(distill=True, bf16=False, batch_size=4, seq_len=16)
    cached = compute_teacher_logits(teacher, blocks, logits_key(tiny.base, ckpt, blocks, VOCAB), config)
    rows = torch.tensor([3, 0, 5])
    ids = blocks.train[rows]
    live, sparse = teacher_side(teacher, ids, config), teacher_side(cached, ids, config, rows)
    assert cached.record["top_k_mass"] == pytest.approx(1.0, abs=1e-3) and float(sparse.tail.max()) < 1e-3
    losses = []
    for targets in (live, sparse):
        student = torch.randn(*ids.shape, VOCAB, generator=torch.Generator().manual_seed(0), requires_grad=True)
        loss = recipe_loss(student, ids, targets, config)
        loss.backward()
        losses.append((loss.detach(), student.grad))
    torch.testing.assert_close(losses[1][0], losses[0][0], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(losses[1][1], losses[0][1], atol=2e-5, rtol=0)
    top4 = compute_teacher_logits(teacher, blocks, logits_key(tiny.base, ckpt, blocks, 4), config)
    four = teacher_side(top4, ids, config, rows)
    assert four.indices.shape[-1] == 4 and torch.equal(four.indices[..., 0], live[0].argmax(-1))
    torch.testing.assert_close(four.p, live[0].gather(-1, four.indices), atol=2e-3, rtol=0)
    torch.testing.assert_close(four.p.sum(-1) + four.tail, torch.ones(four.tail.shape), atol=2e-3, rtol=0)
    assert float(four.tail.min()) > 0 and 0 < top4.record["top_k_mass"] < 1


def test_a_cache_computed_once_is_read_back_without_the_teacher_and_trains_alike(tmp_path, heal_inputs, monkeypatch):
    tiny, ckpt, data = heal_inputs
    cache = tmp_path / "teacher.safetensors"
    args = ["--max-steps", "3", "--teacher", str(tiny.base), "--teacher-logits", str(cache), "--teacher-top-k", "8"]
    assert heal_cli(ckpt, data, tmp_path / "first", *args) == 0
    first = json.loads((tmp_path / "first" / RECORD_NAME).read_text())["recovery"]
    assert first["teacher_logits"]["computed_here"] and first["teacher_logits"]["top_k"] == 8 and cache.is_file()
    assert 0 < first["teacher_logits"]["top_k_mass"] <= 1 and first["val_loss_teacher"] is not None

    def no_teacher(*_args, **_kwargs):
        raise AssertionError("a cached run must not load the teacher")

    monkeypatch.setattr(heal_module, "load_teacher", no_teacher)
    stamp = cache.stat().st_mtime_ns
    assert heal_cli(ckpt, data, tmp_path / "second", *args) == 0
    second = json.loads((tmp_path / "second" / RECORD_NAME).read_text())["recovery"]
    assert not second["teacher_logits"]["computed_here"] and cache.stat().st_mtime_ns == stamp
    # the precision the teacher ran in is not in the key: a run in another precision reads the cache and says so
    assert second["teacher_logits"]["precision"] == first["teacher_logits"]["precision"] == first["precision"]
    assert second["val_loss_teacher"] == first["val_loss_teacher"] and second["loss"] == "distillation"
    a, b = _weights(tmp_path / "first"), _weights(tmp_path / "second")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_cache_of_more_text_than_an_untimed_run_trains_on_is_said_with_the_max_tokens_it_needs(
    tmp_path, heal_inputs, capsys, monkeypatch
):
    """A 10 MB text for a 2-step run ran the teacher over 5,018 batches, silently (said from a million tokens more
    than the run trains on; from one here)."""
    monkeypatch.setattr(heal_module, "UNTRAINED_TOKENS_SAID", 1)
    tiny, ckpt, data = heal_inputs
    held = _blocks(ckpt, data, seq_len=16).train.shape[0]
    args = ["--teacher", str(tiny.base), "--teacher-logits", str(tmp_path / "t.safetensors"), "--teacher-top-k", "8"]
    capsys.readouterr()
    assert heal_cli(ckpt, data, tmp_path / "o", *args, "--max-steps", "2", "--batch-size", "1", "--seq-len", "16") == 0
    said = f"teacher over all {held:,} training blocks (0.00 GiB cached) where this run trains on 2 (2 steps): "
    assert said + "--max-tokens 51 reads the text they need" in capsys.readouterr().err  # (2 + 1) x 16 / 0.95
    accumulated = ["--max-steps", "2", "--batch-size", "1", "--grad-accum", "3", "--seq-len", "16", "--overwrite"]
    other_cache = [*args[:3], str(tmp_path / "t2.safetensors"), *args[4:]]  # the first is read: nothing to say
    assert heal_cli(ckpt, data, tmp_path / "o", *other_cache, *accumulated) == 0
    assert "where this run trains on 6 (2 steps): --max-tokens 118 reads" in capsys.readouterr().err  # 7 x 16 / 0.95
    enough = ["--max-steps", str(held), "--batch-size", "1", "--seq-len", "16", "--overwrite"]
    assert heal_cli(ckpt, data, tmp_path / "o", *args, *enough) == 0
    assert "training blocks" not in capsys.readouterr().err


def test_full_vocabulary_cache_heals_like_the_live_teacher(tmp_path, heal_inputs):
    """At k = vocabulary the cached run follows the live one: the same training losses and held-out loss within
    a few per cent of what healing moved (float16 targets, and Adam turns tiny gradient differences into whole
    steps on weights whose gradient is near zero, so the weights themselves are not compared)."""
    tiny, ckpt, data = heal_inputs
    live = ["--max-steps", "3", "--teacher", str(tiny.base), "--bf16", "false", "--logging-steps", "1"]
    assert heal_cli(ckpt, data, tmp_path / "live", *live) == 0
    cache = ["--teacher-logits", str(tmp_path / "t.safetensors"), "--teacher-top-k", str(VOCAB)]
    assert heal_cli(ckpt, data, tmp_path / "cached", *live, *cache) == 0
    a, b = (json.loads((tmp_path / n / RECORD_NAME).read_text())["recovery"] for n in ("live", "cached"))
    assert [s for s, _ in a["train_loss"]] == [s for s, _ in b["train_loss"]] == [1, 2, 3]
    for (_, x), (_, y) in zip(a["train_loss"], b["train_loss"], strict=True):
        assert y == pytest.approx(x, rel=1e-2, abs=1e-3)
    moved = abs(a["val_loss_after"] - a["val_loss_before"])
    assert moved > 0.01 and abs(b["val_loss_after"] - a["val_loss_after"]) < 0.05 * moved


def _retokenized(ckpt: Path, tmp_path: Path) -> Path:
    """The checkpoint with another tokenizer file (same vocabulary and ids, other bytes)."""
    other = tmp_path / "retok"
    shutil.copytree(ckpt, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    return other


@pytest.mark.parametrize(
    "case, match",
    [
        ("other-teacher", "was computed for another teacher weights;"),
        (
            "other-text",
            "another training text (the packed blocks: text, tokenizer, --seq-len, split) (or by an earlier",
        ),
        ("other-tokenizer", "was computed for another tokenizer;"),
        ("other-k", "was computed for another top_k;"),
        ("not-a-cache", "is not a teacher-logits file written by nsc-prune heal"),
        ("no-teacher", "--teacher-logits caches a teacher's logits: pass the teacher with --teacher BASE"),
        ("k-without-cache", "--teacher-top-k sets the cached teacher logits: pass --teacher-logits FILE"),
        ("k-zero", "--teacher-top-k must be an integer >= 1"),
        ("temperature", "--temperature with --teacher-logits must be 1"),
        ("temperature-below-1", "--temperature with --teacher-logits must be 1"),
        ("k-above-the-vocabulary", f"--teacher-top-k must be at most the vocabulary size ({VOCAB}); got {VOCAB + 1}"),
        ("inside-the-teacher", "is inside the model folder"),  # a model.safetensors there became its weights
        ("a-link-to-nothing", "is a link to a missing file; name the file"),  # the link was replaced by the file
    ],
)
def test_a_cache_for_other_inputs_is_one_line_exit_2_nothing_written(
    tmp_path, heal_inputs, tiny_llama, capsys, case, match
):
    tiny, ckpt, data = heal_inputs
    teacher_files = sorted(p.name for p in tiny.base.iterdir())
    made = tmp_path / "made"
    made.mkdir()
    cache = made / "t.safetensors"
    assert (
        heal_cli(
            ckpt, data, made / "healed", "--max-steps", "1", "--teacher", str(tiny.base), "--teacher-logits", str(cache)
        )
        == 0
    )
    teacher, extra = tiny.base, ["--teacher-logits", str(cache)]
    if case == "other-teacher":
        teacher = tiny_llama(gqa=True, seed=1).base
    elif case == "other-text":
        data = tmp_path / "b.txt"
        data.write_text(data.with_name("a.txt").read_text() + "\n\nw3 w4 w5 w6 w7 w8 w9 w3 w4 w5 w6 w7")
    elif case == "other-tokenizer":
        ckpt = _retokenized(ckpt, tmp_path)
    elif case == "other-k":
        extra += ["--teacher-top-k", "5"]
    elif case == "not-a-cache":  # a model's weights, outside the model
        shutil.copy(next(iter(index_model_dir(tiny.base).values())).file, tmp_path / "weights.safetensors")
        extra = ["--teacher-logits", str(tmp_path / "weights.safetensors")]
    elif case == "no-teacher":
        teacher = None
    elif case == "k-without-cache":
        extra = ["--teacher-top-k", "5"]
    elif case == "k-zero":
        extra = ["--teacher-logits", str(tmp_path / "new.safetensors"), "--teacher-top-k", "0"]
    elif case.startswith("temperature"):
        temperature = "2" if case == "temperature" else "0.5"
        extra = ["--teacher-logits", str(tmp_path / "new.safetensors"), "--temperature", temperature]
    elif case == "k-above-the-vocabulary":
        extra = ["--teacher-logits", str(tmp_path / "new.safetensors"), "--teacher-top-k", str(VOCAB + 1)]
    elif case == "inside-the-teacher":
        extra = ["--teacher-logits", str(tiny.base / "model.safetensors")]
    elif case == "a-link-to-nothing":
        (tmp_path / "link.safetensors").symlink_to(tmp_path / "elsewhere" / "t.safetensors")
        extra = ["--teacher-logits", str(tmp_path / "link.safetensors")]
    before = sorted(p.name for p in tmp_path.iterdir())
    stamp = cache.stat().st_mtime_ns
    teacher_args = ["--teacher", str(teacher)] if teacher is not None else []
    capsys.readouterr()  # what building the other teacher printed is not heal's
    code = heal_cli(ckpt, data, tmp_path / "out", "--max-steps", "1", *teacher_args, *extra)
    err = capsys.readouterr().err
    assert code == 2, err
    assert match in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before and cache.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tiny.base.iterdir()) == teacher_files


def test_a_budget_too_small_after_the_cache_is_computed_keeps_the_cache_and_says_so(tmp_path, heal_inputs, capsys):
    """``--minutes`` is checked by its probe, which needs the cache: a refused budget writes no output, and the
    complete cache it computed first stays (named in the one line) for the rerun to read."""
    tiny, ckpt, data = heal_inputs
    cache = tmp_path / "t.safetensors"
    teacher = ["--teacher", str(tiny.base), "--teacher-logits", str(cache)]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert heal_cli(ckpt, data, tmp_path / "out", "--minutes", "0.00001", *teacher) == 2
    err = capsys.readouterr().err
    assert "--minutes must be enough for one training step" in err and len(err.strip().splitlines()) == 1, err
    assert f"the teacher logits computed for it are in {cache}, a rerun reads them" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "t.safetensors"])
    assert heal_cli(ckpt, data, tmp_path / "out", "--max-steps", "1", *teacher) == 0
    record = json.loads((tmp_path / "out" / RECORD_NAME).read_text())["recovery"]
    assert not record["teacher_logits"]["computed_here"]
    assert heal_cli(ckpt, data, tmp_path / "again", "--minutes", "0.00001", *teacher) == 2
    err = capsys.readouterr().err  # a cache that was read, not computed, is not mentioned
    assert "--minutes must be enough" in err and "teacher logits computed" not in err
    fresh = ["--teacher", str(tiny.base), "--teacher-logits", str(tmp_path / "d.safetensors")]
    assert heal_cli(ckpt, data, tmp_path / "diverged", "--max-steps", "3", "--learning-rate", "1e30", *fresh) == 2
    err = capsys.readouterr().err  # any error after the cache was computed names it (a divergence said nothing)
    assert "training diverged" in err and f"computed for it are in {tmp_path / 'd.safetensors'}" in err, err


def test_a_file_made_at_the_cache_path_while_it_was_computed_is_kept(tmp_path, heal_inputs, monkeypatch, capsys):
    """FILE is never overwritten (docs/recovery.md): one made there while the logits were computed was replaced."""
    tiny, ckpt, data = heal_inputs
    cache = tmp_path / "t.safetensors"
    computed = heal_module.compute_teacher_logits

    def compute_while_a_file_appears(*args, **kwargs):
        logits = computed(*args, **kwargs)
        cache.write_text("mine")
        return logits

    monkeypatch.setattr(heal_module, "compute_teacher_logits", compute_while_a_file_appears)
    teacher = ["--teacher", str(tiny.base), "--teacher-logits", str(cache)]
    assert heal_cli(ckpt, data, tmp_path / "out", "--max-steps", "1", *teacher) == 2
    assert "t.safetensors was created while this command ran" in capsys.readouterr().err
    assert cache.read_text() == "mine" and (tmp_path / "t.safetensors.kept-1").is_file()
    assert not (tmp_path / "out").exists()


def test_a_heal_of_the_same_inputs_writing_the_cache_meanwhile_is_this_runs_own(tmp_path, heal_inputs, monkeypatch):
    """Heals of two points of one front started at once with one new --teacher-logits FILE: the later writer
    failed after computing the logits (exit 2, FILE.kept-1, no checkpoint). A file of the same key is its own."""
    tiny, ckpt, data = heal_inputs
    cache = tmp_path / "t.safetensors"
    computed = heal_module.compute_teacher_logits

    def compute_while_another_heal_writes(*args, **kwargs):
        logits = computed(*args, **kwargs)
        teacher_logits.save_teacher_logits(logits, cache)  # the other heal, of the same teacher, text and top k
        return logits

    monkeypatch.setattr(heal_module, "compute_teacher_logits", compute_while_another_heal_writes)
    teacher = ["--teacher", str(tiny.base), "--teacher-logits", str(cache)]
    assert heal_cli(ckpt, data, tmp_path / "out", "--max-steps", "1", *teacher) == 0
    assert (tmp_path / "out").is_dir() and not list(tmp_path.glob("t.safetensors.kept*"))


def test_the_clis_shown_default_is_the_librarys():
    assert heal_command.DEFAULT_TOP_K_TEXT == str(teacher_logits.DEFAULT_TOP_K)


def test_a_changed_cache_file_is_refused_when_its_shapes_do_not_fit(tmp_path, heal_inputs):
    """A file whose key matches but whose tensors do not fit the blocks (edited by hand) is refused too."""
    from safetensors.torch import save_file

    tiny, ckpt, data = heal_inputs
    blocks = _blocks(ckpt, data)
    key = logits_key(tiny.base, ckpt, blocks, 4)
    meta = {teacher_logits.METADATA_KEY: json.dumps({"key": key, "vocab_size": VOCAB, "val_loss_teacher": 1.0})}
    bad = {
        "indices": torch.zeros((1, 15, 4), dtype=torch.int32),
        "logprobs": torch.zeros((1, 15, 4), dtype=torch.float16),
    }
    save_file(bad, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(Exception, match="tensors must be shaped"):
        load_teacher_logits(tmp_path / "bad.safetensors", key, blocks)
    shape = (*blocks.train[:, :-1].shape, 4)  # shaped right, but values no teacher gives: failed deep in training
    whole = {  # four distinct tokens holding 0.8 of the mass at every position: a file a teacher could write
        "indices": torch.arange(4, dtype=torch.int32).expand(shape).contiguous(),
        "logprobs": torch.full(shape, math.log(0.2), dtype=torch.float16),
    }
    save_file(whole, str(tmp_path / "whole.safetensors"), metadata=meta)
    assert load_teacher_logits(tmp_path / "whole.safetensors", key, blocks).indices.shape == shape
    certain = {part: tensor.clone() for part, tensor in whole.items()}  # a teacher sure of one token: log p = 0
    certain["logprobs"][0, 0] = torch.log_softmax(torch.tensor([30.0, 0.0, 0.0, 0.0]), -1).half()
    assert float(certain["logprobs"][0, 0, 0]) == 0.0
    save_file(certain, str(tmp_path / "certain.safetensors"), metadata=meta)
    assert load_teacher_logits(tmp_path / "certain.safetensors", key, blocks).indices.shape == shape
    for name, value, message in (
        ("indices", VOCAB, f"holds token ids outside the vocabulary of {VOCAB}"),
        ("logprobs", float("nan"), "holds log-probabilities that are NaN or above 0"),
        ("logprobs", math.log(0.5), "top-k probabilities sum to more than 1"),  # 1.1: the tail was clamped to 0
        ("logprobs", -math.inf, "top-k probabilities sum to more than 1, or are all 0"),
        ("indices", 3, "names a token twice at one position"),
    ):
        tensors = {part: tensor.clone() for part, tensor in whole.items()}
        if value == -math.inf:
            tensors[name][0, 0] = value  # a position where no token is possible
        else:
            tensors[name][0, 0, 0] = value
        save_file(tensors, str(tmp_path / "edited.safetensors"), metadata=meta)
        with pytest.raises(InvalidInputError, match=message):
            load_teacher_logits(tmp_path / "edited.safetensors", key, blocks)


LAUNCHED_SCRIPT = """
import json, os
from nsc_prune.cli import main
from nsc_prune.hf.train import heal as heal_module
from tests.hf.test_heal import FAST
calls = []
load = heal_module.load_teacher
def counted(*args, **kwargs):
    model = load(*args, **kwargs)
    model.register_forward_hook(lambda module, inputs, output: calls.append(inputs[0].shape[0] if inputs else 0))
    return model
heal_module.load_teacher = counted
rank = int(os.environ["RANK"])
argv = ["heal", {ckpt!r}, "--data", {data!r}, "--out", {out!r}, *FAST, *{args!r}]
code = main([arg.replace("%RANK%", str(rank)) for arg in argv])  # %RANK%: a path of each rank's own
json.dump({{"code": code, "teacher_forwards": len(calls)}}, open({out!r} + ".%d.json" % rank, "w"))
"""


def _batches(rows: torch.Tensor, batch_size: int = 4) -> int:  # FAST: batch 4
    return -(-rows.shape[0] // batch_size)


def _teacher_forwards_per_rank(blocks) -> list[int]:
    """The teacher's forwards on each of two ranks: every other training batch, then every other held-out one."""
    train, val = _batches(blocks.train), _batches(blocks.val)
    return [(train + 1) // 2 + (val + 1) // 2, train // 2 + val // 2]


def test_under_accelerate_launch_each_rank_computes_its_share_of_the_cache(tmp_path, heal_inputs):
    """Two gloo processes: each runs the teacher on half the training batches and half the held-out ones, the cache
    rank 0 writes equals the one a single process computes, and so do the held-out losses it records."""
    from safetensors.torch import load_file

    from nsc_prune.hf.train.trainer import evaluate_loss
    from nsc_prune.hf.weights.loading import load_pruned

    tiny, ckpt, data = heal_inputs
    cache, out = tmp_path / "teacher.safetensors", tmp_path / "healed"
    args = ["--max-steps", "1", "--teacher", str(tiny.base), "--teacher-logits", str(cache), "--teacher-top-k", "8"]
    args += ["--val-fraction", "0.3", "--bf16", "false"]  # as the reference below: auto is bf16 on AVX512-BF16 CPUs
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED_SCRIPT.format(ckpt=str(ckpt), data=str(data), out=str(out), args=args))
    run_two_processes(script, timeout=180)
    ranks = [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["code"] for r in ranks] == [0, 0]
    blocks = _blocks(ckpt, data, val_fraction=0.3)
    assert _batches(blocks.train) >= 4 and _batches(blocks.val) >= 3
    # (the Trainer's distillation steps use the cache, not the teacher: only the cache pass and the val loss run it)
    assert [r["teacher_forwards"] for r in ranks] == _teacher_forwards_per_rank(blocks)
    teacher = heal_module.load_teacher(tiny.base, torch.float32)
    config = TrainConfig(distill=True, bf16=False, batch_size=4, seq_len=16)
    alone = compute_teacher_logits(teacher, blocks, logits_key(tiny.base, ckpt, blocks, 8), config)
    shared = load_file(cache)
    assert torch.equal(shared["indices"], alone.indices)
    torch.testing.assert_close(shared["logprobs"], alone.logprobs, atol=2e-3, rtol=0)
    recovery = json.loads((out / RECORD_NAME).read_text())["recovery"]
    assert recovery["val_loss_teacher"] == pytest.approx(alone.record["val_loss_teacher"], rel=1e-5)
    student = load_pruned(ckpt, dtype=torch.float32)
    assert recovery["val_loss_before"] == pytest.approx(evaluate_loss(student, blocks.val, 4), rel=1e-5)


def test_under_accelerate_launch_a_cache_only_one_rank_has_is_computed_by_every_rank(tmp_path, heal_inputs):
    """Caches may be per node: when rank 0 finds the file and rank 1 does not, both compute their shares (a rank
    that skipped the pass would meet the others' sums in its training's collectives) and the run completes."""
    tiny, ckpt, data = heal_inputs
    args = ["--max-steps", "1", "--teacher", str(tiny.base), "--teacher-top-k", "8"]
    first = heal_cli(ckpt, data, tmp_path / "first", *args, "--teacher-logits", str(tmp_path / "cache.0.safetensors"))
    assert first == 0
    out = tmp_path / "healed"
    script = tmp_path / "launched.py"
    per_rank = [*args, "--teacher-logits", str(tmp_path / "cache.%RANK%.safetensors")]
    script.write_text(LAUNCHED_SCRIPT.format(ckpt=str(ckpt), data=str(data), out=str(out), args=per_rank))
    run_two_processes(script, timeout=180)
    ranks = [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in (0, 1)]
    blocks = _blocks(ckpt, data)
    assert [r["code"] for r in ranks] == [0, 0]
    assert [r["teacher_forwards"] for r in ranks] == _teacher_forwards_per_rank(blocks)
    assert not (tmp_path / "cache.1.safetensors").exists()  # rank 0 writes the cache, at its own path


def test_under_accelerate_launch_ranks_that_read_other_text_stop_in_one_line(tmp_path, heal_inputs):
    """Rank 1 reads another text: both ranks stop (rank 0 prints the line) before anything is loaded or written (they
    would train apart, or hang in a collective)."""
    tiny, ckpt, data = heal_inputs
    (tmp_path / "text.0.txt").write_text(data.read_text())
    (tmp_path / "text.1.txt").write_text(data.read_text() + "\n\nw3 w4 w5 w6 w7 w8 w9 w3 w4 w5")
    out, script = tmp_path / "healed", tmp_path / "launched.py"
    args = ["--max-steps", "1", "--teacher", str(tiny.base), "--teacher-logits", str(tmp_path / "cache.safetensors")]
    script.write_text(
        LAUNCHED_SCRIPT.format(ckpt=str(ckpt), data=str(tmp_path / "text.%RANK%.txt"), out=str(out), args=args)
    )
    done = run_two_processes(script, timeout=180)
    results = [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["code"] for r in results] == [2, 2] and [r["teacher_forwards"] for r in results] == [0, 0]
    line = "nsc-prune: error: the 2 processes disagree on the inputs of heal (weights, text, recipe) (rank 1 differs"
    assert done.stderr.count(line) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]  # rank 0's line
    assert not out.exists() and not (tmp_path / "cache.safetensors").exists()


@pytest.mark.parametrize(
    "metadata",
    [
        {"key": "x", "vocab_size": 8, "val_loss_teacher": 1.0},  # an AttributeError when keys were compared
        {"key": {}, "vocab_size": float("inf"), "val_loss_teacher": 1.0},  # an OverflowError
        {"key": {}, "vocab_size": 8},  # a KeyError after the cache was read
        {"key": {}, "vocab_size": 8, "val_loss_teacher": "x"},  # copied into the healed record
    ],
    ids=["key-a-string", "vocab-infinite", "no-teacher-loss", "teacher-loss-a-string"],
)
def test_a_cache_whose_metadata_was_edited_is_one_line(tmp_path, metadata):
    from safetensors.torch import save_file

    path = tmp_path / "t.safetensors"
    tensors = {"indices": torch.zeros(1, 3, 2, dtype=torch.int32), "logprobs": torch.zeros(1, 3, 2)}
    save_file(tensors, str(path), metadata={teacher_logits.METADATA_KEY: json.dumps(metadata)})
    with pytest.raises(InvalidInputError, match="is not a teacher-logits file written by nsc-prune heal"):
        load_teacher_logits(path, {}, None)


def test_a_full_disk_names_the_teacher_logits_file(tmp_path, monkeypatch):
    """safetensors' own error for a full disk names no file: the line said "could not write a safetensors file"."""
    from nsc_prune.hf.train import teacher_logits as module

    class SafetensorError(Exception):  # safetensors' type, by name
        pass

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("safetensors.torch.save_file", full)
    logits = module.TeacherLogits(torch.zeros(1, 3, 2, dtype=torch.int32), torch.zeros(1, 3, 2), {}, 8, {})
    path = tmp_path / "cache" / "t.safetensors"
    with pytest.raises(InvalidInputError, match=rf"could not write --teacher-logits {path} \(.*os error 28\)"):
        module.save_teacher_logits(logits, path)
    assert list(tmp_path.iterdir()) == []
