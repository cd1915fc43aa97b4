"""One way to type a training recipe (issue 22): heal and train-supernet take the TrainConfig fields as flags and
as --set KEY=VALUE, read by one parser (flags win)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from nsc_prune.cli import heal, train_supernet
from nsc_prune.cli.parser import RECIPE_FLAGS, recipe_settings

HEAL = ["CKPT", "--data", "a.txt", "--out", "o"]
SUPERNET = ["--base", "b", "--space", "ffn-grid", "--data", "a.txt", "--out", "o"]


@pytest.mark.parametrize("module, required", [(heal, HEAL), (train_supernet, SUPERNET)], ids=["heal", "supernet"])
def test_flags_and_set_give_one_recipe_in_both_commands(module, required):
    parser = module.build_parser()
    flags = parser.parse_args([*required, "--batch-size", "4", "--learning-rate", "3e-3", "--bf16", "false"])
    pairs = [*required, "--set", "batch_size=4", "--set", "learning_rate=3e-3", "--set", "bf16=false"]
    pairs = parser.parse_args(pairs)
    assert recipe_settings(flags) == {"batch_size": 4, "learning_rate": 3e-3, "bf16": False}
    assert {k: v for k, v in recipe_settings(pairs).items() if k != "learning_rate"} == {"batch_size": 4, "bf16": False}
    both = parser.parse_args([*required, "--set", "batch_size=2", "--batch-size", "4", "--seq-len", "64"])
    assert recipe_settings(both) == {"batch_size": 4, "seq_len": 64}  # the flag wins


def test_bf16_auto_is_kept_for_the_machine_to_decide():
    """'auto' (bf16 where the machine runs it) read as a switch was False: fp32 on a bf16 GPU."""
    parser = heal.build_parser()
    assert recipe_settings(parser.parse_args([*HEAL, "--bf16", "auto"])) == {"bf16": "auto"}
    assert recipe_settings(parser.parse_args([*HEAL, "--bf16", "true"])) == {"bf16": True}


def test_a_text_field_is_read_where_any_data_file_has_fields(tmp_path):
    from nsc_prune.cli.parser import text_data
    from nsc_prune.errors import ConfigError

    (tmp_path / "a.txt").write_text("plain words")
    (tmp_path / "b.jsonl").write_text('{"body": "words of a record"}\n')
    parser = heal.build_parser()
    mixed = parser.parse_args(["CKPT", "--data", str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl"), "--out", "o",
                               "--text-field", "body"])  # fmt: skip
    assert text_data(mixed).text_field == "body"
    plain = parser.parse_args(["CKPT", "--data", str(tmp_path / "a.txt"), "--out", "o", "--text-field", "body"])
    with pytest.raises(ConfigError, match="--text-field body would be ignored: every --data is plain text"):
        text_data(plain)


def test_recipe_flags_are_the_train_config_fields():
    recipe = pytest.importorskip("nsc_prune.hf.train.recipe")
    flagged = {flag[2:].replace("-", "_") for flag, _, _ in RECIPE_FLAGS} | {"lora_targets", "bf16"}
    flagged |= {"gradient_checkpointing"}
    # full and distill are each command's own (heal --full / --teacher, train-supernet --teacher base)
    assert flagged == {f.name for f in dataclasses.fields(recipe.TrainConfig)} - {"full", "distill"}


def test_unknown_recipe_key_names_the_close_one():
    recipe = pytest.importorskip("nsc_prune.hf.train.recipe")
    from nsc_prune.errors import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"--set KEY must be a TrainConfig field; got 'batchsize'\. "
        r"Did you mean batch_size\?",
    ):
        recipe.TrainConfig.from_settings({"batchsize": 4})
    assert recipe.TrainConfig.from_settings({"learning_rate": "3e-3"}).learning_rate == 3e-3  # YAML's string


@pytest.mark.parametrize(
    "settings, message",
    [  # each was ignored without a word
        ({"full": True, "lora_rank": 4}, "--lora-rank would be ignored: --full trains every weight, and no LoRA"),
        ({"full": True, "lora_targets": ["q_proj"]}, "--lora-targets would be ignored: --full trains every weight"),
        ({"ce_weight": 0.5}, "--ce-weight would be ignored: distillation settings need a teacher (--teacher)"),
        ({"temperature": 2.0}, "--temperature would be ignored: distillation settings need a teacher"),
    ],
)
def test_recipe_settings_the_recipe_would_ignore_are_refused(settings, message):
    recipe = pytest.importorskip("nsc_prune.hf.train.recipe")
    from nsc_prune.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        recipe.TrainConfig.from_settings(settings)
    recipe.TrainConfig.from_settings({**settings, "distill": True, "full": False})  # where they apply


@pytest.mark.parametrize("module, required", [(heal, HEAL), (train_supernet, SUPERNET)], ids=["heal", "supernet"])
def test_a_list_flag_given_twice_keeps_both(module, required):
    # argparse's nargs="+" kept the last occurrence only: `--data a.txt --data b.txt` trained on b.txt alone
    parser = module.build_parser()
    args = parser.parse_args(
        [*required, "--data", "b.txt", "c.txt", "--lora-targets", "q_proj", "--lora-targets", "v_proj"]
    )
    assert args.data == ["a.txt", "b.txt", "c.txt"]
    assert recipe_settings(args)["lora_targets"] == ["q_proj", "v_proj"]
