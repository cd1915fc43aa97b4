"""The trainer (issue 13): it learns, subnet contexts average, SIGTERM + resume reproduces an uninterrupted run,
a resume with other settings is refused, and two processes under ``accelerate launch`` match one."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("accelerate")

from safetensors.torch import load_file  # noqa: E402

from nsc_prune.errors import ConfigError, InvalidInputError  # noqa: E402
from nsc_prune.hf.train import launch as launch_module  # noqa: E402
from nsc_prune.hf.train import precision  # noqa: E402
from nsc_prune.hf.train import trainer as trainer_module  # noqa: E402
from nsc_prune.hf.train.data import load_text_blocks  # noqa: E402
from nsc_prune.hf.train.recipe import TrainConfig  # noqa: E402
from nsc_prune.hf.train.resume import CHECKPOINTS_DIR, RUN_RECORD  # noqa: E402
from nsc_prune.hf.train.trainer import RecoveryTrainer, evaluate_loss, train  # noqa: E402
from tests.conftest import _tokenizer, accelerate_launch, free_port, run_launched, run_two_processes  # noqa: E402
from tests.hf.conftest import sigterm_at  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEQ = 16


def corpus(path: Path, docs: int = 40) -> Path:
    """Learnable text: each document cycles through w3..w9 from its own offset (a ``.jsonl``: one record a
    document, each ended by EOS; a ``.txt``: paragraphs of one text)."""
    texts = [" ".join(f"w{3 + (i + k) % 7}" for k in range(20 + i % 5)) for i in range(docs)]
    jsonl = path.suffix == ".jsonl"
    path.write_text("\n".join(json.dumps({"text": text}) for text in texts) if jsonl else "\n\n".join(texts))
    return path


def tiny_model(seed: int = 0):
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=128,
        max_position_embeddings=64,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    path = corpus(tmp_path_factory.mktemp("data") / "a.jsonl")
    return load_text_blocks([path], _tokenizer(128), SEQ, val_fraction=0.1)


def recipe(**kw) -> TrainConfig:
    base = {
        "max_steps": 6,
        "seq_len": SEQ,
        "batch_size": 4,
        "learning_rate": 5e-3,
        "warmup_steps": 0,
        "save_steps": 100,
        "eval_steps": 3,
        "logging_steps": 1,
        "lora_rank": 4,
        "lora_alpha": 8,
        "bf16": False,
        "gradient_checkpointing": False,
    }
    return TrainConfig(**{**base, **kw})


def trained(result) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in result.model.named_parameters() if v.requires_grad}


def test_training_lowers_held_out_loss_and_reports(tmp_path, blocks):
    model = tiny_model()
    before = evaluate_loss(model, blocks.val)
    result = train(model, blocks, recipe(max_steps=12, full=True), tmp_path, progress=False)
    after = evaluate_loss(result.model, blocks.val)
    assert after < before - 0.5, (before, after)
    assert result.steps == 12 and result.tokens == 12 * 4 * SEQ and result.tokens_per_s > 0 and not result.interrupted
    assert [s for s, _ in result.train_loss] == list(range(1, 13)) and [s for s, _ in result.val_loss] == [3, 6, 9, 12]
    assert result.val_loss[-1][1] == pytest.approx(after, rel=1e-4)
    record = json.loads((tmp_path / "checkpoints" / "nsc_prune_train.json").read_text())
    assert record["data_sha256"] == blocks.sha256 and record["config"]["max_steps"] == 12
    assert any(p.suffix == ".safetensors" for p in result.checkpoint.iterdir())


@pytest.mark.parametrize(("grad_accum", "max_steps", "blocks_seen"), [(1, 14, 50 + 4), (2, 7, 50)])
def test_the_token_count_is_what_the_batches_held(tmp_path, blocks, grad_accum, max_steps, blocks_seen):
    """An epoch's last batch holds 50 % 4 = 2 of the 50 training blocks (and its last step, under accumulation, one
    batch): the record counted every step as full, 896 tokens where 864 and 800 were trained on."""
    assert blocks.train.shape[0] == 50
    config = recipe(max_steps=max_steps, grad_accum=grad_accum, eval_steps=100)
    result = train(tiny_model(), blocks, config, tmp_path, progress=False)
    assert result.steps == max_steps and result.tokens == blocks_seen * SEQ
    assert result.train_loss and result.tokens_per_s == pytest.approx(result.tokens / result.seconds)


def test_evaluate_at_stop_false_drops_only_the_last_steps_evaluation(tmp_path, blocks):
    # heal measures the merged model on the same blocks after training: the Trainer's own evaluation at the last
    # step (even one that falls on eval_steps) would be the same measurement twice
    result = train(tiny_model(), blocks, recipe(max_steps=12), tmp_path, progress=False, evaluate_at_stop=False)
    assert result.steps == 12 and [s for s, _ in result.val_loss] == [3, 6, 9]
    off_grid = train(tiny_model(), blocks, recipe(max_steps=7), tmp_path / "b", progress=False)
    assert [s for s, _ in off_grid.val_loss] == [3, 6, 7]  # the default still evaluates where training stops


def test_lora_is_default_and_only_adapters_train(tmp_path, blocks):
    model = tiny_model()
    frozen = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    result = train(model, blocks, recipe(max_steps=2), tmp_path, progress=False)
    names = [n for n, p in result.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert torch.equal(result.model.get_base_model().model.layers[0].mlp.up_proj.base_layer.weight, frozen)


def test_subnet_loss_is_the_mean_over_contexts(tmp_path, blocks):
    """Two contexts that change nothing give the same loss as none (a sum would double the gradient)."""
    steps: list[int] = []

    def contexts(step: int):
        steps.append(step)
        return [contextlib.nullcontext(), contextlib.nullcontext()]

    plain = train(tiny_model(), blocks, recipe(max_steps=3), tmp_path / "a", progress=False)
    sampled = train(tiny_model(), blocks, recipe(max_steps=3), tmp_path / "b", subnet_contexts=contexts, progress=False)
    assert steps == [0, 1, 2]
    for name, value in trained(plain).items():
        torch.testing.assert_close(trained(sampled)[name], value, atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="non-empty list"):
        train(tiny_model(), blocks, recipe(max_steps=1), tmp_path / "c", subnet_contexts=lambda s: [], progress=False)


def two_subnets(model):
    """Subnet contexts: the whole model, and the model without its second MLP (whose weights get no gradient)."""

    @contextlib.contextmanager
    def without_second_mlp():
        handle = model.model.layers[1].mlp.register_forward_hook(lambda module, args, out: torch.zeros_like(out))
        try:
            yield
        finally:
            handle.remove()

    return lambda step: [contextlib.nullcontext(), without_second_mlp()]


def test_subnet_contexts_train_without_recomputing_activations(tmp_path, blocks, monkeypatch):
    """Checkpointing recomputes a layer in the backward pass, after its subnet's context has exited: the full layer,
    so torch's CheckpointError (or wrong gradients). ``auto``, on with CUDA, is off with subnet contexts (CUDA
    faked here); ``True`` is one line."""
    seen = set()
    forward = trainer_module.forward_logits

    def watched(model, ids):
        seen.add(model.get_base_model().is_gradient_checkpointing)
        return forward(model, ids)

    monkeypatch.setattr(trainer_module, "forward_logits", watched)
    model = tiny_model()
    with pytest.raises(
        ConfigError, match="gradient_checkpointing must be false or auto with subnet_contexts; got True"
    ):
        train(model, blocks, recipe(max_steps=1, gradient_checkpointing=True), tmp_path / "on",
              subnet_contexts=two_subnets(model), progress=False)  # fmt: skip
    assert not (tmp_path / "on").exists()
    model = tiny_model()  # without CUDA "auto" is off already: the record keeps it, so a run started before resumes
    train(model, blocks, recipe(max_steps=1, gradient_checkpointing="auto"), tmp_path / "cpu",
          subnet_contexts=two_subnets(model), progress=False)  # fmt: skip
    record = json.loads((tmp_path / "cpu" / CHECKPOINTS_DIR / RUN_RECORD).read_text())
    assert record["config"]["gradient_checkpointing"] == "auto"
    monkeypatch.setattr(trainer_module, "uses_checkpointing", lambda config: config.gradient_checkpointing is not False)
    model = tiny_model()
    train(model, blocks, recipe(max_steps=1, gradient_checkpointing="auto"), tmp_path / "auto",
          subnet_contexts=two_subnets(model), progress=False)  # fmt: skip
    assert seen == {False}


def test_backward_per_subnet_equals_one_graph(tmp_path, blocks, monkeypatch):
    """Backpropagating each subnet before the next forward trains the same weights as one backward of the mean."""
    model = tiny_model()
    streamed = trained(train(model, blocks, recipe(max_steps=3), tmp_path / "a", subnet_contexts=two_subnets(model)))
    monkeypatch.setattr(RecoveryTrainer, "backward_per_subnet", property(lambda self: False))
    model = tiny_model()
    joint = trained(train(model, blocks, recipe(max_steps=3), tmp_path / "b", subnet_contexts=two_subnets(model)))
    plain = trained(train(tiny_model(), blocks, recipe(max_steps=3), tmp_path / "c", progress=False))
    assert any(not torch.allclose(plain[name], value, atol=1e-4) for name, value in joint.items())
    for name, value in joint.items():
        torch.testing.assert_close(streamed[name], value, atol=1e-6, rtol=0)


def test_distillation_from_itself_starts_at_zero_and_needs_a_teacher(tmp_path, blocks):
    """The student starts as the teacher: KD loss 0 at the first step (cross-entropy would be ~log(vocab))."""
    result = train(
        tiny_model(),
        blocks,
        recipe(max_steps=1, distill=True, full=True),
        tmp_path,
        teacher=tiny_model(),
        progress=False,
    )
    assert result.train_loss[0][1] == pytest.approx(0.0, abs=1e-6)
    mixed = train(
        tiny_model(),
        blocks,
        recipe(max_steps=1, distill=True, full=True, ce_weight=0.5),
        tmp_path / "m",
        teacher=tiny_model(),
        progress=False,
    )
    assert mixed.train_loss[0][1] == pytest.approx(
        0.5 * evaluate_loss(tiny_model(), blocks.train), rel=0.1
    )  # half the CE
    with pytest.raises(ConfigError, match="needs a teacher"):
        train(tiny_model(), blocks, recipe(distill=True), tmp_path / "x", progress=False)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_auto_follows_the_cpu(native, monkeypatch, tmp_path):
    """Without CUDA, ``bf16="auto"`` trains in bf16 exactly where the CPU multiplies bf16 in hardware."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    assert precision.uses_bf16(recipe(bf16="auto")) is native
    assert precision.uses_bf16(recipe(bf16=True)) and not precision.uses_bf16(recipe(bf16=False))
    args = trainer_module.training_arguments(recipe(bf16="auto"), tmp_path, False, True)
    assert args.bf16 is native and args.use_cpu


@pytest.mark.parametrize("bf16", [False, True])
def test_an_accelerate_config_s_mixed_precision_does_not_override_the_recipe(monkeypatch, tmp_path, blocks, bf16):
    """accelerate launch exports the user's accelerate config as ACCELERATE_MIXED_PRECISION, which transformers
    read when bf16 was off: --bf16 false trained in bf16 autocast, and the record said float32."""
    runs = []
    for mixed in (None, "fp16" if bf16 else "bf16"):
        if mixed:
            monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", mixed)
        args = trainer_module.training_arguments(recipe(bf16=bf16), tmp_path, False, True)
        assert args.mixed_precision == ("bf16" if bf16 else "no")
        result = train(tiny_model(), blocks, recipe(max_steps=2, bf16=bf16), tmp_path / str(mixed), progress=False)
        runs.append(result.train_loss)
    assert runs[0] == runs[1]


def test_the_training_device_is_the_gpu_of_the_launchers_local_rank(monkeypatch):
    """As accelerate assigns GPUs: rank ``LOCAL_RANK`` trains on ``cuda:LOCAL_RANK`` (not every rank on the first
    GPU, where the time budget's probe would otherwise run them all), the first GPU without a launcher."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert launch_module.training_device() == torch.device("cuda", 3)
    monkeypatch.delenv("LOCAL_RANK")
    assert launch_module.training_device() == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert launch_module.training_device() == torch.device("cpu")


def test_under_bf16_the_teacher_and_the_probe_share_the_students_autocast(tmp_path, blocks):
    """A student that is its teacher starts at KD loss 0 in bf16 too (a float32 teacher against a bf16 student
    would not), and the time budget's probe passes run the student under the same autocast as training."""
    from nsc_prune.hf.train.budget import TimeBudget
    from nsc_prune.hf.train.trainer import measure_budget, prepare_model

    config = recipe(max_steps=1, distill=True, full=True, bf16=True)
    result = train(tiny_model(), blocks, config, tmp_path, teacher=tiny_model(), progress=False)
    assert result.train_loss[0][1] == pytest.approx(0.0, abs=1e-6)
    fp32_teacher = trainer_module.teacher_side(tiny_model(), blocks.train[:4], recipe(distill=True))
    bf16_teacher = trainer_module.teacher_side(tiny_model(), blocks.train[:4], config)
    assert not torch.equal(fp32_teacher[0], bf16_teacher[0])  # the teacher really ran in bf16
    torch.testing.assert_close(bf16_teacher[0], fp32_teacher[0], atol=2e-2, rtol=0)
    seen: list[bool] = []
    student = prepare_model(tiny_model(), config)
    student.register_forward_pre_hook(lambda module, args: seen.append(torch.is_autocast_enabled("cpu")))
    measure_budget(student, tiny_model(), blocks, config, TimeBudget(60.0, passes=2))
    assert seen == [True, True]


def test_a_resume_trains_in_the_precision_the_run_began_in(tmp_path, blocks, monkeypatch):
    """``--bf16 auto`` resolves per machine: a run begun in bf16 is not resumed in float32 on a machine without
    native bf16 (the same flags, another run); ``--bf16 true`` there continues it."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    auto = recipe(max_steps=4, save_steps=2, bf16="auto")
    first = train(tiny_model(), blocks, auto, tmp_path, progress=False, callbacks=[sigterm_at(2)])
    assert first.interrupted and first.steps == 2
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(InvalidInputError, match=r"trained in bf16 autocast, with float32 here; pass --bf16 true"):
        train(tiny_model(), blocks, auto, tmp_path, resume=True)
    resumed = train(tiny_model(), blocks, recipe(max_steps=4, save_steps=2, bf16=True), tmp_path, resume=True)
    assert resumed.steps == 4 and not resumed.interrupted


def test_a_resumed_checkpoint_s_pickled_object_is_not_loaded(tmp_path, blocks):
    """The Trainer reads optimizer.pt with weights_only=True: an object in it was refused in a traceback whose hint
    was to load it with weights_only=False. One line now, naming the checkpoint to remove."""
    from fractions import Fraction  # not on torch's list of safe globals

    config = recipe(max_steps=4, save_steps=2)
    first = train(tiny_model(), blocks, config, tmp_path, progress=False, callbacks=[sigterm_at(2)])
    torch.save({"state": Fraction(1, 3), "param_groups": []}, first.checkpoint / "optimizer.pt")
    with pytest.raises(InvalidInputError, match=rf"--resume: a torch file in {first.checkpoint} holds objects"):
        train(tiny_model(), blocks, config, tmp_path, resume=True, progress=False)


def test_sigterm_then_resume_equals_an_uninterrupted_run(tmp_path, blocks):
    config = recipe(max_steps=6, save_steps=4)
    full = trained(train(tiny_model(), blocks, config, tmp_path / "full", progress=False))
    first = train(tiny_model(), blocks, config, tmp_path / "cut", progress=False, callbacks=[sigterm_at(2)])
    assert first.interrupted and first.steps == 2 and first.checkpoint.name == "checkpoint-2"
    with pytest.raises(InvalidInputError, match="pass --resume"):
        train(tiny_model(), blocks, config, tmp_path / "cut", progress=False)
    with pytest.raises(InvalidInputError, match=r"other settings \(learning_rate differ\)"):
        train(
            tiny_model(), blocks, recipe(max_steps=6, save_steps=4, learning_rate=1e-3), tmp_path / "cut", resume=True
        )
    with pytest.raises(InvalidInputError, match=r"other settings \(checkpoint differ\)"):  # e.g. heal's, fingerprinted
        train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, inputs={"checkpoint": "another"})
    resumed = train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, progress=False)
    assert resumed.steps == 6 and not resumed.interrupted
    for name, value in full.items():
        torch.testing.assert_close(trained(resumed)[name], value, atol=1e-6, rtol=0)


def test_resume_of_a_finished_run_trains_no_further_step(tmp_path, blocks):
    config = recipe(max_steps=4, save_steps=2)
    done = train(tiny_model(), blocks, config, tmp_path, progress=False)
    again = train(tiny_model(), blocks, config, tmp_path, resume=True, progress=False)
    assert done.steps == again.steps == 4 and again.tokens == done.tokens
    for name, value in trained(done).items():
        torch.testing.assert_close(trained(again)[name], value, atol=0, rtol=0)


def test_seq_len_above_the_model_and_mismatched_blocks(tmp_path, blocks):
    with pytest.raises(InvalidInputError, match=r"the blocks' length must be config.seq_len \(32\)"):
        train(tiny_model(), blocks, recipe(seq_len=32), tmp_path, progress=False)
    long = load_text_blocks([corpus(tmp_path / "a.txt", 80)], _tokenizer(128), 80, val_fraction=0.0)
    with pytest.raises(InvalidInputError, match=r"max_position_embeddings \(64\)"):
        train(tiny_model(), long, recipe(seq_len=80), tmp_path, progress=False)


DP_SCRIPT = """
import json, sys, torch
from safetensors.torch import save_file
sys.path.insert(0, {root!r})
from tests.hf.test_train_trainer import tiny_model, recipe, corpus, two_subnets, SEQ
from tests.conftest import _tokenizer
from nsc_prune.hf.train.data import load_text_blocks
from nsc_prune.hf.train.trainer import train
from nsc_prune.cli import close_process_group
blocks = load_text_blocks([{data!r}], _tokenizer(128), SEQ, val_fraction=0.1)
model = tiny_model()
result = train(model, blocks, recipe(max_steps=4, batch_size={batch}), {out!r}, subnet_contexts=two_subnets(model),
               progress=False)
if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
    trained = {{k: v.detach().contiguous() for k, v in result.model.named_parameters() if v.requires_grad}}
    save_file(trained, {out!r} + "/w.safetensors")
    json.dump(result.to_dict(), open({out!r} + "/r.json", "w"))
close_process_group()  # as the CLI does: left to interpreter exit, gloo can abort the process
"""


def test_accelerate_two_processes_match_one_with_the_same_global_batch(tmp_path):
    from safetensors.torch import load_file

    data = corpus(tmp_path / "a.txt")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    runs = {}
    for name, batch, launch in (
        ("dp", 2, accelerate_launch(free_port())),
        ("single", 4, []),
    ):
        out = tmp_path / name
        out.mkdir()
        script = tmp_path / f"{name}.py"
        script.write_text(DP_SCRIPT.format(root=str(ROOT), data=str(data), batch=batch, out=str(out)))
        proc = run_launched([sys.executable, *launch, str(script)], env, timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = (load_file(out / "w.safetensors"), json.loads((out / "r.json").read_text()))
    (dp, dp_info), (single, single_info) = runs["dp"], runs["single"]
    assert dp_info["world_size"] == 2 and single_info["world_size"] == 1
    assert dp_info["tokens"] == single_info["tokens"] == 4 * 4 * SEQ
    moved = max((single[k] - v).abs().max().item() for k, v in load_file(tmp_path / "single" / "w.safetensors").items())
    assert set(dp) == set(single)
    for name, value in single.items():
        torch.testing.assert_close(dp[name], value, atol=1e-5, rtol=1e-4)
    assert moved == 0.0  # (same file: sanity of the comparison itself)


BUDGET_SCRIPT = """
import json, os, time, torch
from tests.hf.test_train_trainer import tiny_model, recipe, SEQ
from tests.conftest import _tokenizer
from nsc_prune.hf.train.budget import TimeBudget
from nsc_prune.hf.train.data import load_text_blocks
from nsc_prune.hf.train.trainer import train
from nsc_prune.cli import close_process_group
blocks = load_text_blocks([{data!r}], _tokenizer(128), SEQ, val_fraction=0.1)
config = recipe(max_steps=1000, batch_size=2, warmup_steps=4, schedule="wsd", eval_steps=1000)
pace = 1.5 if os.environ["RANK"] == "1" else 1.0  # rank 1's clock runs fast: alone, it would size fewer steps
budget = TimeBudget({minutes}, clock=lambda: time.perf_counter() * pace)
result = train(tiny_model(), blocks, config, {out!r}, budget=budget, progress=False)
json.dump(result.to_dict(), open({out!r} + "/r%d.json" % torch.distributed.get_rank(), "w"))
close_process_group()
"""


def test_a_time_budget_under_accelerate_launch_stops_every_rank_at_rank_0s_step(tmp_path):
    """``--minutes`` under a launcher: each rank times its own probe and steps (here rank 1 on a clock 1.5x fast),
    rank 0's sizing is every rank's at each re-size, so both processes run the same steps and end (a rank that
    stopped alone would leave the other waiting in its next gradient reduction); rank 0 alone writes the record."""
    data = corpus(tmp_path / "a.txt")
    out = tmp_path / "dp"
    out.mkdir()
    script = tmp_path / "budget.py"
    script.write_text(BUDGET_SCRIPT.format(data=str(data), out=str(out), minutes=0.1))
    run_two_processes(script, timeout=120)
    ranks = [json.loads((out / f"r{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["steps"] == ranks[1]["steps"] == ranks[0]["budget"]["max_steps"] >= 8
    assert ranks[0]["budget"] == ranks[1]["budget"] and ranks[0]["budget"]["settled"]
    stored = json.loads((out / "checkpoints" / "nsc_prune_train.json").read_text())["budget"]
    assert stored["max_steps"] == ranks[0]["steps"]


REFUSAL_SCRIPT = """
import json, os, time, torch
from tests.hf.test_train_trainer import tiny_model, recipe, SEQ
from tests.conftest import _tokenizer
from nsc_prune.hf.train.budget import BudgetTooSmall, TimeBudget
from nsc_prune.hf.train.data import load_text_blocks
from nsc_prune.hf.train.trainer import train
from nsc_prune.cli import close_process_group
blocks = load_text_blocks([{data!r}], _tokenizer(128), SEQ, val_fraction=0.1)
config = recipe(max_steps=1000, batch_size=2, warmup_steps=4, schedule="wsd", eval_steps=1000)
rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else int(os.environ["RANK"])
seen = {{}}
for refuser in (1, 0):  # the rank whose clock runs 1000x fast: its first probe pass alone spends the budget
    pace = 1000.0 if rank == refuser else 1.0
    out = {out!r} + "/refused_by_%d" % refuser
    try:
        result = train(tiny_model(), blocks, config, out, budget=TimeBudget({minutes}, clock=lambda: time.perf_counter() * pace),
                       progress=False)
        seen[refuser] = {{"steps": result.steps, "max_steps": result.budget.max_steps}}
    except BudgetTooSmall as err:
        seen[refuser] = {{"refused": str(err), "every_rank": err.every_rank}}
json.dump(seen, open({out!r} + "/seen%d.json" % rank, "w"))
close_process_group()
"""


def test_under_accelerate_launch_rank_0s_probe_decides_whether_a_time_budget_holds_a_step(tmp_path):
    """Each rank probes on its own clock: a budget only rank 1's probe refuses runs rank 0's sizing on both ranks
    (was: rank 1 exited 2 and the launcher killed rank 0's run); one rank 0 refuses is refused by every rank with
    rank 0's line (printed by rank 0 alone), before anything is written."""
    data = corpus(tmp_path / "a.txt")
    out = tmp_path / "dp"
    out.mkdir()
    script = tmp_path / "refusal.py"
    script.write_text(REFUSAL_SCRIPT.format(data=str(data), out=str(out), minutes=0.05))
    run_two_processes(script, timeout=120)
    seen = [json.loads((out / f"seen{rank}.json").read_text()) for rank in (0, 1)]
    assert seen[0]["1"] == seen[1]["1"] and seen[0]["1"]["steps"] == seen[0]["1"]["max_steps"] >= 1
    assert seen[0]["0"] == seen[1]["0"] and "--minutes must be enough for one training step" in seen[0]["0"]["refused"]
    assert seen[0]["0"]["every_rank"]  # the CLI prints it on rank 0 alone
    assert not (out / "refused_by_0").exists()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_tensors_finite_sees_every_nan_and_inf_however_the_sums_fall(dtype):
    from nsc_prune.hf.train.callbacks import tensors_finite

    def tensors(*spoilt: tuple[int, float]) -> list[torch.Tensor]:
        made = [torch.ones(3, 4, dtype=getattr(torch, dtype)), torch.full((5,), -2.0, dtype=getattr(torch, dtype))]
        for which, value in spoilt:
            made[which].view(-1)[1] = value
        return made

    assert tensors_finite(tensors()) and tensors_finite([])
    for spoilt in ([(0, math.nan)], [(1, math.inf)], [(0, -math.inf)], [(0, math.inf), (1, -math.inf)]):
        assert not tensors_finite(tensors(*spoilt)), spoilt
    assert not tensors_finite(iter(tensors((1, math.nan))))  # a generator, as the callback passes


def test_a_run_whose_loss_turns_nan_stops_in_one_line_without_saving_that_step(tmp_path, blocks):
    config = recipe(max_steps=20, full=True, learning_rate=1e30, logging_steps=1, save_steps=1, eval_steps=100)
    with pytest.raises(InvalidInputError, match=r"training diverged: the loss, its gradients or the weights were NaN"):
        train(tiny_model(), blocks, config, tmp_path, progress=False)  # ran on, then the JSON record failed
    saved = sorted((tmp_path / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert saved and int(saved[-1].name.split("-")[1]) < 19  # it stopped early
    for checkpoint in saved:  # and saved no step whose logged loss was NaN
        history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
        assert all(math.isfinite(entry["loss"]) for entry in history if "loss" in entry)


def test_a_logged_gradient_norm_of_zero_stops_the_run_as_diverged():
    """A residual stream past float32's square root (a LoRA rate of 10) makes RMSNorm's x^2 inf and its output 0:
    every logit 0, the loss a finite ln(vocabulary), the gradients 0, not NaN; heal wrote that model with exit 0."""
    from transformers import TrainerControl, TrainerState

    from nsc_prune.hf.train.callbacks import StopOnDivergence

    state, control, live = TrainerState(global_step=7), TrainerControl(), StopOnDivergence()
    live.on_log(None, state, control, logs={"loss": 3.2, "grad_norm": 0.4})
    assert live.step is None and not control.should_training_stop
    dead = StopOnDivergence()
    dead.on_log(None, state, control, logs={"loss": math.log(128), "grad_norm": 0.0})
    assert dead.step == 7 and control.should_training_stop and not control.should_save


@pytest.mark.parametrize("max_steps", [3, 5])
def test_a_run_that_diverges_between_logged_losses_stops_without_saving_that_step(tmp_path, blocks, max_steps):
    """No loss is logged in these runs (--logging-steps beyond the run) and none is evaluated at the stop: a NaN in
    the last steps used to pass unseen, and heal wrote a NaN model (or failed writing its record)."""
    config = recipe(max_steps=max_steps, full=True, learning_rate=1e30, logging_steps=100, save_steps=1)
    with pytest.raises(InvalidInputError, match=r"training diverged: .* at step (\d+) \(learning rate 1e\+30\)"):
        train(tiny_model(), blocks, config, tmp_path, progress=False, evaluate_at_stop=False)
    for checkpoint in (tmp_path / "checkpoints").glob("checkpoint-*"):  # every saved step's weights are finite
        weights = load_file(checkpoint / "model.safetensors")
        assert all(bool(torch.isfinite(tensor).all()) for tensor in weights.values()), checkpoint.name


@pytest.mark.parametrize(
    "damaged",
    ["optimizer.pt", "trainer_state.json", "model.safetensors", "unfinished", "no-optimizer.pt", "no-scheduler.pt",
     "no-model.safetensors"],
)  # fmt: skip
def test_resume_passes_over_a_checkpoint_cut_short_for_the_one_before(tmp_path, blocks, damaged):
    """A run stopped while it wrote a checkpoint (a cut file, or no trainer_state.json: the Trainer writes it last)
    resumes from the checkpoint before it, naming why, and reaches the uninterrupted run's weights; it used to point
    at the cut checkpoint and fail on every --resume."""
    config = recipe(max_steps=6, save_steps=2, full=True)
    full = trained(train(tiny_model(), blocks, config, tmp_path / "full", progress=False))
    assert train(tiny_model(), blocks, config, tmp_path / "cut", progress=False, callbacks=[sigterm_at(4)]).interrupted
    last = tmp_path / "cut" / "checkpoints" / "checkpoint-4"
    if damaged == "unfinished":
        (last / "trainer_state.json").unlink()
        reason = r"checkpoint-4 is incomplete \(no trainer_state.json"
    elif damaged.startswith("no-"):  # the Trainer restarted the optimizer or schedule silently, or found no weights
        (last / damaged[3:]).unlink()
        reason = "checkpoint-4 lacks " + ("its weights" if damaged.endswith("safetensors") else damaged[3:])
    else:
        os.truncate(last / damaged, (last / damaged).stat().st_size // 2)
        reason = rf"checkpoint-4/{damaged} cannot be read \(\w+\)"
    with pytest.warns(UserWarning, match=rf"--resume: .*{reason}.*; continuing from .*checkpoint-2 instead"):
        resumed = train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, progress=False)
    assert resumed.steps == 6 and resumed.checkpoint.name == "checkpoint-6"
    for name, value in full.items():
        torch.testing.assert_close(trained(resumed)[name], value, atol=1e-6, rtol=0)


def test_a_resume_over_the_same_files_in_other_blocks_says_why(tmp_path, blocks):
    """A run stopped under an earlier nsc-prune (no BOS led its blocks; text files were read paragraph by
    paragraph) and resumed under this one: "blocks_sha256 differ" named nothing the user had changed."""
    from dataclasses import replace

    from nsc_prune.hf.train.resume import check_resume, run_record

    config = recipe(max_steps=2)
    folder = tmp_path / "checkpoints"
    (folder / "checkpoint-1").mkdir(parents=True)
    (folder / RUN_RECORD).write_text(json.dumps(run_record(config, blocks, None)))
    shifted = replace(blocks, train=blocks.train.roll(1, dims=1))  # the same files (sha256), other blocks
    with pytest.raises(InvalidInputError, match=r"\(blocks_sha256 differ\) \(the same files in other blocks: another"):
        check_resume(tmp_path, config, shifted, None, resume=True)


def test_a_resume_with_other_teacher_logits_or_a_time_budget_is_refused(tmp_path, blocks):
    from nsc_prune.hf.train.budget import TimeBudget
    from nsc_prune.hf.train.resume import check_resume, run_record

    config = recipe(max_steps=2)
    folder = tmp_path / "checkpoints"
    (folder / "checkpoint-1").mkdir(parents=True)
    (folder / RUN_RECORD).write_text(json.dumps(run_record(config, blocks, {"logits": "A"})))
    with pytest.warns(UserWarning, match="incomplete"):  # the same inputs: accepted (the checkpoint is a stand-in)
        check_resume(tmp_path, config, blocks, {"logits": "A"}, resume=True)
    with pytest.raises(InvalidInputError, match="teacher_logits"):
        check_resume(tmp_path, config, blocks, {"logits": "B"}, resume=True)
    (folder / RUN_RECORD).write_text(json.dumps(run_record(config, blocks, None)))
    with pytest.raises(InvalidInputError, match="minutes"):  # an untimed run resumed as a timed one
        check_resume(tmp_path, config, blocks, None, resume=True, budget=TimeBudget(20))


def test_checkpoints_are_ordered_by_step_not_by_name(tmp_path):
    from nsc_prune.hf.train.resume import saved_checkpoints

    for step in (9, 10, 2):
        (tmp_path / f"checkpoint-{step}").mkdir()
    assert [p.name for p in saved_checkpoints(tmp_path)] == ["checkpoint-10", "checkpoint-9", "checkpoint-2"]


def test_a_resume_in_another_number_of_processes_is_refused(tmp_path, blocks, monkeypatch):
    """A 2-process run resumed in one process trained a twice-seen half of its blocks at half the batch, with exit 0
    (held-out loss 4.99 against the uninterrupted 4.24); the other way it skipped blocks it never trained on."""
    from nsc_prune.hf.train.resume import check_resume, run_record
    from tests.conftest import as_launched_rank

    config = recipe(max_steps=2)
    folder = tmp_path / "checkpoints"
    (folder / "checkpoint-1").mkdir(parents=True)
    as_launched_rank(monkeypatch, 0, 2)
    (folder / RUN_RECORD).write_text(json.dumps(run_record(config, blocks, None)))
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(
        InvalidInputError, match=r"which trained in 2 processes, and this run has 1: .*; launch it in 2 \(torchrun"
    ):
        check_resume(tmp_path, config, blocks, None, resume=True)


def test_resume_with_only_an_unfinished_checkpoint_starts_again_saying_why(tmp_path, blocks):
    config = recipe(max_steps=4, save_steps=2)
    assert train(tiny_model(), blocks, config, tmp_path, progress=False, callbacks=[sigterm_at(2)]).interrupted
    (tmp_path / "checkpoints" / "checkpoint-2" / "trainer_state.json").unlink()
    with pytest.warns(UserWarning, match=r"holds no checkpoint to continue from \(.*checkpoint-2 is incomplete"):
        again = train(tiny_model(), blocks, config, tmp_path, resume=True, progress=False)
    assert again.steps == 4 and not again.interrupted


class _CtrlC(transformers.TrainerCallback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt


def test_ctrl_c_after_a_checkpoint_says_where_it_is_and_how_to_resume(tmp_path, blocks):
    from nsc_prune.errors import InterruptedRun

    config = recipe(max_steps=6, save_steps=2)
    with pytest.raises(KeyboardInterrupt) as early:  # no checkpoint yet: nothing to say
        train(tiny_model(), blocks, config, tmp_path / "early", progress=False, callbacks=[_CtrlC(1)])
    assert not isinstance(early.value, InterruptedRun)
    # the CLI said "nothing was written", while the checkpoints stayed and the next run without --resume was refused
    with pytest.raises(
        InterruptedRun, match=r"the last checkpoint is .*checkpoint-2: run the same command with --resume"
    ):
        train(tiny_model(), blocks, config, tmp_path / "late", progress=False, callbacks=[_CtrlC(3)])


def test_a_batch_larger_than_the_text_is_refused_before_anything_is_written(tmp_path, blocks):
    rows = blocks.train.shape[0]  # the record counted batch x steps tokens that no batch held
    with pytest.raises(InvalidInputError, match=rf"--batch-size must be at most the {rows} training blocks of"):
        train(tiny_model(), blocks, recipe(batch_size=rows + 1), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    accum = rows // 2 + 1  # two blocks a batch: the Trainer stepped at the epoch's end, the record said accum x 2
    with pytest.raises(InvalidInputError, match=rf"--grad-accum must be at most {rows // 2} with --batch-size 2: "):
        train(tiny_model(), blocks, recipe(batch_size=2, grad_accum=accum), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_step_of_every_process_must_fit_in_the_text(tmp_path, blocks, monkeypatch):
    """Under a launcher each process takes its own batch: 2 x a batch of more than half the blocks passed the check
    of one batch, and each step held a block twice while the record counted them all."""
    rows = blocks.train.shape[0]
    monkeypatch.setenv("WORLD_SIZE", "2")  # the check runs before any process group is joined
    batch = rows // 2 + 1
    with pytest.raises(
        InvalidInputError, match=rf"--batch-size x --grad-accum x processes must be at most the {rows} "
    ):
        train(tiny_model(), blocks, recipe(batch_size=batch), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "message",
    [
        "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file",
        "[enforce fail at inline_container.cc:672] . unexpected pos 259136 vs 259024",  # was a traceback (a tmpfs)
    ],
)
def test_a_checkpoint_the_disk_cannot_hold_fails_in_one_line_and_resume_continues(
    tmp_path, blocks, monkeypatch, message
):
    """A full disk during a save printed torch's 45-line traceback with no word on how to go on."""
    config = recipe(max_steps=6, save_steps=2, full=True)
    full = trained(train(tiny_model(), blocks, config, tmp_path / "full", progress=False))
    real = transformers.Trainer._save_optimizer_and_scheduler

    def full_disk(self, output_dir):
        if self.state.global_step == 4:
            raise RuntimeError(message)
        return real(self, output_dir)

    monkeypatch.setattr(transformers.Trainer, "_save_optimizer_and_scheduler", full_disk)
    with pytest.raises(
        InvalidInputError, match=r"could not write the checkpoint .*checkpoint-4 \(\[enforce fail.*--resume"
    ):
        train(tiny_model(), blocks, config, tmp_path / "cut", progress=False)
    # under ulimit -f torch's writer fails alike: "make room" alone was told to a disk with room
    assert trainer_module._write_failure_fix(RuntimeError(message)) == "make room"
    monkeypatch.setattr(trainer_module, "file_size_limit", lambda: 614400)
    assert trainer_module._write_failure_fix(RuntimeError(message)).endswith(
        "lift the file-size limit (ulimit -f: 614400 bytes)"
    )
    monkeypatch.undo()
    with pytest.warns(UserWarning, match=r"checkpoint-4 is incomplete.*continuing from .*checkpoint-2 instead"):
        resumed = train(tiny_model(), blocks, config, tmp_path / "cut", resume=True, progress=False)
    for name, value in full.items():
        torch.testing.assert_close(trained(resumed)[name], value, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("code", "fix"),
    [("No space left on device (os error 28)", "make room"), ("File too large (os error 27)", "lift the file-size")],
)
def test_a_model_file_the_disk_cannot_hold_in_a_checkpoint_fails_in_one_line(tmp_path, blocks, monkeypatch, code, fix):
    """safetensors raises its own SafetensorError for a full disk, which the save did not catch: a traceback. At the
    first checkpoint the line promised a --resume from "the last whole checkpoint", of which there was none, and a
    file-size limit (ulimit -f, FAT32's 4 GiB) was told to make room."""
    from safetensors import SafetensorError

    def full_disk(self, output_dir=None, state_dict=None):
        raise SafetensorError(f"Error while serializing: I/O error: {code}")

    monkeypatch.setattr(transformers.Trainer, "_save", full_disk)
    with pytest.raises(InvalidInputError, match=rf"checkpoint-2 \(Error while serializing: .*\)\); {fix}.*, then run the "
                       "same command again: no checkpoint was written whole, so it starts at the first step$"):  # fmt: skip
        train(tiny_model(), blocks, recipe(max_steps=4, save_steps=2, full=True), tmp_path / "run", progress=False)


def test_ctrl_c_while_the_first_checkpoint_is_written_leaves_none_to_refuse_the_next_run(tmp_path, blocks, monkeypatch):
    """The CLI said "nothing was written" while the unfinished checkpoint-2 made the same command refuse to start."""
    from nsc_prune.errors import InterruptedRun

    config = recipe(max_steps=4, save_steps=2)
    real = transformers.Trainer._save_optimizer_and_scheduler

    def ctrl_c(self, output_dir):
        raise KeyboardInterrupt  # the weights are written, the optimizer and trainer_state.json are not

    monkeypatch.setattr(transformers.Trainer, "_save_optimizer_and_scheduler", ctrl_c)
    with pytest.raises(KeyboardInterrupt) as stopped:
        train(tiny_model(), blocks, config, tmp_path, progress=False)
    assert not isinstance(stopped.value, InterruptedRun) and not list((tmp_path / "checkpoints").glob("checkpoint-*"))
    monkeypatch.setattr(transformers.Trainer, "_save_optimizer_and_scheduler", real)
    assert train(tiny_model(), blocks, config, tmp_path, progress=False).steps == 4  # the same run starts again


def test_another_failure_during_a_save_is_not_called_a_full_disk(tmp_path, blocks, monkeypatch):
    def failing(self, output_dir):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(transformers.Trainer, "_save_optimizer_and_scheduler", failing)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        train(tiny_model(), blocks, recipe(max_steps=2, save_steps=1, full=True), tmp_path / "run", progress=False)


def test_a_library_run_whose_output_is_a_file_prints_neither_bar_nor_dicts(tmp_path, blocks, capsys):
    train(tiny_model(), blocks, recipe(max_steps=2, logging_steps=1), tmp_path / "run", progress=True)
    out, err = capsys.readouterr()
    assert "'loss'" not in out and "\r" not in err and "it/s" not in err


def test_the_library_keeps_its_bar_where_seen_and_a_command_off_a_terminal_prints_lines(tmp_path, monkeypatch):
    """The terminal check was in the trainer: train(progress=True) in a notebook (no tty) lost its notebook bar;
    then a script's ``2> log`` (no tty, no notebook) got every redraw of it, and the Trainer's dicts on stdout."""
    import io
    import types

    from nsc_prune.hf.progress import log_lines
    from nsc_prune.hf.train.trainer import training_arguments

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a file, whether or not pytest captures
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert training_arguments(recipe(max_steps=2), tmp_path, True, False).disable_tqdm is True
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))  # a notebook's kernel
    assert training_arguments(recipe(max_steps=2), tmp_path, True, False).disable_tqdm is False
    with log_lines():  # what heal and train-supernet set when their output is not a terminal
        assert training_arguments(recipe(max_steps=2), tmp_path, True, False).disable_tqdm is True
    assert training_arguments(recipe(max_steps=2), tmp_path, False, False).disable_tqdm is True


def test_the_bar_s_logged_dicts_go_to_stderr_not_the_result_s_stdout(tmp_path, blocks, monkeypatch, capsys):
    """Where the Trainer draws its bar (a terminal, a notebook), tqdm.write put one dict a step on stdout:
    `heal ... > result.txt` held them above its one `wrote` line."""
    import types

    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))  # a notebook's kernel: a bar
    train(tiny_model(), blocks, recipe(max_steps=2, logging_steps=1), tmp_path / "run", progress=True)
    out, err = capsys.readouterr()
    assert "'loss'" not in out and "'loss'" in err, (out, err)

    class NotebookTable(transformers.TrainerCallback):  # transformers' own in a notebook (no ProgressCallback)
        def on_log(self, args, state, control, logs=None, **kwargs):
            print("[table row]", file=sys.stderr)

    monkeypatch.setattr(transformers.trainer, "DEFAULT_PROGRESS_CALLBACK", NotebookTable)
    train(tiny_model(), blocks, recipe(max_steps=2, logging_steps=1), tmp_path / "nb", progress=True)
    out, err = capsys.readouterr()
    assert "[table row]" in err and "'loss'" not in out + err, (out, err)  # its table alone, not a second bar


def test_the_adapted_modules_are_named_as_the_model_names_them():
    """On a fused family a LoRA target adapts its whole fused module: ``q_proj`` is Phi-3's ``qkv_proj`` (the
    recovery record said ``q_proj``); ``--full`` adapts none."""
    config = transformers.Phi3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=0,
    )  # fmt: skip
    model = transformers.Phi3ForCausalLM(config)
    lora = trainer_module.prepare_model(model, TrainConfig(lora_targets=("q_proj", "down_proj"), lora_rank=2))
    assert trainer_module.adapted_modules(lora) == ["down_proj", "qkv_proj"]
    full = trainer_module.prepare_model(transformers.Phi3ForCausalLM(config), TrainConfig(full=True))
    assert trainer_module.adapted_modules(full) is None
    pattern = r".*\.(qkv_proj|down_proj)"  # a kept adapter may name its targets by one regular expression
    kept = peft.get_peft_model(transformers.Phi3ForCausalLM(config), peft.LoraConfig(r=2, target_modules=pattern))
    assert trainer_module.adapted_modules(kept) == [pattern]  # not its characters


@pytest.mark.parametrize(("avx512", "amx", "native"), [(True, False, True), (False, True, True), (False, False, False)])
def test_either_cpu_probe_makes_bf16_native(monkeypatch, avx512, amx, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    precision.cpu_has_native_bf16.cache_clear()
    try:
        assert precision.cpu_has_native_bf16() is native
    finally:
        precision.cpu_has_native_bf16.cache_clear()


def test_a_divergence_names_the_first_step_it_did_not_save(tmp_path, blocks):
    """Step 1's update leaves the weights huge but finite (Adam's steps are about the rate, 1e30) and is saved; step
    2's forward overflows: the message names step 2, not the saved step 1."""
    config = recipe(max_steps=3, full=True, learning_rate=1e30, logging_steps=100, save_steps=1)
    with pytest.raises(InvalidInputError, match=r"at step 2 \(learning rate"):
        train(tiny_model(), blocks, config, tmp_path, progress=False, evaluate_at_stop=False)
    assert [p.name for p in (tmp_path / "checkpoints").glob("checkpoint-*")] == ["checkpoint-1"]


def test_an_unknown_lora_target_is_one_line_naming_the_models_linear_modules():
    from nsc_prune.hf.train.trainer import prepare_model

    with pytest.raises(
        ConfigError, match=r"lora_targets must be linear modules of the model \(\[.*'q_proj'.*\]\); got \['foo_proj'\]"
    ):
        prepare_model(tiny_model(), recipe(lora_targets=("q_proj", "foo_proj")))


def test_lora_rank_is_refused_just_past_the_largest_targeted_matrix():
    from nsc_prune.hf.train.trainer import lora_config_for

    assert lora_config_for(tiny_model(), recipe(lora_rank=32)).r == 32  # hidden 32: min(32, 48) is the largest
    with pytest.raises(ConfigError, match="lora_rank must be at most 32"):
        lora_config_for(tiny_model(), recipe(lora_rank=33))


def test_full_refuses_a_peft_model_and_trains_every_weight_of_a_frozen_one():
    from nsc_prune.hf.train.trainer import lora_config_for, prepare_model

    wrapped = peft.get_peft_model(tiny_model(), lora_config_for(tiny_model(), recipe()))
    with pytest.raises(ConfigError, match="merge its adapter first"):
        prepare_model(wrapped, recipe(full=True))
    frozen = tiny_model().requires_grad_(False)
    assert all(p.requires_grad for p in prepare_model(frozen, recipe(full=True)).parameters())


def test_grad_accum_is_refused_one_block_past_the_text(blocks):
    from nsc_prune.hf.train.trainer import check_blocks

    rows = blocks.train.shape[0]
    check_blocks(blocks, recipe(batch_size=1, grad_accum=rows))
    with pytest.raises(InvalidInputError, match=f"--grad-accum must be at most {rows} with --batch-size 1"):
        check_blocks(blocks, recipe(batch_size=1, grad_accum=rows + 1))


def test_a_last_update_that_overflows_the_weights_is_a_divergence(tmp_path, blocks):
    """The one step's gradients are finite; its update (a rate past float32's range) makes the weights inf, and no
    later step is there to see it."""

    config = recipe(max_steps=1, full=True, learning_rate=1e39, logging_steps=100, save_steps=100)
    with pytest.raises(InvalidInputError, match=r"training diverged: .* at step 1 \(learning rate 1e\+39\)"):
        train(tiny_model(), blocks, config, tmp_path, progress=False, evaluate_at_stop=False)


def test_a_teacher_without_distill_trains_cross_entropy(tmp_path, blocks):
    config = recipe(max_steps=2, eval_steps=100)
    plain = trained(train(tiny_model(), blocks, config, tmp_path / "plain", progress=False))
    taught = trained(train(tiny_model(), blocks, config, tmp_path / "t", teacher=tiny_model(seed=1), progress=False))
    for name, value in plain.items():
        torch.testing.assert_close(taught[name], value, atol=0, rtol=0)


def _blocks(value: int):
    from nsc_prune.hf.train.data import TextBlocks

    return TextBlocks(
        train=torch.full((4, 8), value, dtype=torch.long),
        val=torch.full((1, 8), value, dtype=torch.long),
        sha256=f"{value:064x}",
        seq_len=8,
    )


def _stored(tmp_path, record):
    folder = tmp_path / "checkpoints"
    folder.mkdir(exist_ok=True)
    (folder / RUN_RECORD).write_text(json.dumps(record))
    return folder


def test_a_resume_over_other_data_names_the_files_and_the_earlier_reader(tmp_path):
    """Other text (both digests differ): the refusal says other --data files, or an earlier nsc-prune's reading of
    the same ones, the two causes a user can act on."""
    from nsc_prune.hf.train.resume import _check_same_run, run_record

    config = TrainConfig(seq_len=8)
    folder = _stored(tmp_path, run_record(config, _blocks(3), None))
    with pytest.raises(
        InvalidInputError,
        match=r"used other --data content \(data_sha256, blocks_sha256 differ\) \(other --data files, or the same "
        r"ones read by an earlier nsc-prune",
    ):
        _check_same_run(folder, run_record(config, _blocks(4), None))
