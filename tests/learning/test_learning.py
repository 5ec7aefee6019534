"""PPO must actually learn: a broken update (no gradient averaging, wrong sign, bad
advantages) stays near the uniform policy's return of 4 on toy-cue."""
import pytest

from conftest import metrics, ok, trainer

pytestmark = pytest.mark.slow


def test_two_rank_ppo_learns_toy_cue(tmp_path):
    run_dir = tmp_path / "run"
    ok(trainer(2, ["--config", "configs/toy_cue.yaml", "--output-dir", str(run_dir), "--no-progress"], timeout=300))
    m = metrics(run_dir)
    assert m["world_size"] == 2 and m["total_timesteps"] == 40960
    assert m["episode_return_mean"] >= 12.0, m["episode_return_mean"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    curve = [e.value for e in acc.Scalars("charts/episode_return")]
    assert len(curve) == 40 and curve[0] < 8.0 < curve[-1]  # the logged curve shows the learning


def test_apex_dqn_on_three_ranks_learns_toy_cue(tmp_path):
    """1 learner + 2 actors. Acting with the Ape-X epsilons (0.4 and 0.4^8), a perfect policy
    averages about 13.6 over the two actors and a uniform one 4."""
    run_dir = tmp_path / "run"
    res = ok(trainer(3, ["--config", "configs/dqn_toy.yaml", "--output-dir", str(run_dir)], timeout=300))
    m = metrics(run_dir)
    assert m["algo"] == "dqn" and m["num_actors"] == 2
    assert m["transitions_sent"] == m["transitions_received"] == 24000  # nothing lost, nothing duplicated
    assert m["episode_return_mean"] >= 10.0, m["episode_return_mean"]
    assert 1.0 <= m["replay_ratio"] <= 2.2  # the learner kept to its replay ratio (2.0) without starving
    assert "learner on cpu" in res.stdout
    assert (run_dir / "checkpoints" / "latest.pt").exists()


def test_two_dqn_agents_in_one_job_train_independently(tmp_path):
    import torch
    run_dir = tmp_path / "run"
    ok(trainer(6, ["--config", "configs/dqn_toy.yaml", "--output-dir", str(run_dir), "--set", "dqn.num_agents=2",
                   "--total-timesteps", "12000", "--set", "logging.tensorboard=false"], timeout=300))
    a0, a1 = metrics(run_dir / "agent_0"), metrics(run_dir / "agent_1")
    assert (a0["agent"], a1["agent"]) == (0, 1) and a0["num_actors"] == a1["num_actors"] == 2
    for m in (a0, a1):
        assert m["transitions_sent"] == m["transitions_received"] == 6000
    w0 = torch.load(run_dir / "agent_0" / "checkpoints" / "latest.pt", weights_only=False)["model"]
    w1 = torch.load(run_dir / "agent_1" / "checkpoints" / "latest.pt", weights_only=False)["model"]
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)  # separate learners, separate weights
