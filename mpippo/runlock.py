"""One writer per folder: kernel locks on the folder itself and on <folder>/.mpippo.lock.

The trainer's rank 0 holds an exclusive `flock` on its run folder (and on each agent's folder of a
multi-agent job) for as long as it lives, and `suite run --local` one on its suite folder. The
kernel releases a flock when the process ends, however it ends (kill -9, a node's OOM killer), so a
stale mark cannot exist and a reused process id means nothing.

Two locks, because each covers a hole in the other: the folder's own descriptor cannot be deleted
from under its holder (a lock file can: `rm .mpippo.lock` would let a second trainer in), and the
lock file works where a folder cannot be locked (NFS emulates flock with byte-range locks, which
need a descriptor open for writing) and carries the holder's name for the line refusing another.

The lock file is never trusted: it is opened without following a symlink and without blocking
(a FIFO), only when it is a regular file; its text is never rewritten in place, because it may be
a hard link to something else. A holder's text goes into a file of our own, made beside it and
renamed over it while the old one is locked; an early release renames the earlier text back.

On a file system without locks (some parallel file systems mount without them) the lock cannot be
had: the run goes on with one warning, as it did before locks existed.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import re
import socket
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mpippo.usage import UsageError, file_kind

LOCK_NAME = ".mpippo.lock"
_UNSUPPORTED = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF)
RETRY_S = 2.0  # a holder() probe holds a shared lock for microseconds: try again before refusing
SUITE_TAG = "[suite folder]"  # in a suite's lock text: its members' runs train inside that folder


class FolderBusy(UsageError):
    """Another process holds the folder's lock."""


class BadLockFile(UsageError):
    """<folder>/.mpippo.lock is not a regular file: never opened, read or written."""


@dataclass
class _Held:
    folder_fd: int | None  # the folder's own descriptor, locked (None where the file system refuses)
    file_fd: int | None    # the lock file's, locked (None without file locks)
    ino: tuple[int, int]   # (device, inode) of the lock file this process made
    before: tuple[bytes, int] | None  # text and mode of the lock file this one replaced (None: none)
    passed_on: bool = False  # a child this process starts on purpose holds it too (the suite's members)


_HELD: dict[str, _Held] = {}  # lock file -> what this process holds, kept for the process's life


def _drop_in_child() -> None:
    """A child forked without exec (a user's env worker under multiprocessing's fork) would share our
    locks and hold the folder after this process died; it lets go of its copies (closing a copy leaves
    the parent's lock whole). A suite's locks stay: its member's launcher is given them on purpose."""
    for path, held_ in list(_HELD.items()):
        if not held_.passed_on:
            del _HELD[path]
            _close_held(held_)


os.register_at_fork(after_in_child=_drop_in_child)


def lock_path(folder: str | Path) -> Path:
    return Path(folder) / LOCK_NAME


def _shown(path: Path) -> str:
    """A path whole (a user needs all of it to find the file), on one line."""
    return repr(str(path))[1:-1]


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    return None if stat.S_ISREG(mode) else file_kind(mode)


def _refuse_kind(path: Path, mode: int) -> None:
    if (kind := _kind(mode)) is not None:
        raise BadLockFile(f"lock file '{_shown(path)}' is {kind}, not mpippo's lock; mpippo keeps a folder's "
                          f"writer lock there and never opens anything else by that name: remove it, then try again")


def _open_existing(path: Path, flags: int) -> int | None:
    """The lock file opened without following a link or blocking, checked to be a regular file (the
    same one lstat saw); None when there is none. BadLockFile for anything else by that name."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    _refuse_kind(path, mode)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # replaced between lstat and open
            _refuse_kind(path, os.lstat(path).st_mode)
        raise
    try:
        _refuse_kind(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


MAX_TEXT = 1 << 16  # a holder's line is ~200 bytes; a larger file by that name is not ours


def _text(fd: int, limit: int = 4096) -> bytes:
    return os.pread(fd, limit, 0)


def _describe(path: Path) -> str:
    """The holder named in the lock file, read the safe way; 'another process' if it says nothing."""
    try:
        fd = _open_existing(path, os.O_RDONLY)
    except (OSError, UsageError):
        fd = None
    if fd is None:
        return "another process"
    try:
        text = _text(fd).decode(errors="replace").strip()
    finally:
        os.close(fd)
    return _shown(text[:240]) or "another process"  # on one line, whatever the file holds (a line break in argv)


def _busy(folder, what: str) -> FolderBusy:
    return FolderBusy(f"{what} '{_shown(Path(folder))}' is in use: {_describe(lock_path(folder))} holds its lock "
                      f"({LOCK_NAME}); one writer per folder: stop that one first, or choose another folder")


def _flock(fd: int, how: int) -> bool | None:
    """True when locked, False when another process holds it, None when this file system has no locks."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno not in _UNSUPPORTED:
            raise
        return None
    return True


def _lock_folder(folder: Path) -> tuple[int | None, bool]:
    """(the folder's descriptor, locked; None where folders cannot be locked, busy?)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    got = _flock(fd, fcntl.LOCK_EX)
    if got:
        return fd, False
    os.close(fd)
    return None, got is False


def acquire(folder: str | Path, what: str = "run folder", warn=None, tag: str = "", passed_on: bool = False) -> bool:
    """Hold `folder`'s locks until this process ends (creating the lock file); True when held (or
    already held by this process), False when the file system has no locks (after one warning).
    FolderBusy, one line naming the holder, when another process holds it; BadLockFile when the
    lock file is something else (a link, a FIFO, a folder). `tag` goes into the holder's line (SUITE_TAG);
    `passed_on`: children forked from this process keep the locks (else they let go at the fork)."""
    folder = Path(folder)
    if str(lock_path(folder)) in _HELD:
        return True
    deadline = time.monotonic() + RETRY_S
    while True:
        folder_fd, busy = _lock_folder(folder)
        if not busy:
            try:
                held = _lock_file(folder, folder_fd, _me(tag))
            except BaseException:
                _close(folder_fd)
                raise
            if held is not False:
                break
            _close(folder_fd)
        if time.monotonic() >= deadline:
            raise _busy(folder, what)
        time.sleep(0.05)
    if held is None:
        (warn or _warn)(f"mpippo: warning: {what} '{folder}': this file system has no locks; nothing stops a second "
                        f"trainer from writing this folder")
        return False
    held.passed_on = passed_on
    _HELD[str(lock_path(folder))] = held
    return True


def _lock_file(folder: Path, folder_fd: int | None, me: bytes) -> _Held | bool | None:
    """The lock file's half: our own file, locked, under the lock's name. False when another process
    holds it; None when there are no locks at all (neither the folder nor the file could be locked)."""
    path = lock_path(folder)
    old = _open_existing(path, os.O_RDWR)
    if old is None:  # none yet: make it (O_EXCL: never someone else's file, nor a link's target)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            return False  # made by another process this instant: look again
        got = _flock(fd, fcntl.LOCK_EX)
        if got is False or not _same_file(fd, path):
            os.close(fd)
            return False
        os.write(fd, me)
        _sweep(path)
        return _held_new(folder_fd, fd, got)
    got = _flock(old, fcntl.LOCK_EX)
    if got is False or (got and not _same_file(old, path)):  # busy, or replaced while we waited
        os.close(old)
        return False
    if got is None and folder_fd is None:
        os.close(old)
        return None
    st = os.fstat(old)
    if st.st_size > MAX_TEXT:
        os.close(old)
        raise BadLockFile(f"lock file '{_shown(path)}' holds {st.st_size:,} bytes, not mpippo's lock (one line naming "
                          f"its holder); mpippo never overwrites it: remove it, then try again")
    before = (_text(old, MAX_TEXT), stat.S_IMODE(st.st_mode))
    _sweep(path)
    fd = _replace(path, me, lock=got)  # while `old` is locked, nobody else replaces it
    os.close(old)
    return _Held(folder_fd, fd, _ident(os.fstat(fd)), before)


def _held_new(folder_fd: int | None, fd: int, got: bool | None) -> _Held | None:
    if got is None and folder_fd is None:
        os.close(fd)
        return None
    ident = _ident(os.fstat(fd))
    if got is None:
        os.close(fd)
        fd = None
    return _Held(folder_fd, fd, ident, None)


def _replace(path: Path, text: bytes, lock: bool | None, mode: int | None = None) -> int:
    """A new file of ours holding `text` (with `mode`, else as the umask says), locked when `lock`,
    renamed over `path`; its descriptor."""
    tmp = path.with_name(f"{LOCK_NAME}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, text)
        if mode is not None:
            os.fchmod(fd, mode)
        if lock:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd


def _sweep(path: Path) -> None:
    """Remove what a holder killed between making its file and renaming it left (a name of ours, made
    only under the lock that this process now holds: nobody else is making one)."""
    for stale in path.parent.glob(f"{LOCK_NAME}.*.tmp"):
        stale.unlink(missing_ok=True)  # (a link itself, never what it points to)


def _me(tag: str = "") -> bytes:
    argv = " ".join(sys.argv)[:120]
    return f"process {os.getpid()} on {socket.gethostname()} {tag + ' ' if tag else ''}({argv})\n".encode(errors="replace")


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _same_file(fd: int, path: Path) -> bool:
    try:
        return _ident(os.fstat(fd)) == _ident(os.lstat(path))
    except FileNotFoundError:
        return False


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _close_held(held: _Held) -> None:
    """Both descriptors of a lock this process no longer holds (one already closed is no matter)."""
    for fd in (held.file_fd, held.folder_fd):
        with contextlib.suppress(OSError):
            _close(fd)


def release(folder: str | Path) -> None:
    """Let go of `folder`'s lock now (a job that ends at start-up), leaving the folder as it was: a
    lock file this process made goes; one it replaced comes back with its earlier text. Neither is
    touched if the name no longer holds our file (someone removed or replaced it)."""
    path = lock_path(folder)
    held = _HELD.pop(str(path), None)
    if held is None:
        return
    try:
        if _ident_or_none(path) == held.ino:
            if held.before is None:
                path.unlink()
            else:
                _close(_replace(path, held.before[0], lock=False, mode=held.before[1]))
    except OSError:
        pass  # the folder went read-only or away: nothing of the user's is at stake
    finally:
        _close_held(held)


def held() -> set[str]:
    """The lock files this process holds now (for let_go: the Python API's call lets go of its own)."""
    return set(_HELD)


def let_go(lock_files: set[str]) -> None:
    """Stop holding these locks, leaving their files as they are (a run that ended: its holder's line stays,
    as at a process's exit); the kernel lets go with the descriptors."""
    for path in lock_files:
        if (held_ := _HELD.pop(path, None)) is not None:
            _close_held(held_)


def _ident_or_none(path: Path) -> tuple[int, int] | None:
    try:
        return _ident(os.lstat(path))
    except OSError:
        return None


def held_fds(folder: str | Path) -> tuple[int, ...]:
    """The descriptors of `folder`'s locks while this process holds them (none otherwise): a child
    that inherits them (Popen pass_fds) keeps the folder locked after this process is gone."""
    held = _HELD.get(str(lock_path(folder)))
    # (to pass them to a child, take the lock passed_on: the child's at-fork hook closes the others first)
    return tuple(fd for fd in (held.folder_fd, held.file_fd) if fd is not None) if held else ()


def holder(folder: str | Path) -> str | None:
    """Who holds `folder`'s lock ('process N on HOST (...)'), or None when nobody does (or there is
    no such folder). Takes shared locks for an instant, never creates anything, never blocks;
    BadLockFile when the lock file is not a regular file."""
    folder = Path(folder)
    path = lock_path(folder)
    if str(path) in _HELD:
        return f"process {os.getpid()} (this one)"
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if _flock(dfd, fcntl.LOCK_SH) is False:
            return _describe(path)
    finally:
        os.close(dfd)  # closing drops the shared lock too
    fd = _open_existing(path, os.O_RDONLY)  # a holder whose file system locks files, not folders
    if fd is None:
        return None
    try:
        if _flock(fd, fcntl.LOCK_SH) is False:
            return _describe(path)
    finally:
        os.close(fd)
    return None


def held_above(folder: str | Path) -> tuple[Path, str] | None:
    """The nearest folder above `folder` (links resolved) whose lock another process holds, and who:
    a run inside a live run's folder would write where that one writes. Not counted: a holder that is
    this process or one that started it, a suite's folder (SUITE_TAG: its members train inside it,
    whoever started them), a folder without a lock file, and one whose lock file is not ours to read.
    None when there is no such folder."""
    for above in Path(os.path.realpath(folder)).parents:
        try:
            if not os.path.lexists(lock_path(above)):
                continue
            who = holder(above)
        except (OSError, UsageError):
            continue  # not this run's folder: its own trainer says what is wrong with it
        if who and SUITE_TAG not in who and not _started_this(who):
            return above, who
    return None


def _started_this(who: str) -> bool:
    """Whether holder text `who` names this process or one of its ancestors on this host."""
    if who.endswith("(this one)"):
        return True
    found = re.match(r"process (\d+) on (\S+) ", who)
    if not found or found[2] != socket.gethostname():
        return False
    import psutil
    try:
        return int(found[1]) in {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    except psutil.Error:
        return False


def set_aside(folder: str | Path, what: str) -> Path | None:
    """A folder a run left with nothing to continue from, renamed to <name>.attempt-<time> beside it
    (kept, never deleted: a killed run's logs, or checkpoints whose latest was removed) so that the
    run can start afresh there. None when there is no folder or it holds only a lock file; FolderBusy
    when a live process holds its lock (it is being written: left as it is). The caller decides that
    nothing there is to be resumed."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink() or not any(p.name != LOCK_NAME for p in folder.iterdir()):
        return None
    who = holder(folder)
    if who:
        raise FolderBusy(f"{what} '{_shown(folder)}' is in use: {who} holds its lock; one writer per folder: "
                         f"it is left as it is")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = folder.with_name(f"{folder.name}.attempt-{stamp}")
    folder.rename(aside)
    return aside


def _warn(line: str) -> None:
    sys.stderr.write(line + "\n")
