"""Recovery training under a launcher (``accelerate launch``, ``torchrun``): the processes of the run, the checks
that they agree, the refusal of sharded launches, the device of this process, and rank 0's time-budget sizing on
every rank."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsc_prune.errors import ConfigError, require
from nsc_prune.hf.ranks import Ranks, current_ranks, import_before_any_group, launched_processes
from nsc_prune.hf.train.budget import BudgetTooSmall, SizedRun
from nsc_prune.hf.train.data import TextBlocks
from nsc_prune.hf.train.recipe import TrainConfig

torch = require("torch", "hf")


def agreed_sizing(sized: SizedRun) -> SizedRun:
    """Rank 0's sizing on every rank of a launcher's run: each rank times its own steps, and all must stop at the
    same step (a collective: every rank calls it at the same points)."""
    return SizedRun.from_dict(trainer_ranks().from_main(sized.to_dict()))


def agreed_budget(measure: Callable[[], SizedRun]) -> SizedRun:
    """Rank 0's verdict on a time budget on every rank: each rank runs ``measure`` (its own probe), then all take
    rank 0's sizing, or all refuse with rank 0's one line (BudgetTooSmall). A rank whose probe alone finds the
    budget too small runs rank 0's steps: failing it would fail the run rank 0 sized (a collective)."""
    try:
        outcome: dict[str, Any] | str = measure().to_dict()
    except BudgetTooSmall as err:
        outcome = str(err)
    outcome = trainer_ranks().from_main(outcome)
    if isinstance(outcome, str):
        raise BudgetTooSmall(outcome, every_rank=True)
    return SizedRun.from_dict(outcome)


def trainer_ranks() -> Ranks:
    """The processes of this run in the process group accelerate (so the Trainer) uses, joined here if it is not
    yet; ``Ranks()`` without a launcher."""
    if launched_processes() > 1:
        import_before_any_group()
        require("accelerate", "hf").PartialState()
    return current_ranks()


def check_ranks_agree(job: str, blocks: TextBlocks, config: TrainConfig, *models: Path | None) -> None:
    """ConfigError on every rank of a launcher's run unless all ranks read the same weights (``models``' folders;
    None: none), text blocks and recipe: ranks that disagree would train apart or hang in a collective."""
    ranks = trainer_ranks()
    if ranks.count == 1:
        return
    from nsc_prune.hf.weights.fingerprint import weights_fingerprint

    inputs = {
        "weights": [weights_fingerprint(Path(m)) if m is not None else None for m in models],
        "blocks": blocks.fingerprint(),
        "recipe": config.to_dict(),
    }
    ranks.check_same(f"the inputs of {job} (weights, text, recipe)", inputs)


SHARDED_LAUNCHES = {"ACCELERATE_USE_FSDP": "FSDP", "ACCELERATE_USE_DEEPSPEED": "DeepSpeed"}
"""The variables ``accelerate launch`` sets for a sharded (or engine-run) training, and the plugin's name."""


def refuse_sharded_launch(job: str) -> None:
    """ConfigError under an FSDP or DeepSpeed launch: ``job`` (heal, train-supernet) trains with plain data
    parallelism and merges and writes the unwrapped model, whose weights such a launch may leave sharded."""
    parse_flag = require("accelerate", "hf").utils.parse_flag_from_env
    for variable, plugin in SHARDED_LAUNCHES.items():
        if parse_flag(variable):
            raise ConfigError(
                f"{job} runs plain data parallelism only (every process holds the whole model): this launch asks "
                f"for {plugin} ({variable} is set), which leaves the weights {job} merges and writes sharded. Launch "
                "with `accelerate launch --multi_gpu` or torchrun (docs/recovery.md, 'Several GPUs')",
                every_rank=True,
            )


def training_device() -> torch.device:
    """The device the Trainer of ``training_arguments`` trains on in this process: the GPU of the launcher's
    ``LOCAL_RANK`` (accelerate's choice; the first GPU without a launcher), else MPS or the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
