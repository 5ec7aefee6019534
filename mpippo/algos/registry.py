"""The algorithms, one entry each: what the config, the command line, the runners, the checkpoint
check and the evaluation ask of an algorithm, in one place, so that none of them branches on its name.

An entry is light (this module imports neither torch nor the config): its name, its layout, the
config section of its own settings, the network it trains and how it is evaluated, and its hooks as
functions. The algorithm's code (torch) is not named here but in algos/implementations.py, which
only the runners and the checkpoint loader import, so `mpippo.config` reads the registry (the
algorithm list, the sections) and a bad config is refused before torch loads.

The two layouts:
  sync           every rank steps its envs and learns on an identical replica of the network; one
                 Allreduce of the flat gradient per minibatch (runners/sync.py). Its
                 implementation is a class built with the Config: optimizer(params), update(...),
                 gae_lambda, allreduces_per_iteration, check_checkpoint(state, cfg, net).
  actor-learner  per agent one learner rank and actor ranks (runners/actor_learner.py). Its
                 implementation is the algorithm object with both halves (algos/apex.py, algos/appo.py),
                 built with (cfg, obs_shape, num_actions, num_actors, masked).
Both kinds have `check_checkpoint(state, cfg, net)`, the check of what their runs save.

A new algorithm is two modules in mpippo/algos/, as each one here: its code (torch) and, beside it,
a torch-free <name>_settings.py whose top level defines `ALGORITHM = Algorithm(...)` (entry.py) and,
when it has settings of its own, the dataclass of its section; then one line in ENTRIES below and
one in implementations.py (its class). The settings module's checks use mpippo/rules.py, which is
below both this registry and the config, so no import circle forms.
"""
from __future__ import annotations

from mpippo.algos import a2c_settings, appo_settings, dqn_settings, ppo_settings
from mpippo.algos.entry import ACTOR_LEARNER, LAYOUTS, SYNC, Algorithm, setting  # noqa: F401 (names of its users)

ENTRIES = (a2c_settings.ALGORITHM, appo_settings.ALGORITHM, dqn_settings.ALGORITHM, ppo_settings.ALGORITHM)


def _table(entries) -> dict[str, Algorithm]:
    found: dict[str, Algorithm] = {}
    for entry in entries:
        if entry.name in found:
            raise ValueError(f"algorithm '{entry.name}' is registered twice")
        if entry.layout not in LAYOUTS:
            raise ValueError(f"algorithm '{entry.name}' has layout '{entry.layout}'; allowed: {', '.join(LAYOUTS)}")
        found[entry.name] = entry
    return found


ALGORITHMS: dict[str, Algorithm] = _table(ENTRIES)
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


