"""The tests' warm start: one process per test process that imports torch and numpy once, then forks
a child for each job the tests run in one interpreter: a one-process job (`python script.py ...`,
`python -m module ...`; tests/warmstart.py asks) or an MPI rank (tests/warmstart_rank.py, which
mpirun starts in the rank's place, asks).

Why: a trainer in a fresh process spends about 1 s of CPU importing torch before its first line of
its own; the suite starts about 500 such processes on two cores, a third of its CPU (measured with
MPIPPO_TEST_PROCS, docs/testing.md). A child forked here runs the same script as __main__, with the
job's arguments, environment, folder, umask, CPU affinity and standard streams (passed as
descriptors), in a session of its own, and ends as the interpreter would (its exit code, a traceback
and 1, or its signal). Nothing of mpippo, MPI, Gymnasium or any env is imported before the fork:
those are the job's own imports, as in a fresh process, and MPI is initialized in the child only.

Protocol, one Unix-socket connection per job: the client sends one JSON line (argv, env, cwd, umask;
a rank's client also its pid and affinity) with descriptors 0-2; the answer is `fresh` (the job's
environment differs in what the interpreter or torch read at their import: the client starts it
fresh) or `pid <n>`, then `exit <wait status>` when the child ends. A rank's child is killed when
its client dies first (mpirun's SIGKILL reaches the client only). The server ends when the test
process's pipe (argv[2]) closes."""
from __future__ import annotations

import array
import contextlib
import gc
import io
import json
import os
import selectors
import signal
import socket
import sys

import numpy  # noqa: F401  (the point: imported once, before the forks)
import torch  # noqa: F401

# the signals a child sets as a fresh interpreter would find them: ignored where the job's parent ignores
# them (the request's "ignored": SIGHUP under nohup, SIGINT in a background job), else the default; Python
# then ignores SIGPIPE and SIGXFSZ and handles SIGINT, as at its start
SIGNALS = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP})

# read at the interpreter's, torch's or its libraries' import: a job that sets them otherwise starts fresh
IMPORT_TIME = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "ATEN_", "ONEDNN_", "DNNL_",
               "TORCH", "PYTORCH_", "CUDA", "NVIDIA", "NUMPY_", "NPY_", "THP_", "GLIBC_TUNABLES", "MALLOC", "LC_",
               "LANG", "TMPDIR", "TZ")
# ... but not these: torch's compiler sets its cache folder in the test process's environment when it
# first compiles (an in-process test's torch.compile), and reads it then, never at the import
AT_RUN_TIME = ("TORCHINDUCTOR_CACHE_DIR",)
_ENV = dict(os.environ)
_WAKE_R, _WAKE_W = os.pipe()
os.set_blocking(_WAKE_W, False)  # (signal.set_wakeup_fd's requirement)


# pip Open MPI's mpirun gives its ranks LD_LIBRARY_PATH=<venv>/lib: the libraries MPI loads in the
# child, which a singleton finds there without it (the same files, checked in /proc/self/maps)
_MPI_LIBS = {os.path.join(sys.prefix, "lib"), *filter(None, _ENV.get("LD_LIBRARY_PATH", "").split(":"))}


def _pidfd_works() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):  # (Linux before 5.3): no way to see a rank's stand-in die
        return False


PIDFD = _pidfd_works()


# what an unset variable means to its reader, where setting it to that is no difference: MKL's thread count
# is OMP_NUM_THREADS's without its own (slurm/common.sh sets both), Python's temporary folder /tmp (Slurm
# sets TMPDIR=/tmp)
_UNSET = {"MKL_NUM_THREADS": lambda e: e.get("OMP_NUM_THREADS"), "TMPDIR": lambda e: "/tmp"}


def suits(env: dict) -> bool:
    def same(k: str) -> bool:
        if k == "LD_LIBRARY_PATH":
            return set(filter(None, env.get(k, "").split(":"))) <= _MPI_LIBS
        if k in _UNSET:
            return env.get(k, _UNSET[k](env)) == _ENV.get(k, _UNSET[k](_ENV))
        return env.get(k) == _ENV.get(k)
    return all(same(k) for k in set(env) | set(_ENV) if k.startswith(IMPORT_TIME) and k not in AT_RUN_TIME)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        msg, anc, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
        if not msg:
            raise EOFError
        data += msg
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


class _Jobs:
    """The children running, by pid: each one's connection, and for a rank its client's pidfd."""

    def __init__(self, sel: selectors.BaseSelector):
        self.sel, self.conn, self.watch = sel, {}, {}

    def add(self, pid: int, conn: socket.socket, client: int | None) -> None:
        self.conn[pid] = conn
        if client is not None:
            try:
                fd = os.pidfd_open(client)
            except OSError:  # the client is gone already
                os.killpg(pid, signal.SIGKILL)
                return
            self.watch[pid] = fd
            self.sel.register(fd, selectors.EVENT_READ, ("client", pid))

    def client_gone(self, pid: int) -> None:
        if pid in self.conn:
            os.killpg(pid, signal.SIGKILL)  # (its session, as Open MPI kills a rank's group; reaped, and said, by reap)
        self._unwatch(pid)

    def _unwatch(self, pid: int) -> None:
        if (fd := self.watch.pop(pid, None)) is not None:
            self.sel.unregister(fd)
            os.close(fd)

    def reap(self) -> None:
        while self.conn:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            self._unwatch(pid)
            try:
                os.killpg(pid, 0)  # (what the job forked lives on: the hostile tables' leftover check reads its env)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.remove(_env_file(pid))
            if (conn := self.conn.pop(pid, None)) is not None:
                _say(conn, f"exit {status}\n")
                conn.close()

    def end_all(self) -> None:
        for pid in self.conn:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass  # (ended meanwhile)

    def close_in_child(self) -> None:
        for c in self.conn.values():
            c.close()
        for fd in self.watch.values():
            os.close(fd)


def _serve(listener: socket.socket, parent_gone: int):
    """Fork a child per request; in the server, report each child's end. Returns (request, fds) in the
    child only, None when the test process has ended."""
    sel = selectors.DefaultSelector()
    for src, what in ((listener, "new"), (parent_gone, "end"), (_WAKE_R, "wake")):
        sel.register(src, selectors.EVENT_READ, (what, None))
    jobs = _Jobs(sel)
    while True:
        for key, _ in sel.select():
            what, pid = key.data
            if what == "end":  # the test process has ended: nobody waits for its jobs (their sessions go)
                jobs.end_all()
                return None
            if what == "wake":
                os.read(_WAKE_R, 4096)
                jobs.reap()
            elif what == "client":
                jobs.client_gone(pid)
            elif (job := _accept(listener, jobs)) is not None:
                sel.close()
                return job


def _accept(listener: socket.socket, jobs: _Jobs):
    conn, _ = listener.accept()
    conn.settimeout(10)  # (a client stopped mid-request must not stall every other job)
    try:
        request, fds = _receive(conn)
    except (EOFError, OSError, ValueError):
        conn.close()
        return None
    pid = -1
    if suits(request["env"]) and (PIDFD or not request.get("client")):
        pid = _fork_in_session()
    if pid < 0:
        for fd in fds:
            os.close(fd)
        _say(conn, "fresh\n")
        conn.close()
        return None
    if pid == 0:
        listener.close()
        jobs.close_in_child()
        conn.close()
        return request, fds
    for fd in fds:
        os.close(fd)
    _publish(pid, request["env"])
    jobs.add(pid, conn, request.get("client"))
    if not _say(conn, f"pid {pid}\n"):  # (its client gave up waiting, and started it fresh or failed)
        os.killpg(pid, signal.SIGKILL)
    return None


def _env_file(pid: int) -> str:
    return os.path.join(os.path.dirname(sys.argv[1]), f"env.{pid}")


def _publish(pid: int, env: dict) -> None:
    """The job's environment, where the tests can read it (warmstart.environ): /proc/<pid>/environ shows a
    forked process's parent's, and the hostile tables find a case's processes by a variable there."""
    path = _env_file(pid)
    with contextlib.suppress(OSError):
        with open(path + ".new", "w") as f:
            json.dump(env, f)
        os.replace(path + ".new", path)


def _fork_in_session() -> int:
    """os.fork's answer (-1 where it failed), returning in the server only once the child leads a session
    of its own: what a timeout or the test process's end kills is the job's session, which must exist by
    the time anyone knows the job's pid (answered at once, a kill found no session and the job ran on)."""
    made_r, made_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # (out of memory or processes: the job starts fresh, where it will meet the same)
        pid = -1
    if pid == 0:
        os.setsid()
        os.close(made_r)
        os.close(made_w)  # (the server's read ends)
        return 0
    os.close(made_w)
    if pid > 0:
        os.read(made_r, 1)  # EOF: the child has its session (or has died)
    os.close(made_r)
    return pid


def _say(conn: socket.socket, line: str) -> bool:
    try:
        conn.sendall(line.encode())
        return True
    except OSError:
        return False  # the test went away; a child it knew of runs to its end as a fresh process would


def _become(request: dict, fds: list[int]) -> None:
    """In the child (its session made at the fork): the job's streams, folder, umask, affinity, environment
    and signals."""
    signal.set_wakeup_fd(-1)
    ignored = set(request["ignored"])
    for sig in SIGNALS:
        how = signal.SIG_IGN if sig in ignored or sig in (signal.SIGPIPE, signal.SIGXFSZ) else signal.SIG_DFL
        with contextlib.suppress(OSError, ValueError):  # (real-time signals Python cannot set)
            signal.signal(sig, signal.default_int_handler if (sig, how) == (signal.SIGINT, signal.SIG_DFL) else how)
    numpy.random.seed()  # (a fork copies the generator's state: each job its own, as fresh; `random` reseeds itself)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for fd in (_WAKE_R, _WAKE_W, int(sys.argv[2])):
        os.close(fd)
    _stdio()
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    if request.get("affinity"):
        os.sched_setaffinity(0, request["affinity"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    sys.orig_argv = [sys.executable, *sys.argv]
    if hasattr(stats := sys.modules.get("sitecustomize"), "warm_start"):
        stats.warm_start()  # (MPIPPO_TEST_PROCS: the child's own record, from now)


def _stdio() -> None:
    """sys.stdin/stdout/stderr made anew on descriptors 0-2, as the interpreter makes them at its start
    (the server's own knew other files: /dev/null is seekable, a pipe not)."""
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, mode, closefd=False)
        raw.name = f"<{name}>"
        if mode == "w" and old.write_through:  # (PYTHONUNBUFFERED: unbuffered, as the interpreter does)
            buf = raw
        else:
            buf = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        new = io.TextIOWrapper(buf, encoding=old.encoding, errors=old.errors, newline="\n",
                               line_buffering=old.line_buffering or (mode == "w" and raw.isatty()),
                               write_through=old.write_through)
        new.mode = mode
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def job_code() -> tuple:
    """What SHIM runs as the job, in its own frame (no frame of this file under the job's): (code,
    globals) for `python script ...` (argv[0] as given, __file__ absolute, the script's folder first on
    sys.path: not runpy.run_path, which sets argv[0] to the path it is given), or (None, module) for
    `python -m module ...` (argv[0] is "-m" while the module is found, then its file: runpy's own)."""
    import importlib.machinery
    import types
    main = sys.modules["__main__"] = types.ModuleType("__main__")  # (the shim's namespace is not the job's)
    if sys.argv[0] == "-m":
        sys.path.insert(0, os.getcwd())
        return None, sys.argv.pop(1)
    path = os.path.abspath(sys.argv[0])
    sys.path.insert(0, os.path.dirname(os.path.realpath(sys.argv[0])))
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=__builtins__,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    with io.open_code(path) as f:
        return compile(f.read(), path, "exec"), main.__dict__


def serve():
    """The server's life (argv: its socket's path, the test process's pipe): returns the job in each child,
    None in the server once the test process has ended (its socket and folder removed)."""
    job = _serve_forever()
    if job is None:
        folder = os.path.dirname(sys.argv[1])
        with contextlib.suppress(OSError):  # (removed by the test process)
            os.remove(sys.argv[1])
            for name in os.listdir(folder):  # (the jobs' environments; anything else there stays, and the folder)
                if name.startswith("env.") or name == "python":  # (python: warmstart.python's)
                    os.remove(os.path.join(folder, name))
            os.rmdir(folder)
        return None
    _become(*job)
    return job


def _serve_forever():
    if hasattr(stats := sys.modules.get("sitecustomize"), "not_a_job"):
        stats.not_a_job()  # (MPIPPO_TEST_PROCS records jobs: the server and its first process are none)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(128)
    signal.set_wakeup_fd(_WAKE_W)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (wakes the select through the wakeup fd)
    gc.freeze()  # (the imports' objects: never scanned, so their pages stay shared with the children)
    if os.fork() > 0:  # no child of the test process: tests that look at their process's children see theirs
        os._exit(0)
    print("ready", flush=True)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.close(null)
    return _serve(listener, int(sys.argv[2]))

