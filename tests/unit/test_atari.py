"""The atari:<Game> family (mpippo/envs/atari.py) on ale-py's vector env: names, options, and the
two episode notions (training's: a lost life; the reported: the real game, unclipped)."""
import numpy as np
import pytest

from mpippo import config as C
from mpippo import envs
from mpippo.usage import UsageError


def cfg_of(name: str, **kwargs):
    over = [("env", "name", name)] + ([("env", "kwargs", kwargs)] if kwargs else [])
    return C.build({}, over, 1)


def test_names_spaces_and_one_line_refusals():
    assert envs.canonical_env_name("atari:ms_pacman") == "atari:MsPacman" == envs.canonical_env_name("atari:MsPacman")
    assert envs.spaces_of(cfg_of("atari:Breakout")) == envs.Spaces((84, 84, 4), "uint8", 4)
    assert envs.spaces_of(cfg_of("atari:Breakout", full_action_space=True)).num_actions == 18
    bad = [("atari:Breakot", {}, "env.name: 'Breakot' is not an ALE game (did you mean 'atari:Breakout'?)"),
           ("atari:", {}, "env.name: 'atari:' is not atari:<Game>"),
           ("atari:Pong", {"noop_max": -1}, "env.kwargs.noop_max: -1 is not an integer in [0, 1000]"),
           ("atari:Pong", {"sticky": 1}, "env.kwargs.sticky: not an option of atari envs; allowed: repeat_action"),
           ("atari:Pong", {"episodic_life": "yes"}, "env.kwargs.episodic_life: 'yes' is not true or false")]
    for name, kwargs, line in bad:
        with pytest.raises(UsageError) as e:
            cfg_of(name, **kwargs)
        assert len(e.value.errors) == 1 and e.value.errors[0].startswith(line), e.value.errors


def test_every_games_name_comes_back_to_its_rom_however_spelled():
    """The name a run records (CamelCase) leads back to the ROM for every game: from the CamelCase
    alone, 'UpNDown' gave 'up_ndown' and 'TicTacToe3d' 'tic_tac_toe3d', neither a ROM (ale-py's assert)."""
    from mpippo.envs.atari import camel, rom_id, _roms
    for rom in _roms():
        for spelled in (rom, camel(rom), rom.replace("_", ""), rom.upper()):
            assert rom_id(spelled) == rom, (spelled, rom_id(spelled))
            assert envs.canonical_env_name(f"atari:{spelled}") == f"atari:{camel(rom)}"
    assert envs.spaces_of(cfg_of("atari:tic_tac_toe_3d")).obs_shape == (84, 84, 4)  # (an assert in ale-py)
    assert envs.spaces_of(cfg_of("atari:UpNDown")).obs_shape == (84, 84, 4)


def play(env, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ep_ret, ep_len = np.zeros(env.num_envs), np.zeros(env.num_envs, dtype=np.int64)
    firsts, rewards, games = 0, set(), []
    for _ in range(steps):
        env.act(rng.integers(0, env.num_actions, env.num_envs))
        rew, obs, first = env.observe()
        assert obs.shape == (env.num_envs, 84, 84, 4) and obs.dtype == np.uint8 and obs.flags.c_contiguous
        ep_ret += rew
        ep_len += 1
        firsts += int(first.sum())
        rewards |= set(np.unique(rew).tolist())
        games += list(zip(*envs.ended_episodes(env, first, ep_ret, ep_len)))
        ep_ret[first], ep_len[first] = 0.0, 0
    return firsts, rewards, games


def test_a_lost_life_ends_a_training_episode_and_the_real_game_is_reported_unclipped():
    """Breakout at random: 5 lives a game, so training sees about 5 `first` flags per reported
    game; rewards train clipped to their sign (a brick scores up to 7) and are reported raw."""
    env = envs.make_env(cfg_of("atari:Breakout"), 2, seed=1)
    firsts, rewards, games = play(env, 1500)
    assert len(games) >= 4 and firsts >= 4 * len(games), (firsts, len(games))
    assert rewards <= {0.0, 1.0}
    assert all(i in (0, 1) and ret >= 0 and 100 < length < 1500 for i, ret, length in games)
    env.close()
    raw = envs.make_env(cfg_of("atari:Breakout", episodic_life=False, reward_clip=False), 2, seed=1)
    firsts, _, games = play(raw, 1500)
    assert firsts == len(games) >= 4  # one episode per game: every first is a game's end


def test_a_rank_seed_near_the_top_of_its_range_starts_its_envs():
    """rank_seed reaches 2**31 - 2 (training.seed 623,693,952 on rank 0): env i adds i, past ALE's 32-bit
    seeds, which had ended the start in a TypeError traceback."""
    top = envs.rank_seed(623_693_952, 0)
    assert top == 2**31 - 2
    env = envs.make_env(cfg_of("atari:Breakout"), 3, seed=top)
    env.close()


def test_the_time_limit_truncates_with_the_final_frames_to_bootstrap_from():
    env = envs.make_env(cfg_of("atari:Pong", max_episode_steps=50), 3, seed=2)
    rng = np.random.default_rng(1)
    seen = 0
    for step in range(1, 121):
        env.act(rng.integers(0, env.num_actions, 3))
        idx, final = env.truncated()
        _, _, first = env.observe()
        if step % 50 == 0:  # every game cut at once; Pong's first point takes longer than 50 steps
            assert list(idx) == [0, 1, 2] and final.shape == (3, 84, 84, 4) and first.all()
            ended = envs.ended_episodes(env, first, None, None)
            assert list(ended[0]) == [0, 1, 2] and list(ended[2]) == [50, 50, 50]
            seen += 1
        else:
            assert len(idx) == 0 and not first.any()
    assert seen == 2
    env.close()


def test_a_new_games_stack_repeats_its_first_frame_and_then_shifts():
    """As EnvPool and baselines' FrameStack (ale-py alone leaves the older slots black): a game's first
    observation is its first frame four times; each step shifts the stack by one frame, so the
    copies leave one per step; a game the time limit restarts starts over the same way; lost lives
    do not restart the stack (Breakout at random loses one every few dozen steps)."""
    for name, kwargs in (("atari:Pong", {"max_episode_steps": 6}), ("atari:Breakout", {})):
        env = envs.make_env(cfg_of(name, **kwargs), 2, seed=3)
        rng = np.random.default_rng(0)
        _, obs, _ = env.observe()
        age = np.zeros(2, dtype=np.int64)
        for _ in range(200 if name == "atari:Breakout" else 14):
            prev = obs.copy()
            env.act(rng.integers(0, env.num_actions, 2))
            _, obs, first = env.observe()
            games = np.isin(np.arange(2), envs.ended_episodes(env, first, None, None)[0])
            age = np.where(games, 0, age + 1)
            for i in range(2):
                if age[i] < 3:  # the slots before the game's first frame hold that frame
                    start = 3 - age[i]
                    assert (obs[i, :, :, :start] == obs[i, :, :, start:start + 1]).all()
                if age[i] > 0:  # one frame in, the oldest out
                    assert (obs[i, :, :, :3] == prev[i, :, :, 1:]).all()
                assert obs[i, :, :, 3].any()  # (a real frame: never a black one)
        if name == "atari:Pong":
            assert (age == 14 - 12).all()  # two restarts by the time limit
        env.close()


def test_each_ended_game_carries_the_frame_it_began_at_and_evaluate_splits_by_its_parity():
    """The frame a game's first observation came at (after its random no-ops) is its phase; evaluate
    tables the returns by its parity (a policy winning one parity only plays by rote)."""
    from mpippo.evaluate import by_start_parity
    env = envs.make_env(cfg_of("atari:Pong", max_episode_steps=3), 4, seed=5)
    start, seen = env.frame.copy(), []
    for _ in range(60):
        env.act(np.zeros(4, dtype=np.int64))
        idx, _, _ = env.episodes()
        assert list(env.episode_start_frames()) == list(start[idx])
        seen += list(start[idx])
        start[idx] = env.frame[idx]
    assert len(seen) == 80 and {s % 2 for s in seen} == {0, 1} and max(seen) <= 30  # no-ops up to 30 frames
    env.close()
    split = by_start_parity([10.0, -20.0, 6.0, -18.0, -16.0], [3, 8, 29, 2, 14])
    assert split == {"odd": {"episodes": 2, "return_mean": 8.0}, "even": {"episodes": 3, "return_mean": -18.0}}
    assert by_start_parity([1.0], []) is None
    assert by_start_parity([1.0], [4])["odd"] == {"episodes": 0, "return_mean": None}


def test_the_nature_cnn_is_built_counted_and_refused_where_it_cannot_go():
    """model.arch nature: the network the configs build, its parameters as the memory model counts
    them, and one line for frames too small or IMPALA-only keys set beside it."""
    from mpippo import models
    cfg = C.build(C.load_yaml("configs/ppo_atari.yaml"), [("env", "name", "atari:Pong")], 2)
    net = models.build("actor_critic", (84, 84, 4), 6, cfg.model)
    q = models.build("q", (84, 84, 4), 6, C.build(C.load_yaml("configs/dqn_atari.yaml"), [], 2).model)
    counted = C.network_params((84, 84, 4), cfg.model.channels, 512, 6, arch="nature")
    assert sum(p.numel() for p in net.parameters()) == counted == sum(p.numel() for p in q.parameters())
    import torch
    logits, value = net(torch.zeros((3, 84, 84, 4), dtype=torch.uint8))
    assert logits.shape == (3, 6) and value.shape == (3,)
    bad = [([("env", "name", "toy-cue"), ("model", "arch", "nature")], "model.arch: nature takes frames of at least 36x36"),
           ([("model", "arch", "nature"), ("model", "channels", [8])], "model.channels: [8] is read by model.arch impala"),
           ([("model", "arch", "resnet")], "model.arch: 'resnet' is not one of impala, nature")]
    for over, line in bad:
        with pytest.raises(UsageError) as e:
            C.build({}, over, 1)
        assert len(e.value.errors) == 1 and e.value.errors[0].startswith(line), e.value.errors


def test_a_suite_scores_atari_games_human_normalized():
    """The report's scale comes from the env's family: Atari's random (0) and human (1) scores,
    Procgen's paper constants as before, none for a Gymnasium env."""
    from mpippo.envs.atari_scores import SCORES
    from mpippo.envs.procgen import SCORE_RANGES
    from mpippo.suite.report import normalized
    random, human = SCORES["pong"]
    assert normalized("atari:Pong", "easy", random) == 0.0 and normalized("atari:Pong", "hard", human) == 1.0
    assert normalized("atari:MsPacman", "easy", SCORES["ms_pacman"][1]) == pytest.approx(1.0)
    lo, hi = SCORE_RANGES["easy"]["coinrun"]
    assert normalized("coinrun", "easy", hi) == 1.0 and normalized("procgen-coinrun-v0", "easy", lo) == 0.0
    assert normalized("gym:CartPole-v1", "easy", 500.0) is None and normalized("atari:Adventure", "easy", 1.0) is None
    assert len(SCORES) == 57
