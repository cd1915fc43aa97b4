"""Whole-tensor value checks in slices. torch's reductions build full-size temporaries first (``isfinite`` a bool
tensor and more, ``abs`` a copy): on a 70B model's 2 GiB embedding, several GiB that streaming one tensor at a time
was meant to spare."""

from __future__ import annotations

import math
from typing import Any

from nsc_prune.errors import require

SLICE_ELEMENTS = 1 << 22  # about 4 million values a slice: 16 MiB of temporaries in float32


def _slices(tensor: Any) -> Any:
    """``tensor`` in slices of whole rows (dim 0) of about ``SLICE_ELEMENTS`` values (views: nothing is copied)."""
    if tensor.dim() == 0 or tensor.numel() <= SLICE_ELEMENTS:
        return (tensor,)
    row = max(1, tensor[0].numel())
    return tensor.split(max(1, SLICE_ELEMENTS // row), dim=0)


def all_finite(tensor: Any) -> bool:
    """Whether every value of ``tensor`` is finite (no NaN or inf); integer tensors always are."""
    torch = require("torch", "hf")
    if not tensor.is_floating_point():
        return True
    return all(bool(torch.isfinite(part).all()) for part in _slices(tensor))


def largest_magnitude(tensor: Any) -> float:
    """``max |tensor|`` as a float (0.0 for an empty tensor); NaN where it holds NaN, as torch's ``max``."""
    torch = require("torch", "hf")
    largest = 0.0
    for part in _slices(tensor):
        if part.numel():
            low, high = (float(end) for end in torch.aminmax(part))  # no copy, as abs() makes
            if math.isnan(low) or math.isnan(high):
                return math.nan
            largest = max(largest, high, -low)
    return largest
