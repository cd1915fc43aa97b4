"""The one rule for an existing output (``docs/outputs.md``), checked before any slow step, and the checks of
cache entries, work folders and input files."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nsc_prune._files import CACHE_ENV, RECORD_NAME, user_path
from nsc_prune._io.atomic import TEMP_NAME_EXTRA, remove_empty
from nsc_prune._io.formats import parse_json
from nsc_prune.errors import InvalidInputError

WRITTEN_FILES_KEY = "files"  # in a folder's record: every file the command wrote there


def check_cache_path(path: str | os.PathLike, kind: str = "file") -> None:
    """Before the work whose result the cache keeps at ``path`` (a ``file`` or a ``folder``): one line when a folder
    above it is a file or cannot be written (a new entry), or ``path`` is another kind of thing; the write failed only
    after the work, naming a temporary file."""
    path = Path(path)
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidInputError(
                    f"the cache folder {parent} is a file; remove it, or set {CACHE_ENV} to another folder"
                )
            if not os.path.lexists(path) and not os.access(parent, os.W_OK | os.X_OK):  # an entry to write
                raise InvalidInputError(
                    f"the cache folder {parent} cannot be written (read-only, or not yours); set {CACHE_ENV} to "
                    "another folder"
                )
            break
    wrong = path.is_dir() if kind == "file" else os.path.lexists(path) and not path.is_dir()
    if wrong:
        other = "folder" if kind == "file" else "file"
        raise InvalidInputError(f"the cache entry {path} is a {other} where nsc-prune keeps a {kind}; remove it")


def existing_file(path: str | os.PathLike, what: str, fix: str = "") -> Path:
    """``path`` when it is a file; else one line saying that it is a folder or that it does not exist."""
    if not os.fspath(path):
        raise InvalidInputError(f"{what} must name a file; got ''")
    path = Path(path)
    if not path.is_file():
        state = "is a folder, not a file" if path.is_dir() else "is not a regular file" if path.exists() else ""
        raise InvalidInputError(f"{what} {path} {state or 'does not exist'}" + (f"; {fix}" if fix else ""))
    return path


def check_not_input(out: Path, inputs: Iterable[str | os.PathLike | None], flag: str = "--out") -> None:
    """Refuse an ``out`` that is or contains one of ``inputs`` (symlinks resolved): replacing it would delete them."""
    target = user_path(out).resolve()
    for given in filter(None, inputs):
        source = user_path(given).resolve()  # --model '~/m' is read there (presets.user_path)
        if source == target or target in source.parents:
            output = flag != "--work-dir"  # an output is written over; the work folder is removed after the run
            raise InvalidInputError(
                f"{flag} must not be or contain an input: {out} {'is' if source == target else 'contains'} {given}, "
                f"which {'writing it' if output else 'removing it after the run'} would delete. "
                f"Choose {'an' if flag == '--out' else 'a'} {flag} outside the inputs."
            )


def check_outside(out: Path, folders: Iterable[str | os.PathLike | None], flag: str = "--out") -> None:
    """Refuse an ``out`` inside one of the model ``folders`` (symlinks resolved): a checkpoint written into another
    one adds files its record does not list, and that folder's ``--overwrite`` would then be refused."""
    target = out.resolve()
    for given in filter(None, folders):
        folder = Path(given).resolve()
        if folder in target.parents:
            raise InvalidInputError(
                f"{flag} {out} is inside the model folder {given}; write it beside the model, not into it"
            )


def check_work_dir(work: Path, keep: Iterable[str | os.PathLike | None], own: Iterable[str]) -> None:
    """A training command removes its work folder (``--work-dir``) when it succeeds: refuse one that is, or contains,
    any of ``keep`` (the inputs and the output), or that exists holding anything but the ``own`` names the command
    writes there, which removing it would delete."""
    check_not_input(work, keep, flag="--work-dir")
    if work.is_file():
        raise InvalidInputError(f"--work-dir {work} is a file; name a folder for the training state")
    _check_parents(work, "--work-dir")
    if work.is_dir():  # the training state is written inside it
        _check_writable(work, work, "--work-dir")
    own = set(own)
    foreign = sorted(p.name for p in work.iterdir() if p.name not in own) if work.is_dir() else []
    if foreign:
        raise InvalidInputError(
            f"--work-dir {work} holds files this command did not write ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}), and the folder is removed after the run; choose a new folder"
        )


def remove_work_dir(work: Path, own: Iterable[str], made: Sequence[Path] = ()) -> None:
    """Remove what a training command wrote in its work folder (the ``own`` names of ``check_work_dir``), then the
    folder when nothing else is left: a file put there while the command ran stays, with its folder; then the
    folders above it that the command made (``made``, from ``missing_parents`` before the run) and left empty."""
    for name in own:
        path = work / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink()
    with contextlib.suppress(OSError):  # not empty (or already gone): left as it is
        work.rmdir()
    remove_empty(made)


def check_output(
    out: str | os.PathLike,
    inputs: Iterable[str | os.PathLike | None] = (),
    overwrite: bool = False,
    *,
    marker: str | None = RECORD_NAME,
    owner: str = "a checkpoint written by nsc-prune extract",
    rewritable: bool = False,
    flag: str = "--out",
) -> None:
    """The one rule for an existing output, checked before any slow step (``docs/outputs.md``).

    ``out`` must not be, nor contain, any of ``inputs`` (symlinks resolved). A folder output (``marker`` the file
    the command writes into it, e.g. ``nsc_prune_extract.json``) or a file output (``marker=None``) that exists is
    replaced only with ``overwrite`` (or when ``rewritable``: the search's own default folder), and then only when
    it is what the command writes: an empty folder or one holding ``marker`` (``owner`` names it in the error), or
    a file. An empty folder counts as new; a folder whose ``marker`` lists its files (``written_files``) may hold
    no other. A file output is a regular file below folders. Raises ``InvalidInputError`` (one line) otherwise.
    """
    given = os.fspath(out)
    if not given:
        raise InvalidInputError(f"{flag} must name a {'file' if marker is None else 'folder'}; got ''")
    out = Path(out)
    _check_nameable(out, flag, folder=marker is not None)
    _check_no_missing_up(out, flag)
    check_not_input(out, inputs, flag)
    _check_parents(out, flag)
    exists = out.exists() or out.is_symlink()
    if marker is None:
        if out.is_dir():
            raise InvalidInputError(f"{flag} {given} is a folder; name the file to write, e.g. {out / 'NAME'}")
        if given.endswith(("/", os.sep)):
            raise InvalidInputError(f"{flag} {given} ends in '/', which names a folder; drop the '/' to name the file")
        if out.exists() and not out.is_file():  # --overwrite would replace /dev/null or a pipe by a file
            raise InvalidInputError(f"{flag} {out} is not a regular file (a device, pipe or socket); name a file")
        if exists and not (overwrite or rewritable):
            raise InvalidInputError(f"output file {out} already exists; pass --overwrite to replace it")
        return
    if out.is_symlink():  # the publish renames over the link, which a folder cannot be: it failed after the work
        raise InvalidInputError(
            f"{flag} {given} is a symbolic link (to {os.readlink(out)}); name the folder itself, e.g. {out.resolve()}"
        )
    if os.path.ismount(out):  # a container's volume: the publish cannot rename over it, and failed after the work
        raise InvalidInputError(
            f"{flag} {given} is a mount point, which the output cannot be renamed over; name a folder inside it, "
            f"e.g. {out / 'NAME'}"
        )
    if not exists or (out.is_dir() and not any(out.iterdir())):
        return
    if not out.is_dir():  # --overwrite would not help: said before it is suggested
        raise InvalidInputError(f"{flag} {out} is a file where a folder is written; remove it or choose another {flag}")
    # Whether --overwrite could replace the folder is said first: suggesting it, then refusing it, sent users twice
    if not (out / marker).is_file():
        raise InvalidInputError(
            f"--overwrite replaces only {owner} (one with {marker}); {out} has other files, which it would delete. "
            f"Remove the folder yourself or choose another {flag}."
        )
    record = _own_record(out / marker)
    if record is None:  # a results.json of the user's own is no sign the folder is ours
        raise InvalidInputError(
            f"--overwrite replaces only {owner}; {out / marker} was not written by nsc-prune (no provenance), and "
            f"{out} may hold other files, which it would delete. Remove the folder yourself or choose another {flag}."
        )
    listed = record.get(WRITTEN_FILES_KEY)
    if not (isinstance(listed, list) and all(isinstance(name, str) for name in listed)):
        listed = None  # a record of an older nsc-prune, written before the list
    others = [] if listed is None else sorted(set(written_files(out)) - set(listed))
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise InvalidInputError(
            f"--overwrite replaces only what the command wrote; {out} also holds {shown}, which it would delete. "
            f"Move them or choose another {flag}."
        )
    if not (overwrite or rewritable):
        raise InvalidInputError(f"output directory {out} already exists; pass --overwrite to replace it")


def written_files(folder: Path, *adding: str) -> list[str]:
    """Every file below ``folder`` as a relative POSIX path, plus the names ``adding`` (a record about to be
    written), sorted: what a record lists under ``files`` so that ``--overwrite`` can tell the folder is its own."""
    return sorted({*(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()), *adding})


def _own_record(record: Path) -> dict[str, Any] | None:
    """The record nsc-prune wrote at ``record`` (a JSON object with its ``provenance``, or one that is a
    ``provenance``), else None."""
    try:
        document = parse_json(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: invalid, not UTF-8, or nested too deeply
        return None
    if not isinstance(document, dict):
        return None
    provenance = document.get("provenance", document)
    return document if isinstance(provenance, dict) and "nsc_prune_version" in provenance else None


def _check_no_missing_up(out: Path, flag: str) -> None:
    """Refuse a ``..`` after a folder that does not exist (``new/..``): the path exists only once the write has made
    that folder, so every check before it saw another path than the one written, and the write failed after the
    work."""
    for i, part in enumerate(out.parts):
        if part == ".." and not Path(*out.parts[:i]).exists():
            missing = Path(*out.parts[:i])
            raise InvalidInputError(
                f"{flag} {out} goes up from {missing}, which does not exist; name the folder directly"
            )


def _check_parents(out: Path, flag: str) -> None:
    """Refuse an ``out`` below a file (``a_file/x.json``) or in a folder this process cannot write (a read-only
    mount, another user's folder): either would fail only when written, after the slow work."""
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidInputError(f"{flag}: {parent} is a file where a folder is needed; choose another {flag}")
            _check_writable(parent, out, flag)
            _check_name_length(out, parent, flag)
            return


def _check_writable(folder: Path, out: Path, flag: str) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidInputError(
            f"{flag} {out}: cannot write in {folder} (read-only, or not yours); choose another {flag}"
        )


def _check_nameable(out: Path, flag: str, folder: bool) -> None:
    """Refuse an output path that cannot be resolved (a symlink loop), is not UTF-8 (a Latin-1 name, say: safetensors
    cannot open it, nor a JSON record name it), or, for a ``folder``, is the folder this process runs in or holds it
    (the output replaces that folder, and its relative paths and the shell's folder are gone)."""
    try:
        target = out.resolve()
    except (RuntimeError, OSError) as err:  # a symlink loop: RuntimeError before Python 3.13, OSError from it
        raise InvalidInputError(f"{flag} {os.fspath(out)} cannot be followed to a path ({err})") from err
    try:
        os.fspath(target).encode()
    except UnicodeEncodeError as err:
        shown = os.fsencode(target).decode("utf-8", "backslashreplace")
        raise InvalidInputError(
            f"{flag} {shown}: the path holds bytes that are not UTF-8, which safetensors and the records cannot "
            "name; rename it"
        ) from err
    here = _cwd()
    if folder and here is not None and (target == here or target in here.parents):
        raise InvalidInputError(
            f"{flag} {os.fspath(out)} is the folder this runs in, or holds it: the output replaces that folder, "
            "leaving the shell in a deleted one; run from elsewhere or pass another folder"
        )


def _cwd() -> Path | None:
    """The current folder, resolved; None when it was deleted."""
    try:
        return Path.cwd().resolve()
    except OSError:
        return None


def _check_name_length(out: Path, parent: Path, flag: str) -> None:
    """Refuse a name too long for the hidden temporary beside it (``.NAME.XXXXXXXX.partial``, ``TEMP_NAME_EXTRA``
    bytes more): the file system refused it only when the output was written."""
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no such query here (Windows): the write says it, if ever
        return
    parts = out.absolute().relative_to(parent).parts  # the folders to make, then the output's own name
    for depth, part in enumerate(parts, start=1):
        allowed = limit - TEMP_NAME_EXTRA if depth == len(parts) else limit
        if len(os.fsencode(part)) > allowed:
            raise InvalidInputError(
                f"{flag} {out}: the name {part[:16]}... ({len(os.fsencode(part))} bytes) is too long here (at most "
                f"{allowed}: the temporary written beside the output adds {TEMP_NAME_EXTRA}); choose a shorter {flag}"
            )


def check_out_dir(out: Path, inputs: Iterable[str | os.PathLike | None], overwrite: bool) -> None:
    """``check_output`` for a checkpoint folder (extract's and heal's ``--out``: ``nsc_prune_extract.json``)."""
    check_output(out, inputs, overwrite)
