"""PPO's entry in the registry: the sync layout's algorithm (algos/ppo.py, which imports torch at its
top, named in algos/implementations.py). PPO has no section of its own; its settings are the training
section's, checked by the sync layout's check (mpippo/rules.py: the minibatch split)."""
from __future__ import annotations

from mpippo import rules
from mpippo.algos.entry import PPO_LOGS, SYNC, Algorithm


def check(cfg, world_size: int, earlier: list[str]) -> list[str]:
    return rules.check_sync(cfg, world_size, earlier, ALGORITHM.minibatches_key)


ALGORITHM = Algorithm("ppo", SYNC, "ppo (synchronous, every rank steps envs and learns)", check=check,
                      logs=PPO_LOGS + ("explained_variance",), continuous=True)
