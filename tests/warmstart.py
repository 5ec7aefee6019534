"""The tests' side of their warm start (tests/warmstart_server.py says what it is and why).

- run(cmd, env, base, cwd, timeout): a one-process job (`python script.py ...`, `python -m module
  ...`) run as a child of this test process's warm server; what subprocess would return (the exit
  code, negative for a signal; stdout and stderr as text with universal newlines), or None where
  it must start fresh (another interpreter, interpreter options, `-c`, or an environment the server
  answers `fresh` to).
- ranks(cmd, env, base): an mpirun command whose ranks start warm (tests/warmstart_rank.py in the
  interpreter's place) and the environment naming the server; (cmd, env) unchanged where it cannot.
- python(base): a program to give as the python of the jobs this process does not start itself (the
  Slurm scripts' MPIPPO_PYTHON): scripts and `-m module` warm, through the stand-in, anything else fresh.

With MPIPPO_TEST_FRESH=1 the tests start every job fresh (conftest.run_warm, warm_ranks): the suite as
it was, to compare or to rule the warm start out. The jobs that tests signal or whose rank processes
they look at (conftest.start) always start fresh."""
from __future__ import annotations

import array
import atexit
import json
import os
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK = HERE / "warmstart_rank.py"
# The server runs as `python -c SHIM <socket> <pipe>`: in each child the job's code then runs right above
# this frame, whose file is "<string>", so that no frame of a file of ours lies under the job's (mpippo names
# where a hung thread is by the innermost frame of a file that is the user's: warmstart_server.py was one)
SHIM = f"""import sys
sys.path[0] = {str(HERE)!r}
import warmstart_server as w
if w.serve() is None:
    sys.exit(0)
del sys.path[0]
code, where = w.job_code()
del w
exec(code, where) if code is not None else __import__("runpy")._run_module_as_main(where)
"""
FRESH = os.environ.get("MPIPPO_TEST_FRESH") == "1"
SOCKET_VAR = "MPIPPO_TEST_WARM"


class _Server:
    def __init__(self, env: dict):
        self.env = dict(env)  # (what /proc shows as the environment of the server and every process it forks)
        self.folder = tempfile.mkdtemp(prefix="mpippo-warm-")
        self.path = os.path.join(self.folder, "s")
        alive_r, self.alive_w = os.pipe()  # the server ends when this process does (the pipe's EOF)
        self.proc = subprocess.Popen([sys.executable, "-c", SHIM, self.path, str(alive_r)], env=env,
                                     cwd=self.folder, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     pass_fds=(alive_r,), start_new_session=True, text=True)
        os.close(alive_r)
        ready = self.proc.stdout.readline()  # (said by the server proper: the process started here forks it)
        self.proc.stdout.close()
        self.proc.wait(10)
        atexit.register(self.close)
        if ready.strip() != "ready":
            raise OSError(f"the tests' warm-start server did not start (its socket {self.path})")

    def close(self) -> None:
        os.close(self.alive_w)  # the server ends its jobs and itself, and removes its socket
        shutil.rmtree(self.folder, ignore_errors=True)  # (... unless it was killed)


# two servers: one-process jobs go to the first, the ranks of an mpirun job take turns (warmstart_rank.py)
_servers: list[_Server] = []
_starting = threading.Lock()  # (the hostile tables run two cases at a time, from threads)
_failed: list[str] = []  # (why they could not start, once said)
_python: list = []  # (python()'s answer, once made)


def _started(base: dict) -> list[_Server]:
    """The two servers; none where they cannot start (a socket's path past the kernel's 107 bytes under a
    long TMPDIR, say): then every job starts fresh, said once on stderr."""
    with _starting:
        while len(_servers) < 2 and not _failed:
            try:
                _servers.append(_Server(base))
            except OSError as e:
                _failed.append(str(e))
                print(f"tests: no warm start, every job starts fresh: {e}", file=sys.stderr)
    return [] if _failed else _servers


def ignored() -> list[int]:
    """The signals this process ignores: a job it starts inherits them ignored (the others' handlers go)."""
    return [int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
            and signal.getsignal(s) == signal.SIG_IGN]


def _umask() -> int:
    """This process's umask, read without setting it (another thread may be creating files)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)


def _python_job(args: list[str]) -> bool:
    """args after the interpreter: a script or `-m module`, no interpreter options."""
    return bool(args) and (not args[0].startswith("-") or (args[0] == "-m" and len(args) > 1))


def run(cmd: list[str], env: dict, base: dict, cwd, timeout: float, on_start=None):
    """The job's subprocess.CompletedProcess, run warm; None where it must start fresh. base: the
    environment the server starts with (the jobs' own before any test changed it). On a timeout the
    job's session is killed and TimeoutError raised with (out, err) so far. on_start(pid): called
    once the child runs (its pid leads its own session)."""
    if cmd[0] != sys.executable or not _python_job(cmd[1:]):
        return None
    if not (servers := _started(base)):
        return None
    job = _Job(servers[0], cmd, env, cwd)
    if job.pid is None:
        return None
    try:
        if on_start:
            on_start(job.pid)
        return job.result(timeout)
    except BaseException:  # (the test's own timeout, an error in on_start): the job goes with the test
        job.kill()
        raise


def environ(p) -> dict:
    """A process's environment (p a psutil.Process): as /proc shows it, or for a warm job, and what its
    session forked, the job's own (/proc shows the server's there; the server keeps each job's)."""
    env = p.environ()
    if not any(s.env == env for s in _servers):  # (a process exec'd shows its own: so the job's exec'd ones)
        return env
    found = []
    for server in _servers:  # (the newest: a pid both servers' jobs had, one after the other)
        try:
            path = os.path.join(server.folder, f"env.{os.getsid(p.pid)}")
            found.append((os.stat(path).st_mtime_ns, path))
        except OSError:
            continue
    try:
        with open(max(found)[1]) as f:
            return json.load(f)
    except (ValueError, OSError):  # (none: not a warm job's; or removed, its session gone meanwhile)
        return env


def ranks(cmd: list[str], env: dict, base: dict) -> tuple[list[str], dict]:
    """cmd with its ranks started warm, and env naming the server; both as given where it cannot."""
    at = cmd.index(sys.executable, 1) if sys.executable in cmd[1:] else len(cmd)
    if not _python_job(cmd[at + 1:]) or not (servers := _started(base)):
        return cmd, env
    paths = os.pathsep.join(s.path for s in servers)
    return cmd[:at] + [sys.executable, "-S", "-E", str(RANK)] + cmd[at + 1:], env | {SOCKET_VAR: paths}


def python(base: dict) -> str | None:
    """The path of a program that starts as `python ARGS` would: `script ...` and `-m module ...` through
    the stand-in (warm, or fresh where the server says so: a Slurm job on a GPU node sets CUDA_*), any
    other arguments (options, `-` reading stdin) as the interpreter itself. None where no server can start."""
    if not (servers := _started(base)):
        return None
    path = os.path.join(servers[0].folder, "python")
    with _starting:
        if _python:
            return _python[0]
        py, paths = shlex.quote(sys.executable), shlex.quote(os.pathsep.join(s.path for s in servers))
        text = (f'#!/bin/sh\n# the tests\' warm start: tests/warmstart.py, python()\ncase "$1" in\n'
                f'  -m) [ $# -ge 2 ] || exec {py} "$@" ;;\n  -*|"") exec {py} "$@" ;;\nesac\n'
                f'MPIPPO_TEST_WARM={paths} exec {py} -S -E {shlex.quote(str(RANK))} "$@"\n')
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
        try:  # (a TMPDIR mounted noexec: the jobs get the interpreter itself)
            subprocess.run([path, "-c", ""], timeout=60, check=True)
            _python.append(path)
        except (OSError, subprocess.SubprocessError):
            _python.append(None)
        return _python[0]


class _Job:
    """One job on the server: `pid` its child's, None where it must start fresh (no server to reach, or
    its answer). Once asked, the job is the server's: a failure from there is the test's, never a fresh
    start (the warm one may be running)."""

    def __init__(self, server: _Server, cmd: list[str], env: dict, cwd):
        self.cmd, self.pid, self.answer, self.killed = cmd, None, b"", False
        # (the request made before connecting: the server reads it as soon as it accepts, one job at a time)
        line = json.dumps({"argv": cmd[1:], "env": env, "cwd": str(cwd), "umask": _umask(), "ignored": ignored()}) + "\n"
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.settimeout(60)  # (to its `pid` answer: a wedged server fails the test, never hangs it)
        try:
            self.conn.connect(server.path)
        except OSError:  # (no server to reach: the job starts fresh, the test goes on)
            self.conn.close()
            return
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.pipes = {out_r: bytearray(), err_r: bytearray()}
        self.open = {out_r, err_r}
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            self.conn.sendmsg([line.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null, out_w, err_w]))])
            first = self._first_line()
        except OSError as e:
            self._close()
            raise RuntimeError(f"the tests' warm-start server did not answer for {cmd}: {e}") from None
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        if first == b"fresh":
            self._close()
            return
        self.pid = int(first.split()[1])
        self.conn.settimeout(None)

    def _first_line(self) -> bytes:
        while b"\n" not in self.answer:
            data = self.conn.recv(4096)
            if not data:
                raise OSError("it ended")
            self.answer += data
        first, self.answer = self.answer.split(b"\n", 1)
        return first

    def result(self, timeout: float) -> subprocess.CompletedProcess:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for fd in self.pipes:
                sel.register(fd, selectors.EVENT_READ)
            sel.register(self.conn, selectors.EVENT_READ)
            while sel.get_map() and time.monotonic() < deadline:
                for key, _ in sel.select(max(deadline - time.monotonic(), 0)):
                    self._read(sel, key.fileobj)
            done = not sel.get_map()
        out, err = (self._text(b) for b in self.pipes.values())
        if not done:
            self.kill()
            raise TimeoutError(out, err)
        status = int(self.answer.split(b"exit ")[1])
        return subprocess.CompletedProcess(self.cmd, os.waitstatus_to_exitcode(status), out, err)

    def _read(self, sel, source) -> None:
        if source is self.conn:
            data = self.conn.recv(4096)
            self.answer += data
        else:
            data = os.read(source, 1 << 16)
            self.pipes[source] += data
        if not data:
            sel.unregister(source)
            self.conn.close() if source is self.conn else self._close_pipe(source)
            if source is self.conn and b"exit " not in self.answer:
                raise RuntimeError(f"the tests' warm-start server ended during {self.cmd}")

    def kill(self) -> None:
        """The job's session ended, and what this side holds of it closed."""
        if not self.killed:  # (once: its pid, once reaped, may be another's)
            self.killed = True
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass  # (ended meanwhile)
        self._close()

    def _close_pipe(self, fd: int) -> None:
        if fd in self.open:  # (once: its number may be another thread's file by now)
            self.open.remove(fd)
            os.close(fd)

    def _close(self) -> None:
        for fd in list(self.open):
            self._close_pipe(fd)
        self.conn.close()

    @staticmethod
    def _text(data: bytes) -> str:  # as subprocess's text mode: the locale's encoding, universal newlines
        return bytes(data).decode().replace("\r\n", "\n").replace("\r", "\n")
