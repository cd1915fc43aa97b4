"""The argument parser every ``nsc-prune`` command uses: usage errors are one line, exit 2; warnings are lines."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from nsc_prune.choices import AUTO_SWITCH
from nsc_prune.errors import ConfigError


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean --budget?"`` for the closest choice, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors print one line (not the usage block), and which names an
    unknown flag (with the closest known one) before complaining about missing required ones."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        args = list(sys.argv[1:] if args is None else args)
        known = list(self._option_string_actions)
        for arg in args:
            if arg == "--":
                break
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and not any(option.startswith(flag) for option in known):
                self.error(f"unknown flag {flag}{did_you_mean(flag, [o for o in known if o.startswith('--')])}")
        return super().parse_args(args, namespace)


def join_dash_values(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``["--budget", "-1B"]`` -> ``["--budget=-1B"]``, so argparse reports the bad value itself
    instead of "expected one argument"."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in flags and len(arg) > 1 and arg[0] == "-" and (arg[1].isdigit() or arg[1] == "."):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def field_default(config: type, name: str) -> Any:
    """A config dataclass field's default, for help texts: defaults live only in the dataclass."""
    return {field.name: field.default for field in dataclasses.fields(config)}[name]


def warn(message: str) -> None:
    """A warning for the person at the terminal; the CLI entry prints it as one ``nsc-prune: warning:`` line."""
    warnings.warn(message, UserWarning, stacklevel=2)


def print_warnings(caught: Sequence[warnings.WarningMessage]) -> None:
    """Each distinct warning once, as ``nsc-prune: warning: MESSAGE`` on stderr (no source path)."""
    seen: set[str] = set()
    for item in caught:
        text = str(item.message)
        if text not in seen:
            seen.add(text)
            print(f"nsc-prune: warning: {text}", file=sys.stderr)


def parse_overrides(items: list[str]) -> dict:
    """``["ffn_step=64", "protect_layers=[0, 1]"]`` -> ``{"ffn_step": 64, "protect_layers": [0, 1]}``."""
    import yaml  # lazily: the search's --help stays fast

    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set takes KEY=VALUE; got {item!r}")
        try:
            overrides[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {key}: cannot read value {value!r} ({err})") from err
    return overrides


def add_data_arguments(parser: argparse.ArgumentParser, data_help: str) -> None:
    """The training-text flags ``heal`` and ``train-supernet`` share (``text_data`` reads them back)."""
    parser.add_argument("--data", nargs="+", required=True, metavar="FILE", help=data_help)
    parser.add_argument("--text-field", default="text", help="JSON/JSONL/dataset field holding the text (default text)")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="share of documents held out (default 0.05)")
    parser.add_argument("--max-tokens", type=int, help="read at most this many tokens of --data")


def text_data(args: argparse.Namespace) -> Any:
    """The ``nsc_prune.hf.train.data.TextData`` of the flags ``add_data_arguments`` added."""
    from nsc_prune.hf.train.data import TextData

    return TextData(tuple(args.data), args.text_field, args.val_fraction, args.max_tokens)


# TrainConfig fields as flags (heal and train-supernet): one way to type a recipe in both commands. Field names
# are the flags' dests; tests/hf/test_train_recipe.py checks the list against TrainConfig (importing it here
# would import torch for --help).
RECIPE_FLAGS = (
    ("--max-steps", int, "optimizer steps"),
    ("--seq-len", int, "tokens per block (default: 512, or the model's context if shorter)"),
    ("--batch-size", int, "blocks per step and process"),
    ("--grad-accum", int, "gradient accumulation steps"),
    ("--learning-rate", float, "peak learning rate (cosine schedule)"),
    ("--warmup-steps", int, "warm-up steps"),
    ("--weight-decay", float, "AdamW weight decay"),
    ("--lora-rank", int, "LoRA rank"),
    ("--lora-alpha", float, "LoRA alpha"),
    ("--temperature", float, "distillation temperature"),
    ("--ce-weight", float, "share of cross-entropy when distilling"),
    ("--save-steps", int, "checkpoint every N steps"),
    ("--eval-steps", int, "held-out loss every N steps"),
    ("--logging-steps", int, "log every N steps"),
    ("--seed", int, "the one seed"),
)
_SWITCHES = ("bf16", "gradient_checkpointing")  # "auto", "true" or "false" on the command line


def add_recipe_arguments(parser: argparse.ArgumentParser, set_help: str) -> None:
    """The recipe flags ``heal`` and ``train-supernet`` share (``TrainConfig`` fields, read back by
    ``recipe_settings``) and ``--set KEY=VALUE`` (``set_help`` says which keys the command takes)."""
    recipe = parser.add_argument_group("recipe (defaults: nsc_prune.hf.train.recipe.TrainConfig)")
    for flag, kind, text in RECIPE_FLAGS:
        recipe.add_argument(flag, type=kind, help=text)
    recipe.add_argument("--lora-targets", nargs="+", help="LoRA target modules (default: every projection)")
    recipe.add_argument("--bf16", choices=AUTO_SWITCH, help="bf16 mixed precision (default auto: on CUDA)")
    recipe.add_argument("--gradient-checkpointing", choices=AUTO_SWITCH, help="default auto: on CUDA")
    recipe.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)


def recipe_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``--set`` pairs, then the recipe flags given (flags win): the settings ``add_recipe_arguments`` added."""
    settings = parse_overrides(args.set)
    names = [flag[2:].replace("-", "_") for flag, _, _ in RECIPE_FLAGS] + ["lora_targets", *_SWITCHES]
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value == "true" if name in _SWITCHES and value != "auto" else value
    return settings
