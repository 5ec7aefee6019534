"""The run-folder lock (mpippo/runlock.py) against what a hostile or careless user leaves where the
lock file goes: links, FIFOs, folders, hard links, a deleted lock file; and many takers at once."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from conftest import ROOT
from mpippo import runlock


@pytest.fixture(autouse=True)
def _let_go():
    """Every lock a test takes in this process goes at its end (the kernel would at exit)."""
    yield
    for path in list(runlock._HELD):
        runlock.release(Path(path).parent)


def holder_process(folder: Path, then: str = "") -> subprocess.Popen:
    """Another process that takes `folder`'s lock, runs `then`, says 'held' and waits."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from mpippo import runlock
        runlock.acquire(sys.argv[1])
        {then}
        print('held', flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_new_lock_names_its_holder_and_an_early_release_removes_it(tmp_path):
    assert runlock.acquire(tmp_path)
    text = (tmp_path / runlock.LOCK_NAME).read_text()
    assert text.startswith(f"process {os.getpid()} on ") and text.endswith("\n")
    assert runlock.acquire(tmp_path)  # held already: fine
    runlock.release(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_earlier_lock_file_gets_its_text_back_and_a_hard_link_is_never_written(tmp_path):
    """A lock file left by an earlier run may be a hard link to a file of the user's: taking the lock
    puts a file of our own under the name; the user's file keeps every byte, before and after."""
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's notes\n" * 1000)  # longer than the 4 KB the old lock put back
    mine.chmod(0o640)
    run = tmp_path / "run"
    run.mkdir()
    os.link(mine, run / runlock.LOCK_NAME)
    assert runlock.acquire(run)
    assert mine.read_text() == "the user's notes\n" * 1000
    assert (run / runlock.LOCK_NAME).read_text().startswith(f"process {os.getpid()}")
    runlock.release(run)
    assert mine.read_text() == "the user's notes\n" * 1000
    back = run / runlock.LOCK_NAME
    assert back.read_bytes() == mine.read_bytes() and back.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in run.iterdir()) == [runlock.LOCK_NAME]  # no file of ours left beside it


@pytest.mark.parametrize("kind", ["symlink-to-file", "symlink-to-checkpoint", "dangling-symlink", "fifo", "folder",
                                  "socket"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused_and_left_alone(tmp_path, kind):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt, mine = run / "checkpoints" / "latest.pt", tmp_path / "mine.txt"
    ckpt.write_bytes(b"weights" * 100)
    mine.write_text("keep me")
    lock = run / runlock.LOCK_NAME
    words = {"fifo": "a FIFO", "folder": "a folder", "socket": "a socket"}.get(kind, "a symbolic link")
    if kind == "symlink-to-file":
        lock.symlink_to(mine)
    elif kind == "symlink-to-checkpoint":
        lock.symlink_to("checkpoints/latest.pt")
    elif kind == "dangling-symlink":
        lock.symlink_to(tmp_path / "created-by-whom.txt")
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "folder":
        (lock / "x").mkdir(parents=True)
    else:
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(lock))
        s.close()
    outcome = {}

    def attempt():  # in a thread: a FIFO opened to read would block forever
        for name, fn in (("acquire", lambda: runlock.acquire(run)), ("holder", lambda: runlock.holder(run))):
            try:
                outcome[name] = fn()
            except runlock.BadLockFile as e:
                outcome[name] = e.errors
    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "blocked on the lock file"
    for name in ("acquire", "holder"):
        assert outcome[name] == [f"lock file '{lock}' is {words}, not mpippo's lock; mpippo keeps a folder's writer "
                                 f"lock there and never opens anything else by that name: remove it, then try again"]
    assert ckpt.read_bytes() == b"weights" * 100 and mine.read_text() == "keep me"
    assert not (tmp_path / "created-by-whom.txt").exists() and not runlock._HELD
    assert os.path.lexists(lock)


def test_what_a_holder_killed_mid_replacement_left_is_swept_by_the_next(tmp_path):
    (tmp_path / runlock.LOCK_NAME).write_text("process 7 on elsewhere (killed)\n")
    (tmp_path / f"{runlock.LOCK_NAME}.{os.getpid()}.tmp").write_text("half made")  # even with our own pid
    assert runlock.acquire(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [runlock.LOCK_NAME]


def test_a_lock_file_too_large_to_be_ours_is_refused_untouched(tmp_path):
    (tmp_path / runlock.LOCK_NAME).write_bytes(b"x" * (runlock.MAX_TEXT + 1))
    with pytest.raises(runlock.BadLockFile, match="holds 65,537 bytes, not mpippo's lock"):
        runlock.acquire(tmp_path)
    assert (tmp_path / runlock.LOCK_NAME).read_bytes() == b"x" * (runlock.MAX_TEXT + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [runlock.LOCK_NAME]


def test_a_second_writer_is_refused_while_the_first_lives_and_welcome_after(tmp_path):
    proc = holder_process(tmp_path)
    try:
        assert runlock.holder(tmp_path).startswith(f"process {proc.pid} on ")
        with pytest.raises(runlock.FolderBusy, match=f"is in use: process {proc.pid} on .* holds its lock"):
            runlock.acquire(tmp_path, "--output-dir")
    finally:
        proc.kill()
        proc.wait()
    assert runlock.holder(tmp_path) is None  # killed: the kernel let go
    assert runlock.acquire(tmp_path)


def test_deleting_the_lock_file_lets_no_second_writer_in(tmp_path):
    """The folder itself is locked too: a removed (or replaced) lock file changes nothing."""
    proc = holder_process(tmp_path, then="os.unlink(os.path.join(sys.argv[1], runlock.LOCK_NAME))")
    try:
        assert not (tmp_path / runlock.LOCK_NAME).exists()
        assert runlock.holder(tmp_path) == "another process"  # its name went with the file
        with pytest.raises(runlock.FolderBusy, match="is in use: another process holds its lock"):
            runlock.acquire(tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert runlock.acquire(tmp_path)


def test_a_child_forked_without_exec_does_not_keep_the_folder_after_its_parent_died(tmp_path):
    """A user's env worker under multiprocessing's fork shares the holder's descriptors: it lets go of
    them at the fork, so the folder is free once the holder is gone, though the worker lives on."""
    proc = holder_process(tmp_path, then="child = os.fork(); child == 0 and (time.sleep(60), os._exit(0)); "
                                         "open(sys.argv[1] + '/worker', 'w').write(str(child))")
    worker = int((tmp_path / "worker").read_text())
    try:
        proc.kill()
        proc.wait()
        os.kill(worker, 0)  # the worker outlived its parent
        assert runlock.holder(tmp_path) is None
        assert runlock.acquire(tmp_path)
    finally:
        os.kill(worker, 9)


def test_a_suite_passes_its_lock_on_to_the_children_it_forks(tmp_path):
    """The suite hands its lock to each member's launcher on purpose (Popen pass_fds): kept."""
    assert runlock.acquire(tmp_path, passed_on=True)
    child = os.fork()
    if child == 0:
        os._exit(0 if runlock.held_fds(tmp_path) else 1)
    assert os.waitpid(child, 0)[1] == 0


def test_where_folders_cannot_be_locked_the_lock_file_still_is(tmp_path, monkeypatch):
    """NFS emulates flock with byte-range locks, which a folder's read-only descriptor cannot take:
    the lock file alone then keeps a second writer out."""
    proc = holder_process(tmp_path)
    monkeypatch.setattr(runlock, "_lock_folder", lambda folder: (None, False))
    try:
        with pytest.raises(runlock.FolderBusy, match=f"process {proc.pid}"):
            runlock.acquire(tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert runlock.acquire(tmp_path) and runlock.held_fds(tmp_path)


def test_without_any_locks_the_run_goes_on_after_one_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "_lock_folder", lambda folder: (None, False))
    monkeypatch.setattr(runlock, "_flock", lambda fd, how: None)
    said = []
    assert runlock.acquire(tmp_path, "--output-dir", warn=said.append) is False
    assert len(said) == 1 and "this file system has no locks" in said[0]


def test_of_many_takers_at_once_exactly_one_holds_the_folder(tmp_path):
    code = textwrap.dedent("""
        import sys, time
        from mpippo import runlock
        time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
        try:
            runlock.acquire(sys.argv[1])
        except runlock.FolderBusy:
            print('busy', flush=True)
            sys.exit(0)
        print('held', flush=True)
        time.sleep(5)
    """)
    import time
    for round_ in range(3):
        folder = tmp_path / f"r{round_}"
        folder.mkdir()
        if round_ == 1:  # an earlier run's lock file: the replacing path
            (folder / runlock.LOCK_NAME).write_text("process 1 on elsewhere (an earlier run)\n")
        at = time.time() + 1.5
        procs = [subprocess.Popen([sys.executable, "-c", code, str(folder), str(at)], cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True) for _ in range(6)]
        said = [p.stdout.readline().strip() for p in procs]
        for p in procs:
            p.kill()
            p.wait()
        assert sorted(said) == ["busy"] * 5 + ["held"], said
        assert sorted(p.name for p in folder.iterdir()) == [runlock.LOCK_NAME]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_atomic_writes_and_lock_files_follow_the_umask(tmp_path, umask):
    """Run outputs get the mode any file of this user gets (the tools', the lock's and the
    trainer's alike), not the 0600 of the temporary file they are written through."""
    from mpippo.files import atomic_write_bytes, file_mode
    before = os.umask(umask)
    try:
        assert file_mode() == 0o666 & ~umask
        atomic_write_bytes(tmp_path / "config.yaml", b"x: 1\n")
        atomic_write_bytes(tmp_path / "config.yaml", b"x: 2\n")  # a rewrite too
        assert runlock.acquire(tmp_path)
    finally:
        os.umask(before)
    for name in ("config.yaml", runlock.LOCK_NAME):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_a_folder_above_held_by_another_process_is_found_unless_it_started_this_one(tmp_path, monkeypatch):
    """held_above: a run inside another live run's folder is found (through a link too); a holder
    that started the asking process (a local suite and its members), this process (however it named
    the folder) and a suite's folder (its lock says so) are not; a lock file that is not ours to read
    is passed over, never opened."""
    outer = tmp_path / "outer"
    (outer / "a").mkdir(parents=True)
    other = holder_process(outer)
    try:
        above, who = runlock.held_above(outer / "a" / "b")
        assert above == outer.resolve() and who.startswith(f"process {other.pid} on ")
        (tmp_path / "link").symlink_to(outer / "a")
        assert runlock.held_above(tmp_path / "link" / "c")[0] == outer.resolve()
        assert runlock.held_above(outer) is None  # the folder itself is its own lock's business
    finally:
        other.kill()
        other.wait()
    assert runlock.held_above(outer / "a") is None  # the holder is gone
    suite = holder_process(outer, then="runlock.release(sys.argv[1]); runlock.acquire(sys.argv[1], tag=runlock.SUITE_TAG)")
    try:
        assert runlock.SUITE_TAG in runlock.holder(outer) and runlock.held_above(outer / "a") is None
    finally:
        suite.kill()
        suite.wait()
    monkeypatch.chdir(tmp_path)
    runlock.acquire("outer")  # this process holds it, by a relative name: it and a child it starts may work inside
    code = "import sys; from mpippo import runlock; print(runlock.held_above(sys.argv[1]))"
    child = subprocess.run([sys.executable, "-c", code, str(outer / "a")], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert child.stdout.strip() == "None", child.stderr
    assert runlock.held_above(outer / "a") is None
    runlock.release("outer")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / runlock.LOCK_NAME)
    assert runlock.held_above(tmp_path / "fifo" / "x") is None  # never opened, no hang


def test_the_holders_line_is_one_line_whatever_its_command_line_holds(tmp_path):
    """A line break in a holder's command line (a --set value) is written \\n: every message that names
    the holder stays one line."""
    code = "import sys, time; from mpippo import runlock; runlock.acquire(sys.argv[1]); print('held', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), "x\ny"], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        who = runlock.holder(tmp_path)
        assert "\n" not in who and "x\\ny" in who, who
        with pytest.raises(runlock.FolderBusy) as e:
            runlock.acquire(tmp_path)
        assert len(str(e.value.errors[0]).splitlines()) == 1
    finally:
        proc.kill()
        proc.wait()
