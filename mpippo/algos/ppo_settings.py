"""PPO's entry in the registry: the sync layout's algorithm (algos/ppo.py, which imports torch at its
top, named through a loader). PPO has no section of its own; its settings are the training
section's, checked by the config's sync-layout check (the minibatch split)."""
from __future__ import annotations

from mpippo.algos.registry import PPO_LOGS, SYNC, Algorithm


def check(cfg, world_size: int, earlier: list[str]) -> list[str]:
    from mpippo import config  # config imports the registry, which imports this module: at call time
    return config.check_sync(cfg, world_size, earlier)


def load():
    """The algorithm's code (imports torch)."""
    from mpippo.algos.ppo import PPO
    return PPO


ALGORITHM = Algorithm("ppo", SYNC, "ppo (synchronous, every rank steps envs and learns)", impl=load, check=check,
                      logs=PPO_LOGS + ("explained_variance",), continuous=True)
