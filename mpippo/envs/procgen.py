"""One ProcgenGym3Env per rank."""
from __future__ import annotations

import contextlib
import io

import numpy as np


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
        self.env = ProcgenGym3Env(num=num_envs, env_name=game, distribution_mode=distribution_mode,
                                  num_levels=num_levels, start_level=start_level,
                                  num_threads=num_threads, rand_seed=int(seed))
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
