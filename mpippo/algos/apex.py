"""Ape-X DQN as an algorithm of the actor-learner layout (mpippo/layout): pure torch/numpy.

The layout moves chunks, credits and weights and owns budgets, signals, checkpoints and logs;
this object says what an actor does with an observation and what the learner does with a
chunk. Actor side: epsilon-greedy over the Q-network (Ape-X epsilon ladder), n-step transitions
(`chunk_fields` names what one transition carries). Learner side: prioritized replay, the
double-DQN loss with importance weights, the target network, and how many updates the data
received so far allows (the replay ratio, or updates per finished episodes).
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from mpippo.algos.adam import Adam
from mpippo.algos.dqn import NStepAccumulator, PrioritizedReplay, apex_epsilons, double_dqn_loss, mirror_half
from mpippo.algos.ppo import autocast
from mpippo.envs import bits_to_mask, mask_bits
from mpippo.errors import NonFiniteError
from mpippo.models import DuelingQNetwork

REPLAY_FILE = "replay.npz"


def chunk_fields(obs_shape) -> list[tuple[str, type, tuple]]:
    """What one transition carries in a chunk: (name, dtype, shape of one item)."""
    obs_shape = tuple(obs_shape)
    return [("actions", np.int64, ()), ("returns", np.float32, ()), ("discounts", np.float32, ()),
            ("next_legal", np.int64, ()), ("obs", np.uint8, obs_shape), ("next_obs", np.uint8, obs_shape)]


def nonfinite_message(what: str, streak: int, limit: int, lr: float, loss: float | None = None,
                      unit: str = "learner updates") -> str:
    """The one line that ends a learner whose steps kept failing (APPO's too)."""
    last = f" (last loss {loss:g})" if loss is not None else ""
    return (f"{what} or its gradient was not finite{last} in {streak} consecutive {unit}, each skipped "
            f"(guards.max_nonfinite_skips = {limit}): training diverged; lower training.learning_rate (now {lr:g})")


class ApeX:
    name = "dqn"
    steps_per_item = 1  # a chunk item is one (n-step) transition
    log_every_updates = 0  # updates are many and small: the learner logs by time only

    def __init__(self, cfg, obs_shape, num_actions: int, num_actors: int, masked: bool):
        self.cfg, self.d, self.t = cfg, cfg.dqn, cfg.training
        self.obs_shape, self.num_actions, self.masked = tuple(obs_shape), num_actions, masked
        self.epsilons = apex_epsilons(num_actors, self.d.eps, self.d.eps_alpha)
        self.samples_per_update = self.d.batch_size
        self.max_nonfinite = cfg.guards.max_nonfinite_skips
        self.skipped = self.nonfinite_streak = 0  # updates skipped for a non-finite loss or gradient

    # ------------------------------------------------- what the layout asks of an algorithm
    def new_net(self) -> torch.nn.Module:
        m = self.cfg.model
        return DuelingQNetwork(self.obs_shape, self.num_actions, tuple(m.channels), m.hidden_size, self.d.dueling,
                               m.downsample).init_trunk_(m.init)

    def fields(self) -> list[tuple[str, type, tuple]]:
        return chunk_fields(self.obs_shape)

    def episode_capacity(self, chunk_size: int, num_envs: int) -> int:
        """Episodes one chunk's header can carry: a chunk is sent at least every chunk_size / num_envs steps."""
        return max(chunk_size, num_envs)

    def actor_steps(self, budget: int, num_actors: int, index: int, num_envs: int) -> int:
        """Actor `index`'s share of the agent's remaining env-step budget, in steps of its envs."""
        return budget // num_actors // num_envs

    def describe(self) -> str:
        return (f"replay {self.d.buffer_size:,} transitions = {self.learner_bytes() / 2**30:.2f} GiB, epsilons "
                f"{', '.join(f'{e:.4f}' for e in self.epsilons)}")

    # ---------------------------------------------------------------- actor side
    def actor(self, index: int, net: torch.nn.Module, num_envs: int, rng: np.random.Generator) -> "ApeXActing":
        return ApeXActing(self, float(self.epsilons[index]), net, num_envs, rng)

    # -------------------------------------------------------------- learner side
    def learner_bytes(self) -> int:
        """What the learner holds beyond the network: the replay buffer."""
        return PrioritizedReplay.nbytes(self.d.buffer_size, self.obs_shape)

    def setup_learner(self, q: torch.nn.Module, device, seed: int, aug_seed: int) -> None:
        self.q, self.target, self.device = q, copy.deepcopy(q), device
        self.model = q  # what the checkpoint's "model" is and the actors get
        self.opt = Adam(q.parameters(), lr=self.t.learning_rate, eps=self.t.adam_eps)
        self.replay = PrioritizedReplay(self.d.buffer_size, self.obs_shape, self.d.per_alpha, seed=seed)
        self.aug_rng = np.random.default_rng(aug_seed)

    def ingest(self, views: dict, count: int) -> None:
        self.replay.add(views["obs"][:count], views["actions"][:count], views["returns"][:count],
                        views["discounts"][:count], views["next_obs"][:count], next_legal=views["next_legal"][:count])

    def updates_allowed(self, transitions: int, episodes: int) -> float:
        """How many updates the data so far pays for: by episodes (the train_dqn() API) or by samples."""
        d = self.d
        if self.replay.size < d.learning_starts:
            return 0.0
        if d.learning_steps_per_batch is not None:
            return d.learning_steps_per_batch * episodes / d.episodes_per_batch
        return d.replay_ratio * (transitions - d.learning_starts) / d.batch_size

    def update(self, updates_done: int, progress: float) -> float:
        """One prioritized double-DQN step; `progress` in [0, 1] anneals beta (and the lr). Returns the loss.
        A step whose loss or gradient is not finite is skipped (the weights and the priorities stay as they
        were), as sync PPO's; guards.max_nonfinite_skips of them in a row raise NonFiniteError."""
        d, t = self.d, self.t
        beta = d.per_beta + (1.0 - d.per_beta) * min(1.0, progress)
        if t.anneal_lr:  # linearly to 0 over the run's budget (the last updates settle the policy)
            for group in self.opt.param_groups:
                group["lr"] = t.learning_rate * max(1.0 - progress, 0.02)
        idx, batch, w = self.replay.sample(d.batch_size, beta)
        if d.mirror_augment:
            mirror_half(batch, self.aug_rng, self.num_actions)
        b = {k: torch.from_numpy(v).to(self.device) for k, v in batch.items()}
        with autocast(self.device, t.precision):
            q_all = self.q(b["obs"])
            with torch.no_grad():
                q_next_target = self.target(b["next_obs"])
                q_next_online = self.q(b["next_obs"]) if d.double else q_next_target
        next_legal = bits_to_mask(b["next_legal"], self.num_actions) if self.masked else None
        loss, td = double_dqn_loss(q_all.float(), q_next_online.float(), q_next_target.float(), b["actions"],
                                   b["returns"], b["discounts"], torch.from_numpy(w).to(self.device), next_legal)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.q.parameters(), t.max_grad_norm)  # not finite if a gradient is not
        if bool(torch.isfinite(torch.stack([loss.detach(), norm.to(loss.device)])).all()):
            self.nonfinite_streak = 0
            self.opt.step()
            self.replay.update_priorities(idx, td.cpu().numpy())
        else:
            self.skip_nonfinite(float(loss.detach()))
        if (updates_done + 1) % d.target_update_period == 0:
            self.target.load_state_dict(self.q.state_dict())
        return float(loss.detach())

    def skip_nonfinite(self, loss: float) -> None:
        """Count a skipped step; end the agent after guards.max_nonfinite_skips of them in a row."""
        self.skipped += 1
        self.nonfinite_streak += 1
        if self.nonfinite_streak >= self.max_nonfinite:
            raise NonFiniteError(nonfinite_message("the TD loss", self.nonfinite_streak, self.max_nonfinite,
                                                   self.t.learning_rate, loss))

    # ------------------------------------------------ what the learner logs and reports
    def log(self, writer, x: int, loss: float) -> None:
        writer.add_scalar("learner/replay_size", self.replay.size, x)
        writer.add_scalar("losses/td_loss", loss, x)

    def console(self) -> str:
        return f"replay {self.replay.size:,}"

    def summary(self, updates: int, transitions: int) -> dict:
        return {"replay_size": self.replay.size, "replay_ratio": updates * self.d.batch_size / max(transitions, 1),
                "epsilons": self.epsilons.tolist(), "nonfinite_skips": self.skipped}

    def closing_note(self, s: dict) -> str:
        return f"replay ratio {s['replay_ratio']:.2f}"

    def state_dict(self) -> dict:
        return {"target": self.target.state_dict(), "optimizer": self.opt.state_dict(),
                "replay_rng": self.replay.rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                "replay_file": REPLAY_FILE if self.d.save_replay else None}

    def load_state_dict(self, st: dict, ckpt_dir, updates: int) -> str:
        """Restore from a checkpoint (already checked by ckpt_schema); returns a note for the start-up line."""
        self.target.load_state_dict(st["target"])
        self.opt.load_state_dict(st["optimizer"])
        self.replay.rng.bit_generator.state = st["replay_rng"]
        torch.set_rng_state(st["torch_rng"])
        if not st.get("replay_file"):
            return ""
        why = self.replay.load(ckpt_dir / st["replay_file"], updates)
        return (f"; restored replay of {self.replay.size:,} transitions" if why is None else
                f"; warning: replay file not used ({why}), the buffer refills from empty")

    def save_side_files(self, ckpt_dir, updates: int, write) -> None:
        """Files a checkpoint names, written before it (write = atomic_write_with)."""
        if self.d.save_replay:
            write(ckpt_dir / REPLAY_FILE, lambda f: self.replay.save(f, updates))


class ApeXActing:
    """One actor's half of Ape-X: epsilon-greedy actions and n-step transitions packed for a chunk."""

    def __init__(self, algo: ApeX, eps: float, net: torch.nn.Module, num_envs: int, rng: np.random.Generator):
        self.algo, self.eps, self.net, self.rng, self.num_envs = algo, eps, net, rng, num_envs
        self.acc = NStepAccumulator(algo.d.n_step, algo.t.gamma, num_envs, algo.obs_shape)

    def set_version(self, version: int) -> None:
        """Transitions do not carry the weights version (the chunk header does)."""

    def can_stop(self) -> bool:
        return True  # any step: a stop loses at most the n-1 steps of unfinished n-step transitions

    @torch.inference_mode()
    def act(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        with autocast(torch.device("cpu"), self.algo.t.precision):
            q_values = self.net(torch.from_numpy(obs)).float()
        if mask is None:
            greedy = q_values.argmax(1).numpy()
            randoms = self.rng.integers(self.algo.num_actions, size=self.num_envs)
        else:  # only legal actions, greedy or random
            greedy = q_values.masked_fill(~torch.from_numpy(mask), float("-inf")).argmax(1).numpy()
            randoms = (self.rng.random(mask.shape) + mask).argmax(1)
        return np.where(self.rng.random(self.num_envs) < self.eps, randoms, greedy)

    def transitions(self, obs, actions, rew, first, next_obs, next_mask) -> dict | None:
        """The n-step transitions this step completes, as chunk fields (None while warming up)."""
        out = self.acc.push(obs, actions, rew, first, next_obs)
        if out is None:
            return None
        o, a, r, disc, nxt = out
        legal = mask_bits(next_mask) if next_mask is not None else np.full(len(a), -1, dtype=np.int64)
        return {"obs": o, "actions": a, "returns": r, "discounts": disc, "next_obs": nxt, "next_legal": legal}
