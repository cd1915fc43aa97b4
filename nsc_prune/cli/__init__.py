"""``nsc-prune`` entry point: the search by default, sub-commands for the rest.

Each sub-command lives in its own module exposing ``build_parser()`` and ``run(args) -> int``;
modules are imported only when their command runs, so the search path never imports torch.
"""

from __future__ import annotations

import importlib
import shlex
import sys

from nsc_prune._io import recorded_command
from nsc_prune.cli.parser import join_dash_values
from nsc_prune.errors import NSCError

SUBCOMMANDS = {
    "models": "nsc_prune.cli.models",
    "extract": "nsc_prune.cli.extract",
    "eval": "nsc_prune.cli.evaluate",
    "rank": "nsc_prune.cli.rank",
    "heal": "nsc_prune.cli.heal",
    "train-supernet": "nsc_prune.cli.train_supernet",
}
SEARCH = "nsc_prune.cli.search"
EXIT_USAGE = 2
VALUE_FLAGS = ("--budget",)  # flags whose value may start with "-" (a negative budget is reported as such)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = SUBCOMMANDS.get(argv[0]) if argv else None
    module = importlib.import_module(name or SEARCH)
    parser = module.build_parser()
    try:
        args = parser.parse_args(join_dash_values(argv[1:] if name else argv, VALUE_FLAGS))
    except SystemExit as done:  # --help, --version, or a usage error already printed on one line
        return int(done.code or 0)
    args.command_line = shlex.join(["nsc-prune", *argv])  # recorded in every output's provenance
    try:
        with recorded_command(args.command_line):
            return int(module.run(args) or 0)
    except NSCError as err:
        print(f"nsc-prune: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:  # unwritable --out, a file where a folder should be, a full disk
        where = f": {err.filename}" if err.filename else ""
        print(f"nsc-prune: error: {err.strerror or err}{where}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("nsc-prune: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
