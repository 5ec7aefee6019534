"""The building blocks of the config's checks and size models, below both the config and the algorithm
registry: this module imports neither, so an algorithm's settings module (algos/*_settings.py, a2c.py)
uses them at its top while `mpippo.config` imports those modules through the registry. What asks the
registry about a run's layout (stepping_ranks, local_num_envs) stays in config; the functions here are
given what they need from the caller (the minibatches key of a sync algorithm, the ranks that step envs)."""
from __future__ import annotations

import math

from mpippo import envs
from mpippo.usage import show  # noqa: F401 (the config's name for it)


def within(section: str, values, bounds: dict) -> list[str]:
    """One line per key outside its closed range: {key: (lo, hi)}, hi None for no upper bound. The
    types (int, finite float, below 2**63) were checked when the values were read."""
    errs = []
    for key, (lo, hi) in bounds.items():
        value = getattr(values, key)
        if value < lo or (hi is not None and value > hi):
            allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            errs.append(f"{section}.{key}: must be {allowed}, got {value}")
    return errs


# Upper bounds of values that are absurd beyond them (each named in its refusal; the algorithms' own
# beside them: algos/dqn_settings.py, algos/appo_settings.py).
MAX_ELO_K = 400          # one game would move a rating by more than the scale's unit (10:1 odds)
MAX_PRIORITY_EXPONENT = 100  # loss_rate ** 100: only the single hardest member is ever sampled
MAX_EVAL_GAMES = 100_000  # rating games per heuristic player and round: ~15 s of the learner's time (CPU)

SELFPLAY_RANGES = {"snapshot_interval_updates": (1, None), "pool_size": (1, None), "eval_games": (1, MAX_EVAL_GAMES),
                   "eval_interval_updates": (0, None), "elo_k": (0, MAX_ELO_K),
                   "priority_exponent": (0, MAX_PRIORITY_EXPONENT), "heuristic_prob": (0, 1), "opponent_eps": (0, 1)}
SELFPLAY_SAMPLING = ("latest", "uniform", "prioritized")  # how an actor picks its opponents (selfplay.OpponentPool)
SELFPLAY_DROP = ("oldest", "lowest_rated")  # which member a full pool drops


def check_agents(section: str, num_agents: int, world_size: int) -> list[str]:
    """The actor-learner layout: the job splits into agents of one learner and >= 1 actor each."""
    if world_size % num_agents or world_size // num_agents < 2:
        return [f"{section}.num_agents: {world_size} rank(s) cannot form {num_agents} agent(s) of a learner and "
                f">= 1 actor each; run with a multiple of {num_agents} ranks, at least {2 * num_agents}"]
    return []


def budget_text(cfg, num_agents: int) -> str:
    """How the job's env-step budget divides over the agents, for the refusals: '3,000 // 1 agent(s)'."""
    return f"{cfg.training.total_timesteps:,} // {num_agents} agent(s)"


def check_selfplay(cfg) -> list[str]:
    errs: list[str] = []
    e = cfg.env
    sp = cfg.selfplay
    if sp.enabled and not getattr(envs.family_of(e.name), "two_player", True):
        errs.append(f"selfplay.enabled: self-play needs a two-player game, env.name is '{e.name}'; allowed: "
                    f"{', '.join(f.name for f in envs.FAMILIES if f.two_player)}")
    return errs


def selfplay_values(sp) -> list[str]:
    """The selfplay section's ranges and choices, whatever the algorithm and selfplay.enabled: a typo
    there is refused, not kept in config.yaml until self-play is switched on."""
    errs = within("selfplay", sp, SELFPLAY_RANGES)
    if sp.sampling not in SELFPLAY_SAMPLING:
        errs.append(f"selfplay.sampling: {show(sp.sampling)} is not one of {', '.join(SELFPLAY_SAMPLING)}")
    if sp.drop not in SELFPLAY_DROP:
        errs.append(f"selfplay.drop: {show(sp.drop)} is not one of {', '.join(SELFPLAY_DROP)}")
    return errs


def envs_per_rank(cfg, stepping: int) -> int:
    """Envs per env-stepping rank (a sync rank, an actor) when `stepping` ranks step envs.
    env.num_envs is divided over them and rounded UP when it does not divide, so the default job
    runs on any core count (48 ranks: 2 each) and the batch is never smaller than the one asked for."""
    e = cfg.env
    if e.num_envs_per_rank is not None:
        return e.num_envs_per_rank
    return -(-e.num_envs // stepping)


def actor_ranks(world_size: int, num_agents: int) -> int:
    """The ranks that step envs in the actor-learner layout: all but each agent's learner."""
    return max(world_size - num_agents, 1)


def actor_envs(cfg, world_size: int, num_agents: int) -> int:
    """Envs per actor in the actor-learner layout."""
    return envs_per_rank(cfg, actor_ranks(world_size, num_agents))


def value_of(cfg, key: str):
    """A setting by its dotted name ('training.num_minibatches')."""
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def cutoff_min_steps(t) -> int:
    """The steps a rank collects before the balanced cut-off may end its rollout (t: the training section)."""
    return max(1, math.ceil(t.rollout_min_fraction * t.n_steps))


def check_sync(cfg, world_size: int, earlier: list[str], minibatches_key: str) -> list[str]:
    """The sync layout (every rank steps envs): each rank splits its share of the batch into the same
    minibatches, as many as the algorithm's `minibatches_key` says."""
    if earlier:  # the divisibility check below needs sane numbers
        return []
    t = cfg.training
    n = value_of(cfg, minibatches_key)
    envs_local = envs_per_rank(cfg, world_size)
    local_batch = envs_local * t.n_steps
    if local_batch % n != 0:
        return [f"{minibatches_key}: the per-rank batch ({envs_local} envs x {t.n_steps} steps = "
                f"{local_batch}) is not divisible by num_minibatches={n}"]
    if t.rollout_cutoff is not None and envs_local * cutoff_min_steps(t) < n:
        return [f"training.rollout_min_fraction: {t.rollout_min_fraction} of {t.n_steps} steps x {envs_local} envs "
                f"is fewer samples than {minibatches_key}={n}: a cut-off rank would have an empty minibatch"]
    return []


def obs_shape_of(cfg) -> tuple:
    """The observation shape of the config's env, from its family (no env made where it knows it)."""
    return envs.spaces_of(cfg).obs_shape


def frame_bytes(obs_shape) -> int:
    """Bytes of one observation as it is stored and sent (envs.obs_dtype: uint8 images, float32 vectors)."""
    return math.prod(obs_shape) * (1 if envs.obs_dtype(obs_shape) == "uint8" else 4)


def aligned(n: int) -> int:
    """n bytes rounded up to 8: the fields of a message start 8-byte aligned (comm/p2p.ChunkLayout)."""
    return (n + 7) // 8 * 8
