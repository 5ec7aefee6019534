"""`toy-cue`: a tiny, fast env for learning tests (thousands of steps per ms).

Each step shows a cue: one of 4 quadrants of an 8x8 frame is lit. Acting with the lit
quadrant's index earns +1. Episodes last 16 steps, so a uniform policy scores 4 on
average and a perfect one 16: a broken PPO update stays near 4.
"""
from __future__ import annotations

import numpy as np

from mpippo.envs.family import ArrayStateFamily, Spaces

SIZE, NUM_CUES, EPISODE_LEN = 8, 4, 16


class CueEnv:
    num_actions = NUM_CUES
    obs_shape = (SIZE, SIZE, 3)
    PER_ENV = ("cue", "t", "rew", "first")  # get_state's keys with one row per env (ArrayStateFamily.reshard)

    def __init__(self, num_envs: int, seed: int):
        self.num_envs = num_envs
        self.rng = np.random.default_rng(seed)
        self.cue = self.rng.integers(NUM_CUES, size=num_envs)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.rew = np.zeros(num_envs, dtype=np.float32)
        self.first = np.ones(num_envs, dtype=bool)

    def _frames(self) -> np.ndarray:
        obs = np.zeros((self.num_envs, SIZE, SIZE, 3), dtype=np.uint8)
        half = SIZE // 2
        for q in range(NUM_CUES):
            idx = self.cue == q
            r, c = divmod(q, 2)
            obs[idx, r * half:(r + 1) * half, c * half:(c + 1) * half, :] = 255
        return obs

    def observe(self):
        return self.rew.copy(), self._frames(), self.first.copy()

    def act(self, actions: np.ndarray) -> None:
        self.rew = (np.asarray(actions) == self.cue).astype(np.float32)
        self.t += 1
        self.first = self.t >= EPISODE_LEN
        self.t[self.first] = 0
        self.cue = self.rng.integers(NUM_CUES, size=self.num_envs)

    def get_state(self) -> dict:
        """Arrays and the RNG's state (plain ints and strings): what a checkpoint may hold."""
        return {"rng": self.rng.bit_generator.state, "cue": self.cue.copy(), "t": self.t.copy(),
                "rew": self.rew.copy(), "first": self.first.copy()}

    def set_state(self, state: dict) -> None:
        self.cue, self.t = np.array(state["cue"]), np.array(state["t"])
        self.rew, self.first = np.array(state["rew"]), np.array(state["first"])
        self.rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        pass


class ToyFamily(ArrayStateFamily):
    name = env_name = "toy-cue"

    def env_class(self):
        return CueEnv

    def spaces(self, cfg) -> Spaces:
        return Spaces(CueEnv.obs_shape, "uint8", CueEnv.num_actions)

    def check_state(self, v, path: str, cfg, n: int, schema) -> None:
        array, mapping, pcg64 = schema.array, schema.mapping, schema.pcg64
        mapping(v, path, ("rng", "cue", "t", "rew", "first"))
        for key, kind in (("cue", "i"), ("t", "i"), ("rew", "f"), ("first", "b")):
            array(v[key], f"{path}.{key}", kind, (n,))
        pcg64(v["rng"], f"{path}.rng")


FAMILY = ToyFamily()
