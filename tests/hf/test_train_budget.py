"""A time budget (issue 31, ``--minutes``): the run is sized from probe passes as computed by hand, then re-sized
from its own warm-up steps; warm-up never exceeds the run, too small a budget is refused before anything is
written, and a timed run interrupted and resumed (before or after the re-size) reaches the weights of an
uninterrupted one (the sizing is stored, never measured again)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from nsc_prune.errors import ConfigError, InvalidInputError  # noqa: E402
from nsc_prune.hf.train.budget import GROWTH_CAP, TimeBudget, probe, resize, size_run  # noqa: E402
from nsc_prune.hf.train.data import load_text_blocks  # noqa: E402
from nsc_prune.hf.train.recipe import WARMUP_FRACTION, TrainConfig  # noqa: E402
from nsc_prune.hf.train.schedule import WarmupCosine  # noqa: E402
from nsc_prune.hf.train.trainer import CHECKPOINTS_DIR, RUN_RECORD, train  # noqa: E402
from tests.conftest import _tokenizer  # noqa: E402
from tests.hf.test_train_trainer import SEQ, _Kill, corpus, recipe, tiny_model, trained  # noqa: E402


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    return load_text_blocks([corpus(tmp_path_factory.mktemp("data") / "a.txt")], _tokenizer(128), SEQ, val_fraction=0.1)


def fake_clock(tick: float):
    """A clock that advances ``tick`` seconds at every reading."""
    return itertools.count(0.0, tick).__next__


def two_speed_clock(probe_tick: float, step_tick: float):
    """A clock whose four probe readings are ``probe_tick`` apart (three passes) and every later reading
    ``step_tick`` later: a step, timed from its begin to its end, takes ``step_tick``."""
    ticks = itertools.chain(itertools.repeat(probe_tick, 3), itertools.repeat(step_tick))
    return itertools.accumulate(ticks, initial=0.0).__next__


def timed_run(path, blocks, config, minutes: float, clock, **kwargs):
    """``train`` of the tiny model under a ``minutes`` budget read on ``clock``."""
    budget = TimeBudget(minutes, clock=clock)
    return train(tiny_model(), blocks, config, path, progress=False, budget=budget, **kwargs)


def test_size_run_by_hand():
    # 30 s, a 4 s probe, 1 s a step: floor(26 / 1) = 26 steps; warm-up min(20, floor(2.6)) = 2.
    sized = size_run(0.5, 4.0, 1.0, 64, 20, 3)
    assert (sized.max_steps, sized.warmup_steps, sized.tokens_per_s) == (26, 2, 64.0)
    assert size_run(100, 0.0, 1.0, 64, 20, 3).warmup_steps == 20  # a long run keeps the recipe's warm-up
    assert size_run(0.1, 0.0, 0.6, 1, 5, 1).max_steps == 10  # 6 / 0.6 is 10 steps despite float rounding
    with pytest.raises(InvalidInputError, match=r"--minutes must be enough for one training step"):
        size_run(0.05, 2.5, 1.0, 64, 20, 3)  # 3 s - 2.5 s probe < one step


@pytest.mark.parametrize(
    ("steps", "warmup", "expected"), [(6, 20, 0), (12, 20, 1), (200, 20, 20), (1000, 20, 20), (50, 0, 0)]
)
def test_no_recipe_is_shorter_than_its_warm_up(steps, warmup, expected):
    """Timed or not: the default 20-step warm-up of a 6-step heal would never reach the learning rate; every
    recipe's warm-up is at most a tenth of its run (and a replace() re-applies the cap)."""
    config = TrainConfig(max_steps=steps, warmup_steps=warmup)
    assert config.warmup_steps == expected <= WARMUP_FRACTION * steps
    assert dataclasses.replace(TrainConfig(), max_steps=steps).warmup_steps == min(20, steps // 10)


def test_the_default_learning_rate_follows_lora_or_full_fine_tuning():
    from nsc_prune.hf.train.recipe import FULL_LEARNING_RATE, LORA_LEARNING_RATE

    assert (
        TrainConfig().learning_rate == LORA_LEARNING_RATE > TrainConfig(full=True).learning_rate == FULL_LEARNING_RATE
    )
    assert TrainConfig(full=True, learning_rate=2e-5).learning_rate == 2e-5  # a given one is kept
    assert TrainConfig.from_dict(TrainConfig(full=True).to_dict()) == TrainConfig(full=True)  # records round-trip


def test_warmup_never_exceeds_the_run_and_the_run_fits_the_budget():
    rng = random.Random(0)
    for _ in range(2000):
        minutes = 10 ** rng.uniform(-3, 3)
        step = 10 ** rng.uniform(-3, 2)
        spent = rng.uniform(0, 3) * step
        warmup = rng.randrange(0, 500)
        try:
            sized = size_run(minutes, spent, step, 128, warmup, 3)
        except InvalidInputError:
            assert minutes * 60 - spent < step * (1 + 1e-6)
            continue
        assert 1 <= sized.max_steps and 0 <= sized.warmup_steps <= min(warmup, sized.max_steps)
        assert sized.warmup_steps <= WARMUP_FRACTION * sized.max_steps
        assert spent + sized.max_steps * step <= minutes * 60 * (1 + 1e-9)
        assert spent + (sized.max_steps + 1) * step > minutes * 60


def test_probe_times_all_but_the_first_pass_and_refuses_early():
    calls = []
    seconds, per_step = probe(calls.append, TimeBudget(1.0, clock=fake_clock(2.0)))
    assert calls == [0, 1, 2] and (seconds, per_step) == (6.0, 2.0)  # read 0, 2, 4, 6: the last two passes timed
    calls.clear()
    with pytest.raises(InvalidInputError, match="--minutes must be enough"):
        probe(calls.append, TimeBudget(1 / 60, clock=fake_clock(1.0)))  # the first pass spends the 1 s
    assert calls == [0]  # refused before the other passes
    for bad in (0, -1, float("nan"), float("inf"), "2"):
        with pytest.raises(ConfigError, match="--minutes must be a number > 0"):
            TimeBudget(bad)


def test_a_timed_run_is_sized_by_hand_and_recorded(tmp_path, blocks):
    # Clock reads 0, 1, 2, 3 around the three probe passes: 3 s charged, 1 s a step. 0.25 min = 15 s: 12 steps,
    # warm-up min(5, floor(0.1 * 12)) = 1.
    budget = TimeBudget(0.25, clock=fake_clock(1.0))
    result = train(
        tiny_model(), blocks, recipe(max_steps=1000, warmup_steps=5), tmp_path, progress=False, budget=budget
    )
    assert result.steps == 12 and result.budget.max_steps == 12 and result.budget.warmup_steps == 1
    assert result.budget.tokens_per_s == 4 * 16 and result.probe_seconds == 3.0
    record = json.loads((tmp_path / CHECKPOINTS_DIR / RUN_RECORD).read_text())
    assert record["config"]["max_steps"] == 12 and record["config"]["warmup_steps"] == 1
    assert record["minutes"] == 0.25 and record["budget"]["max_steps"] == 12
    # The sized run is the untimed run of the same steps: same weights.
    plain = train(tiny_model(), blocks, recipe(max_steps=12, warmup_steps=1), tmp_path / "plain", progress=False)
    for name, value in trained(plain).items():
        torch.testing.assert_close(trained(result)[name], value, atol=0, rtol=0)


def test_too_small_a_budget_writes_nothing(tmp_path, blocks):
    with pytest.raises(InvalidInputError, match="--minutes must be enough for one training step"):
        train(
            tiny_model(),
            blocks,
            recipe(),
            tmp_path / "run",
            progress=False,
            budget=TimeBudget(2.5 / 60, clock=fake_clock(1.0)),
        )
    assert not (tmp_path / "run").exists()


def test_an_interrupted_timed_run_resumes_to_the_uninterrupted_weights(tmp_path, blocks):
    config = recipe(max_steps=1000, warmup_steps=5, save_steps=4)
    full = train(
        tiny_model(), blocks, config, tmp_path / "full", progress=False, budget=TimeBudget(0.25, clock=fake_clock(1.0))
    )
    cut = train(
        tiny_model(),
        blocks,
        config,
        tmp_path / "cut",
        progress=False,
        callbacks=[_Kill(5)],
        budget=TimeBudget(0.25, clock=fake_clock(1.0)),
    )
    assert cut.interrupted and cut.steps == 5
    # Resumed with a clock that would size the run differently: the stored sizing wins, nothing is measured.
    slow = TimeBudget(0.25, clock=fake_clock(3.0))
    resumed = train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, progress=False, budget=slow)
    assert resumed.steps == full.steps == 12 and resumed.probe_seconds == 0 and resumed.budget == full.budget
    for name, value in trained(full).items():
        torch.testing.assert_close(trained(resumed)[name], value, atol=1e-6, rtol=0)
    with pytest.raises(InvalidInputError, match=r"other settings \(minutes differ\)"):
        train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, budget=TimeBudget(0.3))
    with pytest.raises(InvalidInputError, match=r"other settings \(.*minutes differ\)"):
        train(tiny_model(), blocks, config, tmp_path / "cut", resume=True)
    assert math.isclose(full.budget.step_seconds, 1.0)


@pytest.mark.parametrize(("warmup", "horizon"), [(0, 10), (2, 36), (5, 76), (20, 21), (3, 3)])
def test_the_schedule_is_transformers_cosine_with_warmup(warmup, horizon):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    reference = transformers.get_cosine_schedule_with_warmup(optimizer, warmup, horizon).lr_lambdas[0]
    ours = WarmupCosine(warmup, horizon)
    assert [ours(step) for step in range(horizon + 2)] == [reference(step) for step in range(horizon + 2)]
    # The warm-up's rates (and the peak at its end) do not depend on the horizon: a re-size there is exact.
    assert [WarmupCosine(warmup, 10 * horizon + 1)(step) for step in range(warmup + 1)] == [
        ours(step) for step in range(warmup + 1)
    ]


def test_resize_by_hand():
    # The probe: 6 s, 2 s a step, 1 minute -> 27 steps, warm-up 2. The warm-up's steps: 3 s in all, 1.5 s a step
    # -> 2 + floor((60 - 6 - 3) / 1.5) = 36 steps; the throughput is now the run's.
    sized = size_run(1.0, 6.0, 2.0, 64, 5, 3)
    assert (sized.max_steps, sized.warmup_steps, sized.probe_max_steps, sized.resize_pending) == (27, 2, 27, True)
    grown = resize(sized, 2, 3.0, 1.5)
    assert (grown.max_steps, grown.probe_max_steps, grown.warmup_steps, grown.run_step_seconds) == (36, 27, 2, 1.5)
    assert grown.tokens_per_s == 64 / 1.5 and not grown.resize_pending and grown.step_cap == 36
    assert resize(sized, 2, 3.0, 0.01).max_steps == GROWTH_CAP * 27  # growth is capped
    assert resize(sized, 2, 60.0, 3.0).max_steps == 2  # the warm-up used the budget: stop there
    assert resize(sized, 2, 3.0, 4.0).max_steps == 2 + 12  # slower than the probe: the run shrinks
    assert type(sized).from_dict(grown.to_dict()) == grown
    assert not size_run(0.25, 3.0, 1.0, 64, 5, 3).resize_pending  # a warm-up of 1 step times nothing


def test_a_timed_run_re_sizes_itself_at_the_end_of_its_warm_up(tmp_path, blocks):
    """Probe passes 2 s, real steps 1.5 s: the probe's 27 steps grow to 36 at the end of the 2-step warm-up,
    the record a resume reads says so, and the weights are those of an untimed 36-step run with that warm-up."""
    config = recipe(max_steps=1000, warmup_steps=5)
    result = timed_run(tmp_path / "timed", blocks, config, 1.0, two_speed_clock(2.0, 1.5))
    assert result.steps == 36 and (result.budget.probe_max_steps, result.budget.max_steps) == (27, 36)
    assert result.budget.warmup_steps == 2 and result.budget.run_step_seconds == 1.5
    record = json.loads((tmp_path / "timed" / CHECKPOINTS_DIR / RUN_RECORD).read_text())
    assert (record["budget"]["max_steps"], record["config"]["max_steps"]) == (36, 27)
    plain = train(tiny_model(), blocks, recipe(max_steps=36, warmup_steps=2), tmp_path / "plain", progress=False)
    for name, value in trained(plain).items():
        torch.testing.assert_close(trained(result)[name], value, atol=0, rtol=0)


@pytest.mark.parametrize("stop_at", [2, 7])
def test_a_timed_run_stopped_before_or_after_its_re_size_resumes_to_the_same_weights(tmp_path, blocks, stop_at):
    """2 minutes, probe 2 s a pass -> 57 steps, warm-up 5; steps of 1.5 s re-size it to 5 + floor(106.5 / 1.5)
    = 76. Stopped at step 2 the resumed part times steps 4-5 and counts steps 1-2 at their rate: the same 76.
    Stopped at step 7 the stored re-size is read back, whatever the clock now says."""
    config = recipe(max_steps=1000, warmup_steps=5, save_steps=100)
    full = timed_run(tmp_path / "full", blocks, config, 2.0, two_speed_clock(2.0, 1.5))
    assert full.steps == 76 and full.budget.probe_max_steps == 57
    cut = timed_run(tmp_path / "cut", blocks, config, 2.0, two_speed_clock(2.0, 1.5), callbacks=[_Kill(stop_at)])
    assert cut.interrupted and cut.steps == stop_at and cut.budget.resize_pending == (stop_at < 5)
    later = TimeBudget(2.0, clock=itertools.count(0.0, 1.5).__next__)  # no probe on a resume: every reading 1.5 s
    resumed = train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, progress=False, budget=later)
    assert resumed.steps == 76 and resumed.budget == full.budget and resumed.probe_seconds == 0
    for name, value in trained(full).items():
        torch.testing.assert_close(trained(resumed)[name], value, atol=1e-6, rtol=0)
