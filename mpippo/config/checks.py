"""Validation: every problem of a config for a job of N ranks, each one line naming the bad value and
what is allowed (`validate`, all at once, then the algorithm's own check from its registry entry);
`build` merges, type-checks and validates."""
from __future__ import annotations

import importlib.util
import math
from typing import Any

from mpippo import envs, rules
from mpippo.algos import registry
from mpippo.config.layout import algorithm
from mpippo.config.schema import (ALGOS, ARCHS, INITS, WANDB_MODES, Config, EnvConfig, ModelConfig, _closest, file_key,
                                  from_dict)
from mpippo.config.sources import merge_overrides
from mpippo.netshape import nature_out
from mpippo.rules import show
from mpippo.usage import UsageError


def validate(cfg: Config, world_size: int = 1) -> list[str]:
    """All problems with `cfg` for a job of `world_size` ranks, each one line."""
    errs = _check_choices(cfg) + _check_ranges(cfg)
    errs += world_size_problems(cfg.parallel.expected_world_size, world_size)
    if cfg.training.algo not in ALGOS:  # said by _check_choices
        return errs
    return errs + algorithm(cfg).check(cfg, world_size, errs)


def world_size_problems(expected: Any, world_size: int) -> list[str]:
    """parallel.expected_world_size against the job's ranks (type-checked values; the start-up also
    asks it of a --set value before the run folder is touched: see cli._parse)."""
    if expected is None:
        return []
    if expected < 1:
        return [f"parallel.expected_world_size: must be a number of ranks >= 1 (the tasks the job was given), or "
                f"null for any; got {show(expected)}"]
    if expected != world_size and world_size == 1:
        return [f"parallel.expected_world_size: {show(expected)} tasks were allocated but this job has "
                f"{world_size} rank(s); the launcher started separate jobs (use mpirun, or srun --mpi=pmix)"]
    if expected != world_size:
        return [f"parallel.expected_world_size: {show(expected)} ranks expected, but this job has {world_size}; "
                f"allowed: a job of {show(expected)} ranks (mpirun -n {show(expected)}), or null for any"]
    return []


def _check_choices(cfg: Config) -> list[str]:
    """Names and modes: env, algorithm, precision, normalization, device, the network's initial weights."""
    errs: list[str] = []
    e, t = cfg.env, cfg.training

    errs += _check_env(cfg)
    if e.num_threads is not None and not 0 <= e.num_threads <= 1024:
        errs.append(f"env.num_threads: must be null (auto) or in [0, 1024], got {e.num_threads}")
    if t.algo not in ALGOS:
        errs.append(f"training.algo: '{t.algo}' is not supported; allowed: {', '.join(ALGOS)}")
    selfplay_algos = [a.name for a in registry.ALGORITHMS.values() if a.selfplay]
    if cfg.selfplay.enabled and t.algo not in selfplay_algos:
        errs.append(f"selfplay.enabled: self-play runs in the DQN learner layout, training.algo is '{t.algo}'; "
                    f"allowed: {', '.join(selfplay_algos)}")
    errs += rules.selfplay_values(cfg.selfplay)
    if t.precision not in ("auto", "fp32", "bf16"):
        errs.append(f"training.precision: '{t.precision}' is not one of auto, fp32, bf16")
    if t.adv_norm not in ("minibatch", "rollout"):
        errs.append(f"training.adv_norm: '{t.adv_norm}' is not one of minibatch, rollout")
    if t.reward_norm not in ("step", "rollout"):
        errs.append(f"training.reward_norm: '{t.reward_norm}' is not one of step, rollout")
    if t.device not in ("cpu", "cuda", "auto"):
        errs.append(f"training.device: '{t.device}' is not one of cpu, cuda, auto")
    if cfg.model.init not in INITS:
        errs.append(f"model.init: {show(cfg.model.init)} is not one of {', '.join(INITS)}")
    if cfg.model.arch not in ARCHS:
        errs.append(f"model.arch: {show(cfg.model.arch)} is not one of {', '.join(ARCHS)}")
    elif cfg.model.arch == "nature":
        errs += [f"model.{k}: {show(getattr(cfg.model, k))} is read by model.arch impala only (nature is a fixed "
                 f"stack of convolutions): remove it" for k in ("channels", "downsample")
                 if getattr(cfg.model, k) != getattr(ModelConfig(), k)]
    errs += _check_wandb(cfg.logging)

    return errs


def _check_env(cfg: Config) -> list[str]:
    """env.name names a family (mpippo/envs/), which checks its own keys; another family's keys
    left at their defaults (a key set for one family and ignored by the next would mislead)."""
    e = cfg.env
    fam = envs.family_of(e.name)
    if fam is None:
        return [f"env.name: unknown environment {show(e.name)}{_closest(e.name, envs.known_env_names())}; "
                f"allowed: {envs.allowed_env_names()}"]
    errs = [f"env.{file_key('env', k)}: {show(getattr(e, k))} is read by "
            f"{', '.join(f.name for f in envs.FAMILIES if k in f.keys)} envs only; env.name {show(e.name)} is of "
            f"the {fam.name} family: remove it" for k in ("kwargs", "imports", "distribution_mode", "num_levels", "start_level")
            if getattr(e, k) != getattr(EnvConfig(), k) and k not in fam.keys]  # (num_threads: any family's)
    if errs or (errs := fam.check(cfg)):
        return errs
    t = cfg.training
    if t.algo in ALGOS and not algorithm(cfg).continuous and fam.spaces(cfg).continuous:
        return [f"training.algo: '{t.algo}' takes discrete actions, {e.name} has continuous (Box) ones; allowed "
                f"with {e.name}: {', '.join(a.name for a in registry.ALGORITHMS.values() if a.continuous)}"]
    if not t.obs_clip > 0:
        errs.append(f"training.obs_clip: must be > 0, got {show(t.obs_clip)}")
    shape = fam.spaces(cfg).obs_shape
    if t.normalize_obs and len(shape) != 1:
        errs.append(f"training.normalize_obs: {e.name} has image observations; allowed: true for vector "
                    f"observations only (images are scaled to [0, 1] by the network)")
    if cfg.model.arch == "nature" and (len(shape) != 3 or min(nature_out(*shape[:2])) < 1):
        errs.append(f"model.arch: nature takes frames of at least 36x36 (its 8x8/4, 4x4/2 and 3x3 convolutions); "
                    f"{e.name} observes {'x'.join(map(str, shape))}; allowed there: impala")
    return errs


def wandb_missing() -> bool:
    return importlib.util.find_spec("wandb") is None


def _check_wandb(lg) -> list[str]:
    if lg.wandb not in WANDB_MODES:
        return [f"logging.wandb: {show(lg.wandb)} is not one of {', '.join(WANDB_MODES)}"]
    if lg.wandb != "off" and wandb_missing():
        return [f"logging.wandb: '{lg.wandb}' needs the wandb package (pip install wandb); or logging.wandb=off"]
    bad = sorted(set(WANDB_PROJECT_FORBIDDEN) & set(lg.wandb_project))
    if not lg.wandb_project.strip() or len(lg.wandb_project) > 128 or bad:
        return [f"logging.wandb_project: {show(lg.wandb_project)} is not a W&B project name: 1 to 128 characters, "
                f"none of {' '.join(WANDB_PROJECT_FORBIDDEN)}" + (f" (it has {' '.join(bad)})" if bad else "")]
    return []


WANDB_PROJECT_FORBIDDEN = "/\\#?%:"  # what W&B refuses in a project name (wandb.init says so)


def _check_ranges(cfg: Config) -> list[str]:
    """Numbers: positive, in [0, 1], non-negative; model shape."""
    errs: list[str] = []
    e, t, lg, ck, m, p = cfg.env, cfg.training, cfg.logging, cfg.checkpoint, cfg.model, cfg.parallel
    positive = {
        "training.total_timesteps": t.total_timesteps, "training.n_steps": t.n_steps,
        "training.n_epochs": t.n_epochs, "training.num_minibatches": t.num_minibatches,
        "training.learning_rate": t.learning_rate, "training.adam_eps": t.adam_eps,
        "training.clip_range": t.clip_range, "training.max_grad_norm": t.max_grad_norm,
        "logging.log_interval": lg.log_interval, "logging.print_interval": lg.print_interval,
        "guards.checksum_interval": cfg.guards.checksum_interval,
        "guards.max_nonfinite_skips": cfg.guards.max_nonfinite_skips, "model.hidden_size": m.hidden_size,
        "checkpoint.keep_last": ck.keep_last,
    }
    if e.num_envs_per_rank is None:
        positive["env.num_envs"] = e.num_envs
    else:
        positive["env.num_envs_per_rank"] = e.num_envs_per_rank
    for key, val in positive.items():
        if not val > 0 or (isinstance(val, float) and not math.isfinite(val)):
            errs.append(f"{key}: must be > 0, got {val}")
    unit = {"training.gamma": t.gamma, "training.gae_lambda": t.gae_lambda}
    if t.reward_norm_gamma is not None:
        unit["training.reward_norm_gamma"] = t.reward_norm_gamma
    for key, val in unit.items():
        if not 0.0 <= val <= 1.0:
            errs.append(f"{key}: must be in [0, 1], got {val}")
    for key, val in {"training.ent_coef": t.ent_coef, "training.vf_coef": t.vf_coef,
                     "checkpoint.interval_iterations": ck.interval_iterations,
                     "checkpoint.interval_minutes": ck.interval_minutes,
                     "parallel.threads_per_rank": p.threads_per_rank,
                     "guards.collective_timeout_s": cfg.guards.collective_timeout_s}.items():
        if val < 0:
            errs.append(f"{key}: must be >= 0, got {val}")
    if t.duration_hours is not None and not t.duration_hours > 0:
        errs.append(f"training.duration_hours: must be > 0 or null, got {t.duration_hours}")
    if t.target_kl is not None and not t.target_kl > 0:
        errs.append(f"training.target_kl: must be > 0 or null, got {t.target_kl}")
    if t.rollout_cutoff is not None and not 0 < t.rollout_cutoff <= 1:
        errs.append(f"training.rollout_cutoff: must be in (0, 1] (a fraction of the ranks) or null, got {t.rollout_cutoff}")
    if not 0 < t.rollout_min_fraction <= 1:
        errs.append(f"training.rollout_min_fraction: must be in (0, 1], got {t.rollout_min_fraction}")
    if not m.downsample and t.algo in ALGOS and algorithm(cfg).network != "q":
        errs.append(f"model.downsample: false is for the DQN network (small boards); training.algo is '{t.algo}'")
    if not m.channels or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in m.channels):
        errs.append(f"model.channels: must be a non-empty list of positive ints, got {show(m.channels)}")
    if not isinstance(m.mlp_sizes, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0
                                                    for c in m.mlp_sizes):
        errs.append(f"model.mlp_sizes: must be a list of positive ints (hidden layer widths; [] for a linear "
                    f"policy), got {show(m.mlp_sizes)}")

    return errs


def build(data: dict, overrides: list[tuple[str, str, Any]], world_size: int) -> Config:
    """Merge + type-check + validate; raises UsageError with every problem found."""
    errors: list[str] = []
    cfg = from_dict(merge_overrides(data, overrides), errors)
    if errors:
        raise UsageError(errors)
    errors = validate(cfg, world_size)
    if errors:
        raise UsageError(errors)
    return cfg


