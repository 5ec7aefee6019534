import json
import sys

import numpy as np
import pytest

from conftest import MPIRUN, error_lines, mpirun, ok

pytestmark = pytest.mark.mpi
SCRIPTS = "tests/mpi/scripts"


def test_sharded_update_equals_single_rank_update(tmp_path):
    """One update with the batch split over 2 or 3 ranks == the same update on 1 rank."""
    results = {}
    for n in (1, 2, 3):
        out = tmp_path / f"params_{n}.npy"
        res = ok(mpirun(n, [f"{SCRIPTS}/equiv_update.py", str(out)], timeout=120))
        assert res.stdout.count(" ok") == n
        results[n] = np.load(out)
    init_moved = np.abs(results[1]).sum() > 0
    assert init_moved
    np.testing.assert_allclose(results[2], results[1], atol=1e-5, rtol=0)
    np.testing.assert_allclose(results[3], results[1], atol=1e-5, rtol=0)


def test_replica_checksum_names_the_diverged_rank():
    res = ok(mpirun(3, [f"{SCRIPTS}/replica_check.py"], timeout=60))
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 3
    for row in rows:  # every rank reaches the same verdict
        assert row["same"] == []
        assert row["diverged"] == [1]


def test_three_uneven_ranks_real_run_keeps_replicas_identical(tmp_path):
    """A short real run on 3 ranks with the replica checksum compared after every update."""
    from conftest import metrics, trainer
    run_dir = tmp_path / "run"
    ok(trainer(3, ["--config", "configs/toy_cue.yaml", "--num-envs-per-rank", "8", "--total-timesteps", "3840",
                   "--set", "guards.checksum_interval=1", "--output-dir", str(run_dir), "--no-progress"]))
    m = metrics(run_dir)
    assert m["world_size"] == 3 and m["total_timesteps"] == 3840
    assert m["replica_checks"] == 5  # one per iteration (>= 1 update each), all passed


def test_actor_learner_messages_arrive_exactly_once():
    """1 learner + 3 actors: every chunk sent is received once, intact, with credits and weights flowing."""
    res = ok(mpirun(4, [f"{SCRIPTS}/p2p_exchange.py"], timeout=90))
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    learner = [r for r in rows if r["role"] == "learner"]
    actors = {r["rank"]: r for r in rows if r["role"] == "actor"}
    assert len(learner) == 3 and set(actors) == {1, 2, 3}
    for row in learner:
        a = actors[row["actor"]]
        assert row["received"] == row["sent"] == a["sent"] == 16 * (a["chunks"] - 1) + 3 * row["actor"]
        assert row["checksum_ok"] and row["seqs_exact"] and row["chunks"] == a["chunks"]
        assert row["weights_versions"] >= 1
    assert all(a["versions_increasing"] for a in actors.values())


def test_train_dqn_api_stops_on_its_episode_budget(tmp_path):
    """train_dqn(n_episodes, num_workers, episodes_per_batch, learning_steps_per_batch) under mpirun -n 3."""
    res = ok(mpirun(3, [f"{SCRIPTS}/train_dqn_api.py", str(tmp_path / "run")], timeout=180))
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1  # the learner returns its metrics, actors None
    m = rows[0]
    # stopped soon after the budget whatever the learner's pace: credit holds each actor to 4 chunks unacknowledged
    # (+1 being filled) of 32 transitions, 2 of toy-cue's 16-step episodes each, so at most about 2 x 5 x 2 = 20 late
    assert 300 <= m["episodes"] < 300 + 2 * 8 * 4
    assert m["total_timesteps"] < 24000  # long before dqn_toy.yaml's step budget
    assert m["transitions_sent"] == m["transitions_received"]
    # 8 updates per 4 episodes, minus warm-up: the learner follows the episode-based budget
    assert 0.5 * 2 * m["episodes"] <= m["updates"] <= 2 * m["episodes"]


def test_train_dqn_api_rejects_a_worker_count_that_is_not_the_job(tmp_path):
    import sys as _sys

    from conftest import run as run_cmd
    script = ("from mpippo import train_dqn; train_dqn(n_episodes=10, num_workers=5, "
              "config='configs/dqn_toy.yaml', output_dir=%r)" % str(tmp_path / "r"))
    res = run_cmd([MPIRUN, "--oversubscribe", "-n", "3", _sys.executable, "-c", script], timeout=60)
    assert res.returncode == 2 and error_lines(res.stderr) == [
        "mpippo: error: num_workers: 5 actor rank(s), but this job has 3 rank(s), a learner and 2 actor(s); allowed: 2, "
        "or a job of 6 ranks (mpirun -n 6)"], res.stderr[-2000:]


def test_two_train_dqn_calls_leave_the_callers_process_as_it_was(tmp_path):
    """Signal handlers given back, the stop flag cleared, the run folder's lock let go: a Ctrl-C between
    two calls is the caller's KeyboardInterrupt, the second call trains, and the first run's folder
    resumes from the command line while the script lives on."""
    res = ok(mpirun(2, [f"{SCRIPTS}/train_dqn_api_twice.py", str(tmp_path / "a"), str(tmp_path / "b")], timeout=240))
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and [r["first"] for r in rows].count(True) == 1, res.stdout[-2000:]
    for r in rows:
        assert r["handler_back"] and r["held"] == [] and r["interrupted"], r
    assert [r["second"] for r in rows].count(True) == 1


def test_an_exception_a_train_dqn_caller_catches_still_ends_the_job_at_once(tmp_path):
    """Fail-stop through the API: the actor's failure ends the job naming its rank (an injected fault, a bug's
    kind: its traceback), though the script catches it; the learner is not left waiting for the watchdog."""
    from conftest import run as run_cmd
    env = {"MPIPPO_FAULT": "rank=1,kind=raise,iteration=300"}
    res = run_cmd([MPIRUN, "--oversubscribe", "-n", "2", sys.executable, f"{SCRIPTS}/train_dqn_api_caught.py",
                   str(tmp_path / "r")], timeout=120, env=env)
    assert res.returncode != 0 and "the script went on" not in res.stdout, res.stdout[-2000:]
    assert "[rank 1]" in res.stderr and "InjectedFault: injected fault on rank 1" in res.stderr, res.stderr[-2000:]


def test_train_dqn_with_the_callers_stdout_closed_trains_and_returns(tmp_path):
    """A closed sys.stdout had ended rank 0 at its first line (ValueError: I/O operation on closed file) and
    left the actor hung; the call now writes its lines nowhere and gives the caller's stream back."""
    res = ok(mpirun(2, [f"{SCRIPTS}/train_dqn_api_closed_stdout.py", str(tmp_path / "r")], timeout=180))
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["learner"] for r in rows) == [False, True] and all(r["stdout_still_closed"] for r in rows), \
        res.stdout[-2000:] + res.stderr[-2000:]
