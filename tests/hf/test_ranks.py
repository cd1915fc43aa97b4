"""What the processes of a launched run exchange, and who prints a refusal they share. The collectives themselves
run in two real processes in test_compute (psi_W's layers gathered), test_train_budget (rank 0's sizing) and the
input checks of heal and train-supernet."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.hf.ranks import Ranks
from tests.conftest import as_launched_rank

ROOT = Path(__file__).resolve().parents[2]
OBJECT_COLLECTIVES = {
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
}  # torch.distributed's: pickle, then unpickle
PICKLE_LOADERS = ("torch.load", "np.load", "numpy.load")
PICKLING_MODULES = {"pickle", "_pickle", "dill", "cloudpickle", "joblib"}


def test_one_process_exchanges_through_json_as_n_do():
    """A lone process gets back what N processes would: JSON's view of the value (keys as strings, tuples as
    lists), floats to the last bit."""
    value = {1: (0.1 + 0.2, None), "nan": float("nan"), "text": "Ä"}
    [got] = Ranks().gather(value)
    assert got.keys() == {"1", "nan", "text"} and got["1"] == [0.30000000000000004, None] and got["text"] == "Ä"
    assert np.isnan(got["nan"])
    assert Ranks().from_main({"max_steps": 7, "minutes": 0.5}) == {"max_steps": 7, "minutes": 0.5}


@pytest.mark.parametrize("value", [np.zeros(3), {"a": object()}, b"bytes"])
def test_what_is_not_json_is_refused_in_one_process_too(value):
    for exchange in (Ranks().gather, Ranks().from_main, lambda v: Ranks().check_same("x", v)):
        with pytest.raises(TypeError, match="ranks exchange JSON values only"):
            exchange(value)


def test_nothing_in_the_package_unpickles_or_exchanges_pickles():
    """torch.distributed's object collectives pickle on one rank and unpickle on the others; the package and its
    scripts exchange tensors of JSON instead (and read weights from safetensors only)."""
    found = []
    for path in [*(ROOT / "nsc_prune").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and (
                node.attr in OBJECT_COLLECTIVES or ast.unparse(node) in PICKLE_LOADERS
            ):
                names = [ast.unparse(node)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] in PICKLING_MODULES]
            elif isinstance(node, ast.ImportFrom):
                errors_only = all(a.name.endswith("Error") for a in node.names)  # an exception class to catch
                imported = [*([] if errors_only else [node.module or ""]), *(a.name for a in node.names)]
                names = [n for n in imported if n.split(".")[0] in PICKLING_MODULES or n in OBJECT_COLLECTIVES]
            else:
                names = []
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names]
    assert not found, found


@pytest.mark.parametrize("rank, shared, printed", [("0", True, True), ("1", True, False), ("1", False, True)])
def test_a_refusal_every_rank_shares_is_printed_by_rank_0_alone(monkeypatch, capsys, rank, shared, printed):
    """N identical lines under a launcher said nothing more than one; a rank's own refusal (its GPU, its file) is
    still printed by that rank."""
    from nsc_prune import cli

    class FakeCommand:
        @staticmethod
        def build_parser():
            import argparse

            return argparse.ArgumentParser()

        @staticmethod
        def run(args):
            if shared:
                raise ConfigError("the 2 processes disagree on the inputs", every_rank=True)
            raise InvalidInputError("--device cuda: torch sees no CUDA GPU")

    as_launched_rank(monkeypatch, rank)
    monkeypatch.setitem(cli.SUBCOMMANDS, "fake", "fake_command")
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: FakeCommand)
    assert cli.main(["fake"]) == 2
    err = capsys.readouterr().err
    assert err.count("nsc-prune: error: ") == (1 if printed else 0), err


def test_ranks_that_disagree_are_told_the_first_key(monkeypatch):
    """The refusal said only which rank differed; for a dict (the search's flags, a table's key) it names where."""
    monkeypatch.setattr(Ranks, "gather", lambda self, value: [value, {**value, "--score": "'psi_mp'"}])
    with pytest.raises(ConfigError, match=r"\(rank 1 differs from rank 0\) in --score; launch every rank"):
        Ranks(0, 2).check_same("the flags of the search", {"--score": "'measured'", "--budget": "'80%'"})


def test_the_search_s_ranks_may_name_their_own_copies_of_the_files(monkeypatch):
    """Ranks on several nodes may read their own copies (the content is compared where it is read: the weights'
    fingerprint, the text's hash); every other flag is compared, under its flag's name."""
    from nsc_prune.cli.parser import check_ranks_agree_on_flags, path_value
    from nsc_prune.cli.search import PATH_FLAGS, build_parser
    from nsc_prune.hf import ranks as ranks_module

    compared = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(ranks_module, "current_ranks", lambda device: Ranks(0, 2))
    monkeypatch.setattr(Ranks, "gather", lambda self, value: compared.append(value) or [value, value])
    parser = build_parser()
    args = parser.parse_args(["--model", "/node0/m", "--weights", "/node0/m", "--calib", "c.txt", "--budget", "80%"])
    args.command_line = "nsc-prune --model /node0/m ..."
    check_ranks_agree_on_flags("the search", args, PATH_FLAGS)
    (flags,) = compared
    assert "--budget" in flags and "--score" in flags and not {"--model", "--weights", "--calib"} & set(flags)
    assert {a.dest for a in parser._actions if a.type is path_value} <= set(PATH_FLAGS)  # every file flag listed


LAUNCH = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({}, None),
        ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, None),  # a cluster shell's: harmless alone
        ({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, None),  # torchrun
        # accelerate joins a group wherever LOCAL_RANK is set, and env:// needs the address: heal's traceback
        ({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}, "LOCAL_RANK=0 set without MASTER_ADDR, MASTER_PORT"),
        ({"RANK": "0"}, None),
        (
            {"RANK": "1"},
            r"RANK=1: WORLD_SIZE \(1, as it is unset\) must be at least 1, and RANK and LOCAL_RANK from 0 to WORLD_SIZE - 1",
        ),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 set without RANK, MASTER_ADDR, MASTER_PORT: left over from another run"),
        ({"LOCAL_RANK": "0"}, "LOCAL_RANK=0 set without WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT"),
        ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE=two, RANK=0: the launcher variables must be whole numbers"),
        (
            {"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
            "WORLD_SIZE \\(2\\) must be at least 1, and RANK",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "5", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
            "RANK and LOCAL_RANK from 0 to WORLD_SIZE - 1",
        ),
    ],
)
def test_launcher_variables_left_in_a_shell_are_refused(monkeypatch, env, said):
    """A stale RANK=1 made a search, heal or train-supernet finish with exit 0 and write nothing (extract: exit 2
    and no line); a stale WORLD_SIZE or LOCAL_RANK ended in torch's or accelerate's traceback."""
    from nsc_prune.hf.ranks import check_launch_environment

    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if said is None:
        check_launch_environment()
    else:
        with pytest.raises(InvalidInputError, match=said):
            check_launch_environment()


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 set without RANK, MASTER_ADDR, MASTER_PORT"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE=two: the launcher variables must be whole numbers"),
    ],
)
def test_the_library_refuses_a_launch_that_is_not_whole_as_the_cli_does(monkeypatch, env, said):
    """The measured score and psi_W join their ranks through ``current_ranks``: from the library, a stale
    WORLD_SIZE was torch's traceback from its rendezvous (or int()'s ValueError)."""
    from nsc_prune.hf.ranks import current_ranks

    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInputError, match=said):
        current_ranks()
    monkeypatch.setenv("RANK", "1")  # RANK alone: one process (the CLI's rank-0 rule is its own)
    monkeypatch.delenv("WORLD_SIZE")
    assert current_ranks() == Ranks()


@pytest.mark.parametrize(("name", "value"), [("RANK", "1"), ("WORLD_SIZE", "two")])
def test_a_stale_rank_is_one_line_and_exit_2_not_a_silent_success(monkeypatch, tmp_path, capsys, name, value):
    """(WORLD_SIZE=two was a ValueError traceback: it was read before the variables were checked.)"""
    from nsc_prune.cli import main

    for launch in LAUNCH:
        monkeypatch.delenv(launch, raising=False)
    monkeypatch.setenv(name, value)
    assert main(["--model", "llama-7b", "--budget", "80%", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and err.startswith(f"nsc-prune: error: {name}={value}") and not (tmp_path / "out").exists()
    )
