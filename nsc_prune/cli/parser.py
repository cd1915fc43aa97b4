"""The argument parser every ``nsc-prune`` command uses: usage errors are one line, exit 2."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, NoReturn


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors print one line (not the usage block)."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
