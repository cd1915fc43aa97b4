"""Atomic output and provenance: every file nsc-prune writes goes through here."""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nsc_prune._version import __version__
from nsc_prune.errors import InvalidInputError


def provenance(**extra: Any) -> dict[str, Any]:
    """What produced an output: package version, exact command, time, Python; plus ``extra``."""
    record = {
        "nsc_prune_version": __version__,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
    }
    record.update(extra)
    return record


def to_json(obj: Any) -> str:
    """Sorted, indented JSON (the one serialisation used for every output file)."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """Permissions a plain ``open()`` would give a new file (0666 less the umask)."""
    return 0o666 & ~_umask()


def default_dir_mode() -> int:
    """Permissions a plain ``mkdir`` would give a new folder (0777 less the umask)."""
    return 0o777 & ~_umask()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, default_file_mode())  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; rename it to ``target`` only on success.

    On any exception (Ctrl-C and a full disk included) the temporary folder is removed and
    ``target`` is left as it was. An existing ``target`` is refused unless ``overwrite``.
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise InvalidInputError(f"output directory {target} already exists; pass --overwrite to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, default_dir_mode())  # mkdtemp makes 0700
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
