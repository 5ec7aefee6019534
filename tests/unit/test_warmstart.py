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

# a script that says what a fresh interpreter would make of it, then ends as its argument asks
PROBE = """import os, sys, signal
print("argv", sys.argv)
print("path0", sys.path[0])
print("name", __name__, os.path.basename(__file__))
print("cwd", os.getcwd(), "umask", oct(os.umask(0)))
print("env", os.environ.get("PROBE_VALUE"), os.environ.get("MPIPPO_TEST_WARM"))
print("stdio", sys.stdout.isatty(), sys.stdin.read(), sys.stderr.errors, sys.stdout.encoding)
for stream in (sys.stdin, sys.stdout, sys.stderr):  # (as the tools do: a stream it thinks seekable fails here)
    stream.reconfigure(errors="backslashreplace")
print("modules", sorted(m for m in ("mpi4py", "mpippo", "gymnasium") if m in sys.modules))
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


def _both(tmp_path, how: str, **env) -> tuple:
    """The probe run warm and fresh, in a folder of its own, with umask 027."""
    (tmp_path / "probe.py").write_text(PROBE)
    cmd = [sys.executable, str(tmp_path / "probe.py"), how]
    full = mpi_env() | {"PROBE_VALUE": "seen"} | env
    old = os.umask(0o027)
    try:
        warm = warmstart.run(cmd, full, WARM_BASE, tmp_path, 60)
        fresh = subprocess.run(cmd, cwd=tmp_path, env=full, capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=60)
    finally:
        os.umask(old)
    return warm, fresh


@pytest.mark.parametrize("how", ["0", "3", "raise", "signal"])
def test_a_warm_job_ends_and_speaks_as_a_fresh_one(tmp_path, how):
    warm, fresh = _both(tmp_path, how)
    assert warm is not None, "the job was started fresh: the warm start did not take it"
    assert warm.returncode == fresh.returncode, (warm, fresh)
    assert warm.stdout == fresh.stdout
    # a traceback names the same error; the warm child's has the server's frames above the script's
    assert warm.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]
    assert ("Traceback" in warm.stderr) == ("Traceback" in fresh.stderr) == (how == "raise")
    assert fresh.returncode == {"0": 0, "3": 3, "raise": 1, "signal": -signal.SIGTERM}[how]


def test_a_job_that_sets_what_torch_reads_at_its_import_starts_fresh(tmp_path):
    for var in ("OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "PYTHONPATH"):
        warm, fresh = _both(tmp_path, "0", **{var: "7"})
        assert warm is None, var
    assert warmstart.run([sys.executable, "-c", "pass"], mpi_env(), WARM_BASE, ROOT, 60) is None


def test_a_warm_job_past_its_timeout_is_killed_with_its_session(tmp_path):
    (tmp_path / "sleeper.py").write_text("import subprocess, sys, time\nprint('started', flush=True)\n"
                                         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                                         "time.sleep(60)\n")
    pids = []
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as got:
        warmstart.run([sys.executable, str(tmp_path / "sleeper.py")], mpi_env(), WARM_BASE, tmp_path, 3,
                      on_start=pids.append)
    assert time.monotonic() - t0 < 20 and got.value.args[0] == "started\n"
    wait_until(lambda: not [p for p in psutil.process_iter() if _in_session(p, pids[0])], "the job's session ended")


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
      f"name {__name__} argv {sys.argv[1:]} torch-loaded {'torch' in sys.modules}", flush=True)
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
        assert len(lines) == 3 and all(" of 3 sum 6 env seen name __main__ " in line for line in lines), res.stdout
        assert all(line.endswith(f"torch-loaded {loaded}") for line in lines), lines
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
    assert psutil.wait_procs([psutil.Process(rank)], timeout=10)[1] == []
    proc.kill()
    proc.wait(10)
