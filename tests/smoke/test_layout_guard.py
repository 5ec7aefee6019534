"""The actor-learner layout's progress guard: a hung actor or learner ends the job, naming it and
where it hangs; a slow learner that keeps talking does not."""
import re
import subprocess
import sys

import pytest

from conftest import MPIRUN, ROOT, error_lines, metrics, mpi_env, relaunched, seconds_since
from mpippo import faults

# 3-rank runs of tens of seconds, mostly asleep: they run beside other tests (make test's parallel part),
# whose load only lengthens the learner's sleeps and the hang's detection, never shortens them
pytestmark = pytest.mark.slow

TIMEOUT_S = 10
DQN = ["run_mpi.py", "--config", "configs/dqn_toy.yaml", "--no-progress",
       "--set", f"guards.collective_timeout_s={TIMEOUT_S}"]


def run_faulty(tmp_path, fault: str, extra=(), limit=90):
    """The job's result and, for a raise, kill or hang, the seconds from the fault to the job's end."""
    stamp = tmp_path / "fault-stamp"
    env = mpi_env() | {"MPIPPO_FAULT": fault, "MPIPPO_FAULT_STAMP": str(stamp)}
    cmd = [MPIRUN, "--oversubscribe", "-n", "3", sys.executable, *DQN, "--output-dir", str(tmp_path / "run"), *extra]
    res = relaunched(lambda: subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit))
    return res, (seconds_since(stamp) if faults.parse(fault)["kind"] in ("raise", "kill", "hang") else None)


@pytest.mark.parametrize("rank,role,iteration", [(2, "actor", 150), (0, "learner", 40)])
def test_a_hung_rank_ends_the_job_naming_it(tmp_path, rank, role, iteration):
    res, elapsed = run_faulty(tmp_path, f"rank={rank},iteration={iteration},kind=hang")
    assert res.returncode != 0, res.stdout[-2000:]
    lines = error_lines(res.stderr)
    assert len(lines) >= 1 and f"rank {rank} ({role}) was silent for" in lines[0], res.stderr[-3000:]
    assert "last seen:" in lines[0] and "Traceback" not in res.stderr
    # ... and the silent rank says where it hangs (here the fault's own wait; a user's env would be named)
    assert re.search(rf"\[rank {rank}\] rank \d finds this rank silent \(its progress guard\), at "
                     rf"'[^']*faults\.py':\d+ in maybe_inject", res.stderr), res.stderr[-3000:]
    # the timeout + the abort, within a minute more, counted from the hang (a bound, not a speed: a job that
    # never ended would meet the test's own timeout instead)
    assert elapsed < TIMEOUT_S + 60, elapsed


def test_a_slow_learner_that_keeps_talking_is_not_a_hang(tmp_path):
    """The learner sleeps 2.5 s in each of 10 updates: its actors (4 chunks of credit each, 8 updates
    of data together) wait for credit about 20 s (15 s on the slower CI machine: 1.6 s sleeps gave
    only 9.7 s there), longer than the timeout, while the learner's keepalives show it is alive.
    The run finishes."""
    res, _ = run_faulty(tmp_path, "rank=0,iteration=100,kind=slow,seconds=2.5,count=10", limit=180)
    assert res.returncode == 0, res.stderr[-3000:]
    m = metrics(tmp_path / "run")
    assert m["longest_credit_hold_s"] > TIMEOUT_S, m["longest_credit_hold_s"]
    assert m["transitions_sent"] == m["transitions_received"] == 24000


def test_a_checkpoint_that_cannot_be_written_ends_the_dqn_run_with_one_line(tmp_path):
    """The same policy as PPO: exit 1, one line, the previous checkpoint intact (here: the one of
    update 100, when the write of update 200 finds the disk full)."""
    import torch
    res, _ = run_faulty(tmp_path, "rank=0,iteration=200,kind=enospc",
                        ["--set", "dqn.checkpoint_interval_updates=100"])
    assert res.returncode == 1, res.stderr[-3000:]
    errors = error_lines(res.stderr)
    assert len(errors) == 1 and "No space left on device" in errors[0] and "previous checkpoint is intact" in errors[0]
    assert "Traceback" not in res.stderr
    state = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=False)
    assert state["iteration"] == 100
