"""Gymnasium and PettingZoo envs through the real CLI: a run, its resume on the same and on another
world size (envs that cannot save their state start fresh episodes, said in the start-up line; the
rest is exact), A2C, DQN and APPO, and self-play on a PettingZoo game."""
import json
import sys

import yaml

from conftest import MPIRUN, ROOT, error_lines, metrics, ok, run, trainer

CARTPOLE = ["--config", "configs/ppo_cartpole.yaml", "--no-progress", "--set", "logging.tensorboard=false"]


def test_a_gymnasium_run_resumes_with_fresh_episodes_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    ok(trainer(None, [*CARTPOLE, "--total-timesteps", "1024", "--output-dir", str(run_dir)]))
    first = metrics(run_dir)
    assert first["env"] == "gym:CartPole-v1" and first["total_timesteps"] == 1024
    res = ok(trainer(None, [*CARTPOLE, "--resume", "--total-timesteps", "2048", "--output-dir", str(run_dir)]))
    assert "gym:CartPole-v1's envs cannot save their state" in res.stdout and "restored exactly" in res.stdout
    assert metrics(run_dir)["total_timesteps"] == 2048 and metrics(run_dir)["episodes"] > first["episodes"]
    res = ok(trainer(2, [*CARTPOLE, "--resume", "--total-timesteps", "3072", "--output-dir", str(run_dir)]))
    assert "the envs, whose states cannot be saved, start fresh episodes" in res.stdout
    assert metrics(run_dir)["world_size"] == 2 and metrics(run_dir)["total_timesteps"] == 3072


def test_a_mujoco_run_plays_on_video_without_a_display_and_without_a_word_from_its_renderer(tmp_path):
    """evaluate --video of a MuJoCo env where there is no display (a cluster's node): Gymnasium's
    renderer tries GLFW first and falls back; MuJoCo's half-made GLFW context printed two tracebacks
    from its destructor at the end ("Exception ignored in ... GLContext.__del__")."""
    run_dir, video = tmp_path / "run", tmp_path / "hop.mp4"
    ok(trainer(None, ["--config", "configs/ppo_mujoco.yaml", "--no-progress", "--set", "env.name=gym:Hopper-v5",
                      "--total-timesteps", "2048", "--set", "logging.tensorboard=false", "--output-dir", str(run_dir)]))
    res = ok(run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "2",
                  "--video", str(video)], 120, env={"DISPLAY": "", "WAYLAND_DISPLAY": ""}))
    assert video.stat().st_size > 0 and "video" in res.stdout
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr, res.stderr[-2000:]


def test_what_mujoco_warns_of_at_start_up_is_said_once_not_once_per_rank(tmp_path):
    """Every rank makes the config's env at start-up, and MuJoCo warns each of the same thing
    (Gymnasium's HalfCheetah XML has a deprecated attribute): one line, from rank 0, also ahead of
    a refusal; rank 0's own warning is kept."""
    res = trainer(2, ["--config", "configs/ppo_mujoco.yaml", "--no-progress", "--set", "env.num_envs=0",
                      "--output-dir", str(tmp_path / "run")])
    assert res.returncode == 2 and "env.num_envs: must be > 0, got 0" in res.stderr, res.stderr[-800:]
    assert res.stderr.count("mpippo: warning: MuJoCo: compiler attribute 'settotalmass'") == 1, res.stderr[-2000:]


def test_another_env_argument_is_another_job(tmp_path):
    run_dir = tmp_path / "run"
    ok(trainer(None, [*CARTPOLE, "--total-timesteps", "512", "--output-dir", str(run_dir)]))
    res = trainer(None, [*CARTPOLE, "--resume", "--total-timesteps", "1024", "--output-dir", str(run_dir),
                         "--set", "env.kwargs={max_episode_steps: 50}"])
    assert res.returncode == 2 and "checkpoint's env arguments is {}" in res.stderr, res.stderr[-800:]
    # the constructor's default or the id's registered time limit named: the same job
    ok(trainer(None, [*CARTPOLE, "--resume", "--total-timesteps", "1024", "--output-dir", str(run_dir),
                      "--set", "env.kwargs={sutton_barto_reward: false, max_episode_steps: 500}"]))
    res = trainer(None, [*CARTPOLE, "--resume", "--total-timesteps", "1536", "--output-dir", str(run_dir),
                         "--set", "env.kwargs={sutton_barto_reward: true}"])
    assert res.returncode == 2 and "asks for {'sutton_barto_reward': True}" in res.stderr, res.stderr[-800:]


def test_a2c_trains_a_gymnasium_env_too(tmp_path):
    """The sync layout's other algorithm on the same family (continuous actions: the loss's
    log-probabilities are the Gaussian's, as PPO's)."""
    run_dir = tmp_path / "run"
    ok(trainer(None, ["--config", "configs/a2c_toy.yaml", "--no-progress", "--total-timesteps", "2048",
                      "--set", "env.name=gym:Pendulum-v1", "--set", "logging.tensorboard=false",
                      "--output-dir", str(run_dir)]))
    m = metrics(run_dir)
    assert m["algo"] == "a2c" and m["env"] == "gym:Pendulum-v1" and m["total_timesteps"] == 2048
    assert m["precision"] == "fp32" and "vector observations" in m["precision_why"]  # auto, on any CPU


def test_selfplay_dqn_runs_on_pettingzoo_connect_four(tmp_path):
    """The two-player family in the actor-learner layout (a learner and an actor): the pool's opponents,
    the action masks, the mirror and the rating games against the heuristic players, as on the built-in game."""
    run_dir = tmp_path / "run"
    res = ok(trainer(2, ["--config", "configs/dqn_selfplay.yaml", "--no-progress", "--total-timesteps", "4000",
                         "--set", "env.name=pz:connect_four_v3", "--set", "dqn.learning_starts=500",
                         "--set", "logging.tensorboard=false", "--output-dir", str(run_dir)], timeout=300))
    assert "dqn on pz:connect_four_v3" in res.stdout and "greedy win rate vs random" in res.stdout
    m = metrics(run_dir)
    assert m["env"] == "pz:connect_four_v3" and m["transitions_sent"] == m["transitions_received"] > 0
    video = tmp_path / "games.mp4"  # its games on video, the boards drawn as the built-in game's
    ok(run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "2",
            "--video", str(video)], 120))
    assert video.stat().st_size > 0


def test_dqn_trains_resumes_and_evaluates_a_gymnasium_env_in_the_actor_learner_layout(tmp_path):
    """Vector observations through the actor-learner layout (float32 in the messages and the replay;
    the MLPs), on a learner and an actor: a DQN run, its resume and evaluate's greedy episodes. (APPO's segments carry them in
    the learning file's CartPole run.)"""
    run_dir = tmp_path / "dqn"
    args = ["--config", "configs/dqn_cartpole.yaml", "--no-progress", "--set", "logging.tensorboard=false",
            "--set", "dqn.learning_starts=500", "--output-dir", str(run_dir)]
    res = ok(trainer(2, [*args, "--total-timesteps", "2000"], timeout=300))
    assert "dqn on gym:CartPole-v1, learner on cpu in fp32" in res.stdout
    m = metrics(run_dir)
    assert m["transitions_sent"] == m["transitions_received"] > 1500 and m["updates"] > 0
    ok(trainer(2, [*args, "--resume", "--total-timesteps", "4000"], timeout=300))
    assert metrics(run_dir)["total_timesteps"] >= 4000 and metrics(run_dir)["updates"] > m["updates"]
    res = ok(run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "4"], 120))
    assert "gym:CartPole-v1" in res.stdout and "greedy" in res.stdout, res.stdout


def test_a_suite_runs_and_reports_a_gymnasium_member_beside_a_procgen_game(tmp_path):
    """A suite's games are any env names: the Gymnasium member gets no distribution_mode and a folder
    name without ':'; the report gives its return and leaves it out of the normalized aggregate
    (no published score range), which the Procgen game still has."""
    data = yaml.safe_load((ROOT / "configs" / "suites" / "tiny.yaml").read_text())
    data.update(games=["starpilot", "gym:CartPole-v1"], seeds=[1], variants={"default": []}, budget=512,
                base_config="configs/ppo_cartpole.yaml")
    suite = tmp_path / "mixed.yaml"
    suite.write_text(yaml.safe_dump(data))
    ok(run([sys.executable, "-m", "mpippo.suite", "run", str(suite), "--root", str(tmp_path), "--local"], 300))
    member = tmp_path / "suites" / "tiny" / "default" / "gym_CartPole-v1" / "seed_1"
    assert metrics(member)["env"] == "gym:CartPole-v1" and metrics(member)["finished"]
    ok(run([sys.executable, "-m", "mpippo.suite", "report", str(suite), "--root", str(tmp_path), "--reps", "50"], 300))
    r = json.loads((tmp_path / "suites" / "tiny" / "report" / "report.json").read_text())
    rows = {g["game"]: g for g in r["games"]}
    assert rows["gym:CartPole-v1"]["normalized"] is None and rows["gym:CartPole-v1"]["mean"] > 0
    assert rows["starpilot"]["normalized"] is not None and r["aggregate_games"] == ["starpilot"]


USER_ENVS = str(ROOT / "tests" / "user_env")
NIM = ["--config", "configs/dqn_selfplay.yaml", "--no-progress", "--set", "env.name=pz:nim", "--set",
       "env.import=mpippo_user_envs:make_nim", "--set", "dqn.mirror_augment=false", "--set", "logging.tensorboard=false"]


def users(cmd: list[str], ranks: int | None = None, timeout: float = 180):
    pre = [MPIRUN, "--oversubscribe", "-n", str(ranks)] if ranks else []
    return run([*pre, sys.executable, *cmd], timeout, env={"PYTHONPATH": USER_ENVS})


def test_a_users_own_two_player_game_learns_in_self_play_resumes_and_evaluates(tmp_path):
    """pz:<name> with env.import module:callable (tests/user_env's Nim, vector observations: the MLP):
    self-play DQN learns to beat the random player (the one fixed player a game of one's own has; about
    half its games at the start), the resume and evaluate name env.import as for any user env, the
    lookahead player is refused, and a game that breaks mid-run on an actor ends the job in one line
    naming the rank."""
    run_dir = tmp_path / "run"
    res = ok(users(["run_mpi.py", *NIM, "--total-timesteps", "12000", "--output-dir", str(run_dir)], 3))
    sp = metrics(run_dir)["selfplay"]
    assert list(sp["heuristics"]) == ["random"] and sp["heuristics"]["random"]["games"] > 0
    assert "lookahead" not in sp["ratings"][0] and "greedy win rate vs random" in res.stdout
    assert sp["ratings"][-1]["random"]["win_rate"] >= 0.8, sp["ratings"]  # (0.9-0.98 in a few seconds here)
    res = ok(users(["analysis/selfplay_curve.py", str(run_dir)]))  # the curve and table: the random player's only
    assert "vs random" in res.stdout and "lookahead" not in res.stdout and (run_dir / "selfplay.png").exists()
    ok(users(["run_mpi.py", "--resume", "--no-progress", "--total-timesteps", "16000", "--output-dir", str(run_dir),
              "--set", "env.import=mpippo_user_envs:make_nim"], 3))
    assert metrics(run_dir)["total_timesteps"] == 16000
    evaluate = ["-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "20",
                "--import", "mpippo_user_envs:make_nim"]
    assert "vs random" in ok(users(evaluate)).stdout
    res = users([*evaluate, "--opponent", "lookahead"])
    assert res.returncode == 2 and error_lines(res.stderr) == [
        "mpippo: error: --opponent: 'pz:nim' has no lookahead player; allowed: random"], res.stderr[-800:]
    res = users(["run_mpi.py", *NIM, "--total-timesteps", "12000", "--set", "env.kwargs={fault: raise, at: 200, fault_rank: 2}",
                 "--output-dir", str(tmp_path / "broken")], 3)
    lines = error_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "env.name: 'pz:nim' raised RuntimeError: the user's game broke in its step() (move " in lines[0], lines
    assert lines[0].startswith("mpippo: error: rank 2: "), lines


def test_dqn_trains_a_users_game_of_more_moves_than_one_word_of_legal_move_bits(tmp_path):
    """Nim of 100 stones taking 1 to 70 (70 moves): the legal moves travel in two words of bits from the
    actors to the replay and the learner's target (DQN refused games of more than 63 moves). The game
    raises on an illegal move, so the run's end says none was played."""
    run_dir = tmp_path / "run"
    ok(users(["run_mpi.py", *NIM, "--total-timesteps", "4000", "--set", "env.kwargs={stones: 100, max_take: 70, strict: true}",
              "--output-dir", str(run_dir)], 3))
    m = metrics(run_dir)
    assert m["total_timesteps"] == 4000 and m["updates"] > 0 and m["selfplay"]["heuristics"]["random"]["games"] > 0


def test_a_self_play_resume_takes_a_smaller_pool_and_refuses_to_drop_self_play(tmp_path):
    """selfplay.pool_size lowered on resume keeps the newest members within it (the sampling table is
    pool_size wide: it was a traceback); selfplay.enabled=false on a run trained with self-play is
    refused (its pool, ratings and curve were dropped without a word, and self-play could not come
    back), nothing written over."""
    run_dir = tmp_path / "run"
    sets = ["--set", "selfplay.snapshot_interval_updates=50"]
    ok(users(["run_mpi.py", *NIM, *sets, "--total-timesteps", "8000", "--output-dir", str(run_dir)], 3))
    assert len(metrics(run_dir)["selfplay"]["pool"]) > 1
    files = {p: p.read_bytes() for p in (run_dir / "config.yaml", run_dir / "checkpoints" / "latest.pt")}
    res = users(["run_mpi.py", "--resume", "--no-progress", "--output-dir", str(run_dir), "--total-timesteps", "10000",
                 "--set", "env.import=mpippo_user_envs:make_nim", "--set", "selfplay.enabled=false"], 3)
    assert res.returncode == 2 and error_lines(res.stderr) == [
        "mpippo: error: selfplay.enabled: false, but the run trained with self-play (its checkpoint holds the opponent "
        "pool and the ratings); allowed: true on resume (without it: a new run)"], res.stderr[-1500:]
    assert all(p.read_bytes() == data for p, data in files.items())
    ok(users(["run_mpi.py", "--resume", "--no-progress", "--output-dir", str(run_dir), "--total-timesteps", "10000",
              "--set", "env.import=mpippo_user_envs:make_nim", "--set", "selfplay.pool_size=1"], 3))
    sp = metrics(run_dir)["selfplay"]
    assert len(sp["pool"]) == 1 and sp["pool"][0]["id"] == sp["snapshots_taken"] - 1  # the newest kept


def test_rating_games_count_each_games_outcome_once_in_order():
    """Nim of one stone: who opens wins. The learner opens half the rating games: 50 wins, 50 losses
    (a game the opponent's opening move ended in the same act as the learner's win overwrote it)."""
    sys.path.insert(0, USER_ENVS)
    import numpy as np
    from mpippo import config as C
    from mpippo.envs.connect4 import random_opponent
    from mpippo.envs.pettingzoo import FAMILY
    cfg = C.resolve(C.build({}, [("env", "name", "pz:nim"), ("env", "import", "mpippo_user_envs:make_nim"),
                                 ("env", "kwargs", {"stones": 1})], 1), 1)
    rng = np.random.default_rng(0)
    assert list(FAMILY.play_games(cfg, random_opponent(rng), random_opponent(rng), 100, seed=3)) == [50, 0, 50]
