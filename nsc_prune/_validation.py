"""Checks for values read from YAML, JSON and flags, and the one error-message template.

Every message about a bad value reads ``NAME must be EXPECTED; got VALUE[. how to fix]`` (``must_be``).
Unknown keys: flags are strict (an error), files are lenient (``config_from_dict`` warns, naming the keys and
the close matches), so a file written by a newer version still loads. Type checks know that in YAML/JSON ``true`` is
a bool and that bool is an int in Python.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
from collections.abc import Mapping
from typing import Any

from nsc_prune._warn import warn
from nsc_prune.errors import ConfigError


def is_int(value: Any) -> bool:
    """A whole number (Python or numpy integer), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number (int or float, Python or numpy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def yaml_problem(err: Exception) -> str:
    """An error in one line: a YAML parse error as its problem and where the parser stopped (PyYAML's own message
    spans several lines, with the text quoted under it), any other with its white space folded."""
    folded = " ".join(str(err).split())
    mark = getattr(err, "problem_mark", None)
    if mark is not None:
        return f"{getattr(err, 'problem', None) or folded} (line {mark.line + 1}, column {mark.column + 1})"
    return folded


def name_list(value: Any, name: str, allow_empty: bool = False) -> tuple[str, ...]:
    """A list setting of names as a tuple: one name given alone (``--set lora_targets=q_proj``) is a list of one, not
    its letters; ConfigError for anything but names (a number, a mapping, an empty name, an empty list)."""
    names = (value,) if isinstance(value, str) else value
    valid = isinstance(names, list | tuple) and all(isinstance(n, str) and n for n in names)
    if not valid or not (names or allow_empty):
        expected = "a list of module names" if allow_empty else "a non-empty list of module names"
        raise ConfigError(must_be(name, expected, value))
    return tuple(names)


def must_be(name: str, expected: str, got: Any, fix: str = "") -> str:
    """The message for a bad value: ``"NAME must be EXPECTED; got GOT[. FIX]"`` (``got`` shown with repr)."""
    return f"{name} must be {expected}; got {got!r}" + (f". {fix}" if fix else "")


def check_settings(**settings: tuple[Any, type]) -> None:
    """ConfigError naming the first keyword whose value is neither None nor an instance of its class: a library call
    given a dict or a string where a settings object goes fails here, not deep inside (``options={...}``)."""
    for name, (value, kind) in settings.items():
        if value is not None and not isinstance(value, kind):
            article = "an" if kind.__name__[0] in "AEIOU" else "a"
            raise ConfigError(must_be(name, f"{article} {kind.__name__} or None", value, f"e.g. {kind.__name__}(...)"))


def config_from_dict(config_class: type, data: Mapping[str, Any], source: str) -> Any:
    """Build a config dataclass from a mapping read from a file (a space or eval YAML): unknown keys warn
    (with close matches), missing required keys fail, the dataclass's own checks become ConfigError."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    unknown = sorted(str(key) for key in set(data) - set(fields))  # YAML reads "1: 2" as an int key
    if unknown:
        close = {key: difflib.get_close_matches(key, list(fields), n=1) for key in unknown}
        hints = "; ".join(f"did you mean {match[0]!r} for {key!r}?" for key, match in close.items() if match)
        warn(
            f"{source}: ignoring unknown keys {unknown} (known: {sorted(fields)})" + (f"; {hints}" if hints else ""),
        )
    required = [
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in data]
    if missing:
        raise ConfigError(f"{source}: missing required keys {missing}")
    try:
        return config_class(**{k: v for k, v in data.items() if k in fields})
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: {err}") from err
