"""APPO on the actor-learner layout, run for real (3 ranks: a learner and two actors on toy-cue):
the policy lag is counted and bounded, signals checkpoint and stop every rank, a resume continues
the counters and the budget exactly, and the checkpoint evaluates like a PPO one."""
import json
import signal
import subprocess
import sys

import pytest
import torch

from conftest import (MPIRUN, ROOT, finish, learner_line_by, metrics, mpi_env, ok, relaunched, run, start, trainer,
                      wait_for_line)

pytestmark = pytest.mark.slow  # 3-rank runs of 10-40 s: left out by make test-fast

APPO = ["--config", "configs/appo_toy.yaml", "--no-progress"]
SEGMENTS = 40960 // 16  # the config's budget in segments of 16 steps


def appo_run(tmp_path, *extra, fault: str | None = None, timeout=180):
    env = mpi_env() | ({"MPIPPO_FAULT": fault} if fault else {})
    cmd = [MPIRUN, "--oversubscribe", "-n", "3", sys.executable, "run_mpi.py", *APPO, "--output-dir", str(tmp_path),
           *extra]
    res = relaunched(lambda: subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout))
    assert res.returncode == 0, res.stderr[-3000:]
    return metrics(tmp_path)


@pytest.mark.alone  # how stale segments get depends on the ranks' relative speed
def test_stale_segments_are_counted_dropped_and_never_trained_on(tmp_path):
    """Weights go out only every 4 updates, so with what is in flight actors collect with weights
    up to 6 updates old; with max_policy_lag 4 the older segments are dropped. Every segment is
    either trained on or counted as dropped, and the run still learns."""
    m = appo_run(tmp_path / "stale", "--set", "appo.weight_sync_period=4", "--set", "appo.max_policy_lag=4")
    lag = m["policy_lag"]
    assert m["transitions_sent"] == m["transitions_received"] == 40960
    assert lag["segments_accepted"] + lag["segments_dropped"] == SEGMENTS == sum(lag["histogram"])
    assert sum(lag["histogram"][5:]) > 0 and lag["segments_dropped"] >= sum(lag["histogram"][5:])
    assert m["episode_return_mean"] >= 12.0
    assert m["updates"] == lag["segments_accepted"] // 32 or m["updates"] == lag["segments_accepted"] // 32 - 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "stale" / "logs"), size_guidance={"histograms": 0})
    acc.Reload()
    assert "learner/policy_lag" in acc.Tags()["histograms"]
    assert acc.Scalars("learner/segments_dropped")[-1].value > 0


@pytest.mark.alone
def test_a_slow_learner_does_not_make_segments_staler(tmp_path):
    """The learner sleeps 1 s in each of 6 updates. Actors wait for credit instead of collecting
    ahead, so the lag stays within what credit lets be in flight (2 actors x 4 chunks x 8
    segments = 2 batches), plus one weight sync: nothing is dropped at the default bound."""
    m = appo_run(tmp_path / "slow", fault="rank=0,iteration=10,kind=slow,seconds=1.0,count=6")
    lag = m["policy_lag"]
    assert m["transitions_sent"] == m["transitions_received"] == 40960
    assert lag["segments_dropped"] == 0 and max(i for i, n in enumerate(lag["histogram"]) if n) <= 2 + 1 + 1
    assert m["longest_credit_hold_s"] > 0.9  # the actors did wait for the sleeping learner


def test_sigusr1_checkpoints_requeues_and_resume_finishes_the_budget_exactly(tmp_path):
    # the PPO test's budget and a fifth (the signal lands at the first log line: 17-25k steps); was twice it
    run_dir, total = tmp_path / "run", 49152
    proc = start([MPIRUN, "--oversubscribe", "-n", "3", sys.executable, "run_mpi.py", *APPO, "--total-timesteps",
                  str(total), "--output-dir", str(run_dir)], env=learner_line_by(update=20))
    wait_for_line(proc, "agent 0 |")  # learning has started: 20 of the budget's 96 updates done
    proc.send_signal(signal.SIGUSR1)
    rc, out, _ = finish(proc)
    assert rc == 3, out[-2000:]
    first = metrics(run_dir)
    assert first["stop_reason"] == "requeue" and 0 < first["total_timesteps"] < total
    # actors stop between segments: every env step counted was sent and received
    assert first["transitions_sent"] == first["transitions_received"] == first["total_timesteps"]
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    assert state["algo"] == "appo" and state["iteration"] == state["version"] == first["updates"] > 0

    res = ok(trainer(3, ["--resume", "--output-dir", str(run_dir), "--no-progress"], timeout=240))
    assert f"resuming at {first['total_timesteps']:,} env steps, {first['updates']:,} updates" in res.stdout
    final = metrics(run_dir)
    assert final["stop_reason"] == "done" and final["resumes"] == 1
    assert final["total_timesteps"] == total  # the budget is whole segments: exact over both parts
    assert final["transitions_received"] == total - first["total_timesteps"]
    assert final["updates"] > first["updates"] and final["episode_return_mean"] >= 12.0
    # once more, at its budget, other settings given: nothing trains, and config.yaml keeps the settings that ran
    config = (run_dir / "config.yaml").read_bytes()
    ok(trainer(3, ["--resume", "--output-dir", str(run_dir), "--no-progress", "--set", "training.learning_rate=0.1"]))
    assert (run_dir / "config.yaml").read_bytes() == config


def test_an_appo_checkpoint_evaluates_like_a_ppo_one(tmp_path):
    run_dir = tmp_path / "run"
    appo_run(run_dir, "--total-timesteps", "4096")
    out = tmp_path / "eval.json"
    ok(run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "4",
            "--json", str(out)], timeout=120))
    res = json.loads(out.read_text())
    assert res["algo"] == "appo" and res["env"] == "toy-cue" and res["episodes"] >= 4
