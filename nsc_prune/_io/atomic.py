"""Atomic output: every file and folder nsc-prune writes is made as a hidden temporary beside its target, synced,
and renamed into place under a lock; on any failure the target is left as it was."""

from __future__ import annotations

import contextlib
import contextvars
import glob
import hashlib
import itertools
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from nsc_prune._io.provenance import context_value
from nsc_prune._io.signals import signals_held, signals_ignored, sigterm_exits
from nsc_prune._warn import warn
from nsc_prune.errors import InvalidInputError

try:
    import fcntl
except ImportError:  # not POSIX: publishing takes no lock
    fcntl = None


_PUBLISHED: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("nsc_prune_published", default=None)
TEMP_NAME_EXTRA = 24  # bytes the hidden temporary's name adds to the output's: ".", ".XXXXXXXX.partial" (or ".old")


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


@contextlib.contextmanager
def claimed_work_dir(folder: str | os.PathLike) -> Iterator[None]:
    """Hold a training's work folder (its checkpoints and run record) for the block: a second run naming the same
    folder (the same ``--out`` twice, one ``--work-dir``) is refused at once in one line. It trained beside the
    first, into its checkpoints, and removed them all when it finished (the first's ``--resume`` then refused).
    Under a launcher rank 0 holds it for every rank. Where no lock can be taken, nothing is held."""
    # a launcher's rank, as nsc_prune.hf.ranks.launcher_rank reads it (which _io, below hf, does not import)
    first = os.environ.get("RANK", "0").strip() in ("", "0")
    fd = _lock_file(f"work:{os.path.realpath(folder)}") if first else None  # not the lock a publish there takes
    if fd is None:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidInputError(
                f"the work folder {folder} is in use by another nsc-prune run (the same --out, or the same "
                "--work-dir); wait for it to end, or pass another --out or --work-dir"
            ) from None
        except OSError:  # a file system without locks: unheld, as before
            pass
        yield
    finally:
        os.close(fd)


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
    SIGHUP held off until the renames are done and a replaced folder's old copy is removed: a signal between the two
    renames of a replaced folder left neither the old output nor the new one, and one between two files published
    together left a new one beside an old one."""
    with signals_held():
        for tmp, target in zip(tmps, targets, strict=True):
            if tmp.is_dir() and target.exists():  # a folder cannot be renamed over another: the old one moves aside
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=_folder_of(target)))
                try:
                    os.replace(target, old)  # over the empty folder just made: a name no earlier run left
                except OSError as err:  # a target that cannot move (busy, immutable): the folder made for it goes
                    os.rmdir(old)
                    raise OSError(err.errno, f"{err.strerror} (moving the existing output aside)", str(target)) from err
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


def _folder_of(target: Path) -> str:
    """The folder ``target`` goes into, as the file system resolves it: ``tempfile`` reads ``..`` as text, so the
    temporary of ``LINK/../out`` was made beside ``LINK`` instead of in the folder ``LINK/..`` is, and the rename
    failed after the work (or crossed file systems)."""
    return os.path.realpath(target.parent)


@contextlib.contextmanager
def naming_output(target: Path) -> Iterator[None]:
    """An OSError inside the block (making the hidden temporary beside ``target``, writing it) names ``target``, the
    path the user gave."""
    try:
        yield
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(target)) from err


@contextlib.contextmanager
def _naming_inside(tmp: Path, target: Path) -> Iterator[None]:
    """An OSError naming a file inside the hidden temporary folder ``tmp`` (removed on failure) names that file
    inside ``target``, the folder the user gave."""
    try:
        yield
    except OSError as err:
        named = err.filename if isinstance(err.filename, (str, bytes, os.PathLike)) else None  # not a descriptor
        if named is None or not Path(os.fsdecode(named)).is_relative_to(tmp):
            raise
        where = target / Path(os.fsdecode(named)).relative_to(tmp)
        raise OSError(err.errno, err.strerror, str(where)) from err


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming_output(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=_folder_of(path))
    try:
        with naming_output(path), os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, default_file_mode())  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def file_size_limit() -> int | None:
    """This process's file-size limit in bytes (``ulimit -f``), None where it has none: a write past it fails as a
    full disk would, or with EFBIG."""
    try:
        import resource
    except ImportError:  # not POSIX: no such limit
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def missing_parents(target: Path) -> list[Path]:
    """``target``'s parent folders that do not exist yet, outermost first (to ``remove_empty`` after a run)."""
    return [parent for parent in reversed(target.absolute().parents) if not parent.exists()]


def _make_parents(target: Path) -> list[Path]:
    """Create ``target``'s missing parent folders; return the ones made, outermost first (``remove_empty``)."""
    made = missing_parents(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return made


def remove_empty(folders: Sequence[Path]) -> None:
    """Remove the folders ``missing_parents`` named, innermost first, where nothing else was put in them."""
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            folder.rmdir()


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


def _holds_files(folder: Path) -> bool:
    """Whether ``folder`` holds anything (False where it cannot be read: another user's leftover)."""
    try:
        return any(folder.iterdir())
    except OSError:
        return False


def _warn_leftovers(target: Path) -> None:
    """Name the hidden temporaries of ``target`` a killed run left beside it (SIGKILL, a power cut: nothing could
    remove them); they are not removed here, since another process may be writing the same output now."""
    stem = f".{glob.escape(target.name)}.{'?' * 8}"
    left = sorted(p.name for suffix in (".partial", ".old") for p in target.parent.glob(stem + suffix))
    if not os.path.lexists(target):  # killed between the two renames of a replace: the last output, moved aside
        olds = [name for name in left if name.endswith(".old") and _holds_files(target.parent / name)]
        if olds:
            warn(
                f"{target.parent / olds[0]} holds the earlier {target.name}, moved aside by a run killed while "
                f"replacing it (the new one never took its place); it is kept: rename it to {target.name} to restore it"
            )
            left.remove(olds[0])
    if left:
        warn(
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
    end. While the block runs in the main thread, SIGTERM (SIGHUP) at its default raises ``SystemExit(143)`` (129)
    instead of killing the process outright (which would leave the hidden ``.NAME.*.partial`` folder behind); a
    handler the caller set is kept. The final renames hold stop signals off until they are done; the clean-up
    ignores them.
    """
    shown, target = Path(target), Path(target).absolute()  # "." has no name to put a sibling beside
    if _occupied(target) and not (overwrite or checked):
        raise InvalidInputError(f"output directory {shown} already exists; pass --overwrite to replace it")
    made = _make_parents(target)
    _warn_leftovers(target)
    tmp: Path | None = None
    with sigterm_exits(keep_set_handlers=True):
        try:
            with naming_output(target):
                tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=_folder_of(target)))
            with _naming_inside(tmp, target):  # a full disk while the block writes: its file in the output
                yield tmp
            os.chmod(tmp, default_dir_mode())  # mkdtemp makes 0700
            _plain_modes(tmp)
            with naming_output(target):  # a full disk may only say so at the fsync
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
                remove_empty(made)
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
    with sigterm_exits(keep_set_handlers=True):
        try:
            for target in paths:
                with naming_output(target):
                    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=_folder_of(target))
                os.close(fd)
                tmps.append(Path(name))
            yield list(tmps)
            for tmp, target in zip(tmps, paths, strict=True):
                with naming_output(target), open(tmp, "rb+") as handle:
                    os.fsync(handle.fileno())  # a full disk may only say so here
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
                remove_empty(made)
            raise


def publish_text(path: str | os.PathLike, text: str, overwrite: bool = True, checked: bool = False) -> Path:
    """Write ``text`` as the output file ``path`` (``atomic_file``: an existing one only with ``overwrite``;
    ``checked``: the caller checked it before its slow work, so one that exists now was made meanwhile and is kept);
    ``recorded_outputs`` lists it. Returns the path."""
    path = Path(path)
    with atomic_file(path, overwrite=overwrite, checked=checked) as tmp, naming_output(path):
        tmp.write_text(text, encoding="utf-8")  # a full disk's OSError names no file: it names the output
    return path


def safetensors_write_error(err: BaseException) -> bool:
    """safetensors' own error for a file it could not write (a full disk): a ``SafetensorError``, not an OSError."""
    return type(err).__name__ == "SafetensorError" and "I/O error" in str(err)
