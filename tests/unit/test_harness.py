"""The test harness's own promise: a job Open MPI failed to start is started again, nothing else is."""
import json
import subprocess
import sys

import pytest

from conftest import LAUNCH_FAILED, finish, relaunched, start, wait_for_line


def _launches(*outcomes):
    """A launch that answers `outcomes` in turn (exit code, stderr), and the count of calls."""
    calls = []

    def launch():
        code, err = outcomes[len(calls)]
        calls.append(code)
        return subprocess.CompletedProcess(["mpirun", "-n", "2"], code, "", err)
    return launch, calls


def test_a_job_open_mpi_failed_to_start_is_started_again():
    launch, calls = _launches((213, f"---\nThe {LAUNCH_FAILED}. We cannot\ncontinue.\n"), (0, ""))
    assert relaunched(launch).returncode == 0 and len(calls) == 2


def test_a_job_that_failed_on_its_own_is_not_started_again():
    launch, calls = _launches((2, "mpippo: error: training.algo: 'x' is not one of ..."), (0, ""))
    assert relaunched(launch).returncode == 2 and len(calls) == 1


def test_relaunching_stops_after_three_starts():
    failed = (213, LAUNCH_FAILED)
    launch, calls = _launches(failed, failed, failed, (0, ""))
    assert relaunched(launch).returncode == 213 and len(calls) == 3


def test_the_process_table_sums_each_files_processes(tmp_path):
    """MPIPPO_TEST_PROCS's records, as tests/procstats/sitecustomize.py writes them, summed by file."""
    from conftest import process_table
    rec = lambda test, cpu, torch, procgen: json.dumps(  # noqa: E731
        {"test": test, "argv": ["run_mpi.py"], "cpu_s": cpu, "wall_s": 1.0, "torch": torch, "procgen": procgen,
         "warm": test == "tests/b.py::t"})
    path = tmp_path / "procs.jsonl"
    path.write_text("\n".join([rec("tests/a.py::t1", 2.5, True, False),
                               rec("tests/b.py::t", 9.0, True, True), rec("tests/a.py::t2", 3.0, True, True),
                               rec("", 0.5, False, False)]) + "\n{\"cut\n")
    lines = process_table(str(path))
    assert lines[0].startswith("processes started: 4, 15 s of CPU; 3 imported torch (1 of them forked warm, "
                               "tests/warmstart.py), 2 made a procgen env")
    assert [line.split()[-1] for line in lines[2:]] == ["tests/b.py", "tests/a.py", "test)"]
    assert lines[3].split()[:4] == ["6", "2", "2", "1"]  # a.py: 5.5 s rounded, 2 processes, 2 torch, 1 procgen


def _flaky_job(tmp_path, failures: int) -> list[str]:
    """A job that fails as Open MPI's launch does `failures` times (a count in a file), then prints its line."""
    count = tmp_path / "starts"
    body = (f"import pathlib, sys\np = pathlib.Path({str(count)!r})\nn = int(p.read_text()) if p.exists() else 0\n"
            f"p.write_text(str(n + 1))\nif n < {failures}:\n    sys.stderr.write({LAUNCH_FAILED!r} + '\\n')\n"
            f"    sys.exit(213)\nprint('iter     1', flush=True)\n")
    return [sys.executable, "-c", body]


def test_a_streamed_job_open_mpi_failed_to_start_is_started_again(tmp_path):
    proc = start(_flaky_job(tmp_path, failures=2))
    assert wait_for_line(proc, "iter ").startswith("iter     1") and proc.starts == 3
    assert finish(proc)[0] == 0


def test_a_streamed_job_that_keeps_failing_to_start_fails_the_test(tmp_path):
    proc = start(_flaky_job(tmp_path, failures=3))
    with pytest.raises(pytest.fail.Exception, match=f"never printed 'iter '.*{LAUNCH_FAILED}"):
        wait_for_line(proc, "iter ")
    assert proc.starts == 3 and (tmp_path / "starts").read_text() == "3"


def test_a_fault_can_name_several_ranks_and_only_those_ranks_act_on_it(monkeypatch):
    """MPIPPO_FAULT's rank=0+2 (both learners of a two-agent job): each of them, no other rank."""
    from mpippo import faults
    monkeypatch.setattr(faults, "FAULT", faults.parse("rank=0+2,iteration=3,kind=slow,seconds=0.2,count=1"))
    assert faults.FAULT["ranks"] == {0, 2} and faults.parse("kind=raise")["ranks"] == {0}
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)  # the sleeps asked for, none taken
    for rank in range(4):
        faults.maybe_inject(rank, 3)
        slept.append(f"after {rank}")
    assert slept == [0.2, "after 0", "after 1", 0.2, "after 2", "after 3"]


RANK = """import os, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *a: None)
open(sys.argv[1] + str(os.getpid()), "w").close()
time.sleep(60)
"""
MPIRUN = """import os, signal, subprocess, sys, time
signal.signal(signal.SIGUSR1, lambda *a: None)
env = {k: v for k, v in os.environ.items() if k not in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")}
rank = [sys.executable, sys.argv[1], sys.argv[2], "run_mpi.py"]
kids = [subprocess.Popen(rank, env=dict(env, PMIX_RANK=r)) for r in ("1", "0")] + [subprocess.Popen(rank, env=env)]
time.sleep(60)
"""


def test_a_process_mpirun_has_forked_but_not_yet_made_a_rank_is_no_rank(tmp_path):
    """Between fork and exec mpirun's child has mpirun's command line (run_mpi.py in it), environment (no
    rank) and handlers (SIGUSR1 caught, to forward it): the tests read it as a rank (KeyError 'PMI_RANK'
    in CI) and the launcher would count it as listening and pass a held signal on too soon. A stand-in
    mpirun starts two ranks out of order and one such child, all catching SIGUSR1."""
    import time

    import psutil

    from mpippo import launch
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "mpirun.py").write_text(MPIRUN)
    mpirun = subprocess.Popen([sys.executable, str(tmp_path / "mpirun.py"), str(tmp_path / "rank.py"),
                               str(tmp_path / "up-"), "run_mpi.py"])
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("up-*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = psutil.Process(mpirun.pid).children()
        assert len(kids) == 3 and all(launch.catches_usr1(p.pid) for p in kids)
        assert [p.environ()["PMIX_RANK"] for p in launch.rank_processes(mpirun.pid)] == ["0", "1"]
        assert launch.ranks_listening(mpirun.pid, 2) and not launch.ranks_listening(mpirun.pid, 3)
    finally:
        for p in psutil.Process(mpirun.pid).children():
            p.kill()
        mpirun.kill()
        mpirun.wait()
