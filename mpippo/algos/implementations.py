"""Each registry entry's code, by name: the class a runner builds and whose `check_checkpoint` checks
that algorithm's checkpoints. It imports torch (every algorithm module), so only the runners, the
checkpoint loader and the tests import it, never the config: a bad config is refused before torch
loads. A new algorithm adds its class here and its entry to registry.ENTRIES (a test holds them equal)."""
from __future__ import annotations

from mpippo.algos.a2c import A2C
from mpippo.algos.apex import ApeX
from mpippo.algos.appo import APPO
from mpippo.algos.ppo import PPO

CLASSES = {"a2c": A2C, "appo": APPO, "dqn": ApeX, "ppo": PPO}


def load(name: str):
    """The class of training.algo `name` (validated by config: a KeyError here is a bug)."""
    return CLASSES[name]
