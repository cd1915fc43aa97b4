"""``nsc-prune heal`` (issue 13): a short run lowers held-out loss; the output loads with load_pruned and its
logits equal the in-memory merged model's; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from nsc_prune._files import RECORD_NAME  # noqa: E402
from nsc_prune._io import STOP_SIGNALS  # noqa: E402
from nsc_prune.cli import main  # noqa: E402
from nsc_prune.errors import InvalidInputError  # noqa: E402
from nsc_prune.hf.train import heal as heal_module  # noqa: E402
from nsc_prune.hf.train.heal import default_work_dir, write_healed  # noqa: E402
from nsc_prune.hf.train.precision import uses_bf16  # noqa: E402
from nsc_prune.hf.train.recipe import TrainConfig  # noqa: E402
from nsc_prune.hf.train.trainer import prepare_model  # noqa: E402
from nsc_prune.hf.weights.fingerprint import weights_fingerprint  # noqa: E402
from nsc_prune.hf.weights.loading import load_pruned  # noqa: E402
from nsc_prune.hf.weights.safetensors_io import index_model_dir  # noqa: E402
from tests.conftest import spoil_weight  # noqa: E402

FAST = [
    "--seq-len",
    "16",
    "--batch-size",
    "4",
    "--learning-rate",
    "5e-3",
    "--warmup-steps",
    "0",
    "--lora-rank",
    "4",
    "--save-steps",
    "100",
    "--eval-steps",
    "100",
    "--quiet",
]


def heal_cli(ckpt: Path, data: Path, out: Path, *extra: str) -> int:
    return main(["heal", str(ckpt), "--data", str(data), "--out", str(out), *FAST, *extra])


def test_heal_lowers_held_out_loss_and_writes_a_loadable_checkpoint(tmp_path, heal_inputs, capsys):
    tiny, ckpt, data = heal_inputs
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "8") == 0
    out = tmp_path / "healed"
    assert "held-out loss" in capsys.readouterr().out
    record = json.loads((out / RECORD_NAME).read_text())
    original = json.loads((ckpt / RECORD_NAME).read_text())
    rec = record["recovery"]
    assert rec["val_loss_after"] < rec["val_loss_before"] - 0.3, rec
    assert record["plan"] == original["plan"] and record["point_index"] == original["point_index"]
    assert record["healed_from"]["weights"] == weights_fingerprint(ckpt)  # not only its path and config
    assert {k: rec["data"][k] for k in ("text_field", "val_fraction", "max_tokens")} == {  # they change the weights
        "text_field": "text",
        "val_fraction": 0.05,
        "max_tokens": None,
    }
    assert (
        rec["recipe"]["max_steps"] == 8 and rec["tokens"] == 8 * 4 * 16 and rec["data_sha256"] == rec["data"]["sha256"]
    )
    assert rec["loss"] == "cross-entropy" and rec["seconds"] > 0 and "command" in record["provenance"]
    assert rec["lora_modules"] == sorted(TrainConfig().lora_targets)
    assert rec["precision"] == ("bf16 autocast" if uses_bf16(TrainConfig()) else "float32")
    assert json.loads((out / "config.json").read_text()) == json.loads((ckpt / "config.json").read_text())
    assert (out / "modeling_nsc_llama.py").is_file() and (out / "tokenizer.json").is_file()
    assert not list(out.glob("*.bin")) and not default_work_dir(out).exists()  # work folder removed on success
    # Written as extract writes: shards plus index, the input's tensors by the same names, shapes and dtypes.
    assert not (out / "model.safetensors").exists() and sorted(p.name for p in out.glob("*.safetensors")) == sorted(
        p.name for p in ckpt.glob("*.safetensors")
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    healed, extracted = index_model_dir(out), index_model_dir(ckpt)
    assert {k: (v.dtype, v.shape) for k, v in healed.items()} == {k: (v.dtype, v.shape) for k, v in extracted.items()}
    model = load_pruned(out)
    assert type(model).__name__ == "NscLlamaForCausalLM"
    stock = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    ids = torch.randint(3, 128, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(stock(ids).logits, model(ids).logits)


def test_healing_a_healed_checkpoint_keeps_the_earlier_steps_in_its_history(tmp_path, heal_inputs):
    """A second heal replaced the first one's recovery, healed_from and the extraction's command: the history of a
    chain of commands was lost after one step."""
    _, ckpt, data = heal_inputs
    first, second = tmp_path / "first", tmp_path / "second"
    assert heal_cli(ckpt, data, first, "--max-steps", "2") == 0
    assert heal_cli(first, data, second, "--max-steps", "3") == 0
    extracted, once, twice = (json.loads((p / RECORD_NAME).read_text()) for p in (ckpt, first, second))
    assert once["history"] == [{"step": "extract", "provenance": extracted["provenance"]}]
    earlier = {"step": "heal", **{k: once[k] for k in ("provenance", "recovery", "healed_from")}}
    assert twice["history"] == [*once["history"], earlier]
    assert twice["recovery"]["steps"] == 3 and twice["healed_from"]["path"] == str(first.resolve())
    card = (second / "README.md").read_text()
    assert f"Healed before this run ({once['recovery']['tokens']:,} tokens, held-out loss " in card


def test_a_model_nsc_prune_did_not_cut_is_carded_as_fine_tuned_with_its_licence(tmp_path, heal_inputs):
    """Its card said "A pruned checkpoint healed by nsc-prune heal" with no header, no licence and no load line."""
    from huggingface_hub import ModelCard

    tiny, _, data = heal_inputs
    (tiny.base / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Tiny\n")
    assert heal_cli(tiny.base, data, tmp_path / "tuned", "--max-steps", "2") == 0
    card = ModelCard((tmp_path / "tuned" / "README.md").read_text())
    assert card.data.license == "apache-2.0" and card.data.pipeline_tag == "text-generation"
    assert "A checkpoint fine-tuned by `nsc-prune heal` (not pruned by nsc-prune)." in card.text
    assert 'AutoModelForCausalLM.from_pretrained("tuned")' in card.text and "## Recovery" in card.text


def test_a_base_storing_rotary_buffers_heals_and_teaches(tmp_path, heal_inputs):
    """Older LLaMA conversions store every layer's ``rotary_emb.inv_freq`` (transformers ignores it): psi_W and
    ``extract --selection first`` took such a base, but ``load_pruned`` (heal's student and teacher, the measured
    score's and ``extract --calib``'s streamed layers) refused it as a tensor config.json does not describe."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from nsc_prune import load_pruned

    tiny, ckpt, data = heal_inputs
    base = tmp_path / "old-base"
    shutil.copytree(tiny.base, base)
    index = json.loads((base / "model.safetensors.index.json").read_text())
    shard = base / index["weight_map"]["model.layers.0.self_attn.q_proj.weight"]
    tensors = load_file(shard)
    for i in range(tiny.config["num_hidden_layers"]):
        name = f"model.layers.{i}.self_attn.rotary_emb.inv_freq"
        tensors[name] = torch.rand(8)
        index["weight_map"][name] = shard.name
    save_file(tensors, shard, metadata={"format": "pt"})
    (base / "model.safetensors.index.json").write_text(json.dumps(index))
    load_pruned(base)
    assert heal_cli(base, data, tmp_path / "tuned", "--max-steps", "2") == 0
    assert not any("inv_freq" in name for name in load_pruned(tmp_path / "tuned").state_dict())
    assert heal_cli(ckpt, data, tmp_path / "taught", "--max-steps", "2", "--teacher", str(base)) == 0


def test_a_tied_config_storing_a_head_of_its_own_heals_untied(tmp_path, heal_inputs, tiny_llama):
    """As extract writes it (``tie_as_loaded``): transformers 5 trains such a head untied and heal writes it, so the
    healed config must not say tied (a loader honouring the tie would serve the embedding)."""
    from safetensors.torch import load_file, save_file

    _, _, data = heal_inputs
    tiny = tiny_llama(lora=False, tie=True, max_shard_size="10GB")
    tensors = load_file(tiny.base / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] * 0.5
    save_file(tensors, tiny.base / "model.safetensors", metadata={"format": "pt"})
    assert heal_cli(tiny.base, data, tmp_path / "tuned", "--max-steps", "1") == 0
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["tie_word_embeddings"] is False
    healed = {}
    for shard in (tmp_path / "tuned").glob("*.safetensors"):
        healed |= load_file(shard)
    assert not torch.equal(healed["lm_head.weight"], healed["model.embed_tokens.weight"])


def test_an_existing_healed_checkpoint_is_replaced_only_with_overwrite(tmp_path, heal_inputs, capsys):
    """docs/outputs.md: heal into its own earlier output is refused (one line, unchanged); --overwrite replaces."""
    _, ckpt, data = heal_inputs
    out = tmp_path / "healed"
    assert heal_cli(ckpt, data, out, "--max-steps", "1") == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert heal_cli(ckpt, data, out, "--max-steps", "2") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "already exists; pass --overwrite" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert heal_cli(ckpt, data, out, "--max-steps", "2", "--overwrite") == 0
    record = json.loads((out / RECORD_NAME).read_text())
    assert record["recovery"]["steps"] == 2  # and it lists its own files, not the extraction's it copied
    assert record["files"] == sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def test_a_healed_base_states_its_rope_as_transformers_4_reads_it(tmp_path, heal_inputs):
    """heal wrote the input's config as it was: a base saved by transformers 5 (rope in rope_parameters alone) ran
    at theta 10000 in transformers 4.x after healing; extract's outputs state rope_theta (legacy_rope_keys)."""
    tiny, _, data = heal_inputs
    config = json.loads((tiny.base / "config.json").read_text())
    assert "rope_theta" not in config and config["rope_parameters"]["rope_theta"] == 10000.0
    assert heal_cli(tiny.base, data, tmp_path / "healed", "--max-steps", "1") == 0  # a dense base heals too
    healed = json.loads((tmp_path / "healed" / "config.json").read_text())
    assert healed == {**config, "rope_theta": 10000.0}


def test_heal_leaves_the_callers_random_state_as_it_was(tmp_path, heal_inputs):
    """heal seeds its own run (transformers.set_seed, the Trainer): a notebook's random, numpy and torch generators
    were left at seed 0's state whatever the caller had seeded."""
    import random

    import numpy as np

    from nsc_prune.hf.train.heal import heal

    _, ckpt, data = heal_inputs
    config = TrainConfig(seq_len=16, batch_size=4, max_steps=1, warmup_steps=0, lora_rank=4)

    def seeded_then_drawn(work=lambda: None):
        random.seed(5), np.random.seed(5), torch.manual_seed(5)
        work()
        return random.random(), float(np.random.rand()), torch.rand(2).tolist()

    after = seeded_then_drawn(lambda: heal(ckpt, [str(data)], tmp_path / "healed", config, progress=False))
    assert after == seeded_then_drawn()


def test_heal_without_progress_draws_no_bar_and_leaves_transformers_setting_alone(tmp_path, heal_inputs, capsys,
                                                                                  monkeypatch, transformers_bars_on):  # fmt: skip
    """heal(progress=False) draws none of the bars heal(progress=True) draws on a terminal (transformers' loading bar,
    the held-out loss), and leaves transformers' global bar setting as it found it."""
    from nsc_prune.hf.train.heal import heal

    _, ckpt, data = heal_inputs
    config = TrainConfig(seq_len=16, batch_size=4, max_steps=1, warmup_steps=0, lora_rank=4)
    monkeypatch.setattr(type(sys.stderr), "isatty", lambda self: True)  # stderr is capsys's
    capsys.readouterr()
    heal(ckpt, [str(data)], tmp_path / "shown", config, progress=True)
    shown = capsys.readouterr().err
    heal(ckpt, [str(data)], tmp_path / "hidden", config, progress=False)
    hidden = capsys.readouterr().err
    assert transformers_bars_on.is_progress_bar_enabled()
    assert "Loading weights" in shown and "held-out loss" in shown and "tokenizing" in shown
    assert "Loading weights" not in hidden and "held-out loss" not in hidden and "tokenizing" not in hidden


def test_quiet_silences_the_checkpoint_saves_bar(tmp_path, heal_inputs, capsys, monkeypatch, transformers_bars_on):
    """--full checkpoints save every weight through transformers, whose "Writing model shards" bar --quiet silences
    as it does its loading bar, even on a terminal."""
    _, ckpt, data = heal_inputs
    monkeypatch.setattr(type(sys.stderr), "isatty", lambda self: True)  # stderr is capsys's
    capsys.readouterr()
    full = [*FAST[: FAST.index("--lora-rank")], *FAST[FAST.index("--lora-rank") + 2 :]]  # --full has no LoRA rank
    argv = ["heal", str(ckpt), "--data", str(data), "--out", str(tmp_path / "healed"), *full, "--max-steps", "2"]
    said = []  # transformers' own log lines (its handler, not capsys): checkpoints under a second apart made it say
    handler = logging.Handler(logging.WARNING)  # "mtime may not be reliable on this filesystem", though nothing was
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)
    try:
        assert main([*argv, "--full", "--save-steps", "1"]) == 0
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert "Writing model shards" not in capsys.readouterr().err
    assert not [line for line in said if "mtime" in line], said


def test_one_sample_a_line_text_heals_at_the_models_context(tmp_path, heal_inputs):
    """A text with one sample a line (no blank line) trains; the record says how it was split; without --seq-len
    the blocks follow the model's context (128 here, below the default 512)."""
    tiny, ckpt, _ = heal_inputs
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(" ".join(f"w{3 + (i + k) % 7}" for k in range(20)) for i in range(40)) + "\n")
    argv = ["heal", str(ckpt), "--data", str(data), "--out", str(tmp_path / "healed"), "--quiet"]
    assert main([*argv, "--max-steps", "2", "--set", "batch_size=2", "--save-steps", "100", "--eval-steps", "100"]) == 0
    rec = json.loads((tmp_path / "healed" / RECORD_NAME).read_text())["recovery"]
    assert rec["recipe"]["seq_len"] == 128 and rec["data"]["seq_len"] == 128
    assert rec["data"]["sources"][0]["documents_by"] == "lines" and rec["data"]["documents"] == 40
    assert rec["data"]["split"] == "documents" and rec["data"]["val_blocks"] >= 1


def test_written_logits_equal_the_in_memory_merged_model(tmp_path, heal_inputs):
    _, ckpt, _ = heal_inputs
    model = prepare_model(load_pruned(ckpt, dtype=torch.float32), TrainConfig(lora_rank=4, seq_len=16))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)  # B = 0 at init: make the adapter matter
    merged = model.merge_and_unload().eval()
    config = json.loads((ckpt / "config.json").read_text())
    write_healed(
        merged,
        ckpt,
        tmp_path / "out",
        config,
        {
            "recipe": TrainConfig().to_dict(),
            "loss": "cross-entropy",
            "tokens": 1,
            "steps": 1,
            "val_loss_before": 1.0,
            "val_loss_after": 0.5,
        },
        overwrite=False,
    )
    loaded = load_pruned(tmp_path / "out")
    before = load_pruned(ckpt)
    ids = torch.randint(3, 128, (2, 12), generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, merged(ids).logits, atol=1e-6, rtol=0)
        assert not torch.allclose(loaded(ids).logits, before(ids).logits, atol=1e-3)


def test_a_checkpoint_record_whose_provenance_is_not_an_object_is_written_over(tmp_path, heal_inputs):
    """write_healed read the checkpoint record's provenance as an object: a string there crashed heal after the
    whole training run, every --resume the same way."""
    import shutil

    _, ckpt, _ = heal_inputs
    odd = tmp_path / "odd"
    shutil.copytree(ckpt, odd)
    record = json.loads((odd / RECORD_NAME).read_text())
    (odd / RECORD_NAME).write_text(json.dumps({**record, "provenance": "x"}))
    recovery = {"recipe": TrainConfig().to_dict(), "loss": "cross-entropy", "tokens": 1, "steps": 1,
                "val_loss_before": 1.0, "val_loss_after": 0.5}  # fmt: skip
    config = json.loads((odd / "config.json").read_text())
    write_healed(load_pruned(odd).eval(), odd, tmp_path / "out", config, recovery, overwrite=False)
    assert isinstance(json.loads((tmp_path / "out" / RECORD_NAME).read_text())["provenance"], dict)


@pytest.mark.parametrize("cached", [False, True])
def test_the_held_out_loss_and_the_teacher_run_on_the_training_device(tmp_path, heal_inputs, monkeypatch, cached):
    """Before training, heal moves the student and the teacher to where training will run (a GPU when there is
    one) before it measures the held-out loss or computes cached teacher logits: not a CPU pass on a GPU machine."""
    import nsc_prune.hf.train.heal as heal_module

    tiny, ckpt, data = heal_inputs
    device, moved, measured = torch.device("cpu"), set(), []
    to = torch.nn.Module.to

    def spy_to(module, *args, **kwargs):
        if args and args[0] is device:
            moved.add(id(module))
        return to(module, *args, **kwargs)

    def spy(function):
        def run(model, *args, **kwargs):
            measured.append(id(model) in moved)
            return function(model, *args, **kwargs)

        return run

    monkeypatch.setattr(torch.nn.Module, "to", spy_to)
    monkeypatch.setattr(heal_module, "training_device", lambda: device)
    monkeypatch.setattr(heal_module, "untrained_loss", spy(heal_module.untrained_loss))
    monkeypatch.setattr(heal_module, "compute_teacher_logits", spy(heal_module.compute_teacher_logits))
    extra = ["--teacher-logits", str(tmp_path / "t.safetensors")] if cached else []
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "1", "--teacher", str(tiny.base), *extra) == 0
    assert measured[:2] == [True, True]  # the student's held-out loss, then the teacher's loss or its logits


def test_distill_resume_and_resume_with_other_settings(tmp_path, heal_inputs, tiny_llama, capsys):
    tiny, ckpt, data = heal_inputs
    out = tmp_path / "kd"
    assert heal_cli(ckpt, data, out, "--max-steps", "2", "--teacher", str(tiny.base), "--keep-checkpoints") == 0
    record = json.loads((out / RECORD_NAME).read_text())["recovery"]
    assert record["loss"] == "distillation" and record["recipe"]["distill"] and record["val_loss_teacher"] is not None
    assert default_work_dir(out).is_dir()
    capsys.readouterr()
    code = heal_cli(
        ckpt,
        data,
        tmp_path / "kd2",
        "--max-steps",
        "3",
        "--teacher",
        str(tiny.base),
        "--resume",
        "--work-dir",
        str(default_work_dir(out)),
    )
    err = capsys.readouterr().err
    assert code == 2 and "other settings (max_steps differ)" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "kd2").exists()
    # another checkpoint or teacher of the same shapes resumed the run without a word
    other_ckpt = Path(shutil.copytree(ckpt, tmp_path / "other-ckpt"))
    spoil_weight(other_ckpt, "model.layers.0.mlp.up_proj.weight")  # refused before it is loaded
    other_teacher = tiny_llama(gqa=True, seed=1).base
    for student, teacher, changed in ((other_ckpt, tiny.base, "checkpoint"), (ckpt, other_teacher, "teacher")):
        resume = ["--max-steps", "2", "--teacher", str(teacher), "--resume", "--work-dir", str(default_work_dir(out))]
        capsys.readouterr()
        assert heal_cli(student, data, tmp_path / "kd3", *resume) == 2
        err = capsys.readouterr().err
        assert f"other settings ({changed} differ)" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "kd3").exists()


def test_a_run_on_a_dataset_whose_files_were_touched_resumes(tmp_path, heal_inputs, capsys, monkeypatch):
    """An hf: dataset's digest follows its files' times (and the split as typed): a resume after a copy or a touch
    was refused as "other settings (data_sha256 differ)" though it read the same blocks."""
    pytest.importorskip("datasets")
    _, ckpt, data = heal_inputs
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "ds").mkdir()
    docs = [doc for doc in data.read_text().split("\n\n") if doc.strip()]
    (tmp_path / "ds" / "train.jsonl").write_text("\n".join(json.dumps({"text": doc}) for doc in docs))
    work = tmp_path / "work"
    argv = ["--max-steps", "2", "--keep-checkpoints", "--work-dir", str(work)]
    assert heal_cli(ckpt, f"hf:{tmp_path / 'ds'}", tmp_path / "healed", *argv) == 0
    os.utime(tmp_path / "ds" / "train.jsonl", (1_000_000_000, 1_000_000_000))
    capsys.readouterr()
    assert heal_cli(ckpt, f"hf:{tmp_path / 'ds'}", tmp_path / "again", *argv, "--resume") == 0, capsys.readouterr().err
    (tmp_path / "ds" / "train.jsonl").write_text("\n".join(json.dumps({"text": doc}) for doc in docs[:-3]))
    assert heal_cli(ckpt, f"hf:{tmp_path / 'ds'}", tmp_path / "third", *argv, "--resume") == 2  # other text
    assert "which used other --data content (data_sha256, blocks_sha256 differ)" in capsys.readouterr().err


def test_resume_with_no_earlier_run_says_it_starts_at_the_first_step(tmp_path, heal_inputs, capsys):
    """A job script may pass --resume whether or not a run was stopped: with no checkpoint to continue from, heal
    trains from the first step and says so once on stderr."""
    _, ckpt, data = heal_inputs
    capsys.readouterr()
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "1", "--resume") == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "--resume" in line]
    assert said == [
        f"nsc-prune: warning: --resume: {default_work_dir(tmp_path / 'healed') / 'checkpoints'} holds no checkpoint "
        "to continue from; starting at the first step"
    ], err
    assert (tmp_path / "healed" / RECORD_NAME).is_file()


def test_resume_from_checkpoints_without_their_run_record_is_refused(tmp_path, heal_inputs, capsys):
    """Checkpoints with no nsc_prune_train.json (another tool's, or a record deleted) cannot be checked against this
    run's settings: --resume refuses them in one line and leaves them, where it resumed them silently."""
    _, ckpt, data = heal_inputs
    work = tmp_path / "work"
    (work / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    capsys.readouterr()
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "1", "--resume", "--work-dir", str(work)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds checkpoints but no nsc_prune_train.json" in err, err
    assert (work / "checkpoints" / "checkpoint-1").is_dir() and not (tmp_path / "healed").exists()


@pytest.mark.parametrize("case", ["the-checkpoint", "a-folder-of-yours", "a-parent-of-out"])
def test_a_work_dir_that_removing_would_lose_data_is_refused(tmp_path, heal_inputs, capsys, case):
    """heal removes its work folder when it succeeds: one that is an input, holds files heal did not write, or
    holds the output is refused in one line before anything is written, and left as it was."""
    _, ckpt, data = heal_inputs
    out = tmp_path / "healed"
    work = {"the-checkpoint": ckpt, "a-folder-of-yours": tmp_path / "mine", "a-parent-of-out": tmp_path}[case]
    if case == "a-folder-of-yours":
        work.mkdir()
        (work / "keep.txt").write_text("important")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    capsys.readouterr()
    assert heal_cli(ckpt, data, out, "--max-steps", "1", "--work-dir", str(work)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--work-dir" in err, err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    "variable, plugin", [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")]
)
def test_a_sharded_launch_is_refused_in_one_line(tmp_path, heal_inputs, capsys, monkeypatch, variable, plugin):
    """``accelerate launch --use_fsdp`` / ``--use_deepspeed`` set these: heal merges and writes the unwrapped model,
    which they leave sharded, so it refuses before loading anything."""
    _, ckpt, data = heal_inputs
    monkeypatch.setenv(variable, "true")
    before = sorted(tmp_path.iterdir())
    assert heal_cli(ckpt, data, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"asks for {plugin} ({variable} is set)" in err, err
    assert "--multi_gpu" in err and sorted(tmp_path.iterdir()) == before
    monkeypatch.setenv(variable, "false")  # accelerate's own spelling of "not asked for"
    assert heal_cli(ckpt, data, tmp_path / "out", "--max-steps", "1") == 0


@pytest.mark.parametrize(
    "case, match",
    [
        ("missing-data", "must be an existing file"),
        ("empty-data", "is empty"),
        ("short-data", "at least 32 tokens"),
        ("seq-len", r"--seq-len must be at most the model's max_position_embeddings \(128\)"),
        ("existing-out", "--overwrite replaces only a checkpoint written by nsc-prune"),  # said at once
        ("teacher-vocab", "the teacher's vocab_size must be the student's (128); got 96"),
        # was trained on the teacher's targets past its context (and cached them with --teacher-logits)
        ("teacher-context", r"--seq-len must be at most the teacher's max_position_embeddings \(8\); got 16"),
        ("not-a-checkpoint", "CKPT must be a checkpoint folder"),
        ("bad-recipe", "--max-steps must be an integer >= 1"),
        ("bad-schedule", "schedule must be one of cosine, wsd; got 'step'"),
        ("unknown-set-key", r"--set KEY must be a TrainConfig field; got 'batchsize'\. Did you mean batch_size\?"),
        ("set-full", "--set full is not a heal setting: pass --full instead"),
        ("text-field-of-text", "--text-field body would be ignored: every --data is plain text"),  # was ignored, unsaid
        ("text-field-of-a-missing-file", "must be an existing file"),
        ("work-dir-inside-dataset", r"--out \S+ds/healed is inside the folder of the dataset hf:\S+ds, whose files"),
        # were tracebacks, or a refusal after the training that left its checkpoints behind
        ("config-text-size", r"CKPT .*: config.json does not load in transformers: .*'num_hidden_layers' expected int"),
        ("config-layer-text-width", r"transformers cannot build a model from config.json: .*expected int"),  # 2 lines
        ("config-other-width", r"does not match its config.json: tensor model\.layers\.\d\.mlp\.\w+\.weight should be"),
        ("spoilt-record", "nsc_prune_extract.json must hold a JSON object, got str"),
        ("record-cost-a-string", "nsc_prune_extract.json is damaged ('str' object has no attribute 'get')"),
        ("record-plan-short", "nsc_prune_extract.json plans 1 kept layers for a model of 3 \\(config.json\\)"),
        ("nan-learning-rate", "--learning-rate must be a finite number > 0; got nan"),
        ("out-inside-checkpoint", "healed is inside the model folder"),  # the checkpoint then held a foreign folder
        ("logits-folder", r"--teacher-logits \S+cache/ ends in '/', which names a folder"),  # wrote a file 'cache'
        ("work-dir-is-out", "--work-dir must not be --out"),  # was "--out must not be or contain an input: o is o"
        ("work-dir-inside-checkpoint", r"--work-dir \S+wk is inside the model folder"),  # a stopped run's files there
        ("stock-type", r"the model_type of CKPT \S+ must be one of \[.*\]; got 'gpt2'$"),  # "load it with transformers"
        (
            "huge-lora-rank",
            "--lora-rank must be at most 64, the largest rank of a targeted matrix; got 1180591620717411303424",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, heal_inputs, tiny_llama, capsys, case, match):
    tiny, ckpt, data = heal_inputs
    out, extra = tmp_path / "out", []
    if case == "missing-data":
        data = tmp_path / "nope.txt"
    elif case == "empty-data":
        data = tmp_path / "empty.txt"
        data.write_text("")
    elif case == "short-data":
        data = tmp_path / "short.txt"
        data.write_text("w3 w4 w5")
    elif case == "seq-len":
        extra = ["--seq-len", "129"]
    elif case == "existing-out":
        out.mkdir()
        (out / "x").write_text("keep me")
    elif case == "teacher-vocab":
        extra = ["--teacher", str(tiny_llama(vocab=96, lora=False).base)]
    elif case == "teacher-context":
        teacher = Path(shutil.copytree(tiny.base, tmp_path / "short-teacher"))
        config = json.loads((teacher / "config.json").read_text())
        (teacher / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8}))
        extra = ["--teacher", str(teacher)]
        assert heal_module._for_contexts(TrainConfig(), {"max_position_embeddings": 128}, teacher).seq_len == 8
    elif case == "not-a-checkpoint":
        ckpt = tmp_path / "nothing"
        ckpt.mkdir()
    elif case == "bad-recipe":
        extra = ["--max-steps", "0"]
    elif case == "bad-schedule":
        extra = ["--schedule", "step"]
    elif case == "unknown-set-key":
        extra = ["--set", "batchsize=2"]
    elif case == "set-full":
        extra = ["--set", "full=true"]
    elif case == "text-field-of-text":
        extra = ["--text-field", "body"]
    elif case == "text-field-of-a-missing-file":  # a typo: the file is named, not the field
        data, extra = tmp_path / "trian.josnl", ["--text-field", "body"]
    elif case == "work-dir-inside-dataset":  # datasets read the checkpoints' nsc_prune_train.json as data
        (tmp_path / "ds").mkdir()
        data, out = f"hf:{tmp_path / 'ds'}", tmp_path / "ds" / "healed"
    elif case.startswith("config-"):
        config = json.loads((ckpt / "config.json").read_text())
        edit = {"num_hidden_layers": "two"} if case == "config-text-size" else {"intermediate_size": 100}
        if case == "config-layer-text-width":
            layers = config["per_layer_config"]
            edit = {"per_layer_config": {**layers, "0": {**layers.get("0", {}), "intermediate_size": "96"}}}
        (ckpt / "config.json").write_text(json.dumps({**config, **edit}))
    elif case == "spoilt-record":
        (ckpt / RECORD_NAME).write_text('"hello"')
    elif case.startswith("record-"):
        record = json.loads((ckpt / RECORD_NAME).read_text())
        edit = {"cost": "x"} if case == "record-cost-a-string" else {"plan": record["plan"][:1]}
        (ckpt / RECORD_NAME).write_text(json.dumps({**record, **edit}))
    elif case == "nan-learning-rate":
        extra = ["--learning-rate", "nan"]
    elif case == "out-inside-checkpoint":
        out = ckpt / "healed"
    elif case == "logits-folder":
        extra = ["--teacher", str(tiny.base), "--teacher-logits", str(tmp_path / "cache") + "/"]
    elif case == "work-dir-is-out":
        extra = ["--work-dir", str(out)]
    elif case == "work-dir-inside-checkpoint":
        extra = ["--work-dir", str(ckpt / "wk")]
    elif case == "huge-lora-rank":
        extra = ["--lora-rank", str(2**70)]
    elif case == "stock-type":
        config = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()  # what the fixtures printed (transformers' bar saving the teacher)
    code = heal_cli(ckpt, data, out, *extra)
    err = capsys.readouterr().err
    assert code == 2, err
    assert match.replace("\\", "") in err or __import__("re").search(match, err), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if case == "existing-out":
        assert (out / "x").read_text() == "keep me"


def _timed_heal(tmp_path, heal_inputs, monkeypatch, clock, minutes: str, warmup: str):
    """``heal --minutes`` (distilled from the tiny base) with the budget read on ``clock``: the output and its
    recovery record."""
    import nsc_prune.cli.heal as heal_command
    from nsc_prune.hf.train.budget import TimeBudget

    tiny, ckpt, data = heal_inputs
    monkeypatch.setattr(heal_command, "time_budget", lambda args, settings: TimeBudget(args.minutes, clock=clock))
    out = tmp_path / "timed"
    assert heal_cli(ckpt, data, out, "--minutes", minutes, "--teacher", str(tiny.base), "--warmup-steps", warmup) == 0
    return out, json.loads((out / RECORD_NAME).read_text())["recovery"]


def test_minutes_sizes_the_run_end_to_end(tmp_path, heal_inputs, capsys, monkeypatch):
    import itertools

    # A fake clock (1 s a reading: 3 s of probe, 1 s a step): 0.25 minutes = 15 s -> 12 steps, warm-up 1.
    out, rec = _timed_heal(tmp_path, heal_inputs, monkeypatch, itertools.count(0.0, 1.0).__next__, "0.25", "20")
    assert "time budget: 0.25 min asked" in capsys.readouterr().out
    timed = rec["time_budget"]
    assert (timed["max_steps"], timed["warmup_steps"], timed["minutes_asked"]) == (12, 1, 0.25)
    assert timed["tokens_per_s_measured"] == 4 * 16 and timed["probe_passes"] == 3 and not timed["resumed"]
    assert rec["steps"] == 12 and rec["recipe"]["max_steps"] == 12 and rec["recipe"]["warmup_steps"] == 1
    assert timed["probe_max_steps"] == 12 and timed["run_step_seconds"] == 1.0  # its own steps: 1 s, the same 12
    assert "Time budget: 0.25 minutes asked" in (out / "README.md").read_text()


def test_minutes_re_sizes_the_run_from_its_warm_up_end_to_end(tmp_path, heal_inputs, capsys, monkeypatch):
    from tests.hf.test_train_budget import two_speed_clock

    # Probe passes 2 s, steps 1.5 s: 1 minute -> the probe's 27 steps (warm-up 2) -> 36 (tests/hf/test_train_budget).
    out, rec = _timed_heal(tmp_path, heal_inputs, monkeypatch, two_speed_clock(2.0, 1.5), "1", "5")
    assert "probe -> 27 steps, 2 warm-up; 42 tokens/s measured -> 36 steps" in capsys.readouterr().out
    timed = rec["time_budget"]  # (tests/hf/test_train_budget: the tokens of the timed steps, short batches included)
    assert (timed["probe_max_steps"], timed["max_steps"], timed["run_step_seconds"]) == (27, 36, 1.5)
    assert rec["steps"] == 36 and (rec["recipe"]["max_steps"], rec["recipe"]["warmup_steps"]) == (36, 2)
    assert "re-sizing it to 36 steps" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--minutes", "0.25", "--max-steps", "3"], "--minutes and --max-steps both fix the run's length"),
        (["--minutes", "0.25", "--set", "max_steps=3"], "--minutes and --max-steps both fix the run's length"),
        (["--minutes", "0"], "--minutes must be a number > 0"),
        (["--minutes", "1e308"], "--minutes must be at most 527,040 (a year); got 1e+308"),  # was an OverflowError
        (["--minutes", "0.0000001"], "--minutes must be enough for one training step"),
    ],
)
def test_minutes_refusals_are_one_line_exit_2_nothing_written(tmp_path, heal_inputs, capsys, extra, match):
    tiny, ckpt, data = heal_inputs
    before = sorted(p.name for p in tmp_path.iterdir())
    assert heal_cli(ckpt, data, tmp_path / "out", *extra) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("signum", STOP_SIGNALS)  # a preemption, a closed terminal
def test_sigterm_exits_143_naming_the_checkpoint_and_resume_finishes(
    tmp_path, heal_inputs, sigterm_at_step, capsys, signals_as_in_a_terminal, signum
):
    tiny, ckpt, data = heal_inputs
    sigterm_at_step(2, signum)
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "4") == 128 + signum  # as the signal ends one
    err = capsys.readouterr().err.strip()
    said = f"nsc-prune: stopped by {signum.name} after step 2; the checkpoint is in "
    assert err.startswith(said) and "--resume" in err
    assert not (tmp_path / "healed").exists()
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "4", "--resume") == 0
    recovery = json.loads((tmp_path / "healed" / RECORD_NAME).read_text())["recovery"]
    assert recovery["steps"] == 4 and recovery["resumed_from_step"] == 2  # its seconds are the last two steps'
    assert "; resumed at step 2: the time is this run's" in capsys.readouterr().out


@pytest.mark.parametrize(("signum", "status", "said"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "")])
def test_a_stop_while_the_output_is_written_names_the_finished_run(
    tmp_path, heal_inputs, monkeypatch, capsys, signals_as_in_a_terminal, signum, status, said
):
    """A stop after the last step (during the merge, the held-out loss or the write) said "nothing was written"
    though the finished run's checkpoint waits in the work folder; --resume writes it without training again."""
    tiny, ckpt, data = heal_inputs
    write = heal_module.write_healed

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signum)
        return write(*args, **kwargs)

    monkeypatch.setattr(heal_module, "write_healed", stopped)
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "3") == status
    err = capsys.readouterr().err.strip()
    expected = "stopped by SIGTERM after step 3; the checkpoint is in " if not said else "the finished run is in "
    assert expected in err and "--resume" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "healed").exists()
    monkeypatch.setattr(heal_module, "write_healed", write)
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "3", "--resume") == 0
    recovery = json.loads((tmp_path / "healed" / RECORD_NAME).read_text())["recovery"]
    assert recovery["steps"] == 3 and recovery["resumed_from_step"] == 3  # no step trained again


def test_a_work_folder_in_use_by_another_run_is_refused_at_once(tmp_path, heal_inputs, capsys):
    """Two heals of one --out (a job array, the same command in two terminals) trained into one OUT.heal: the first
    to finish removed the other's checkpoints and run record, whose --resume was then refused (32 steps lost)."""
    from nsc_prune._io import claimed_work_dir
    from nsc_prune.hf.train.supernet import state_dir

    _, ckpt, data = heal_inputs
    out = tmp_path / "healed"
    with claimed_work_dir(tmp_path / "healed.heal"):  # another heal of the same --out, running
        assert heal_cli(ckpt, data, out, "--max-steps", "2") == 2
        err = capsys.readouterr().err
        assert f"the work folder {tmp_path / 'healed.heal'} is in use by another nsc-prune run" in err, err
        argv = ["train-supernet", "--base", str(ckpt), "--space", "ffn-grid", "--data", str(data), "--out", str(out),
                "--work-dir", str(tmp_path / "healed.heal")]  # fmt: skip
        assert main(argv) == 2 and "is in use by another nsc-prune run" in capsys.readouterr().err
        assert heal_cli(ckpt, data, out, "--max-steps", "2", "--work-dir", str(tmp_path / "own")) == 0  # its own
    assert not (tmp_path / "healed.heal").exists() and state_dir(out) != tmp_path / "healed.heal"
    assert heal_cli(ckpt, data, tmp_path / "again", "--max-steps", "2") == 0  # released with the run


def test_a_full_disk_while_the_output_is_written_names_the_finished_run(tmp_path, heal_inputs, monkeypatch, capsys):
    """A full disk while the healed model was written said only "No space left on device": no path, and not that
    the finished run waits in the work folder for --resume to write it."""
    import errno

    tiny, ckpt, data = heal_inputs
    write = heal_module.write_healed

    def full_disk(*args, **kwargs):
        raise OSError(
            errno.ENOSPC, "No space left on device", str(tmp_path / ".healed.x.partial" / "model.safetensors")
        )

    monkeypatch.setattr(heal_module, "write_healed", full_disk)
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "3") == 2
    err = capsys.readouterr().err.strip()
    assert "could not write the output (No space left on device: " in err and "model.safetensors" in err, err
    assert "the finished run is in " in err and "make room, then run the same command with --resume" in err, err
    monkeypatch.setattr(heal_module, "write_healed", write)
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "3", "--resume") == 0
    assert json.loads((tmp_path / "healed" / RECORD_NAME).read_text())["recovery"]["resumed_from_step"] == 3


def _zero_rows_and_columns(folder: Path) -> dict[str, tuple[list[int], list[int]]]:
    """Each 2-D weight's all-zero rows and columns."""
    from safetensors.torch import load_file

    found = {}
    for shard in sorted(folder.glob("*.safetensors")):
        for name, tensor in load_file(shard).items():
            if tensor.dim() == 2:
                rows, cols = tensor.ne(0).any(dim=1), tensor.ne(0).any(dim=0)
                found[name] = ((~rows).nonzero().flatten().tolist(), (~cols).nonzero().flatten().tolist())
    return found


@pytest.mark.parametrize(("fmt", "extra"), [("padded", []), ("nemotron-nas", []), ("nemotron-nas", ["--full"])])
def test_heal_keeps_the_units_a_checkpoint_holds_as_zeros_at_zero(tmp_path, tiny_llama, write_plan, fmt, extra):
    """A padded or nemotron-nas checkpoint keeps a cut head or channel as zeros; LoRA's B, shared by every column
    of o_proj and down_proj, brought them back (a zero query head then passed the mean of its values on)."""
    from nsc_prune.hf.extract import ExtractOptions, extract_subnet

    tiny = tiny_llama(gqa=True, lora=False)  # 4 query heads in 2 KV groups
    layers = [{"ffn": 40, "kv_groups": 1}, {"ffn": 96, "kv_groups": 2}, {"ffn": 0, "kv_groups": 0, "keep": False}]
    plan = write_plan(tmp_path / "pareto.json", layers, tiny.config)
    ckpt = extract_subnet(
        plan, tiny.base, tmp_path / "ckpt", point=0, options=ExtractOptions(format=fmt, dtype="float32")
    )
    data = tmp_path / "a.txt"
    data.write_text("\n\n".join(" ".join(f"w{3 + (i + k) % 7}" for k in range(20 + i % 5)) for i in range(40)))
    rank = FAST.index("--lora-rank")
    fast = FAST[:rank] + FAST[rank + 2 :] if extra else FAST  # --full takes no rank
    argv = ["heal", str(ckpt), "--data", str(data), "--out", str(tmp_path / "healed"), *fast, "--max-steps", "12"]
    assert main([*argv, *extra]) == 0
    before, after = _zero_rows_and_columns(ckpt), _zero_rows_and_columns(tmp_path / "healed")
    zero_heads = before["model.layers.0.self_attn.o_proj.weight"][1]
    zero_channels = before["model.layers.0.mlp.down_proj.weight"][1]  # nemotron-nas writes the FFN narrow
    assert len(zero_heads) == 2 * 16 and len(zero_channels) == (96 - 40 if fmt == "padded" else 0)
    for name, (rows, cols) in before.items():  # every zero row and column stays zero
        assert set(rows) <= set(after[name][0]) and set(cols) <= set(after[name][1]), name
    recovery = json.loads((tmp_path / "healed" / RECORD_NAME).read_text())["recovery"]
    assert recovery["val_loss_after"] < recovery["val_loss_before"] - 0.1  # the live units did learn
    if fmt == "nemotron-nas":  # the card's trust_remote_code load: the healed folder lacked auto_map's code
        shipped = sorted(p.name for p in ckpt.glob("*.py"))
        assert shipped and sorted(p.name for p in (tmp_path / "healed").glob("*.py")) == shipped
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "healed", trust_remote_code=True)


def test_only_a_projection_with_every_column_and_its_bias_zero_is_silenced():
    """A partly cut projection keeps its live columns' output while healing; a dropped layer's outputs zeros."""
    from nsc_prune.hf.train.padding import zero_columns, zero_columns_masked

    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"cut": torch.nn.ModuleDict({"o_proj": torch.nn.Linear(4, 3, bias=False)})})
    model.add_module("dropped", torch.nn.ModuleDict({"down_proj": torch.nn.Linear(4, 3)}))
    model.add_module("biased", torch.nn.ModuleDict({"down_proj": torch.nn.Linear(4, 3)}))  # no column, a bias
    with torch.no_grad():
        model.cut.o_proj.weight[:, 0] = 0
        for name in ("dropped", "biased"):
            model[name].down_proj.weight.zero_()
        model.dropped.down_proj.bias.zero_()
        model.biased.down_proj.bias.fill_(1.0)
        model.cut.o_proj.weight[:, 1:] += 1.0  # no live column is zero by chance
    zeros = zero_columns(model)
    assert sorted(zeros) == ["biased.down_proj", "cut.o_proj", "dropped.down_proj"]
    assert zeros["cut.o_proj"].tolist() == [1, 0, 0, 0]
    x = torch.ones(1, 4)
    with zero_columns_masked(model, zeros):
        with torch.no_grad():
            model.cut.o_proj.weight[:, 0] = 5.0  # what a step could write into the cut column is not read
            model.dropped.down_proj.bias.fill_(2.0)  # nor into the dropped layer's bias (--full trains it)
            model.dropped.down_proj.weight.fill_(3.0)
        assert torch.equal(model.cut.o_proj(x), x[:, 1:] @ model.cut.o_proj.weight[:, 1:].T)
        assert model.cut.o_proj(x).abs().min() > 0 and not model.dropped.down_proj(x).any()
        assert torch.equal(model.biased.down_proj(x), torch.ones(1, 3))  # its bias is its output: kept


def test_a_full_heal_keeps_a_padded_dropped_layer_silent(tmp_path, tiny_llama, write_plan):
    """A padded checkpoint keeps a dropped layer as zeros, biases included; ``--full`` trained its o_proj and
    down_proj biases, which then added a constant to the residual stream: the layer the plan dropped came back."""
    from safetensors.torch import load_file

    from nsc_prune.hf.extract import ExtractOptions, extract_subnet

    tiny = tiny_llama(gqa=True, lora=False, bias=True)
    layers = [{"ffn": 40, "kv_groups": 1}, {"ffn": 96, "kv_groups": 2}, {"ffn": 0, "kv_groups": 0, "keep": False}]
    plan = write_plan(tmp_path / "pareto.json", layers, tiny.config)
    options = ExtractOptions(format="padded", dtype="float32")
    ckpt = extract_subnet(plan, tiny.base, tmp_path / "ckpt", point=0, options=options)
    data = tmp_path / "a.txt"
    data.write_text("\n\n".join(" ".join(f"w{3 + (i + k) % 7}" for k in range(20 + i % 5)) for i in range(40)))
    rank = FAST.index("--lora-rank")
    argv = ["heal", str(ckpt), "--data", str(data), "--out", str(tmp_path / "healed"), "--full"]
    assert main([*argv, *FAST[:rank], *FAST[rank + 2 :], "--max-steps", "6", "--learning-rate", "1e-2"]) == 0
    healed = {}
    for shard in sorted((tmp_path / "healed").glob("*.safetensors")):
        healed |= load_file(shard)
    dropped = {name: t for name, t in healed.items() if name.startswith("model.layers.2.")}
    assert {"model.layers.2.self_attn.o_proj.bias", "model.layers.2.mlp.down_proj.bias"} <= set(dropped)
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        assert not dropped[f"model.layers.2.{name}.weight"].any() and not dropped[f"model.layers.2.{name}.bias"].any()
    assert healed["model.layers.1.mlp.down_proj.bias"].any()  # a kept layer's bias did train


@pytest.mark.parametrize("stop", ["diverged", "ctrl-c"])
def test_a_heal_stopped_before_its_first_checkpoint_leaves_no_work_folder(
    tmp_path, heal_inputs, capsys, monkeypatch, stop
):
    """It said nothing was written and left OUT.heal/checkpoints/nsc_prune_train.json, which the next run had to pass
    over; the divergence message told the user to remove a folder nothing is in. The new folders above OUT stayed."""
    _, ckpt, data = heal_inputs
    flags = ["--max-steps", "4", "--set", "save_steps=100"]
    if stop == "diverged":
        flags += ["--learning-rate", "1e30"]
    else:
        from nsc_prune.hf.train import trainer

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(trainer.RecoveryTrainer, "training_step", interrupted)
    before = sorted(tmp_path.iterdir())
    capsys.readouterr()
    code = heal_cli(ckpt, data, tmp_path / "new" / "deeper" / "healed", *flags)
    err = capsys.readouterr().err
    assert code == (2 if stop == "diverged" else 130), err
    assert "training diverged" in err and "remove" not in err if stop == "diverged" else "nothing was written" in err, (
        err
    )
    assert sorted(tmp_path.iterdir()) == before, err


def test_a_finished_heal_removes_the_new_folders_above_its_work_dir(tmp_path, heal_inputs):
    """The work folder went after the run, and the empty folders made for it stayed."""
    _, ckpt, data = heal_inputs
    (tmp_path / "runs").mkdir()  # there before the run: it stays
    work = tmp_path / "runs" / "new" / "deeper" / "work"
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "1", "--work-dir", str(work)) == 0
    assert (tmp_path / "healed" / RECORD_NAME).is_file() and not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("spoilt", ["tokenizer-not-json", "tokenizer-config-a-list", "ids-past-the-embeddings"])
def test_a_tokenizer_that_does_not_load_or_fit_the_model_is_one_line(tmp_path, heal_inputs, capsys, spoilt):
    """Each was a traceback: a JSONDecodeError or AttributeError from transformers, an IndexError in the first
    forward pass (a tokenizer of more words than the model's embeddings)."""
    from tests.conftest import _tokenizer

    _, ckpt, data = heal_inputs
    if spoilt == "tokenizer-not-json":
        (ckpt / "tokenizer.json").write_text("{")
        said = r"cannot load a tokenizer from \S+: JSONDecodeError: .*; copy the base's tokenizer files into it"
    elif spoilt == "tokenizer-config-a-list":
        (ckpt / "tokenizer_config.json").write_text("[1]")
        said = r"cannot load a tokenizer from \S+: AttributeError: "
    else:
        vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
        _tokenizer(4 * vocab).save_pretrained(ckpt)
        data.write_text(" ".join(f"w{i}" for i in range(1, 4 * vocab)) * 4)
        said = rf"the tokenizer in \S+ gives token id \d+, but the model has vocab_size={vocab} embeddings"
    capsys.readouterr()
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(said, err), err
    assert not (tmp_path / "healed").exists() and not default_work_dir(tmp_path / "healed").exists()


@pytest.mark.parametrize("spoilt", ["checkpoint", "teacher"])
def test_a_nan_in_the_weights_is_named_not_reported_as_a_divergence(tmp_path, heal_inputs, capsys, spoilt):
    """It was "training diverged at step 1 ...; lower --learning-rate", though no step had run."""
    tiny, ckpt, data = heal_inputs
    folder = Path(shutil.copytree(ckpt if spoilt == "checkpoint" else tiny.base, tmp_path / "spoilt"))
    spoil_weight(folder, "model.layers.1.mlp.down_proj.weight")
    student, teacher = (folder, tiny.base) if spoilt == "checkpoint" else (ckpt, folder)
    capsys.readouterr()
    assert heal_cli(student, data, tmp_path / "healed", "--max-steps", "1", "--teacher", str(teacher)) == 2
    err = capsys.readouterr().err
    named = f"CKPT {folder}" if spoilt == "checkpoint" else f"the teacher {folder}"
    assert err.count("\n") == 1 and f"{named}: model.layers.1.mlp.down_proj.weight holds NaN or inf values" in err, err
    assert not (tmp_path / "healed").exists() and not default_work_dir(tmp_path / "healed").exists()


@pytest.mark.parametrize("spoilt", ["checkpoint", "teacher", "teacher-logits"])
def test_outputs_that_overflow_are_named_not_reported_as_a_divergence(tmp_path, heal_inputs, capsys, spoilt):
    """Finite weights whose outputs overflow float32 (an LM-head row of 1e38: NaN log-probabilities) stopped the run
    at step 1 with "lower --learning-rate"; a teacher's were cached, NaN and all, and the cache refused as not
    written by heal."""
    tiny, ckpt, data = heal_inputs
    folder = Path(shutil.copytree(ckpt if spoilt == "checkpoint" else tiny.base, tmp_path / "spoilt"))
    spoil_weight(folder, "lm_head.weight", 1e38, whole_row=True)
    student, teacher = (folder, tiny.base) if spoilt == "checkpoint" else (ckpt, folder)
    cache = ["--teacher-logits", str(tmp_path / "t.safetensors")] if spoilt == "teacher-logits" else []
    capsys.readouterr()
    assert heal_cli(student, data, tmp_path / "healed", "--max-steps", "1", "--teacher", str(teacher), *cache) == 2
    err = capsys.readouterr().err
    named = (
        f"{folder}: its loss on the text is nan" if spoilt != "teacher-logits" else "the teacher's log-probabilities"
    )
    assert err.count("\n") == 1 and named in err and "overflow float32" in err and "learning-rate" not in err, err
    assert not (tmp_path / "healed").exists() and not (tmp_path / "t.safetensors").exists()


def test_a_heal_whose_merged_weights_overflow_its_dtype_is_one_line_naming_the_folder_to_remove(tmp_path, heal_inputs):
    """A float16 checkpoint's merged weights past 65504 (or a float32 merge past 3e38) were inf after training: the
    NaN loss failed the record's JSON in a traceback, after every step, and --resume failed the same way. A model
    whose hidden states overflowed in RMSNorm (every logit 0) is refused whatever its loss before."""
    from nsc_prune.hf.train.heal import _check_healed

    tiny, ckpt, _ = heal_inputs
    model = load_pruned(ckpt, dtype=torch.float32)
    block, config = torch.randint(3, 100, (1, 16)), TrainConfig(learning_rate=1e3)
    _check_healed(model, 3.0, 2.5, block, config, tmp_path / "work")  # a healed model passes
    dead = load_pruned(ckpt, dtype=torch.float32)
    with torch.no_grad():
        dead.model.norm.weight.zero_()  # what the overflow leaves: every logit 0
    for before in (0.6, 6.0):  # the loss before above ln(vocabulary) too: a badly cut point
        with pytest.raises(
            InvalidInputError, match=rf"predicts every token alike .*held-out loss {before:.4f} -> 4.85"
        ):
            _check_healed(dead, before, math.log(128), block, config, None)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("inf")
    with pytest.raises(
        InvalidInputError, match=r"merged weights overflow .* lower --learning-rate, and remove \S+work"
    ):
        _check_healed(model, 3.0, 2.5, block, config, tmp_path / "work")


def test_each_healed_tensor_keeps_the_dtype_the_input_stores_it_in(tmp_path, heal_inputs, capsys):
    """The output dtype came from config.json's key: absent, float32 (bfloat16 weights written as float32, twice
    the size); float32 norms beside bfloat16 matrices were all written as bfloat16. Int8 codes are refused."""
    from nsc_prune.hf.weights.safetensors_io import index_model_dir, stored_dtype
    from tests.conftest import store_as

    _, ckpt, data = heal_inputs
    mixed = Path(shutil.copytree(ckpt, tmp_path / "mixed"))
    store_as(mixed, lambda name: torch.float32 if "norm" in name else torch.bfloat16, None)
    assert heal_cli(mixed, data, tmp_path / "healed", "--max-steps", "1") == 0
    stored, written = index_model_dir(mixed), index_model_dir(tmp_path / "healed")
    assert {name: info.dtype for name, info in written.items()} == {name: info.dtype for name, info in stored.items()}
    assert {"F32", "BF16"} == {info.dtype for info in written.values()}
    assert json.loads((tmp_path / "healed" / "config.json").read_text())["dtype"] == stored_dtype(stored) == "bfloat16"
    quantized = Path(shutil.copytree(ckpt, tmp_path / "int8"))
    store_as(quantized, lambda name: torch.int8 if name.endswith("1.mlp.down_proj.weight") else torch.float32, None)
    capsys.readouterr()
    assert heal_cli(quantized, data, tmp_path / "h8", "--max-steps", "1") == 2 and not (tmp_path / "h8").exists()
    assert "model.layers.1.mlp.down_proj.weight is I8, the integer codes" in capsys.readouterr().err


def test_a_kept_adapter_is_merged_and_the_record_and_card_say_so(tmp_path, heal_inputs, write_plan):
    """Healing an ``extract --keep-adapter`` checkpoint merges its adapter: the record still said keep_adapter and
    the card told the reader to attach ``adapter/``, which the healed folder does not have."""
    from nsc_prune.hf.extract import ExtractOptions, extract_subnet
    from tests.hf.conftest import PLAN

    tiny, _, data = heal_inputs
    plan = write_plan(tmp_path / "p.json", PLAN, tiny.config)
    options = ExtractOptions(dtype="float32", keep_adapter=True)
    kept = extract_subnet(plan, tiny.base, tmp_path / "kept", point=0, adapter=tiny.adapter, options=options)
    assert (kept / "adapter").is_dir()
    assert heal_cli(kept, data, tmp_path / "healed", "--max-steps", "1") == 0
    healed = tmp_path / "healed"
    record = json.loads((healed / RECORD_NAME).read_text())
    assert not (healed / "adapter").exists()
    assert record["options"]["keep_adapter"] is False and record["params"]["adapter"] == 0
    card = (healed / "README.md").read_text()
    assert "merged into the weights" in card and "adapter/" not in card
    assert "written by `nsc-prune extract` and healed by `nsc-prune heal` (below)" in card and "## Recovery" in card


def test_the_time_budget_record_says_a_resume_and_a_sizing_read_back_apart():
    """A timed run killed before its first checkpoint and run again with --resume starts at step 0 but reads its
    sizing back: "resumed" said true for it, and nothing said that minutes_used then leaves out the probe."""
    from nsc_prune.hf.train.budget import size_run
    from nsc_prune.hf.train.heal import time_budget_record
    from nsc_prune.hf.train.trainer import TrainResult

    sized = size_run(1.0, 3.0, 1.0, 64, 5, 3)
    fresh = TrainResult(None, 10, 640, 10.0, 64.0, budget=sized, probe_seconds=3.0)
    for result, resumed, read_back in (
        (fresh, False, False),
        (dataclasses.replace(fresh, probe_seconds=0.0), False, True),  # no checkpoint to continue from
        (dataclasses.replace(fresh, probe_seconds=0.0, resumed_from_step=4), True, True),
    ):
        record = time_budget_record(result)
        assert (record["resumed"], record["sizing_read_back"]) == (resumed, read_back)


def test_the_recorded_loss_after_is_the_written_bf16_checkpoints(tmp_path, tiny_llama, write_plan):
    """The loss after was measured on the float32 merge, before it was rounded to the input's bf16 and written: a
    fifth of a full fine-tune's recorded gain was not in the checkpoint."""
    from transformers import AutoTokenizer

    from nsc_prune.hf.extract import ExtractOptions, extract_subnet
    from nsc_prune.hf.train.data import TextData
    from nsc_prune.hf.train.trainer import evaluate_loss
    from tests.hf.conftest import PLAN

    tiny = tiny_llama(gqa=True, lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{k: v for k, v in p.items() if k != "lora_rank"} for p in PLAN],
                      tiny.config)  # fmt: skip
    ckpt = extract_subnet(plan, tiny.base, tmp_path / "ckpt", point=0, options=ExtractOptions(dtype="bfloat16"))
    data = tmp_path / "a.txt"
    data.write_text("\n\n".join(" ".join(f"w{3 + (i + k) % 7}" for k in range(20 + i % 5)) for i in range(40)))
    out = tmp_path / "healed"
    at = FAST.index("--lora-rank")
    full = FAST[:at] + FAST[at + 2 :]  # --full trains no LoRA
    assert main(["heal", str(ckpt), "--data", str(data), "--out", str(out), *full, "--full", "--max-steps", "6"]) == 0
    recorded = json.loads((out / RECORD_NAME).read_text())["recovery"]["val_loss_after"]
    blocks = TextData.of([data]).load(AutoTokenizer.from_pretrained(out), 16)
    written = evaluate_loss(load_pruned(out, dtype="float32"), blocks.val, 4)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    before = json.loads((out / RECORD_NAME).read_text())["recovery"]["val_loss_before"]
    assert before == pytest.approx(evaluate_loss(load_pruned(ckpt, dtype="float32"), blocks.val, 4), abs=1e-6)
    assert recorded == pytest.approx(written, abs=1e-6)


def test_no_bar_is_drawn_where_output_is_not_a_terminal(tmp_path, heal_inputs, capsys):
    """Bars are drawn on a terminal only (extract and eval kept to it); heal drew the Trainer's bar into a redirected
    stderr. Its log lines stay, one per logged loss with the step of the total and the time left (they were the
    Trainer's dicts, with no step, no time left and two throughputs that disagreed)."""
    _, ckpt, data = heal_inputs
    quiet = FAST.index("--quiet")
    argv = ["heal", str(ckpt), "--data", str(data), "--out", str(tmp_path / "h"), *FAST[:quiet], *FAST[quiet + 1 :]]
    capsys.readouterr()
    assert main([*argv, "--max-steps", "3", "--logging-steps", "1", "--eval-steps", "2"]) == 0
    out, err = capsys.readouterr()
    lines = out.rstrip().splitlines()
    assert "%|" not in err and lines[-1].startswith("wrote "), (out, err)
    loss = r"loss \d+\.\d{4}, learning rate \S+, grad norm \S+, [\d,]+ tokens \([\d,]+ tokens/s\)"
    for step in (1, 2, 3):
        assert any(re.fullmatch(rf"step {step}/3: {loss}, \d\d:\d\d elapsed, \d\d:\d\d left", line) for line in lines)
    assert any(re.fullmatch(r"step 2/3: held-out loss \d+\.\d{4}", line) for line in lines), out
    assert not any("{" in line for line in lines), out  # none of the Trainer's dicts


@pytest.mark.parametrize("fmt", ["pruned", "padded", "nemotron-nas"])
def test_a_checkpoint_whose_plan_drops_a_layer_passes_the_record_check(tmp_path, tiny_llama, write_plan, fmt):
    """padded and nemotron-nas keep a dropped layer's place: counting only the kept layers refused them."""
    from nsc_prune.hf.extract import ExtractOptions, extract_subnet
    from nsc_prune.hf.train.heal import _check_input_record

    tiny = tiny_llama(gqa=True, lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 64}, {"ffn": 96, "keep": False}, {"ffn": 96}], tiny.config)
    out = extract_subnet(plan, tiny.base, tmp_path / fmt, point=0, options=ExtractOptions(format=fmt))
    record, config = (json.loads((out / name).read_text()) for name in (RECORD_NAME, "config.json"))
    assert config["num_hidden_layers"] == (2 if fmt == "pruned" else 3)
    _check_input_record(record, out, config)
    with pytest.raises(InvalidInputError, match="for a model of 4 \\(config.json\\)"):
        _check_input_record(record, out, {**config, "num_hidden_layers": 4})


def test_a_warning_about_the_text_is_said_before_training_starts(tmp_path, heal_inputs, capsys, monkeypatch):
    """The CLI held every warning until the command ended: a 30-minute run said after 30 minutes that its text was
    the tokenizer's unknown token."""
    import nsc_prune.hf.train.trainer as trainer_module

    _, ckpt, _ = heal_inputs
    data = tmp_path / "unknown.txt"
    data.write_text("\n\n".join(" ".join(["zz qq xx"] * 30) for _ in range(20)))
    said_before, run = [], trainer_module._run_trainer
    monkeypatch.setattr(
        trainer_module, "_run_trainer", lambda *args: (said_before.append(capsys.readouterr().err), run(*args))[1]
    )
    assert heal_cli(ckpt, data, tmp_path / "healed", "--max-steps", "1") == 0
    assert "are the tokenizer's unknown token" in said_before[0]
    assert "unknown token" not in capsys.readouterr().err  # said once


def test_bad_input_found_before_training_prints_only_its_error(tmp_path, heal_inputs, capsys):
    """The early flush came before the batch-size check: --resume's note, then the error, for plain bad input."""
    _, ckpt, data = heal_inputs
    assert heal_cli(ckpt, data, tmp_path / "healed", "--resume", "--batch-size", "500", "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nsc-prune: error: --batch-size must be at most"), err


def test_heal_with_a_teacher_distills_though_the_recipe_did_not_say_so(tmp_path, heal_inputs):
    from nsc_prune.hf.train.heal import heal

    tiny, ckpt, data = heal_inputs
    config = TrainConfig(seq_len=16, batch_size=4, max_steps=1, warmup_steps=0, lora_rank=4)
    out = heal(ckpt, [str(data)], tmp_path / "healed", config, teacher=tiny.base, progress=False)
    recovery = json.loads((out / "nsc_prune_extract.json").read_text())["recovery"]
    assert recovery["loss"] == "distillation" and recovery["recipe"]["distill"] is True


def test_the_healed_provenance_is_the_heals_own_with_the_inputs_other_keys(tmp_path, heal_inputs):
    from nsc_prune.hf.train.heal import heal

    _, ckpt, data = heal_inputs
    path = ckpt / "nsc_prune_extract.json"
    record = json.loads(path.read_text())
    old = {
        "nsc_prune_version": "0.0.1",
        "command": "nsc-prune extract OLD",
        "time_utc": "2000-01-01T00:00:00+00:00",
        "python": "2.7",
        "base": "the-base",
    }
    path.write_text(json.dumps({**record, "provenance": old}))
    config = TrainConfig(seq_len=16, batch_size=4, max_steps=1, warmup_steps=0, lora_rank=4)
    out = heal(ckpt, [str(data)], tmp_path / "healed", config, progress=False)
    healed = json.loads((out / "nsc_prune_extract.json").read_text())
    assert healed["provenance"]["base"] == "the-base"
    assert all(healed["provenance"][key] != old[key] for key in ("nsc_prune_version", "command", "time_utc", "python"))
    assert healed["history"][-1]["provenance"] == old  # the extraction's own, kept in the history


def test_minutes_used_counts_the_probe():
    from nsc_prune.hf.train.budget import size_run
    from nsc_prune.hf.train.heal import time_budget_record
    from nsc_prune.hf.train.trainer import TrainResult

    sized = size_run(1.0, 3.0, 1.0, 64, 5, 3)
    result = TrainResult(None, 10, 640, 10.0, 64.0, budget=sized, probe_seconds=3.0)
    assert time_budget_record(result)["minutes_used"] == round(13.0 / 60, 3)


@pytest.mark.parametrize(("key", "flag"), [("full", "--full"), ("distill", "--teacher BASE")])
def test_a_set_of_what_a_heal_flag_decides_is_refused(tmp_path, capsys, key, flag):
    """The flag would silently override the --set value."""
    argv = ["heal", str(tmp_path), "--data", str(tmp_path / "d.txt"), "--out", str(tmp_path / "o")]
    assert main([*argv, "--set", f"{key}=true"]) == 2
    err = capsys.readouterr().err
    assert f"--set {key} is not a heal setting: pass {flag} instead" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def _recovery(**extra):
    return {
        "recovery": {
            "recipe": {"full": False, "lora_rank": 8},
            "loss": "distillation",
            "tokens": 1000,
            "steps": 10,
            "val_loss_before": 3.0,
            "val_loss_after": 2.5,
            "data": {"val_tokens": 64},
            **extra,
        }
    }


def test_the_card_says_a_resume_the_cached_teachers_mass_and_one_minute_in_the_singular():
    """The healed card's Recovery section: a resumed run says its times are those after the resume (else its
    tokens/s reads as the whole run's), a --teacher-logits cache says the share of the teacher's probability mass
    its top k keeps, and a budget of one minute is "1 minute"."""
    from nsc_prune.hf.train.heal import _recovery_lines

    timed = {
        "minutes_asked": 1,
        "minutes_used": 0.9,
        "probe_passes": 3,
        "step_seconds_measured": 0.5,
        "probe_max_steps": 100,
        "warmup_steps": 10,
        "run_step_seconds": None,
    }
    lines = _recovery_lines(
        _recovery(
            teacher="/models/base",
            val_loss_teacher=2.0,
            teacher_logits={"top_k": 64, "top_k_mass": 0.97},
            resumed_from_step=4,
            time_budget=timed,
        )
    )
    text = "\n".join(lines)
    assert "Teacher `base`, held-out loss 2.0000; its top 64 log-probabilities per token cached (97% of its" in text
    assert "Resumed at step 4: times and tokens/s are those after the resume." in text
    assert "Time budget: 1 minute asked, 0.9 used;" in text
    text = "\n".join(_recovery_lines(_recovery(time_budget={**timed, "minutes_asked": 2})))
    assert "Time budget: 2 minutes asked" in text and "Resumed" not in text and "Teacher" not in text


def test_a_teacher_whose_tokenizer_differs_at_the_same_vocab_size_is_refused(tmp_path):
    """vocab_size alone does not show the teacher reads the student's tokens: a teacher with its own tokenizer of
    the same size would distil targets over other words. Its tokenizer (where it has one) must be the student's."""
    from nsc_prune.hf.train.heal import check_same_vocabulary
    from tests.conftest import _tokenizer

    student, teacher = tmp_path / "student", tmp_path / "teacher"
    for folder, words in ((student, 128), (teacher, 96)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"vocab_size": 128}))
        _tokenizer(words).save_pretrained(folder)
    tokenizer = _tokenizer(128)
    check_same_vocabulary(student, student, tokenizer, ("student", "teacher"), "Distill from the base")
    with pytest.raises(InvalidInputError, match=r"the teacher's tokenizer \(\S+teacher\) must be the student's; got a"):
        check_same_vocabulary(student, teacher, tokenizer, ("student", "teacher"), "Distill from the base")


def test_a_heal_with_no_held_out_text_is_refused_before_training(tmp_path, heal_inputs):
    """heal reports the held-out loss before and after: --val-fraction 0 is refused naming why, with nothing
    written (no output, no work folder), not trained and then failed on an empty validation set."""
    from nsc_prune.hf.train.data import TextData
    from nsc_prune.hf.train.heal import heal

    _, ckpt, data = heal_inputs
    config = TrainConfig(max_steps=1, seq_len=16, batch_size=2)
    with pytest.raises(
        InvalidInputError, match=r"val_fraction must be > 0 for heal \(it reports held-out loss\); got 0"
    ):
        heal(ckpt, TextData((str(data),), val_fraction=0.0), tmp_path / "healed", config, progress=False)
    assert not (tmp_path / "healed").exists() and not (tmp_path / "healed.heal").exists()
