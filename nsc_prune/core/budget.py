"""Budget strings: ``5.7B``, ``5700M``, ``85%`` (of the full model), ``1.4T``, ``40.32M``, ``123456``."""

from __future__ import annotations

import re

from nsc_prune.errors import InvalidInputError

SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMBGT%]?)\s*$", re.IGNORECASE)


def parse_budget(text: str, full: int | None = None) -> int:
    """Parse ``text`` into an integer budget; a percentage needs ``full`` (the unpruned cost)."""
    match = _PATTERN.match(str(text))
    if not match:
        raise InvalidInputError(
            f"cannot read budget {text!r}; use a number with an optional K/M/B/T suffix (5.7B, 5700M, 1.4T) or a percentage (85%)"
        )
    number, suffix = float(match.group(1)), match.group(2).upper()
    if suffix == "%":
        if full is None:
            raise InvalidInputError(f"budget {text!r} is a percentage but there is no full model to take it of")
        if not 0 < number:
            raise InvalidInputError(f"budget percentage must be > 0; got {text!r}")
        return int(round(full * number / 100))
    value = int(round(number * SUFFIXES[suffix]))
    if value <= 0:
        raise InvalidInputError(f"budget must be > 0; got {text!r}")
    return value


def format_count(value: float) -> str:
    """Human form of a large count: 6738415616 -> '6.738B', 1.7097e12 -> '1.710T'."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if abs(value) >= scale:
            return f"{value / scale:.3f}{suffix}"
    return f"{value:g}"
