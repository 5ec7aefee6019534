"""One writer per folder: a kernel lock on <folder>/.mpippo.lock.

The trainer's rank 0 holds an exclusive `flock` on its run folder's lock file for as long as it
lives, and `suite run --local` one on its suite folder. The kernel releases a flock when the
process ends, however it ends (kill -9, a node's OOM killer), so a stale mark cannot exist and a
reused process id means nothing. The file's text names the holder (host, process id, command) for
the line that refuses a second writer. `holder()` asks without taking the lock for long: `status`
can say "running" for a member whose trainer holds it.

On a file system without locks (some parallel file systems mount without them) the lock cannot be
had: the run goes on with one warning, as it did before locks existed.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from mpippo.config import UsageError, show

LOCK_NAME = ".mpippo.lock"
_HELD: dict[str, tuple[int, bytes]] = {}  # lock file -> (its open descriptor, kept for the process's
# life; the file's text before this process wrote its own, put back by an early release)
_UNSUPPORTED = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
RETRY_S = 2.0  # a holder() probe holds a shared lock for microseconds: try again before refusing


class FolderBusy(UsageError):
    """Another process holds the folder's lock."""


def lock_path(folder: str | Path) -> Path:
    return Path(folder) / LOCK_NAME


def _describe(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text[:200] or "another process"


def acquire(folder: str | Path, what: str = "run folder", warn=None) -> bool:
    """Hold `folder`'s lock until this process ends (creating the lock file); True when held (or
    already held by this process), False when the file system has no locks (after one warning).
    FolderBusy, one line naming the holder, when another process holds it."""
    path = lock_path(folder)
    if str(path) in _HELD:
        return True
    deadline = time.monotonic() + RETRY_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            raise FolderBusy(f"{what} '{show(str(folder))[1:-1]}' is in use: {_describe(path)} holds its lock "
                             f"({LOCK_NAME}); one writer per folder: stop that one first, or choose another folder")
        except OSError as e:
            os.close(fd)
            if e.errno not in _UNSUPPORTED:
                raise
            (warn or _warn)(f"mpippo: warning: {what} '{folder}': this file system has no locks ({e.strerror}); "
                            f"nothing stops a second trainer from writing this folder")
            return False
        if _same_file(fd, path):  # not a file that a releasing holder unlinked while we waited
            break
        os.close(fd)
    me = f"process {os.getpid()} on {socket.gethostname()} ({' '.join(sys.argv)[:120]})"
    before = os.pread(fd, 4096, 0)
    _write(fd, me.encode(errors="replace") + b"\n")
    _HELD[str(path)] = (fd, before)
    return True


def _write(fd: int, data: bytes) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def release(folder: str | Path, remove: bool = False) -> None:
    """Let go of `folder`'s lock now (a job that ends at start-up): `remove` deletes the lock file
    (this job made it), else the file gets its earlier text back, so nothing in the folder changed."""
    path = lock_path(folder)
    held = _HELD.pop(str(path), None)
    if held is None:
        return
    fd, before = held
    if remove:
        path.unlink(missing_ok=True)
    else:
        _write(fd, before)
    os.close(fd)


def held_fd(folder: str | Path) -> int | None:
    """The descriptor of `folder`'s lock while this process holds it (None otherwise): a child
    that inherits it (Popen pass_fds) keeps the folder locked after this process is gone."""
    held = _HELD.get(str(lock_path(folder)))
    return held[0] if held else None


def holder(folder: str | Path) -> str | None:
    """Who holds `folder`'s lock ('process N on HOST (...)'), or None when nobody does (or the
    folder has no lock file). Takes a shared lock for an instant, never creates anything."""
    path = lock_path(folder)
    if str(path) in _HELD:
        return f"process {os.getpid()} (this one)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _describe(path)
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops the shared lock too
    return None


def _warn(line: str) -> None:
    sys.stderr.write(line + "\n")
