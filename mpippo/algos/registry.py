"""The algorithms, one entry each: what the config, the command line, the runners, the checkpoint
check and the evaluation ask of an algorithm, in one place, so that none of them branches on its name.

An entry is light (this module imports neither torch nor the config): its name, its layout, the
config section of its own settings, the network it trains and how it is evaluated. Its code is
named by "module:attribute" paths and imported only when a run needs it, so `mpippo.config` reads
the registry (the algorithm list, the sections) and a bad config is refused before torch loads.

The two layouts:
  sync           every rank steps its envs and learns on an identical replica of the network; one
                 Allreduce of the flat gradient per minibatch (runners/sync.py). The entry's
                 `impl` is a class built with the Config: optimizer(params), update(...),
                 gae_lambda, allreduces_per_iteration, check_checkpoint(state, cfg, net).
  actor-learner  per agent one learner rank and actor ranks (runners/actor_learner.py). The entry's
                 `impl` is the algorithm object with both halves (algos/apex.py, algos/appo.py),
                 built with (cfg, obs_shape, num_actions, num_actors, masked).
Both kinds of `impl` have `check_checkpoint(state, cfg, net)`, the check of what their runs save.

A new algorithm is one module in mpippo/algos/ whose top level defines `ALGORITHM = Algorithm(...)`
(and, when it has settings of its own, the dataclass of its section): the registry finds it there.
Config reads that top level, so it imports nothing heavy; torch is imported inside its functions.
"""
from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

SYNC, ACTOR_LEARNER = "sync", "actor-learner"
LAYOUTS = (SYNC, ACTOR_LEARNER)


def setting(default, help: str):
    """A config key of a section dataclass: its default and its help text (`python -m mpippo.config`
    prints it; docs/config.md's table lists it). Here, not in config.py, so that algorithm modules declare
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
    impl: str                          # "module:attribute": the algorithm's code (see the module docstring)
    check: Optional[str] = None        # "module:function"(cfg, world_size, earlier errors) -> problems; light
    section: Optional[str] = None      # the config section of its own settings (None: training's keys only)
    section_type: Optional[type] = None  # that section's dataclass, when the entry brings it (dqn's and appo's
    #                                      live in config.py, older than the registry)
    network: str = "actor_critic"      # models.build's kind: actor_critic (logits, value) | q (Q-values)
    network_options: Callable = no_options  # (cfg) -> models.build's keyword arguments
    greedy_eval: bool = False          # evaluation always takes the argmax (Q-values); else the policy samples
    continuous: bool = False           # it acts on Box actions too (a Gaussian policy); else Discrete only
    selfplay: bool = False             # selfplay.enabled is allowed (two-player games in its learner)
    logs: tuple = ()                   # the losses it logs: quantities of metrics/tags.LOSSES (their writers read it)
    minibatches_key: str = "training.num_minibatches"  # sync: the key that splits each rank's batch
    memory: Optional[str] = None       # actor-learner: "module:function"(cfg, world_size, learner, actor, ...)
    chunk_items: Optional[str] = None  # actor-learner: "module:function"(cfg, world_size) -> (capacity, bytes)
    ignores: tuple = ()                # keys of the shared sections it does not read ("training.n_epochs"): set
    #                                    away from their defaults, the start-up says so in one line

    def hook(self, what: str):
        """The function or class named by the entry's field `what`, imported now."""
        module, _, attr = getattr(self, what).partition(":")
        return getattr(importlib.import_module(module), attr)

    def load(self):
        """The algorithm's code: the class the runner builds (imports torch)."""
        return self.hook("impl")

    def build_network(self, cfg, obs_shape, num_actions: int, device=None, continuous: bool = False):
        """Its network for `cfg` (a Config), through the one builder (models.build); continuous: a
        Gaussian policy over num_actions dimensions."""
        from mpippo import models
        return models.build(self.network, tuple(obs_shape), int(num_actions), cfg.model, device=device,
                            continuous=continuous, **self.network_options(cfg))


PPO_LOGS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")
# training keys of the sync PPO loop that the actor-learner algorithms replace by their own section's
_SYNC_LOOP = ("training.n_steps", "training.n_epochs", "training.num_minibatches", "training.rollout_cutoff",
              "training.rollout_min_fraction", "training.normalize_obs", "training.obs_clip")
_PPO_LOSS = ("training.gae_lambda", "training.clip_range", "training.clip_vloss", "training.ent_coef",
             "training.vf_coef", "training.target_kl", "training.norm_adv", "training.adv_norm",
             "training.normalize_reward", "training.reward_norm", "training.reward_norm_gamma")

BUILT_IN = (
    Algorithm("ppo", SYNC, "ppo (synchronous, every rank steps envs and learns)",
              impl="mpippo.algos.ppo:PPO", check="mpippo.config:check_sync", logs=PPO_LOGS + ("explained_variance",), continuous=True),
    Algorithm("appo", ACTOR_LEARNER, "appo (asynchronous PPO with V-trace: actor ranks and a learner rank, "
              "section appo)", impl="mpippo.algos.appo:APPO", check="mpippo.config:check_appo", section="appo",
              logs=PPO_LOGS, memory="mpippo.config:appo_memory",
              chunk_items="mpippo.config:appo_chunk_items",
              ignores=_SYNC_LOOP + ("training.clip_vloss", "training.target_kl", "training.adv_norm",
                                    "training.reward_norm")),
    Algorithm("dqn", ACTOR_LEARNER, "dqn (Ape-X: actor ranks and a learner rank with replay, section dqn)",
              impl="mpippo.algos.apex:ApeX", check="mpippo.config:check_dqn", section="dqn", network="q",
              network_options=lambda cfg: {"dueling": cfg.dqn.dueling}, greedy_eval=True, selfplay=True,
              logs=("td_loss",), memory="mpippo.config:dqn_memory",
              chunk_items="mpippo.config:dqn_chunk_items", ignores=_SYNC_LOOP + _PPO_LOSS),
)


def _declares_algorithm(path: Path) -> bool:
    """Whether a module's top level assigns ALGORITHM, read without running it (ppo.py and the
    other older modules import torch at their top and declare nothing: their entries are above)."""
    try:
        text = path.read_text()
        if not re.search(r"^ALGORITHM\b", text, re.M):  # parsing every module cost each process 60 ms
            return False
        tree = ast.parse(text)
    except (OSError, SyntaxError):
        return False
    return any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ALGORITHM"
                                                    for t in node.targets) for node in tree.body)


def _discover() -> dict[str, Algorithm]:
    found = {a.name: a for a in BUILT_IN}
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        if path.stem != "registry" and _declares_algorithm(path):
            entry = importlib.import_module(f"mpippo.algos.{path.stem}").ALGORITHM
            if entry.name in found:
                raise ValueError(f"{path}: algorithm '{entry.name}' is registered twice")
            if entry.layout not in LAYOUTS:
                raise ValueError(f"{path}: algorithm '{entry.name}' has layout '{entry.layout}'; allowed: "
                                 f"{', '.join(LAYOUTS)}")
            found[entry.name] = entry
    return found


ALGORITHMS: dict[str, Algorithm] = _discover()
NAMES = tuple(ALGORITHMS)


def get(name: str) -> Algorithm:
    """The entry of training.algo `name` (validated by config: a KeyError here is a bug)."""
    return ALGORITHMS[name]


def sections() -> list[tuple[str, type]]:
    """The config sections that entries bring, in registry order."""
    return [(a.section, a.section_type) for a in ALGORITHMS.values() if a.section_type is not None]


def algorithm_sections() -> tuple[str, ...]:
    """Every section that belongs to one algorithm (the others are shared by all)."""
    return tuple(a.section for a in ALGORITHMS.values() if a.section)


def help_text() -> str:
    return "Algorithm: " + " | ".join(a.summary for a in ALGORITHMS.values()) + "."


