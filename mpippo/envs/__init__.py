"""Vectorized envs with one small interface (gym3's observe/act, numpy arrays):

    rew (N,) float32, obs (N, H, W, C) uint8, first (N,) bool = env.observe()
    env.act(actions (N,) int32)
    env.get_state() -> list[bytes] (procgen), a dict of arrays (built-in envs) or None (a family
        without exact_resume);  env.set_state(that)
    env.action_mask() -> (N, A) bool: legal actions; only envs that have illegal ones (connect4)
    env.truncated() -> (indices, final observations) of the episodes the last act cut by a time
        limit; only envs that have such limits (gym, atari): the runner bootstraps them
    env.episodes() -> (indices, returns, lengths) of the real episodes the last act ended, where training's
        episodes are not the real ones (atari: a lost life ends one, rewards clipped): what is
        reported instead of the sums of the training rewards between `first` flags; pz: every game ended
        since the last call, those the opponent's opening moves ended among them (no reward shows them)

Observations are uint8 images (N, H, W, C) or float32 vectors (N, D) (`Spaces`).

`first[i]` is True when obs[i] starts a new episode (so the previous step ended one).
"""
from __future__ import annotations

import hashlib

import numpy as np

from mpippo.envs import atari, connect4, gym, pettingzoo, procgen, toy
from mpippo.envs.family import EnvFamily, Spaces, obs_dtype, take_rows

DEFAULT_ENV = "coinrun"  # env.name's default: the Procgen paper's first game

# The env families, in the order a name is tried; each is one module (see envs/family.py).
FAMILIES: tuple[EnvFamily, ...] = (procgen.FAMILY, toy.FAMILY, connect4.FAMILY, gym.FAMILY, pettingzoo.FAMILY,
                                    atari.FAMILY)


def family_of(name) -> EnvFamily | None:
    """The family whose envs `name` names (None: no family knows it)."""
    return next((f for f in FAMILIES if isinstance(name, str) and f.accepts(name)), None)


def family(cfg) -> EnvFamily:
    """The family of a checked config's env.name."""
    found = family_of(cfg.env.name)
    if found is None:
        raise ValueError(f"env.name {cfg.env.name!r} belongs to no env family (config.validate refuses it)")
    return found


def canonical_env_name(name: str) -> str:
    """The one spelling config.yaml keeps ('procgen-coinrun-v0' -> 'coinrun')."""
    found = family_of(name)
    return found.canonical(name) if found is not None else name


def allowed_env_names() -> str:
    return "; ".join(f.allowed() for f in FAMILIES)


def known_env_names() -> tuple[str, ...]:
    return tuple(n for f in FAMILIES for n in f.known_names())


def spaces_of(cfg) -> Spaces:
    """Observation and action spaces of the config's env (for memory estimates before any allocation)."""
    return family(cfg).spaces(cfg)


def make_env(cfg, num_envs: int, seed: int, num_threads: int = 0, render: bool = False):
    """`num_envs` envs of `cfg.env` in one batch object. num_threads: procgen's stepping threads
    (0: step in the calling thread); render: frames for a video (`env.render()` where observations
    are no pictures)."""
    return family(cfg).make(cfg, num_envs, seed, num_threads, render)


def ended_episodes(env, first, ep_ret, ep_len):
    """(env indices, returns, lengths) of the episodes the last act ended, as reported: the env's
    real ones where training's episodes are not (env.episodes(): atari, pz), else the sums of the
    rewards since the last `first` flag (`ep_ret`, `ep_len`, which the caller then zeroes)."""
    if hasattr(env, "episodes"):
        return env.episodes()
    idx = np.flatnonzero(first)
    return idx, ep_ret[idx], ep_len[idx]


def mask_words(num_actions: int) -> int:
    """How many int64 words carry one state's legal actions (mask_bits): 64 actions a word."""
    return max(1, -(-int(num_actions) // 64))


def mask_bits(mask):
    """Legal actions (N, A) bool -> (N, mask_words(A)) int64 bitmasks (bit b of word w: action 64 w + b
    legal), for a fixed-layout message field and the replay; numpy arrays or torch tensors. A word of -1
    (every bit set) reads as all legal: the value a transition without a mask carries."""
    n, a = mask.shape
    w = mask_words(a)
    if isinstance(mask, np.ndarray):
        padded = np.zeros((n, w * 64), np.uint64)
        padded[:, :a] = mask
        return (padded.reshape(n, w, 64) << np.arange(64, dtype=np.uint64)).sum(2, dtype=np.uint64).view(np.int64)
    import torch
    padded = torch.zeros((n, w * 64), dtype=torch.int64, device=mask.device)
    padded[:, :a] = mask.long()
    return (padded.reshape(n, w, 64) << torch.arange(64, device=mask.device)).sum(2)  # (distinct bits: no carry)


def bits_to_mask(bits, num_actions: int):
    """Inverse of mask_bits for numpy arrays or torch tensors: (N, W) int64 -> (N, A) bool."""
    n = bits.shape[0]
    if isinstance(bits, np.ndarray):
        words = (bits[:, :, None] >> np.arange(64)) & 1
        return words.reshape(n, bits.shape[1] * 64)[:, :num_actions].astype(bool)
    import torch
    words = (bits[:, :, None] >> torch.arange(64, device=bits.device)) & 1
    return words.reshape(n, bits.shape[1] * 64)[:, :num_actions].bool()


def rank_seed(base_seed: int, rank: int) -> int:
    """Distinct, deterministic per-rank seed (fits procgen's 31-bit rand_seed)."""
    return (base_seed * 1_000_003 + rank * 7919) % (2**31 - 1)


def streams_seed(base_seed: int, rank: int, resumes: int) -> int:
    """The seed of an actor-learner rank's streams (its envs, exploration, augmentation): its start's,
    then fresh ones on every resume that repeat no rank's start (seed + 7919 x resumes did: rank_seed
    steps by 7919 per rank, so a resumed actor replayed its neighbour's first envs)."""
    return resume_seed(base_seed, rank, resumes) if resumes else rank_seed(base_seed, rank)


def resume_seed(base_seed: int, rank: int, iteration: int) -> int:
    """The seed of a rank's RNG streams on a resume that cannot restore them (another world size):
    a function of the seed, the rank and the iteration only, so two resumes of one checkpoint on
    one size draw alike; hashed, so that it repeats no rank_seed stream of the run's start."""
    digest = hashlib.blake2b(f"mpippo-resume/{base_seed}/{rank}/{iteration}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


__all__ = ["DEFAULT_ENV", "FAMILIES", "EnvFamily", "Spaces", "allowed_env_names", "bits_to_mask", "canonical_env_name",
           "ended_episodes", "family", "family_of", "known_env_names", "make_env", "mask_bits", "mask_words", "rank_seed",
           "resume_seed", "spaces_of", "streams_seed", "obs_dtype", "take_rows"]
