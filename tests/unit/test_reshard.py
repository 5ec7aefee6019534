"""Re-sharding a sync checkpoint's env states over another world size (mpippo/resume.py,
an env family's reshard), without MPI: every env's state lands on the rank that now holds it, in
rank order, and the job's episode statistics and env count are kept."""
import numpy as np
import pytest

from mpippo import resume
from mpippo.envs import family_of, resume_seed, take_rows
from mpippo.envs.connect4 import ConnectFourVecEnv
from mpippo.envs.toy import CueEnv


def test_take_rows_joins_only_the_parts_that_hold_them():
    parts = [np.arange(0, 4), np.arange(4, 8), np.arange(8, 12)]
    assert take_rows(parts, 3, 9).tolist() == list(range(3, 9))
    assert take_rows(parts, 4, 8).tolist() == [4, 5, 6, 7]
    assert take_rows([[b"a", b"b"], [b"c"]], 1, 3) == [b"b", b"c"]  # procgen: one byte string per env


def stepped(cls, n: int, seed: int, steps: int):
    env = cls(n, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        env.act(rng.integers(env.num_actions, size=n))
    return env


@pytest.mark.parametrize("name,cls", [("toy-cue", CueEnv), ("connect4", ConnectFourVecEnv)])
@pytest.mark.parametrize("was,now", [(2, 1), (1, 2), (2, 4), (4, 2)])
def test_builtin_envs_continue_every_env_in_rank_order(name, cls, was, now):
    total = 8
    old = [stepped(cls, total // was, seed=r, steps=5) for r in range(was)]
    states = [e.get_state() for e in old]
    frames = np.concatenate([e.observe()[1] for e in old])
    n = total // now
    for r in range(now):
        env = cls(n, seed=99)
        env.set_state(family_of(name).reshard(states, r * n, (r + 1) * n, seed=r))
        np.testing.assert_array_equal(env.observe()[1], frames[r * n:(r + 1) * n])
        for key in cls.PER_ENV:
            np.testing.assert_array_equal(env.get_state()[key],
                                          np.concatenate([s[key] for s in states])[r * n:(r + 1) * n])


def test_procgen_games_continue_exactly_on_another_split():
    """A procgen state holds its game's RNGs: the re-sharded games step on exactly as the old ones."""
    pytest.importorskip("procgen")
    from mpippo.envs.procgen import ProcgenVecEnv
    old = [ProcgenVecEnv("starpilot", 2, seed=s) for s in (1, 2)]
    for e in old:
        for _ in range(3):
            e.act(np.zeros(2, dtype=np.int32))
    new = ProcgenVecEnv("starpilot", 4, seed=7)
    new.set_state(family_of("starpilot").reshard([e.get_state() for e in old], 0, 4, seed=0))
    actions = np.array([1, 4, 7, 2], dtype=np.int32)
    for e, a in zip(old, (actions[:2], actions[2:])):
        e.act(a)
    new.act(actions)
    np.testing.assert_array_equal(new.observe()[1], np.concatenate([e.observe()[1] for e in old]))


def rank_state(n: int, offset: int, episodes: int, window: list) -> dict:
    """The parts of a sync rank's checkpoint state that resume.reshard and episode_stats read."""
    rows = np.arange(offset, offset + n)
    return {"obs": np.stack([np.full((2, 2, 3), i, np.uint8) for i in rows]), "first": rows % 2 == 0,
            "ret_tracker": rows * 0.5, "ep_ret": rows * 1.0, "ep_len": rows.astype(np.int64),
            "env": [bytes([i]) for i in rows], "win_returns": window, "episodes_total": episodes,
            "interval_ep": np.array([1.0, 2.0, 3.0]), "interval_ev": np.ones(5)}


def test_reshard_gives_each_new_rank_its_contiguous_share_and_deals_the_statistics():
    ranks = [rank_state(3, 0, 5, [1.0, 2.0]), rank_state(3, 3, 7, [3.0])]
    parts = [resume.reshard(ranks, "starpilot", 3, r, seed=0) for r in range(3)]
    for r, part in enumerate(parts):
        assert part["ep_len"].tolist() == [2 * r, 2 * r + 1]
        assert part["env"] == [bytes([2 * r]), bytes([2 * r + 1])]
        assert (part["obs"][:, 0, 0, 0] == part["ep_len"]).all()
    stats = [resume.episode_stats(ranks, 3, r) for r in range(3)]
    assert sum(s["episodes_total"] for s in stats) == 12 and stats[0]["episodes_total"] == 12
    assert sorted(x for s in stats for x in s["win_returns"]) == [1.0, 2.0, 3.0]
    assert stats[0]["interval_ep"].tolist() == [2.0, 4.0, 6.0] and not stats[1]["interval_ep"].any()


def test_plan_by_world_size_and_env_count():
    from mpippo import config as C
    cfg = C.resolve(C.Config(), 2)
    cfg.env.num_envs_per_rank = 4
    two = {"world_size": 2, "ranks": [rank_state(4, 0, 0, []), rank_state(4, 4, 0, [])]}
    assert resume.plan(two, cfg, 2) == ("exact", 8, 8)
    cfg.env.num_envs_per_rank = 8
    assert resume.plan(two, cfg, 1) == ("reshard", 8, 8)
    cfg.env.num_envs_per_rank = 3
    assert resume.plan(two, cfg, 2) == ("fresh", 8, 6)
    assert resume.plan({**two, "world_size": 3}, cfg, 2)[0] == "fresh"  # rank states missing


def test_resume_seed_is_a_function_of_seed_rank_and_iteration():
    assert resume_seed(1, 0, 10) == resume_seed(1, 0, 10)
    seeds = {resume_seed(1, r, i) for r in range(4) for i in (10, 11)} | {resume_seed(2, 0, 10)}
    assert len(seeds) == 9 and all(0 <= s < 2**31 - 1 for s in seeds)


def test_the_launch_guard_is_not_kept_for_a_resume_from_config_yaml():
    """parallel.expected_world_size guards one launch: the resolved config (what config.yaml and the
    checkpoint record) leaves it out, so a resume from that file on another allocation is not refused."""
    from mpippo import config as C
    asked = C.build({"parallel": {"expected_world_size": 2}}, [], 2)
    assert asked.parallel.expected_world_size == 2 and C.resolve(asked, 2).parallel.expected_world_size is None
    assert C.build(C.resolve(asked, 2).to_dict(), [], 1).parallel.expected_world_size is None


@pytest.mark.parametrize("key, value, words", [("num_levels", 5, "level count is 0"), ("start_level", 7, "first level is 0"),
                                               ("distribution_mode", "hard", "distribution mode is 'easy'")])
def test_a_resume_of_a_procgen_run_on_other_levels_is_refused(key, value, words):
    """Procgen's levels and mode are the job (another set of levels is another experiment): a resume
    asking for others is refused naming both values (on another family these keys are refused
    before, as keys it does not read)."""
    from mpippo import config as C
    saved = C.build({"env": {"name": "coinrun"}}, [], 1).to_dict()
    cfg = C.build({"env": {"name": "coinrun"}}, [("env", key, value)], 1)
    with pytest.raises(C.UsageError, match=words):
        resume.check(saved, cfg)
    assert resume.check(saved, C.build({"env": {"name": "coinrun"}}, [], 1)) == []


def test_an_actor_learner_resume_draws_streams_no_rank_started_with():
    """Each resume of a DQN or APPO agent starts its actors' envs, exploration and augmentation on
    fresh streams: none is any rank's start (seed + 7919 x resumes was the next rank's), nor another
    resume's; the start's is rank_seed's as before."""
    from mpippo.envs import rank_seed, streams_seed
    for base in range(4):
        starts = {rank_seed(base, r) for r in range(64)}
        assert all(streams_seed(base, r, 0) == rank_seed(base, r) for r in range(64))
        resumed = [streams_seed(base, r, k) for r in range(64) for k in range(1, 4)]
        assert not starts & set(resumed) and len(set(resumed)) == len(resumed)
