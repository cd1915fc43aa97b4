"""The argument parser every ``nsc-prune`` command uses: usage errors are one line, exit 2; warnings are lines."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from nsc_prune._files import user_path
from nsc_prune._validation import yaml_problem
from nsc_prune._warn import held_until_said, is_ours, warn
from nsc_prune.choices import AUTO_SWITCH, COMPUTE_DTYPES, DEVICES
from nsc_prune.errors import ConfigError, InvalidInputError, NSCError


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean --budget?"`` for the closest choice, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def shown_default(action: argparse.Action) -> str | None:
    """The default ``--help`` and docs/cli.md state for ``action``: ``action.shown_default`` when the value lives
    elsewhere (a config dataclass, or it depends on other flags; see ``show_default``), else argparse's default;
    None for no default (None, False, an empty list)."""
    value = getattr(action, "shown_default", action.default)
    if value is None or value is False or value is argparse.SUPPRESS or value == []:
        return None
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)


def show_default(action: argparse.Action, value: Any) -> argparse.Action:
    """State ``value`` as ``action``'s default in ``--help`` while the parser keeps ``None`` (so a config file or
    ``--set`` can still fill the setting): for defaults held by a config dataclass or set by other flags."""
    action.shown_default = value
    return action


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every flag with a default ends its help with ``(default: X)``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = shown_default(action)
        if default is None or text is argparse.SUPPRESS or not action.option_strings:
            return text
        return f"{text} (default: {default.replace('%', '%%')})"


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors print one line (not the usage block), which takes no
    abbreviated flag (``--max-step`` is not ``--max-steps``), shows defaults in ``--help``, and names an unknown
    flag (with the closest known one) before complaining about missing required ones."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs["allow_abbrev"] = False
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def visible_flags(self) -> list[str]:
        """The long flags ``--help`` lists (hidden deprecated spellings left out)."""
        return [
            option
            for action in self._actions
            if action.help is not argparse.SUPPRESS
            for option in action.option_strings
            if option.startswith("--")
        ]

    def parse_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        args = list(sys.argv[1:] if args is None else args)
        given = set()
        for arg in args:
            if arg == "--":
                break
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and flag not in self._option_string_actions:
                self.error(f"unknown flag {flag}{did_you_mean(flag, self.visible_flags())}")
            given.add(flag)
        for action in self._actions:  # the last of the two would win silently
            if isinstance(action, _DeprecatedSpelling) and given.issuperset(action.option_strings):
                new = action.target.option_strings[0]
                if given & set(action.target.option_strings):
                    self.error(
                        f"{action.option_strings[0]} is an old spelling of {new}, and both are given; pass {new}"
                    )
        return super().parse_args(args, namespace)


class _DeprecatedSpelling(argparse.Action):
    """An old flag name that still works for one release: parses as ``target`` does, warns, then acts as it."""

    def __init__(self, option_strings: list[str], dest: str, target: argparse.Action, **kwargs: Any) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=target.nargs,
            const=target.const,
            type=target.type,
            choices=target.choices,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
            metavar=target.metavar,
        )
        self.target = target

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        new = self.target.option_strings[0]
        warn(f"{option_string} is deprecated; use {new}")
        self.target(parser, namespace, values, new)


class _RemovedSpelling(argparse.Action):
    """An old flag name whose meaning is now ambiguous: using it is a one-line usage error naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, message: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        self.message = message

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        parser.error(f"{option_string} {self.message}")


def add_deprecated_flag(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Keep ``old`` (hidden from ``--help``) as a spelling of the flag ``new`` for one release; each use warns
    ``OLD is deprecated; use NEW`` (printed once per command). The one place the CLI keeps old spellings."""
    parser.add_argument(old, action=_DeprecatedSpelling, target=parser._option_string_actions[new])


def add_removed_flag(parser: argparse.ArgumentParser, old: str, message: str) -> None:
    """Refuse ``old`` (hidden from ``--help``) in one line: ``OLD MESSAGE``, where the message names the new flag."""
    parser.add_argument(old, action=_RemovedSpelling, message=message)


def deprecated_values(flag: str, renamed: dict[str, str]) -> Callable[[str], str]:
    """An argparse ``type`` for ``flag`` that reads each old value in ``renamed`` as its new name, with a warning
    ``FLAG OLD is deprecated; use FLAG NEW`` (the values' counterpart of ``add_deprecated_flag``)."""

    def read(text: str) -> str:
        if text in renamed:
            warn(f"{flag} {text} is deprecated; use {flag} {renamed[text]}")
            return renamed[text]
        return text

    return read


def path_value(text: str) -> str:
    """A file or folder flag, input or output: refused when empty (``Path('')`` is the current folder, which a
    command would write into or read as its input; an empty ``--calib`` read as no calibration); a leading ``~``
    expanded as the shell does, which it does not in ``--out=~/x`` or a script's quoted ``'~/x'`` (an output was
    written into a folder named ``~``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a file or folder; got {text!r}")
    return str(user_path(text)) if text.startswith("~") else text


def positive_int(text: str) -> int:
    """A count flag (steps, layers, tokens): a whole number >= 1."""
    return _whole(text, 1)


def nonnegative_int(text: str) -> int:
    """A count flag that may be 0 (warm-up steps, a seed): a whole number >= 0."""
    return _whole(text, 0)


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= {least}; got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be a whole number >= {least}; got {text!r}")
    return value


def percent_list(text: str) -> list[int]:
    """A scripts' ``--budgets``: comma-separated whole percents in 1..99, e.g. ``90,80,70``."""
    try:
        budgets = [int(b) for b in text.split(",")]
    except ValueError:
        budgets = []
    if not budgets or not all(0 < b < 100 for b in budgets):
        raise argparse.ArgumentTypeError(f"must be whole percents in 1..99 such as 90,80,70; got {text!r}")
    return budgets


def positive_number(text: str) -> float:
    """A size or rate flag (GB, tokens/s, a std): a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text!r}")
    return value


def check_file_output(
    parser: argparse.ArgumentParser,
    path: str | None,
    overwrite: bool,
    inputs: Sequence[str | None] = (),
    flag: str = "--out",
) -> None:
    """A script's file output (``--json``, ``--out``) under the one output rule (``nsc_prune._io.check_output``),
    checked before any slow step; a refusal is the parser's error (one line, exit 2)."""
    from nsc_prune._io import check_output
    from nsc_prune.errors import NSCError

    if path is None:
        return
    try:
        check_output(path, inputs, overwrite, marker=None, flag=flag)
    except NSCError as err:
        parser.error(str(err))


def check_new_folder(parser: argparse.ArgumentParser, path: str | os.PathLike, flag: str = "--out") -> None:
    """A script's output folder that it fills from scratch: absent or empty, else the parser's error (one line,
    exit 2), before any slow step."""
    path = Path(path)
    above = next((parent for parent in path.parents if parent.exists()), None)
    if above is not None and not above.is_dir():
        parser.error(f"{flag} {path} is below the file {above}; name a folder")
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        state = "exists and is not empty" if path.is_dir() else "is a file"
        parser.error(f"{flag} {path} {state}; name a new folder (the study fills it from scratch)")


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


@dataclasses.dataclass(frozen=True)
class Caught:
    """A warning raised while a command ran, and whether nsc-prune's code raised it (``ours``)."""

    warning: warnings.WarningMessage
    ours: bool


def _raised_by_nsc_prune() -> bool:
    """Called by the recorder ``warnings.showwarning`` runs: whether the function that called ``warnings.warn``
    (the first frame above the recorder outside ``warnings``) belongs to the ``nsc_prune`` package. A transformers
    or torch warning is not ours even when our code triggered it (its ``stacklevel`` points the reported
    location at our caller, so the location cannot tell)."""
    frame = sys._getframe(2)  # 0: this function, 1: the recorder
    while frame is not None and frame.f_globals.get("__name__") == "warnings":
        frame = frame.f_back
    return frame is not None and is_ours(str(frame.f_globals.get("__name__", "")))


@dataclasses.dataclass
class HeldWarnings:
    """The warnings a command raised and has not printed yet, and the lines it printed (each is printed once)."""

    items: list[Caught] = dataclasses.field(default_factory=list)
    said: set[str] = dataclasses.field(default_factory=set)
    started: bool = False  # a long step started (``say_held_warnings``): later warnings are said even on an error


@contextlib.contextmanager
def collected_warnings() -> Iterator[HeldWarnings]:
    """Collect the warnings raised inside (under the filters in force) instead of printing them; a long step's
    start prints those collected so far (``nsc_prune._warn.say_held_warnings``)."""
    held = HeldWarnings()

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        item = warnings.WarningMessage(message, category, filename, lineno, file, line)
        held.items.append(Caught(item, _raised_by_nsc_prune()))

    def say() -> None:
        held.started = True
        print_warnings(held)

    with warnings.catch_warnings(), held_until_said(say):
        warnings.showwarning = record
        yield held


def print_warnings(held: HeldWarnings) -> None:
    """Each distinct warning once on stderr: ours as ``nsc-prune: warning: MESSAGE`` (no source path), other
    libraries' in Python's own format (file, line, category), so they do not read as nsc-prune's."""
    for item in held.items:
        warning = item.warning
        if item.ours:
            text = f"nsc-prune: warning: {warning.message}\n"
        else:
            text = warnings.formatwarning(
                warning.message, warning.category, warning.filename, warning.lineno, warning.line
            )
        if text not in held.said:
            held.said.add(text)
            sys.stderr.write(text)
    held.items.clear()


def parse_overrides(items: list[str]) -> dict:
    """``["ffn_step=64", "protect_layers=[0, 1]"]`` -> ``{"ffn_step": 64, "protect_layers": [0, 1]}``."""
    import yaml  # lazily: the search's --help stays fast

    from nsc_prune._io import parse_yaml

    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set takes KEY=VALUE; got {item!r}")
        if key.strip() in overrides:  # the last would win silently, and the output folder's name held both
            raise ConfigError(f"--set {key.strip()} is given twice; give each setting once")
        try:
            overrides[key.strip()] = parse_yaml(value)
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {key}: cannot read value {value!r} ({yaml_problem(err)})") from err
        if overrides[key.strip()] is None:  # a space drops it: the default ran, under a folder named after the null
            raise ConfigError(f"--set {key.strip()} gives no value (got {value!r}); leave it out for the default")
    return overrides


def add_compute_arguments(parser: argparse.ArgumentParser | Any, what: str) -> None:
    """``--device`` and ``--calib-dtype``: where a streamed base runs for ``what``, and in which float type."""
    from nsc_prune.hf.weights.compute import Compute

    parser.add_argument(
        "--device", choices=DEVICES, default=field_default(Compute, "device"), help=f"where {what} runs the base"
    )
    parser.add_argument(
        "--calib-dtype",
        choices=COMPUTE_DTYPES,
        default=field_default(Compute, "dtype"),
        help=f"float type of the base's layers for {what} (float16: GPU only)",
    )


def compute_settings(args: argparse.Namespace) -> Any:
    """``--device`` and ``--calib-dtype`` as the library's ``Compute`` (checked against this machine later)."""
    from nsc_prune.hf.weights.compute import Compute

    return Compute(args.device, args.calib_dtype)


def is_main_process() -> bool:
    """False on every rank but the first of a ``torchrun`` / ``accelerate launch`` run: only one prints and writes."""
    from nsc_prune.hf.ranks import launcher_rank

    return launcher_rank() == 0


def check_ranks_agree_on_flags(command: str, args: argparse.Namespace, paths: tuple[str, ...]) -> None:
    """Under ``torchrun`` / ``accelerate launch``, ConfigError on every rank unless every rank parsed the same flags:
    a rank whose flags skip a collective (another ``--score`` or ``--refine``) would leave the others waiting in it
    for good. The ``paths`` flags may differ (each node's own copy of the files): what they hold is compared where
    it is read (the weights' fingerprint, the calibration text's hash)."""
    from nsc_prune.hf.ranks import current_ranks, launched_processes
    from nsc_prune.hf.weights.compute import Compute

    if launched_processes() > 1:
        device = getattr(args, "device", "cpu")
        try:
            Compute(device).check()  # no GPU: one line, not NCCL's traceback
        except NSCError as err:
            err.every_rank = True  # every rank checks the same flag: said once
            raise
        skipped = {*paths, "command_line"}
        flags = {f"--{k.replace('_', '-')}": repr(v) for k, v in sorted(vars(args).items()) if k not in skipped}
        current_ranks(device).check_same(f"the flags of {command}", flags)


def refuse_launcher(command: str, why: str) -> None:
    """One line on every rank, before any work, for a command that runs in one process started by ``torchrun`` /
    ``accelerate launch``: ``why`` it runs alone."""
    from nsc_prune.hf.ranks import launched_processes

    if not is_main_process() or launched_processes() > 1:
        raise InvalidInputError(
            f"{command} runs in one process ({why}); run it without torchrun / accelerate launch", every_rank=True
        )


def add_data_arguments(parser: argparse.ArgumentParser, data_help: str) -> None:
    """The training-text flags ``heal`` and ``train-supernet`` share (``text_data`` reads them back)."""
    parser.add_argument(
        "--data", nargs="+", action="extend", required=True, metavar="FILE", type=path_value, help=data_help
    )
    parser.add_argument(
        "--text-field", help="JSON/JSONL/dataset field holding the text (default: text; plain text has none)"
    )
    parser.add_argument("--val-fraction", type=float, default=0.05, help="share of documents held out")
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="read at most this many tokens of --data (two --seq-len blocks, one with --val-fraction 0)",
    )


def text_data(args: argparse.Namespace) -> Any:
    """The ``nsc_prune.hf.train.data.TextData`` of the flags ``add_data_arguments`` added."""
    from nsc_prune.hf.train.data import TextData, reads_fields

    texts = [f for f in args.data if not reads_fields(f)]
    # a plain text has no fields: the flag was silently ignored (a missing file is read's to name)
    if args.text_field is not None and len(texts) == len(args.data) and all(Path(f).is_file() for f in texts):
        raise ConfigError(
            f"--text-field {args.text_field} would be ignored: every --data is plain text, read as written (a field "
            "is read from .json, .jsonl and hf: inputs)"
        )
    field = "text" if args.text_field is None else args.text_field
    return TextData(tuple(args.data), field, args.val_fraction, args.max_tokens)


# TrainConfig fields as flags (heal and train-supernet): one way to type a recipe in both commands. Field names
# are the flags' dests; tests/hf/test_train_recipe.py checks the list against TrainConfig (importing it here
# would import torch for --help).
RECIPE_FLAGS = (
    ("--max-steps", int, "optimizer steps"),
    ("--seq-len", int, "tokens per training block"),
    ("--batch-size", int, "sequences per step and process (blocks of --seq-len tokens)"),
    ("--grad-accum", int, "gradient accumulation steps"),
    ("--learning-rate", float, "peak learning rate"),
    ("--warmup-steps", int, "warm-up steps (at most a tenth of the run as first sized)"),
    ("--schedule", str, "learning-rate schedule: cosine, or wsd (warm-up, the peak, 1-sqrt decay over the last fifth)"),
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


def add_recipe_arguments(
    parser: argparse.ArgumentParser,
    set_help: str,
    own: Mapping[str, tuple[str, str]] | None = None,
    full: bool = True,
) -> None:
    """The recipe flags ``heal`` and ``train-supernet`` share (``TrainConfig`` fields, read back by
    ``recipe_settings``) and ``--set KEY=VALUE`` (``set_help`` says which keys the command takes). The parser
    keeps None (so ``--set`` can fill a field); ``--help`` shows ``TrainConfig``'s default, or for a field in
    ``own`` the command's own (help text, default). ``full``: the command has ``--full`` (its own learning rate)."""
    from nsc_prune.hf.train.recipe import (  # no torch: --help works without the [hf] extra
        DEFAULT_SEQ_LEN,
        FULL_LEARNING_RATE,
        LORA_LEARNING_RATE,
        TrainConfig,
    )

    own = own or {}
    recipe = parser.add_argument_group("recipe (defaults: nsc_prune.hf.train.recipe.TrainConfig)")
    for flag, kind, text in RECIPE_FLAGS:
        name = flag[2:].replace("-", "_")
        default = field_default(TrainConfig, name)
        if name == "seq_len":
            teacher = " (or --teacher's)" if full else ""  # heal's; train-supernet's teacher is its base
            default = f"{DEFAULT_SEQ_LEN}, or the model's context{teacher} if shorter"
        if name == "learning_rate":
            default = (
                f"{LORA_LEARNING_RATE:g} with LoRA, {FULL_LEARNING_RATE:g} with --full" if full else LORA_LEARNING_RATE
            )
        text, default = own.get(name, (text, default))
        show_default(recipe.add_argument(flag, type=kind, help=text), default)
    text, default = own.get(
        "lora_targets",
        ("LoRA target modules (Phi-3: a part adapts its fused module)", field_default(TrainConfig, "lora_targets")),
    )
    show_default(recipe.add_argument("--lora-targets", nargs="+", action="extend", help=text), default)
    for name, text in (
        ("bf16", "bf16 mixed precision (auto: on a GPU with native bf16, compute capability 8.0+, and on such a CPU)"),
        ("gradient_checkpointing", "auto: on CUDA"),
    ):
        text, default = own.get(name, (text, field_default(TrainConfig, name)))
        switch = recipe.add_argument(f"--{name.replace('_', '-')}", choices=AUTO_SWITCH, help=text)
        show_default(switch, default)
    recipe.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)


def add_minutes_argument(parser: argparse.ArgumentParser) -> None:
    """``--minutes N`` (heal and train-supernet): a time budget that sizes the run (``time_budget`` reads it)."""
    parser.add_argument(
        "--minutes",
        type=float,
        metavar="N",
        help="time budget: the steps and warm-up are sized from the throughput of a few probe passes, and the "
        "steps again from the run's own until its decay begins (replaces --max-steps; the two together are refused)",
    )


def time_budget(args: argparse.Namespace, settings: dict[str, Any]) -> Any:
    """The ``TimeBudget`` of ``--minutes`` (None without it); refuses it beside ``--max-steps``/``--set max_steps``."""
    if getattr(args, "minutes", None) is None:
        return None
    from nsc_prune.errors import ConfigError
    from nsc_prune.hf.train.budget import TimeBudget

    if "max_steps" in settings:
        raise ConfigError(
            "--minutes and --max-steps both fix the run's length; got both. Pass one (--minutes sizes the steps)"
        )
    return TimeBudget(args.minutes, warmup_steps=settings.get("warmup_steps"))  # as asked: the sized run caps it


def recipe_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``--set`` pairs, then the recipe flags given (flags win): the settings ``add_recipe_arguments`` added."""
    settings = parse_overrides(args.set)
    names = [flag[2:].replace("-", "_") for flag, _, _ in RECIPE_FLAGS] + ["lora_targets", *_SWITCHES]
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value == "true" if name in _SWITCHES and value != "auto" else value
    return settings
