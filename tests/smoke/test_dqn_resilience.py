"""DQN never loses a run either: signals checkpoint (with the replay buffer) and stop every rank
of the agent; a resume continues counters, budgets and the buffer; a crash resumes from the
last periodic checkpoint."""
import signal
import sys

import numpy as np
import pytest
import torch

from conftest import MPIRUN, finish, learner_line_by, metrics, ok, rank_processes, start, trainer, wait_for_line

pytestmark = pytest.mark.slow

DQN = ["--config", "configs/dqn_toy.yaml", "--no-progress"]
TOTAL = 30000  # 2 actors x 8 envs: budgets are whole actor steps of 16 env steps (learns toy-cue by 24,000)


def load(run_dir):
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)


def test_sigusr1_checkpoints_replay_requeues_and_resume_finishes_the_budget(tmp_path, monkeypatch):
    """... and a resume whose replay takes longer to load than the progress guard's timeout is not
    taken for a hung learner (it keeps the actors' guard fed while it loads)."""
    run_dir = tmp_path / "run"
    proc = start([MPIRUN, "--oversubscribe", "-n", "3", sys.executable, "run_mpi.py", *DQN, "--total-timesteps", str(TOTAL),
                  "--output-dir", str(run_dir), "--set", "dqn.save_replay=true"], env=learner_line_by(update=200))
    wait_for_line(proc, "agent 0 |")  # learning has started: 200 of the budget's ~900 updates done
    proc.send_signal(signal.SIGUSR1)
    rc, out, _ = finish(proc)
    assert rc == 3, out[-2000:]
    assert "stopped by SIGUSR1 after a checkpoint" in out
    first = metrics(run_dir)
    assert first["stop_reason"] == "requeue" and first["transitions_sent"] == first["transitions_received"]
    assert 0 < first["total_timesteps"] < TOTAL
    state = load(run_dir)
    assert state["timesteps"] == first["total_timesteps"] and state["iteration"] == first["updates"] > 0
    with np.load(run_dir / "checkpoints" / state["replay_file"]) as z:
        assert int(z["tag"]) == state["iteration"] and int(z["size"]) == first["replay_size"] > 0

    monkeypatch.setenv("MPIPPO_FAULT", "rank=0,kind=slow_restore,seconds=8")  # the learner's restore: 8 s
    res = ok(trainer(3, ["--resume", "--output-dir", str(run_dir), "--no-progress",
                         "--set", "guards.collective_timeout_s=4"], timeout=180))
    assert f"resuming at {first['total_timesteps']:,} env steps" in res.stdout
    assert f"restored replay of {first['replay_size']:,} transitions" in res.stdout
    final = metrics(run_dir)
    assert final["stop_reason"] == "done" and final["resumes"] == 1
    assert TOTAL - 16 < final["total_timesteps"] <= TOTAL  # the budget counts both segments
    assert final["transitions_sent"] == final["transitions_received"] == final["total_timesteps"] - first["total_timesteps"]
    assert final["updates"] > first["updates"] and load(run_dir)["iteration"] == final["updates"]
    assert final["episode_return_mean"] >= 10.0, final["episode_return_mean"]  # still learns across the restart


def test_sigterm_to_one_actor_stops_the_whole_agent_with_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = start([MPIRUN, "--oversubscribe", "-n", "3", sys.executable, "run_mpi.py", *DQN, "--total-timesteps", "1000000",
                  "--output-dir", str(run_dir)])
    wait_for_line(proc, "agent 0 |")
    ranks = rank_processes(proc)
    assert len(ranks) == 3
    ranks[-1].send_signal(signal.SIGTERM)  # one actor; the learner hears of it in its STOP message
    rc, out, _ = finish(proc)
    assert rc == 4, out[-2000:]
    m = metrics(run_dir)
    assert m["stop_reason"] == "stopped" and m["transitions_sent"] == m["transitions_received"] > 0
    assert load(run_dir)["iteration"] == m["updates"]


def test_crash_resumes_from_the_last_periodic_checkpoint(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setenv("MPIPPO_FAULT", "rank=2,iteration=600,kind=kill")  # an actor dies at its step 600
    res = trainer(3, DQN + ["--total-timesteps", "16000", "--output-dir", str(run_dir),
                            "--set", "dqn.checkpoint_interval_updates=50"], timeout=120)
    assert res.returncode not in (0, 2, 3, 4)
    state = load(run_dir)
    assert state["iteration"] > 0 and state["iteration"] % 50 == 0 and 0 < state["timesteps"] < 16000
    monkeypatch.delenv("MPIPPO_FAULT")
    res = ok(trainer(3, ["--resume", "--output-dir", str(run_dir), "--no-progress"], timeout=180))
    assert "replay file not used" not in res.stdout  # save_replay is off: nothing to restore, no warning
    m = metrics(run_dir)
    assert 16000 - 16 < m["total_timesteps"] <= 16000 and m["updates"] > state["iteration"]
    assert m["transitions_sent"] == m["transitions_received"]
