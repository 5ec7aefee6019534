"""A decided process's end, without the interpreter's teardown.

After torch's import, Python's teardown frees module by module what the kernel frees at once:
0.1-0.7 s of CPU per process (more on a slow node), a tenth to a quarter of a short run's. The
trainer (run_mpi.py) and the tools (toolcli.exit_process) end here once their outcome is decided
and their files are closed. What the teardown owed the process is done, in its order: threading's
own end (its exit hooks stop idle executor workers, then threads that are not daemons are joined, for
LINGER_S at most),
atexit's functions (W&B's finish, logging's flush, temporary folders), the steps registered with
`last` (mpippo.comm: MPI_Finalize), the processes it started and left running ended, the Python and C
standard streams flushed. Objects' __del__
do not run: whatever holds data closes it before (the trainer's logs, the tools' atomic writes).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import sys
import threading
from pathlib import Path

from mpippo import preemption
from mpippo.errors import code_at, who

_LAST: list = []


def last(step) -> None:
    """Run `step()` at end_process, after atexit's functions (mpippo.comm registers MPI_Finalize:
    only a process that imported MPI pays for it)."""
    _LAST.append(step)


LINGER_S = 10.0  # how long a decided process waits for threads that are not daemons (Python: forever)


def _join_threads(limit_s: float) -> None:
    """threading's own end (what Py_FinalizeEx calls first: the main thread marked done, its exit hooks
    stopping idle executor workers, then every thread that is not a daemon joined), for limit_s at
    most: a user's env module that left such a thread running (a simulator's client, a log shipper)
    held a finished run forever, its stop signals already ignored and its run folder locked. Past it,
    one warning names each thread and where it runs, and the process ends without them. (The joins
    run in a daemon thread: the main thread's wait has a timeout, and a Ctrl-C reaches it.)"""
    _main_thread_done()

    def end_threads() -> None:
        for hook in reversed(getattr(threading, "_threading_atexits", [])):
            with contextlib.suppress(Exception):  # (a hook that fails must not leave the rest unjoined)
                hook()
        for thread in threading.enumerate():
            if not thread.daemon and thread is not threading.main_thread():
                with contextlib.suppress(RuntimeError):  # (one not started yet)
                    thread.join()
    ender = threading.Thread(target=end_threads, name="mpippo-threads-end", daemon=True)
    try:
        ender.start()
    except RuntimeError:  # no thread can start (ulimit -u; what failed first for it said so): the process ends
        return            # without the joins, as after their time limit, not with a second traceback
    ender.join(limit_s)
    if ender.is_alive():
        _say_lingering(limit_s)


def _main_thread_done() -> None:
    """What threading._shutdown does first, on the main thread: it counts as ended from now on, so a
    thread that waits for its end (main_thread().join(), a loop on is_alive()) ends too."""
    main = threading.main_thread()
    if threading.current_thread() is not main:
        return
    with contextlib.suppress(Exception):  # (private parts of threading, which differ between versions)
        threading._SHUTTING_DOWN = True
        handle = getattr(main, "_os_thread_handle", None) or getattr(main, "_handle", None)
        if handle is not None and hasattr(handle, "_set_done"):  # Python 3.13 and later
            handle._set_done()
        elif getattr(main, "_tstate_lock", None) is not None and main._tstate_lock.locked():  # 3.10 to 3.12
            main._tstate_lock.release()
            main._stop()


def _say_lingering(limit_s: float) -> None:
    frames = sys._current_frames()
    left = [t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread() and t.is_alive()]
    what = ("; ".join(f"'{t.name}'{code_at(frames.get(t.ident))}" for t in left[:3]) +
            (f" (and {len(left) - 3} more)" if len(left) > 3 else "")) if left else \
        "threading's exit hooks (an executor whose task never ends)"
    with contextlib.suppress(Exception):
        sys.stderr.write(f"mpippo: warning: {who()}{len(left)} thread(s) that are not daemons still running "
                         f"{limit_s:g} s after the end, not waited for: {what}\n")


CHILD_GRACE_S = 5.0  # how long a decided process waits for the processes it started to end by themselves


def _has_children() -> bool:
    """Whether this process has a child (Linux's /proc: no import; elsewhere psutil answers)."""
    try:
        return any(Path(f"/proc/self/task/{t}/children").read_text().split() for t in os.listdir("/proc/self/task"))
    except OSError:
        return True


def _end_children(grace_s: float) -> None:
    """Processes this one started that still run at its end (a user's env whose simulator server its
    close() left up) outlive it, holding mpirun's output pipes: mpirun never returned, and a batch job
    stayed until its time limit. They get grace_s to end by themselves; then one warning names them and
    they are ended (SIGTERM, then SIGKILL). Services that end with this process on their own are left be."""
    if not _has_children():
        return
    import psutil  # (only where there is a child: most processes end without this import)
    with contextlib.suppress(psutil.Error):
        _, alive = psutil.wait_procs(_stray(psutil), timeout=grace_s)
        if not alive:
            return
        alive = sorted(alive, key=lambda p: p.pid)
        names = "; ".join(f"pid {p.pid} ({_command(p)})" for p in alive[:3]) + (
            f" (and {len(alive) - 3} more)" if len(alive) > 3 else "")
        with contextlib.suppress(Exception):  # (a reader gone, or no stderr: the processes are ended all the same)
            sys.stderr.write(f"mpippo: warning: {who()}{len(alive)} process(es) this process started still running "
                             f"{grace_s:g} s after its end (an env whose close() leaves its own processes up?): {names}; "
                             f"ending them\n")
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(alive, timeout=2.0)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()


# services that watch this process and end with it: W&B's, multiprocessing's tracker and forkserver (by a
# word of their command line), and the MPI daemons a singleton's MPI_Init may start (by name: Open MPI 4's orted)
OWN_ENDS = ("wandb", "multiprocessing.resource_tracker", "multiprocessing.forkserver")
MPI_DAEMONS = ("orted", "prted", "prte", "hydra_pmi_proxy")


def _stray(psutil) -> list:
    """This process's descendants but the services that end with it (and what those started)."""
    out = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.name() not in MPI_DAEMONS and not any(w in " ".join(child.cmdline()) for w in OWN_ENDS):
                out += [child, *child.children(recursive=True)]
    return out


def _command(p) -> str:
    """A process's command line, shortened for a warning."""
    try:
        return " ".join(p.cmdline())[:80] or p.name()
    except Exception:  # noqa: BLE001 (psutil.Error: ended meanwhile, or not ours to read)
        return "?"


def end_process(code) -> None:
    """Exit with `code` as SystemExit(code) would (None is 0; a text is printed on stderr and is 1),
    except that a stream that cannot be flushed at the end (a reader gone: `tool | head`) keeps the
    status, where Python's teardown turns it into 120. A Ctrl-C meanwhile (a person's "now": the
    outcome is decided) skips what is left of the teardown's duties, not the exit. Under a profiler or
    debugger (python -m cProfile -o ..., pdb) it is SystemExit, whose teardown gives them their end."""
    if code is None or isinstance(code, int):
        code = int(code or 0)
    else:
        with contextlib.suppress(Exception):
            print(code, file=sys.stderr)
        code = 1
    # decided: said before the teardown, which a rank may not survive (MPI_Finalize killed by mpirun once the
    # others are gone; a user's env whose close() ends the process its own way)
    preemption.announce_exit(code & 0xFF)
    if sys.getprofile() is not None or sys.gettrace() is not None:
        raise SystemExit(code)  # a profiler, tracer or debugger wraps the program: it writes its results after
    try:
        _join_threads(LINGER_S)
        atexit._run_exitfuncs()
        for step in _LAST:
            step()
        _end_children(CHILD_GRACE_S)
    except KeyboardInterrupt:
        pass
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # (a reader gone, or no stream at all: `tool >&-`)
            stream.flush()
    with contextlib.suppress(Exception):  # C libraries' buffered output (exit() would flush it)
        ctypes.CDLL(None).fflush(None)
    os._exit(code & 0xFF)  # (what the kernel keeps of any status)
