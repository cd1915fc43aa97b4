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
