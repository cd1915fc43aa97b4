"""The CLI closes the torch.distributed group it ran in: left to interpreter exit, gloo can abort a finished run."""

import pytest

from nsc_prune.cli import main

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "argv, code",
    [(["--model", "llama-7b", "--budget", "5.7B", "--no-plot"], 0), (["--model", "llama-7b", "--budget", "-1B"], 2)],
)
def test_the_cli_destroys_the_group_it_ran_in(tmp_path, capsys, argv, code):
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert main([*argv, "--out", str(tmp_path / "out")]) == code
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize(
    "argv",
    [["rank", "--benchmark", "evals/ranking/lts_gpt2_wt103_200.json", "--out", "OUT"], ["models"]],
)
def test_a_command_of_one_process_refuses_a_launch_once(tmp_path, capsys, monkeypatch, argv):
    """Under torchrun `rank` ran once per process: both wrote --out, and one failed on the other's file (a stray
    rank.json.kept-1 left)."""
    from pathlib import Path

    from tests.conftest import as_launched_rank

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    argv = [str(tmp_path / "r.json") if a == "OUT" else a for a in argv]
    for rank, said in ((0, f"{argv[0]} runs in one process"), (1, "")):  # every rank alike: rank 0 prints it
        as_launched_rank(monkeypatch, rank)
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and (said in err if said else err == ""), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_launch_asking_for_an_absent_gpu_says_so_once(tmp_path, capsys, monkeypatch):
    from tests.conftest import as_launched_rank

    argv = ["--model", "llama-7b", "--budget", "5.7B", "--device", "cuda", "--out", str(tmp_path / "o")]
    for rank in (0, 1):
        as_launched_rank(monkeypatch, rank)
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert ("--device cuda: torch sees no CUDA GPU" in err) if rank == 0 else err == "", err
