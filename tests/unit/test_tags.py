"""The TensorBoard tags: CleanRL's names where it has one, and old runs' logs still read."""
import numpy as np
import pytest

from mpippo.metrics import tags
from mpippo.runs import read_curve


def test_the_episode_charts_and_losses_have_cleanrls_names():
    # CleanRL's ppo.py writes these: one chart holds both tools' curves
    assert tags.chart("episode_return") == "charts/episodic_return"
    assert tags.chart("episode_length") == "charts/episodic_length"
    assert {tags.loss(q) for q in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "explained_variance")} == {
        "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
        "losses/explained_variance"}
    every = [t for table in (tags.CHARTS, tags.LOSSES, tags.LEARNER) for t, _ in table.values()]
    assert not set(tags.FORMER.values()) & set(every)  # a former name is never written again


@pytest.mark.parametrize("tag", ["charts/episodic_return", "charts/episode_return"])
def test_a_runs_curve_reads_todays_tag_and_the_former_one(tmp_path, tag):
    from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(str(tmp_path / "logs"))
    for step, value in ((256, 1.0), (512, 3.0)):
        w.add_scalar(tag, value, step)
    w.add_scalar("charts/steps_per_s", 9.0, 512)  # no return in it: never taken for the curve
    w.close()
    steps, returns, _ = read_curve(tmp_path / "logs")
    assert steps.tolist() == [256, 512] and np.allclose(returns, [1.0, 3.0])
    assert tags.readable(tags.chart("episode_return")) == ("charts/episodic_return", "charts/episode_return")


def test_a_resumed_runs_curve_keeps_the_redone_steps_and_says_nothing(tmp_path, caplog):
    """A run resumed from its checkpoint at step 768 logs 768 and 1,024 again: the curve holds the
    second life's values there (the first life's later events are stale), and TensorBoard's warning of
    "a TensorFlow restart" does not reach the tools' output."""
    from torch.utils.tensorboard import SummaryWriter
    for life, steps in ((0.0, (256, 512, 768, 1024)), (10.0, (768, 1024, 1280))):
        w = SummaryWriter(str(tmp_path / "logs"), purge_step=steps[0] if life else None)  # as metrics.sinks
        for step in steps:
            w.add_scalar(tags.chart("episode_return_mean"), life + step / 256, step)
        w.close()  # (the file's name, its second and then the writer's count, orders the two lives)
    steps, returns, _ = read_curve(tmp_path / "logs")
    assert steps.tolist() == [256, 512, 768, 1024, 1280]
    assert returns.tolist() == [1.0, 2.0, 13.0, 14.0, 15.0]
    assert not [r for r in caplog.records if "restart" in r.getMessage()]  # pytest's handler takes stderr's place
