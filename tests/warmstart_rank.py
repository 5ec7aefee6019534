"""An MPI rank's stand-in for the tests' warm start (tests/warmstart_server.py says what and why):
mpirun starts `python -S -E tests/warmstart_rank.py run_mpi.py ...` where the test named `python
run_mpi.py ...`; this process asks the test process's warm server (its socket in MPIPPO_TEST_WARM)
to fork the rank with this process's arguments, environment (mpirun's and PMIx's variables
included), folder, affinity and standard streams, passes on every signal it gets, and ends as the
rank did (its exit code or its signal). Where there is no server, or the server answers `fresh`,
it becomes the rank itself (exec of the same interpreter): the job runs as it would without it.
Only the standard library: it starts in a few milliseconds."""
import array
import json
import os
import signal
import socket
import sys

ARGV = sys.argv[1:]
# every signal a rank can be sent and catch (SIGKILL and SIGSTOP cannot be passed on: the server
# kills the rank when this process dies; the tests that stop a rank start it fresh)
PASSED = [s for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD)]


def fresh() -> None:
    os.execv(sys.executable, [sys.executable, *ARGV])


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def main() -> None:
    paths = os.environ.pop("MPIPPO_TEST_WARM", "").split(os.pathsep)  # (not the rank's: a fresh one has none)
    # two servers, ranks taking turns: each server's interpreter has its own string-hash seed, so the ranks
    # of a job do not all share one, as fresh ones share none (an order of a set of names differs)
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0"))  # (mpirun's, srun's)
    path = paths[int(rank) % len(paths)]
    if not path:
        fresh()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        fresh()
    umask = os.umask(0o022)
    os.umask(umask)
    ignored = [int(s) for s in PASSED if signal.getsignal(s) == signal.SIG_IGN]  # (as mpirun left them)
    line = json.dumps({"argv": ARGV, "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask, "ignored": ignored,
                       "client": os.getpid(), "affinity": sorted(os.sched_getaffinity(0))}) + "\n"
    streams = [fd if _open(fd) else os.open(os.devnull, os.O_RDWR) for fd in (0, 1, 2)]
    conn.sendmsg([line.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", streams))])
    answer = b""
    while b"\n" not in answer:
        data = conn.recv(4096)
        if not data:
            fresh()
        answer += data
    first, answer = answer.split(b"\n", 1)
    if first == b"fresh":
        conn.close()
        fresh()
    pid = int(first.split()[1])
    def pass_on(sig, _frame) -> None:
        try:
            os.killpg(pid, sig)  # (the rank's session: Open MPI signals a rank's process group)
        except ProcessLookupError:
            pass  # the rank has ended; its status is on its way
    for sig in PASSED:
        try:
            signal.signal(sig, pass_on)
        except (OSError, ValueError):
            pass  # (not catchable here)
    while b"\n" not in answer:
        data = conn.recv(4096)
        if not data:  # the server died: the rank with it, as far as mpirun can tell
            os._exit(1)
        answer += data
    status = int(answer.split()[1])
    if os.WIFSIGNALED(status):  # the same death: mpirun names the signal
        sig = os.WTERMSIG(status)
        if sig in PASSED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # (a signal whose default is not to end a process)
    os._exit(os.waitstatus_to_exitcode(status))


main()
