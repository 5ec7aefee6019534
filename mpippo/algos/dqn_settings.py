"""Ape-X DQN's entry in the registry and what the config asks of it before torch loads: the dqn
section, its checks (ranges, agents, the budget under which no update could happen), and the
models of its messages and memory. The algorithm itself is algos/apex.py (the learner and the
actors) with its parts in algos/dqn.py (replay, n-step returns, the loss); both import torch, and
algos/implementations.py, not this module, names them.

The checks use the config's building blocks (mpippo/rules.py: ranges, agents, sizes), which sit
below the config and the registry: `mpippo.config` imports this module through the registry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mpippo import envs, rules
from mpippo.algos.entry import ACTOR_LEARNER, PPO_LOSS_KEYS, SYNC_LOOP_KEYS, Algorithm, setting

MAX_REPLAY_RATIO = 1024  # samples trained per env step: each transition trained on ~1,000 times
RANGES = {"num_agents": (1, None), "buffer_size": (1, None), "batch_size": (1, None), "n_step": (1, None),
          "learning_starts": (0, None), "replay_ratio": (0, MAX_REPLAY_RATIO), "target_update_period": (1, None),
          "weight_sync_period": (1, None), "eps": (0, 1), "eps_alpha": (0, None), "per_alpha": (0, 1),
          "per_beta": (0, 1), "max_episodes": (0, None), "episodes_per_batch": (1, None), "chunk_size": (1, None),
          "max_inflight": (1, None), "checkpoint_interval_updates": (0, None)}


@dataclass
class DQNConfig:
    num_agents: int = setting(1, "Independent agents in one job: COMM_WORLD is split into this many groups, each with its own learner (its own GPU).")
    buffer_size: int = setting(100_000, "Replay capacity in transitions (uint8 frames or float32 vectors; the learner prints the memory it takes).")
    batch_size: int = setting(64, "Transitions per learner update.")
    n_step: int = setting(3, "n-step returns, computed on the actors.")
    learning_starts: int = setting(5000, "Transitions in replay before the learner starts updating.")
    replay_ratio: float = setting(4.0, "Samples trained per env step received; actors wait for the learner beyond it. 0: the learner only collects, no update (a throughput measurement).")
    target_update_period: int = setting(2000, "Learner updates between target-network copies.")
    weight_sync_period: int = setting(25, "Learner updates between weight sends to the actors (non-blocking).")
    eps: float = setting(0.4, "Ape-X exploration base: env i of the N envs of all actors (actor by actor) uses eps ** (1 + eps_alpha * i / (N - 1)).")
    eps_alpha: float = setting(7.0, "Ape-X exploration exponent.")
    per_alpha: float = setting(0.6, "Prioritized replay exponent (0 = uniform).")
    per_beta: float = setting(0.4, "Importance-weight exponent at the start; annealed to 1 over total_timesteps.")
    dueling: bool = setting(True, "Dueling Q head.")
    double: bool = setting(True, "Double-DQN target (online argmax, target value); false = max of the target.")
    max_episodes: int = setting(0, "Stop once the agent's actors finished this many episodes; 0 = off (total_timesteps decides).")
    episodes_per_batch: int = setting(4, "With learning_steps_per_batch: the episodes that earn that many updates.")
    learning_steps_per_batch: Optional[int] = setting(None, "When set, the learner may do this many updates per episodes_per_batch finished episodes, instead of following replay_ratio.")
    chunk_size: int = setting(64, "Transitions per actor -> learner message.")
    max_inflight: int = setting(4, "Chunks an actor may have unacknowledged before it waits for the learner.")
    checkpoint_interval_updates: int = setting(0, "Learner updates between periodic checkpoints; 0 = off (checkpoint.interval_minutes, signals and the end still save).")
    mirror_augment: bool = setting(False, "Train on a left-right mirrored copy of half of each batch (games symmetric under it: connect4).")
    save_replay: bool = setting(False, "Write the replay buffer to checkpoints/replay_<update>.npz with each checkpoint, so a resume starts with a full buffer (as large on disk as in memory; the one before is removed once the checkpoint naming the new one is written).")


def check(cfg, world_size: int, earlier: list[str]) -> list[str]:
    """The dqn section's ranges, the agents the job can form, the env's symmetry for mirroring, the
    budget; then the selfplay section (DQN's alone)."""
    e, d = cfg.env, cfg.dqn
    errs = rules.within("dqn", d, RANGES)
    if d.learning_steps_per_batch is not None and d.learning_steps_per_batch < 1:
        errs.append(f"dqn.learning_steps_per_batch: must be >= 1 or null, got {d.learning_steps_per_batch}")
    if not errs and not earlier:
        errs += rules.check_agents("dqn", d.num_agents, world_size)
    fam = envs.family_of(e.name)
    if d.mirror_augment and fam is not None and not fam.symmetric(e.name):
        errs.append(f"dqn.mirror_augment: the rules of '{e.name}' are not left-right symmetric; allowed: "
                    f"{', '.join(n for f in envs.FAMILIES for n in f.known_names() if f.symmetric(n))}")
    if not errs and not earlier:
        errs += _budget(cfg, world_size)
    return errs + rules.check_selfplay(cfg)


def production(cfg, world_size: int) -> dict:
    """What the actors of one DQN agent make over the whole budget (algos/apex.py: actor_steps, the
    n-step accumulator): steps per env, transitions per actor and in all, and the most updates the
    replay ratio then allows (None when learning by episodes, or with replay_ratio 0)."""
    d = cfg.dqn
    actors = world_size // d.num_agents - 1
    n_envs = rules.actor_envs(cfg, world_size, d.num_agents)
    steps = cfg.training.total_timesteps // d.num_agents // actors // n_envs
    per_actor = max(steps - d.n_step + 1, 0) * n_envs
    total = actors * per_actor
    updates = None
    if d.learning_steps_per_batch is None and d.replay_ratio > 0:
        updates = int(d.replay_ratio * max(total - d.learning_starts, 0) / d.batch_size)
    return {"actors": actors, "envs": n_envs, "steps": steps, "per_actor": per_actor, "total": total, "updates": updates}


def _budget(cfg, world_size: int) -> list[str]:
    """Combinations under which no update can ever happen (or the learner gets its data too late)."""
    d, errs = cfg.dqn, []
    if d.learning_starts > d.buffer_size:
        errs.append(f"dqn.learning_starts: {d.learning_starts:,} is above dqn.buffer_size={d.buffer_size:,}: the replay "
                    f"never holds that many transitions, so no update would ever happen; allowed: <= {d.buffer_size:,}")
    if d.batch_size > d.buffer_size:
        errs.append(f"dqn.batch_size: {d.batch_size:,} is above dqn.buffer_size={d.buffer_size:,}: every batch would "
                    f"repeat transitions of a smaller replay; allowed: <= {d.buffer_size:,}")
    p = production(cfg, world_size)
    split = (f"{rules.budget_text(cfg, d.num_agents)} // {p['actors']} actor(s) // {p['envs']} envs = {p['steps']:,} steps "
             f"per env")
    if p["steps"] < d.n_step:
        least = d.n_step * p["envs"] * p["actors"] * d.num_agents
        errs.append(f"training.total_timesteps: {split}, fewer than dqn.n_step={d.n_step:,}: no transition would ever "
                    f"be made; allowed: >= {least:,} (or lower dqn.n_step or env.num_envs)")
        return errs
    made = (f"{p['actors']} actor(s) x ({p['steps']:,} steps - dqn.n_step {d.n_step} + 1) x {p['envs']} envs = "
            f"{p['total']:,}, with training.total_timesteps {split}")
    # one line per mistake: a learning_starts or batch_size above the replay was said above
    if d.learning_starts >= p["total"]:
        if d.learning_starts <= d.buffer_size:
            errs.append(f"dqn.learning_starts: {d.learning_starts:,} is not below the transitions the actors make over "
                        f"the budget ({made}): no update would ever happen; allowed: < {p['total']:,} (or raise "
                        f"training.total_timesteps)")
    elif p["updates"] is not None and p["updates"] < 1 and d.batch_size <= d.buffer_size:
        least = d.batch_size / (p["total"] - d.learning_starts)
        errs.append(f"dqn.replay_ratio: {d.replay_ratio:g} x ({p['total']:,} transitions - dqn.learning_starts "
                    f"{d.learning_starts:,}) / dqn.batch_size {d.batch_size:,} = {p['updates']} updates over the budget "
                    f"({made}): no update would ever happen; allowed: >= {least:.4g} (or lower dqn.learning_starts)")
    if d.chunk_size > p["per_actor"]:
        errs.append(f"dqn.chunk_size: {d.chunk_size:,} transitions per message, but each actor makes only "
                    f"{p['per_actor']:,} over the budget (({p['steps']:,} steps - dqn.n_step {d.n_step} + 1) x "
                    f"{p['envs']} envs, with training.total_timesteps {split}): they would reach the learner only in "
                    f"its last message, when the run ends, too late to train on; allowed: <= {p['per_actor']:,}")
    return errs


def legal_words(cfg) -> int:
    """The int64 words a transition's next legal moves take (ApeX.legal_words): a two-player game's
    envs.mask_words, else one (all legal, never read)."""
    fam = envs.family_of(cfg.env.name)
    return envs.mask_words(fam.spaces(cfg).num_actions) if fam is not None and fam.two_player else 1


def chunk_items(cfg, world_size: int) -> tuple[int, int]:
    """DQN's message: (episode-return slots, bytes of chunk_size transitions of two frames)."""
    n, frame = cfg.dqn.chunk_size, rules.frame_bytes(rules.obs_shape_of(cfg))
    return (max(n, rules.actor_envs(cfg, world_size, cfg.dqn.num_agents)),
            rules.aligned(8 * n) + rules.aligned(8 * n * legal_words(cfg)) + 2 * rules.aligned(4 * n)
            + 2 * rules.aligned(n * frame))


def memory(cfg, world_size: int, z) -> tuple[list, list]:
    """DQN's learner: network copies, the replay, a batch; its actors: the n-step frames; with
    self-play the opponent pool on both. z: the layout's sizes (config.LayoutSizes)."""
    d, sp, params, frame, envs, net_keys = cfg.dqn, cfg.selfplay, z.params, z.frame, z.envs, z.net_keys
    per = 2 * frame + 16 + 8 * legal_words(cfg)  # two frames, action, return, discount, legal moves
    replay = d.buffer_size * per + 2 * (1 << max(int(d.buffer_size - 1).bit_length(), 0)) * 8
    learner = [(24 * params, f"network {params:,} parameters x 6 (weights, gradients, two Adam moments, target "
                f"network, weights sent)", net_keys),
               (replay, f"replay {d.buffer_size:,} transitions x {per:,} bytes (two frames each)",
                "dqn.buffer_size"),
               (d.batch_size * (2 * frame + 2 * z.fwd), f"batch {d.batch_size:,} transitions and their forward "
                f"passes", "dqn.batch_size")]
    actor = [((d.n_step + 2) * envs * frame, f"{envs:,} envs x (dqn.n_step {d.n_step:,} + 2) frames",
              "dqn.n_step, env.num_envs")]
    if sp.enabled:  # pool members on the learner, cached on the actors; the sampling table in every message
        updates = production(cfg, world_size)["updates"] if world_size // d.num_agents >= 2 else None
        members = min(sp.pool_size, 1 + (updates // sp.snapshot_interval_updates if updates is not None else 0))
        table = (32 * (1 + 2 * sp.pool_size), f"the opponent table of {sp.pool_size:,} slots", "selfplay.pool_size")
        learner += [(members * 4 * params, f"opponent pool of {members:,} snapshot(s)",
                     f"selfplay.pool_size, {net_keys}"),
                    table, (sp.eval_games * (3 * frame + z.fwd), f"{sp.eval_games:,} rating games side by side",
                            "selfplay.eval_games")]
        actor += [((members + 1) * 4 * params, f"{members:,} cached opponent(s)", f"selfplay.pool_size, {net_keys}"),
                  table]
    return learner, actor


ALGORITHM = Algorithm(
    "dqn", ACTOR_LEARNER, "dqn (Ape-X: actor ranks and a learner rank with replay, section dqn)",
    check=check, section="dqn", section_type=DQNConfig, network="q",
    network_options=lambda cfg: {"dueling": cfg.dqn.dueling}, greedy_eval=True, selfplay=True, logs=("td_loss",),
    memory=memory, chunk_items=chunk_items, ignores=SYNC_LOOP_KEYS + PPO_LOSS_KEYS)
