"""The actor-learner layout, assembled: per agent, one learner rank and several actor ranks,
for Ape-X DQN (`training.algo: dqn`) and asynchronous PPO (`training.algo: appo`).

The job's World is split into `<algo>.num_agents` contiguous agents (World.split); in each, rank 0
is the learner (mpippo/layout/learner.py; on a GPU when there is one) and the others are actors
(mpippo/layout/actor.py). The algorithm is one object with both halves: `algos.apex.ApeX`
(epsilon-greedy acting and n-step transitions; prioritized replay and the double-DQN loss) or
`algos.appo.APPO` (sampling from the policy and segments of T steps; V-trace and PPO's clipped
loss, the policy lag bounded). Self-play (two-player games, DQN) is a hook on both roles
(selfplay.LearnerHook / ActorHook).

Checkpoints (the learner's): the network, the algorithm's state (DQN: target network, Adam, the
replay RNG and, with `dqn.save_replay`, the replay buffer in a separate file; APPO: Adam, reward
statistics, version, lag histogram), counters and the return window. They are written every
`<algo>.checkpoint_interval_updates` updates / `checkpoint.interval_minutes`, on a signal and
at the end. A signal on any rank of an agent stops its actors (STOPREQ), the learner
drains every chunk in flight, checkpoints and the job exits 3 (SIGUSR1: requeue) or 4. A resume
continues the counters and budgets; it is not bit-exact (actor/learner timing is not), and after
a crash the env steps since the last checkpoint are collected again.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import torch

from mpippo import models, resume, runctl
from mpippo.algos import implementations
from mpippo.algos.policy_gradient import autocast
from mpippo.checkpoint import checkpoint_dir, latest_path, load_checkpoint, read_checkpoint_bytes
from mpippo.comm import World
from mpippo.comm.p2p import ActorChannel, ChunkLayout, LearnerChannel
from mpippo.config import Config, UsageError, agent_folder, layout_section
from mpippo.envs import make_env, rank_seed, streams_seed
from mpippo.layout.actor import Actor
from mpippo.layout.learner import Learner
from mpippo.models.flat import flatten_parameters_
from mpippo.preemption import SignalFlags
from mpippo.metrics.sinks import WandbStart
from mpippo.runctl import bf16_native, cuda_determinism, pick_device, resolve_precision, threads_per_rank
from mpippo.selfplay import ActorHook, LearnerHook, OpponentCache, heuristic_players


@dataclass
class Agent:
    """The facts of one agent that both roles use."""
    cfg: Config
    index: int
    run_dir: Path
    world_size: int
    job_rank: int
    num_envs: int
    obs_shape: tuple
    num_actions: int
    ranks_on_node: int = 1  # the job's ranks on the learner's node (all of them: a one-node job)
    affinity: int = 1  # cores in this rank's affinity mask, and its share of them (World)
    cpu_share: int = 1
    steps_before: int = 0
    resumes: int = 0
    wandb_run: object = None  # the learner's W&B run, begun at start-up (logging.wandb)

    @property
    def ckpt_dir(self) -> Path:
        return checkpoint_dir(self.run_dir)

    @property
    def model_spec(self) -> dict:
        """The checkpoint's model_spec (models.spec): what a resume and evaluate rebuild the network from."""
        return models.spec(self.obs_shape, self.num_actions, self.cfg.model)

    @property
    def section(self):
        """The layout's settings (num_agents, chunk_size, ...): cfg.dqn or cfg.appo."""
        return layout_section(self.cfg)


def start_on(device, learner: Learner, state: dict | None) -> str:
    """The learner's own start-up, in the thread talking_while runs it in (its actors wait meanwhile):
    Learner.restore on a resume (the replay buffer: minutes for many GB), then its logs' writers
    (TensorBoard's import). On the learner's GPU, which is the main thread's current device only (a
    CUDA device is current per thread; a stream or handle made on GPU 0 would put a context of every
    learner there)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    note = learner.restore(state) if state is not None else ""
    learner.open_logs()
    return note


class ActorLearnerRun:
    def __init__(self, cfg: Config, world: World, run_dir: Path, resume: bool = False):
        d = layout_section(cfg)
        per_agent = world.size // d.num_agents
        index = world.rank // per_agent
        self.cfg, self.world = cfg, world
        self.group = world.split(index)  # this agent's ranks: 0 is the learner
        self.is_learner = self.group.rank == 0
        self.num_actors = per_agent - 1
        cfg.parallel.threads_per_rank = threads_per_rank(cfg.parallel.threads_per_rank, world.cpu_share)
        torch.set_num_threads(cfg.parallel.threads_per_rank)  # (the metrics say what ran)
        torch.manual_seed(rank_seed(cfg.training.seed, index))  # same init on a group's ranks
        self.seed = rank_seed(cfg.training.seed, world.rank)
        num_envs = cfg.env.num_envs_per_rank
        self.env = make_env(cfg, num_envs if not self.is_learner else 1, seed=self.seed)  # the learner: spaces only
        self.agent = Agent(cfg, index, agent_folder(run_dir, index, d.num_agents), world.size, world.rank, num_envs,
                           tuple(self.env.obs_shape), int(self.env.num_actions), world.local_size, world.affinity,
                           world.cpu_share)
        self.algo = self.new_algo()
        self.model = self.algo.new_net()
        sp = cfg.selfplay if cfg.selfplay.enabled else None
        self.table_size = 1 + 2 * sp.pool_size if sp else 0
        self.layout = ChunkLayout(d.chunk_size, self.algo.fields(), results_rows=sp.pool_size + 4 if sp else 0,
                                  episode_capacity=self.algo.episode_capacity(d.chunk_size, num_envs))
        self.resume_notes: list[str] = []  # what a resume changes that is safe to change (resume.check)
        self.resume_state = self.resume_point(resume)
        self.streams = streams_seed(cfg.training.seed, world.rank, self.agent.resumes)  # (fresh on each resume)
        if self.agent.resumes and not self.is_learner:  # fresh episodes and exploration, not a replay of segment 1,
            self.env.close()                            # made in start-up: a failure is one line the job agrees on
            self.env = make_env(cfg, num_envs, seed=self.streams)
        self.precision_why = self.settle_precision()
        if self.is_learner and self.algo.learner_bytes() > 0.9 * psutil.virtual_memory().available:
            raise UsageError(f"{self.algo.learner_bytes_key()} need {self.algo.learner_bytes() / 2**30:.1f} GiB, more than the "
                              f"{psutil.virtual_memory().available / 2**30:.1f} GiB available; lower it")

    def new_algo(self):
        """The algorithm object of the run's registry entry (ApeX, APPO): both halves of it."""
        a = self.agent
        return implementations.load(self.cfg.training.algo)(self.cfg, a.obs_shape, a.num_actions, num_actors=self.num_actors,
                                          masked=hasattr(self.env, "action_mask"))

    def settle_precision(self) -> str:
        """training.precision made concrete for this rank's own device (auto -> bf16 | fp32): a
        learner on a GPU and actors on CPUs may differ; nothing requires them to compute alike."""
        t = self.cfg.training
        native, evidence = bf16_native(getattr(self, "device", None) or torch.device("cpu"))
        t.precision, why, warning = resolve_precision(t.precision, native, evidence,
                                                      mlp=len(self.agent.obs_shape) == 1)
        if warning and self.world.is_root:
            print(warning, flush=True)
        return why

    def resume_point(self, resume: bool) -> dict | None:
        """The learner picks its device and reads its agent's checkpoint; the group learns the outcome
        (one start-up bcast), so a bad device or checkpoint ends every rank with the same message.
        Returns the learner's state."""
        outcome, state = {"steps": 0, "resumes": 0}, None
        if self.is_learner:
            try:
                self.device = pick_device(self.cfg.training.device, self.agent.index)
                cuda_determinism(self.device, self.cfg.training.deterministic)
                if resume:
                    state = self.read_checkpoint()
                    outcome = {"steps": int(state["timesteps"]), "resumes": int(state.get("resumes", 0)) + 1}
            except UsageError as e:
                outcome = {"error": e.errors}
        outcome = self.group.bcast_obj(outcome)
        if "error" in outcome:
            raise UsageError(outcome["error"])
        self.agent.steps_before, self.agent.resumes = outcome["steps"], outcome["resumes"]
        return state

    def read_checkpoint(self) -> dict:
        path = latest_path(self.agent.run_dir)
        state = load_checkpoint(read_checkpoint_bytes(path), str(path), self.algo.name)
        self.resume_notes = resume.check(state["config"], self.cfg)  # the same game and levels, or one line
        if self.cfg.selfplay.enabled and "selfplay" not in state:
            raise UsageError("checkpoint: it has no opponent pool (trained without self-play); "
                              "resume it with selfplay.enabled=false")
        if not self.cfg.selfplay.enabled and "selfplay" in state:  # (its pool, ratings and curve would be dropped)
            raise UsageError("selfplay.enabled: false, but the run trained with self-play (its checkpoint holds the "
                              "opponent pool and the ratings); allowed: true on resume (without it: a new run)")
        if state["agent"] != self.agent.index:
            raise UsageError(f"checkpoint: it is agent {state['agent']}'s, in the folder of agent {self.agent.index}")
        resume.load_network(self.model, state, self.cfg, self.agent.model_spec)
        return state

    def start_wandb(self) -> WandbStart | None:
        """Each learner's W&B run in its agent's folder (logging.wandb), begun before anything of
        the run is written; a refusal is a UsageError that the job agrees on."""
        if not self.is_learner or self.cfg.logging.wandb == "off":
            return None
        started = WandbStart(self.cfg, self.agent.run_dir)
        self.agent.wandb_run = started.run
        return started

    def train(self, signals: SignalFlags | None = None) -> dict:
        signals = signals or SignalFlags()
        if self.is_learner:
            self.env.close()  # it gave the spaces; the learner steps no env
            return self.learn(signals)
        return self.act(signals)

    def actor_steps(self) -> int:
        """This actor's share of its agent's remaining env-step budget, in steps of its envs (0 on a learner)."""
        if self.is_learner:
            return 0
        a = self.agent
        budget = self.cfg.training.total_timesteps // a.section.num_agents - a.steps_before
        return self.algo.actor_steps(max(budget, 0), self.num_actors, self.group.rank - 1, a.num_envs)

    # ---- the two roles, assembled ----
    def act(self, signals: SignalFlags) -> dict:
        cfg, a, sp = self.cfg, self.agent, self.cfg.selfplay
        index, steps = self.group.rank - 1, self.actor_steps()
        flat = flatten_parameters_(self.model)
        rng = np.random.default_rng(self.streams + 17)
        ch = ActorChannel(self.group, 0, self.layout, flat.numel(), a.section.max_inflight, self.table_size,
                          snapshots=sp.enabled, timeout_s=cfg.guards.collective_timeout_s)
        hook = None
        if sp.enabled:  # the env's opponent: pool members (inference copies) and the heuristic players
            crng = np.random.default_rng(rng.integers(2**62))
            cache = OpponentCache(self.algo.new_net, a.num_envs, crng, sp.heuristic_prob, sp.pool_size,
                                  lambda: autocast(torch.device("cpu"), cfg.training.precision), sp.opponent_eps,
                                  heuristic_players(cfg, crng))
            hook = ActorHook(sp, cache, self.env)
        acting = self.algo.actor(index, self.model, a.num_envs, rng)
        return Actor(ch, acting, self.env, flat, steps, a.job_rank, self.group.rank, hook).run(signals)

    def learn(self, signals: SignalFlags) -> dict:
        cfg, a, device = self.cfg, self.agent, self.device
        q = self.model.to(device)
        flat = flatten_parameters_(q)
        self.algo.setup_learner(q, device, seed=self.seed, aug_seed=self.streams + 99)
        hook = LearnerHook(cfg, self.greedy_policy(q, device), self.seed) if cfg.selfplay.enabled else None
        ch = LearnerChannel(self.group, list(range(1, self.num_actors + 1)), self.layout, flat.numel(),
                            a.section.max_inflight, self.table_size, timeout_s=cfg.guards.collective_timeout_s)
        learner = Learner(a, self.algo, ch, flat, hook)
        state, self.resume_state = self.resume_state, None
        note = ch.talking_while(lambda: start_on(device, learner, state))
        for line in self.resume_notes:
            print(f"mpippo: agent {a.index}: warning: {line}", flush=True)
        if (spent := self._spent_note()) is not None:
            print(f"mpippo: agent {a.index}: note: {spent}", flush=True)
        a.run_dir.mkdir(parents=True, exist_ok=True)
        verb = f"resuming at {a.steps_before:,} env steps, {learner.c['updates']:,} updates{note}" if a.resumes else "starting"
        print(f"mpippo: agent {a.index}: {verb}: {self.algo.name} on {cfg.env.name}, learner on {device} in "
              f"{cfg.training.precision} ({self.precision_why}), {self.num_actors} actor(s) x {a.num_envs} envs, "
              f"{self.algo.describe()}", flush=True)
        return learner.run(signals)

    def _spent_note(self) -> str | None:
        """The learner's word for a resume whose actors have no step left (runctl.spent_note)."""
        a, total = self.agent, self.cfg.training.total_timesteps
        budget = total // a.section.num_agents  # (each agent's share)
        left = sum(self.algo.actor_steps(max(budget - a.steps_before, 0), self.num_actors, i, a.num_envs)
                   for i in range(self.num_actors))
        if a.section.num_agents == 1:
            return runctl.spent_note(f"training.total_timesteps {total:,}", budget, a.steps_before, left)
        return runctl.spent_note(f"its share, {budget:,}, of training.total_timesteps {total:,}", budget,
                                 a.steps_before, left, "this agent trains nothing")

    def greedy_policy(self, q, device):
        precision = self.cfg.training.precision

        @torch.inference_mode()
        def policy(obs, mask):
            with autocast(device, precision):
                qv = q(torch.from_numpy(obs).to(device)).float()
            return qv.masked_fill(~torch.from_numpy(mask).to(device), float("-inf")).argmax(1).cpu().numpy()
        return policy
