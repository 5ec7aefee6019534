"""The algorithms, one entry each: what the config, the command line, the runners, the checkpoint
check and the evaluation ask of an algorithm, in one place, so that none of them branches on its name.

An entry is light (this module imports neither torch nor the config): its name, its layout, the
config section of its own settings, the network it trains and how it is evaluated, and its hooks as
functions. The algorithm's code is behind a loader (`impl`, called only when a run needs it), so
`mpippo.config` reads the registry (the algorithm list, the sections) and a bad config is refused
before torch loads.

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
Config reads that top level, so it imports nothing heavy; torch is imported inside its functions
(a2c.py), or the entry lives in a torch-free module beside the algorithm's (ppo_settings.py for
ppo.py, dqn_settings.py for apex.py, appo_settings.py for appo.py). Entries are listed by module name.
"""
from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

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
    impl: Callable[[], Any]            # () -> the algorithm's class (imports torch; see the module docstring)
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

    def load(self):
        """The algorithm's code: the class the runner builds (imports torch)."""
        return self.impl()

    def build_network(self, cfg, obs_shape, num_actions: int, device=None, continuous: bool = False):
        """Its network for `cfg` (a Config), through the one builder (models.build); continuous: a
        Gaussian policy over num_actions dimensions."""
        from mpippo import models
        return models.build(self.network, tuple(obs_shape), int(num_actions), cfg.model, device=device,
                            continuous=continuous, **self.network_options(cfg))


PPO_LOGS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")
# training keys of the sync PPO loop that the actor-learner algorithms replace by their own section's
SYNC_LOOP_KEYS = ("training.n_steps", "training.n_epochs", "training.num_minibatches", "training.rollout_cutoff",
                  "training.rollout_min_fraction", "training.normalize_obs", "training.obs_clip")
PPO_LOSS_KEYS = ("training.gae_lambda", "training.clip_range", "training.clip_vloss", "training.ent_coef",
                 "training.vf_coef", "training.target_kl", "training.norm_adv", "training.adv_norm",
                 "training.normalize_reward", "training.reward_norm", "training.reward_norm_gamma")


def _declares_algorithm(path: Path) -> bool:
    """Whether a module's top level assigns ALGORITHM, read without running it (the modules that import
    torch at their top declare nothing: their entries are in the *_settings.py beside them)."""
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
    found: dict[str, Algorithm] = {}
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


