"""The tests' warm start (tests/warmstart*.py) keeps its promise: a job forked from the warm server, or
an MPI rank started through its stand-in, is seen by the test as the same job started fresh would
be: its output, exit code or signal, arguments, folder, umask, environment and `__main__`; and a
job whose environment torch or the interpreter read at their import starts fresh."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import warmstart
from conftest import MPIRUN, ROOT, WARM_BASE, mpi_env, wait_until

# a script that says what a fresh interpreter would make of it, then ends as its argument asks; run as a
# script and as a module (`python -m probe`: argv[0] is "-m" while it is found, as mpippo/__init__.py reads)
PROBE = """import os, sys, signal
print("argv while imported", sys.argv[:1], sys.orig_argv[1:])
if __name__ != "__main__":
    raise SystemExit(0)
print("argv", sys.argv, sys.orig_argv[1:])
print("path0", sys.path[0])
print("name", __name__, __file__, __spec__ and __spec__.name)
print("cwd", os.getcwd(), "umask", oct(os.umask(0)))
print("env", os.environ.get("PROBE_VALUE"), os.environ.get("MPIPPO_TEST_WARM"))
print("stdio", sys.stdout.isatty(), sys.stdin.read(), sys.stderr.errors, sys.stdout.encoding)
for stream in (sys.stdin, sys.stdout, sys.stderr):  # (as the tools do: a stream it thinks seekable fails here)
    stream.reconfigure(errors="backslashreplace")
print("signals", [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)])
print("modules", sorted(m for m in ("mpi4py", "mpippo", "gymnasium") if m in sys.modules))
print("globals", sorted(k for k in globals() if not k.startswith("__")))
print("line\\r\\nwith a return\\rand more")
sys.stderr.write("to stderr\\n")
how = sys.argv[1]
if how == "raise":
    raise ValueError("from the probe")
if how == "signal":
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(int(how))
"""


def _both(tmp_path, how: str, form: str = "script", **env) -> tuple:
    """The probe run warm and fresh, in a folder of its own, with umask 027, SIGHUP ignored (nohup) and
    a handler on SIGTERM in this process (a job inherits the first, not the second)."""
    (tmp_path / "probe.py").write_text(PROBE)
    cmd = [sys.executable, *(["probe.py"] if form == "script" else ["-m", "probe"]), how]
    full = mpi_env() | {"PROBE_VALUE": "seen"} | env
    warmstart.run(cmd, full, WARM_BASE, tmp_path, 60)  # (the servers start with this process's signals as they were)
    old = os.umask(0o027), signal.signal(signal.SIGHUP, signal.SIG_IGN), signal.signal(signal.SIGTERM, print)
    try:
        warm = warmstart.run(cmd, full, WARM_BASE, tmp_path, 60)
        fresh = subprocess.run(cmd, cwd=tmp_path, env=full, capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=60)
    finally:
        os.umask(old[0])
        signal.signal(signal.SIGHUP, old[1])
        signal.signal(signal.SIGTERM, old[2])
    return warm, fresh


@pytest.mark.parametrize("form", ["script", "module"])
@pytest.mark.parametrize("how", ["0", "3", "raise", "signal"])
def test_a_warm_job_ends_and_speaks_as_a_fresh_one(tmp_path, how, form):
    warm, fresh = _both(tmp_path, how, form)
    assert warm is not None, "the job was started fresh: the warm start did not take it"
    assert warm.returncode == fresh.returncode, (warm, fresh)
    assert warm.stdout == fresh.stdout
    assert fresh.returncode == {"0": 0, "3": 3, "raise": 1, "signal": -signal.SIGTERM}[how]
    if how != "raise":
        assert warm.stderr == fresh.stderr
    else:  # the same error; the warm child's traceback has the server's frames below the script's
        assert warm.stderr.splitlines()[:2] == fresh.stderr.splitlines()[:2] == ["to stderr",
                                                                                "Traceback (most recent call last):"]
        assert warm.stderr.splitlines()[-3:] == fresh.stderr.splitlines()[-3:]  # (its frame, its line, the error)


def test_warm_jobs_draw_their_own_random_numbers(tmp_path):
    """A fork copies numpy's global generator: each warm job reseeds it, as a fresh process seeds its own."""
    (tmp_path / "draw.py").write_text("import numpy\nprint(numpy.random.rand())\n")
    cmd = [sys.executable, str(tmp_path / "draw.py")]
    draws = [warmstart.run(cmd, mpi_env(), WARM_BASE, tmp_path, 60).stdout for _ in range(3)]
    assert len(set(draws)) == 3, draws


def test_a_job_that_sets_what_torch_reads_at_its_import_starts_fresh(tmp_path):
    for var in ("OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "PYTHONPATH", "MKL_NUM_THREADS", "TMPDIR"):
        warm, fresh = _both(tmp_path, "0", **{var: "7"})
        assert warm is None, var
    # ... but not to what an unset one means (slurm/common.sh sets MKL's threads as OpenMP's; Slurm TMPDIR=/tmp)
    same = {"MKL_NUM_THREADS": WARM_BASE["OMP_NUM_THREADS"]} | ({} if "TMPDIR" in WARM_BASE else {"TMPDIR": "/tmp"})
    assert _both(tmp_path, "0", **same)[0] is not None, same
    assert warmstart.run([sys.executable, "-c", "pass"], mpi_env(), WARM_BASE, ROOT, 60) is None


def test_a_warm_job_past_its_timeout_is_killed_with_its_session(tmp_path):
    (tmp_path / "sleeper.py").write_text("import subprocess, sys, time\nprint('started', flush=True)\n"
                                         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                                         "time.sleep(60)\n")
    pids = []
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as got:
        warmstart.run([sys.executable, str(tmp_path / "sleeper.py")], mpi_env(), WARM_BASE, tmp_path, 8,
                      on_start=pids.append)
    assert time.monotonic() - t0 < 40 and got.value.args[0] == "started\n"  # (at its timeout, not the job's 60 s)
    wait_until(lambda: not [p for p in psutil.process_iter() if _in_session(p, pids[0])], "the job's session ended")


def test_a_warm_job_leads_its_own_session_when_the_test_learns_its_pid(tmp_path):
    """The job's session is what a timeout, or the test process's end, kills: it must exist by the time
    its pid is known (else a kill that soon finds no session, and the job runs on)."""
    (tmp_path / "waits.py").write_text("import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.01)\n")
    sessions = []

    def started(pid: int) -> None:
        sessions.append(os.getsid(pid) == pid)
        (tmp_path / "go").touch()  # (the job ends only now: its pid is no other's while it is read)
    for _ in range(20):
        (tmp_path / "go").unlink(missing_ok=True)
        warmstart.run([sys.executable, "waits.py"], mpi_env(), WARM_BASE, tmp_path, 60, on_start=started)
    assert sessions == [True] * 20, sessions


def test_a_test_that_fails_while_its_warm_job_runs_takes_the_job_with_it(tmp_path):
    """An error in the test while it waits (on_start's here; pytest-timeout's is another) ends the job's
    session and reaches the test: never a fresh start of a job that is running warm."""
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(60)\n")
    pids = []

    def started(pid: int) -> None:
        pids.append(pid)
        raise RuntimeError("the test's own")
    with pytest.raises(RuntimeError, match="the test's own"):
        warmstart.run([sys.executable, "sleeper.py"], mpi_env(), WARM_BASE, tmp_path, 60, on_start=started)
    wait_until(lambda: not [p for p in psutil.process_iter() if _in_session(p, pids[0])], "the job's session ended")


def test_what_a_warm_job_forks_is_seen_with_the_jobs_environment(tmp_path):
    """/proc shows a forked process the server's environment: warmstart.environ gives the job's, by which
    the hostile tables find a case's processes (a user's env that forks a child and leaves it, say)."""
    (tmp_path / "forks.py").write_text("import os, time\nif (pid := os.fork()) == 0:\n    null = os.open(os.devnull, os.O_RDWR)\n"
                                       "    os.dup2(null, 1), os.dup2(null, 2)\n    time.sleep(60)\n    os._exit(0)\n"
                                       "print(pid)\n")
    res = warmstart.run([sys.executable, "forks.py"], mpi_env() | {"PROBE_VALUE": "forked"}, WARM_BASE, tmp_path, 60)
    child = psutil.Process(int(res.stdout))
    try:
        assert child.environ().get("PROBE_VALUE") is None  # (what the tables read before)
        assert warmstart.environ(child)["PROBE_VALUE"] == "forked"
        assert warmstart.environ(psutil.Process()) == psutil.Process().environ()  # (a process exec'd: its own)
    finally:
        child.kill()


def test_the_python_named_for_other_jobs_starts_scripts_warm_and_the_rest_as_python(tmp_path):
    """warmstart.python: what the Slurm tests give the batch scripts as MPIPPO_PYTHON. A script and `-m
    module` start warm (torch already loaded: the server's), with their arguments and exit code; `-` (a
    script on stdin, as slurm/common.sh runs one) and options run the interpreter itself."""
    python = warmstart.python(WARM_BASE)
    code = "import sys\nprint('torch' in sys.modules, sys.argv[1:])\nsys.exit(int(sys.argv[-1]))\n"
    (tmp_path / "probe.py").write_text(code)

    def run(*args, stdin=None):
        res = subprocess.run([python, *args], cwd=tmp_path, env=mpi_env(), input=stdin, capture_output=True, text=True,
                             timeout=60)
        return res.returncode, res.stdout
    assert run("probe.py", "a b", "3") == (3, "True ['a b', '3']\n")
    assert run("-m", "probe", "0") == (0, "True ['0']\n")
    assert run("-", "4", stdin=code) == (4, "False ['4']\n")
    assert run("-c", "import sys; print(sys.executable)") == (0, f"{sys.executable}\n")
    assert run("-m")[0] == subprocess.run([sys.executable, "-m"], capture_output=True).returncode == 2


def _alive(pid: int) -> bool:
    """Running (a zombie waits for a parent that is gone to be reaped by whoever adopts it: ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _in_session(p: psutil.Process, sid: int) -> bool:
    try:
        return os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False


RANKS = """import os, sys
from mpi4py import MPI
w = MPI.COMM_WORLD
total = w.allreduce(w.Get_rank() + 1)
print(f"rank {w.Get_rank()} of {w.Get_size()} sum {total} env {os.environ.get('PROBE_VALUE')} "
      f"{os.environ.get('MPIPPO_TEST_WARM')} "
      f"name {__name__} argv {sys.argv[1:]} torch-loaded {'torch' in sys.modules} hash {hash('mpippo')}", flush=True)
code = int(sys.argv[1]) if w.Get_rank() == 1 else 0
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


@pytest.mark.parametrize("code", [0, 5, -int(signal.SIGKILL)])
def test_warm_ranks_run_mpi_and_end_as_fresh_ones(tmp_path, code):
    """Three ranks through the stand-in: MPI works between them, each is forked warm (torch already
    loaded, which a fresh rank of this script never imports), and mpirun sees rank 1's end as it
    would a fresh rank's: its exit code, or its death by a signal."""
    (tmp_path / "ranks.py").write_text(RANKS)
    cmd = [MPIRUN, "--oversubscribe", "-n", "3", sys.executable, str(tmp_path / "ranks.py"), str(code)]
    env = mpi_env() | {"PROBE_VALUE": "seen"}
    warm_cmd, warm_env = warmstart.ranks(cmd, env, WARM_BASE)
    warm, fresh = (subprocess.run(c, cwd=tmp_path, env=e, capture_output=True, text=True, timeout=60)
                   for c, e in ((warm_cmd, warm_env), (cmd, env)))
    for res, loaded in ((warm, "True"), (fresh, "False")):
        lines = sorted(line for line in res.stdout.splitlines() if line.startswith("rank "))
        assert len(lines) == 3 and all(" of 3 sum 6 env seen None name __main__ " in line for line in lines), res.stdout
        assert all(f"torch-loaded {loaded} hash " in line for line in lines), lines
        # each rank its own string-hash seed, as fresh processes have (ranks 0 and 1: two servers)
        assert lines[0].split()[-1] != lines[1].split()[-1], lines
    assert warm.returncode == fresh.returncode and (fresh.returncode == 0) == (code == 0), (warm.stderr[-1500:],
                                                                                          fresh.stderr[-1500:])


def test_a_rank_whose_stand_in_is_killed_dies_with_it(tmp_path):
    """mpirun's SIGKILL reaches the stand-in only: the server kills the rank it forked."""
    (tmp_path / "wait.py").write_text("import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(60)\n")
    cmd, env = warmstart.ranks([MPIRUN, "-n", "1", sys.executable, str(tmp_path / "wait.py")], mpi_env(), WARM_BASE)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    rank = int(proc.stdout.readline().split()[1])
    stand_in = [p for p in psutil.Process(proc.pid).children(recursive=True) if "warmstart_rank.py" in " ".join(p.cmdline())]
    assert len(stand_in) == 1 and rank != stand_in[0].pid
    stand_in[0].kill()
    wait_until(lambda: not _alive(rank), "the rank's end", 10)
    proc.kill()
    proc.wait(10)


def test_the_jobs_of_a_test_process_that_died_end_with_it(tmp_path):
    """A test process killed with its jobs running (a worker's crash, a timeout's kill): its server ends
    their sessions and itself, and removes its socket."""
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "tester.py").write_text(
        f"import os, sys, threading\nsys.path.insert(0, {str(ROOT / 'tests')!r})\nimport warmstart\n"
        f"env = dict(os.environ)\nthreading.Thread(target=warmstart.run, daemon=True, args=([sys.executable, "
        f"{str(tmp_path / 'sleeper.py')!r}], env, env, {str(tmp_path)!r}, 60),\n"
        f"                 kwargs={{'on_start': lambda pid: print(pid, warmstart._servers[0].path, flush=True)}}).start()\n"
        f"threading.Event().wait()\n")
    tester = subprocess.Popen([sys.executable, str(tmp_path / "tester.py")], env=mpi_env(), stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    pid, path = tester.stdout.readline().split()
    assert psutil.pid_exists(int(pid)) and os.path.exists(path)
    tester.kill()
    tester.wait(10)
    wait_until(lambda: not _alive(int(pid)) and not os.path.exists(path), "the job's and the socket's end")


def test_where_no_server_can_start_every_job_starts_fresh(tmp_path):
    """A TMPDIR so long that the servers' socket path passes the kernel's limit: one line on stderr, then
    one-process jobs and mpirun jobs as they were, fresh."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    code = (f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\nimport os, warmstart\nenv = dict(os.environ)\n"
            "print(warmstart.run([sys.executable, '-m', 'json.tool', '--help'], env, env, '.', 60),\n"
            "      warmstart.ranks(['mpirun', '-n', '2', sys.executable, 'x.py'], env, env)[0][3:5])\n")
    res = subprocess.run([sys.executable, "-c", code], env=mpi_env() | {"TMPDIR": str(deep)}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["None", f"['{sys.executable}',", "'x.py']"], res.stdout
    assert res.stderr.count("tests: no warm start, every job starts fresh") == 1, res.stderr
