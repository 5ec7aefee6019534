"""What a registry entry is made of (mpippo/algos/registry.py lists the entries): the Algorithm record,
the layouts, `setting` for a section's keys, and the key groups the entries share. Light: no torch, no
config, no other algorithm module, so every entry module imports it at its top."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

SYNC, ACTOR_LEARNER = "sync", "actor-learner"
LAYOUTS = (SYNC, ACTOR_LEARNER)


def setting(default, help: str):
    """A config key of a section dataclass: its default and its help text (`python -m mpippo.config`
    prints it; docs/config.md's table lists it). Here, not in the config package, so that algorithm modules declare
    their sections with it without importing the config."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def no_options(cfg) -> dict:
    return {}


@dataclass(frozen=True)
class Algorithm:
    name: str                          # training.algo
    layout: str                        # SYNC | ACTOR_LEARNER
    summary: str                       # what it is, in the help of training.algo
    check: Optional[Callable] = None   # (cfg, world_size, earlier errors) -> problems; light
    section: Optional[str] = None      # the config section of its own settings (None: training's keys only)
    section_type: Optional[type] = None  # that section's dataclass
    network: str = "actor_critic"      # models.build's kind: actor_critic (logits, value) | q (Q-values)
    network_options: Callable = no_options  # (cfg) -> models.build's keyword arguments
    greedy_eval: bool = False          # evaluation always takes the argmax (Q-values); else the policy samples
    continuous: bool = False           # it acts on Box actions too (a Gaussian policy); else Discrete only
    selfplay: bool = False             # selfplay.enabled is allowed (two-player games in its learner)
    logs: tuple = ()                   # the losses it logs: quantities of metrics/tags.LOSSES (their writers read it)
    minibatches_key: str = "training.num_minibatches"  # sync: the key that splits each rank's batch
    memory: Optional[Callable] = None  # actor-learner: (cfg, world_size, config.LayoutSizes) -> (learner, actor) parts
    chunk_items: Optional[Callable] = None  # actor-learner: (cfg, world_size) -> (return slots, item bytes)
    ignores: tuple = ()                # keys of the shared sections it does not read ("training.n_epochs"): set
    #                                    away from their defaults, the start-up says so in one line

    def build_network(self, cfg, obs_shape, num_actions: int, device=None, continuous: bool = False):
        """Its network for `cfg` (a Config), through the one builder (models.build); continuous: a
        Gaussian policy over num_actions dimensions."""
        from mpippo import models  # torch: an entry is read before torch loads
        return models.build(self.network, tuple(obs_shape), int(num_actions), cfg.model, device=device,
                            continuous=continuous, **self.network_options(cfg))


PPO_LOGS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")
# training keys of the sync PPO loop that the actor-learner algorithms replace by their own section's
SYNC_LOOP_KEYS = ("training.n_steps", "training.n_epochs", "training.num_minibatches", "training.rollout_cutoff",
                  "training.rollout_min_fraction", "training.normalize_obs", "training.obs_clip")
PPO_LOSS_KEYS = ("training.gae_lambda", "training.clip_range", "training.clip_vloss", "training.ent_coef",
                 "training.vf_coef", "training.target_kl", "training.norm_adv", "training.adv_norm",
                 "training.normalize_reward", "training.reward_norm", "training.reward_norm_gamma")
