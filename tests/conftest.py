"""Helpers shared by the suites: run the real CLI or an MPI script with a hard timeout."""
from __future__ import annotations

import atexit
import compileall
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

import warmstart
from mpippo.leftovers import SHM_VAR, owned_prefix, sweep_leftovers
from mpippo.machine import describe

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# the jobs' PYTHONPATH: the repository, and with MPIPPO_TEST_PROCS set the per-process exit record first
# (tests/procstats/sitecustomize.py; the table at the end of the run)
PROCS = os.environ.get("MPIPPO_TEST_PROCS")
PYTHONPATH = f"{ROOT / 'tests' / 'procstats'}:{ROOT}" if PROCS else str(ROOT)
MPIRUN = str(BIN / "mpirun") if (BIN / "mpirun").exists() else "mpirun"
# The project's bytecode, once, by the session's first process: where PYTHONDONTWRITEBYTECODE is set (as on
# this project's machines) no process writes it, and each of the ~880 processes a full run starts compiled
# mpippo's 13,000 lines from source again, about 1 s of CPU each (2026-11-29). Up-to-date files are skipped.
if "PYTEST_XDIST_WORKER" not in os.environ:
    for _folder in ("mpippo", "benchmarks", "analysis", "tests"):
        compileall.compile_dir(ROOT / _folder, quiet=2)
# configs/smoke.yaml's iterations on toy-cue, for the tests whose point is no game's (signals, faults, damaged
# files, the CLI's outputs, scripts): a process that makes a procgen env first spends about 4 s of CPU loading
# every game's assets, whatever the game (2026-11-29: 128 of a full run's processes did, 68 after the move)
SMOKE_TOY = ["--config", "configs/smoke.yaml", "--set", "env.name=toy-cue"]
# pip Open MPI's btl/ofi sleeps 1 s in every MPI_Init on a machine without a fabric (strace: after
# its network scan); the tests run on one node, where the sm and self BTLs carry everything. Set
# here, so that every process the tests start inherits it, Slurm jobs included (measured: the
# suite's idle wall time was mostly these seconds, one per start).
os.environ.setdefault("OMPI_MCA_btl", "^ofi")
# Open MPI yields the core while it waits only when it knows the node is oversubscribed: mpirun
# --oversubscribe does, but a Slurm job on the local cluster (48 claimed CPUs, 2 real cores) does
# not, and its waiting ranks spin against the ones still starting (48-rank test: 75 s -> 57 s).
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
# The same for torch's OpenMP threads: `make test` runs two workers on two cores, so a trainer's two
# torch threads share them with the other worker's, and libgomp's spinning waits burn the core that
# the other thread needs (two smoke runs side by side: 4.2 s each spinning, 2.4 s with passive waits).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# And one torch thread per rank (the trainer's auto count takes OMP_NUM_THREADS first): the two workers'
# jobs already fill both cores with ranks, and a one-rank job's second thread only waits for the other
# worker's (a toy smoke run: 4.5 s of CPU with two threads, 3.2 s with one). test_placement.py checks
# the auto count without it, as a user's machine runs.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# Each job the tests start gets a shared-memory folder of its own: the tests run jobs side by side,
# and jobs sharing one folder meet on the same files now and then (mpippo.launch.own_shm_folder
# says why). One parent per test process, made at import (a forked child that execs inherits it),
# removed with everything in it when that process exits (or by the next test session, named after
# this process, if it is killed).
sweep_leftovers()
_SHM_PARENT = tempfile.mkdtemp(prefix=owned_prefix("tests"), dir="/dev/shm") if os.path.isdir("/dev/shm") else None
if _SHM_PARENT:
    atexit.register(shutil.rmtree, _SHM_PARENT, True)


def mpi_env() -> dict:
    """The environment for one job (mpirun, the launcher, a local suite): a call per job."""
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PRTE_MCA_hwloc_default_binding_policy="none",
               PYTHONPATH=PYTHONPATH, PYTHONUNBUFFERED="1")
    if _SHM_PARENT:
        env[SHM_VAR] = tempfile.mkdtemp(dir=_SHM_PARENT)
    return env


# The jobs' environment before any test changed it: the tests' warm-start server starts with it
# (tests/warmstart.py: one-process jobs forked from a process that has imported torch once)
WARM_BASE = mpi_env()


def warm_python() -> str | None:
    """The python to name for the jobs a test does not start itself (the Slurm scripts' MPIPPO_PYTHON): their
    scripts start warm (tests/warmstart.py: python); None where every job starts fresh."""
    return None if warmstart.FRESH else warmstart.python(WARM_BASE)


def run_warm(cmd: list[str], env: dict, cwd, timeout: float, on_start=None) -> subprocess.CompletedProcess | None:
    """cmd run warm (tests/warmstart.py), or None where it must start fresh; a timeout fails the test."""
    if warmstart.FRESH:
        return None
    try:
        return warmstart.run(cmd, env, WARM_BASE, cwd, timeout, on_start)
    except TimeoutError as e:
        out, err = e.args
        pytest.fail(f"timed out after {timeout} s (deadlock?): {' '.join(cmd)}\n{out[-3000:]}\n{err[-3000:]}")


def warm_ranks(cmd: list[str], env: dict) -> tuple[list[str], dict]:
    """An mpirun command whose ranks start warm (tests/warmstart.py), and its environment."""
    return (cmd, env) if warmstart.FRESH else warmstart.ranks(cmd, env, WARM_BASE)


def fake_wandb(folder: Path, body: str) -> dict:
    """A stand-in `wandb` package in `folder` (module text `body`), found before the real one: W&B's
    failures on demand, and no test ever reaches for its servers. Returns the environment to add."""
    (folder / "fake" / "wandb").mkdir(parents=True, exist_ok=True)
    (folder / "fake" / "wandb" / "__init__.py").write_text(body)
    return {"PYTHONPATH": f"{folder / 'fake'}:{PYTHONPATH}"}


# the real wandb with no login and, should it try anyway, a server address that refuses at once
NO_WANDB_LOGIN = {"WANDB_API_KEY": "", "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_SILENT": "true"}


def wandb_home(folder: Path) -> dict:
    """The real wandb in a home of its own (no ~/.netrc, no settings): online mode has no login."""
    return {"HOME": str(folder), "WANDB_CONFIG_DIR": str(folder / ".wandb-config"), **NO_WANDB_LOGIN}


def error_lines(stderr: str) -> list[str]:
    """A job's `mpippo: error:` lines. Where a rank ends the job with MPI_Abort, mpirun forwards the
    rank's line and prints its own abort banner on the same stream, whose last byte is a NUL (Open MPI 5,
    every time): the line may come after the banner, so after that NUL, or with a blank before it (seen
    under load); leading blanks and NULs are dropped here."""
    return [line.lstrip(" \t\x00") for line in stderr.splitlines()
            if line.lstrip(" \t\x00").startswith("mpippo: error:")]


# Open MPI's runtime now and then fails before it starts a single rank: CI once saw mpirun exit 213
# with only this line among ~900 jobs (PMIx found no interface to listen on, or could not bind, on a
# loaded machine; nothing of ours had run). Such a launch is started again, at most twice, and said.
LAUNCH_FAILED = "PMIx server's listener thread failed to start"
STARTS = 3  # at most, for a job Open MPI failed to start


def launch_failed(code: int, err: str, args) -> bool:
    """Whether a job ended in Open MPI's failure to start it (then said on stderr: it is started again)."""
    if code == 0 or LAUNCH_FAILED not in err:
        return False
    print(f"mpirun failed to start the job (exit {code}, {LAUNCH_FAILED!r}); starting it again: "
          f"{' '.join(map(str, args))[:200]}", file=sys.stderr)
    return True


def relaunched(launch: Callable[[], subprocess.CompletedProcess]) -> subprocess.CompletedProcess:
    """launch(), again where Open MPI failed to start the job (LAUNCH_FAILED); any other outcome stands."""
    for _ in range(STARTS - 1):
        res = launch()
        if not launch_failed(res.returncode, res.stderr, res.args):
            return res
    return launch()


def run(cmd: list[str], timeout: float, cwd=ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run with a hard timeout; on timeout kill the whole process group and fail (a hang is a bug).
    `env`: variables added to the job's environment."""
    return relaunched(lambda: _run_once(cmd, timeout, cwd, env))


def _run_once(cmd: list[str], timeout: float, cwd, env: dict | None) -> subprocess.CompletedProcess:
    full = mpi_env() | (env or {})
    if (res := run_warm(cmd, full, cwd, timeout)) is not None:
        return res
    started, full = warm_ranks(cmd, full)
    proc = subprocess.Popen(started, cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout} s (deadlock?): {' '.join(cmd)}\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


class Started(subprocess.Popen):
    """A job whose output the test reads as it comes (start()). Where Open MPI failed to start it
    (LAUNCH_FAILED), wait_for_line starts it again, as run() does, at most STARTS starts in all."""

    def __init__(self, cmd: list[str], **kw):
        self.how, self.starts = (cmd, kw), 1
        super().__init__(cmd, **kw)

    def again(self, err: str) -> bool:
        """Started again (True) if this start ended in Open MPI's failure to launch and starts are left."""
        if self.starts >= STARTS or not launch_failed(self.returncode, err, self.args):
            return False
        self.stdout.close()
        self.stderr.close()
        subprocess.Popen.__init__(self, self.how[0], **self.how[1])  # the same object: the test holds it
        self.starts += 1
        return True


def start(cmd: list[str], **kw) -> Started:
    """Start a job in its own session, its output read by the test (wait_for_line, finish)."""
    return Started(cmd, cwd=ROOT, env=mpi_env() | kw.pop("env", {}), stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def learner_line_by(update: int, learners: str = "0") -> dict:
    """The env of a job whose learners (job ranks, "0+2" for two agents of 2 ranks) pause 5.5 s at
    `update` and the next (MPIPPO_FAULT kind=slow): the actor-learner layout prints its console line
    every 5 s, so the line a test signals at comes after the first pause on every machine, however
    fast (a 49k-step APPO run took 3.9 s on a Zen 5 core, before any line), and the second gives the
    signal 5.5 s to land before the budget is spent."""
    return {"MPIPPO_FAULT": f"rank={learners},iteration={update},kind=slow,seconds=5.5,count=2"}


def fault_stamp(monkeypatch, tmp_path: Path) -> Path:
    """Where the injected fault writes its moment (MPIPPO_FAULT_STAMP): fail-stop bounds count from
    there, not from the launch, whose start-up (torch imports, MPI) a slow machine stretches."""
    stamp = tmp_path / "fault-stamp"
    monkeypatch.setenv("MPIPPO_FAULT_STAMP", str(stamp))
    return stamp


def seconds_since(stamp: Path) -> float:
    """Wall-clock seconds from the fault's stamp to now (the job has ended); fails if it never fired."""
    assert stamp.exists(), "the injected fault never fired"
    return time.time() - float(stamp.read_text())


def rank_processes(proc: subprocess.Popen) -> list:
    """The trainer ranks under a started job, in rank order (mpippo.launch's own reading: a process
    mpirun has forked but not yet made a rank, or one that ended meanwhile, is left out; callers wait
    for the count they expect)."""
    from mpippo import launch
    return launch.rank_processes(proc.pid)


def _readline(proc: subprocess.Popen, deadline: float) -> str | None:
    """The job's next line ('' at its end), or None if none came by `deadline` (a blocked read is
    left to a thread, whose read ends when the job is killed)."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(max(deadline - time.monotonic(), 0.0))
    return box[0] if box else None


def wait_until(condition, what: str, timeout: float = 30.0):
    """condition()'s first true value, polled until `timeout` (a moment the test waits for, not a guessed
    sleep: on a loaded machine it comes late); the test fails naming `what` if it never comes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (out := condition()):
            return out
        time.sleep(0.005)
    pytest.fail(f"{what} did not happen within {timeout} s")


def wait_for_line(proc: subprocess.Popen, prefix: str, timeout: float = 120) -> str:
    """The first line of the job's output that starts with `prefix`; the test fails if none comes."""
    deadline, err = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        line = _readline(proc, deadline)
        if line is None:  # nothing more within the time: a job that prints nothing fails, it does not hang
            break
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            err = proc.stderr.read()
            if isinstance(proc, Started) and proc.again(err):
                continue
            break
        if not line:  # (its output closed, the process not yet reaped: no busy loop meanwhile)
            time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        err = proc.stderr.read()
    pytest.fail(f"never printed {prefix!r}: {err[-2000:]}")


def finish(proc: subprocess.Popen, timeout: float = 90) -> tuple[int, str, str]:
    """The job's exit code and output once it ends; the test fails if it does not within `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("did not exit after the signal (hang)")
    return proc.returncode, out, err


def mpirun(n: int, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return run([MPIRUN, "--oversubscribe", "-n", str(n), sys.executable] + args, timeout)


def trainer(n: int | None, args: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    """The real CLI: under mpirun with n ranks, or plain python when n is None."""
    if n is None:
        return run([sys.executable, "run_mpi.py"] + args, timeout)
    return mpirun(n, ["run_mpi.py"] + args, timeout)


def ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, f"exit {res.returncode}\nSTDOUT:\n{res.stdout[-4000:]}\nSTDERR:\n{res.stderr[-4000:]}"
    return res


def metrics(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "benchmark_metrics.json").read_text())


# The order the two workers take the files in (make test: --dist loadfile --no-loadscope-reorder): the files
# that start the longest jobs first, the in-process unit tests last, so that the part ends with both workers
# on short files. (xdist's own order, most tests first, put the Slurm and learning files, few tests and the
# most CPU, at the end: on the AVX2 node one worker ran alone for the part's last two minutes.)
FIRST_TO_LAST = ("tests/slurm/", "tests/learning/", "tests/smoke/", "tests/mpi/", "tests/unit/")


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        path = item.nodeid
        return next((i for i, d in enumerate(FIRST_TO_LAST) if path.startswith(d)), len(FIRST_TO_LAST))
    items.sort(key=rank)  # stable: each folder's files and tests keep their order


def pytest_terminal_summary(terminalreporter) -> None:
    """The machine's kind last, beside the times: CI's log is read from its tail, and the suite's time
    depends on it (native bf16 or not, AVX-512 or AVX2 kernels)."""
    if not hasattr(terminalreporter.config, "workerinput"):  # the controller only, not each xdist worker
        if PROCS and os.path.exists(PROCS):
            for line in process_table(PROCS):
                terminalreporter.write_line(line)
        terminalreporter.write_line(describe())


def process_table(path: str, rows: int = 15) -> list[str]:
    """MPIPPO_TEST_PROCS's records summed by test file, most CPU first: where the suite's CPU goes by the
    processes it starts (torch's import and procgen's assets cost seconds in each)."""
    files: dict[str, list[float]] = {}
    warm = 0
    for line in Path(path).read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut by a full disk
        warm += bool(r.get("warm"))
        f = files.setdefault(r["test"].split("::")[0] or "(no test)", [0, 0.0, 0, 0])
        f[0], f[1], f[2], f[3] = f[0] + 1, f[1] + r["cpu_s"], f[2] + r["torch"], f[3] + r["procgen"]
    total = [sum(v[i] for v in files.values()) for i in range(4)]
    out = [f"processes started: {total[0]:,}, {total[1]:,.0f} s of CPU; {total[2]:,} imported torch "
           f"({warm:,} of them forked warm, tests/warmstart.py), {total[3]:,} made a procgen env "
           f"(MPIPPO_TEST_PROCS={path})",
           f"{'cpu s':>8} {'procs':>6} {'torch':>6} {'procgen':>8}  test file"]
    for name, (n, cpu_s, torch_n, procgen_n) in sorted(files.items(), key=lambda kv: -kv[1][1])[:rows]:
        out.append(f"{cpu_s:8.0f} {n:6d} {torch_n:6d} {procgen_n:8d}  {name}")
    return out


# MPIPPO_TEST_CPU=<file>: each test's wall time and the CPU seconds of the processes it started and
# waited for (RUSAGE_CHILDREN: a job's ranks included, a Slurm job's not), a JSON line per test, to
# see where `make test`'s CPU goes (two workers on two cores: wall time follows CPU work, not the
# test's own duration, which depends on what the other worker runs beside it).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get("MPIPPO_TEST_CPU")
    if not path:
        yield
        return

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    c0, t0, start = cpu(), time.monotonic(), time.time()
    yield
    with open(path, "a") as f:  # the start and the worker: each worker's timeline, its waits beside the other's work
        f.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu() - c0, 2),
                            "wall_s": round(time.monotonic() - t0, 2), "start": round(start, 2),
                            "worker": os.environ.get("PYTEST_XDIST_WORKER", "-")}) + "\n")
