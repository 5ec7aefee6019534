"""One ProcgenGym3Env per rank."""
from __future__ import annotations

import contextlib
import io
import struct

import numpy as np

from mpippo.envs.family import EnvFamily, Spaces, take_rows
from mpippo.usage import UsageError


def _import_procgen():
    # procgen imports the unmaintained `gym` package, which prints a banner on import.
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        from procgen import ProcgenGym3Env
    return ProcgenGym3Env


class ProcgenVecEnv:
    def __init__(self, game: str, num_envs: int, seed: int, distribution_mode: str = "easy",
                 num_levels: int = 0, start_level: int = 0, num_threads: int = 0):
        ProcgenGym3Env = _import_procgen()
        # num_threads=0: step in the calling thread (a CPU rank's cores train); a GPU rank passes its
        # CPU share (runctl.env_threads). rand_seed: procgen's own default is a random seed, which
        # would make runs irreproducible.
        # the exploration mode sets its own one level (procgen asserts that none is given); seeds past
        # 31 bits (an actor's reseed after many resumes) wrap
        levels = {} if distribution_mode == "exploration" else {"num_levels": num_levels, "start_level": start_level}
        self.env = ProcgenGym3Env(num=num_envs, env_name=game, distribution_mode=distribution_mode, **levels,
                                  num_threads=num_threads, rand_seed=int(seed) % LEVEL_MAX)
        self.num_envs = num_envs
        self.obs_shape = tuple(self.env.ob_space["rgb"].shape)
        self.num_actions = int(self.env.ac_space.eltype.n)

    def observe(self):
        rew, ob, first = self.env.observe()
        return rew.astype(np.float32, copy=False), ob["rgb"], first.astype(bool, copy=False)

    def act(self, actions: np.ndarray) -> None:
        self.env.act(actions.astype(np.int32, copy=False))

    def get_state(self) -> list[bytes]:
        return self.env.callmethod("get_state")

    def set_state(self, states: list[bytes]) -> None:
        self.env.callmethod("set_state", states)

    def close(self) -> None:
        self.env.close()


GAMES = (
    "bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball",
    "fruitbot", "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot",
)
MODES = ("easy", "hard", "extreme", "memory", "exploration")
# the games procgen builds each of these modes for (others stop the process in its C++ or assert)
MODE_GAMES = {"extreme": ("chaser", "dodgeball", "leaper", "starpilot"),
              "memory": ("caveflyer", "dodgeball", "heist", "jumper", "maze", "miner"),
              "exploration": ("caveflyer", "climber", "coinrun", "heist", "jumper", "leaper", "maze", "ninja")}
LEVEL_MAX = 2**31 - 1  # procgen's level seeds and options are 32-bit signed ints

# (R_min, R_max) per game and mode, from the Procgen paper
SCORE_RANGES = {
    "easy": {"bigfish": (1, 40), "bossfight": (0.5, 13), "caveflyer": (3.5, 12), "chaser": (0.5, 13),
             "climber": (2, 12.6), "coinrun": (5, 10), "dodgeball": (1.5, 19), "fruitbot": (-1.5, 32.4),
             "heist": (3.5, 10), "jumper": (3, 10), "leaper": (3, 10), "maze": (5, 10), "miner": (1.5, 13),
             "ninja": (3.5, 10), "plunder": (4.5, 30), "starpilot": (2.5, 64)},
    "hard": {"bigfish": (0, 40), "bossfight": (0.5, 13), "caveflyer": (2, 13.4), "chaser": (0.5, 14.2),
             "climber": (1, 12.6), "coinrun": (5, 10), "dodgeball": (1.5, 19), "fruitbot": (-0.5, 27.2),
             "heist": (2, 10), "jumper": (1, 10), "leaper": (1.5, 10), "maze": (4, 10), "miner": (1.5, 20),
             "ninja": (2, 10), "plunder": (3, 30), "starpilot": (1.5, 35)},
}


class ProcgenFamily(EnvFamily):
    """The 16 Procgen games: 64x64 RGB frames, 15 actions; a game's state (its RNGs inside) is
    saved and restored by procgen itself, so a resume continues every episode."""
    name = "procgen"
    keys = ("distribution_mode", "num_levels", "start_level", "num_threads")

    def canonical(self, name: str) -> str:
        """'procgen-coinrun-v0' (gym's id), 'procgen:procgen-coinrun-v0' and 'coinrun' -> 'coinrun'."""
        for prefix in ("procgen:procgen-", "procgen-"):
            if name.startswith(prefix) and name.endswith("-v0"):
                return name[len(prefix):-len("-v0")]
        return name

    def accepts(self, name: str) -> bool:
        return self.canonical(name) in GAMES

    def allowed(self) -> str:
        return f"{', '.join(GAMES)} (or procgen-<game>-v0)"

    def known_names(self) -> tuple[str, ...]:
        return GAMES

    def check(self, cfg) -> list[str]:
        e, errs, game = cfg.env, [], self.canonical(cfg.env.name)
        if e.distribution_mode not in MODES:
            errs.append(f"env.distribution_mode: '{e.distribution_mode}' is not one of {', '.join(MODES)}")
        elif game not in MODE_GAMES.get(e.distribution_mode, GAMES):
            errs.append(f"env.distribution_mode: procgen has no '{e.distribution_mode}' mode for {game}; allowed "
                        f"there: easy, hard (and '{e.distribution_mode}' for {', '.join(MODE_GAMES[e.distribution_mode])})")
        for key in ("num_levels", "start_level"):
            if not 0 <= getattr(e, key) <= LEVEL_MAX:
                errs.append(f"env.{key}: must be 0 to {LEVEL_MAX:,} (procgen's 32-bit level seeds), got {getattr(e, key)}")
        if not errs and e.start_level + e.num_levels > LEVEL_MAX:
            errs.append(f"env.start_level + env.num_levels: {e.start_level + e.num_levels:,} is past procgen's last "
                        f"level seed, {LEVEL_MAX:,}")
        if e.distribution_mode == "exploration" and (e.num_levels or e.start_level):
            errs.append("env.num_levels, env.start_level: the exploration mode plays procgen's one fixed level of the "
                        "game; leave both at 0")
        return errs

    def spaces(self, cfg) -> Spaces:
        return Spaces((64, 64, 3), "uint8", 15)

    def make(self, cfg, num_envs: int, seed: int, num_threads: int = 0, render: bool = False):
        e = cfg.env
        return ProcgenVecEnv(self.canonical(e.name), num_envs, seed=seed, distribution_mode=e.distribution_mode,
                             num_levels=e.num_levels, start_level=e.start_level, num_threads=num_threads)

    def held_out(self, cfg) -> list[str]:
        """The levels after the training's (start_level + num_levels on, unlimited): the paper's test
        levels. Exploration mode plays one fixed level: none to hold out."""
        e = cfg.env
        if e.distribution_mode == "exploration":
            raise UsageError(f"--levels: the run trained '{e.name}' in procgen's exploration mode, whose games have one "
                             f"fixed level and none to hold out; allowed: train (the default)")
        notes = ["the run trained on unlimited levels, so train and test levels are the same distribution"] \
            if e.num_levels == 0 else []
        e.start_level, e.num_levels = e.start_level + e.num_levels, 0
        return notes

    def score_range(self, name: str, mode: str) -> tuple[float, float] | None:
        """The Procgen paper's (R_min, R_max) of the game in this mode (easy and hard only)."""
        return SCORE_RANGES.get(mode, {}).get(self.canonical(name))

    def reshard(self, states: list, lo: int, hi: int, seed: int):
        """A procgen state is one serialized game per env, its RNGs inside: the games continue exactly."""
        return take_rows(states, lo, hi)

    def check_state(self, v, path: str, cfg, n: int, schema) -> None:
        """One serialized game per env, parsed by procgen's C++ code: the header it asserts on
        (version 0, the game's name) is checked here, so a foreign or garbled state is refused."""
        need, seq = schema.need, schema.seq
        name = self.canonical(cfg.env.name)
        header = struct.pack("<ii", 0, len(name)) + name.encode()
        for i, s in enumerate(seq(v, path, n)):
            need(isinstance(s, bytes) and s.startswith(header), f"{path}[{i}]", f"not a saved {name} game state")


FAMILY = ProcgenFamily()
