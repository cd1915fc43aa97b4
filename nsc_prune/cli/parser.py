"""The argument parser every ``nsc-prune`` command uses: usage errors are one line, exit 2; warnings are lines."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn


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
