"""Progress bars of the long steps (issue 22): extraction, calibration, psi_W and held-out loss open a tqdm bar
(rate and ETA; drawn on a terminal only), and ``--quiet`` (``nsc_prune.hf.progress.quiet``) silences every one."""

from __future__ import annotations

import logging

import pytest

tqdm = pytest.importorskip("tqdm")
pytest.importorskip("torch")

from nsc_prune.cli import main  # noqa: E402
from nsc_prune.hf import progress as progress_module  # noqa: E402
from nsc_prune.hf.progress import is_quiet, library_bars, progress, quiet, quiet_logger  # noqa: E402


@pytest.fixture
def bars(monkeypatch):
    """The (desc, unit, disable) of every tqdm bar opened, in order (the bars themselves still run)."""
    opened = []
    real = tqdm.tqdm

    def recording(iterable=None, **kwargs):
        opened.append((kwargs.get("desc"), kwargs.get("unit"), kwargs.get("disable")))
        return real(iterable, **kwargs)

    monkeypatch.setattr(progress_module, "_tqdm", lambda: recording)
    return opened


def test_a_bar_only_outside_quiet(bars):
    assert list(progress(range(3), "extract", "tensor")) == [0, 1, 2]
    assert bars == [("extract", "tensor", None)]  # disable=None: drawn on a terminal only
    with quiet():
        assert is_quiet() and progress(range(3), "extract", "tensor") == range(3)
    assert not is_quiet() and len(bars) == 1


@pytest.mark.parametrize("flags, expected", [([], True), (["--quiet"], False)], ids=["bars", "quiet"])
def test_extract_calibration_and_writing_show_bars_unless_quiet(
    tmp_path, tiny_llama, write_plan, bars, flags, expected
):
    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 40}, {"ffn": 96}, {"ffn": 17}], tiny.config)
    calib = tmp_path / "calib.txt"
    calib.write_text(" ".join(f"w{3 + i % 100}" for i in range(200)))
    argv = ["extract", "--pareto", str(plan), "--base", str(tiny.base), "--out", str(tmp_path / "out")]
    assert main([*argv, "--calib", str(calib), "--calib-tokens", "128", *flags]) == 0
    names = {(desc, unit) for desc, unit, _ in bars}
    assert ({("calibration", "layer"), ("extract", "tensor")} <= names) == expected, bars
    assert expected or not names
    assert not is_quiet()  # --quiet holds for its command only


def test_held_out_loss_and_psi_w_use_the_bar(tmp_path, tiny_llama, bars):
    import torch

    from nsc_prune.hf.score.psi_w import layer_weight_tables
    from nsc_prune.hf.train.trainer import evaluate_loss

    tiny = tiny_llama(lora=False)
    model = __import__("transformers").AutoModelForCausalLM.from_pretrained(tiny.base)
    evaluate_loss(model, torch.randint(3, 100, (4, 8)), batch_size=2)
    layer_weight_tables(tiny.base, tiny.config, cache_dir=tmp_path / "cache")
    assert [(d, u) for d, u, _ in bars] == [("held-out loss", "batch"), ("psi_W", "layer")]


def test_a_command_into_a_log_flushes_stdout_by_line_and_shows_bars_as_lines(monkeypatch, capsys):
    """In a batch job's log, stdout was block-buffered (nothing for minutes, all of it lost to a SIGKILL) and the
    weight steps showed no progress at all; each bar is now a plain line when it starts and at most once a minute."""
    import sys

    import nsc_prune.cli.search as search

    seen = []

    def run(args):
        seen.append(sys.stdout.line_buffering)
        assert list(progress(range(3), "extract", "tensor")) == [0, 1, 2]
        return 0

    monkeypatch.setattr(search, "run", run)
    assert main(["--model", "llama-7b", "--budget", "5B"]) == 0  # capsys: neither stdout nor stderr is a terminal
    assert seen == [True] and not sys.stdout.line_buffering  # as it was, after the command
    err = capsys.readouterr().err
    assert err == "nsc-prune: extract: 0/3 tensor, 00:00 elapsed, ? left\n", err  # no carriage return
    assert list(progress(range(3), "extract", "tensor")) == [0, 1, 2] and capsys.readouterr().err == ""  # a library


def test_a_training_log_line_says_the_step_of_the_total_and_the_time_left_from_this_process_steps():
    """A resumed run (from step 40) times only its own steps: 10 steps in 20 s leave 50 steps, 100 s."""
    from nsc_prune.hf.train.callbacks import LogLines

    now = [1000.0]
    lines = LogLines(clock=lambda: now[0])
    lines.began, lines.first_step = now[0], 40
    now[0] += 20.0
    logs = {"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 0.5, "num_input_tokens_seen": 51200}
    assert lines.line({**logs, "train_tokens_per_second": 512.0}, 50, 100) == (
        "step 50/100: loss 2.5000, learning rate 0.0001, grad norm 0.5, 51,200 tokens (512 tokens/s), "
        "00:20 elapsed, 01:40 left"
    )
    assert lines.line({"eval_loss": 2.25}, 50, 100) == "step 50/100: held-out loss 2.2500"
    done = lines.line({"train_loss": 2.5, "train_runtime": 20.0}, 50, 100)  # a run shorter than --logging-steps
    assert done == "step 50/100: done, mean loss 2.5000, 00:20 elapsed"  # printed nothing before: one line at the end
    lines.first_step = 50  # no step of its own yet: no time left to tell
    assert lines.line({"loss": 2.5}, 50, 100) == "step 50/100: loss 2.5000, 00:20 elapsed, ? left"


def test_a_jupyter_kernel_shows_the_bars_its_stderr_would_hide(monkeypatch, bars):
    """In a notebook stderr is not a terminal: extraction, calibration and psi_W drew no bar there, for minutes."""
    import sys
    import types

    assert progress_module.bar_settings()["disable"] is None  # off a terminal here: tqdm draws none
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert progress_module.bar_settings()["disable"] is False
    assert list(progress(range(2), "extract", "tensor")) == [0, 1] and bars == [("extract", "tensor", False)]
    with quiet():
        assert progress(range(2), "extract", "tensor") == range(2)  # --quiet, or progress off, still wins


def test_a_timed_run_s_lines_count_to_its_sizing_not_the_trainer_s_cap(capsys):
    """A --minutes run's first lines said step 5/2,732 (the cap re-sizing may grow to) where it was sized at 1,004."""
    from types import SimpleNamespace

    from nsc_prune.hf.train.callbacks import LogLines

    state = SimpleNamespace(is_world_process_zero=True, global_step=5, max_steps=2732)
    lines = LogLines(clock=lambda: 10.0, planned=lambda: 1004)
    lines.on_train_begin(None, SimpleNamespace(global_step=0), None)
    lines.on_log(None, state, None, logs={"loss": 3.0})
    assert capsys.readouterr().out.startswith("step 5/1,004: loss 3.0000")


def test_a_librarys_plain_tqdm_bar_follows_ours_and_tqdm_is_as_it_was_after(monkeypatch):
    """transformers' GGUF conversion opens tqdm(...) without a ``disable``: no switch of its own reaches it, so a
    log got its carriage-return redraws (and --quiet did too)."""
    from nsc_prune.hf.progress import plain_bars

    monkeypatch.setattr(progress_module, "bars_seen", lambda: False)  # a log
    with plain_bars():
        assert tqdm.tqdm(range(2)).disable and not tqdm.tqdm(range(2), disable=False).disable  # an explicit one wins
    monkeypatch.setattr(progress_module, "bars_seen", lambda: True)  # a terminal
    with plain_bars():
        assert not tqdm.tqdm(range(2)).disable
        with quiet():
            assert not tqdm.tqdm(range(2)).disable  # decided when the block opened
    with quiet(), plain_bars():
        assert tqdm.tqdm(range(2)).disable
    assert not tqdm.tqdm(range(2)).disable and "__init__" in vars(tqdm.std.tqdm)


def test_a_library_call_asking_for_bars_stays_quiet_under_an_outer_quiet():
    with quiet():
        with quiet(False):  # a library call's progress=True under the CLI's --quiet
            assert is_quiet() and progress(range(2), "x", "y") == range(2)
        assert is_quiet()
    with quiet(False):
        assert not is_quiet()


def test_a_bar_over_an_iterator_knows_its_total_and_so_its_time_left(monkeypatch):
    totals = []
    real = tqdm.tqdm
    monkeypatch.setattr(progress_module, "_tqdm", lambda: lambda it, **kw: totals.append(kw["total"]) or real(it, **kw))
    assert list(progress(iter("abc"), "tokenizing", "document", total=3)) == ["a", "b", "c"]
    assert totals == [3]


def test_a_quieted_logger_is_at_its_level_after(monkeypatch):
    logger = logging.getLogger("nsc_prune.tests.quiet_logger")
    monkeypatch.setattr(logger, "level", 15)  # a level no code names; restored after the test
    with quiet_logger(logger.name, logging.ERROR):
        assert logger.level == logging.ERROR
    assert logger.level == 15


def test_transformers_bars_are_off_in_a_log_and_back_after(monkeypatch, transformers_bars_on):
    hf_logging = transformers_bars_on
    monkeypatch.setattr(progress_module, "bars_seen", lambda: False)  # a log, not quiet
    with library_bars():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    monkeypatch.setattr(progress_module, "bars_seen", lambda: True)  # a terminal
    with library_bars():
        assert hf_logging.is_progress_bar_enabled()
