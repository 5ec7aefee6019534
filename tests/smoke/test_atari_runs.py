"""atari:<Game> through the real CLI with the shipped configs, shrunk to seconds: PPO on 2 ranks
(the Nature CNN), its resume (fresh games, said), evaluate on the real game with a video; Ape-X DQN
and APPO in the actor-learner layout. Learning on Atari is measured by analysis/, not here."""
import json
import sys

from conftest import metrics, ok, run, trainer

SMALL = ["--no-progress", "--set", "logging.tensorboard=false", "--set", "env.name=atari:Pong"]


def clean(res):
    """A job that ended well and said nothing of ale-py's native objects: one still alive at the
    interpreter's end (a frozen start-up cycle holding an env) makes nanobind print ~30 lines of leaks."""
    ok(res)
    assert "nanobind: leaked" not in res.stderr + res.stdout, res.stderr[-2000:]
    return res


def test_ppo_on_atari_trains_resumes_with_fresh_games_and_evaluates_the_real_game(tmp_path):
    run_dir = tmp_path / "run"
    ppo = ["--config", "configs/ppo_atari.yaml", *SMALL, "--set", "env.num_envs=4", "--n-steps", "32",
           "--output-dir", str(run_dir)]
    clean(trainer(2, [*ppo, "--total-timesteps", "256"], timeout=300))
    m = metrics(run_dir)
    assert m["env"] == "atari:Pong" and m["world_size"] == 2 and m["total_timesteps"] == 256
    # the defaults named (noop_max 30, no sticky actions) are the same game, not another job
    res = clean(trainer(2, [*ppo, "--resume", "--total-timesteps", "512", "--set", "env.kwargs.noop_max=30",
                            "--set", "env.kwargs.repeat_action_probability=0.0"], timeout=300))
    assert "atari:Pong's envs cannot save their state" in res.stdout and metrics(run_dir)["total_timesteps"] == 512
    out = tmp_path / "eval.json"
    clean(run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "1",
            "--json", str(out), "--video", str(tmp_path / "pong.mp4")], 300))
    r = json.loads(out.read_text())
    # one real game: to 21 points, over every life (Pong has one), unclipped; a random policy loses it
    assert r["episodes"] == 1 and -21 <= r["return_mean"] <= 21 and r["length_mean"] > 500
    assert sum(p["episodes"] for p in r["by_start_parity"].values()) == 1  # the game's phase, counted once
    assert (tmp_path / "pong.mp4").stat().st_size > 10_000


def test_ape_x_dqn_and_appo_run_on_atari_in_the_actor_learner_layout(tmp_path):
    tiny = ["--set", "training.precision=fp32", "--set", "env.num_envs=4"]
    clean(trainer(2, ["--config", "configs/dqn_atari.yaml", *SMALL, *tiny, "--total-timesteps", "1200",
                   "--set", "dqn.learning_starts=600", "--set", "dqn.batch_size=32", "--set", "dqn.buffer_size=2000",
                   "--output-dir", str(tmp_path / "dqn")], timeout=300))
    clean(trainer(2, ["--config", "configs/appo_atari.yaml", *SMALL, *tiny, "--total-timesteps", "1024",
                   "--set", "appo.rollout_length=32", "--set", "appo.batch_segments=4",
                   "--output-dir", str(tmp_path / "appo")], timeout=300))
    for algo in ("dqn", "appo"):
        m = metrics(tmp_path / algo)
        assert m["algo"] == algo and m["env"] == "atari:Pong" and m["num_actors"] == 1
        assert m["transitions_sent"] == m["transitions_received"] >= 1024
