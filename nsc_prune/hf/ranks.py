"""The processes of a data-parallel run under ``accelerate launch`` or ``torchrun``: which chunks of the calibration
tokens are this rank's, and the sums every rank must share.

The launcher sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` and the rendezvous address; ``current_ranks`` joins that
group (gloo on the CPU, NCCL on CUDA) unless the caller already did. One process is ``Ranks()``: every chunk is its
own and every reduction is the identity, so the single-process path runs the same code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nsc_prune.errors import ConfigError, InvalidInputError, require


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
        wire = self._on_wire(tensor)  # NCCL reduces GPU tensors only (a caller's own group)
        require("torch", "hf").distributed.all_reduce(wire)
        return tensor if wire is tensor else tensor.copy_(wire)

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """A list of floats summed over every rank, in float64."""
        torch = require("torch", "hf")
        return self.sum(torch.tensor(list(values), dtype=torch.float64)).tolist()

    def every(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (a collective; e.g. every rank found a cache, which may be per
        node)."""
        return self.sum_floats([float(bool(flag))])[0] == self.count if self.count > 1 else bool(flag)

    def from_main(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (JSON-serialisable, e.g. a decision only rank 0 may take); every rank,
        rank 0 and a lone process included, gets it back through JSON, so one process sees what N see."""
        if self.count == 1:
            return _decoded(_encoded(value))
        torch = require("torch", "hf")
        data = _encoded(value) if self.main else b""
        size = self._on_wire(torch.tensor([len(data)], dtype=torch.int64))
        torch.distributed.broadcast(size, src=0)
        wire = self._on_wire(_as_bytes_tensor(data, int(size.item())))
        torch.distributed.broadcast(wire, src=0)
        return _decoded(wire.cpu().numpy().tobytes())

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (JSON-serialisable), in rank order, on every rank, each through JSON."""
        if self.count == 1:
            return [_decoded(_encoded(value))]
        torch = require("torch", "hf")
        data = _encoded(value)
        sizes = [self._on_wire(torch.zeros(1, dtype=torch.int64)) for _ in range(self.count)]
        torch.distributed.all_gather(sizes, self._on_wire(torch.tensor([len(data)], dtype=torch.int64)))
        lengths = [int(size.item()) for size in sizes]
        wires = [self._on_wire(torch.zeros(max(lengths), dtype=torch.uint8)) for _ in range(self.count)]
        torch.distributed.all_gather(wires, self._on_wire(_as_bytes_tensor(data, max(lengths))))
        return [_decoded(wire.cpu().numpy().tobytes()[:n]) for wire, n in zip(wires, lengths)]

    def check_same(self, what: str, value: Any) -> None:
        """ConfigError on every rank unless every rank passes an equal ``value`` (e.g. the inputs of a table)."""
        values = self.gather(value)
        differ = [rank for rank, other in enumerate(values) if other != values[0]]
        if differ:
            first, other = values[0], values[differ[0]]
            keys = []
            if isinstance(first, dict) and isinstance(other, dict):
                keys = sorted(k for k in {*first, *other} if first.get(k) != other.get(k))
            raise ConfigError(
                f"the {self.count} processes disagree on {what} (rank {differ[0]} differs from rank 0)"
                + (f" in {keys[0]}" if keys else "")
                + "; launch every rank with the same files and flags",
                every_rank=True,
            )

    def _on_wire(self, tensor: Any) -> Any:
        """``tensor`` where this group's backend reduces it: this rank's GPU under NCCL, else where it is."""
        return tensor.to(f"cuda:{self.local}") if self._nccl() else tensor

    def _nccl(self) -> bool:
        torch = require("torch", "hf")
        return self.count > 1 and torch.distributed.get_backend() == "nccl"


def _encoded(value: Any) -> bytes:
    """``value`` as UTF-8 JSON: what ranks exchange is data, never a pickle (which would run code on unpickling)."""
    try:
        return json.dumps(value).encode("utf-8")
    except TypeError as err:
        raise TypeError(f"ranks exchange JSON values only (lists, dicts, str, numbers, None): {err}") from err


def _decoded(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"))


def _as_bytes_tensor(data: bytes, length: int) -> Any:
    """``data`` zero-padded to ``length`` bytes, as a uint8 tensor (the collectives move tensors only)."""
    torch = require("torch", "hf")
    padded = bytearray(length)
    padded[: len(data)] = data
    return torch.frombuffer(padded, dtype=torch.uint8) if length else torch.zeros(0, dtype=torch.uint8)


LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # torchrun's, accelerate's


def check_launch_environment() -> None:
    """InvalidInputError unless the launcher variables describe one process or a whole launch, as ``torchrun`` and
    ``accelerate launch`` set them. Left over in a shell, a ``RANK`` of 1 made a run finish without writing, and a
    ``WORLD_SIZE`` (or ``LOCAL_RANK``) without the rest ended in torch's or accelerate's traceback."""
    env = {name: os.environ[name] for name in LAUNCH_VARIABLES if name in os.environ}
    said = ", ".join(f"{name}={value}" for name, value in env.items())
    fix = "unset them, or start the command with torchrun / accelerate launch, which set them all"
    try:
        world, rank, local = (int(env.get(name, "1" if name == "WORLD_SIZE" else "0")) for name in LAUNCH_VARIABLES[:3])
    except ValueError:
        raise InvalidInputError(f"{said}: the launcher variables must be whole numbers; {fix}") from None
    if world < 1 or not 0 <= rank < world or not 0 <= local < world:
        size = f"{world}{', as it is unset' if 'WORLD_SIZE' not in env else ''}"
        raise InvalidInputError(
            f"{said}: WORLD_SIZE ({size}) must be at least 1, and RANK and LOCAL_RANK from 0 to WORLD_SIZE - 1: left "
            f"over from another run? {fix}"
        )
    # init_process_group reads RANK and the rendezvous address, and accelerate joins a group wherever LOCAL_RANK is
    # set (world size 1 too)
    launched = world > 1 or "LOCAL_RANK" in env
    missing = [name for name in LAUNCH_VARIABLES if name != "LOCAL_RANK" and name not in env] if launched else []
    if missing:
        raise InvalidInputError(f"{said} set without {', '.join(missing)}: left over from another run? {fix}")


def launched_processes() -> int:
    """The processes ``torchrun`` / ``accelerate launch`` started (``WORLD_SIZE``; 1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launcher_rank() -> int:
    """This process's rank as ``torchrun`` / ``accelerate launch`` set it (``RANK``; 0 without a launcher): rank 0
    alone writes outputs and prints."""
    return int(os.environ.get("RANK", "0"))


def import_before_any_group() -> None:
    """Import ``torch.distributed.nn`` now, before a launcher's run joins its process group (nothing once a group
    exists: importing it then would keep that group).

    Its functions default to ``group=group.WORLD``, evaluated at import. Imported while a group lives (transformers
    imports it when it loads a tokenizer), they keep that group past ``destroy_process_group``: gloo's worker threads
    then outlive the run, and one still freeing a collective's tensors when the interpreter shuts down aborts a
    finished rank (SIGABRT, "terminate called without an active exception"; about one two-process search in 6 to
    50 on two cores). Imported first, the defaults are None."""
    torch = require("torch", "hf")
    if torch.distributed.is_available() and not torch.distributed.is_initialized():
        import torch.distributed.nn


def current_ranks(device: str = "cpu") -> Ranks:
    """The ranks of this run: one process unless a launcher set ``WORLD_SIZE`` > 1, then the joined group (gloo
    on ``cpu``, NCCL on ``cuda``, each rank on the GPU of its ``LOCAL_RANK``).

    A launch that is not whole (a ``WORLD_SIZE`` left in a shell without the rest) is an InvalidInputError here as
    in the CLI, not torch's traceback from its rendezvous."""
    if os.environ.get("WORLD_SIZE", "1").strip() != "1":
        check_launch_environment()
    world = launched_processes()
    if world == 1:
        return Ranks()
    torch = require("torch", "hf")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
    if not torch.distributed.is_initialized():
        import_before_any_group()
        torch.distributed.init_process_group(backend="nccl" if device == "cuda" else "gloo")
    return Ranks(torch.distributed.get_rank(), torch.distributed.get_world_size(), local)
