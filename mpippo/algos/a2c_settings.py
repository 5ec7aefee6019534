"""A2C's entry in the registry and what the config asks of it before torch loads: the a2c section
and its check (the choices, the ranges, the sync layout's minibatch split). The algorithm itself is
algos/a2c.py (it imports torch), found through algos/implementations.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpippo import rules
from mpippo.algos.entry import SYNC, Algorithm, setting

OPTIMIZERS = ("rmsprop", "adam")
RETURNS = ("nstep", "gae")


@dataclass
class A2CConfig:
    optimizer: str = setting("rmsprop", "A2C: rmsprop (as SB3 and the A3C paper; alpha and eps below) | adam "
                                        "(training.adam_eps), both at training.learning_rate.")
    rmsprop_alpha: float = setting(0.99, "A2C: RMSprop's smoothing constant of the squared gradients, in [0, 1).")
    rmsprop_eps: float = setting(1e-5, "A2C: RMSprop's epsilon (added to the root of the squared-gradient average).")
    returns: str = setting("nstep", "A2C: nstep (bootstrapped returns over the rollout: GAE with lambda 1, SB3's "
                                    "default) | gae (GAE with training.gae_lambda).")
    num_minibatches: int = setting(1, "A2C: gradient steps in the one pass over each rollout (global, as "
                                      "training.num_minibatches); 1 = one step on the whole batch.")


def check(cfg, world_size: int, earlier: list[str]) -> list[str]:
    """The a2c section's choices and ranges, then the sync layout's minibatch split (one line each)."""
    a, errs = cfg.a2c, []
    for key, allowed in (("optimizer", OPTIMIZERS), ("returns", RETURNS)):
        if getattr(a, key) not in allowed:
            errs.append(f"a2c.{key}: {rules.show(getattr(a, key))} is not one of {', '.join(allowed)}")
    if not 0 <= a.rmsprop_alpha < 1:
        errs.append(f"a2c.rmsprop_alpha: must be in [0, 1), got {a.rmsprop_alpha}")
    if not a.rmsprop_eps > 0:
        errs.append(f"a2c.rmsprop_eps: must be > 0, got {a.rmsprop_eps}")
    errs += rules.within("a2c", a, {"num_minibatches": (1, None)})
    return errs + rules.check_sync(cfg, world_size, earlier + errs, ALGORITHM.minibatches_key)


ALGORITHM = Algorithm(
    "a2c", SYNC, "a2c (synchronous advantage actor-critic: PPO's layout, one pass per rollout, no clipping; "
    "section a2c)", check=check, section="a2c", section_type=A2CConfig,
    logs=("policy_loss", "value_loss", "entropy", "approx_kl", "explained_variance"), minibatches_key="a2c.num_minibatches",
    continuous=True,
    ignores=("training.n_epochs", "training.num_minibatches", "training.clip_range", "training.clip_vloss",
             "training.target_kl"))
