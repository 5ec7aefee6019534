"""Failures that every rank detects together (after a collective decision).

They end the job cleanly on all ranks -- one message from rank 0, exit code 1 -- instead
of the abort path that a failure on a single rank needs.
"""
import contextlib
import errno
import os
import resource
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path


class JobFailure(RuntimeError):
    pass


class CheckpointError(JobFailure):
    """Rank 0 could not write a checkpoint (disk full, quota, permissions)."""


class NonFiniteError(JobFailure, FloatingPointError):
    """Too many consecutive steps with NaN/Inf loss or gradients on some rank."""


# what its line says to do: a finite but huge reward (1e20) overflows float32 in the value loss
DIVERGED = ("training diverged: lower training.learning_rate, or bring the env's rewards and observations into "
            "range (training.normalize_reward, training.normalize_obs)")


class ReplicaDivergence(JobFailure):
    """The ranks' parameters are no longer bit-identical."""


# ---- failures one rank finds alone, mid-run ----

class RankFailure(RuntimeError):
    """A failure one rank finds by itself, mid-run, said in one line instead of a traceback: the
    abort hook (comm.World.install_abort_hook) prints `mpippo: error: rank N: <text>` and ends the
    whole job with `exit_code`; only an abort reaches the other ranks, which may be waiting in a
    collective for this one."""
    exit_code = 1


class SecondInterrupt(KeyboardInterrupt):
    """A person's second Ctrl-C while the first stop is pending (preemption.SignalFlags): their "now"."""


_LAST_SAID = threading.Lock()
_WHO = [""]  # the job's rank, as this process's own lines name it ("rank 3: "; "" alone): set by mpippo.comm


def name_rank(who: str) -> None:
    """How this process's own lines name it in a job of several ranks (mpippo.comm's World knows)."""
    _WHO[0] = who


def who() -> str:
    """This process's name in a line of its own ("rank 3: "; "" alone): a warning each rank may print."""
    return _WHO[0]


def say(line: str) -> None:
    """A line on stderr that cannot fail the caller: the hang watch's thread must end the process
    even where stderr is closed (`2>&-`) or gone."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


# the reader left (a pipe's), the terminal hung up (a tty's EIO), a descriptor not open for writing (`1</dev/null`,
# `2</dev/null`: the trainer's first line had ended it with a traceback, its folder left unusable; a refusal exit 1)
GONE = frozenset({errno.EPIPE, errno.EIO, errno.EBADF})
FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})  # a console redirected to a full file system
_STDOUT_LOST: list[str] = []  # why a tool's stdout could not be written (FULL), once it failed: console_lost()


def console_lost(lost: str = "what it printed from there on is lost; the files it was asked to write are written"
                 ) -> str | None:
    """A tool's line for its stdout that a full file system refused (`evaluate ... > out.txt` on a full disk):
    its output is dropped from there and its work goes on, so the files it was asked for are still written
    (they had been lost with the console); it then ends with this line, exit 1. None where nothing was lost."""
    return f"its console (stdout) could not be written ({_STDOUT_LOST[0]}): {lost}" if _STDOUT_LOST else None


class ConsoleHeld(Exception):
    """A stop's handler raises it into a console write held CONSOLE_HELD_S or more (a pipe whose reader
    stopped reading, `run_mpi.py | less` not scrolled; a terminal paused with Ctrl-S): the write is given up
    and the console dropped, so the stop reaches its checkpoint. The trainer had waited in the write for as
    long as the reader did, deaf to SIGTERM."""


CONSOLE_HELD_S = 2.0
_WRITING: list = [None]  # (thread, since) of the console write in progress: console_held()


def console_held() -> bool:
    """Whether this thread (a handler's: the main one) is in a console write held CONSOLE_HELD_S or more."""
    w = _WRITING[0]
    return w is not None and w[0] == threading.get_ident() and time.monotonic() - w[1] >= CONSOLE_HELD_S


class ReaderMayLeave:
    """A console stream whose reader may go away (`run_mpi.py | head -3`, `bench.py | head -3`, a closed
    terminal): the rest of its output is dropped and the work goes on (a BrokenPipeError had ended a one-rank run with
    a traceback and no checkpoint, and lost a tool's results, printed before they were written)."""

    def __init__(self, stream, progress_only: bool = False, name: str = "stdout"):
        self._stream, self._name = stream, name
        self._progress_only, self._warned = progress_only, False  # (see let_readers_leave)

    def write(self, text: str) -> int:
        _WRITING[0] = (threading.get_ident(), time.monotonic())
        try:
            return self._stream.write(text)
        except ConsoleHeld:
            self._held()
            return len(text)
        except OSError as e:
            self._lost(e)
            return len(text)
        finally:
            _WRITING[0] = None

    def flush(self) -> None:
        _WRITING[0] = (threading.get_ident(), time.monotonic())
        try:
            self._stream.flush()
        except ConsoleHeld:
            self._held()
        except OSError as e:
            self._lost(e)
        finally:
            _WRITING[0] = None

    def _held(self) -> None:
        """A console nobody takes output from: dropped, and stdout and stderr with it where both are that one
        (a terminal paused with Ctrl-S holds both: the next line would wait there again)."""
        try:
            mine = os.fstat(self._stream.fileno())
        except (OSError, ValueError):
            return
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino, st.st_rdev) == (mine.st_dev, mine.st_ino, mine.st_rdev):
                    _to_null(fd)

    def _lost(self, e: OSError) -> None:
        if e.errno in FULL:
            self._drop()
            if self._name == "stdout" and not _STDOUT_LOST:  # (a tool says it at its end: console_lost)
                _STDOUT_LOST.append(e.strerror or str(e))
            if not self._progress_only:  # a tool's; a full stderr says nothing
                return
            if self._warned:  # (once: the warning itself may meet the same full stream)
                return
            self._warned = True
            say(f"mpippo: warning: {who()}the console's output cannot be written ({e.strerror}): "
                f"dropped from here on (a run goes on: its outputs are in its folder)")
            return
        if e.errno not in GONE:
            raise e
        self._drop()

    def _drop(self) -> None:  # the descriptor itself to /dev/null: the stream's buffer and children's output too
        try:
            _to_null(self._stream.fileno())
        except (OSError, ValueError):  # (a stream without a descriptor: its writes keep failing, caught above)
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _to_null(fd: int) -> None:
    """Descriptor `fd` writes to /dev/null from now on."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def let_readers_leave(progress_only: bool = False) -> tuple:
    """stdout and stderr as ReaderMayLeave (once). One the process started without (`>&-`: Python's
    None, whose flush() raised after a whole run, and a refusal on a closed stderr exited 1, not 2)
    writes to /dev/null, as its descriptor does. What their encoding cannot hold is written as its
    escape (PYTHONIOENCODING=ascii, or a C locale without UTF-8, and a run folder named 'résumé': the
    start-up line's UnicodeEncodeError had ended the run; a folder's undecodable byte in a tool's table).
    progress_only (the trainer's: its console is progress, its outputs are files): a console on a full
    file system (`> log` on a full disk) is dropped with a warning and the run goes on; it had ended
    the run at its first line, before any checkpoint, its folder made. A tool's console is its product:
    dropped too, so that its files are still written, and said at its end (console_lost), exit 1.
    Returns the streams it found, for an in-process caller's to be put back."""
    for fd in (0, 1, 2):  # first, before any file is opened: one would take the closed descriptor (the signal
        try:              # log's pipe became fd 2 and read the run's stderr as signals)
            os.fstat(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.open(os.devnull, os.O_RDWR)  # (the lowest free descriptor: this one; children get it too)
    found = (sys.stdout, sys.stderr)
    for name, fd, stream in zip(("stdout", "stderr"), (1, 2), found):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
        if stream is None:
            try:
                stream = open(fd, "w", errors="backslashreplace", closefd=False)
            except OSError:
                continue
        if not isinstance(stream, ReaderMayLeave):
            setattr(sys, name, ReaderMayLeave(stream, progress_only, name))
    return found


def say_last(line: str, final: bool = True) -> None:
    """The line a process ends with, once: its main thread and the hang watch (runctl.watch_alone,
    which ends a process whose main thread native code holds) may both reach it, and both then end
    the process alike. final=False (a tool's run, which an in-process caller may start again): said
    unless the watch has said its last line already."""
    if _LAST_SAID.acquire(blocking=False):
        say(line)
        if not final:
            _LAST_SAID.release()


def say_interrupted(who: str, how: str = "a second Ctrl-C") -> None:
    """A person's "now" (a trainer's rank, exit 130)."""
    say_last(f"mpippo: {who}stopped at once by {how}, without a checkpoint of this iteration "
             f"(--resume continues from the last checkpoint, if one was written)")


class EnvFailure(RankFailure):
    """A Gymnasium env (the user's code) raised, exited, or broke its declared contract mid-run: bad
    input found late, so exit 2, as when start-up finds the same env misbehaving."""
    exit_code = 2


def user_code_at(frames) -> str:
    """", at 'file':line in fn" for the innermost of `frames` (traceback.FrameSummary, outermost
    first) in the user's own code: outside Python's library, NumPy, Gymnasium, mpippo and its
    entry script (run_mpi.py); "" when none is (the env returned what Gymnasium could not
    take, or mpippo's own code is running)."""
    paths = sysconfig.get_paths()
    packages = tuple(p + os.sep for p in {paths["purelib"], paths["platlib"]})  # (under stdlib in a conda env)
    mods = [m for m in (sys.modules.get("numpy"), sys.modules.get("gymnasium"), sys.modules.get("mpippo"))
            if getattr(m, "__file__", None)]
    libs = tuple(str(Path(m.__file__).parent) + os.sep for m in mods)
    # mpippo's entry script lies outside the package (a user's own train.py is the user's code)
    entry = str(Path(mods[-1].__file__).parents[1] / "run_mpi.py") if mods and mods[-1].__name__ == "mpippo" else None

    def ours(name: str) -> bool:  # (a frame without a file, "<frozen runpy>" under `python -m` or "<string>"
        # under `python -c`, names no place to look: the innermost frame is named instead)
        return (name.startswith(libs) or name == entry or name.startswith("<")
                or (name.startswith(paths["stdlib"] + os.sep) and not name.startswith(packages)))
    own = [f for f in frames if not ours(f.filename)]
    return _at(own[-1]) if own else ""


_USERS_CODE = [0, 0.0]  # how deep the main thread is in the user's code now, and since when (time.monotonic)


class _UsersCode:
    """`with users_code():` marks the user's code running (an env's module imported, an env made, reset
    or closed, a game's move): where the one-rank start-up watch may end a start-up held after a stop, or
    held past its timeout (mpippo's own slow steps, a checkpoint read, W&B's start, are the main thread's
    to finish). A class, not a generator: a two-player game enters it at every move (a generator's
    context manager cost 1.5 us of a move's 30)."""

    def __call__(self) -> "_UsersCode":
        return self

    def __enter__(self) -> None:
        if _USERS_CODE[0] == 0:
            _USERS_CODE[1] = time.monotonic()
        _USERS_CODE[0] += 1

    def __exit__(self, *exc) -> bool:
        _USERS_CODE[0] -= 1
        return False


users_code = _UsersCode()


def in_users_code_since() -> float | None:
    """When the main thread entered the user's code (time.monotonic), or None where it is not in it."""
    return _USERS_CODE[1] if _USERS_CODE[0] > 0 else None


def code_at(frame) -> str:
    """Where a thread is, from its current frame (sys._current_frames()): in the user's code if it is
    in any, else its innermost frame ("" without one)."""
    frames = traceback.extract_stack(frame) if frame is not None else []
    return user_code_at(frames) or (_at(frames[-1]) if frames else "")


def main_thread_at() -> str:
    """Where the main thread is now (code_at), asked from another thread: a watch's, the watchdog's."""
    return code_at(sys._current_frames().get(threading.main_thread().ident))


def _at(f: traceback.FrameSummary) -> str:
    return f", at {f.filename!r}:{f.lineno} in {f.name}"


# The limits of this process (`ulimit`) that end a run with a failure that is no bug and no full disk:
# ulimit's flag: (RLIMIT name, words, its unit in bytes or items, the unit's name)
LIMITS = {"f": ("RLIMIT_FSIZE", "file-size limit", 1024, "KiB"), "n": ("RLIMIT_NOFILE", "open-file limit", 1, "files"),
          "u": ("RLIMIT_NPROC", "limit on this user's processes and threads", 1, ""),
          "v": ("RLIMIT_AS", "virtual-memory limit", 1024, "KiB")}
LIMITED = {errno.EFBIG: "f", errno.EMFILE: "n"}  # the OS errors one causes where the file system itself is fine


def limit_words(flag: str) -> str:
    """': this process's <limit> (ulimit -<flag>) is N <unit>' and what to do; '' where it has no such limit."""
    name, words, unit, unit_name = LIMITS[flag]
    soft, hard = resource.getrlimit(getattr(resource, name))
    if soft == resource.RLIM_INFINITY:
        return ""
    said = f": this process's {words} (ulimit -{flag}) is {soft // unit}{f' {unit_name}' if unit_name else ''}"
    if hard != resource.RLIM_INFINITY and hard <= soft:  # (bash's `ulimit -f N` sets both)
        return f"{said}, its hard limit too: run it from a shell without that limit"
    if hard == resource.RLIM_INFINITY:
        return f"{said}; raise it (ulimit -{flag} unlimited)"
    if unit > 1:  # (a number of blocks is the shell's own unit: 1 KiB in bash, 512 bytes in others)
        return f"{said}; raise it (up to its hard limit, {hard // unit} {unit_name})"
    return f"{said}; raise it (ulimit -{flag} {hard})"


def os_reason(e: OSError) -> str:
    """An OSError in words (its strerror), naming the limit behind it where the cause is one this process
    has (`ulimit -f`, `-n`): a checkpoint write that failed "File too large" had blamed nothing."""
    said = e.strerror or str(e)
    return said + limit_words(LIMITED[e.errno]) if e.errno in LIMITED else said


def limit_failure(exc: BaseException) -> str | None:
    """The line for an exception that a limit of this process explains (a thread that cannot start under
    `ulimit -u`, memory or a library that cannot be mapped under `ulimit -v`, a file under `-f`, `-n`), for
    the abort hook; None for any other (a traceback: maybe a bug)."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, OSError) and exc.errno in LIMITED and (said := limit_words(LIMITED[exc.errno])):
        return f"{f'{exc.filename!r}: ' if exc.filename else ''}{exc.strerror or exc}{said}"
    if isinstance(exc, RuntimeError) and "can't start new thread" in first:  # (root is above ulimit -u; a thread's
        said = (limit_words("u") if os.geteuid() else "") or limit_words("v")  # stack is virtual memory: -v too)
        return f"cannot start a thread{said or ' (the system is out of threads: a cgroup pids.max?)'}"
    memory = isinstance(exc, MemoryError) or (isinstance(exc, (ImportError, OSError, RuntimeError)) and any(
        w in first for w in ("failed to map", "Cannot allocate memory", "could not create a primitive")))
    if memory and (said := limit_words("v")):
        return f"out of memory ({type(exc).__name__}{f': {first[:200]}' if str(exc) else ''}){said}"
    return None


_RUN_FOLDER: list = []  # the run folder this process trains in, once known (cli), and its (device, inode)


def run_folder_is(path: Path) -> None:
    """On every rank; only rank 0 need see the folder (a node-local one): elsewhere its identity is None."""
    try:
        st = os.stat(path)
        ident = (st.st_dev, st.st_ino)
    except OSError:
        ident = None
    _RUN_FOLDER[:] = [Path(path).absolute(), ident]


def _run_folder_state() -> str | None:
    """'gone' when the run folder's path names nothing, 'replaced' when it names another folder (moved
    away, then a copy restored or a folder made at its path: the run must not write into that one, a second
    trainer's), else None (here, or not known)."""
    try:
        st = os.stat(_RUN_FOLDER[0])
    except FileNotFoundError:
        return "gone"
    except OSError:  # (no longer searchable: not known to be moved)
        return None
    return "replaced" if _RUN_FOLDER[1] not in (None, (st.st_dev, st.st_ino)) else None


def run_folder_gone(path: Path) -> bool:
    """Whether `path` lies in this process's run folder and that folder is gone or replaced (moved away
    while the run used it): a write there must not make it again, nor land in another run's copy
    (files.atomic_write_with)."""
    return bool(_RUN_FOLDER) and _RUN_FOLDER[0] in Path(path).absolute().parents and _run_folder_state() is not None


def folder_gone(exc: BaseException) -> str | None:
    """The line for a file of this process's run folder not found because the folder itself is gone (moved
    or deleted while the run used it: TensorBoard's writer thread had ended the job with a traceback per
    rank), or None: any other missing file keeps its own words."""
    if not _RUN_FOLDER or not isinstance(exc, FileNotFoundError) or \
            not isinstance(exc.filename, (str, bytes, os.PathLike)):
        return None
    run, path = _RUN_FOLDER[0], Path(os.fsdecode(exc.filename))
    try:
        if run not in path.absolute().parents:
            return None
    except OSError:  # (a working folder gone: not known to be moved)
        return None
    state = _run_folder_state()
    if state is None:
        return None  # (it is there: some other file is missing)
    how = "is gone: moved or deleted" if state == "gone" else "was replaced: moved away, and another folder put at its path,"
    return (f"the run folder '{run}' {how} while the run used it ({exc.strerror}: '{path}'); if it was moved, the "
            f"run goes on from its last checkpoint with --resume there")


FILE_SYSTEM_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})  # the disk's, not a bug


def file_system_failure(e: OSError) -> str:
    """The line for an OSError of FILE_SYSTEM_FULL met anywhere in a run (the abort hook's)."""
    verb = "reading or writing" if e.errno == errno.EIO else "writing"  # (EIO: either; the others: a write)
    what = f"{verb} {e.filename!r}" if e.filename else f"{verb} a file (or the console)"
    return (f"{what} failed ({os_reason(e)}); what was written before is kept: make room (or mend the file "
            f"system), then run it again (a run: --resume, from its last checkpoint)")
