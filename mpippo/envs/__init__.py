"""Vectorized envs with one small interface (gym3's observe/act, numpy arrays):

    rew (N,) float32, obs (N, H, W, C) uint8, first (N,) bool = env.observe()
    env.act(actions (N,) int32)
    env.get_state() -> list[bytes];  env.set_state(list[bytes])

`first[i]` is True when obs[i] starts a new episode (so the previous step ended one).
"""
from __future__ import annotations

from mpippo.config import TOY_ENVS, Config, canonical_env_name


def make_env(cfg: Config, num_envs: int, seed: int):
    name = canonical_env_name(cfg.env.name)
    if name in TOY_ENVS:
        from mpippo.envs.toy import CueEnv
        return CueEnv(num_envs, seed=seed)
    from mpippo.envs.procgen import ProcgenVecEnv
    return ProcgenVecEnv(name, num_envs, seed=seed, distribution_mode=cfg.env.distribution_mode,
                         num_levels=cfg.env.num_levels, start_level=cfg.env.start_level)


def rank_seed(base_seed: int, rank: int) -> int:
    """Distinct, deterministic per-rank seed (fits procgen's 31-bit rand_seed)."""
    return (base_seed * 1_000_003 + rank * 7919) % (2**31 - 1)
