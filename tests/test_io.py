"""Atomic output and provenance (nsc_prune._io): SIGTERM leaves nothing half-written; the command recorded."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nsc_prune._files import RECORD_NAME
from nsc_prune._io import (
    STOP_SIGNALS,
    atomic_dir,
    atomic_file,
    atomic_files,
    atomic_write_text,
    check_output,
    command_line,
    parse_json,
    provenance,
    publish_text,
    read_json_object,
    recorded_command,
    recorded_outputs,
    remove_work_dir,
    sigterm_exits,
)
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.ranking.benchmarks import load_benchmark
from tests.conftest import as_in_a_terminal

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from nsc_prune._io import atomic_dir

    with atomic_dir(Path(sys.argv[1])) as tmp:
        (tmp / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
        print("writing", flush=True)
        time.sleep(60)  # "mid-write": the parent sends SIGTERM now
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("signum", STOP_SIGNALS)  # a preemption, a closed terminal
def test_sigterm_mid_write_leaves_no_partial_folder(tmp_path, signum):
    target = tmp_path / "ckpt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(target)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=as_in_a_terminal,
    )  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "writing"
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]  # the temporary folder exists
        child.send_signal(signum)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 128 + signum, err  # unwound as SystemExit(143), not killed (-15)
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no .ckpt.*.partial, no ckpt


def test_sigterm_handler_is_restored_and_errors_clean_up(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with atomic_dir(tmp_path / "a") as tmp:
        assert signal.getsignal(signal.SIGTERM) is not before
        (tmp / "f").write_text("x")
    assert signal.getsignal(signal.SIGTERM) is before
    assert (tmp_path / "a" / "f").read_text() == "x"
    with pytest.raises(RuntimeError, match="boom"), atomic_dir(tmp_path / "b") as tmp:
        raise RuntimeError("boom")
    assert signal.getsignal(signal.SIGTERM) is before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    with pytest.raises(InvalidInputError, match="already exists; pass --overwrite"), atomic_dir(tmp_path / "a"):
        pass


# A command that works until the terminal it runs in is closed (an ssh session dropped).
HUNG_UP = """
import sys, time
import nsc_prune.cli.search as search

def run(args):
    print("ready", flush=True)
    time.sleep(30)

search.run = run
from nsc_prune.cli import main
sys.exit(main(["--model", "llama-7b", "--budget", "70%"]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX terminals")
@pytest.mark.parametrize("closed", [True, False], ids=["closed", "open"])
def test_a_closed_terminal_stops_a_command_with_exit_129(tmp_path, closed):
    """After a hang-up every write to the terminal fails: the stop's one line raised an OSError (exit 1). A SIGHUP
    sent while the terminal is still open (`kill -HUP`) says its line there."""
    import pty
    import time

    script = tmp_path / "hung_up.py"
    script.write_text(HUNG_UP)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    pid, terminal = pty.fork()
    if pid == 0:  # the child: a session of its own whose controlling terminal is the pty
        as_in_a_terminal()  # pytest may run under nohup
        os.execve(sys.executable, [sys.executable, str(script)], env)
    seen = b""
    while b"ready" not in seen:
        seen += os.read(terminal, 1024)
    if closed:
        os.close(terminal)  # the terminal hangs up: SIGHUP to its session
    else:
        os.kill(pid, signal.SIGHUP)
        with contextlib.suppress(OSError):  # EIO once the child is gone
            while chunk := os.read(terminal, 1024):
                seen += chunk
        os.close(terminal)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 128 + signal.SIGHUP
    assert closed or b"nsc-prune: stopped by SIGHUP; nothing was written" in seen, seen


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_sighup_the_process_ignores_stays_ignored():
    """Under ``nohup`` SIGHUP is ignored from the start: a closed terminal must not stop the command then. A SIGTERM
    a wrapper ignored (`trap '' TERM`) is still a preemption: the command stops at it."""
    before = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGHUP, signal.SIGTERM)}
    try:
        with sigterm_exits():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
        assert signal.getsignal(signal.SIGHUP) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize(("world", "handled"), [("1", True), ("2", False)])
def test_a_command_handles_sigterm_unless_it_is_one_of_several_launched_ranks(monkeypatch, world, handled):
    """A rank waiting in a collective would run a Python handler only when the wait returns: the launcher's SIGTERM
    to the ranks of a failed run would then wait for its SIGKILL."""
    from nsc_prune.cli import _launch_checked_sigterm
    from tests.conftest import as_launched_rank

    as_launched_rank(monkeypatch, 0, int(world))
    before = signal.getsignal(signal.SIGTERM)
    with _launch_checked_sigterm():
        assert (signal.getsignal(signal.SIGTERM) is not before) is handled
    assert signal.getsignal(signal.SIGTERM) is before


def test_provenance_records_the_cli_command_line():
    command = shlex.join(["nsc-prune", "extract", "--out", "my ckpt/"])
    assert provenance()["command"] == command_line()
    with recorded_command(command):
        assert provenance()["command"] == "nsc-prune extract --out 'my ckpt/'"
    assert provenance()["command"] != command  # back to sys.argv outside the block


def test_provenance_time_is_utc_whatever_the_machines_zone(monkeypatch):
    import datetime as dt
    import time

    monkeypatch.setenv("TZ", "IST-05:30")  # POSIX form: no zone database needed; a local time would show +05:30
    time.tzset()
    try:
        assert time.localtime().tm_gmtoff == 5.5 * 3600
        said = dt.datetime.fromisoformat(provenance()["time_utc"])
    finally:
        monkeypatch.undo()
        time.tzset()
    assert said.utcoffset() == dt.timedelta(0)
    assert abs(said - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(minutes=1)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_where_a_folder_output_goes_is_named_as_such(tmp_path, overwrite):
    """A folder output (eval --out, extract --out, ...) that is an existing file: the one line says so, with or
    without --overwrite (before, it suggested --overwrite, which was then refused), and the file is kept."""
    from nsc_prune._io import check_output

    out = tmp_path / "results.txt"
    out.write_text("mine")
    with pytest.raises(InvalidInputError, match="--out .*results.txt is a file where a folder is written"):
        check_output(out, overwrite=overwrite)
    assert out.read_text() == "mine"


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_output_is_a_regular_file_path_below_folders(tmp_path, overwrite):
    """A file output (rank --out, profile --out) that is a pipe or device is refused even with --overwrite (which
    replaced /dev/null by a file, as root); so are a path ending in '/', below a file, or empty: each would have
    been found only when written, after the slow work, or written somewhere else."""
    from nsc_prune._io import check_output

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    (tmp_path / "a_file").write_text("mine")
    refused = {
        str(pipe): "is not a regular file",
        os.devnull: "is not a regular file",
        f"{tmp_path / 'new'}/": "ends in '/', which names a folder; drop the '/'",
        str(tmp_path / "a_file" / "x.json"): "a_file is a file where a folder is needed",
        "": "--out must name a file; got ''",
    }
    for out, message in refused.items():
        with pytest.raises(InvalidInputError, match=message):
            check_output(out, overwrite=overwrite, marker=None)
    assert pipe.exists() and not pipe.is_file() and not (tmp_path / "new").exists()
    check_output(tmp_path / "new" / "x.json", overwrite=overwrite, marker=None)  # a new file in a new folder


def test_an_unwritable_output_is_named_not_its_hidden_temporary(tmp_path):
    from nsc_prune._io import atomic_write_text

    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):  # root writes anyway: a folder that cannot hold files instead
            if not Path("/proc").is_dir():
                pytest.skip("root on a system without /proc: no folder refuses a file")
            folder = Path("/proc")
        with pytest.raises(OSError) as caught:
            atomic_write_text(folder / "x.json", "{}")
        assert caught.value.filename == str(folder / "x.json")
    finally:
        (tmp_path / "ro").chmod(0o700)


def test_a_signal_during_the_swap_of_a_replaced_folder_waits_for_it(tmp_path, monkeypatch, signals_as_in_a_terminal):
    """Ctrl-C between the two renames that replace a folder left neither output in place (the old one hidden as
    .NAME.old-PID): the signals are held off while the renames run and delivered after them (ignoring them lost a
    scheduler's one SIGTERM to a command that went on working after a publish), and the new output remains."""
    target = tmp_path / "out"
    target.mkdir()
    (target / "f").write_text("old")
    renames = []
    real = os.replace

    def replace(src, dst):
        signal.raise_signal(signal.SIGINT)  # held while the renames run: no KeyboardInterrupt yet
        renames.append(Path(dst).name)
        real(src, dst)

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt), atomic_dir(target, overwrite=True) as tmp:
        (tmp / "f").write_text("new")
    assert len(renames) == 2 and signal.getsignal(signal.SIGINT) is before  # both renames ran, then the Ctrl-C
    assert (target / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    monkeypatch.undo()
    got = []
    with signals_held_as(signal.SIGTERM, got.append):  # a caller's own handler gets it after the publish
        publish_text(tmp_path / "file.json", "{}")
    assert got == [signal.SIGTERM] and (tmp_path / "file.json").read_text() == "{}"


@contextlib.contextmanager
def signals_held_as(signum, record):
    """``record`` as the handler of ``signum`` for the block, and a ``signum`` raised at the file publish's rename."""
    real = os.replace

    def replace(src, dst):
        signal.raise_signal(signum)
        real(src, dst)

    before = signal.signal(signum, lambda s, frame: record(s))
    os.replace = replace
    try:
        yield
    finally:
        os.replace = real
        signal.signal(signum, before)


def test_a_folder_that_cannot_be_moved_aside_leaves_no_old_folder(tmp_path, monkeypatch):
    """A busy or immutable output folder failed the publish's first rename, and the empty .NAME.*.old made for it
    stayed (the next run called it a killed run's leftover)."""
    import errno

    target = tmp_path / "out"
    target.mkdir()
    (target / "f").write_text("old")
    real = os.replace

    def replace(src, dst):
        if Path(src) == target:
            raise OSError(errno.EBUSY, "Device or resource busy", str(src), None, str(dst))  # as the kernel's
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="busy") as caught, atomic_dir(target, overwrite=True) as tmp:
        (tmp / "f").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (target / "f").read_text() == "old"
    assert caught.value.filename == str(target) and caught.value.filename2 is None  # not the .old it removed


def test_a_work_folder_is_held_by_one_run_at_a_time(tmp_path, monkeypatch):
    from nsc_prune._io import claimed_work_dir

    with claimed_work_dir(tmp_path / "w"):
        with pytest.raises(InvalidInputError, match=r"the work folder \S+/w is in use by another nsc-prune run"):
            with claimed_work_dir(tmp_path / "w"):
                pass
        with claimed_work_dir(tmp_path / "other"):  # another folder is free
            pass
        monkeypatch.setenv("RANK", "1")  # a launched run's rank 0 holds it for the others
        with claimed_work_dir(tmp_path / "w"):
            pass
    monkeypatch.delenv("RANK")
    with claimed_work_dir(tmp_path / "w"):  # released
        pass
    assert list(tmp_path.iterdir()) == []  # nothing is put in the user's folders


def test_a_second_ctrl_c_does_not_stop_the_clean_up_of_an_interrupted_write(tmp_path, monkeypatch):
    """Ctrl-C twice left a half-removed .NAME.*.partial folder beside the output: only SIGTERM was ignored while the
    first one's clean-up ran."""
    from nsc_prune._io import atomic_files

    real = shutil.rmtree

    def rmtree(path, **kwargs):
        signal.raise_signal(signal.SIGINT)  # the second Ctrl-C, while the temporary folder is being removed
        real(path, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "out") as tmp:
        (tmp / "shard").write_text("x")
        raise KeyboardInterrupt
    real_unlink = os.unlink

    def unlink(path):
        signal.raise_signal(signal.SIGINT)
        real_unlink(path)

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(KeyboardInterrupt), atomic_files(tmp_path / "a.json", tmp_path / "b.json"):
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_write_removes_the_parent_folders_it_made(tmp_path):
    """A failure while writing `--out new1/new2/o` said nothing was written and left new1/new2/; a folder that was
    there, or one something else was put into meanwhile, stays."""
    from nsc_prune._io import atomic_files

    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "new1" / "new2" / "o"):
        raise RuntimeError("an overflow in float16")
    with pytest.raises(RuntimeError), atomic_files(tmp_path / "a" / "x.json", tmp_path / "b" / "c" / "y.json"):
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "kept" / "new" / "o"):
        (tmp_path / "kept" / "new" / "theirs").write_text("x")
        raise RuntimeError("boom")
    assert [p.name for p in (tmp_path / "kept" / "new").iterdir()] == ["theirs"]


def test_recorded_outputs_lists_what_was_published_not_what_failed(tmp_path):
    with recorded_outputs() as written:
        with atomic_file(tmp_path / "a.json") as tmp:
            tmp.write_text("{}")
        with pytest.raises(RuntimeError), atomic_dir(tmp_path / "b"):
            raise RuntimeError("boom")
        with atomic_dir(tmp_path / "c") as tmp:
            (tmp / "f").write_text("x")
    assert written == [tmp_path / "a.json", tmp_path / "c"]


def test_a_killed_runs_temporary_is_named_on_the_next_write_and_kept(tmp_path):
    left = tmp_path / ".ckpt.ab12cd34.partial"  # what SIGKILL leaves: nothing could remove it
    left.mkdir()
    (tmp_path / ".ckpt.v2.ab12cd34.partial").mkdir()  # another output's (ckpt.v2): not named
    with pytest.warns(
        UserWarning, match=r"holds 1 unfinished temporary of ckpt \(\.ckpt\.ab12cd34\.partial\): left by"
    ):
        with atomic_dir(tmp_path / "ckpt") as tmp:
            (tmp / "f").write_text("x")
    assert left.is_dir() and (tmp_path / "ckpt" / "f").is_file()  # another process may be writing it: kept


def test_the_output_a_killed_replace_moved_aside_is_named_as_such(tmp_path):
    """A SIGKILL between the two renames of a replace leaves the old output hidden and none in its place: it was
    called an unfinished temporary, to remove to free the space (the only copy)."""
    old = tmp_path / ".ckpt.ab12cd34.old"
    old.mkdir()
    (old / "model.safetensors").write_text("weights")
    with pytest.warns(UserWarning, match=r"\.ckpt\.ab12cd34\.old holds the earlier ckpt, moved aside by a run") as said:
        with atomic_dir(tmp_path / "ckpt") as tmp:
            (tmp / "f").write_text("x")
    assert (old / "model.safetensors").read_text() == "weights"
    assert not any("unfinished temporar" in str(w.message) for w in said)  # not also one to remove


def test_files_published_together_are_never_split_by_a_signal(tmp_path, monkeypatch, signals_as_in_a_terminal):
    from nsc_prune._io import atomic_files

    for name in ("pareto.json", "pareto.png"):
        (tmp_path / name).write_text("old")
    real = os.replace

    def replace(src, dst):
        signal.raise_signal(signal.SIGINT)  # between the two renames: held until both are done
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        with atomic_files(tmp_path / "pareto.json", tmp_path / "pareto.png", overwrite=True) as (json_tmp, png_tmp):
            json_tmp.write_text("new")
            png_tmp.write_text("new")
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"pareto.json": "new", "pareto.png": "new"}


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_that_changed_while_the_command_ran_is_kept_and_the_run_too(tmp_path, overwrite):
    """The existing output was checked when the command began only: a folder created meanwhile (no --overwrite), or a
    file put into the one being replaced (--overwrite), was deleted at the publish, and the run's output too."""
    out = tmp_path / "out"
    if overwrite:  # an earlier run's output, which --overwrite may replace as it was
        out.mkdir()
        record = {"files": ["nsc_prune_extract.json"], "provenance": {"nsc_prune_version": "0.1.0"}}
        (out / "nsc_prune_extract.json").write_text(json.dumps(record))

    def replaceable(found):
        check_output(found, (), True)

    with pytest.raises(InvalidInputError, match=r"nothing was replaced, and this run's output is in \S+out.kept-1"):
        with atomic_dir(out, overwrite, replaceable) as tmp:
            (tmp / "model.safetensors").write_text("new")
            out.mkdir(exist_ok=True)
            (out / "notes.txt").write_text("mine")  # put there while the command ran
    assert (out / "notes.txt").read_text() == "mine" and (tmp_path / "out.kept-1" / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_the_current_folder_can_be_the_output(tmp_path, monkeypatch):
    """--out . in an empty folder passed the check and failed at the publish, losing the output."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    with atomic_dir(".") as tmp:
        (tmp / "results.json").write_text("{}")
    assert (tmp_path / "here" / "results.json").read_text() == "{}"


def test_removing_a_work_folder_keeps_what_the_command_did_not_write(tmp_path):
    work = tmp_path / "work"
    (work / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (work / "notes.txt").write_text("mine")  # put there while the command ran
    remove_work_dir(work, ("checkpoints", "order.json"))
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]
    (work / "notes.txt").unlink()
    remove_work_dir(work, ("checkpoints",))
    assert not work.exists()


def test_replacing_a_folder_is_not_blocked_by_what_a_killed_run_left(tmp_path):
    """The old output was moved aside to .NAME.old-PID: one a killed run left (PIDs come back in containers) made
    the next --overwrite fail, and the new output was deleted."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("old")
    stale = tmp_path / f".out.old-{os.getpid()}"
    stale.mkdir()
    (stale / "a.txt").write_text("left")
    with atomic_dir(out, overwrite=True) as tmp:
        (tmp / "a.txt").write_text("new")
    assert (out / "a.txt").read_text() == "new" and (stale / "a.txt").read_text() == "left"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names an fsynced descriptor through /proc")
def test_a_published_folder_is_on_disk_before_its_rename(tmp_path, monkeypatch):
    """Every file of the finished folder, its folders, and then the folder the rename is in are fsynced, in that
    order: without it a power loss after the rename could leave a published checkpoint of truncated shards."""
    synced, renamed = [], []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(Path(os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (renamed.append(len(synced)), real_replace(a, b)))
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "a.bin").write_bytes(b"a")
        (tmp / "sub" / "b.bin").write_bytes(b"b")
    (rename,) = renamed
    assert [p.name for p in synced[:rename]] == ["a.bin", "b.bin", tmp.name, "sub"]  # files, then folders
    assert synced[rename:] == [tmp_path]  # then the rename itself


def test_an_output_that_goes_up_from_a_missing_folder_is_refused(tmp_path):
    """`--out new/..` passed every check (the path did not exist yet), then the write made new/ and found the path
    taken: refused after the work. Going up from a folder that exists is fine."""
    with pytest.raises(InvalidInputError, match=r"--out \S+new/\.\./out goes up from \S+new, which does not exist"):
        check_output(tmp_path / "new" / ".." / "out")
    (tmp_path / "there").mkdir()
    check_output(tmp_path / "there" / ".." / "out")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[" * 100_000, "nested too deeply"),  # a RecursionError traceback
        ('{"initializer_range": 1' + "0" * 400 + "}", "integer of 401 digits starting 100000000000 is past a float"),
        ('{"a": -1' + "0" * 400 + "}", "integer of 401 digits starting -10000000000 is past a float"),
        ('{"selected": 4, "x": {"y": 1, "y": 2}}', "the key 'y' appears more than once"),  # json kept the last
        ('{"a": [1, NaN]}', "NaN is not a JSON number"),
        ('{"rms_norm_eps": 1e400}', "the number 1e400 is past a float's range"),  # inf: extract's traceback at the end
    ],
    ids=["nested", "huge", "huge-negative", "twice", "nan", "huge-float"],
)
def test_json_no_later_step_can_use_is_refused_when_read(tmp_path, text, said):
    """Python's json reads both; the integer was an OverflowError wherever it met float() (an adapter's lora_alpha,
    a point's nsc, a latency table's seconds), the nesting a RecursionError."""
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(ConfigError, match=f"c.json is not valid JSON \\(.*{said}"):
        read_json_object(tmp_path / "c.json", unique_keys=True)  # a file nsc-prune writes (pareto.json)
    if said.startswith("the key"):  # another tool's file (config.json) is read as json and transformers read it
        assert read_json_object(tmp_path / "c.json") == {"selected": 4, "x": {"y": 2}}
    constant = "NaN" in said or "1e400" in said  # other tools' files may hold them where nothing reads
    with pytest.raises(InvalidInputError, match="unrecognised" if constant else f"c.json: .*{said}"):
        load_benchmark(tmp_path / "c.json")  # NaN in a benchmark is refused where it is a target, naming the row
    assert parse_json('{"a": 1' + "0" * 300 + ', "b": [[1]]}') == {"a": 10**300, "b": [[1]]}
    assert parse_json('{"a": NaN, "a": 2}', unique_keys=False, constants=True) == {"a": 2}  # other tools' files


def test_an_output_through_a_symlink_loop_is_refused(tmp_path):
    """The search and rank --out: a RuntimeError traceback from Path.resolve."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for out, marker in ((tmp_path / "a", RECORD_NAME), (tmp_path / "a" / "pareto.json", None)):
        with pytest.raises(InvalidInputError, match=f"--out {out} cannot be followed to a path"):
            check_output(out, marker=marker)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_output_that_is_a_symbolic_link_is_refused_before_the_work(tmp_path, overwrite):
    """The publish renames the finished folder over ``--out``: over a link to a folder that failed ("Is a
    directory") after the work, and left a hidden ``.link.*.old`` folder each time."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(InvalidInputError, match=r"--out \S+link is a symbolic link \(to \S+empty\); name the folder"):
        check_output(tmp_path / "link", overwrite=overwrite, marker=RECORD_NAME)


def test_a_folder_made_during_a_training_before_the_publish_keeps_the_output_beside_it(tmp_path):
    """heal, train-supernet and eval enter atomic_dir after their slow work (checked=True: the --out was checked
    before it): a folder made at --out meanwhile refused the output ("already exists; pass --overwrite", which would
    be refused too) instead of keeping it beside as OUT.kept-1."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # made while the command trained
    for overwrite in (False, True):
        with pytest.raises(InvalidInputError, match=r"nothing was replaced, and this run's output is in \S+out.kept-"):
            with atomic_dir(out, overwrite, lambda found: check_output(found, (), True), checked=True) as tmp:
                (tmp / "model.safetensors").write_text("new")
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.kept-1", "out.kept-2"]
    with pytest.raises(InvalidInputError, match="already exists; pass --overwrite"):  # unchecked: refused on entry
        with atomic_dir(out):
            pass


@pytest.mark.parametrize("where", ["write", "fsync"])
def test_a_full_disk_names_the_output_file(tmp_path, monkeypatch, where):
    """A full disk raises an OSError that names no file (write's ENOSPC, or fsync's): the CLI's line said "No space
    left on device" and not which output (a measured sensitivity table's, hours at 70B) was lost; nothing is left."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if where == "write":
        monkeypatch.setattr(Path, "write_text", full)
    else:
        monkeypatch.setattr(os, "fsync", full)
    table = tmp_path / "tables" / "t.json"
    with pytest.raises(OSError) as raised:
        publish_text(table, "table")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(table)
    assert not (tmp_path / "tables").exists()
    if where == "fsync":  # run records and caches; checkpoints, written by safetensors in the folder we sync
        record = tmp_path / "run.json"
        with pytest.raises(OSError) as raised:
            atomic_write_text(record, "{}")
        assert raised.value.filename == str(record) and list(tmp_path.iterdir()) == []
        with pytest.raises(OSError) as raised:
            with atomic_dir(tmp_path / "ckpt") as folder:
                (folder / "model.safetensors").write_bytes(b"weights")
        assert raised.value.filename == str(tmp_path / "ckpt") and list(tmp_path.iterdir()) == []
        with pytest.raises(OSError) as raised:  # a record written in the folder: named in it, not in the temporary
            with atomic_dir(tmp_path / "ckpt") as folder:
                atomic_write_text(folder / "config.json", "{}")
        assert raised.value.filename == str(tmp_path / "ckpt" / "config.json") and list(tmp_path.iterdir()) == []


def test_a_file_output_made_while_the_command_ran_is_kept_and_the_run_too(tmp_path):
    """profile's table, rank's report, the search's pareto.json and an explicit sensitivity table were checked only
    before the slow work and then written with overwrite: a file made there meanwhile was replaced."""
    table = tmp_path / "lut.json"
    table.write_text("mine")  # made after the command checked --out
    with pytest.raises(InvalidInputError, match=r"lut.json was created while this command ran; .* \S+lut.json.kept-1"):
        publish_text(table, "table", overwrite=False, checked=True)
    assert table.read_text() == "mine" and (tmp_path / "lut.json.kept-1").read_text() == "table"
    with pytest.raises(InvalidInputError, match="lut.json already exists; pass --overwrite"):  # unchecked: on entry
        publish_text(table, "table", overwrite=False)
    (tmp_path / "link.json").symlink_to(tmp_path / "nothing-yet.json")  # a link to no file is there too
    with pytest.raises(InvalidInputError, match="link.json already exists; pass --overwrite"):
        publish_text(tmp_path / "link.json", "table", overwrite=False)
    publish_text(table, "table")  # --overwrite: replaced
    assert table.read_text() == "table"
    pair = tmp_path / "pareto.json", tmp_path / "pareto.png"
    pair[1].write_text("mine")
    with pytest.raises(InvalidInputError, match=r"pareto.png was created while this command ran"):
        with atomic_files(*pair, checked=True) as (written, drawn):
            written.write_text("front")
            drawn.write_text("plot")
    assert not pair[0].exists() and pair[1].read_text() == "mine"  # both kept beside, neither published
    assert (tmp_path / "pareto.json.kept-1").read_text() == "front"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_numpy_numbers_the_checks_accept_are_written_as_json_numbers():
    """np.int64 passes every integer check (a budget, seq_len, --set value, lm-eval batch size from Python): the
    document was then unwritable, a TypeError after the search or the whole evaluation."""
    np = pytest.importorskip("numpy")
    from nsc_prune._io import to_json
    from nsc_prune.planning import search_plan

    assert json.loads(to_json({"a": np.int64(3), "b": np.float32(0.5), "c": [np.bool_(True)]})) == {
        "a": 3, "b": 0.5, "c": [True]
    }  # fmt: skip
    with pytest.raises(TypeError, match="ndarray is not JSON serializable"):
        to_json({"a": np.zeros(2)})  # an array is no number: not flattened silently
    document = search_plan("llama-7b", budget=np.int64(5_700_000_000), seq_len=np.int64(256)).document
    assert json.loads(document.to_json())["budget"]["requested"] == 5_700_000_000


def test_a_published_folder_has_the_permissions_of_plain_files(tmp_path):
    """transformers 5's save_pretrained writes model.safetensors through a private temporary (0600): models --prepare
    and train-supernet published it unreadable to the group beside a 0644 config.json."""
    old_umask = os.umask(0o022)  # under 077 the plain modes would equal the temporaries' 0700 / 0600
    try:
        _check_published_modes(tmp_path)
    finally:
        os.umask(old_umask)


def _check_published_modes(tmp_path):
    import stat

    from nsc_prune._io import default_file_mode

    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "sub").mkdir()
        for name in ("model.safetensors", "sub/w.safetensors"):
            (tmp / name).write_text("w")
            os.chmod(tmp / name, 0o600)
        (tmp / "script.sh").write_text("x")
        os.chmod(tmp / "script.sh", 0o700)  # a mode the command chose is kept
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert modes == {"model.safetensors": default_file_mode(), "w.safetensors": default_file_mode(), "script.sh": 0o700}
    from nsc_prune._io.atomic import default_dir_mode

    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == default_dir_mode()  # not the temporary folder's 0700
    atomic_write_text(tmp_path / "record.json", "{}")  # a file written alone (a run record): not its temporary's 0600
    assert stat.S_IMODE((tmp_path / "record.json").stat().st_mode) == default_file_mode()


def test_a_folder_replace_that_fails_puts_the_earlier_folder_back(tmp_path, monkeypatch):
    import nsc_prune._io.atomic as atomic

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("earlier")
    real = os.replace

    def flaky(source, target):
        if Path(source).name.endswith(".partial"):  # the new folder into place, after the earlier one moved aside
            raise OSError(16, "Device or resource busy")
        return real(source, target)

    monkeypatch.setattr(atomic.os, "replace", flaky)
    with pytest.raises(OSError, match="busy"):
        with atomic_dir(tmp_path / "out", overwrite=True) as tmp:
            (tmp / "x").write_text("new")
    monkeypatch.undo()
    assert (tmp_path / "out" / "x").read_text() == "earlier" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_link_to_nothing_where_a_folder_goes_is_refused_before_the_work(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(InvalidInputError, match="already exists"):
        with atomic_dir(tmp_path / "link") as tmp:
            raise AssertionError(f"the work began in {tmp}")


def test_json_outputs_are_written_with_sorted_keys():
    from nsc_prune._io.formats import to_json

    assert to_json({"b": 1, "a": {"d": 2, "c": 3}}).replace(" ", "").replace("\n", "") == '{"a":{"c":3,"d":2},"b":1}'


RACE = """
import multiprocessing as mp, sys
from pathlib import Path
from nsc_prune._io import atomic_dir, atomic_files

def one(kind, root, tag, overwrite, barrier, results):
    try:
        if kind == "folder":
            with atomic_dir(root / "out", overwrite=overwrite) as tmp:
                (tmp / "who").write_text(tag)
                barrier.wait()
        else:
            with atomic_files(root / "a.json", root / "a.png", overwrite=overwrite) as (json_tmp, png_tmp):
                json_tmp.write_text(tag)
                png_tmp.write_text(tag)
                barrier.wait()
        results.put("ok")
    except Exception as err:
        results.put(type(err).__name__ + ": " + str(err))

if __name__ == "__main__":
    kind, root, overwrite, trials = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
    for trial in range(trials):
        here = root / str(trial)
        here.mkdir()
        if overwrite:  # an earlier run's output, which both replace
            (here / "out").mkdir()
            for name in ("out/who",) if kind == "folder" else ("a.json", "a.png"):
                (here / name).write_text("old")
            if kind != "folder":
                (here / "out").rmdir()
        barrier, results = mp.Barrier(2), mp.Queue()
        runs = [mp.Process(target=one, args=(kind, here, tag, overwrite, barrier, results)) for tag in "AB"]
        [run.start() for run in runs]
        [run.join() for run in runs]
        print(trial, sorted(results.get() for _ in runs), flush=True)
"""


@pytest.mark.parametrize("kind", ["folder", "files"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_two_runs_publishing_one_output_at_once_never_lose_or_mix_it(tmp_path, kind, overwrite):
    """Without a lock, the second publish deleted the folder the first had just published (or leaked the replaced
    one as .out.*.old), and a pair of files could come from two runs."""
    script = tmp_path / "race.py"
    script.write_text(RACE)
    root = tmp_path / "runs"
    root.mkdir()
    trials = 12
    done = subprocess.run([sys.executable, str(script), kind, str(root), str(int(overwrite)), str(trials)],
                          capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    outcomes = [line.split(" ", 1)[1] for line in done.stdout.splitlines()]
    assert len(outcomes) == trials
    for trial in range(trials):
        here = root / str(trial)
        names = sorted(p.name for p in here.iterdir())
        if kind == "folder":
            winner = (here / "out" / "who").read_text()
            kept = [name for name in names if name.startswith("out.kept-")]
            assert set(names) == {"out", *kept} and winner in "AB"  # no hidden .out.*.old or .partial
            assert len(kept) == (0 if overwrite else 1)  # the other run's output: replaced, or kept beside
        else:
            assert (here / "a.json").read_text() == (here / "a.png").read_text()  # one run's pair, never a mix
            assert not [name for name in names if name.startswith(".")]
    assert all(o == "['ok', 'ok']" for o in outcomes) if overwrite else all("created while" in o for o in outcomes)


def test_publishing_waits_for_no_lock_the_user_holds_and_one_folder_is_locked_once(tmp_path):
    """The publish lock was a flock on the output's folder: a run under `flock DIR cmd` hung there after its work,
    and two targets naming one folder two ways (a link, '..') deadlocked on their own two locks."""
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    code = textwrap.dedent(f"""
        import fcntl, os
        from nsc_prune._io import atomic_dir, atomic_files
        held = os.open({str(tmp_path / "d")!r}, os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_EX)  # as `flock DIR nsc-prune ...` holds it
        with atomic_dir({str(tmp_path / "d" / "out")!r}) as tmp:
            (tmp / "w").write_text("x")
        with atomic_files({str(tmp_path / "d" / "a.json")!r}, {str(tmp_path / "link" / "b.json")!r}) as (a, b):
            a.write_text("1")
            b.write_text("2")
        print("published")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "published", done.stderr
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["a.json", "b.json", "out"]


def test_the_lock_folder_is_used_only_when_it_is_ours_alone(tmp_path, monkeypatch):
    """Another user could make the predictable lock folder first in a shared temporary folder, then hold a lock for
    ever or plant a link where a lock file goes; with no usable temporary folder the publish itself failed."""
    import tempfile

    from nsc_prune._io.atomic import _lock_file

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    locks = tmp_path / f"nsc-prune-locks-{os.getuid()}"
    fd = _lock_file("/some/folder")
    assert fd is not None and oct(locks.stat().st_mode & 0o777) == "0o700"
    os.close(fd)
    name = sorted(locks.iterdir())[0].name
    (locks / name).unlink()
    (locks / name).symlink_to(tmp_path / "planted")
    assert _lock_file("/some/folder") is None and not (tmp_path / "planted").exists()
    (locks / name).unlink()
    locks.chmod(0o777)  # writable by others: not ours alone
    assert _lock_file("/some/folder") is None

    def no_temporary_folder():
        raise FileNotFoundError("No usable temporary directory found")

    monkeypatch.setattr(tempfile, "gettempdir", no_temporary_folder)
    with atomic_dir(tmp_path / "out") as tmp:  # published, unlocked
        (tmp / "w").write_text("x")
    assert (tmp_path / "out" / "w").read_text() == "x"


def test_a_cache_that_cannot_be_written_is_named_before_the_work(tmp_path, monkeypatch):
    """A read-only cache folder failed only when the measured table was written, after the whole measurement (a
    7B model's hours); an entry already there is still read."""
    from nsc_prune._io import check_cache_path

    cache = tmp_path / "cache"
    (cache / "sensitivity").mkdir(parents=True)
    (cache / "sensitivity" / "kept.json").write_text("{}")
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: Path(path) != cache / "sensitivity" and real_access(path, mode)
    )
    check_cache_path(cache / "sensitivity" / "kept.json")  # to read: nothing is written
    with pytest.raises(InvalidInputError, match=r"the cache folder .*sensitivity cannot be written .*NSC_PRUNE_CACHE"):
        check_cache_path(cache / "sensitivity" / "new.json")


def test_the_cache_folder_expands_a_leading_tilde(monkeypatch, tmp_path):
    """NSC_PRUNE_CACHE='~/x' (quoted, so the shell left it) made a folder named '~' in the working directory."""
    from nsc_prune._files import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NSC_PRUNE_CACHE", "~/x")
    assert cache_dir("psi_w") == tmp_path / "x" / "psi_w"
    monkeypatch.setenv("NSC_PRUNE_CACHE", "")  # empty: as unset
    assert cache_dir() == tmp_path / ".cache" / "nsc-prune"
    monkeypatch.chdir(tmp_path)  # relative: the folder it names now (pareto.json recorded the table's path as given)
    monkeypatch.setenv("NSC_PRUNE_CACHE", "rel")
    assert cache_dir("sensitivity") == tmp_path / "rel" / "sensitivity"


@pytest.mark.parametrize("out", [".", "..", "here"])
def test_an_output_folder_that_is_or_holds_the_current_folder_is_refused(tmp_path, monkeypatch, out):
    """The output replaced the folder the process ran in: extract wrote its checkpoint, then failed reading its
    record by a relative path, exit 2, and the shell was left in a deleted folder."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    if out == "here":
        out = str(tmp_path / "here")
    with pytest.raises(InvalidInputError, match="is the folder this runs in, or holds it"):
        check_output(out, overwrite=True)
    check_output("elsewhere")  # a folder beside: as before
    check_output("pareto.json", marker=None)  # a file here: as before


def test_an_output_path_that_is_not_utf8_is_refused_before_the_work(tmp_path):
    """A Latin-1 name (legal on Linux, read by Python as surrogates) was a UnicodeEncodeError traceback, after the
    work where its folder existed; safetensors cannot open such a path either."""
    latin = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9"))
    with pytest.raises(InvalidInputError, match=r"the path holds bytes that are not UTF-8"):
        check_output(latin / "ck")
    with pytest.raises(InvalidInputError, match=r"the path holds bytes that are not UTF-8"):
        check_output(latin.with_name(latin.name + ".json"), marker=None)


def test_a_folder_lock_makes_another_process_wait_and_puts_nothing_beside_the_path(tmp_path):
    """The publish lock (``folder_locks``): held by one process, another waits for it; its lock file is in the
    user's lock folder, never beside the path."""
    from nsc_prune._io.atomic import folder_locks

    target = tmp_path / "cache" / "model"
    code = f"from nsc_prune._io.atomic import folder_locks\nwith folder_locks([{str(target)!r}]):\n    print('locked')"
    with folder_locks([target]):
        waiting = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            waiting.wait(timeout=5)  # it should still be waiting for the lock
        except subprocess.TimeoutExpired:
            pass
        assert waiting.returncode is None, "a second process took a lock that is held"
    assert waiting.communicate(timeout=60)[0].strip() == "locked"
    assert list(tmp_path.iterdir()) == []


def test_an_output_named_through_a_link_and_dot_dot_goes_where_the_file_system_puts_it(tmp_path):
    """``LINK/../out`` is the folder above the link's target, but ``tempfile`` read '..' as text: the temporary was made
    beside the link, and the rename failed after the work (extract), or crossed file systems (rank)."""
    (tmp_path / "far" / "deep" / "model").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "far" / "deep" / "model")
    with atomic_dir(tmp_path / "link" / ".." / "ckpt") as tmp:
        (tmp / "w").write_text("x")
    with atomic_files(tmp_path / "link" / ".." / "a.json", tmp_path / "link" / ".." / "new" / "b.json") as (a, b):
        a.write_text("1")
        b.write_text("2")
    atomic_write_text(tmp_path / "link" / ".." / "c.txt", "3")
    deep = tmp_path / "far" / "deep"
    assert sorted(p.name for p in deep.iterdir()) == ["a.json", "c.txt", "ckpt", "model", "new"]
    assert (deep / "ckpt" / "w").read_text() == "x" and (deep / "new" / "b.json").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["far", "link"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("callers", [signal.SIG_IGN, lambda signum, frame: None])
def test_a_write_keeps_the_sigterm_handler_a_caller_set(tmp_path, callers):
    """A program that embeds the library handles (or ignores) SIGTERM itself: an output written meanwhile must not
    turn the signal into SystemExit. One at its default is taken, so the write's temporary folder is cleaned up."""
    before = signal.signal(signal.SIGTERM, callers)
    try:
        with atomic_dir(tmp_path / "kept"):
            assert signal.getsignal(signal.SIGTERM) is callers
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with atomic_dir(tmp_path / "taken"):
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
        with atomic_files(tmp_path / "file"):
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "kept", "taken"]
