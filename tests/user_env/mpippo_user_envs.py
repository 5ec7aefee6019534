"""A user's own Gymnasium envs, written as a user's package would write them, for the tests. Never
imported by mpippo unless a config names it (env.import: mpippo_user_envs); importing it
registers its ids, like a user's package would.

- `mpippo-test/Steady-v0`: the observation never changes, every step earns 1, the episode never
  ends by itself: a time limit (5 steps) cuts it. Its true value is 1 / (1 - gamma) everywhere.
- `mpippo-test/Ending-v0`: the same, but the episode terminates after 5 steps (a real end).
- `mpippo-test/Faulty-v0`: Steady (cut at 5 steps) that breaks at a chosen step, as a user's env with a bug
  would (`fault`, below).
- `make_corridor`: an entry point (env.import: mpippo_user_envs:make_corridor) for a walk to the
  right end of a corridor of 6 cells (Discrete(2) actions starting at 1: a non-zero start).
"""
import os
import signal
import sys
import threading

import gymnasium as gym
import numpy as np

LIMIT = 5


class Steady(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, ends: bool = False):
        self.ends, self.t = ends, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([1.0, 0.0, -1.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([1.0, 0.0, -1.0], np.float32), 1.0, self.ends and self.t >= LIMIT, False, {}


class Corridor(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (6,), np.float32)
    action_space = gym.spaces.Discrete(2, start=1)  # 1 = left, 2 = right

    def __init__(self, length: int = 6):
        self.length, self.pos = length, 0
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)

    def _obs(self):
        obs = np.zeros(self.length, np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {}

    def step(self, action):
        assert action in (1, 2), action
        self.pos = min(max(self.pos + (1 if action == 2 else -1), 0), self.length - 1)
        done = self.pos == self.length - 1
        return self._obs(), 1.0 if done else -0.01, done, False, {}


def make_corridor(**kwargs):
    return Corridor(**kwargs)


gym.register(id="mpippo-test/Steady-v0", entry_point=Steady, max_episode_steps=LIMIT)
gym.register(id="mpippo-test/Ending-v0", entry_point=Steady, kwargs={"ends": True})


class DictObs(Steady):
    observation_space = gym.spaces.Dict({"a": gym.spaces.Discrete(3)})


class FloatImage(Steady):
    observation_space = gym.spaces.Box(0.0, 1.0, (8, 8, 3), np.float32)


class Broken(Steady):
    def __init__(self):
        raise ValueError("this env cannot be made")


gym.register(id="mpippo-test/DictObs-v0", entry_point=DictObs)
gym.register(id="mpippo-test/FloatImage-v0", entry_point=FloatImage)
gym.register(id="mpippo-test/Broken-v0", entry_point=Broken)


class Target(gym.Env):
    """Continuous control in one line: the observation is a target in [-1, 1] (with a constant 5 as
    a second dimension, so observation normalization has a mean to remove), the action a point in
    [-2, 2]; the reward is -(action - target)^2; 16 steps an episode, ended by a time limit. A
    policy that ignores the target scores about -5.3 (the target's variance 1/3 x 16), a perfect one 0."""
    observation_space = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 10.0], np.float32))
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = self.np_random.uniform(-1.0, 1.0)
        return np.array([self.target, 5.0], np.float32), {}

    def step(self, action):
        reward = -float((float(np.asarray(action).reshape(-1)[0]) - self.target) ** 2)
        self.target = self.np_random.uniform(-1.0, 1.0)
        return np.array([self.target, 5.0], np.float32), reward, False, False, {}

    def render(self):
        frame = np.zeros((32, 64, 3), np.uint8)
        frame[:, int((self.target + 1) * 31.5)] = 255
        return frame


gym.register(id="mpippo-test/Target-v0", entry_point=Target, max_episode_steps=16)


class MultiAction(Steady):
    action_space = gym.spaces.MultiDiscrete([2, 3])


class ImageBoxActions(Steady):
    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


gym.register(id="mpippo-test/MultiAction-v0", entry_point=MultiAction)
gym.register(id="mpippo-test/ImageBoxActions-v0", entry_point=ImageBoxActions)


class Strict(Steady):
    """float64 Box actions within +-0.1, checked as Gymnasium's own spaces check them (float32's 0.1 is
    0.10000000149, outside); its info carries a path whose length differs from env to env and step to
    step, as the one-env API allows; its kwargs are what it was made with (scale: a float, other: any)."""
    action_space = gym.spaces.Box(-0.1, 0.1, (2,), np.float64)
    made = 0

    def __init__(self, scale: float = 1.0, other=None):
        super().__init__()
        Strict.made += 1
        self.kwargs, self.k = {"scale": scale, "other": other}, Strict.made

    def step(self, action):
        self.last = action
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} outside {self.action_space}")
        obs, reward, terminated, truncated, _ = super().step(0)
        return obs, reward, terminated, truncated, {"path": np.zeros(self.k + self.t)}


class IntegerBox(Steady):
    action_space = gym.spaces.Box(0, 5, (2,), np.int64)


class Offset(Target):
    """Target's task with actions in [5, 6]: the Gaussian's first draws (mean 0) all clip to 5."""
    action_space = gym.spaces.Box(5.0, 6.0, (1,), np.float32)


class OldReset(Steady):
    """The older gym API: reset returns the observation alone."""

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed)[0]


gym.register(id="mpippo-test/Strict-v0", entry_point=Strict)
gym.register(id="mpippo-test/IntegerBox-v0", entry_point=IntegerBox)
gym.register(id="mpippo-test/Offset-v0", entry_point=Offset, max_episode_steps=16)
gym.register(id="mpippo-test/OldReset-v0", entry_point=OldReset)


class WrongShape(Steady):
    """Declares 3 numbers and resets to 4."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}


class Shifting(Steady):
    """Each env made declares one number more than the one before."""
    made = 0

    def __init__(self):
        super().__init__()
        Shifting.made += 1
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (Shifting.made,), np.float32)


class ChannelsFirst(Steady):
    """Frames stacked channels-first (4, 84, 84), as a PyTorch-minded wrapper makes them."""
    observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


gym.register(id="mpippo-test/WrongShape-v0", entry_point=WrongShape)
gym.register(id="mpippo-test/ChannelsFirst-v0", entry_point=ChannelsFirst)
gym.register(id="mpippo-test/Shifting-v0", entry_point=Shifting)
# an env whose module needs a package this machine lacks (as Box2D's envs without box2d)
gym.register(id="mpippo-test/MissingDep-v0", entry_point="mpippo_user_envs_missing_dependency:Env")


def _wait_in_native_code() -> None:
    """Forever, in C that retries when a signal interrupts it, as a library's blocking call may: a
    default pthread mutex locked twice by one thread (glibc waits on its futex again after the
    signal's C-level handler; Python's own handler, which runs only between bytecodes, never runs).
    ctypes releases the interpreter's lock around the call. Makes $MPIPPO_TEST_ENV_MARK first."""
    import ctypes
    if os.environ.get("MPIPPO_TEST_ENV_MARK"):
        open(os.environ["MPIPPO_TEST_ENV_MARK"], "w").close()
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER (40 bytes on x86-64)
    lock = ctypes.CDLL(None).pthread_mutex_lock
    lock(mutex)
    lock(mutex)


class Faulty(Steady):
    """Steady until this process's envs have taken `at` steps in all, then broken as `fault` says:
    raise, exit (sys.exit(3), the code a requeue exits with), generator-exit, nan-reward, huge-reward (1e39), none-reward,
    text-reward ("1.0"), none-terminated, inf-obs, nan-final (the
    observation a time limit cuts on), four-tuple (the old gym API), shape (4 numbers for 3), hang (waits
    forever in native code, the interpreter's lock released, as a simulator waiting on its server), hang-native
    (the same in native code that no signal brings back to Python: `_wait_in_native_code`), render,
    render-float (frames of float32 once broken), close; make (its constructor raises once `at` envs were made in this process); exit-make, exit-reset (sys.exit(3) in its constructor, sys.exit(0) in its reset); hang-make, hang-native-make (its constructor hangs, as hang and hang-native; the native one once `at` envs were made); nan-reset (its reset's observation is NaN); swap-space (its reset swaps its observation space for another); late-signals (its
    step number `at` sets the stop signals' handlers to the default, as a library started lazily, and
    creates the file $MPIPPO_TEST_ENV_MARK if set); or signals: its constructor sets the stop signals' handlers to the default; or leave-process: its constructor starts `sleep 3007`, which nothing ends; or process-state: its constructor blocks them, makes torch's default dtype float64 and changes the working folder to $MPIPPO_TEST_ENV_CHDIR. On the rank `rank` only (-1: all). MPIPPO_TEST_ENV_FAULT="fault@at" overrides the arguments,
    so a run trained sound can be evaluated broken."""
    metadata = {"render_modes": ["rgb_array"]}
    steps = 0  # this process's, all envs
    made = 0   # envs this process made

    def __init__(self, fault: str = "", at: int = 0, rank: int = -1, render_mode=None):
        super().__init__()
        if os.environ.get("MPIPPO_TEST_ENV_FAULT"):
            fault, at = os.environ["MPIPPO_TEST_ENV_FAULT"].split("@")
        mine = rank < 0 or os.environ.get("OMPI_COMM_WORLD_RANK", "0") == str(rank)
        Faulty.made += 1
        if mine and fault == "make" and Faulty.made > int(at):
            raise RuntimeError(f"the user's env could not start its simulator (env {Faulty.made})")
        if mine and fault == "exit-make":  # (the requeue's exit code: passed on, a batch script would requeue)
            sys.exit(3)
        if mine and fault == "hang-make":  # (a simulator's start that waits on a server: Python's handlers run)
            if os.environ.get("MPIPPO_TEST_ENV_MARK"):
                open(os.environ["MPIPPO_TEST_ENV_MARK"], "w").close()
            threading.Event().wait()
        if mine and fault == "hang-native-make" and Faulty.made > int(at):
            _wait_in_native_code()
        self.fault, self.at, self.render_mode = (fault if mine else ""), int(at), render_mode
        if self.fault == "leave-process":  # a simulator's server that close() does not stop (it outlives the run)
            import subprocess
            subprocess.Popen(["sleep", "3007"], stdin=subprocess.DEVNULL)
        if self.fault == "signals":  # as SDL's start-up does: a library's own handlers for the stop signals
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                signal.signal(sig, signal.SIG_DFL)
        if self.fault == "process-state":  # a simulator's set-up: what a library may change in the whole process
            import torch
            signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1))
            torch.set_default_dtype(torch.float64)
            os.chdir(os.environ["MPIPPO_TEST_ENV_CHDIR"])

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        if self.fault == "exit-reset":
            sys.exit(0)
        if self.fault == "nan-reset":
            obs = np.full(3, np.nan, np.float32)
        if self.fault == "swap-space":  # (its reset declares other observations than it was made with)
            self.observation_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
            obs = np.zeros(6, np.float32)
        return obs, info

    def broken(self, fault: str) -> bool:
        return self.fault == fault and Faulty.steps > self.at

    def step(self, action):
        Faulty.steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        if self.broken("raise"):
            raise RuntimeError("the user's env broke")
        if self.broken("exit"):
            sys.exit(3)
        if self.broken("os-exit"):  # (nothing in the process can catch it: the requeue's code reaches the script)
            os._exit(3)
        if self.broken("generator-exit"):  # (a BaseException, as an env built on a coroutine may let out)
            raise GeneratorExit
        if self.broken("hang"):
            if os.environ.get("MPIPPO_TEST_ENV_MARK"):  # (a test waits for the hang itself, not a guessed time)
                open(os.environ["MPIPPO_TEST_ENV_MARK"], "w").close()
            threading.Event().wait()
        if self.broken("hang-native"):
            _wait_in_native_code()
        if self.fault == "late-signals" and Faulty.steps == self.at + 1:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                signal.signal(sig, signal.SIG_DFL)
            if os.environ.get("MPIPPO_TEST_ENV_MARK"):  # (a test waits for this moment, then for mpippo's repair)
                open(os.environ["MPIPPO_TEST_ENV_MARK"], "w").close()
        if self.broken("four-tuple"):
            return obs, reward, terminated, info
        if self.broken("shape"):
            obs = np.zeros(4, np.float32)
        if self.broken("inf-obs") or (self.broken("nan-final") and self.t == LIMIT):
            obs = np.full(3, np.inf if self.fault == "inf-obs" else np.nan, np.float32)
        if self.broken("huge-reward"):  # (finite, but past float32's range)
            reward = 1e39
        if self.broken("none-reward") or self.broken("text-reward"):  # (numpy's float arrays take both: NaN, 1.0)
            reward = None if self.fault == "none-reward" else "1.0"
        if self.broken("none-terminated"):  # (a bool array takes it as False)
            terminated = None
        return obs, (np.nan if self.broken("nan-reward") else reward), terminated, truncated, info

    def render(self):
        if self.broken("render"):
            raise RuntimeError("no display")
        if self.broken("render-float"):  # (a renderer whose pictures change kind mid-run: its first is checked)
            return np.zeros((16, 16, 3), np.float32)
        return np.zeros((16, 16, 3), np.uint8)

    def close(self):
        if self.fault == "close":
            raise RuntimeError("the user's env could not close")


gym.register(id="mpippo-test/Faulty-v0", entry_point=Faulty, max_episode_steps=LIMIT)


class NoSpaces(gym.Env):
    """A first draft that declares no spaces."""

    def reset(self, *, seed=None, options=None):
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}


gym.register(id="mpippo-test/NoSpaces-v0", entry_point=NoSpaces)


class Nim:
    """A user's own two-player game, written on PettingZoo's AEC API as a user would: a pile of
    `stones`; each move takes 1, 2 or 3; who takes the last stone wins (+1, the other -1). The one
    who leaves a multiple of 4 wins, so the first player wins from 9 with perfect play. Observations
    are a one-hot of the pile (a vector: the MLP); the mask allows no more than the pile (`max_take`
    actions: take 1 to max_take).
    `fault`: a bug of the kind a user's game has, at move `at` (`raise`, `nan-reward`, `text-reward`, `none-terminated`,
    `wrong-shape`; on
    rank `fault_rank` only, if given),
    or `endless`: the second player's moves take nothing and keep the move (a game that never ends)."""

    metadata = {"name": "nim_v0", "render_modes": []}

    def __init__(self, stones: int = 9, fault: str | None = None, at: int = 3, max_take: int = 3,
                 fault_rank: int | None = None, strict: bool = False):
        from gymnasium import spaces
        if fault_rank is not None and os.environ.get("OMPI_COMM_WORLD_RANK") != str(fault_rank):
            fault = None  # (the bug shows on that rank only)
        self.stones, self.fault, self.at, self.moves, self.max_take = stones, fault, at, 0, max_take
        self.strict = strict  # an illegal move raises (a test that no player ever makes one), instead of losing
        self.possible_agents = ["first", "second"]
        self._obs = spaces.Dict({"observation": spaces.Box(0.0, 1.0, (stones + 1,), np.float32),
                                 "action_mask": spaces.Box(0, 1, (max_take,), np.int8)})

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        from gymnasium import spaces
        return spaces.Discrete(self.max_take)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.pile = self.stones
        self.rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = self.agents[0]

    def observe(self, agent):
        obs = np.zeros(self.stones + 1, np.float32)
        obs[self.pile] = 1.0
        if self.fault == "wrong-shape" and self.moves >= self.at:
            obs = obs[:-1]
        return {"observation": obs, "action_mask": np.array([self.pile >= k for k in range(1, self.max_take + 1)], np.int8)}

    def step(self, action):
        self.moves += 1
        if self.fault == "raise" and self.moves >= self.at:
            raise RuntimeError("the user's game broke")
        mover = self.agent_selection
        other = self.agents[1 - self.agents.index(mover)]
        self.rewards = {a: 0.0 for a in self.agents}
        take = int(action) + 1
        if self.fault == "endless" and mover == "second":
            return
        if take > self.pile and self.strict:
            raise RuntimeError(f"illegal move: take {take} of {self.pile}")
        if take > self.pile:  # an illegal move loses, as PettingZoo's classic games rule
            self.rewards[mover], self.rewards[other] = -1.0, 1.0
        else:
            self.pile -= take
            if self.pile == 0:
                self.rewards[mover], self.rewards[other] = 1.0, -1.0
        if self.fault in ("nan-reward", "text-reward") and self.moves >= self.at:  # (float() takes "1.0")
            self.rewards[mover] = self.rewards[other] = float("nan") if self.fault == "nan-reward" else "1.0"
        if self.pile == 0 or self.rewards[mover] not in (0.0, "0"):
            self.terminations = {a: True for a in self.agents}
        if self.fault == "none-terminated" and self.moves >= self.at:  # (read as "not over" by any())
            self.terminations = {a: None for a in self.agents}
        self.agent_selection = other

    def close(self):
        pass


def make_nim(**kwargs):
    """The entry point of the user's own two-player game (env.import: mpippo_user_envs:make_nim; its
    env.kwargs are this function's)."""
    return Nim(**kwargs)


def make_float64_game():
    """A game whose constructor sets torch's default dtype to float64 (as some users' simulators do)."""
    import torch
    torch.set_default_dtype(torch.float64)
    return Nim()


def make_unselected_game():
    """reset() names no player to move (agent_selection unset)."""
    game = Nim()
    reset = game.reset

    def forgetful_reset(seed=None, options=None):
        reset(seed, options)
        del game.agent_selection
    game.reset = forgetful_reset
    return game


def make_text_observation_game():
    """Observations of the declared shape holding text."""
    game = Nim()
    observe = game.observe
    game.observe = lambda agent: dict(observe(agent), observation=np.array(["x"] * (game.stones + 1)))
    return game


def make_no_legal_move_game():
    """An action mask with no legal move while the game goes on."""
    game = Nim()
    observe = game.observe
    game.observe = lambda agent: dict(observe(agent), action_mask=np.zeros(3, np.int8))
    return game


def make_three_player_game():
    """Not a two-player game: a third agent."""
    game = Nim()
    game.possible_agents = ["first", "second", "third"]
    return game


def make_box_action_game():
    """A game whose moves are continuous."""
    from gymnasium import spaces
    game = Nim()
    game.action_space = lambda agent: spaces.Box(-1.0, 1.0, (2,), np.float32)
    return game


def make_unmasked_game():
    """Observations without PettingZoo's action mask."""
    game = Nim()
    game.observation_space = lambda agent: game._obs["observation"]
    return game
