"""Atomic output and provenance: every file nsc-prune writes goes through here."""

from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import errno
import functools
import glob
import hashlib
import itertools
import json
import os
import platform
import re
import shlex
import shutil
import signal
import stat
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from nsc_prune._files import CACHE_ENV, CONFIG_NAME, RECORD_NAME
from nsc_prune._validation import must_be, yaml_problem
from nsc_prune._version import __version__
from nsc_prune.errors import ConfigError, InvalidInputError

try:
    import fcntl
except ImportError:  # not POSIX: publishing takes no lock
    fcntl = None

_COMMAND: contextvars.ContextVar[str | None] = contextvars.ContextVar("nsc_prune_command", default=None)
_PUBLISHED: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("nsc_prune_published", default=None)
WRITTEN_FILES_KEY = "files"  # in a folder's record: every file the command wrote there
TEMP_NAME_EXTRA = 24  # bytes the hidden temporary's name adds to the output's: ".", ".XXXXXXXX.partial" (or ".old")


@contextlib.contextmanager
def context_value(var: contextvars.ContextVar[Any], value: Any) -> Iterator[None]:
    """Within this block ``var`` holds ``value`` (restored on exit): the CLI's per-command switches."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def recorded_command(command: str | None) -> contextlib.AbstractContextManager[None]:
    """Within this block, ``provenance()`` records ``command`` (the CLI's shell-quoted command line)."""
    return context_value(_COMMAND, command)


@contextlib.contextmanager
def recorded_outputs() -> Iterator[list[Path]]:
    """Yield the list of outputs ``atomic_dir`` and ``atomic_file`` publish within this block, in order: what an
    interrupted command had written before it stopped."""
    published: list[Path] = []
    with context_value(_PUBLISHED, published):
        yield published


def _publishing(targets: Iterable[Path]) -> contextlib.AbstractContextManager[None]:
    """Hold an exclusive lock for each folder ``targets`` are published into, for the check that they are free and
    the renames: two runs publishing one output at once interleaved there (one deleted the output the other had just
    published, or left the files of a pair from two runs)."""
    return folder_locks(Path(target).parent for target in targets)


@contextlib.contextmanager
def folder_locks(paths: Iterable[str | os.PathLike]) -> Iterator[None]:
    """Hold an exclusive lock on each of ``paths`` (by real path; a path one process locks must not be locked
    again inside the block). The lock is a file named by the real path in this user's lock folder under the
    system's temporary folder (``_lock_file``): nothing is put in the user's folder or cache, and a lock the user
    holds on that folder itself (``flock DIR cmd``) is not waited for. Where no lock can be taken (no ``fcntl``, no
    writable temporary folder), nothing is locked."""
    with contextlib.ExitStack() as stack:
        for folder in sorted({os.path.realpath(path) for path in paths}):
            fd = _lock_file(folder)
            if fd is None:
                continue
            stack.callback(os.close, fd)
            with contextlib.suppress(OSError):  # a file system without locks: unlocked, as before
                fcntl.flock(fd, fcntl.LOCK_EX)
                stack.callback(fcntl.flock, fd, fcntl.LOCK_UN)
        yield


def _lock_file(folder: str) -> int | None:
    """An open descriptor of the lock file of ``folder`` (read-only suffices for ``flock``), or None. The lock
    folder is used only when it is this user's own and no one else can write in it: in a shared temporary folder
    another user could make it first, then hold a lock for ever or plant a link where a lock file goes."""
    if fcntl is None:
        return None
    try:
        locks = Path(tempfile.gettempdir()) / f"nsc-prune-locks-{os.getuid()}"  # no usable one: OSError
        with contextlib.suppress(FileExistsError):
            locks.mkdir(mode=0o700)
        found = os.lstat(locks)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
            return None
        name = f"{hashlib.sha256(os.fsencode(folder)).hexdigest()[:32]}.lock"
        return os.open(locks / name, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None


def _publish(tmps: list[Path], targets: list[Path]) -> None:
    """Rename each of ``tmps`` over its target (an existing folder moved aside first), with SIGINT, SIGTERM and
    SIGHUP ignored: a signal between the two renames of a replaced folder left neither the old output nor the new
    one, and one between two files published together left a new one beside an old one."""
    with signals_ignored():
        for tmp, target in zip(tmps, targets, strict=True):
            if tmp.is_dir() and target.exists():  # a folder cannot be renamed over another: the old one moves aside
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
                os.replace(target, old)  # over the empty folder just made: a name no earlier run left
                try:
                    os.replace(tmp, target)
                except OSError:  # a folder put there meanwhile by a writer that took no lock: the old one back
                    with contextlib.suppress(OSError):
                        os.rename(old, target)
                    raise
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, target)
            _sync_folder(target.parent)  # the rename itself, on disk
            published = _PUBLISHED.get()
            if published is not None:
                published.append(target)


def command_line() -> str:
    """The command being run: the one set by ``recorded_command``, else ``sys.argv`` shell-quoted."""
    return _COMMAND.get() or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


def provenance(**extra: Any) -> dict[str, Any]:
    """What produced an output: package version, exact command, time, Python; plus ``extra``."""
    record = {
        "nsc_prune_version": __version__,
        "command": command_line(),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
    }
    record.update(extra)
    return record


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


def parse_json(text: str, *, unique_keys: bool = True, constants: bool = False) -> Any:
    """``json.loads`` that refuses, with a ValueError, what Python's json reads but no later step can use: an integer
    past float64's range and nesting past the interpreter's recursion limit; unless ``constants``, NaN and Infinity,
    which JSON has not; with ``unique_keys``, a key repeated in one object, of which json keeps the last silently.
    The defaults are for files nsc-prune writes; another tool's file is read as that tool and transformers read it
    (``unique_keys=False``; ``constants=True`` where a NaN may stand in a field nothing reads)."""
    hooks: dict[str, Any] = {"object_pairs_hook": _unique_keys} if unique_keys else {}
    try:
        return json.loads(text, parse_int=_float_sized_int, parse_constant=None if constants else _no_constant, **hooks)
    except RecursionError as err:
        raise ValueError("arrays or objects nested too deeply") from err


def checkpoint_record(folder: str | os.PathLike) -> dict[str, Any]:
    """The record ``extract`` or ``heal`` wrote in a checkpoint folder (``RECORD_NAME``); empty for any other folder,
    ConfigError for one that does not read."""
    record = Path(folder) / RECORD_NAME
    return read_json_object(record, unique_keys=True) if record.is_file() else {}


def read_model_config(
    folder: str | os.PathLike, name: str, what: str = "a model folder", fix: str = ""
) -> dict[str, Any]:
    """``folder``'s config.json as a dict; InvalidInputError in one line, naming ``name`` (the flag or argument that
    gave the folder) and why, for a path that is not ``what`` with a config.json."""
    folder = Path(folder)
    if not (folder / CONFIG_NAME).is_file():
        why = (
            f"it has no {CONFIG_NAME}"
            if folder.is_dir()
            else "it is a file"
            if folder.exists()
            else "it does not exist"
        )
        raise InvalidInputError(
            must_be(name, f"{what} with {CONFIG_NAME}", str(folder)) + f" ({why})" + (fix and f". {fix}")
        )
    return read_json_object(folder / CONFIG_NAME)


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
    NUL after every letter)."""
    data = Path(path).read_bytes()
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


@contextlib.contextmanager
def _naming(target: Path) -> Iterator[None]:
    """An OSError making the hidden temporary beside ``target`` names ``target``, the path the user gave."""
    try:
        yield
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(target)) from err


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _naming(path):
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


# The signals that stop a command as SIGTERM does: a scheduler's preemption (scancel, kubectl delete) and a closed
# terminal or ssh session (SIGHUP).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
_SIGHUP = getattr(signal, "SIGHUP", None)  # POSIX only


def stop_signal(status: object) -> str | None:
    """The name of the stop signal (``STOP_SIGNALS``) whose exit status (128 + the signal) is ``status``, or None."""
    return next((signum.name for signum in STOP_SIGNALS if status == 128 + signum), None)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # the shell's exit status for a signal; unwinds through atomic_dir's cleanup


def _detach_hung_up_terminal() -> None:
    """After a hang-up every write to the terminal fails (EIO), so a stop's clean-up and its one line would end in
    an OSError: point stdout and stderr, where they are that terminal, at the null device (a log file, a pipe or a
    terminal still open keep them; a write of nothing tells them apart)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                os.write(fd, b"")
            except OSError as err:
                if err.errno == errno.EIO:
                    os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _on_stop(handler: Callable[[int, Any], None], signum: int, frame: Any) -> None:
    if signum == _SIGHUP:
        _detach_hung_up_terminal()
    handler(signum, frame)


@contextlib.contextmanager
def handling_signals(handler: Any, signums: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Handle ``signums`` (SIGTERM and SIGHUP) with ``handler`` for the block and restore the old handlers after. A
    SIGHUP the process ignores (``nohup``) stays ignored, and a SIGHUP's terminal is let go first (its writes would
    fail). Only the main thread can set handlers; elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ignored = {s for s in signums if s == _SIGHUP and signal.getsignal(s) == signal.SIG_IGN}
    installed = functools.partial(_on_stop, handler) if callable(handler) else handler
    old = {signum: signal.signal(signum, installed) for signum in signums if signum not in ignored}
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)


def signals_ignored() -> contextlib.AbstractContextManager[None]:
    """Ignore Ctrl-C, SIGTERM and SIGHUP for the block: a clean-up or publish that a second signal would leave half
    done."""
    return handling_signals(signal.SIG_IGN, (signal.SIGINT, *STOP_SIGNALS))


def _make_parents(target: Path) -> list[Path]:
    """Create ``target``'s missing parent folders; return the ones made, outermost first (``_remove_empty``)."""
    made = [parent for parent in reversed(target.parents) if not parent.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    return made


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders ``_make_parents`` made, innermost first, where nothing else was put in them."""
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            folder.rmdir()


def sigterm_exits() -> contextlib.AbstractContextManager[None]:
    """While the block runs (in the main thread), SIGTERM (SIGHUP) raises ``SystemExit(143)`` (129) instead of ending
    the process outright, so that clean-ups and ``finally`` blocks run as they do for a Ctrl-C."""
    return handling_signals(_terminate)


def _occupied(target: Path) -> bool:
    """Whether ``target`` exists and is not an empty folder (which counts as new)."""
    return (target.exists() or target.is_symlink()) and not (target.is_dir() and not any(target.iterdir()))


def _keep_beside(tmp: Path, target: Path) -> Path:
    """Rename the finished temporary ``tmp`` to the first free ``TARGET.kept-N`` beside ``target``."""
    for n in itertools.count(1):
        kept = target.with_name(f"{target.name}.kept-{n}")
        if not (kept.exists() or kept.is_symlink()):
            os.rename(tmp, kept)
            return kept
    raise AssertionError("unreachable")  # pragma: no cover


def _warn_leftovers(target: Path) -> None:
    """Name the hidden temporaries of ``target`` a killed run left beside it (SIGKILL, a power cut: nothing could
    remove them); they are not removed here, since another process may be writing the same output now."""
    stem = f".{glob.escape(target.name)}.{'?' * 8}"
    left = sorted(p.name for suffix in (".partial", ".old") for p in target.parent.glob(stem + suffix))
    if left:
        warnings.warn(
            f"{target.parent} holds {len(left)} unfinished temporar{'y' if len(left) == 1 else 'ies'} of {target.name} "
            f"({', '.join(left[:2])}{', ...' if len(left) > 2 else ''}): left by a run that was killed, unless "
            f"another is writing {target.name} now; remove {'it' if len(left) == 1 else 'them'} to free the space"
        )


@contextlib.contextmanager
def atomic_dir(
    target: str | os.PathLike,
    overwrite: bool = False,
    replaceable: Callable[[Path], None] | None = None,
    *,
    checked: bool = False,
) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; rename it to ``target`` only on success.

    On any exception (Ctrl-C, SIGTERM and a full disk included) the temporary folder is removed and
    ``target`` is left as it was. An existing ``target`` is refused unless ``overwrite`` (an empty folder counts as
    new, as in ``check_output``), and checked again when the block is done (``replaceable(target)`` raises unless
    it may still be replaced: files put there while the command ran); a refusal then keeps the finished folder
    beside ``target`` and names it. ``checked``: the command checked ``target`` before its slow work, which ran
    before this block (a training), so a ``target`` occupied now was created meanwhile and is handled as at the
    end. While the block runs in the main thread, SIGTERM (SIGHUP) raises ``SystemExit(143)`` (129) instead of
    killing the process outright (which would leave the hidden ``.NAME.*.partial`` folder behind); the final renames and
    the clean-up ignore it.
    """
    shown, target = Path(target), Path(target).absolute()  # "." has no name to put a sibling beside
    if _occupied(target) and not (overwrite or checked):
        raise InvalidInputError(f"output directory {shown} already exists; pass --overwrite to replace it")
    made = _make_parents(target)
    _warn_leftovers(target)
    tmp: Path | None = None
    with handling_signals(_terminate):
        try:
            with _naming(target):
                tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
            yield tmp
            os.chmod(tmp, default_dir_mode())  # mkdtemp makes 0700
            _plain_modes(tmp)
            _sync_tree(tmp)
            with _publishing([target]):
                try:
                    if _occupied(target) and not overwrite:
                        raise InvalidInputError(f"output directory {shown} was created while this command ran")
                    if _occupied(target) and replaceable is not None:
                        replaceable(target)
                except InvalidInputError as err:
                    kept, tmp = _keep_beside(tmp, target), None
                    raise InvalidInputError(
                        f"{err}; nothing was replaced, and this run's output is in {kept}"
                    ) from None
                _publish([tmp], [target])
        except BaseException:
            with signals_ignored():  # a second Ctrl-C or SIGTERM must not interrupt the clean-up
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                _remove_empty(made)
            raise


def _plain_modes(folder: Path) -> None:
    """Give the files below ``folder`` that only their owner may read the permissions of a plain ``open()``: a
    library that writes through a private temporary (transformers 5's ``save_pretrained``) left model.safetensors
    at 0600 beside a 0644 config.json."""
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600:
            os.chmod(path, default_file_mode())


def _sync_tree(folder: Path) -> None:
    """fsync every file below ``folder``, then the folders: its content is on disk before the rename publishes it,
    so a power loss cannot leave a published checkpoint of truncated shards (as ``atomic_files`` does per file)."""
    folders = [folder]
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            continue
        if path.is_dir():
            folders.append(path)
        else:
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for path in folders:
        _sync_folder(path)


def _sync_folder(folder: Path) -> None:
    """fsync a folder's entries (the names renamed into it); a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a folder
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, overwrite: bool = False, *, checked: bool = False) -> Iterator[Path]:
    """Yield a temporary file path beside ``target``; fsync it and rename it to ``target`` only on success.

    The single-file sibling of ``atomic_dir``: on any exception (Ctrl-C, SIGTERM, a full disk) the temporary
    file is removed and ``target`` is left as it was. An existing ``target`` is refused unless ``overwrite``
    (``atomic_files``).
    """
    with atomic_files(target, overwrite=overwrite, checked=checked) as (tmp,):
        yield tmp


@contextlib.contextmanager
def atomic_files(*targets: str | os.PathLike, overwrite: bool = False, checked: bool = False) -> Iterator[list[Path]]:
    """``atomic_file`` for files that belong together (``pareto.json`` and its ``pareto.png``): yields one temporary
    path per target; all of them are published at once after the block, or none is. Without ``overwrite`` an
    existing target is refused on entry (unless ``checked``: the caller checked it before its slow work) and when
    the block is done, where the finished files are kept beside as ``TARGET.kept-N`` and named."""
    paths = [Path(target) for target in targets]
    for target in paths:
        if os.path.lexists(target) and not (overwrite or checked):  # a link to nothing yet too: as at the publish
            raise InvalidInputError(f"output file {target} already exists; pass --overwrite to replace it")
    made = [folder for target in paths for folder in _make_parents(target.absolute())]
    for target in paths:
        _warn_leftovers(target)
    tmps: list[Path] = []
    with handling_signals(_terminate):
        try:
            for target in paths:
                with _naming(target):
                    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
                os.close(fd)
                tmps.append(Path(name))
            yield list(tmps)
            for tmp in tmps:
                with open(tmp, "rb+") as handle:
                    os.fsync(handle.fileno())
                os.chmod(tmp, default_file_mode())  # mkstemp makes 0600
            with _publishing(paths):
                created = [] if overwrite else [target for target in paths if os.path.lexists(target)]
                if created:
                    kept, tmps = [_keep_beside(tmp, target) for tmp, target in zip(tmps, paths, strict=True)], []
                    raise InvalidInputError(
                        f"output file {created[0]} was created while this command ran; nothing was replaced, and "
                        f"this run's output is in {', '.join(map(str, kept))}"
                    )
                _publish(tmps, paths)
        except BaseException:
            with signals_ignored():
                for tmp in tmps:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                _remove_empty(made)
            raise


def publish_text(path: str | os.PathLike, text: str, overwrite: bool = True, checked: bool = False) -> Path:
    """Write ``text`` as the output file ``path`` (``atomic_file``: an existing one only with ``overwrite``;
    ``checked``: the caller checked it before its slow work, so one that exists now was made meanwhile and is kept);
    ``recorded_outputs`` lists it. Returns the path."""
    path = Path(path)
    with atomic_file(path, overwrite=overwrite, checked=checked) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def safetensors_write_error(err: BaseException) -> bool:
    """safetensors' own error for a file it could not write (a full disk): a ``SafetensorError``, not an OSError."""
    return type(err).__name__ == "SafetensorError" and "I/O error" in str(err)


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
    target = out.resolve()
    for given in filter(None, inputs):
        source = Path(given).resolve()
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


def remove_work_dir(work: Path, own: Iterable[str]) -> None:
    """Remove what a training command wrote in its work folder (the ``own`` names of ``check_work_dir``), then the
    folder when nothing else is left: a file put there while the command ran stays, with its folder."""
    for name in own:
        path = work / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink()
    with contextlib.suppress(OSError):  # not empty (or already gone): left as it is
        work.rmdir()


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
    if not exists or (out.is_dir() and not any(out.iterdir())):
        return
    if not out.is_dir():  # --overwrite would not help: said before it is suggested
        raise InvalidInputError(f"{flag} {out} is a file where a folder is written; remove it or choose another {flag}")
    if not (overwrite or rewritable):
        raise InvalidInputError(f"output directory {out} already exists; pass --overwrite to replace it")
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
