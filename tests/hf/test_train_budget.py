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
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from nsc_prune.errors import ConfigError, InvalidInputError  # noqa: E402
from nsc_prune.hf.train.budget import GROWTH_CAP, TimeBudget, probe, resize, size_run  # noqa: E402
from nsc_prune.hf.train.data import load_text_blocks  # noqa: E402
from nsc_prune.hf.train.recipe import WARMUP_FRACTION, TrainConfig  # noqa: E402
from nsc_prune.hf.train.resume import CHECKPOINTS_DIR, RUN_RECORD  # noqa: E402
from nsc_prune.hf.train.schedule import WarmupCosine, WarmupStableDecay  # noqa: E402
from nsc_prune.hf.train.trainer import train  # noqa: E402
from tests.conftest import _tokenizer  # noqa: E402
from tests.hf.conftest import sigterm_at  # noqa: E402
from tests.hf.test_train_trainer import SEQ, corpus, recipe, tiny_model, trained  # noqa: E402


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    return load_text_blocks(
        [corpus(tmp_path_factory.mktemp("data") / "a.jsonl")], _tokenizer(128), SEQ, val_fraction=0.1
    )


def fake_clock(tick: float):
    """A clock that advances ``tick`` seconds at every reading."""
    return itertools.count(0.0, tick).__next__


def two_speed_clock(probe_tick: float, step_tick: float):
    """A clock whose four probe readings are ``probe_tick`` apart (three passes) and every later reading
    ``step_tick`` later: the run's first step begins ``step_tick`` after the probe, and every step ends
    ``step_tick`` after the one before."""
    ticks = itertools.chain(itertools.repeat(probe_tick, 3), itertools.repeat(step_tick))
    return itertools.accumulate(ticks, initial=0.0).__next__


def stepped_clock(probe_tick: float, step_seconds, between: float = 0.0):
    """A clock whose four probe readings are ``probe_tick`` apart (three passes), then the first step's begin
    reading right after, and for each step ``n`` (from 1) an end reading ``step_seconds(n)`` after the step
    before, plus ``between`` seconds spent between steps (evaluation, checkpoints) from step 2 on."""
    ends = (step_seconds(n) + (between if n > 1 else 0.0) for n in itertools.count(1))
    ticks = itertools.chain(itertools.repeat(probe_tick, 3), [0.0], ends)
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
    assert size_run(0.005, 0.0, 0.1, 1, 0, 1).max_steps == 3  # 0.3 / 0.1 is 2.9999999999999996 in floats
    unprobed = size_run(100, 0.0, 1.0, 64, 20, 3)  # an injected clock can read a 0 s probe
    assert type(unprobed).from_dict(unprobed.to_dict()) == unprobed
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
    assert probe(lambda step: None, TimeBudget(1.0, passes=1, clock=fake_clock(2.0))) == (2.0, 2.0)  # its only pass
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


def test_a_timed_run_keeps_the_warm_up_asked_beyond_its_placeholder_steps(tmp_path, blocks):
    """A recipe caps its warm-up at a tenth of its max_steps, a placeholder under --minutes: --warmup-steps 300
    with a default 1000-step recipe warmed up 100 steps of a run sized to thousands. The sized run caps it now."""
    import argparse

    from nsc_prune.cli.parser import time_budget

    assert time_budget(argparse.Namespace(minutes=30), {"warmup_steps": 300}).warmup_steps == 300
    # 1 min on a 1 s clock: 3 s of probe, then 57 steps; the recipe of 10 steps kept 1 of its 5 warm-up steps
    config = recipe(max_steps=10, warmup_steps=5)
    budget = TimeBudget(1.0, clock=fake_clock(1.0), warmup_steps=5)
    result = train(tiny_model(), blocks, config, tmp_path, progress=False, budget=budget)
    assert config.warmup_steps == 1 and result.budget.probe_max_steps == 57 and result.budget.warmup_steps == 5
    with pytest.raises(ConfigError, match="warmup_steps must be an integer >= 0"):
        TimeBudget(1.0, warmup_steps=-1)


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
    # cosine with a 1-step warm-up: nothing to re-size, the probe's sizing is settled and stored (a wsd run would
    # go on re-sizing from its own steps after a resume: the wsd tests below)
    config = recipe(max_steps=1000, warmup_steps=5, save_steps=4, schedule="cosine")
    full = train(
        tiny_model(), blocks, config, tmp_path / "full", progress=False, budget=TimeBudget(0.25, clock=fake_clock(1.0))
    )
    cut = train(
        tiny_model(),
        blocks,
        config,
        tmp_path / "cut",
        progress=False,
        callbacks=[sigterm_at(5)],
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
    for other in (dataclasses.replace(config, warmup_steps=3), config):  # the stored sizing replaced the asked one
        warmup = None if other.warmup_steps == 3 else 7
        with pytest.raises(InvalidInputError, match=r"other settings \(warmup_steps differ\)"):
            train(
                tiny_model(), blocks, other, tmp_path / "cut", resume=True, budget=TimeBudget(0.25, warmup_steps=warmup)
            )
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


@pytest.mark.parametrize(
    ("warmup", "horizon"), [(0, 10), (2, 36), (5, 76), (1, 3), (0, 1), (7, 75), (11, 13), (5, 5)]
)  # (11, 13), (5, 5): a timed run re-sized after its warm-up to a run the decay fraction does not fit after it
def test_wsd_is_transformers_wsd_with_1_sqrt_decay(warmup, horizon):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ours = WarmupStableDecay(warmup, horizon)
    decay = WarmupStableDecay.decay_steps(warmup, horizon)
    reference = transformers.get_wsd_schedule(
        optimizer, warmup, decay, num_training_steps=horizon, decay_type="1-sqrt"
    ).lr_lambdas[0]
    assert [ours(step) for step in range(horizon + 2)] == [reference(step) for step in range(horizon + 2)]
    assert (
        decay == min(max(1, round(0.2 * horizon)), horizon - warmup) and ours.decay_start == horizon - decay >= warmup
    )


def test_the_default_schedule_is_wsd_and_an_unknown_one_is_refused():
    assert TrainConfig().schedule == "wsd" and TrainConfig(schedule="cosine").schedule == "cosine"
    with pytest.raises(ConfigError, match=r"schedule must be one of cosine, wsd; got 'linear'"):
        TrainConfig(schedule="linear")


def test_a_re_size_keeps_every_rate_already_run():
    """Re-sized after ``step`` steps to any longer horizon ``fit_horizon`` allows, a schedule gives the rates of
    steps 0..step (the next one's included: the scheduler has set it) of the schedule it was; and no other step
    may be re-sized: cosine only at the warm-up's end, wsd from there to its decay's first step."""
    for kind in (WarmupCosine, WarmupStableDecay):
        for warmup, horizon in [(0, 10), (2, 27), (5, 57), (7, 75)]:
            planned = kind(warmup, horizon)
            steps = [step for step in range(horizon + 1) if planned.resizable(step)]
            expected = [warmup] if kind is WarmupCosine else list(range(warmup, planned.decay_start + 1))
            assert steps == expected
            for step in steps:
                for asked in range(step + 1, 3 * horizon):
                    moved = kind(warmup, planned.fit_horizon(step, asked))
                    assert moved.horizon >= asked if kind is WarmupCosine else moved.decay_start >= step
                    assert [moved(i) for i in range(step + 1)] == [planned(i) for i in range(step + 1)]
    # re-sized after 21 steps to 10: the shortest run whose decay starts at step 21, 26 - round(0.2 x 26) = 21
    assert WarmupStableDecay(2, 27).fit_horizon(21, 10) == 26 and WarmupStableDecay(2, 27).fit_horizon(21, 40) == 40


def test_resize_by_hand():
    # The probe: 6 s, 2 s a step, 1 minute -> 27 steps, warm-up 2. The warm-up's steps: 3 s in all, 1.5 s a step
    # -> 2 + floor((60 - 6 - 3) / 1.5) = 36 steps; the throughput is now the run's.
    sized = size_run(1.0, 6.0, 2.0, 64, 5, 3)
    assert (sized.max_steps, sized.warmup_steps, sized.probe_max_steps, sized.settled) == (27, 2, 27, False)
    grown = resize(sized, 2, 3.0, 1.5)
    assert (grown.max_steps, grown.probe_max_steps, grown.warmup_steps, grown.run_step_seconds) == (36, 27, 2, 1.5)
    assert grown.tokens_per_s == 64 / 1.5 and not grown.settled and grown.step_cap == GROWTH_CAP * 27
    settled = dataclasses.replace(grown, settled=True)  # the trainer settles it where the schedule says
    assert settled.step_cap == 36
    assert resize(grown, 9, 13.5, 0.01).max_steps == GROWTH_CAP * 27  # growth is capped by the probe's count
    assert resize(sized, 2, 3.0, 0.01).max_steps == GROWTH_CAP * 27
    assert resize(sized, 2, 60.0, 3.0).max_steps == 2  # the warm-up used the budget: stop there
    assert resize(sized, 2, 3.0, 4.0).max_steps == 2 + 12  # slower than the probe: the run shrinks
    assert type(sized).from_dict(settled.to_dict()) == settled


@pytest.mark.parametrize(
    "edit, said",
    [
        ("x", "the sizing must be an object; got 'x'"),
        ({"max_steps": "x"}, "its sizing's 'max_steps' is 'x'"),  # an internal sentinel's repr in the message
        ({"max_steps": 0}, "its sizing's 'max_steps' is 0"),
        ({"step_seconds": None}, "its sizing's 'step_seconds' is missing"),
        ({"minutes": None}, "its sizing's 'minutes' is missing"),  # a TypeError when the run re-sized itself
        ({"probe_passes": "x"}, "its sizing's 'probe_passes' is 'x'"),
        ({"settled": 1}, "its sizing's 'settled' is 1"),
        ({"run_step_seconds": -1.0}, "its sizing's 'run_step_seconds' is -1.0"),
    ],
)
def test_a_stored_sizing_of_another_shape_is_named(edit, said):
    sized = size_run(2.0, 1.0, 2.0, 64, 5, 1)
    stored = sized.to_dict()
    assert type(sized).from_dict(stored) == sized
    if isinstance(edit, dict):
        stored = {k: v for k, v in {**stored, **edit}.items() if v is not None}
    with pytest.raises(ValueError, match=re.escape(said)):
        type(sized).from_dict(stored if isinstance(edit, dict) else edit)


def test_a_timed_run_re_sizes_itself_at_the_end_of_its_warm_up(tmp_path, blocks):
    """Probe passes 2 s, real steps 1.5 s: the probe's 27 steps grow to 36 at the end of the 2-step warm-up,
    the record a resume reads says so, and the weights are those of an untimed 36-step run with that warm-up."""
    config = recipe(max_steps=1000, warmup_steps=5, schedule="cosine")
    result = timed_run(tmp_path / "timed", blocks, config, 1.0, two_speed_clock(2.0, 1.5))
    assert result.steps == 36 and (result.budget.probe_max_steps, result.budget.max_steps) == (27, 36)
    assert result.budget.warmup_steps == 2 and result.budget.run_step_seconds == 1.5
    record = json.loads((tmp_path / "timed" / CHECKPOINTS_DIR / RUN_RECORD).read_text())
    assert (record["budget"]["max_steps"], record["config"]["max_steps"]) == (36, 27)
    plain = train(
        tiny_model(),
        blocks,
        recipe(max_steps=36, warmup_steps=2, schedule="cosine"),
        tmp_path / "plain",
        progress=False,
    )
    for name, value in trained(plain).items():
        torch.testing.assert_close(trained(result)[name], value, atol=0, rtol=0)


@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_probe_recomputes_activations_as_the_steps_do(tmp_path, blocks, monkeypatch, checkpointing):
    """transformers turns activation checkpointing on in Trainer.train(); the probe ran before it, so on a GPU (where
    ``auto`` turns it on) the probe held every layer's activations (out of memory where the run fits) and timed
    steps without the recomputation."""
    from nsc_prune.hf.train import trainer as trainer_module

    seen = {"probe": set(), "steps": set()}
    phase = ["steps"]
    measure, forward = trainer_module.measure_budget, trainer_module.forward_logits

    def probing(*args, **kwargs):
        phase[0] = "probe"
        try:
            return measure(*args, **kwargs)
        finally:
            phase[0] = "steps"

    def watched(model, ids):
        seen[phase[0]].add(model.get_base_model().is_gradient_checkpointing)
        return forward(model, ids)

    monkeypatch.setattr(trainer_module, "measure_budget", probing)
    monkeypatch.setattr(trainer_module, "forward_logits", watched)
    config = recipe(max_steps=1000, warmup_steps=5, schedule="cosine", gradient_checkpointing=checkpointing)
    timed_run(tmp_path / "timed", blocks, config, 0.2, two_speed_clock(2.0, 1.5))
    assert seen == {"probe": {checkpointing}, "steps": {checkpointing}}


def test_a_timed_runs_tokens_per_second_counts_the_tokens_its_timed_steps_held(tmp_path, blocks):
    """A batch of more than half the blocks: step 1 holds ``batch`` blocks, step 2 the pass's other ``N - batch``.
    The cosine run re-sizes at its warm-up's end (step 2) from step 2 alone (1.5 s): its tokens/s is that step's
    tokens over 1.5 s; it was ``batch`` full blocks' (up to twice too high)."""
    rows = blocks.train.shape[0]
    batch = rows // 2 + 1
    config = recipe(max_steps=1000, warmup_steps=5, schedule="cosine", batch_size=batch)
    result = timed_run(tmp_path / "timed", blocks, config, 1.0, two_speed_clock(2.0, 1.5))
    assert result.budget.run_step_seconds == 1.5 and result.budget.warmup_steps == 2
    assert result.budget.run_step_tokens == (rows - batch) * SEQ
    assert result.budget.tokens_per_s == pytest.approx((rows - batch) * SEQ / 1.5)
    assert result.budget.to_dict()["tokens_per_s"] == round((rows - batch) * SEQ / 1.5, 1)


@pytest.mark.parametrize("stop_at", [2, 7])
def test_a_timed_run_stopped_before_or_after_its_re_size_resumes_to_the_same_weights(tmp_path, blocks, stop_at):
    """2 minutes, probe 2 s a pass -> 57 steps, warm-up 5; steps of 1.5 s re-size it to 5 + floor(106.5 / 1.5)
    = 76. Stopped at step 2 the resumed part times steps 4-5 and counts steps 1-2 at their rate: the same 76.
    Stopped at step 7 the stored re-size is read back, whatever the clock now says."""
    config = recipe(max_steps=1000, warmup_steps=5, save_steps=100, schedule="cosine")
    full = timed_run(tmp_path / "full", blocks, config, 2.0, two_speed_clock(2.0, 1.5))
    assert full.steps == 76 and full.budget.probe_max_steps == 57
    cut = timed_run(tmp_path / "cut", blocks, config, 2.0, two_speed_clock(2.0, 1.5), callbacks=[sigterm_at(stop_at)])
    assert cut.interrupted and cut.steps == stop_at and cut.budget.settled == (stop_at >= 5)
    later = TimeBudget(2.0, clock=itertools.count(0.0, 1.5).__next__)  # no probe on a resume: every reading 1.5 s
    resumed = train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, progress=False, budget=later)
    assert resumed.steps == 76 and resumed.budget == full.budget and resumed.probe_seconds == 0
    for name, value in trained(full).items():
        torch.testing.assert_close(trained(resumed)[name], value, atol=1e-6, rtol=0)


def test_a_wsd_run_re_sizes_itself_until_its_decay_and_fills_the_budget(tmp_path, blocks):
    """1 minute, probe passes 2 s (27 steps, warm-up 2); the first 4 steps take 2 s, the later ones 1 s, as a
    CPU's first steps are slower. Cosine re-sizes only at the warm-up's end, from two 2 s steps: 2 + floor((60 -
    6 - 4) / 2) = 27 steps, 37 of the 60 s. wsd re-sizes after every step until its decay begins: after step 39
    (43 s spent; steps 2-39 took 41 / 38 s each) 39 + floor(11 / (41 / 38)) = 49 steps, whose decay starts at
    49 - round(9.8) = 39: settled, 59 of the 60 s. Its weights are those of an untimed 49-step wsd run."""
    config = recipe(max_steps=1000, warmup_steps=5, schedule="cosine")
    slow_start = lambda n: 2.0 if n <= 4 else 1.0  # noqa: E731
    cosine = timed_run(tmp_path / "cosine", blocks, config, 1.0, stepped_clock(2.0, slow_start))
    assert cosine.steps == 27 and cosine.budget.run_step_seconds == 2.0 and cosine.budget.settled
    wsd = dataclasses.replace(config, schedule="wsd")
    timed = timed_run(tmp_path / "wsd", blocks, wsd, 1.0, stepped_clock(2.0, slow_start))
    assert timed.steps == 49 and (timed.budget.probe_max_steps, timed.budget.max_steps) == (27, 49)
    assert timed.budget.settled and timed.budget.run_step_seconds == pytest.approx(41 / 38)
    record = json.loads((tmp_path / "wsd" / CHECKPOINTS_DIR / RUN_RECORD).read_text())
    assert record["budget"]["max_steps"] == 49 and record["budget"]["settled"]
    plain = train(
        tiny_model(), blocks, recipe(max_steps=49, warmup_steps=2, schedule="wsd"), tmp_path / "plain", progress=False
    )
    for name, value in trained(plain).items():
        torch.testing.assert_close(trained(timed)[name], value, atol=0, rtol=0)


@pytest.mark.parametrize(("between", "steps"), [(0.0, 54), (0.5, 36)])
def test_the_time_between_steps_is_charged_to_the_budget(tmp_path, blocks, between, steps):
    """1 minute, probe passes 2 s (27 steps), steps of 1 s. With nothing between them the run grows to the cap,
    twice the probe's count (54 steps, 6 + 54 = 60 s). With 0.5 s of evaluation and checkpoint writes between
    steps a step costs 1.5 s: 36 steps, 6 + 1 + 35 x 1.5 = 59.5 s, where timing the steps alone would have run 54
    steps into 6 + 54 + 53 x 0.5 = 86.5 s."""
    config = recipe(max_steps=1000, warmup_steps=5, schedule="wsd")
    timed = timed_run(tmp_path / "run", blocks, config, 1.0, stepped_clock(2.0, lambda n: 1.0, between))
    assert timed.steps == steps and timed.budget.settled
    assert timed.budget.run_step_seconds == pytest.approx(1.0 + between)
    assert 6 + 1 + (steps - 1) * (1.0 + between) <= 60


@pytest.mark.parametrize("stop_at", [7, 32])
def test_a_wsd_run_stopped_before_or_in_its_decay_resumes_to_the_same_weights(tmp_path, blocks, stop_at):
    """Steps of 1.5 s: 36 steps (decay from step 29). Stopped at step 7 the resumed part keeps re-sizing, counting
    the 7 steps it did not time at its own steps' rate: the same 36; stopped at step 32 the settled sizing is read
    back."""
    config = recipe(max_steps=1000, warmup_steps=5, save_steps=100, schedule="wsd")
    full = timed_run(tmp_path / "full", blocks, config, 1.0, two_speed_clock(2.0, 1.5))
    assert full.steps == 36 and full.budget.settled
    cut = timed_run(tmp_path / "cut", blocks, config, 1.0, two_speed_clock(2.0, 1.5), callbacks=[sigterm_at(stop_at)])
    assert cut.interrupted and cut.steps == stop_at and cut.budget.settled == (stop_at > 29)
    later = TimeBudget(1.0, clock=itertools.count(0.0, 1.5).__next__)
    resumed = train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, progress=False, budget=later)
    # the tokens of the steps the resumed process timed are its own (stopped at 7, steps 9-29 against 2-29)
    assert resumed.steps == 36 and dataclasses.replace(resumed.budget, run_step_tokens=None) == dataclasses.replace(
        full.budget, run_step_tokens=None
    )
    for name, value in trained(full).items():
        torch.testing.assert_close(trained(resumed)[name], value, atol=1e-6, rtol=0)


class _Crash(transformers.TrainerCallback):
    """Raises at the end of step ``at``, before any checkpoint of that step: a crash, not a SIGTERM."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise RuntimeError("crash")


def test_a_crashed_wsd_run_resumes_from_an_older_checkpoint_to_the_same_weights(tmp_path, blocks):
    """The sizing is stored at every re-size, a checkpoint every 12 steps: crashed at step 41 (settled at 49
    steps after step 39, as in the test above), the run resumes from step 36's checkpoint, whose scheduler holds
    an older horizon. The stored sizing wins: the decay and the weights are the uninterrupted run's."""
    config = recipe(max_steps=1000, warmup_steps=5, save_steps=12, schedule="wsd")
    slow_start = lambda n: 2.0 if n <= 4 else 1.0  # noqa: E731
    full = timed_run(tmp_path / "full", blocks, config, 1.0, stepped_clock(2.0, slow_start))
    with pytest.raises(RuntimeError, match="crash"):
        timed_run(tmp_path / "cut", blocks, config, 1.0, stepped_clock(2.0, slow_start), callbacks=[_Crash(41)])
    assert (tmp_path / "cut" / CHECKPOINTS_DIR / "checkpoint-36").is_dir()
    later = TimeBudget(1.0, clock=itertools.count(0.0, 1.0).__next__)
    resumed = train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, progress=False, budget=later)
    assert resumed.steps == full.steps == 49 and resumed.budget == full.budget
    for name, value in trained(full).items():
        torch.testing.assert_close(trained(resumed)[name], value, atol=1e-6, rtol=0)


def test_a_cosine_run_resumed_at_its_last_warm_up_step_keeps_the_probes_count(tmp_path, blocks):
    """Stopped after step 4 of a 5-step warm-up, the resumed part times only step 5 (its first, which also
    allocates): nothing to re-size from, so the probe's 57 steps stand, settled, and the run stops there rather
    than at the loop's cap (twice the probe's count) with its cosine past its horizon."""
    config = recipe(max_steps=1000, warmup_steps=5, save_steps=100, schedule="cosine")
    cut = timed_run(tmp_path / "cut", blocks, config, 2.0, two_speed_clock(2.0, 1.5), callbacks=[sigterm_at(4)])
    assert cut.interrupted and cut.steps == 4 and not cut.budget.settled
    later = TimeBudget(2.0, clock=itertools.count(0.0, 1.5).__next__)
    resumed = train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, progress=False, budget=later)
    assert resumed.steps == resumed.budget.max_steps == 57 and resumed.budget.settled
    assert resumed.budget.run_step_seconds is None


def test_a_re_size_that_finds_the_budget_spent_stops_at_that_step(tmp_path, blocks):
    """Steps of 1 s then 60 s: at the warm-up's end (step 2) the budget is spent, so the run stops there,
    not one step later (the Trainer's own stop check ran before the re-size)."""
    config = recipe(max_steps=1000, warmup_steps=5, schedule="cosine")
    result = timed_run(tmp_path / "run", blocks, config, 1.0, stepped_clock(2.0, lambda n: 1.0 if n == 1 else 60.0))
    assert result.budget.max_steps == 2 and result.steps == 2
