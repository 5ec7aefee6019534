"""A sync run resumed on another world size (resume.plan): with the same total env count the envs'
states are re-sharded and every episode in progress continues (toy-cue: its step counters and
cues are visible); with another total the envs start fresh with one warning; the RNG streams are
re-derived from the seed, the rank and the iteration, so two resumes run alike."""
import shutil
import sys

import numpy as np
import pytest
import torch

from conftest import mpirun, ok, run, trainer

pytestmark = pytest.mark.mpi
# toy-cue, 8 envs in all, 6 steps an iteration: after 3 iterations every episode (16 steps) is at
# step 2 of its second, after 4 at step 8: in progress at each checkpoint
TINY = ["--config", "configs/toy_cue.yaml", "--set", "env.num_envs=8", "--n-steps", "6",
        "--set", "training.n_epochs=1", "--set", "training.num_minibatches=1",
        "--set", "checkpoint.interval_iterations=1", "--no-progress"]
ENV_ROWS = ("cue", "t", "rew", "first")  # toy-cue's per-env state (envs/toy.py PER_ENV)
RUNNER_ROWS = ("obs", "first", "ret_tracker", "ep_ret", "ep_len")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("elsewhere") / "run2"
    ok(trainer(2, TINY + ["--total-timesteps", str(3 * 48), "--output-dir", str(run_dir)]))
    return run_dir


def latest(run_dir) -> dict:
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)


def per_env(ranks: list[dict]) -> dict:
    """Every per-env row of the job, joined in rank order."""
    rows = {k: np.concatenate([r[k] for r in ranks]) for k in RUNNER_ROWS}
    rows.update({f"env.{k}": np.concatenate([r["env"][k] for r in ranks]) for k in ENV_ROWS})
    return rows


def assert_same_envs(before: list[dict], after: list[dict]) -> None:
    a, b = per_env(before), per_env(after)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def assert_equal(a, b, path="") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=path)
    else:
        assert a == b, path


def resumed(run_dir, ranks: int, out, *sets: str) -> dict:
    """Every rank's state right after the trainer resumed `run_dir` on `ranks` ranks."""
    args = ["tests/mpi/scripts/resume_states.py", str(run_dir), str(out), *sets]
    ok(mpirun(ranks, args) if ranks > 1 else run([sys.executable, *args], timeout=120))
    return torch.load(out, weights_only=False)


def test_two_ranks_resumed_on_one_continue_every_episode(two_ranks, tmp_path):
    before = latest(two_ranks)["ranks"]
    after = resumed(two_ranks, 1, tmp_path / "states.pt")
    assert after["note"].startswith("note: resumed on 1 rank(s) from 2: ") and "warning" not in after["note"]
    assert "8 env states (episodes in progress) carried over; RNG streams re-derived" in after["note"]
    assert_same_envs(before, after["ranks"])
    assert (after["ranks"][0]["ep_len"] == 2).all() and (after["ranks"][0]["env"]["t"] == 2).all()
    assert after["ranks"][0]["episodes_total"] == sum(r["episodes_total"] for r in before) == 8


def test_one_rank_resumed_on_two_continues_and_two_resumes_run_alike(two_ranks, tmp_path):
    """The 2-rank run resumed on 1 rank for an iteration, twice, by the CLI: the same result (the
    re-derived RNG streams); that 1-rank checkpoint resumed on 2 ranks continues its episodes."""
    ends = []
    for name in ("a", "b"):
        shutil.copytree(two_ranks, tmp_path / name)
        res = ok(trainer(None, TINY + ["--resume", "--total-timesteps", str(4 * 48), "--output-dir", str(tmp_path / name)]))
        assert res.stdout.count("mpippo: note: resumed on 1 rank(s) from 2: model, optimizer") == 1, res.stdout
        ends.append(latest(tmp_path / name))
    assert ends[0]["world_size"] == 1 and ends[0]["timesteps"] == 4 * 48
    for key in ("model", "optimizer", "ranks"):
        assert_equal(ends[0][key], ends[1][key], key)
    after = resumed(tmp_path / "a", 2, tmp_path / "states.pt")
    assert after["note"].startswith("note: resumed on 2 rank(s) from 1: ")
    assert_same_envs(ends[0]["ranks"], after["ranks"])
    assert [len(r["first"]) for r in after["ranks"]] == [4, 4] and (per_env(after["ranks"])["env.t"] == 8).all()
    assert not torch.equal(after["ranks"][0]["rng"]["torch"], after["ranks"][1]["rng"]["torch"])  # a stream each


def test_another_total_env_count_starts_fresh_with_one_warning(two_ranks, tmp_path):
    after = resumed(two_ranks, 1, tmp_path / "states.pt", "env.num_envs=4")
    note = after["note"]
    assert note.count("warning:") == 1 and note.startswith("warning: checkpoint was written by 2 rank(s), this job has 1")
    assert "the checkpoint's 8 env states do not fit this job's 4 envs: they start fresh" in note
    r = after["ranks"][0]
    assert (r["env"]["t"] == 0).all() and (r["ep_len"] == 0).all() and r["first"].all()
    assert r["episodes_total"] == 8  # the episode statistics carry over all the same


def test_a_config_saved_with_the_launch_guard_resumes_on_another_world_size(two_ranks, tmp_path):
    """config.yaml as code of before saved it, with the guard of its launch (2 ranks): the resume of
    that run on 1 rank reads its own config without it, and goes on."""
    import yaml
    shutil.copytree(two_ranks, tmp_path / "run")
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    cfg["parallel"]["expected_world_size"] = 2
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    res = ok(trainer(None, ["--resume", "--no-progress", "--total-timesteps", str(4 * 48),
                            "--output-dir", str(tmp_path / "run")]))
    assert "expected_world_size" not in res.stdout + res.stderr
    assert latest(tmp_path / "run")["world_size"] == 1 and latest(tmp_path / "run")["timesteps"] == 4 * 48
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["parallel"]["expected_world_size"] is None


def test_a_plain_resume_on_another_world_size_keeps_the_total_and_derives_the_rest_again(two_ranks, tmp_path):
    """`--resume` alone reads the run's config.yaml, which keeps what the job derived from its size and
    machine as asked: the 8 envs of 2 ranks x 4 run as 1 x 8 with every episode carried over (a frozen
    4 per rank had halved the job), and auto precision and threads are settled again here."""
    import json

    import yaml
    shutil.copytree(two_ranks, tmp_path / "run")
    res = ok(trainer(None, ["--resume", "--no-progress", "--total-timesteps", str(4 * 48),
                            "--output-dir", str(tmp_path / "run")]))
    assert "8 env states (episodes in progress) carried over" in res.stdout, res.stdout
    m = json.loads((tmp_path / "run" / "benchmark_metrics.json").read_text())
    assert (m["world_size"], m["num_envs"], m["num_envs_per_rank"]) == (1, 8, 8)
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (cfg["env"]["num_envs"], cfg["env"]["num_envs_per_rank"]) == (8, None)
    assert (cfg["training"]["precision"], cfg["parallel"]["threads_per_rank"]) == ("auto", 0)
