"""The processes of a data-parallel run under ``accelerate launch`` or ``torchrun``: which chunks of the calibration
tokens are this rank's, and the sums every rank must share.

The launcher sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` and the rendezvous address; ``current_ranks`` joins that
group (gloo on the CPU, NCCL on CUDA) unless the caller already did. One process is ``Ranks()``: every chunk is its
own and every reduction is the identity, so the single-process path runs the same code.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nsc_prune.errors import ConfigError, require


@dataclass(frozen=True)
class Ranks:
    """This process's ``index`` among ``count`` processes (``local``: its index on this machine)."""

    index: int = 0
    count: int = 1
    local: int = 0

    @property
    def main(self) -> bool:
        """The process that writes outputs and prints."""
        return self.index == 0

    def mine(self, count: int) -> list[int]:
        """The indices of ``count`` chunks this rank processes: every ``self.count``-th from its own index."""
        return list(range(self.index, count, self.count))

    def sum(self, tensor: Any) -> Any:
        """``tensor`` summed over every rank (in place; every rank gets the sum)."""
        if self.count == 1:
            return tensor
        torch = require("torch", "hf")
        if self._nccl() and tensor.device.type != "cuda":  # NCCL reduces GPU tensors only (a caller's own group)
            on_gpu = tensor.to(f"cuda:{self.local}")
            torch.distributed.all_reduce(on_gpu)
            return tensor.copy_(on_gpu)
        torch.distributed.all_reduce(tensor)
        return tensor

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """A list of floats summed over every rank, in float64."""
        torch = require("torch", "hf")
        return self.sum(torch.tensor(list(values), dtype=torch.float64)).tolist()

    def every(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (a collective; e.g. every rank found a cache, which may be per
        node)."""
        return self.sum_floats([float(bool(flag))])[0] == self.count if self.count > 1 else bool(flag)

    def from_main(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (a picklable object, e.g. a decision only rank 0 may take)."""
        if self.count == 1:
            return value
        shared = [value]
        require("torch", "hf").distributed.broadcast_object_list(shared, src=0)
        return shared[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        if self.count == 1:
            return [value]
        values: list[Any] = [None] * self.count
        require("torch", "hf").distributed.all_gather_object(values, value)
        return values

    def check_same(self, what: str, value: Any) -> None:
        """ConfigError on every rank unless every rank passes an equal ``value`` (e.g. the inputs of a table)."""
        if self.count == 1:
            return
        values = self.gather(value)
        differ = [rank for rank, other in enumerate(values) if other != values[0]]
        if differ:
            raise ConfigError(
                f"the {self.count} processes disagree on {what} (rank {differ[0]} differs from rank 0); launch every "
                "rank with the same files and flags"
            )

    def _nccl(self) -> bool:
        torch = require("torch", "hf")
        return self.count > 1 and torch.distributed.get_backend() == "nccl"


def launcher_rank() -> int:
    """This process's rank as ``torchrun`` / ``accelerate launch`` set it (``RANK``; 0 without a launcher): rank 0
    alone writes outputs and prints."""
    return int(os.environ.get("RANK", "0"))


def current_ranks(device: str = "cpu") -> Ranks:
    """The ranks of this run: one process unless a launcher set ``WORLD_SIZE`` > 1, then the joined group (gloo
    on ``cpu``, NCCL on ``cuda``, each rank on the GPU of its ``LOCAL_RANK``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Ranks()
    torch = require("torch", "hf")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl" if device == "cuda" else "gloo")
    return Ranks(torch.distributed.get_rank(), torch.distributed.get_world_size(), local)
