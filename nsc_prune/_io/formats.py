"""Reading the text formats of inputs and records: strict JSON (no NaN, no 1e400, no key twice in nsc-prune's
own files), YAML, UTF-8 text; JSON as nsc-prune writes it; a file's sha256."""

from __future__ import annotations

import codecs
import functools
import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from nsc_prune._files import RECORD_NAME
from nsc_prune._validation import yaml_problem
from nsc_prune.errors import ConfigError


def _no_constant(name: str) -> Any:
    """Python's json reads NaN and Infinity, which JSON has not: a config value of NaN passed every check and failed
    when the output's config was written, after the slow work."""
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's dict; ValueError for a key it holds twice (an architecture, a tensor or a field written twice
    is an error, not the last one silently kept)."""
    data = dict(pairs)
    if len(data) != len(pairs):
        keys = [key for key, _ in pairs]
        repeated = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"the key {repeated!r} appears more than once in one object")
    return data


def _float_sized_int(text: str) -> int:
    number = int(text)
    if abs(number) > sys.float_info.max:  # every number is used as a float somewhere: float() would overflow there
        digits = len(text.lstrip("-"))
        raise ValueError(f"the integer of {digits} digits starting {text[:12]} is past a float's range")
    return number


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e400: json reads it as inf, which no JSON writer takes back
        raise ValueError(f"the number {text[:24]} is past a float's range")
    return number


def parse_json(text: str, *, unique_keys: bool = True, constants: bool = False) -> Any:
    """``json.loads`` that refuses, with a ValueError, what Python's json reads but no later step can use: an integer
    past float64's range and nesting past the interpreter's recursion limit; unless ``constants``, NaN and Infinity,
    which JSON has not, and a number past a float's range (1e400, read as inf); with ``unique_keys``, a key repeated
    in one object, of which json keeps the last silently.
    The defaults are for files nsc-prune writes; another tool's file is read as that tool and transformers read it
    (``unique_keys=False``; ``constants=True`` where a NaN may stand in a field nothing reads)."""
    hooks: dict[str, Any] = {"object_pairs_hook": _unique_keys} if unique_keys else {}
    if not constants:
        hooks["parse_float"] = _finite_float
    try:
        return json.loads(text, parse_int=_float_sized_int, parse_constant=None if constants else _no_constant, **hooks)
    except RecursionError as err:
        raise ValueError("arrays or objects nested too deeply") from err


def checkpoint_record(folder: str | os.PathLike) -> dict[str, Any]:
    """The record ``extract`` or ``heal`` wrote in a checkpoint folder (``RECORD_NAME``); empty for any other folder,
    ConfigError for one that does not read."""
    record = Path(folder) / RECORD_NAME
    return read_json_object(record, unique_keys=True) if record.is_file() else {}


def read_json_object(path: str | os.PathLike, *, unique_keys: bool = False) -> dict[str, Any]:
    """A JSON file holding an object (config.json, adapter_config.json) as a dict; ConfigError otherwise (NaN
    included). ``unique_keys``: a key written twice in one object is refused, for the files nsc-prune writes (a hand
    edit); another tool's file is read as json and transformers read it, the last one kept."""
    path = Path(path)
    try:
        data = parse_json(path.read_text(encoding="utf-8"), unique_keys=unique_keys)
    except ValueError as err:  # invalid JSON or invalid UTF-8
        raise ConfigError(f"{path} is not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_utf8(path: str | os.PathLike, what: str, why: str = "") -> str:
    """A text file's content; ConfigError in one line, naming ``what`` and the file (and ``why`` it must be UTF-8),
    for one that is not UTF-8 or holds NUL bytes (UTF-16 without a byte-order mark decodes as UTF-8 otherwise, a
    NUL after every letter). A leading UTF-8 byte-order mark (Notepad's) is not part of the text."""
    data = Path(path).read_bytes().removeprefix(codecs.BOM_UTF8)
    if b"\x00" in data:
        raise ConfigError(
            f"{what} {path} is binary or UTF-16 (it has NUL bytes), not UTF-8 text" + (f" ({why})" if why else "")
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text: byte {err.start} is not" + (f" ({why})" if why else "")
        ) from err
    return text.replace("\r\n", "\n").replace("\r", "\n")  # lines as read_text reads them (universal newlines)


@functools.cache
def _yaml_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        """YAML 1.1's SafeLoader, with YAML 1.2's exponent floats that 1.1 reads as text: without a dot (``1e-3``)
        or with an unsigned exponent (``1.5e3``), and no aliases: nine nested ``*a`` of ten items in a 458-byte file
        make 10**9 values, which a check or its message would walk."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.events.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"found the alias *{event.anchor}: write the value out", event.start_mark
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if not isinstance(node, yaml.MappingNode):  # `!!set [1]`: the parent's one-line error
                return super().construct_mapping(node, deep)
            seen = set()  # as the JSON reader: a key written twice is an error, not the last value silently kept
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` may restate keys (YAML's merge rules); the
                    merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                    for part in merged:  # mappings it merges are checked here: PyYAML flattens them unseen
                        if isinstance(part, yaml.MappingNode):
                            self.construct_mapping(part, deep)
                    continue
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, Hashable) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"found the key {key!r} twice in one mapping: keep one", key_node.start_mark
                    )
                if isinstance(key, Hashable):
                    seen.add(key)
            return super().construct_mapping(node, deep)

    exponent_float = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(exponent_float), list("-+.0123456789"))
    return Loader


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` that reads ``1e-3`` and ``1.5e3`` as the numbers a user means (a space's ``init``,
    ``--set init=1e-3``)."""
    import yaml

    return yaml.load(text, Loader=_yaml_loader())  # a SafeLoader: plain data only, no Python objects


def read_yaml(path: str | os.PathLike, what: str) -> Any:
    """The content of a YAML file (a space, an eval config); ConfigError in one line, naming ``what`` and the file,
    for one that is not UTF-8 text or not valid YAML."""
    import yaml

    path = Path(path)
    try:
        return parse_yaml(read_utf8(path, what, "a YAML file is UTF-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"{what} {path} is not valid YAML ({yaml_problem(err)})") from err


def to_json(obj: Any) -> str:
    """Sorted, indented JSON (the one serialisation used for every output file)."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False, default=json_number) + "\n"


def json_number(value: Any) -> Any:
    """A numpy number as the Python one (the checks accept ``np.int64(2)`` for an int: it failed only when the
    output was written, after the work)."""
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
