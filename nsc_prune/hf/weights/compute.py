"""Where a streamed base runs and in which float type: calibration (``activation``), the measured table and psi_W.

Torch-free at import: the CLI builds and validates a ``Compute`` before anything heavy is loaded; ``check`` asks
torch whether this machine can run it, before any slow step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nsc_prune._validation import must_be
from nsc_prune.choices import COMPUTE_DTYPES, DEVICES
from nsc_prune.errors import ConfigError, require


@dataclass(frozen=True)
class Compute:
    """``device``: cpu or cuda (the current CUDA device); ``dtype``: the float type of the layers and hidden states
    (losses, activation sums and spectra are always accumulated in float32 or float64)."""

    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(must_be("--device", f"one of {DEVICES}", self.device))
        if self.dtype not in COMPUTE_DTYPES:
            raise ConfigError(must_be("--calib-dtype", f"one of {COMPUTE_DTYPES}", self.dtype))

    def check(self) -> None:
        """ConfigError unless this machine can run ``device`` in ``dtype``."""
        if self.device == "cuda":
            require_cuda()
        if self.device == "cpu" and self.dtype == "float16":
            raise ConfigError(
                must_be(
                    "--calib-dtype on cpu", "float32 or bfloat16", "float16", "float16 is a GPU type; pass bfloat16"
                )
            )
        if self.device == "cuda" and self.dtype == "bfloat16" and not gpu_has_native_bf16():
            raise ConfigError(
                must_be(
                    "--calib-dtype on this GPU",
                    "float32 or float16",
                    "bfloat16",
                    "It has no native bfloat16 (compute capability below 8.0)",
                )
            )

    @property
    def torch_dtype(self) -> Any:
        return getattr(require("torch", "hf"), self.dtype)

    def record(self) -> dict[str, str]:
        """What provenance records: the device (with the GPU's name) and the dtype."""
        torch = require("torch", "hf")
        where = {"device": self.device, "dtype": self.dtype}
        if self.device == "cuda" and torch.cuda.is_available():
            where["gpu"] = torch.cuda.get_device_name()
        return where


def require_cuda(device: str = "cuda") -> None:
    """ConfigError for ``--device DEVICE`` (cuda, cuda:1) where torch sees no CUDA GPU: one message for every
    command, naming the torch build (a CPU wheel is the usual cause)."""
    torch = require("torch", "hf")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"--device {device}: torch sees no CUDA GPU on this machine (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}); pass --device cpu, or install a CUDA build of torch"
        )


def gpu_has_native_bf16(device: Any = None) -> bool:
    """Whether the CUDA GPU ``device`` (the current one by default) computes bfloat16 in hardware (compute
    capability 8.0 or later). torch's ``is_bf16_supported()`` alone also says yes where bf16 is only emulated
    (V100, T4), and slower there than float32."""
    torch = require("torch", "hf")
    if not torch.cuda.is_available():
        return False
    with torch.cuda.device(device if device is not None else torch.cuda.current_device()):
        return torch.cuda.is_bf16_supported(including_emulation=False)
