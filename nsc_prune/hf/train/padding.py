"""Units a checkpoint holds as zeros stay zeros while it heals.

``extract --format padded`` and ``--format nemotron-nas`` keep a cut attention head or FFN channel as zeros: the
head's ``o_proj`` columns (and its query rows), the channel's ``down_proj`` column (and its gate and up rows). Such a
unit adds nothing only while its ``o_proj`` / ``down_proj`` columns are zero. Training writes into them: LoRA's ``B``
is shared by every column, and under ``--full`` a zero query head on a live KV head (nemotron-nas) attends uniformly
and feeds the mean of its values to its columns' gradient; either way the head the plan cut comes back. So while
the model heals, the inputs of those columns are masked (a forward pre-hook on the projection, wrapped by PEFT or
not: LoRA's path and the base weight's alike), and after the merge the columns are set to zero again: the masked
columns added nothing during training, so this changes nothing the model computes. The unit's query, key, value,
gate and up rows get no gradient then, and stay zero; so does a dropped layer's bias (padded checkpoints with
``attention_bias`` / ``mlp_bias``), whose projection outputs zeros while the model heals."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

INPUT_PROJECTIONS = ("o_proj", "down_proj")  # the projections whose input columns are a layer's heads / channels


def _plain_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _weight(module: Any) -> torch.Tensor:
    return getattr(module, "base_layer", module).weight


def zero_columns(model: Any) -> dict[str, torch.Tensor]:
    """``{module name: bool mask of its all-zero input columns}`` for every ``o_proj`` and ``down_proj`` of
    ``model`` that has any; empty for a checkpoint that holds no unit as zeros."""
    found = {}
    for name, module in _plain_model(model).named_modules():
        if name.rsplit(".", 1)[-1] in INPUT_PROJECTIONS and isinstance(module, torch.nn.Linear):
            zero = ~_weight(module).detach().ne(0).any(dim=0)
            if bool(zero.any()):
                found[name] = zero.cpu()
    return found


def _masked_input(keep: torch.Tensor) -> Any:
    moved: dict[tuple[Any, Any], torch.Tensor] = {}  # one copy per device and dtype: a GPU step does not wait on one

    def hook(module: Any, args: tuple[Any, ...]) -> Any:
        where = (args[0].device, args[0].dtype)
        if where not in moved:
            moved[where] = keep.to(device=args[0].device, dtype=args[0].dtype)
        return (args[0] * moved[where], *args[1:])

    return hook


def _silenced(module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
    return output * 0  # its bias then gets no gradient and stays zero


def _is_dropped(module: Any, zero: torch.Tensor) -> bool:
    """Every input column and the bias zero: a dropped layer's ``o_proj`` / ``down_proj`` in a padded checkpoint."""
    bias = getattr(module, "base_layer", module).bias
    return bool(zero.all()) and (bias is None or not bool(bias.detach().ne(0).any()))


@contextlib.contextmanager
def zero_columns_masked(model: Any, zeros: dict[str, torch.Tensor]) -> Iterator[None]:
    """Within the block, the ``zeros`` columns (``zero_columns``) of ``model`` read zeros, whatever training writes
    into them, and a dropped layer's projection (every column and its bias zero) outputs zeros: under ``--full``
    its bias would train and add a constant to the residual stream. Call it on the model as it trains (after PEFT
    wrapped its projections)."""
    plain = _plain_model(model)
    handles = []
    for name, zero in zeros.items():
        module = plain.get_submodule(name)
        handles.append(module.register_forward_pre_hook(_masked_input(~zero)))
        if _is_dropped(module, zero):
            handles.append(module.register_forward_hook(_silenced))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def restore_zero_columns_(model: Any, zeros: dict[str, torch.Tensor]) -> None:
    """Set the ``zeros`` columns of ``model``'s weights (merged) to zero again."""
    plain = _plain_model(model)
    for name, zero in zeros.items():
        weight = _weight(plain.get_submodule(name))
        weight[:, zero.to(weight.device)] = 0
