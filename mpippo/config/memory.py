"""Memory models, by arithmetic and without building anything: the networks' parameters, a rank's
lower bound (`memory_floor`), the actor-learner messages (`chunk_bytes`), the learner's and actors'
parts (`layout_memory`), checked against the memory the node has (`host_problems`)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from mpippo import envs
from mpippo.config.layout import actor_learner, algorithm, layout_section, local_num_envs, sync_minibatches
from mpippo.config.schema import Config
from mpippo.netshape import NATURE_LAYERS, nature_out
from mpippo.rules import frame_bytes, obs_shape_of
from mpippo.usage import UsageError


def network_params(obs_shape, channels, hidden_size: int, num_actions: int = 15, downsample: bool = True,
                   arch: str = "impala") -> int:
    """Parameters of the image network, by arithmetic. impala (models/impala_cnn.py): per stage a
    conv and two residual blocks of two 3x3 convs, then the dense layer and two heads (626,256 for
    the default); nature (models/nature_cnn.py): three convs, the dense layer, two heads."""
    h, w, c = obs_shape
    if arch == "nature":
        n = 0
        for ch, k, _ in NATURE_LAYERS:
            n, c = n + k * k * c * ch + ch, ch
        oh, ow = nature_out(h, w)
        return n + (c * oh * ow + 1) * hidden_size + (hidden_size + 1) * (num_actions + 1)
    n = 0
    for ch in channels:
        n += 9 * c * ch + ch + 4 * (9 * ch * ch + ch)
        c = ch
        if downsample:
            h, w = (h + 1) // 2, (w + 1) // 2
    return n + (c * h * w + 1) * hidden_size + (hidden_size + 1) * (num_actions + 1)


def first_conv_bytes(obs_shape, m) -> int:
    """Bytes of the first conv's float32 output per sample (kept for backward): the memory models'."""
    h, w, _ = obs_shape
    if m.arch == "nature":
        ch, k, st = NATURE_LAYERS[0]
        return ((h - k) // st + 1) * ((w - k) // st + 1) * ch * 4
    return h * w * m.channels[0] * 4


def mlp_params(obs_dim: int, sizes, num_actions: int, kind: str = "actor_critic") -> int:
    """Parameters of an MLP of models/mlp.py: the actor-critic's policy and value networks of `sizes`,
    or (kind q) the Q-network's one stack and its dueling head."""
    def layers(widths):
        return sum((a + 1) * b for a, b in zip(widths, widths[1:]))
    if kind == "q":
        return layers([obs_dim, *sizes, num_actions + 1])
    return layers([obs_dim, *sizes, num_actions]) + layers([obs_dim, *sizes, 1])


def memory_floor(cfg: Config, world_size: int) -> tuple[int, str]:
    """A lower bound of one env-stepping rank's memory in bytes, and what it is made of. A lower
    bound (the real peak is several times larger: docs/performance.md), so it never refuses a job
    that would fit; it catches the sizes that would only end in an allocation failure. In the
    actor-learner layout (dqn, appo) this is an actor; `layout_memory` has the learner too."""
    m, t = cfg.model, cfg.training
    if actor_learner(cfg):
        parts = layout_memory(cfg, world_size)[1]
        return sum(b for b, _, _ in parts), ", ".join(what for _, what, _ in parts)
    sp = envs.spaces_of(cfg)
    n_envs = local_num_envs(cfg, world_size)
    if sp.image:
        params = network_params(sp.obs_shape, m.channels, m.hidden_size, sp.num_actions, m.downsample, m.arch)
        first_act = first_conv_bytes(sp.obs_shape, m)  # float32 output of the first conv, kept for backward
    else:
        params = mlp_params(sp.obs_shape[0], m.mlp_sizes, sp.num_actions)
        first_act = 2 * sum(m.mlp_sizes) * 4  # both networks' hidden activations
    obs_bytes = frame_bytes(sp.obs_shape)
    # observations + six float32/int64 fields per step; one minibatch's first activations
    steps = t.n_steps
    rollout, minibatch = steps * n_envs * (obs_bytes + 32), max(steps * n_envs // sync_minibatches(cfg)[1], 1)
    need = 16 * params + rollout + minibatch * first_act  # params: weights, gradients, two Adam moments
    return need, (f"network {params:,} parameters, {n_envs:,} envs x {steps:,} steps of {obs_bytes:,}-byte "
                  f"observations, minibatch {minibatch:,} samples")


def chunk_bytes(cfg: Config, world_size: int) -> int:
    """One actor -> learner message (comm/p2p.ChunkLayout), by arithmetic: the header, self-play's
    result rows, the episode-return slots and chunk_size items (DQN: transitions of two frames;
    APPO: segments of T+1 frames)."""
    rows = cfg.selfplay.pool_size + 4 if _selfplay_rows(cfg) else 0
    capacity, items = algorithm(cfg).chunk_items(cfg, world_size)
    return 64 + 32 * rows + 8 * capacity + items


def _selfplay_rows(cfg: Config) -> bool:
    """Whether the messages carry self-play's game results (selfplay on, and the algorithm has it)."""
    return cfg.selfplay.enabled and algorithm(cfg).selfplay


@dataclass(frozen=True)
class LayoutSizes:
    """What every actor-learner memory model is made of: a frame, one sample's forward pass, the
    network's parameters and an actor's envs (bytes, counts); the keys that size the network."""
    frame: int
    fwd: int
    params: int
    envs: int
    net_keys: str = "model.hidden_size, model.channels"


def layout_memory(cfg: Config, world_size: int) -> tuple[list, list]:
    """Lower bounds of a learner's and of an actor's memory in the actor-learner layout, as parts
    [(bytes, what, the keys that size it)]: what is allocated for certain (buffers, network copies,
    one forward pass), never the allocator's or the framework's overhead. The messages' parts are
    the layout's; the rest is the algorithm's (its registry entry's `memory`)."""
    m, sp, section = cfg.model, cfg.selfplay, algorithm(cfg).section
    sec = layout_section(cfg)
    obs_shape = obs_shape_of(cfg)
    frame, elems = frame_bytes(obs_shape), math.prod(obs_shape)
    if len(obs_shape) == 3:  # per sample: the float input and the first conv's output
        fwd, net_keys = 4 * elems + first_conv_bytes(obs_shape, m), "model.hidden_size, model.channels"
        params = network_params(obs_shape, m.channels, m.hidden_size, downsample=m.downsample, arch=m.arch)
    else:  # vectors: the input and the MLPs' hidden activations (an actor-critic's two towers at most)
        fwd, net_keys = 4 * elems + 2 * sum(m.mlp_sizes) * 4, "model.mlp_sizes"
        params = mlp_params(elems, m.mlp_sizes, envs.spaces_of(cfg).num_actions, algorithm(cfg).network)
    actors, n_envs = world_size // sec.num_agents - 1, local_num_envs(cfg, world_size)
    rows = 32 * (sp.pool_size + 4) if _selfplay_rows(cfg) else 0  # self-play's game results, per message
    chunk = chunk_bytes(cfg, world_size) - rows
    chunk_keys = f"{section}.chunk_size, {section}.max_inflight"
    sizes = LayoutSizes(frame, fwd, params, n_envs, net_keys)
    learner = [(actors * sec.max_inflight * chunk, f"{actors} actor(s) x {sec.max_inflight:,} messages in flight x "
                f"{chunk:,} bytes", chunk_keys)]
    actor = [(8 * params, f"network {params:,} parameters x 2 (the copy it acts with, the weights received)",
              net_keys),
             (sec.max_inflight * chunk, f"{sec.max_inflight:,} messages in flight x {chunk:,} bytes", chunk_keys),
             (n_envs * fwd, f"{n_envs:,} envs' forward pass", "env.num_envs")]
    if rows:
        learner.append((actors * sec.max_inflight * rows, f"{actors} actor(s) x {sec.max_inflight:,} messages' "
                        f"game-result rows of {rows:,} bytes", "selfplay.pool_size"))
        actor.append((sec.max_inflight * rows, f"{sec.max_inflight:,} messages' game-result rows of {rows:,} bytes",
                      "selfplay.pool_size"))
    more_learner, more_actor = algorithm(cfg).memory(cfg, world_size, sizes)
    return learner + more_learner, actor + more_actor


def memory_available(ranks_on_node: int) -> int:
    """Bytes this rank may use: the node's available memory (and its cgroup's, under Slurm) shared
    by the ranks on the node."""
    import psutil
    avail = psutil.virtual_memory().available
    try:  # cgroup v2: Slurm's per-job limit
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit.isdigit():
            avail = min(avail, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(avail, 0) // max(ranks_on_node, 1)


# a rank's interpreter with numpy, torch and procgen loaded, before it allocates anything of its own
# (docs/cluster.md: about 350 MB per procgen process); the trainer's own floor comes on top
RANK_BASE_BYTES = 300 << 20


def _slurm_nodes() -> int:
    """The allocation's node count, 1 outside Slurm or where the variable is not a count (Slurm
    writes a plain number; anything else is not Slurm's, and one node is the cautious reading).
    Outside a job (no SLURM_JOB_ID, as Slurm sets beside it), a stray SLURM_JOB_NUM_NODES=1000 let
    500 ranks start on this one node."""
    job = os.environ.get("SLURM_JOB_ID", "").strip()
    if not (job.isascii() and job.isdigit()):
        return 1
    try:
        return max(int(os.environ.get("SLURM_JOB_NUM_NODES", "1").strip()), 1)
    except ValueError:  # (words, "²", past int()'s 4,300 digits)
        return 1


def ranks_fit(ranks: int, flag: str) -> None:
    """`ranks` processes on this node (or on each node of a Slurm allocation) must have memory to start."""
    per_node = -(-ranks // _slurm_nodes())
    need, have = per_node * RANK_BASE_BYTES, memory_available(1)
    if need > have:
        raise UsageError(f"{flag}: {ranks:,} rank(s) need at least {need / 2**30:,.1f} GiB on this node to start "
                          f"({RANK_BASE_BYTES >> 20} MB each), {have / 2**30:,.1f} GiB are available; give fewer")


def host_problems(cfg: Config, world_size: int, ranks_on_node: int) -> list[str]:
    """What this node cannot give the config: memory for its sizes, cores for its threads."""
    errs = [memory_problem(cfg, world_size, ranks_on_node)]
    cores = os.cpu_count() or 1
    if cfg.parallel.threads_per_rank > cores:
        errs.append(f"parallel.threads_per_rank: {cfg.parallel.threads_per_rank} threads per rank on a node of {cores} "
                    f"core(s); allowed: 0 (auto) to {cores}")
    from mpippo.runctl import threads_from_env  # (what auto takes: the same bound)
    if cfg.parallel.threads_per_rank == 0 and (taken := threads_from_env()) and taken[1] > cores:
        errs.append(f"{taken[0]}={taken[1]}: threads per rank (parallel.threads_per_rank 0, auto, takes it) on a node of "
                    f"{cores} core(s); allowed: 1 to {cores}, or set parallel.threads_per_rank")
    return [e for e in errs if e]


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f}"


def memory_problem(cfg: Config, world_size: int, ranks_on_node: int) -> str | None:
    if actor_learner(cfg):
        return _layout_memory_problem(cfg, world_size, ranks_on_node)
    need, parts = memory_floor(cfg, world_size)
    have = memory_available(ranks_on_node)
    if need <= have:
        return None
    return (f"memory: this config needs at least {need / 2**30:,.1f} GiB per rank ({parts}), but {have / 2**30:,.1f} GiB "
            f"are available to each of the {ranks_on_node} rank(s) on this node; lower model.hidden_size, model.channels, "
            f"env.num_envs or training.n_steps")


def _layout_memory_problem(cfg: Config, world_size: int, ranks_on_node: int) -> str | None:
    """The learners and actors this node holds against its available memory. Ranks are placed in
    order, agent after agent (a learner, then its actors), so a node of r ranks holds at most
    ceil(r / ranks per agent) learners (the first node holds that many)."""
    per_agent = world_size // layout_section(cfg).num_agents
    learners = min(layout_section(cfg).num_agents, -(-ranks_on_node // max(per_agent, 1)))
    actors = max(ranks_on_node - learners, 0)
    learner, actor = layout_memory(cfg, world_size)
    one_learner, one_actor = sum(b for b, _, _ in learner), sum(b for b, _, _ in actor)
    need = learners * one_learner + actors * one_actor
    have = memory_available(1)
    if need <= have:
        return None
    weighted = sorted([(learners * b, "learner", what, keys) for b, what, keys in learner] +
                      [(actors * b, "actor", what, keys) for b, what, keys in actor], key=lambda x: -x[0])
    top, covered = [], 0
    for part in weighted:  # the few parts that make most of it: what to lower
        if not part[0]:
            break
        top.append(part)
        covered += part[0]
        if covered >= 0.9 * need:
            break
    keys = list(dict.fromkeys(k.strip() for _, _, _, ks in top for k in ks.split(",")))
    most = "; ".join(f"{role}: {what} = {_gib(b / (learners if role == 'learner' else actors))} GiB"
                     for b, role, what, _ in top)
    return (f"memory: this config needs at least {_gib(need)} GiB on this node ({learners} learner(s) x "
            f"{_gib(one_learner)} GiB + {actors} actor(s) x {_gib(one_actor)} GiB; most of it: {most}), but "
            f"{_gib(have)} GiB are available there; lower {', '.join(keys)}")


