"""Typed configuration: YAML file + CLI overrides -> validated `Config`, in five parts:

  schema   the typed sections (every key with its default and help), reading a mapping (`from_dict`)
  sources  the YAML file (read strictly) and the `--set section.key=value` overrides
  checks   `validate` (every problem at once, each one line naming the bad value and what is
           allowed) and `build` (merge, type-check, validate)
  layout   what a config means for N ranks: its algorithm's layout, the envs per rank, `resolve`
  memory   memory models by arithmetic, checked against the node (`host_problems`)

`from mpippo import config as C` reaches all of them (C.build, C.Config, C.validate, ...).
`python -m mpippo.config` prints every key with its help. The checks' building blocks shared with
the algorithms' settings modules are in mpippo/rules.py, below this package and the registry.
"""
from mpippo.algos import registry  # noqa: F401 (config.registry: the algorithms, for the config's readers)
from mpippo.envs import canonical_env_name  # noqa: F401 (a name of config)
from mpippo.rules import frame_bytes, obs_shape_of, show  # noqa: F401 (names of config)
from mpippo.usage import UsageError  # noqa: F401 (config.UsageError: the one-line refusal)

from mpippo.config.schema import (ALGOS, ARCHS, check_saved_imports, CheckpointConfig, Config, DEFAULT_CONFIG,
                                  describe, EARLIER_DEFAULTS, EnvConfig, file_key, FILE_KEYS, from_dict,
                                  GuardsConfig, INITS, INT64_MAX, LAUNCH_ONLY, LoggingConfig, MAX_CONFIG_BYTES,
                                  ModelConfig, OFF_STRINGS, ParallelConfig, _section_classes, SECTIONS,
                                  SelfPlayConfig, TrainingConfig, WANDB_MODES, with_earlier_defaults)
from mpippo.config.sources import (load_yaml, merge_overrides, parse_override)
from mpippo.config.checks import (build, validate, wandb_missing, WANDB_PROJECT_FORBIDDEN, world_size_problems)
from mpippo.config.layout import (actor_learner, agent_folder, algorithm, envs_note, ignored_note, layout_section,
                                  local_num_envs, resolve, saved_form, stepping_ranks, sync_minibatches)
from mpippo.config.memory import (chunk_bytes, first_conv_bytes, host_problems, layout_memory, LayoutSizes,
                                  memory_available, memory_floor, memory_problem, mlp_params, network_params)
