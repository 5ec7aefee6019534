"""What a config means for a job of N ranks: its algorithm's entry and layout, the ranks that step
envs and the envs each runs, the agents' folders, the config as it runs (`resolve`) and as config.yaml
keeps it (`saved_form`), with the start-up's notes on what differs from what was asked."""
from __future__ import annotations

import copy
from pathlib import Path

from mpippo.algos import registry
from mpippo.config.schema import Config
from mpippo.envs import canonical_env_name
from mpippo.rules import actor_ranks, envs_per_rank, show, value_of


def algorithm(cfg: Config) -> registry.Algorithm:
    """The registry entry of the run's training.algo."""
    return registry.get(cfg.training.algo)


def actor_learner(cfg: Config) -> bool:
    """Whether the run's algorithm runs in the actor-learner layout (else: synchronous replicas)."""
    return algorithm(cfg).layout == registry.ACTOR_LEARNER


def sync_minibatches(cfg: Config) -> tuple[str, int]:
    """The sync layout's minibatches per update: (the key that sets them, their number)."""
    key = algorithm(cfg).minibatches_key
    return key, value_of(cfg, key)


def stepping_ranks(cfg: Config, world_size: int) -> int:
    """Ranks that step envs: all of them in the sync layout (PPO, A2C); the actors in the
    actor-learner layout (DQN, APPO: learners step none)."""
    if not actor_learner(cfg):
        return world_size
    return actor_ranks(world_size, layout_section(cfg).num_agents)


def layout_section(cfg: Config):
    """The actor-learner layout's settings of this run's algorithm (its section: dqn, appo):
    num_agents, chunk_size, max_inflight, weight_sync_period, checkpoint_interval_updates. None
    in the sync layout."""
    return getattr(cfg, algorithm(cfg).section) if actor_learner(cfg) else None


def agent_folder(run_dir, agent: int, num_agents: int) -> Path:
    """Agent `agent`'s folder of a run: the run folder itself, or agent_<k>/ of a multi-agent job."""
    return Path(run_dir) / f"agent_{agent}" if num_agents > 1 else Path(run_dir)


def local_num_envs(cfg: Config, world_size: int) -> int:
    """Envs per rank (PPO) or per actor (DQN): env.num_envs over the ranks that step envs, rounded up."""
    return envs_per_rank(cfg, stepping_ranks(cfg, world_size))


def envs_note(asked: Config, ran: Config, world_size: int) -> str | None:
    """Why the envs that run differ from the env.num_envs asked for (None when they do not)."""
    if asked.env.num_envs_per_rank is not None or asked.env.num_envs == ran.env.num_envs:
        return None
    return (f"env.num_envs {asked.env.num_envs} does not divide over {stepping_ranks(asked, world_size)} env-stepping "
            f"rank(s): {ran.env.num_envs_per_rank} per rank, {ran.env.num_envs} in all")


def ignored_note(cfg: Config) -> str | None:
    """One line naming the keys set away from their defaults that `cfg`'s algorithm does not read:
    the shared keys its registry entry lists and the sections of the other algorithms (None: none)."""
    entry, default = registry.get(cfg.training.algo), Config()
    keys = list(entry.ignores)
    for section in registry.algorithm_sections():
        if section != entry.section:
            keys += [f"{section}.{k}" for k in getattr(default, section).__dataclass_fields__]
    unread = []
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value != getattr(getattr(default, section), name):
            unread.append(f"{key}={show(value)}")
    idle = [] if cfg.selfplay.enabled else [  # (the section is read by self-play alone)
        f"selfplay.{k}={show(getattr(cfg.selfplay, k))}" for k in default.selfplay.__dataclass_fields__
        if k != "enabled" and getattr(cfg.selfplay, k) != getattr(default.selfplay, k)]
    said = [f"training.algo {entry.name} does not read {', '.join(unread)}: these settings have no effect (docs/config.md "
            f"lists the keys each algorithm reads)"] if unread else []
    said += [f"selfplay.enabled is false, so self-play's settings have no effect: {', '.join(idle)}"] if idle else []
    return "; ".join(said) or None


# Keys a job derives from its machine and size: auto precision, torch's and the envs' threads, the envs
# per rank that a total over the ranks gives, and that total rounded up to the ranks. config.yaml keeps
# them as asked, so a plain --resume on another node or world size derives them again there (re-sharding
# the same total, fp32 on a CPU without bf16; a total saved rounded would round up again at each resize);
# the metrics file says what they were. A value the user set stays set.
AS_ASKED = (("env", "num_envs"), ("env", "num_envs_per_rank"), ("env", "num_threads"),
            ("parallel", "threads_per_rank"), ("training", "precision"))


def saved_form(ran: Config, asked: Config) -> dict:
    """config.yaml's content: what ran (`ran`, resolved, as the trainer settled it), with AS_ASKED as asked."""
    data = ran.to_dict()
    for section, key in AS_ASKED:
        data[section][key] = getattr(getattr(asked, section), key)
    return data


def resolve(cfg: Config, world_size: int) -> Config:
    """Fill derived values: the envs per rank and in all, the env's canonical name (config.yaml keeps
    what saved_form says)."""
    # parallel.expected_world_size guards one launch (validate checked it) and is no part of the
    # run: kept in config.yaml, it would refuse a resume from that file on another allocation
    # a copy throughout: the trainer settles auto values in it, and the config as asked must keep them
    cfg = copy.deepcopy(cfg)
    cfg.parallel.expected_world_size = None
    per_rank = local_num_envs(cfg, world_size)
    cfg.env.num_envs_per_rank = per_rank
    cfg.env.num_envs = per_rank * stepping_ranks(cfg, world_size)
    cfg.env.name = canonical_env_name(cfg.env.name)
    return cfg


