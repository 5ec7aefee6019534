"""`atari:<Game>`: the Arcade Learning Environment's games through ale-py's own C++ vector env.

ale-py rather than EnvPool: an 8.5 MB wheel with its 108 ROMs inside (EnvPool installs about 930 MB
with its dependencies, mostly MuJoCo assets), Farama's reference emulator, as fast at one thread per rank (about 1,100
steps/s for Pong on one core of a loaded 2-core machine, EnvPool about 1,000), and both autoreset
modes. Each rank steps its batch on `num_threads` worker threads of its own (1 unless the rank
was given more cores: ALE's default, one thread per core of the machine, would oversubscribe a
node of one rank per core), unpinned, so the rank's own binding holds.

The preprocessing is the one CleanRL's ppo_atari_envpool.py and the Ape-X paper use: 4 frames
skipped with the last two max-pooled, 84x84 grayscale, 4 frames stacked (the observation is
(84, 84, 4) uint8, frames last as every image here; a game's first observation repeats its first frame
in the older slots, as EnvPool and baselines' FrameStack do, where ale-py's vector env leaves them black:
after that the frames are EnvPool's, pixel for pixel), up to 30 no-op starts, FIRE on reset where the
game needs it, no sticky actions (env.kwargs: repeat_action_probability 0.25 for the "v5"
protocol of Machado et al.), the minimal action set, 27,000 agent steps (108,000 frames, 30
minutes of play) at most per game.

For training, a lost life ends the episode (episodic_life, as baselines' EpisodicLifeEnv: the
value is not bootstrapped across it, the game goes on) and rewards are clipped to their sign
(reward_clip). Neither touches what is reported: `episodes()` gives the real games that ended, their
unclipped return over all lives, which is what CleanRL and the papers report.

Games cannot be saved and restored per env (neither ale-py's vector env nor EnvPool can): a resume
starts fresh games.
"""
from __future__ import annotations

import difflib
import functools
import re

import numpy as np

from mpippo.envs.family import EnvFamily, Spaces
from mpippo.envs.atari_scores import SCORES
from mpippo.usage import show

PREFIX = "atari:"
FRAME_SKIP, STACK, SIZE = 4, 4, 84
# env.kwargs of an atari env: name -> (default, check, what is allowed)
OPTIONS = {
    "repeat_action_probability": (0.0, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and 0.0 <= v <= 1.0, "a number in [0, 1] (sticky actions; 0.25 is the v5 protocol)"),
    "full_action_space": (False, lambda v: isinstance(v, bool), "true or false (all 18 actions)"),
    "noop_max": (30, lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1000,
                 "an integer in [0, 1000] (no-op actions at a game's start)"),
    "max_episode_steps": (27_000, lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 10**7,
                          "an integer in [1, 10000000] (agent steps, 4 frames each)"),
    "episodic_life": (True, lambda v: isinstance(v, bool), "true or false (a lost life ends a training episode)"),
    "reward_clip": (True, lambda v: isinstance(v, bool), "true or false (train on the rewards' signs)"),
}


def rom_id(game: str) -> str:
    """'MsPacman', 'ms_pacman' or 'mspacman' -> ALE's ROM id ('ms_pacman'), looked up without case or
    underscores: a rule from the CamelCase name misses some ('UpNDown' -> 'up_ndown', 'TicTacToe3d'
    -> 'tic_tac_toe3d'). A name of no game comes back snake_cased, for the hint."""
    return _by_key().get(game.replace("_", "").lower()) or re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", game).lower()


def camel(rom: str) -> str:
    return "".join(part.capitalize() for part in rom.split("_"))


@functools.cache
def _roms() -> list[str]:
    from ale_py import roms
    return list(roms.get_all_rom_ids())


@functools.cache
def _by_key() -> dict[str, str]:
    try:
        return {r.replace("_", ""): r for r in _roms()}
    except ImportError:  # no ale-py here: names are spelled out, and the check says what is missing
        return {}


def unknown_game(game: str, prefix: str = "atari:") -> str | None:
    """Why `game` is not one of ale-py's games (with the closest one, as `prefix` + name), or None if it is."""
    roms = _roms()
    if rom_id(game) in roms:
        return None
    near = difflib.get_close_matches(rom_id(game), roms, n=1)
    hint = f" (did you mean '{prefix}{camel(near[0])}'?)" if near else ""
    return f"'{game}' is not an ALE game{hint}; allowed: the {len(roms)} games of ale-py " \
           f"{', '.join(camel(r) for r in roms[:6])}, ..."


def options(cfg) -> dict:
    """The env's settings: env.kwargs over the defaults (checked by AtariFamily.check)."""
    return {k: cfg.env.kwargs.get(k, default) for k, (default, _, _) in OPTIONS.items()}


class AtariFamily(EnvFamily):
    name = "atari"
    exact_resume = False  # no per-env save and restore: a resume starts fresh games
    static_spaces = False  # the action count is the ROM's (its minimal set): read from an env
    keys = ("kwargs",)

    def __init__(self):
        self._actions: dict = {}

    def accepts(self, name: str) -> bool:
        return isinstance(name, str) and name.startswith(PREFIX)

    def acting_kwargs(self, name: str, kwargs: dict) -> dict:
        """Left out: the options set to their defaults (noop_max 30, ...), which the game takes anyway."""
        return {k: v for k, v in kwargs.items() if k not in OPTIONS or v != OPTIONS[k][0]}

    def canonical(self, name: str) -> str:
        """'atari:ms_pacman' and 'atari:MsPacman' -> 'atari:MsPacman'."""
        return PREFIX + camel(rom_id(name[len(PREFIX):])) if self.accepts(name) else name

    def allowed(self) -> str:
        return "atari:<Game> (an ALE game, e.g. atari:Breakout, atari:Pong)"

    def check(self, cfg) -> list[str]:
        game = cfg.env.name[len(PREFIX):]
        errs = []
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", game):
            return [f"env.name: '{cfg.env.name[:80]}' is not atari:<Game> with an ALE game such as atari:Breakout"]
        try:
            unknown = unknown_game(game)
        except ImportError as e:
            return [f"env.name: '{cfg.env.name}' needs the ale-py package, which does not import ({e})"]
        if unknown:
            errs.append(f"env.name: {unknown}")
        for key, value in cfg.env.kwargs.items():
            if key not in OPTIONS:
                errs.append(f"env.kwargs.{key}: not an option of atari envs; allowed: {', '.join(OPTIONS)}")
            elif not OPTIONS[key][1](value):
                errs.append(f"env.kwargs.{key}: {show(value)} is not {OPTIONS[key][2]}")
        return errs

    def spaces(self, cfg) -> Spaces:
        key = (rom_id(cfg.env.name[len(PREFIX):]), bool(options(cfg)["full_action_space"]))
        if key not in self._actions:  # the ROM's minimal action set: one env, once per process
            env = AtariVecEnv(cfg, 1, seed=0)
            self._actions[key] = env.num_actions
            env.close()
        return Spaces((SIZE, SIZE, STACK), "uint8", self._actions[key])

    def make(self, cfg, num_envs: int, seed: int, num_threads: int = 0, render: bool = False):
        return AtariVecEnv(cfg, num_envs, seed, num_threads)

    def score_range(self, name: str, mode: str) -> tuple[float, float] | None:
        """(random, human): the human-normalized score (mpippo/envs/atari_scores.py; the 57 games)."""
        return SCORES.get(rom_id(name[len(PREFIX):]))

    def check_state(self, v, path: str, cfg, n: int, schema) -> None:
        schema.need(v is None, path, "expected none (an Atari game's state is not saved)")


class AtariVecEnv:
    """num_envs games behind the batch interface, with `truncated()` (time limits) and `episodes()`
    (the real games that ended, unclipped returns over all lives)."""

    def __init__(self, cfg, num_envs: int, seed: int, num_threads: int = 0):
        import gymnasium
        from ale_py.vector_env import AtariVectorEnv
        o = options(cfg)
        self.clip = o["reward_clip"]
        # SAME_STEP: a game that ends is reset inside the step that ended it, so the observation
        # returned is the next game's (the batch interface's `first`); life_loss_info ends the
        # episode on a lost life without resetting the game (its episodic_life would restart it)
        self.env = AtariVectorEnv(
            rom_id(cfg.env.name[len(PREFIX):]), num_envs, num_threads=max(1, int(num_threads)),
            thread_affinity_offset=-1, autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
            life_loss_info=o["episodic_life"], reward_clipping=False,
            repeat_action_probability=float(o["repeat_action_probability"]),
            full_action_space=o["full_action_space"], noop_max=o["noop_max"],
            max_num_frames_per_episode=FRAME_SKIP * o["max_episode_steps"], img_height=SIZE, img_width=SIZE,
            grayscale=True, stack_num=STACK, frameskip=FRAME_SKIP, maxpool=True, use_fire_reset=True)
        self.num_envs, self.obs_shape = num_envs, (SIZE, SIZE, STACK)
        self.num_actions = int(self.env.single_action_space.n)
        # ALE takes 32-bit seeds: rank seeds reach 2**31 - 2, and env i adds i (wrapped: still distinct)
        obs, info = self.env.reset(seed=(np.arange(num_envs, dtype=np.int64) + int(seed)) % 2**31)
        self.game_return = np.zeros(num_envs, dtype=np.float64)
        self.game_length = np.zeros(num_envs, dtype=np.int64)  # agent steps since each game's start
        self.obs = self._pad(self._frames_last(obs))
        self.frame = info["episode_frame_number"].copy()
        self.start = self.frame.copy()  # each game's frame number at its first observation (after its no-ops)
        self.rew = np.zeros(num_envs, dtype=np.float32)
        self.first = np.ones(num_envs, dtype=bool)
        self.ended = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))
        self.ended_start = np.zeros(0, dtype=np.int64)
        self.no_cut = (np.zeros(0, dtype=np.int64), np.zeros((0, *self.obs_shape), dtype=np.uint8))
        self.cut = self.no_cut

    @staticmethod
    def _frames_last(obs: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(obs.transpose(0, 2, 3, 1))  # (N, 4, 84, 84) -> (N, 84, 84, 4)

    def _pad(self, obs: np.ndarray) -> np.ndarray:
        """The slots older than a young game's first frame hold that frame (ale-py leaves them zero)."""
        for i in np.flatnonzero(self.game_length < STACK - 1):
            first = STACK - 1 - self.game_length[i]
            obs[i, :, :, :first] = obs[i, :, :, first:first + 1]
        return obs

    def observe(self):
        return self.rew, self.obs, self.first

    def act(self, actions: np.ndarray) -> None:
        obs, rew, term, trunc, info = self.env.step(np.asarray(actions, dtype=np.int64))
        raw = np.asarray(rew, dtype=np.float32)
        self.game_return += raw
        self.game_length += 1
        frame = info["episode_frame_number"]
        over = trunc | (frame < self.frame)  # the game was reset in this step: it ended (lost lives do not reset)
        self.frame = frame.copy()
        self.ended = (np.flatnonzero(over), self.game_return[over].copy(), self.game_length[over].copy())
        self.ended_start, self.start[over] = self.start[over].copy(), frame[over]
        self.game_return[over], self.game_length[over] = 0.0, 0
        self.obs = self._pad(self._frames_last(obs))  # (after the reset above: a new game is 0 steps old)
        self.rew = np.sign(raw) if self.clip else raw
        self.first = np.logical_or(term, trunc)
        cut = np.flatnonzero(np.logical_and(trunc, np.logical_not(term)))
        self.cut = ((cut, np.stack([np.asarray(info["final_obs"][i]).transpose(1, 2, 0) for i in cut]))
                    if len(cut) else self.no_cut)

    def truncated(self) -> tuple[np.ndarray, np.ndarray]:
        """(env indices, final observations) of the games the time limit cut at the last act."""
        return self.cut

    def episodes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(env indices, returns, lengths in agent steps) of the real games that ended at the last
        act: unclipped, over all lives; what runs report instead of their sums of training rewards."""
        return self.ended

    def episode_start_frames(self) -> np.ndarray:
        """The frame number at which each game `episodes()` last gave began (after its no-op start):
        its parity is the game's frame phase, which a policy playing by rote depends on (evaluate)."""
        return self.ended_start

    def render(self) -> np.ndarray:
        """The newest frame of env 0, as the RGB picture a video takes."""
        return np.repeat(self.obs[0, :, :, -1:], 3, axis=2)

    def get_state(self):
        return None  # not exact_resume: a resume starts fresh games

    def set_state(self, state) -> None:
        raise ValueError("an Atari game's state cannot be restored")

    def close(self) -> None:
        """Close the games and let go of ale-py's native vector env now: a run's objects made during its
        start-up are frozen (runctl.end_startup_gc_pause), so one in a cycle would outlive the
        interpreter's end, where nanobind reports it as leaked in some thirty lines of stderr."""
        if self.env is not None:
            self.env.close()
            self.env.ale = self.env = None


FAMILY = AtariFamily()
