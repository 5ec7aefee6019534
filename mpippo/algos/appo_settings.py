"""APPO's entry in the registry and what the config asks of it before torch loads: the appo
section, its checks (ranges, V-trace's clips, the loss, the batch's split, the agents, the budget
under which no update could happen), and the models of its messages and memory. The algorithm
itself is algos/appo.py (the learner and the actors; it imports torch), named in algos/implementations.py.

The checks use the config's building blocks (mpippo/rules.py), which sit below the config and the
registry: `mpippo.config` imports this module through the registry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mpippo import rules
from mpippo.algos.entry import ACTOR_LEARNER, PPO_LOGS, SYNC_LOOP_KEYS, Algorithm, setting

MAX_EPOCHS = 1000  # passes over one batch: a single update would outlast the actors' patience (guards)
RANGES = {"num_agents": (1, None), "rollout_length": (1, None), "batch_segments": (1, None), "epochs": (1, MAX_EPOCHS),
          "num_minibatches": (1, None), "max_policy_lag": (0, None), "weight_sync_period": (1, None),
          "chunk_size": (1, None), "max_inflight": (1, None), "checkpoint_interval_updates": (0, None)}
LOSSES = ("ppo_clip", "vtrace_pg")


@dataclass
class APPOConfig:
    num_agents: int = setting(1, "Independent agents in one job (as dqn.num_agents): each a learner rank (its own GPU) and its actors.")
    rollout_length: int = setting(64, "Steps T of one segment (one env's T steps under one weights version), the unit actors send and the learner trains on.")
    batch_segments: int = setting(64, "Segments per learner update (batch = batch_segments x rollout_length samples).")
    epochs: int = setting(2, "Passes over each batch; V-trace targets are recomputed with the current network before each.")
    num_minibatches: int = setting(2, "Minibatches per pass; must divide batch_segments x rollout_length.")
    loss: str = setting("ppo_clip", "ppo_clip: PPO's clipped surrogate with the ratio to the behaviour policy and V-trace advantages (APPO) | vtrace_pg: IMPALA's policy gradient.")
    rho_bar: float = setting(1.0, "V-trace clip of the importance weights in the value targets and advantages (IMPALA's rho-bar).")
    c_bar: float = setting(1.0, "V-trace clip of the trace coefficients (IMPALA's c-bar).")
    max_policy_lag: int = setting(20, "Segments whose weights are more than this many learner updates old are dropped (and counted).")
    weight_sync_period: int = setting(1, "Learner updates between weight sends to the actors (non-blocking).")
    chunk_size: int = setting(8, "Segments per actor -> learner message.")
    max_inflight: int = setting(4, "Chunks an actor may have unacknowledged before it waits for the learner.")
    checkpoint_interval_updates: int = setting(0, "Learner updates between periodic checkpoints; 0 = off (checkpoint.interval_minutes, signals and the end still save).")


def check(cfg, world_size: int, earlier: list[str]) -> list[str]:
    a = cfg.appo
    errs = rules.within("appo", a, RANGES)
    for key in ("rho_bar", "c_bar"):
        if not getattr(a, key) > 0 or not math.isfinite(getattr(a, key)):
            errs.append(f"appo.{key}: must be > 0, got {getattr(a, key)}")
    if a.loss not in LOSSES:
        errs.append(f"appo.loss: '{a.loss}' is not one of {', '.join(LOSSES)}")
    if not errs and a.max_policy_lag < a.weight_sync_period:
        errs.append(f"appo.max_policy_lag: {a.max_policy_lag} is below appo.weight_sync_period={a.weight_sync_period}: "
                    f"actors would keep weights older than the bound between syncs and every segment would be dropped; "
                    f"allowed: >= {a.weight_sync_period}")
    if not errs and (a.batch_segments * a.rollout_length) % a.num_minibatches:
        errs.append(f"appo.num_minibatches: the batch ({a.batch_segments} segments x {a.rollout_length} steps = "
                    f"{a.batch_segments * a.rollout_length}) is not divisible by num_minibatches={a.num_minibatches}")
    if not errs and a.chunk_size > 2 * a.batch_segments:
        errs.append(f"appo.chunk_size: a message of {a.chunk_size:,} segments is more than the learner keeps between two "
                    f"updates (a batch and one more: 2 x appo.batch_segments = {2 * a.batch_segments:,}): "
                    f"{a.chunk_size - 2 * a.batch_segments:,} segments of each would be dropped; allowed: "
                    f"<= {2 * a.batch_segments:,}")
    if not errs and not earlier:
        errs += rules.check_agents("appo", a.num_agents, world_size)
    if not errs and not earlier:
        errs += _budget(cfg, world_size)
    return errs


def production(cfg, world_size: int) -> dict:
    """What the actors of one APPO agent make over the whole budget (algos/appo.py: actor_steps):
    rounds of rollout_length steps of all of an actor's envs, one segment per env and round."""
    a = cfg.appo
    actors = world_size // a.num_agents - 1
    envs = rules.actor_envs(cfg, world_size, a.num_agents)
    rounds = cfg.training.total_timesteps // a.num_agents // (envs * a.rollout_length)
    return {"actors": actors, "envs": envs, "rounds": rounds, "total": rounds * envs,
            "per_actor": -(-rounds // actors) * envs}


def _budget(cfg, world_size: int) -> list[str]:
    """Combinations under which no update can ever happen (or the learner gets its data too late)."""
    a, errs = cfg.appo, []
    p = production(cfg, world_size)
    split = (f"{rules.budget_text(cfg, a.num_agents)} // ({p['envs']} envs x appo.rollout_length {a.rollout_length:,}) = "
             f"{p['rounds']:,} round(s) of {p['envs']} segments")
    if p["total"] == 0:
        least = p["envs"] * a.rollout_length * a.num_agents
        errs.append(f"training.total_timesteps: {split}: no segment would ever be made; allowed: >= {least:,} (or lower "
                    f"appo.rollout_length or env.num_envs)")
        return errs
    if a.batch_segments > p["total"]:
        errs.append(f"appo.batch_segments: {a.batch_segments:,} segments per update, but the actors make only "
                    f"{p['total']:,} over the budget (training.total_timesteps {split}): no update would ever happen; "
                    f"allowed: <= {p['total']:,} (or raise training.total_timesteps)")
    if a.chunk_size > p["per_actor"]:
        errs.append(f"appo.chunk_size: {a.chunk_size:,} segments per message, but an actor makes at most "
                    f"{p['per_actor']:,} over the budget (training.total_timesteps {split}, over {p['actors']} "
                    f"actor(s)): they would reach the "
                    f"learner only in its last message, when the run ends, too late to train on; allowed: "
                    f"<= {p['per_actor']:,}")
    return errs


def segment_bytes(frame: int, T: int) -> int:
    """One APPO segment (algos/appo.segment_fields): T+1 frames and first-flags, T actions, log-probs,
    rewards, discounted returns and bootstrap values, the version."""
    return (T + 1) * (frame + 1) + T * (8 + 4 + 4 + 4 + 4) + 8


def chunk_items(cfg, world_size: int) -> tuple[int, int]:
    """APPO's message: (episode-return slots, bytes of chunk_size segments of T+1 frames)."""
    n, T, frame = cfg.appo.chunk_size, cfg.appo.rollout_length, rules.frame_bytes(rules.obs_shape_of(cfg))
    return n * T, (rules.aligned(n * (T + 1) * frame) + rules.aligned(8 * n * T) + 4 * rules.aligned(4 * n * T)
                   + rules.aligned(n * (T + 1)) + 8 * n)


def memory(cfg, world_size: int, z) -> tuple[list, list]:
    """APPO's learner: network copies, a batch of segments and its V-trace forward pass; its actors:
    their envs' segments. z: the layout's sizes (config.LayoutSizes)."""
    a, params, fwd = cfg.appo, z.params, z.fwd
    T, seg = a.rollout_length, segment_bytes(z.frame, a.rollout_length)
    samples = a.batch_segments * T
    learner = [(20 * params, f"network {params:,} parameters x 5 (weights, gradients, two Adam moments, weights "
                f"sent)", z.net_keys),
               (2 * a.batch_segments * seg, f"batch {a.batch_segments:,} segments x {seg:,} bytes, and its copy",
                "appo.batch_segments, appo.rollout_length"),
               (a.batch_segments * (T + 1) * fwd, f"the V-trace forward pass over {a.batch_segments:,} x "
                f"{T + 1:,} frames", "appo.batch_segments, appo.rollout_length"),
               (samples // a.num_minibatches * fwd, f"minibatch {samples // a.num_minibatches:,} samples",
                "appo.batch_segments, appo.rollout_length")]  # (or raise appo.num_minibatches)
    actor = [(2 * z.envs * seg, f"{z.envs:,} envs' segments of {T:,} steps x 2", "appo.rollout_length, env.num_envs")]
    return learner, actor


ALGORITHM = Algorithm(
    "appo", ACTOR_LEARNER, "appo (asynchronous PPO with V-trace: actor ranks and a learner rank, section appo)",
    check=check, section="appo", section_type=APPOConfig, logs=PPO_LOGS, memory=memory,
    chunk_items=chunk_items,
    ignores=SYNC_LOOP_KEYS + ("training.clip_vloss", "training.target_kl", "training.adv_norm", "training.reward_norm"))
