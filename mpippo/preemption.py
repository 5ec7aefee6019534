"""Signals only set flags; the ranks act on them together at the next iteration boundary.

SIGUSR1        -> checkpoint, exit EXIT_REQUEUE (3): "stopped early, requeue me" (Slurm --signal).
SIGTERM/SIGINT -> checkpoint, exit EXIT_STOPPED (4): stopped on request, resumable with --resume.
SIGHUP, SIGXCPU -> the same (a closed terminal; a soft CPU-time limit's warning, `ulimit -S -t` or a
                  batch system's, before the hard limit's SIGKILL), unless the process started with them ignored.
SIGUSR2        -> the same as SIGTERM; `python -m mpippo.launch` relays SIGTERM/SIGINT as SIGUSR2,
                  because mpirun kills the ranks right after forwarding a SIGTERM.
A second SIGINT while the first is pending raises KeyboardInterrupt (the job then aborts with one
line, exit 130, comm.World.install_abort_hook; a one-rank run whose main thread native code holds
is ended so by its hang watch, which reads the signals from `SignalLog`); any
number of SIGUSR1/SIGUSR2/SIGTERM keep the first stop's outcome, up to the process's last
instant (`settle`).
Whichever rank or ranks got the signal, the flags are combined with one Allreduce(MAX), so
a signal delivered to mpirun (which forwards it) or to a single rank works the same.

`install()` is the first statement of run_mpi.py, before any slow import: a signal that
arrives while torch and MPI load (seconds on a busy node) is only a flag too. Start-up
checks the flags at each of its agreement points; a signal there ends the job before any
training with exit 3 or 4 and nothing written (tested from the first instant).
"""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import stat
import threading
import time
from typing import Callable

from mpippo.errors import ConsoleHeld, SecondInterrupt, console_held

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_REQUEUE, EXIT_STOPPED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # a person's second Ctrl-C: a shell's code for a command Ctrl-C ended (128 + SIGINT)
# a watchdog's thread that wakes this much later than it asked was stopped (SIGSTOP, Slurm's suspend):
# the time since is no one's hang
PAUSE_S = 5.0


class PauseClock:
    """A watch thread's clock that knows when the process was last stopped and continued: `tick()`,
    once per wake-up of a thread that sleeps `every` seconds, returns now and moves `resumed` to now
    when the wake-up came more than PAUSE_S late. A wait is timed from max(its start, resumed)."""

    def __init__(self, every: float, clock=time.monotonic):
        self.every, self.clock = every, clock
        self.woke = self.resumed = clock()

    def tick(self) -> float:
        now = self.clock()
        if now - self.woke > self.every + PAUSE_S:  # stopped, then continued: none of that time was a wait's
            self.resumed = now
        self.woke = now
        return now


_FLAGS: "SignalFlags | None" = None
SETTLED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP, signal.SIGXCPU)


def settle() -> None:
    """The run's outcome is decided: further SIGUSR1/SIGUSR2/SIGTERM/SIGHUP/SIGXCPU are ignored from here to the
    process's end. Python's shutdown puts every signal it handled back to its default action (which
    kills) before MPI_Finalize runs, and that can wait for other ranks for a while; Slurm
    may send SIGUSR1 more than once, so a second one there would turn exit 3 into death by signal.
    Ignored signals stay ignored through the shutdown. SIGINT is left alone (a person's Ctrl-C)."""
    for sig in SETTLED:
        signal.signal(sig, signal.SIG_IGN)


LISTENING_ENV = "MPIPPO_LISTENING"  # a path the batch scripts give: created once every rank listens
_MARK: tuple[int, int, int] | None = None  # rank 0's listening mark held open (descriptor, device, inode) for its status
_MARK_LOCK = threading.Lock()  # (the main thread's end and a watchdog's abort may both say one)


def _forget_mark() -> None:  # in a forked child (a user's env's workers): the status to say is rank 0's own
    global _MARK
    _MARK = None


def announce_listening() -> None:
    """Every rank has installed its handlers (the caller knows: all have reached a collective):
    create the file named by $MPIPPO_LISTENING, if any. slurm/common.sh holds a signal that
    arrives before it exists, because a rank whose interpreter has not yet run its first line would
    die of it, and passes it on the moment it appears (no guessed delay, so a short run is still
    stopped by a signal in its first seconds). Made new or not at all (O_EXCL): whatever already
    stands at the path (a link to someone's file, a FIFO that would block the open) is never
    followed, opened or written; the script made the path free and only checks that it exists.
    It says "running" until announce_exit writes the status over it."""
    global _MARK
    path = os.environ.get(LISTENING_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError:  # the script then passes held signals on after its longest wait
        return
    try:
        os.write(fd, b"running\n")
    except OSError:  # (a full TMPDIR: an empty mark, and the script takes any status as the trainer's)
        pass
    st = os.fstat(fd)
    if _MARK is None:
        os.register_at_fork(after_in_child=_forget_mark)
    _MARK = (fd, st.st_dev, st.st_ino)


def announce_exit(code: int) -> None:
    """The process's exit status is decided (its last step, shutdown.end_process or an abort): written into
    rank 0's listening mark. slurm/common.sh requeues the job on status 3, which a rank ended by another's
    code also gives (a user's env calling os._exit(3): nothing in the process can catch it, and each
    requeued job would end so again); a mark still saying "running", or another status, tells it not to."""
    if _MARK is None:
        return
    fd, dev, ino = _MARK
    with _MARK_LOCK, contextlib.suppress(OSError):
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == (dev, ino):  # still the mark (not another file that took its number)
            line = f"exit {code}\n".encode()
            os.pwrite(fd, line, 0)
            os.ftruncate(fd, len(line))


def rank0_status(path: str | None) -> int | None:
    """The status rank 0 wrote into its listening mark at `path` ("exit N": announce_exit), or None (no mark,
    still "running", not a regular file: never followed or blocked on). slurm/common.sh's rank0_said alike."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        said = os.read(fd, 16).decode("ascii", "replace").split() if stat.S_ISREG(os.fstat(fd).st_mode) else []
    except OSError:
        said = []
    finally:
        os.close(fd)
    return int(said[1]) if len(said) == 2 and said[0] == "exit" and said[1].isdigit() else None


def install() -> "SignalFlags":
    """The process's flags, with the handlers installed on the first call (idempotent), so
    a signal received before the trainer exists is still seen by it."""
    global _FLAGS
    if _FLAGS is None:
        _FLAGS = SignalFlags().install()
        os.register_at_fork(after_in_child=_cpu_limit_ends_child)
    return _FLAGS


def _cpu_limit_ends_child() -> None:
    """A forked child (a user's env's worker) has no one to read its stop flag: its CPU-time limit ends it,
    as before the trainer caught SIGXCPU, and its parent sees a worker fail."""
    with contextlib.suppress(ValueError):  # (signal's own refusals: the child goes on as it would have)
        if signal.getsignal(signal.SIGXCPU) is not signal.SIG_IGN:
            signal.signal(signal.SIGXCPU, signal.SIG_DFL)


class SignalFlags:
    def __init__(self):
        self.requeue = False  # SIGUSR1
        self.stop = False     # SIGTERM / SIGINT / SIGUSR2 / SIGHUP / SIGXCPU
        # a hangup (the terminal closed, `kill -HUP`) stops as SIGTERM does, with a checkpoint (MPI_Init's own
        # handler had swallowed it, and before MPI it killed); unless the process started with it ignored (nohup).
        # So does a soft CPU-time limit's SIGXCPU (by default it killed the rank: no checkpoint, no line).
        self.stops = (*STOPS, *quiet_stops())

    def install(self) -> "SignalFlags":
        for sig, handler in self._handlers().items():
            signal.signal(sig, handler)
        return self

    def _handlers(self) -> dict:
        return {signal.SIGUSR1: self._on_usr1, **{sig: self._on_stop for sig in self.stops}}

    def reclaim(self) -> list[str]:
        """The handlers again, once the user's code has run (env.import's module, the envs' constructors
        and first reset): a library that set its own (SDL's for SIGINT and SIGTERM, a simulator's)
        would otherwise decide what a stop or a requeue does, and the run's last minutes would be lost.
        Returns what was undone, in words: the signals whose Python handler had been replaced (one a C
        library set is undone too, unseen), and those the code had blocked (pthread_sigmask: no handler
        would ever run); flags that were never installed (an API caller's own) install nothing."""
        if _FLAGS is not self:
            return []
        ours = self._handlers()
        replaced = [sig.name for sig, handler in ours.items() if signal.getsignal(sig) != handler]
        self.install()
        blocked = unblock(list(ours))
        return ([f"set its own handler for {', '.join(replaced)}"] if replaced else []) + \
            ([f"blocked {', '.join(blocked)}"] if blocked else [])

    def _on_usr1(self, signum, frame):
        self.requeue = True
        if console_held():  # (the main thread held in a console write nobody takes: it must reach the checkpoint)
            raise ConsoleHeld

    def _on_stop(self, signum, frame):
        if is_second_ctrl_c(signum, self.stop):
            raise SecondInterrupt  # impatient second Ctrl-C
        if console_held():  # (raised out of the write alone: ReaderMayLeave drops that console and goes on)
            self.stop = True
            raise ConsoleHeld
        first, self.stop = not self.stop, True
        if signum == signal.SIGXCPU and first:  # (no one sent it: the run's end line alone would puzzle)
            used = resource.getrusage(resource.RUSAGE_SELF)  # (the kernel moves the limit on: not its value now)
            line = (f"mpippo: SIGXCPU: this process used {used.ru_utime + used.ru_stime:.0f} s of CPU, its soft "
                    f"CPU-time limit (ulimit -S -t): it checkpoints and stops\n")
            with contextlib.suppress(OSError):  # (os.write: the signal may land inside a write to sys.stderr)
                os.write(2, line.encode())


STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)  # (SIGUSR1 is a requeue, no stop)
QUIET_STOPS = (signal.SIGHUP, signal.SIGXCPU)  # stops too, where they are not ignored from the start (nohup's SIGHUP)


@contextlib.contextmanager
def lent_signals():
    """The Python API's call: mpippo's signal handlers for its length, then the caller's back and the flags
    cleared. Left installed, they had swallowed every later Ctrl-C and SIGTERM of the caller's process, and
    a stop between two calls had ended the next at start-up (exit 4, 'nothing was trained yet')."""
    sigs = (signal.SIGUSR1, *STOPS, *QUIET_STOPS)
    before = {sig: signal.getsignal(sig) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # (None: set from C, not restorable from Python)
                signal.signal(sig, handler)
        if _FLAGS is not None:
            _FLAGS.requeue = _FLAGS.stop = False


def quiet_stops() -> tuple:
    return tuple(sig for sig in QUIET_STOPS if signal.getsignal(sig) is not signal.SIG_IGN)


def unblock(signals: list) -> list[str]:
    """Unblock `signals` in this thread (the main one, where Python runs handlers); the names of those
    that were blocked. An env's constructor that blocks them (a simulator's thread set-up) kept every
    stop and requeue from arriving: the run trained on through Slurm's warning."""
    if threading.current_thread() is not threading.main_thread():
        return []
    before = signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    return [sig.name for sig in signals if sig in before]


def is_second_ctrl_c(signum: int, stopped: bool) -> bool:
    """A person's "now": a SIGINT after any stop."""
    return signum == signal.SIGINT and stopped


def second_ctrl_c_in(came: list[int]) -> int | None:
    """SIGINT if `came` (signals in the order they came) holds a second Ctrl-C, else None."""
    stopped = False
    for sig in came:
        if is_second_ctrl_c(sig, stopped):
            return sig
        stopped |= sig in STOPS or sig in QUIET_STOPS  # (a hangup is a stop where it is caught: not under nohup)
    return None


# the stops of the trainer and the tools, and the requeue (a start-up held in native code still ends on it);
# not a profiler's timer
LOGGED = frozenset((*STOPS, *QUIET_STOPS, signal.SIGUSR1))


class SignalLog:
    """Every stop signal this process caught, in the order they came, readable from any thread. Python runs
    a handler in the main thread between bytecodes: one waiting in native code that retries after a
    signal (a simulator's socket read, a mutex) never runs it, and the stop never comes. Python's
    C-level handler still writes each caught signal's number to the wakeup fd, whichever thread the
    kernel interrupts: that fd is this log's pipe (the hang watch reads it, runctl.watch_alone).
    Never closed: no late write meets a closed fd. A user's code that sets its own wakeup fd later
    (asyncio's signal handlers) takes the log's place; the watch then sees nothing new."""

    def __init__(self):
        self.r, w = os.pipe()
        for fd in (self.r, w):
            os.set_blocking(fd, False)  # (the C handler must never block, the reader never wait)
        try:
            signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # (only the main thread may set it)
            os.close(self.r)
            os.close(w)
            raise
        self.came: list[int] = []
        os.register_at_fork(after_in_child=_forget_in_child)  # (once: a process has one log)

    def read(self) -> list[int]:
        """Every signal so far (the pipe drained)."""
        while True:
            try:
                got = os.read(self.r, 4096)
            except OSError:  # (EAGAIN: nothing more now)
                return self.came
            if not got:
                return self.came
            self.came.extend(sig for sig in got if sig in LOGGED)


_LOG: SignalLog | None = None


def log_signals() -> SignalLog | None:
    """The process's SignalLog, begun on the first call: by an entry point of ours (run_mpi.py,
    `python -m mpippo.evaluate`), in its main thread, before anything slow; a Python API caller's
    wakeup fd stays its own (no log there). None where it cannot begin (not the main
    thread; no file descriptor left)."""
    global _LOG
    if _LOG is None:
        try:
            _LOG = SignalLog()
        except (OSError, ValueError):
            return None
    return _LOG


def unheard(rule: Callable[[list[int]], int | None]) -> Callable[[], int | None] | None:
    """The hang watch's reading of this process's log (runctl.watch_alone's stop_due): `rule` over the
    signals so far names the one that should have ended the process; None where no log is kept (a
    Python API caller's process)."""
    log = _LOG
    return None if log is None else (lambda: rule(log.read()))


def _forget_in_child() -> None:
    """A forked child (an env's worker processes) has its own signals: its C handler would write them
    to the parent's log (a worker's terminate() would read as a stop there). Its wakeup fd goes."""
    global _LOG
    _LOG = None
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # (not the child's main thread: nothing Python can do; it execs or exits soon)
        pass
