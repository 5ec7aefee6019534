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
