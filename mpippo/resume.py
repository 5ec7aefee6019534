"""What a resume may change, and what it may not: the job stays the job its checkpoint holds.

A checkpoint holds the resolved config of the run that wrote it. Resuming it with a config that
names another game, level set or algorithm would train one task's network on another's data (and
procgen cannot load one game's saved states into another's envs): refused in one line. What can
change safely is said in one line and the run goes on: another world size or per-rank env count
and another precision (a requeue on a node without bf16: the numbers are no longer bit-identical
to an uninterrupted run).

A sync checkpoint holds every rank's state. On the world size and env split that wrote it, each
rank restores its own (exact). On another world size with the same total env count (strong
scaling: env.num_envs divided over more or fewer ranks), the envs' states are re-sharded: the old
ranks' envs joined in rank order, each new rank takes its contiguous share, and every episode in
progress continues. With another total they start fresh. Either way the episode statistics are
carried and the RNG streams re-derived from the seed, the rank and the iteration (`plan`,
`reshard`, `episode_stats`, `elsewhere_note`).
"""
from __future__ import annotations

import numpy as np

from mpippo import config as C
from mpippo import envs
from mpippo.envs import take_rows

# (section, key, what it is called in the message)
FIXED = (("training", "algo", "algorithm"), ("env", "name", "environment"),
         ("env", "distribution_mode", "distribution mode"), ("env", "num_levels", "level count"),
         ("env", "start_level", "first level"), ("env", "kwargs", "env arguments"),
         ("training", "normalize_obs", "observation normalization"))


def _saved(saved: dict, section: str, key: str):
    sec = saved.get(section) if isinstance(saved, dict) else None
    return sec.get(key) if isinstance(sec, dict) else None


def check(saved: dict, cfg: C.Config, per_rank_note: bool = True) -> list[str]:
    """Notes on what changes (empty when nothing does); UsageError when the job itself would.
    per_rank_note=False: the caller says what another per-rank env count does (the sync runner:
    elsewhere_note)."""
    for section, key, name in FIXED:
        was, now = _saved(saved, section, key), getattr(getattr(cfg, section), key)
        if section == "env" and key == "name" and isinstance(was, str):
            was, now = envs.canonical_env_name(was), envs.canonical_env_name(now)
        if section == "env" and key == "kwargs" and isinstance(was, dict) and (fam := envs.family_of(cfg.env.name)):
            was, now = fam.acting_kwargs(cfg.env.name, was), fam.acting_kwargs(cfg.env.name, now)
        if was is not None and was != now:
            raise C.UsageError(
                f"--resume: the checkpoint's {name} is {C.show(was)}, this config asks for {C.show(now)} "
                f"({section}.{key}); a resume continues the same job (fixed: "
                f"{', '.join(f'{s}.{k}' for s, k, _ in FIXED)}): start another run folder instead")
    notes = []
    was, now = _saved(saved, "env", "num_envs_per_rank"), cfg.env.num_envs_per_rank
    if per_rank_note and was is not None and now is not None and was != now:
        notes.append(f"env.num_envs_per_rank is {now}, the checkpoint's run had {was}: model, optimizer and "
                     f"counters continue; env states and RNG streams start fresh (not an exact resume)")
    was, now = _saved(saved, "training", "precision"), cfg.training.precision
    if was in ("fp32", "bf16") and now in ("fp32", "bf16") and was != now:
        notes.append(f"training.precision is {now}, the checkpoint's run used {was}: training continues, but its "
                     f"numbers are no longer bit-identical to an uninterrupted run")
    return notes


def load_network(model, state: dict, cfg: C.Config, spec: dict) -> None:
    """The checkpoint's weights into `model` (built from this config, whose model_spec is `spec`), or one
    line: the model settings that changed since the run was made (a resume keeps its network), else what
    the spec or torch's load said. Both layouts' resumes load through here."""
    if state.get("model_spec") != spec:
        raise C.UsageError(_network_mismatch(state["config"], cfg, f"network {state.get('model_spec')}, this "
                                                                   f"config's {spec}"))
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise C.UsageError(_network_mismatch(state["config"], cfg, _state_dict_detail(e))) from None


def _network_mismatch(saved: dict, cfg: C.Config, detail: str) -> str:
    """model.init aside (it only draws a new run's first weights), every model setting that differs."""
    changed = [f"model.{key} {C.show(now)} (the checkpoint's {C.show(was)})"
               for key, now in vars(cfg.model).items()
               if key != "init" and (was := _saved(saved, "model", key)) is not None and was != now]
    if not changed:
        return f"checkpoint: its network does not fit this config's ({detail})"
    return (f"checkpoint: this config's model settings are not the run's: {'; '.join(changed)}; a resume "
            f"keeps the run's network: allowed: the checkpoint's values (or start another run folder)")


def _state_dict_detail(e: Exception) -> str:
    """torch's load_state_dict error, shortened to its most telling line (its first says only
    'Error(s) in loading state_dict for X:')."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    telling = next((ln for ln in lines[1:] if ln.startswith(("size mismatch", "Missing key", "Unexpected key"))),
                   lines[0] if lines else type(e).__name__)
    return telling[:160]


# A sync rank's entry of a checkpoint's "ranks", the one list of its keys: runners/sync.py rank_state
# writes them, ckpt_schema.check_sync_rank checks them, this module deals them out on another world size.
# The runner's per-env arrays have one row per env like the env's state; the rest are the rank's RNG
# streams (RANK_RNG) and its episode statistics.
RUNNER_PER_ENV = ("obs", "first", "ret_tracker", "ep_ret", "ep_len")
EPISODE_STATS = ("win_returns", "episodes_total", "interval_ep", "interval_ev")
RANK_STATE = ("rng", "env", *RUNNER_PER_ENV, *EPISODE_STATS)
RANK_RNG = ("python", "numpy", "torch", "shuffle", "cuda")  # and "sampler", the device sampler's, when it has one


def plan(state: dict, cfg: C.Config, world_size: int) -> tuple[str, int, int]:
    """How a sync checkpoint's rank states come back on this job: ("exact" | "reshard" | "fresh",
    the checkpoint's env count, this job's). exact: the same world size and per-rank env count;
    reshard: another split of the same total, of envs that save their state; fresh: another total, envs
    that cannot be saved (or no usable rank states)."""
    ranks = state.get("ranks") or []
    was_total = sum(len(r["first"]) for r in ranks)
    now_total = world_size * cfg.env.num_envs_per_rank
    if not ranks or len(ranks) != state["world_size"]:  # (ckpt_schema checks each entry, not their number)
        return "fresh", was_total, now_total
    if len(ranks) == world_size and len(ranks[0]["first"]) == cfg.env.num_envs_per_rank:
        return "exact", was_total, now_total
    can = was_total == now_total and envs.family(cfg).exact_resume
    return ("reshard" if can else "fresh"), was_total, now_total


def reshard(ranks: list[dict], env_name: str, world_size: int, rank: int, seed: int) -> dict:
    """This rank's share of the checkpoint's envs, [rank * n, (rank + 1) * n) of all ranks' envs in
    rank order (n = their total / world_size): the env state and the runner's per-env arrays.
    `seed`: the built-in envs' RNG, which is one per rank and cannot be split."""
    n = sum(len(r["first"]) for r in ranks) // world_size
    lo, hi = rank * n, (rank + 1) * n
    part = {k: take_rows([r[k] for r in ranks], lo, hi) for k in RUNNER_PER_ENV}
    part["env"] = envs.family_of(env_name).reshard([r["env"] for r in ranks], lo, hi, seed)
    return part


def episode_stats(ranks: list[dict], world_size: int, rank: int) -> dict:
    """The job's episode statistics dealt out to this job's ranks. The reporter sums the ranks'
    counters and pools their windows of recent returns: the sums go to rank 0, the windows'
    returns round-robin to every rank, and the job's figures stay what they were."""
    first = rank == 0
    return {"win_returns": [x for r in ranks for x in r["win_returns"]][rank::world_size],
            "episodes_total": sum(int(r["episodes_total"]) for r in ranks) if first else 0,
            "interval_ep": sum((r["interval_ep"] for r in ranks), np.zeros(3)) * first,
            "interval_ev": sum((r["interval_ev"] for r in ranks), np.zeros(5)) * first}


def fresh_episodes_note(env_name: str) -> str:
    """The start-up line of an exact resume of envs that cannot save their state (envs/family.py)."""
    return (f"note: {env_name}'s envs cannot save their state: model, optimizer, counters, reward normalizer, "
            f"episode statistics and RNG streams restored exactly; every env starts a fresh episode")


def elsewhere_note(how: str, was_world: int, world: int, was_envs: int, now_envs: int, saved: bool = True) -> str:
    """The start-up line of a resume on another world size or env split: what carries over, what
    is fresh. saved: whether the envs' states were saved at all (envs/family.py: exact_resume)."""
    rng = "RNG streams re-derived from training.seed, the rank and the iteration"
    if how == "reshard":
        return (f"note: resumed on {world} rank(s) from {was_world}: model, optimizer, counters, reward normalizer, "
                f"episode statistics and {was_envs} env states (episodes in progress) carried over; {rng} "
                f"(deterministic, not bit-identical to an uninterrupted run)")
    why = (f"checkpoint was written by {was_world} rank(s), this job has {world}" if was_world != world else
           f"env.num_envs_per_rank is {now_envs // world}, the checkpoint's run had {was_envs // was_world}")
    envs_part = (f"the checkpoint's {was_envs} env states do not fit this job's {now_envs} envs: they start fresh "
                 f"(episodes in progress are dropped)" if saved else "the envs, whose states cannot be saved, start "
                 "fresh episodes")
    return (f"warning: {why}: restored model, optimizer, counters, reward normalizer and episode statistics; "
            f"{envs_part}; {rng} (not an exact resume)")
