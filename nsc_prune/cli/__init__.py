"""``nsc-prune`` entry point: the search by default, sub-commands for the rest.

Each sub-command lives in its own module exposing ``build_parser()`` and ``run(args) -> int``;
modules are imported only when their command runs, so the search path never imports torch.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import importlib
import os
import re
import shlex
import sys
from collections.abc import Iterator
from typing import Any

from nsc_prune._io import recorded_command, recorded_outputs, safetensors_write_error, sigterm_exits, stop_signal
from nsc_prune._warn import raised_by_nsc_prune
from nsc_prune.cli.parser import collected_warnings, did_you_mean, join_dash_values, print_warnings
from nsc_prune.errors import InterruptedRun, NSCError, Stopped
from nsc_prune.hf.ranks import check_launch_environment, launched_processes, launcher_rank

SUBCOMMANDS = {
    "models": "nsc_prune.cli.models",
    "extract": "nsc_prune.cli.extract",
    "eval": "nsc_prune.cli.evaluate",
    "rank": "nsc_prune.cli.rank",
    "heal": "nsc_prune.cli.heal",
    "train-supernet": "nsc_prune.cli.train_supernet",
    "profile": "nsc_prune.cli.profile",
}
SEARCH = "nsc_prune.cli.search"
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a program the pipe killed exits
USAGE = f"nsc-prune --model M --budget B [options]  |  nsc-prune {{{','.join(SUBCOMMANDS)}}} ..."
VALUE_FLAGS = ("--budget",)  # flags whose value may start with "-" (a negative budget is reported as such)


def _command_error(argv: list[str]) -> str | None:
    """The one-line answer for a bare ``nsc-prune`` or an unknown sub-command; None when ``argv`` is runnable."""
    if not argv:
        return f"nothing to do; usage: {USAGE} (see nsc-prune --help)"
    word = argv[0]
    if word in SUBCOMMANDS or word.startswith("-"):
        return None
    hint = (
        did_you_mean(word, list(SUBCOMMANDS))
        or f"; commands: {', '.join(SUBCOMMANDS)}, or the search: nsc-prune --model M --budget B"
    )
    return f"unknown command {word!r}{hint}"


_SETTING_MUST_BE = re.compile(r"(^|: )([a-z][a-z0-9_]*) must be ")


def _as_typed(message: str, parser: Any, argv: list[str]) -> str:
    """``message`` with a setting the library names by its field (``probe_depth must be ...``) named by the flag the
    user typed for it (``--probe-depth must be ...``); a value from a YAML or ``--set`` keeps its field's name."""
    typed = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}

    def flag(match: re.Match) -> str:
        option = "--" + match.group(2).replace("_", "-")
        known = option in typed and option in parser._option_string_actions
        return f"{match.group(1)}{option} must be " if known else match.group(0)

    return _SETTING_MUST_BE.sub(flag, message, count=1)


def main(argv: list[str] | None = None) -> int:
    """Run ``nsc-prune ARGV``; returns the exit status (2 for a usage error or bad input, printed on one line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    problem = _command_error(argv)
    if problem:
        print(f"nsc-prune: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    name = SUBCOMMANDS.get(argv[0])
    module = importlib.import_module(name or SEARCH)
    try:
        parser = module.build_parser()
    except NSCError as err:  # heal's and train-supernet's help shows TrainConfig's defaults: it needs the [hf] extra
        print(f"nsc-prune: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    # Warnings (a deprecated flag's among them) are collected and printed once the command has passed its checks:
    # as its long step starts (nsc_prune._warn.say_held_warnings), as it ends, or before a stop's line; ours as
    # "nsc-prune: warning: ..." lines, other libraries' as Python prints them; a command that fails on bad input
    # prints only its error.
    with collected_warnings() as caught:
        try:
            args = parser.parse_args(join_dash_values(argv[1:] if name else argv, VALUE_FLAGS))
        except SystemExit as done:  # --help, --version, or a usage error already printed on one line
            return int(done.code or 0)
        except Warning as err:  # -W error (a deprecated flag's warning raised): the user's rule, said in one line
            return _warning_made_an_error(err)
        args.command_line = shlex.join(["nsc-prune", *argv])  # recorded in every output's provenance
        written: list = []  # rebound to what recorded_outputs yields
        try:
            with (
                recorded_command(args.command_line),
                recorded_outputs() as written,
                _quiet_if(getattr(args, "quiet", False)),
                _output_streams(),
                _launch_checked_sigterm(),
            ):
                code = int(module.run(args) or 0)
        except Stopped as err:  # a stop signal ended a run that kept its work: exit as the signal ends a process
            print_warnings(caught)  # a stopped run's warnings were about its inputs: said before the stop, not lost
            _say_once(f"nsc-prune: {err}")
            return err.status
        except NSCError as err:
            if caught.started:  # training or an evaluation had started (and said the earlier ones): keep these too
                print_warnings(caught)
            if not (err.every_rank and launcher_rank() != 0):  # a verdict all ranks share: printed once
                print(f"nsc-prune: error: {_as_typed(str(err), parser, argv)}", file=sys.stderr)
            return EXIT_USAGE
        except BrokenPipeError:  # `nsc-prune rank ... | head -1`: the reader has what it wanted
            _stdout_to_devnull()
            return EXIT_BROKEN_PIPE
        except OSError as err:  # unwritable --out, a file where a folder should be, a full disk
            print(f"nsc-prune: error: {_os_error_text(err)}", file=sys.stderr)
            return EXIT_USAGE
        except Warning as err:
            return _warning_made_an_error(err)
        except Exception as err:
            line = _library_failure(err)
            if line is None:
                raise
            print(f"nsc-prune: error: {line}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt as err:  # a training run says where its checkpoints are (InterruptedRun)
            print_warnings(caught)
            _say_once(f"nsc-prune: {_interrupted(err, written)}")
            return 130
        except SystemExit as done:
            signal_name = stop_signal(done.code)
            if signal_name is None:
                raise
            print_warnings(caught)
            _say_once(f"nsc-prune: {_stopped(f'stopped by {signal_name}', written)}")
            return int(done.code)
        finally:
            close_process_group()
    print_warnings(caught)
    return code


def _warning_made_an_error(err: Warning) -> int:
    """A warning of ours that ``-W error`` raised: one ``error:`` line and exit 2, as bad input; another library's
    keeps its traceback, which says where it came from."""
    if not raised_by_nsc_prune(err):
        raise err
    print(f"nsc-prune: error: {err}", file=sys.stderr)
    return EXIT_USAGE


def _os_error_text(err: OSError) -> str:
    """What went wrong and where: the path a rename wrote to (not its temporary), and what stood in the way."""
    named = err.filename2 or err.filename
    where = f": {named}" if named else ""
    if isinstance(err, (FileExistsError, NotADirectoryError)) and named:
        where += " (a file where a folder is needed)"
    elif isinstance(err, IsADirectoryError) and named:
        where += " (a folder where a file is needed)"
    elif err.errno == errno.EFBIG:
        where += " (a file-size limit: ulimit -f, or the file system's)"
    return f"{err.strerror or err}{where}"


OUT_OF_MEMORY = ("can't allocate memory", "Cannot allocate memory", "out of memory")  # torch's CPU, mmap, CUDA


def _library_failure(err: Exception) -> str | None:
    """The line for a failure of the machine that another library raised as its own error, else None: out of memory
    (Python's MemoryError, e.g. a config.json of hidden_size 1e12, or torch's RuntimeError from its CPU allocator,
    a mapped file or CUDA), and safetensors' own error for a full disk, which is no OSError."""
    if isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and any(s in str(err) for s in OUT_OF_MEMORY)):
        return "out of memory: the model or the settings need more than this machine has"
    if safetensors_write_error(err):
        return f"could not write a safetensors file: {err}"
    return None


def _launch_checked_sigterm() -> contextlib.AbstractContextManager:
    """The launcher variables checked first (``check_launch_environment``: one line for a set left in a shell);
    then a SIGTERM outside a training run's own handler cleans up and says what stands (``sigterm_exits``), in a
    process of its own: a launched rank keeps the default, since a rank waiting in a collective would run the
    handler only when the wait returns, and the launcher's SIGTERM to the other ranks of a failed run would wait
    for its SIGKILL."""
    check_launch_environment()
    return sigterm_exits() if launched_processes() == 1 else contextlib.nullcontext()


def _say_once(line: str) -> None:
    """Print a stop's line from rank 0 alone: a launcher's signal stops every rank, and each said the same."""
    if launcher_rank() == 0:
        print(line, file=sys.stderr)


def _interrupted(err: KeyboardInterrupt, written: list) -> str:
    """What a Ctrl-C left: a training run's checkpoints (``InterruptedRun`` says where), the outputs already
    written (the plot or a summary may still have been on its way), or nothing."""
    return str(err) if isinstance(err, InterruptedRun) else _stopped("interrupted", written)


def _stopped(how: str, written: list) -> str:
    """``how`` a command stopped, and the outputs it had written by then, or that it wrote nothing."""
    return f"{how} after it wrote {', '.join(map(str, written))}" if written else f"{how}; nothing was written"


def _stdout_to_devnull() -> None:
    """Point stdout at the null device, so the interpreter's own flush at exit does not fail on the closed pipe
    (Python's documented recipe for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


@contextlib.contextmanager
def _output_streams() -> Iterator[None]:
    """stdout as its reader takes it. Not a terminal (a batch job's log): flushed line by line, so that its lines
    are in the log as they are printed, in order with stderr's, and a killed job keeps them; progress as lines a
    minute apart, and a training run's loss lines (``nsc_prune.hf.progress.log_lines``). An encoding that cannot
    hold every character (a Windows pipe or file: cp1252): those it lacks written escaped, as stderr writes them,
    not a UnicodeEncodeError after the outputs were written (a path of ``--out`` or the model folder's name)."""
    from nsc_prune.hf.progress import log_lines

    stdout = sys.stdout
    changed: dict[str, tuple[Any, Any]] = {}  # setting: (while the command runs, after)
    if hasattr(stdout, "reconfigure"):
        if not stdout.line_buffering and not stdout.isatty():
            changed["line_buffering"] = (True, False)
        if stdout.errors == "strict" and codecs.lookup(stdout.encoding).name != "utf-8":
            changed["errors"] = ("backslashreplace", "strict")
    if changed:
        stdout.reconfigure(**{name: during for name, (during, _) in changed.items()})
    try:
        with log_lines(not sys.stderr.isatty()):
            yield
    finally:
        if changed:
            stdout.reconfigure(**{name: after for name, (_, after) in changed.items()})


def _quiet_if(on: bool) -> contextlib.AbstractContextManager:
    """``--quiet``: no progress bar of ours, nor transformers' (``nsc_prune.hf.progress``), while the command runs."""
    if not on:
        return contextlib.nullcontext()
    from nsc_prune.hf.progress import quiet

    return quiet()


def close_process_group() -> None:
    """Destroy the ``torch.distributed`` group a command ran in (``accelerate launch``, torchrun), if any.

    Left to interpreter shutdown, gloo's worker threads can abort a finished run (SIGABRT, "terminate called
    without an active exception"). Every rank reaches this after the command's last collective."""
    torch = sys.modules.get("torch")  # the search never imports torch: then there is no group
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
