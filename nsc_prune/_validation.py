"""Type checks for values read from YAML, JSON and flags, where ``true`` is a bool and bool is an int."""

from __future__ import annotations

import numbers
from typing import Any


def is_int(value: Any) -> bool:
    """A whole number (Python or numpy integer), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number (int or float, Python or numpy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
