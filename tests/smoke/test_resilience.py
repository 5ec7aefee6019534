"""Never lose a run: exact resume, signals, fail-stop, guards, damaged checkpoints."""
import re
import signal
import sys

import pytest
import torch

from conftest import (MPIRUN, SMOKE_TOY, error_lines, fault_stamp, finish, ok, rank_processes, seconds_since, start,
                      trainer, wait_for_line)

# starpilot ends random-play episodes quickly and with non-zero returns, so curves are informative
pytestmark = pytest.mark.slow

FAST = ["--config", "configs/smoke.yaml", "--set", "env.name=starpilot", "--no-progress"]
K_STEPS = 8 * 256  # 8 iterations of 2 ranks x 4 envs x 32 steps
PLUMBING = SMOKE_TOY + ["--no-progress"]  # the same iterations where the game is not the point


def load(run_dir):
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)


def scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def assert_same_training_state(a, b):
    assert a["iteration"] == b["iteration"] and a["timesteps"] == b["timesteps"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for p in sa:
        for k in sa[p]:
            assert torch.equal(sa[p][k], sb[p][k]), (p, k)
    assert a["ret_rms"] == b["ret_rms"]


def assert_same_curves(run_a, run_b):
    for tag in ("charts/episodic_return", "losses/policy_loss", "losses/value_loss", "charts/episode_return_mean"):
        ca, cb = scalars(run_a, tag), scalars(run_b, tag)
        assert ca == cb, tag  # same steps (no duplicates after the resume) and identical values
    returns = [v for _, v in scalars(run_a, "charts/episodic_return")]
    assert len(returns) >= 4 and any(v != 0 for v in returns)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """K iterations without interruption."""
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    ok(trainer(2, FAST + ["--total-timesteps", str(K_STEPS), "--output-dir", str(run_dir)]))
    return run_dir


def test_bit_exact_resume_after_stop_by_step_count(reference_run, tmp_path):
    run_dir = tmp_path / "run"
    ok(trainer(2, FAST + ["--total-timesteps", str(K_STEPS // 2), "--output-dir", str(run_dir)]))
    res = ok(trainer(2, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", str(K_STEPS), "--no-progress"]))
    assert "resuming at 1,024 steps" in res.stdout and "warning" not in res.stdout
    assert_same_training_state(load(reference_run), load(run_dir))
    assert_same_curves(reference_run, run_dir)


def test_sigusr1_mid_iteration_checkpoints_requeues_and_resumes_exactly(reference_run, tmp_path):
    run_dir = tmp_path / "run"
    proc = start([MPIRUN, "-n", "2", sys.executable, "run_mpi.py", *FAST, "--total-timesteps", str(K_STEPS),
                  "--output-dir", str(run_dir), "--set", "logging.print_interval=1",
                  "--set", "checkpoint.interval_iterations=0"], env={"MPIPPO_FAULT": "rank=0,iteration=2,kind=slow,seconds=2,count=6"})
    wait_for_line(proc, "iter     1")
    proc.send_signal(signal.SIGUSR1)  # to mpirun, which forwards it; lands mid-iteration (rank 0 sleeps 2 s in each of
    # iterations 2-7: a forwarding slow on a loaded machine still lands before the run's end)
    rc, out, _ = finish(proc)
    assert rc == 3, out[-2000:]
    assert "stopped by SIGUSR1" in out
    stopped_at = load(run_dir)["iteration"]
    assert 2 <= stopped_at < 8
    ok(trainer(2, ["--resume", "--output-dir", str(run_dir), "--no-progress"]))
    assert_same_training_state(load(reference_run), load(run_dir))
    assert_same_curves(reference_run, run_dir)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_through_the_launcher_checkpoints_and_stops(tmp_path, sig):
    run_dir = tmp_path / "run"
    proc = start([sys.executable, "-m", "mpippo.launch", "-n", "2", "--mpirun-args=--oversubscribe", *PLUMBING,
                  "--total-timesteps", "100000", "--output-dir", str(run_dir), "--set", "logging.print_interval=1",
                  "--set", "checkpoint.interval_iterations=0"])
    wait_for_line(proc, "iter     1")
    proc.send_signal(sig)
    rc, out, _ = finish(proc)
    assert rc == 4, out[-2000:]
    assert "stopped by a signal after a checkpoint" in out
    assert load(run_dir)["iteration"] >= 2


def test_a_second_ctrl_c_to_the_launcher_stops_the_job_at_once_with_its_line_and_130(tmp_path):
    """The launcher passes a second Ctrl-C on as SIGTERM, on which mpirun SIGKILLs the ranks before
    any can say a word (mpirun's exit 1): the launcher says the line and exits 130, as a rank would.
    Rank 0 sleeps 3 s in each iteration from the second: the gentle stop is still pending."""
    import time
    run_dir = tmp_path / "run"
    proc = start([sys.executable, "-m", "mpippo.launch", "-n", "2", "--mpirun-args=--oversubscribe", *PLUMBING,
                  "--total-timesteps", "100000", "--output-dir", str(run_dir), "--set", "logging.print_interval=1"],
                 env={"MPIPPO_FAULT": "rank=0,iteration=2,kind=slow,seconds=3,count=6"})
    wait_for_line(proc, "iter     1")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rc, out, err = finish(proc)
    assert rc == 130, out[-2000:] + err[-2000:]
    assert err.count("stopped at once by a second Ctrl-C") == 1, err[-2000:]
    assert "Traceback" not in out + err


def test_a_suspended_job_goes_on_and_sigterm_to_a_single_rank_stops_all_ranks_cleanly(tmp_path):
    """Rank 1 comes 11 s late to the trainer's construction (a slow import), longer than the 8-s
    collective timeout: start-up's collectives wait longer (runctl.STARTUP_TIMEOUT_S). Then the job is
    stopped for longer than the timeout (SIGSTOP: Ctrl-Z, Slurm's suspend), rank 1 a second before
    rank 0 and continued 0.5 s after it, so that rank 0 waits for it in a collective: the time stopped
    is not taken for a hang. Then SIGTERM to one rank stops both with a checkpoint."""
    import time
    run_dir = tmp_path / "run"
    proc = start([MPIRUN, "-n", "2", sys.executable, "run_mpi.py", *PLUMBING, "--total-timesteps", "100000",
                  "--output-dir", str(run_dir), "--set", "logging.print_interval=1",
                  "--set", "guards.collective_timeout_s=8"], env={"MPIPPO_FAULT": "rank=1,kind=slow_start,seconds=11"})
    wait_for_line(proc, "iter     1")
    ranks = rank_processes(proc)
    assert len(ranks) == 2
    ranks[1].suspend()
    time.sleep(1)
    ranks[0].suspend()
    time.sleep(10)
    ranks[0].resume()  # first: it finds itself 11 s into its wait, of which 1 s is rank 1's
    time.sleep(0.5)  # (rank 1 then has 6.5 s of the timeout to reach the collective, on a loaded machine too)
    ranks[1].resume()
    time.sleep(2)
    ranks[-1].send_signal(signal.SIGTERM)  # only one rank hears it; the flag Allreduce tells the other
    rc, out, _ = finish(proc)
    assert rc == 4, out[-2000:]
    assert load(run_dir)["iteration"] >= 2


@pytest.mark.alone
@pytest.mark.parametrize("kind", ["raise", "kill", "hang"])
def test_fault_on_one_rank_ends_the_job_within_30s_and_latest_loads(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("MPIPPO_FAULT", f"rank=1,iteration=3,kind={kind}")
    stamp = fault_stamp(monkeypatch, tmp_path)
    run_dir = tmp_path / "run"
    res = trainer(2, PLUMBING + ["--total-timesteps", "100000", "--output-dir", str(run_dir),
                             "--set", "guards.collective_timeout_s=5"], timeout=90)
    assert res.returncode not in (0, 2, 3, 4), res.returncode
    assert seconds_since(stamp) < 30
    if kind == "raise":
        assert "[rank 1]" in res.stderr and "InjectedFault" in res.stderr
    if kind == "hang":
        # rank 0 waits in a collective; the watchdog asks rank 1 where it is, then aborts
        assert "[rank 0] collective" in res.stderr and "waited more than 5 s" in res.stderr
        assert "ranks that did not arrive: [1]" in res.stderr
        busy = re.search(r"rank 1: not in a collective for (\d+) s", res.stderr)  # stuck in its own work that long
        assert busy and int(busy[1]) >= 4, res.stderr[-2000:]
        # ... and rank 1 says where it is (here in the fault's own sleep: a user's env would be named instead)
        assert re.search(r"\[rank 1\] rank 0 waits for this rank, outside collectives for \d+ s, at '[^']*faults\.py':\d+ "
                         r"in maybe_inject", res.stderr), res.stderr[-2000:]
    assert load(run_dir)["iteration"] == 2  # checkpoint of the last completed iteration


def test_one_nan_step_is_skipped_and_k_in_a_row_abort(tmp_path, monkeypatch):
    monkeypatch.setenv("MPIPPO_FAULT", "rank=1,iteration=2,kind=nan,count=1")
    run_dir = tmp_path / "one"
    # replicas checked each update
    ok(trainer(2, PLUMBING + ["--total-timesteps", "1024", "--output-dir", str(run_dir)]))
    assert [v for _, v in scalars(run_dir, "charts/skipped_steps")] == [0.0, 1.0, 0.0, 0.0]

    monkeypatch.setenv("MPIPPO_FAULT", "rank=1,iteration=2,kind=nan,count=3")
    run_dir = tmp_path / "three"
    res = trainer(2, PLUMBING + ["--total-timesteps", "1024", "--output-dir", str(run_dir),
                             "--set", "guards.max_nonfinite_skips=3"])
    assert res.returncode == 1
    errors = error_lines(res.stderr)
    assert len(errors) == 1 and "3 consecutive steps" in errors[0], res.stderr[-2000:]
    assert "training diverged: lower training.learning_rate, or bring the env's rewards" in errors[0], errors[0]
    assert "Traceback" not in res.stderr
    assert load(run_dir)["iteration"] == 1


def test_killed_during_checkpoint_write_leaves_previous_latest_loadable(tmp_path, monkeypatch):
    monkeypatch.setenv("MPIPPO_FAULT", "rank=0,iteration=3,kind=kill_in_save")
    run_dir = tmp_path / "run"
    res = trainer(2, PLUMBING + ["--total-timesteps", "100000", "--output-dir", str(run_dir)], timeout=90)
    assert res.returncode != 0
    assert list((run_dir / "checkpoints").glob(".ckpt_0000003.pt.*.tmp"))  # the torn write is really there
    assert load(run_dir)["iteration"] == 2
    monkeypatch.delenv("MPIPPO_FAULT")
    ok(trainer(2, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", "1024", "--no-progress"]))
    assert load(run_dir)["iteration"] == 4


def test_disk_full_during_checkpoint_is_one_line_and_keeps_previous(tmp_path, monkeypatch):
    monkeypatch.setenv("MPIPPO_FAULT", "rank=0,iteration=3,kind=enospc")
    run_dir = tmp_path / "run"
    res = trainer(2, PLUMBING + ["--total-timesteps", "100000", "--output-dir", str(run_dir)], timeout=90)
    assert res.returncode == 1
    errors = error_lines(res.stderr)
    assert len(errors) == 1 and "No space left on device" in errors[0] and "previous checkpoint is intact" in errors[0]
    assert load(run_dir)["iteration"] == 2
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))  # the failed temp file was removed


def _bad_resume(run_dir, extra=()):
    res = trainer(2, ["--resume", "--output-dir", str(run_dir), "--no-progress", *extra], timeout=60)
    errors = error_lines(res.stderr)
    assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    return errors[0]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("small") / "run"
    ok(trainer(2, PLUMBING + ["--total-timesteps", "512", "--output-dir", str(run_dir)]))
    return run_dir


def test_damaged_or_foreign_checkpoints_are_refused(small_run, tmp_path):
    import shutil
    latest = small_run / "checkpoints" / "latest.pt"
    good = latest.read_bytes()

    # (a truncated file and another algorithm's name inside are the hostile table's ckpt-truncated and
    # ckpt-other-algo; here: bytes that are no checkpoint, another network, another algorithm's config)
    run = tmp_path / "garbage"
    shutil.copytree(small_run, run)
    (run / "checkpoints" / "latest.pt").write_bytes(b"not a checkpoint at all")
    assert "unreadable checkpoint" in _bad_resume(run)

    assert "model.hidden_size 128 (the checkpoint's 64)" in _bad_resume(small_run, ["--set", "model.hidden_size=128"])
    assert latest.read_bytes() == good  # refused resumes touch nothing

    assert "from algorithm 'ppo'" in _bad_resume(small_run, ["--config", "configs/dqn_toy.yaml"])
    assert latest.read_bytes() == good


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    res = trainer(2, PLUMBING + ["--output-dir", str(blocker / "run")], timeout=60)
    assert res.returncode == 2 and "cannot write to" in res.stderr


def test_resume_on_another_world_size_restores_weights_and_says_so(small_run, tmp_path):
    """A plain --resume on 1 rank of a 2-rank run: its config.yaml keeps the job's total env count, so the
    envs' states carry over (a note, no warning; a saved per-rank count had halved the job)."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    res = ok(trainer(None, ["--resume", "--output-dir", str(run), "--total-timesteps", "1024", "--no-progress"]))
    assert "warning:" not in res.stdout, res.stdout
    assert "note: resumed on 1 rank(s) from 2: " in res.stdout and "env states (episodes in progress) carried over" \
        in res.stdout, res.stdout
    state = load(run)
    assert state["world_size"] == 1 and state["timesteps"] == 1024
