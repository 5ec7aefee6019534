"""What a resume may change, and what it may not: the job stays the job its checkpoint holds.

A checkpoint holds the resolved config of the run that wrote it. Resuming it with a config that
names another game, level set or algorithm would train one task's network on another's data (and
procgen cannot load one game's saved states into another's envs): refused in one line. What can
change safely is said in one line and the run goes on: another per-rank env count (as another
world size: env states and RNG streams start fresh) and another precision (a requeue on a node
without bf16: the numbers are no longer bit-identical to an uninterrupted run).
"""
from __future__ import annotations

from mpippo import config as C

# (section, key, what it is called in the message)
FIXED = (("training", "algo", "algorithm"), ("env", "name", "environment"),
         ("env", "distribution_mode", "distribution mode"), ("env", "num_levels", "level count"),
         ("env", "start_level", "first level"))


def _saved(saved: dict, section: str, key: str):
    sec = saved.get(section) if isinstance(saved, dict) else None
    return sec.get(key) if isinstance(sec, dict) else None


def check(saved: dict, cfg: C.Config) -> list[str]:
    """Notes on what changes (empty when nothing does); ConfigError when the job itself would."""
    for section, key, name in FIXED:
        was, now = _saved(saved, section, key), getattr(getattr(cfg, section), key)
        if section == "env" and key == "name" and isinstance(was, str):
            was, now = C.canonical_env_name(was), C.canonical_env_name(now)
        if was is not None and was != now:
            raise C.ConfigError(
                f"--resume: the checkpoint's {name} is {C.show(was)}, this config asks for {C.show(now)} "
                f"({section}.{key}); a resume continues the same job (fixed: "
                f"{', '.join(f'{s}.{k}' for s, k, _ in FIXED)}): start another run folder instead")
    notes = []
    was, now = _saved(saved, "env", "num_envs_per_rank"), cfg.env.num_envs_per_rank
    if was is not None and now is not None and was != now:
        notes.append(f"env.num_envs_per_rank is {now}, the checkpoint's run had {was}: model, optimizer and "
                     f"counters continue; env states and RNG streams start fresh (not an exact resume)")
    was, now = _saved(saved, "training", "precision"), cfg.training.precision
    if was in ("fp32", "bf16") and now in ("fp32", "bf16") and was != now:
        notes.append(f"training.precision is {now}, the checkpoint's run used {was}: training continues, but its "
                     f"numbers are no longer bit-identical to an uninterrupted run")
    return notes


def envs_changed(saved: dict, cfg: C.Config) -> bool:
    was = _saved(saved, "env", "num_envs_per_rank")
    return was is not None and was != cfg.env.num_envs_per_rank
