"""Vectorized envs with one small interface (gym3's observe/act, numpy arrays):

    rew (N,) float32, obs (N, H, W, C) uint8, first (N,) bool = env.observe()
    env.act(actions (N,) int32)
    env.get_state() -> list[bytes] (procgen) or a dict of arrays (built-in envs);  env.set_state(that)
    env.action_mask() -> (N, A) bool: legal actions; only envs that have illegal ones (connect4)

`first[i]` is True when obs[i] starts a new episode (so the previous step ended one).
"""
from __future__ import annotations

PROCGEN_GAMES = (
    "bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball",
    "fruitbot", "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot",
)
TOY_ENVS = ("toy-cue", "connect4")  # built-in envs: a tiny test env (envs/toy.py), Connect Four vs an opponent (envs/connect4.py)


def canonical_env_name(name: str) -> str:
    """'procgen-coinrun-v0' and 'coinrun' both -> 'coinrun'."""
    if name.startswith("procgen-") and name.endswith("-v0"):
        return name[len("procgen-"):-len("-v0")]
    if name.startswith("procgen:procgen-") and name.endswith("-v0"):
        return name[len("procgen:procgen-"):-len("-v0")]
    return name


def obs_shape_of(env_name: str) -> tuple[int, int, int]:
    """Observation shape of an env, without making one (memory estimates before any allocation)."""
    name = canonical_env_name(env_name)
    if name == "connect4":
        from mpippo.envs.connect4 import COLS, ROWS
        return (ROWS, COLS, 2)
    if name == "toy-cue":
        from mpippo.envs.toy import CueEnv
        return CueEnv.obs_shape
    return (64, 64, 3)  # every procgen game


def make_env(cfg, num_envs: int, seed: int, num_threads: int = 0):
    """The env of `cfg.env` (a Config's env section: name, distribution_mode, num_levels, start_level),
    `num_envs` copies. num_threads: procgen's stepping threads (0: step in the calling thread)."""
    name = canonical_env_name(cfg.env.name)
    if name in TOY_ENVS:
        return _builtin_env(name)(num_envs, seed=seed)
    from mpippo.envs.procgen import ProcgenVecEnv
    return ProcgenVecEnv(name, num_envs, seed=seed, distribution_mode=cfg.env.distribution_mode,
                         num_levels=cfg.env.num_levels, start_level=cfg.env.start_level, num_threads=num_threads)


def mask_bits(mask):
    """Legal actions (N, A) bool -> one int64 bitmask per env (bit a = action a legal), for a
    fixed-layout message field (<= 63 actions); -1 stands for "all legal"."""
    import numpy as np
    return (mask.astype(np.int64) << np.arange(mask.shape[1], dtype=np.int64)).sum(1)


def bits_to_mask(bits, num_actions: int):
    """Inverse of mask_bits for numpy arrays or torch tensors: (N,) int64 -> (N, A) bool."""
    import numpy as np
    if isinstance(bits, np.ndarray):
        return ((bits[:, None] >> np.arange(num_actions)) & 1).astype(bool)
    import torch
    return ((bits[:, None] >> torch.arange(num_actions, device=bits.device)) & 1).bool()


def rank_seed(base_seed: int, rank: int) -> int:
    """Distinct, deterministic per-rank seed (fits procgen's 31-bit rand_seed)."""
    return (base_seed * 1_000_003 + rank * 7919) % (2**31 - 1)


def resume_seed(base_seed: int, rank: int, iteration: int) -> int:
    """The seed of a rank's RNG streams on a resume that cannot restore them (another world size):
    a function of the seed, the rank and the iteration only, so two resumes of one checkpoint on
    one size draw alike; hashed, so that it repeats no rank_seed stream of the run's start."""
    import hashlib
    digest = hashlib.blake2b(f"mpippo-resume/{base_seed}/{rank}/{iteration}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


def take_rows(parts: list, lo: int, hi: int):
    """Rows lo..hi-1 of `parts` (arrays or lists, one per old rank) joined in order, copying only
    the parts that hold them (a job of many ranks takes a few rows each)."""
    import numpy as np
    pieces, start = [], 0
    for part in parts:
        a, b = max(lo - start, 0), min(hi - start, len(part))
        if a < b:
            pieces.append(part[a:b])
        start += len(part)
    if pieces and isinstance(pieces[0], np.ndarray):
        return np.concatenate(pieces)
    return [x for piece in pieces for x in piece]


def reshard_env_states(env_name: str, states: list, lo: int, hi: int, seed: int):
    """Envs lo..hi-1 of every old rank's env states joined in rank order, as one env state: a
    rank's share of the same envs on a new world size. A procgen state is one serialized game per
    env, its RNGs inside: the games continue exactly. A built-in env keeps one array row per env
    (its class's PER_ENV keys) and one RNG for all its envs, which cannot be split: the rows
    continue, the RNG is seeded anew from `seed`."""
    name = canonical_env_name(env_name)
    if name not in TOY_ENVS:
        return take_rows(states, lo, hi)
    import numpy as np
    state = {k: take_rows([s[k] for s in states], lo, hi) for k in _builtin_env(name).PER_ENV}
    state["rng"] = np.random.default_rng(seed).bit_generator.state
    return state


def _builtin_env(name: str):
    if name == "connect4":
        from mpippo.envs.connect4 import ConnectFourVecEnv
        return ConnectFourVecEnv
    from mpippo.envs.toy import CueEnv
    return CueEnv
