"""The env registry (mpippo/envs/): every family answers what the rest of mpippo asks; no module
outside mpippo/envs/ names an env; the Gymnasium family's episodes, time limits and user envs."""
import ast
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mpippo import config as C
from mpippo import envs

ROOT = Path(__file__).resolve().parents[2]
USER_ENVS = str(ROOT / "tests" / "user_env")


def _env_literal(value) -> bool:
    return isinstance(value, str) and (value in envs.known_env_names() or bool(re.fullmatch(r"(gym:|procgen-|pz:|atari:)\S+", value)))


def test_no_env_name_outside_mpippo_envs():
    """`name == "connect4"`, a game's name, "gym:...": only the families know names; the rest asks
    them (two_player, exact_resume, spaces...)."""
    found = []
    for path in sorted((ROOT / "mpippo").rglob("*.py")):
        if "envs" in path.relative_to(ROOT / "mpippo").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and _env_literal(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == []


def test_the_literal_finder_finds_one():
    tree = ast.parse('if cfg.env.name == "connect4":\n    pass\nx = "gym:CartPole-v1"\n')
    assert sorted(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and _env_literal(n.value)) == [
        "connect4", "gym:CartPole-v1"]


@pytest.mark.parametrize("name", ["coinrun", "procgen-coinrun-v0", "toy-cue", "connect4", "gym:CartPole-v1",
                                  "pz:connect_four_v3", "pz:tictactoe_v3"])
def test_every_name_has_one_family_that_answers(name):
    fam = envs.family_of(name)
    assert fam is not None and [f for f in envs.FAMILIES if f.accepts(name)] == [fam]
    cfg = C.resolve(C.build({}, [("env", "name", name)], 1), 1)
    sp = fam.spaces(cfg)
    assert sp.num_actions >= 2 and len(sp.obs_shape) in (1, 3)
    env = fam.make(cfg, 2, seed=1)
    rew, obs, first = env.observe()
    assert obs.shape == (2, *sp.obs_shape) and obs.dtype == np.dtype(sp.obs_dtype) and first.all()
    env.act(np.zeros(2, dtype=np.int32))
    assert env.observe()[1].shape == (2, *sp.obs_shape)
    state = env.get_state()
    assert (state is None) == (not fam.exact_resume)
    env.close()


def user_cfg(name, **env):
    if USER_ENVS not in sys.path:
        sys.path.insert(0, USER_ENVS)
    over = [("env", "name", name), ("env", "import", "mpippo_user_envs"), ("env", "num_envs", 2),
            ("training", "n_steps", 12), ("training", "gamma", 0.9), ("training", "normalize_reward", False),
            ("training", "precision", "fp32"), *[("env", k, v) for k, v in env.items()]]
    return C.resolve(C.build({}, over, 1), 1)


def trainer_of(cfg, tmp_path):
    from mpippo.comm import World
    from mpippo.runners.sync import SyncTrainer
    return SyncTrainer(cfg, World(), tmp_path, None)


def test_a_time_limit_bootstraps_from_the_final_observation(tmp_path):
    """Steady: cut by its 5-step limit, never ended: each cut step's reward gains gamma * V(final
    obs); the steps before it and every other step gain nothing."""
    ppo = trainer_of(user_cfg("gym:mpippo-test/Steady-v0"), tmp_path)
    _, ppo.obs, ppo.first = ppo.env.observe()
    ppo.collect_rollout(ppo.obs, ppo.first)
    with torch.no_grad():
        v_final = ppo.model(torch.tensor([[1.0, 0.0, -1.0]]))[1].item()
    want = torch.zeros(12, 2)
    want[[4, 9]] = 0.9 * v_final  # the 5th and 10th acts hit the limit
    torch.testing.assert_close(ppo.buf.trunc_values, want)
    assert ppo.buf.dones[[0, 5, 10]].eq(1).all() and ppo.buf.dones.sum() == 6  # (the first obs is a start too)
    adv, ret = ppo.advantages(ppo.obs, ppo.first)
    r = ppo.buf.rewards
    assert torch.allclose(r[4], 1 + 0.9 * torch.tensor(v_final)) and torch.allclose(r[3], torch.ones(2))


def test_a_termination_gets_no_value(tmp_path):
    ppo = trainer_of(user_cfg("gym:mpippo-test/Ending-v0"), tmp_path)
    _, ppo.obs, ppo.first = ppo.env.observe()
    ppo.collect_rollout(ppo.obs, ppo.first)
    assert ppo.buf.trunc_values.abs().sum() == 0 and ppo.buf.dones[[5, 10]].eq(1).all()


def test_an_entry_point_registers_the_id_and_a_nonzero_start_is_shifted(tmp_path):
    cfg = user_cfg("gym:mpippo-test/Corridor-v0", **{"import": "mpippo_user_envs:make_corridor",
                                                     "kwargs": {"length": 4}})
    env = envs.make_env(cfg, 3, seed=0)
    assert env.obs_shape == (4,) and env.num_actions == 2
    for _ in range(3):  # action 1 -> the env's 2 (right): the end after 3 steps
        env.act(np.ones(3, dtype=np.int64))
    rew, obs, first = env.observe()
    assert first.all() and np.allclose(rew, 1.0) and (obs[:, 0] == 1).all()  # a new episode's first cell


def test_the_gymnasium_family_imports_nothing_unnamed():
    """Importing mpippo (config, envs) imports neither gymnasium nor a user's module."""
    import subprocess
    code = ("import sys, mpippo.config, mpippo.envs; "
            "print('gymnasium' in sys.modules, 'mpippo_user_envs' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": USER_ENVS}, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_a_gaussian_policy_draws_logs_and_scores_as_torch_normal():
    """Continuous actions: PolicyStep draws mean + std * N(0, 1) from its sampler's stream, the
    log-probability and entropy are a diagonal Normal's (summed over dimensions), and the update's
    logprob_entropy gives the same numbers for the same actions."""
    from mpippo.algos.policy_gradient import GumbelSampler, PolicyStep, logprob_entropy
    from mpippo.models.mlp import MLPPolicy
    torch.manual_seed(0)
    net = MLPPolicy(3, 2, (16,), continuous=True)
    with torch.no_grad():
        net.logstd.copy_(torch.tensor([[-0.5, 0.3]]))
    step = PolicyStep(net, GumbelSampler(torch.device("cpu"), 7), (3,), 4096, 2, torch.device("cpu"), "fp32", False,
                      obs_dtype=torch.float32)
    obs = torch.randn(1, 3).expand(4096, 3).contiguous()
    action, logprob, _ = step(obs)
    mean = net(obs)[0]
    dist = torch.distributions.Normal(mean, net.logstd.exp())
    torch.testing.assert_close(logprob, dist.log_prob(action).sum(-1))
    z = (action - mean) / net.logstd.exp()
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1) < 0.05  # the draw is mean + std * N(0, 1)
    lp, ent = logprob_entropy(mean, action, net.logstd)
    torch.testing.assert_close(lp, logprob)
    torch.testing.assert_close(ent, dist.entropy().sum(-1))


def test_observation_statistics_are_the_jobs_whatever_the_split():
    """ObsNormalizer: two ranks' rollouts summed and folded in once give the statistics of all their
    observations together (as one process would compute them), then normalize and clip."""
    from mpippo.algos.buffers import ObsNormalizer
    rng = np.random.default_rng(0)
    parts = [rng.normal([3.0, -1.0], [2.0, 0.5], size=(400, 2)) for _ in range(2)]
    a, b = ObsNormalizer(2, 5.0), ObsNormalizer(2, 5.0)
    a.add(parts[0]), b.add(parts[1])
    joined = a.sums + b.sums
    a.update(joined.copy())
    everything = np.concatenate(parts)
    np.testing.assert_allclose(a.mean, everything.mean(0), rtol=1e-6)
    np.testing.assert_allclose(a.var, everything.var(0), rtol=1e-3)
    assert a.sums.sum() == 0  # the next rollout starts its own sums
    out = a(np.array([[3.0, 100.0]]))
    assert out.dtype == np.float32 and abs(out[0, 0]) < 0.1 and out[0, 1] == 5.0  # clipped


def test_box_actions_are_clipped_for_the_env_only(tmp_path):
    cfg = user_cfg("gym:mpippo-test/Target-v0")
    env = envs.make_env(cfg, 2, seed=0)
    assert env.spaces.continuous and env.num_actions == 1
    target = env.observe()[1][:, 0].copy()
    env.act(np.array([[9.0], [-9.0]], dtype=np.float32))  # far outside [-2, 2]: the env gets +-2
    np.testing.assert_allclose(env.observe()[0], -(np.array([2.0, -2.0]) - target) ** 2, rtol=1e-5)


def test_box_actions_are_clipped_in_the_spaces_own_dtype_and_info_of_any_shape_is_not_read(tmp_path):
    """Strict checks each action with Gymnasium's spaces (float64 bounds of +-0.1: float32's clip gave
    0.10000000149, outside) and returns an info path of a length no two envs share (Gymnasium's merge of
    infos into arrays failed on it)."""
    env = envs.make_env(user_cfg("gym:mpippo-test/Strict-v0"), 3, seed=0)
    for _ in range(3):
        env.act(np.array([[9.0, -9.0], [0.1, -0.1], [0.05, 1e9]]))
    assert np.allclose(env.observe()[0], 1.0)
    last = env.env.envs[2].unwrapped.last
    assert last.dtype == np.float64 and last.tolist() == [0.05, 0.1]


def test_integer_box_actions_and_a_boolean_time_limit_are_refused_in_one_line():
    """A Gaussian's draws are not whole numbers (the env got 0.64), and True was Gymnasium's one-step limit."""
    for name, kwargs, line in [
            ("IntegerBox", {}, "env.name: the action space Box(0, 5, (2,), int64) holds int64 values; allowed: "
                               "Discrete, or a Box of floats (continuous)"),
            ("Steady", {"max_episode_steps": True}, "env.kwargs.max_episode_steps: True is not a whole number of "
                                                    "steps; allowed: 1 or more (or none: the id's own limit)")]:
        with pytest.raises(C.UsageError) as refused:
            user_cfg(f"gym:mpippo-test/{name}-v0", kwargs=kwargs)
        assert refused.value.errors == [line]


def test_an_exponent_without_a_dot_is_a_number_in_env_kwargs_and_a_key_given_twice_is_refused():
    """PyYAML (YAML 1.1) read --set env.kwargs.scale=1e-3 as the text '1e-3': refused against a float
    default, and passed on as text where the constructor has none."""
    user_cfg("gym:mpippo-test/Steady-v0")  # (the user envs' folder on the path, before a config names its module)
    over = [C.parse_override("env.kwargs.scale=1e-3"), C.parse_override("env.kwargs.other=2E+2")]
    cfg = C.resolve(C.build({}, [*[("env", k, v) for k, v in (("name", "gym:mpippo-test/Strict-v0"),
                                                              ("import", "mpippo_user_envs"))], *over], 1), 1)
    assert envs.family(cfg).check(cfg) == []
    made = envs.make_env(cfg, 1, seed=0).env.envs[0].unwrapped.kwargs
    assert made == {"scale": 0.001, "other": 200.0}
    with pytest.raises(C.UsageError, match=r"--set env.kwargs: duplicate key 'a' \(first given at line 1\)"):
        C.parse_override("env.kwargs={a: 1, a: 2}")


def test_an_older_apis_reset_is_named_as_such():
    with pytest.raises(C.UsageError, match=r"making 2 and resetting them failed \(TypeError: its reset\(\) returned "
                                           r"ndarray .*, not \(obs, info\)\); allowed: envs whose reset"):
        envs.make_env(user_cfg("gym:mpippo-test/OldReset-v0"), 2, seed=0)


def test_action_bounds_that_leave_out_zero_are_warned_of_once(tmp_path, capsys):
    trainer_of(user_cfg("gym:mpippo-test/Offset-v0"), tmp_path)
    out = capsys.readouterr().out
    assert "mpippo: warning: env.name: 'gym:mpippo-test/Offset-v0' has action bounds [5, 6] that do not hold 0" in out
    trainer_of(user_cfg("gym:mpippo-test/Target-v0"), tmp_path)
    assert "action bounds" not in capsys.readouterr().out
    assert envs.Spaces((2,), "float32", 3, True, (-1.0, 0.0, -2.0), (1.0, 1.0, -1.0)).bounds_off_zero() == \
        "[0, 1], [-2, -1]"


class Recorder:
    """A per-env opponent (the self-play cache's protocol) that plays the leftmost legal column and
    records what the env tells it."""
    per_env = True

    def __init__(self):
        self.started, self.ended = [], []

    def __call__(self, obs, mask, envs):
        return mask.argmax(1)

    def games_started(self, envs):
        self.started += list(envs)

    def games_ended(self, envs, rewards):
        self.ended += list(zip(envs, rewards))


def test_pettingzoo_connect_four_plays_as_the_built_in_game():
    """pz:connect_four_v3 behind the batch interface: the learner's seat alternates, the opponent
    (the pool's per-env protocol) moves inside act and hears of every game's start and end, an
    illegal move loses the game (PettingZoo's rule) and is counted, rewards are the learner's."""
    env = envs.make_env(C.resolve(C.build({}, [("env", "name", "pz:connect_four_v3")], 1), 1), 2, seed=0)
    rec = Recorder()
    env.set_opponent(rec)
    assert sorted(rec.started) == [0, 1]
    first_seats = env.agent_first.copy()
    _, obs, first = env.observe()
    assert obs.shape == (2, 6, 7, 2) and obs.dtype == np.uint8 and first.all()
    stones = (obs > 0).sum(axis=(1, 2, 3))
    assert list(stones) == [0 if f else 1 for f in first_seats]  # the opponent opened where it starts
    ends = {}  # the learner stacks column 6, the opponent column 0: who started wins on its 4th stone
    for step in range(1, 5):
        env.act(np.array([6, 6]))
        rew, _, first = env.observe()
        ends.update({i: (step, rew[i]) for i in np.flatnonzero(first) if i not in ends})
    assert ends == {i: (4, 1.0) if f else (3, -1.0) for i, f in enumerate(first_seats)}
    assert sorted((int(i), float(r)) for i, r in rec.ended) == sorted((i, r) for i, (_, r) in ends.items())
    assert list(env.agent_first) == list(~first_seats)  # the next games swap who starts
    before = env.illegal_moves
    for _ in range(4):  # column 0 fills (both play it); the learner's next stone there is illegal
        env.act(np.where(env.action_mask()[:, 0], 0, env.action_mask().argmax(1)))
    assert not env.action_mask()[:, 0].any()  # (alternating stones: no one won in that column)
    env.act(np.zeros(2, dtype=np.int64))
    rew, _, first = env.observe()
    assert env.illegal_moves == before + 2 and list(rew) == [-1.0, -1.0] and first.all()


def test_the_step_check_takes_every_kind_of_number_an_env_may_return_and_nothing_else():
    """A reward or an episode end as Gymnasium types them (SupportsFloat, bool): numpy's, torch's and
    Python's scalars, a number in a one-element array; not None, text, several numbers, a complex one; an
    end is no float and is 0 or 1."""
    import fractions

    import torch

    from mpippo.envs.family import a_flag, a_number
    numbers = [1, -2.5, True, np.float16(2), np.int64(3), np.True_, np.array(1.0), np.array([2.0]),
               torch.tensor(1.5), fractions.Fraction(1, 2)]
    assert all(a_number(x) for x in numbers), [x for x in numbers if not a_number(x)]
    assert not any(a_number(x) for x in [None, "1.0", b"1", np.array([1.0, 2.0]), 1j, np.array("1"), object()])
    flags = [True, False, np.True_, 0, 1, np.int8(1), np.array(True), torch.tensor(False)]
    assert all(a_flag(x) for x in flags), [x for x in flags if not a_flag(x)]
    assert not any(a_flag(x) for x in [None, 2, 1.0, "True", np.array([True, False])])


@pytest.mark.parametrize("fault, expect", [
    ("raise", "raised RuntimeError: the user's env broke in its step() (step 4 of this rank), at '"),
    ("exit", "called sys.exit(3) in its step() (step 4 of this rank), at '"),
    ("generator-exit", "raised GeneratorExit in its step() (step 4 of this rank), at '"),
    ("four-tuple", "raised ValueError: not enough values to unpack (expected 5, got 4) in its step()"),
    ("shape", "raised ValueError"),
    ("nan-reward", "returned a reward holding nan (as float32) at step 4 of this rank; allowed: finite values"),
    ("huge-reward", "returned a reward of 1e+39 at step 4 of this rank, past float32's range; allowed: values within "
                    "+-3.4e38"),
    ("none-reward", "returned a reward of None (NoneType) at step 4 of this rank; allowed: a number (an int, a float, a "
                    "numpy or torch scalar)"),
    ("text-reward", "returned a reward of '1.0' (str) at step 4 of this rank; allowed: a number"),
    ("none-terminated", "returned terminated of None (NoneType) at step 4 of this rank; allowed: True or False"),
    ("inf-obs", "returned an observation holding inf (as float32) at step 4 of this rank"),
    ("nan-final", "returned a final observation holding nan (as float32) at step 5 of this rank")])
def test_a_users_env_that_breaks_mid_run_is_named_in_one_line(fault, expect):
    """Whatever a user's env does wrong after start-up (raise, sys.exit, the old 4-tuple, a wrong
    shape, non-finite numbers, a reward or an end flag that is no number) becomes one EnvFailure line naming the env, the step and where in the
    env's own code (not Gymnasium's): its rank's abort hook prints it and ends the job, exit 2."""
    from mpippo.errors import EnvFailure
    sys.modules.get("mpippo_user_envs") and setattr(sys.modules["mpippo_user_envs"].Faulty, "steps", 0)
    env = envs.make_env(user_cfg("gym:mpippo-test/Faulty-v0", kwargs={"fault": fault, "at": 6}), 2, seed=0)
    sys.modules["mpippo_user_envs"].Faulty.steps = 0  # (the first reset took none)
    with pytest.raises(EnvFailure) as e:
        for _ in range(6):
            env.act(np.zeros(2, dtype=np.int64))
    line = str(e.value)
    assert line.startswith("env.name: 'gym:mpippo-test/Faulty-v0' ") and expect in line and "\n" not in line, line
    if expect.endswith("at '"):  # the env's own line, not a frame of Gymnasium's
        assert "mpippo_user_envs.py':" in line and "in step;" in line, line
    if fault in ("four-tuple", "shape"):  # Gymnasium failed on what the env returned: no frame of the user's
        assert ", at '" not in line and "declared spaces (observations Box(-1.0, 1.0, (3,), float32)" in line, line
    assert e.value.exit_code == 2


def test_a_users_renderer_that_fails_is_named_and_a_failing_close_only_warns(capsys):
    from mpippo.errors import EnvFailure
    env = envs.make_env(user_cfg("gym:mpippo-test/Faulty-v0", kwargs={"fault": "render", "at": -1}), 1, seed=0,
                        render=True)
    with pytest.raises(EnvFailure, match=r"raised RuntimeError: no display in its render\(\) .*in render; "
                                         r"allowed: a picture from render\(\)"):
        env.render()
    env.close()
    from mpippo import errors
    env = envs.make_env(user_cfg("gym:mpippo-test/Faulty-v0", kwargs={"fault": "close"}), 1, seed=0)
    errors.name_rank("rank 1: ")  # (as mpippo.comm names a rank of several: each rank's envs close)
    try:
        env.close()  # at the end of a run whose results are written: one warning, not a failed run
    finally:
        errors.name_rank("")
    err = capsys.readouterr().err
    assert err.startswith("mpippo: warning: rank 1: env.name: 'gym:mpippo-test/Faulty-v0' raised RuntimeError: the "
                          "user's env could not close in its close(), at '") and err.endswith("in close; ignored\n"), err


def test_procgens_exploration_mode_makes_its_one_level_and_a_wide_seed_wraps():
    """The exploration mode (its games only) sets procgen's own level: passing num_levels and
    start_level as every other mode does made procgen assert (a traceback on every rank); a seed past
    31 bits (an actor's reseed after many resumes) tripped gym3's option check."""
    cfg = C.resolve(C.build({}, [("env", "name", "coinrun"), ("env", "distribution_mode", "exploration")], 1), 1)
    assert envs.family(cfg).check(cfg) == []
    env = envs.make_env(cfg, 2, seed=2**31 + 5)
    env.act(np.zeros(2, dtype=np.int64))
    assert env.observe()[1].shape == (2, 64, 64, 3)
    env.close()


@pytest.mark.parametrize("shape, refused", [((4, 84, 84), True), ((12, 84, 84), True), ((9, 64, 64), True),
                                            ((1, 16, 16), True), ((4, 10, 10), True), ((2, 8, 8), True),
                                            ((84, 84, 4), False), ((64, 64, 12), False), ((10, 10, 4), False),
                                            ((4, 7, 16), False), ((4, 4, 16), False), ((6, 7, 2), False),
                                            ((32, 32, 64), False), ((210, 160, 3), False)])
def test_a_channels_first_image_space_is_refused_and_a_board_of_many_planes_is_not(shape, refused):
    """Frames stacked channels-first (4 grey or 4 RGB frames: 4 or 12 planes of 84x84) would train as
    pictures a few pixels high; a small board with many planes (4 x 7 of 16) is channels-last and trains."""
    import gymnasium as gym

    from mpippo.envs.gym import _spaces_of

    class Env:
        observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        action_space = gym.spaces.Discrete(3)
    if not refused:
        assert _spaces_of(Env()).obs_shape == shape
        return
    with pytest.raises(C.UsageError, match=r"looks channels-first \(C, H, W\); allowed: channels-last images"):
        _spaces_of(Env())


def pz_cfg(name="pz:nim", spec="mpippo_user_envs:make_nim", **kwargs):
    if USER_ENVS not in sys.path:
        sys.path.insert(0, USER_ENVS)
    over = [("env", "name", name), ("env", "import", spec), ("env", "kwargs", kwargs)]
    return C.resolve(C.build({}, over, 1), 1)


def perfect_nim(obs, mask):
    """Leave a multiple of 4 where one can (take pile % 4), else the smallest legal take."""
    pile = obs.argmax(1)
    take = np.where(pile % 4 > 0, pile % 4, 1)
    return np.minimum(take, mask.sum(1)) - 1


def test_a_users_own_two_player_game_plays_behind_the_batch_interface():
    """pz:<name> with env.import module:callable: the user's AEC game (Nim, vector observations) with
    its env.kwargs; the learner's reward is its own until its next turn, a game's outcome the sign of
    its total, the seats alternate, and play_games rates a perfect player against the random one."""
    from mpippo.envs.connect4 import random_opponent
    from mpippo.envs.pettingzoo import FAMILY
    cfg = pz_cfg(stones=5)
    sp = envs.spaces_of(cfg)
    assert (sp.obs_shape, sp.obs_dtype, sp.num_actions) == ((6,), "float32", 3)
    env = envs.make_env(cfg, 2, seed=0)
    rec = Recorder()  # takes 1 stone (the leftmost legal action)
    env.set_opponent(rec)
    seats = env.agent_first.copy()
    _, obs, first = env.observe()
    assert obs.dtype == np.float32 and first.all() and list(obs.argmax(1)) == [5 if f else 4 for f in seats]
    rewards = []
    for _ in range(3):  # the learner takes 1 as well: who started takes the 5th stone
        env.act(np.zeros(2, dtype=np.int64))
        rewards.append(env.observe()[0])
    ended = {int(i): float(r) for i, r in rec.ended}
    assert ended == {i: 1.0 if f else -1.0 for i, f in enumerate(seats)}
    assert list(env.outcomes) == [ended[0], ended[1]] and list(env.agent_first) == list(~seats)
    assert [sum(float(r[i]) for r in rewards) for i in (0, 1)] == [ended[0], ended[1]]  # (the opening moves earn 0)
    rng = np.random.default_rng(0)
    w, d, l = FAMILY.play_games(pz_cfg(), perfect_nim, random_opponent(rng), 200, seed=1)
    assert w + d + l == 200 and d == 0 and w > 150  # (9 stones: who starts wins; second, a random first errs often)


@pytest.mark.parametrize("fault, expect", [
    ("raise", "raised RuntimeError: the user's game broke in its step() (move "),
    ("nan-reward", "returned a reward of nan at move "),
    ("text-reward", "returned a reward of '1.0' (str) at move "),
    ("none-terminated", "returned a termination of None (NoneType) at move "),
    ("wrong-shape", "returned an observation of shape (9,) and a mask of (3,) at move "),
    ("endless", "went on for 10,000 moves in one game without ending it")])
def test_a_users_two_player_game_that_breaks_mid_run_is_named_in_one_line(fault, expect):
    from mpippo.errors import EnvFailure
    env = envs.make_env(pz_cfg(fault=fault, at=3), 4, seed=0)
    with pytest.raises(EnvFailure) as e:
        for _ in range(20):
            env.act(env.action_mask().argmax(1))
    line = str(e.value)
    assert line.startswith("env.name: 'pz:nim' ") and expect in line and "\n" not in line, line
    if fault == "raise":  # the game's own line
        assert "mpippo_user_envs.py':" in line and "in step;" in line, line


def test_a_users_two_player_game_that_breaks_in_its_opening_moves_is_refused_at_start_up():
    """The games are made, reset and opened (the opponent's first moves) when the envs are made: a
    failure there is a start-up refusal (UsageError: nothing of the run is written yet), not a
    failure mid-run."""
    with pytest.raises(C.UsageError) as e:
        envs.make_env(pz_cfg(fault="raise", at=1), 4, seed=0)  # (seed 0: the opponent opens a game)
    assert str(e.value).startswith("env.name: 'pz:nim': making 4 and starting their games failed (raised "
                                   "RuntimeError: the user's game broke in its step() (move 1 of this rank), at '")


def test_games_that_end_in_their_opening_moves_are_counted_and_begun_anew():
    """Nim of one stone: whoever opens takes it and wins. Games the opponent opens end before the
    learner moves: they are counted (a loss), begun anew (the learner opening the next), and the
    learner never has to move in a finished game (no illegal move, no step of a game that is over)."""
    env = envs.make_env(pz_cfg(stones=1), 4, seed=0)
    rec = Recorder()
    env.set_opponent(rec)
    assert env.action_mask().any(1).all() and env.illegal_moves == 0
    assert all(r == -1.0 for _, r in rec.ended) and len(rec.ended) == len(rec.started) - 4
    for _ in range(3):
        env.act(np.zeros(4, dtype=np.int64))
        assert env.observe()[2].all() and env.illegal_moves == 0
    assert sorted(set(float(r) for _, r in rec.ended)) == [-1.0, 1.0]


def test_games_lost_before_the_learners_first_move_are_reported_and_evaluated():
    """Nim of one stone: the learner's move wins a game, and the next, which the opponent opens, is lost
    in the same act before the learner sees it (no reward, no `first` flag of its own). Episodes, as
    runs report them and evaluate counts them, are both: the true rate 0.5, where counting the
    learner's turns alone said 1.0."""
    from mpippo.evaluate import play
    from mpippo.metrics.timers import Stopwatch
    env = envs.make_env(pz_cfg(stones=1), 4, seed=0)
    ep_ret, ep_len = np.zeros(4), np.zeros(4, dtype=np.int64)
    env.act(np.zeros(4, dtype=np.int64))
    idx, ret, length = envs.ended_episodes(env, env.observe()[2], ep_ret, ep_len)
    assert sorted(zip(ret.tolist(), length.tolist())).count((-1.0, 0)) >= 4 and (1.0, 1) in zip(ret, length)
    fresh, rec = envs.make_env(pz_cfg(stones=1), 4, seed=0), Recorder()  # its first games' openings ended some,
    assert len(fresh.results) > 0                                        # not yet reported ...
    fresh.set_opponent(rec)  # ... and another opponent's games are not the last one's
    assert sorted(fresh.episodes()[1].tolist()) == sorted(r for _, r in rec.ended) and len(rec.ended) > 0
    returns, lengths, _ = play(envs.make_env(pz_cfg(stones=1), 4, seed=1), lambda obs, mask: np.zeros(4, np.int64),
                               np.full(4, 10), 100, None, 0, Stopwatch(("env_step", "inference")))
    assert len(returns) == 40 and sorted(set(returns)) == [-1.0, 1.0] and abs(np.mean(returns)) <= 0.1, returns
    assert all(n == (1 if r > 0 else 0) for r, n in zip(returns, lengths))


def test_an_illegal_move_loses_the_game_without_reaching_it():
    """PPO and A2C do not mask: the learner's illegal move ends the game as its loss, -1, and the
    game's own step never sees it (a raw AEC env would raise on it)."""
    env = envs.make_env(pz_cfg(stones=2, max_take=3), 2, seed=0)
    steps = [g.moves for g in env.games]
    env.act(np.full(2, 2))  # take 3 of 2 (or of 1, where the opponent opened)
    rew, _, first = env.observe()
    assert list(rew) == [-1.0, -1.0] and first.all() and env.illegal_moves == 2
    assert [g.moves for g in env.games] <= [m + 1 for m in steps]  # (at most a new game's opening move)


class Fake:
    """possible_agents and spaces, as _spaces_of reads them from a made game."""
    def __init__(self, obs, n=3, agents=("a", "b")):
        from gymnasium import spaces
        self.possible_agents = list(agents)
        self.obs = spaces.Dict({"observation": obs, "action_mask": spaces.Box(0, 1, (n,), np.int8)})
        self.n = n

    def observation_space(self, agent):
        return self.obs

    def action_space(self, agent):
        from gymnasium import spaces
        return spaces.Discrete(self.n)


@pytest.mark.parametrize("space, n, agents, expect", [
    (("uint8", 0, 1, (3, 3, 2)), 3, "ab", "planes"),
    (("int8", 0, 1, (3, 3, 2)), 3, "ab", "planes"),
    (("uint8", 0, 255, (8, 8, 3)), 3, "ab", "uint8"),
    (("float32", -5, 5, (7,)), 3, "ab", "vector"),
    (("float32", 0, 1, (3, 3, 2)), 3, "ab", "its observations Box(0.0, 1.0, (3, 3, 2), float32) are not supported"),
    (("int8", 0, 1, (2, 8, 8)), 3, "ab", "look channels-first (C, H, W)"),
    (("int8", 0, 1, (3, 3, 2)), 3, "aa", "has 2 agent(s) (a, a); allowed: two-player games (possible_agents of two, named"),
    (("int8", 0, 1, (3, 3, 2)), 1100, "ab", "has 1,100 actions (allowed: up to 1,024)"),
    (("float32", 0, 1, (2_000_000,)), 3, "ab", "has observations of shape (2000000,) (allowed: each dimension up to")])
def test_a_games_spaces_are_read_or_refused_in_one_line(space, n, agents, expect):
    """0/1 planes of any integer dtype (uint8 too) are scaled to 0/255 for the CNNs; uint8 pictures
    kept; float planes, channels-first planes, one agent twice and spaces past what a network (and a
    checkpoint) is built for are refused."""
    from gymnasium import spaces
    from mpippo.envs.pettingzoo import _spaces_of
    dtype, low, high, shape = space
    game = Fake(spaces.Box(low, high, shape, np.dtype(dtype)), n, agents)
    if expect in ("planes", "uint8", "vector"):
        sp, kind = _spaces_of(game, "pz:g")
        assert kind == expect and sp.obs_shape == shape and sp.num_actions == n
    else:
        with pytest.raises(C.UsageError) as e:
            _spaces_of(game, "pz:g")
        assert expect in str(e.value), str(e.value)


def test_a_games_constructor_that_sets_torchs_default_dtype_is_put_back():
    import torch
    from mpippo.envs import gym as gym_family
    envs.spaces_of(pz_cfg(spec="mpippo_user_envs:make_float64_game"))
    assert torch.get_default_dtype() == torch.float32
    assert any("float64" in said for said in gym_family.undone())


def test_a_gymnasium_env_with_more_actions_than_a_network_is_built_for_is_refused():
    """(A checkpoint of such a run could not be loaded again: model_spec's bounds are the same.)"""
    from gymnasium import spaces
    from mpippo.envs.gym import _spaces_of
    env = type("Wide", (), {"observation_space": spaces.Box(-1, 1, (4,), np.float32),
                            "action_space": spaces.Discrete(1100)})()
    with pytest.raises(C.UsageError) as e:
        _spaces_of(env)
    assert "1,100 actions (allowed: up to 1,024)" in str(e.value)


def test_video_of_an_env_without_render_mode_names_video_not_the_users_kwargs():
    """--video makes its env with render_mode='rgb_array': an env whose constructor takes none was
    refused as 'making ... with env.kwargs {} failed', blaming settings the user never gave."""
    from mpippo.evaluate import check_render
    with pytest.raises(C.UsageError) as e:
        check_render(user_cfg("gym:mpippo-test/Steady-v0"))
    assert str(e.value).startswith("--video: making 'mpippo-test/Steady-v0' with render_mode='rgb_array' failed (") \
        and str(e.value).endswith("allowed: an env whose constructor takes render_mode (Gymnasium's rendering API)")


def test_a_resume_compares_env_kwargs_as_they_act():
    """Entries at what the env takes anyway compare as absent (an int for a float default); bools stay
    bools; a default holding an array (Humanoid's camera) is compared without a traceback, and kept."""
    gym_family, atari = envs.family_of("gym:CartPole-v1"), envs.family_of("atari:Pong")
    assert gym_family.acting_kwargs("gym:HalfCheetah-v5", {"forward_reward_weight": 1, "frame_skip": 5}) == {}
    assert gym_family.acting_kwargs("gym:CartPole-v1", {"sutton_barto_reward": 0}) == {"sutton_barto_reward": 0}
    assert gym_family.acting_kwargs("gym:CartPole-v1", {"max_episode_steps": 500, "x": 1}) == {"x": 1}
    camera = {"default_camera_config": {"trackbodyid": 1, "distance": 4.0, "lookat": [0, 0, 1], "elevation": -20}}
    assert gym_family.acting_kwargs("gym:Humanoid-v5", camera) == camera
    assert gym_family.acting_kwargs("gym:NoSuchEnv-v0", {"a": 1}) == {"a": 1}
    assert atari.acting_kwargs("atari:Pong", {"noop_max": 30, "repeat_action_probability": 0, "reward_clip": False}) \
        == {"reward_clip": False}
