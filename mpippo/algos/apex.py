"""Ape-X DQN as an algorithm of the actor-learner layout (mpippo/layout): pure torch/numpy.

The layout moves chunks, credits and weights and owns budgets, signals, checkpoints and logs;
this object says what an actor does with an observation and what the learner does with a
chunk. Actor side: epsilon-greedy over the Q-network (Ape-X epsilon ladder), n-step transitions
(`chunk_fields` names what one transition carries). Learner side: prioritized replay, the
double-DQN loss with importance weights, the target network, and how many updates the data
received so far allows (the replay ratio, or updates per finished episodes).

The learner's update runs from the device's memory and never waits for it: the replay lives on
the learner's GPU when it fits (frames as uint8) and is sampled there, the online network sees obs
and next_obs in one batch (on a GPU), the step with a non-finite loss or gradient is skipped by
the device itself (DeviceAdam, NonFiniteGuard: the host reads the guard's counters every
`guard_every` updates), and the losses are summed on the device and read when the learner logs.
On a CPU the code is the same; the guard is read after every update there (a read costs nothing).
"""
from __future__ import annotations

import contextlib
import copy
import os
import re

import numpy as np
import torch

from mpippo import ckpt_schema as schema
from mpippo import models
from mpippo.algos.adam import Adam
from mpippo.algos.learner_parts import DeviceAdam, NonFiniteGuard, flat_parameters, nonfinite_message
from mpippo.algos.dqn import (NStepAccumulator, PrioritizedReplay, apex_epsilons, double_dqn_loss, mirror_half_device,
                              replay_device)
from mpippo.algos.policy_gradient import autocast
from mpippo.envs import bits_to_mask, mask_bits, mask_words, obs_dtype
from mpippo.errors import NonFiniteError
from mpippo.metrics import tags
from mpippo.selfplay import LearnerHook

REPLAY_FILE = "replay.npz"  # the one name of checkpoints written before each had its own (still read)
REPLAY_NAMED = re.compile(r"replay_(\d{10,})\.npz")  # replay_<updates>.npz: the checkpoint of that update names it


def chunk_fields(obs_shape, legal_words: int = 1) -> list[tuple[str, type, tuple]]:
    """What one transition carries in a chunk: (name, dtype, shape of one item); next_legal: the next
    state's legal actions as mask_bits' words (one for up to 64 actions)."""
    obs_shape, dtype = tuple(obs_shape), np.dtype(obs_dtype(obs_shape))
    return [("actions", np.int64, ()), ("returns", np.float32, ()), ("discounts", np.float32, ()),
            ("next_legal", np.int64, (legal_words,)), ("obs", dtype, obs_shape), ("next_obs", dtype, obs_shape)]


class ApeX:
    name = "dqn"
    steps_per_item = 1  # a chunk item is one (n-step) transition
    log_every_updates = 0  # updates are many and small: the learner logs by time only

    def __init__(self, cfg, obs_shape, num_actions: int, num_actors: int, masked: bool = False):
        self.cfg, self.d, self.t = cfg, cfg.dqn, cfg.training
        self.obs_shape, self.num_actions, self.masked = tuple(obs_shape), num_actions, masked
        # the ladder runs over every env of every actor: the paper's actors each stepped one env, and a
        # ladder over ranks would leave a 2-rank job (one actor) exploring at 0.4 in all its envs
        self.envs_per_actor = max(int(cfg.env.num_envs_per_rank or 1), 1)
        self.epsilons = apex_epsilons(num_actors * self.envs_per_actor, self.d.eps, self.d.eps_alpha)
        self.samples_per_update = self.d.batch_size
        self.max_nonfinite = cfg.guards.max_nonfinite_skips
        self.guard = None  # (setup_learner) updates skipped for a non-finite loss or gradient, on the device
        self.guard_seen = (0, 0, False)  # the guard's counters as last read: (streak, skipped, tripped)

    @property
    def skipped(self) -> int:
        """Updates skipped so far for a non-finite loss or gradient (reads the device)."""
        return self.read_guard()[1]

    @property
    def nonfinite_streak(self) -> int:
        """Of them, the ones in a row up to the last update (reads the device)."""
        return self.read_guard()[0]

    def read_guard(self) -> tuple[int, int, bool]:
        if self.guard is not None:
            self.guard_seen = self.guard.read()
        return self.guard_seen

    # ------------------------------------------------- what the layout asks of an algorithm
    def new_net(self) -> torch.nn.Module:
        return models.build("q", self.obs_shape, self.num_actions, self.cfg.model, dueling=self.d.dueling)

    def fields(self) -> list[tuple[str, type, tuple]]:
        return chunk_fields(self.obs_shape, self.legal_words())

    def legal_words(self) -> int:
        """The int64 words a transition's next legal moves take: mask_words of a game's moves; one where
        there is no mask (all legal, never read)."""
        return mask_words(self.num_actions) if self.masked else 1

    def episode_capacity(self, chunk_size: int, num_envs: int) -> int:
        """Episodes one chunk's header can carry: a chunk is sent at least every chunk_size / num_envs steps."""
        return max(chunk_size, num_envs)

    def actor_steps(self, budget: int, num_actors: int, index: int, num_envs: int) -> int:
        """Actor `index`'s share of the agent's remaining env-step budget, in steps of its envs."""
        return budget // num_actors // num_envs

    def describe(self) -> str:
        where = f" on {self.replay.device}" if hasattr(self, "replay") else ""
        return (f"replay {self.d.buffer_size:,} transitions = {self.learner_bytes() / 2**30:.2f} GiB{where}, epsilons "
                f"{self.epsilons[0]:.4f} to {self.epsilons[-1]:.4f} over {len(self.epsilons)} env(s)")

    # ---------------------------------------------------------------- actor side
    def actor(self, index: int, net: torch.nn.Module, num_envs: int, rng: np.random.Generator) -> "ApeXActing":
        rungs = self.epsilons.reshape(-1, self.envs_per_actor)[index]  # one per env (every actor has envs_per_actor)
        return ApeXActing(self, rungs, net, num_envs, rng)

    # -------------------------------------------------------------- learner side
    def learner_bytes(self) -> int:
        """What the learner holds beyond the network: the replay buffer."""
        return PrioritizedReplay.nbytes(self.d.buffer_size, self.obs_shape, self.legal_words())

    def learner_bytes_key(self) -> str:
        """The setting that sizes learner_bytes, for a refusal."""
        return f"dqn.buffer_size: {self.d.buffer_size} transitions"

    def setup_learner(self, q: torch.nn.Module, device, seed: int, aug_seed: int) -> None:
        """The learner's half on `device`: the replay there when it fits (else on the host, each batch
        copied from pinned memory), the network's parameters, gradients and Adam moments in flat buffers
        (DeviceAdam), the guard."""
        device = torch.device(device)
        flat_parameters(q)  # (the runner's q already is: its flat buffer is what the actors get)
        self.q, self.target, self.device = q, copy.deepcopy(q), device
        self.model = q  # what the checkpoint's "model" is and the actors get
        # the state's holder: DeviceAdam takes the steps (its own kernels), not this one
        self.opt = Adam(q.parameters(), lr=self.t.learning_rate, eps=self.t.adam_eps, fused=False)
        self.adam = DeviceAdam(q.parameters(), self.opt)
        where = replay_device(device, self.learner_bytes())
        self.replay = PrioritizedReplay(self.d.buffer_size, self.obs_shape, self.d.per_alpha, seed=seed, device=where,
                                        legal_words=self.legal_words())
        self.aug_rng = np.random.default_rng(aug_seed)
        self.guard = NonFiniteGuard(self.max_nonfinite, device)
        # the online network on obs and next_obs in one batch: one pass of kernel launches instead of two on a
        # GPU; on a CPU two passes, as the backward then runs over half the rows (the next_obs half needs none)
        self.joint_forward = device.type == "cuda"
        # how often the host reads the guard: a read waits for the GPU to finish what was queued
        self.guard_every = 32 if device.type == "cuda" else 1
        self.loss_stats = torch.zeros(2, dtype=torch.float64, device=device)  # since the last log: sum, count

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

    def td_loss(self, batch: dict, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The double-DQN loss of a sampled batch and its |TD errors|: the online network once on
        batch["frames"] (obs and next_obs) with `joint_forward`, else on each half; the target on next_obs."""
        d, t, B = self.d, self.t, weights.shape[0]
        with autocast(self.device, t.precision):
            if self.joint_forward and d.double:
                q_cat = self.q(batch["frames"])
                q_all, q_next_online = q_cat[:B], q_cat[B:].detach()
            else:
                q_all = self.q(batch["obs"])
            with torch.no_grad():
                q_next_target = self.target(batch["next_obs"])
                if not (self.joint_forward and d.double):
                    q_next_online = self.q(batch["next_obs"]) if d.double else q_next_target
        next_legal = bits_to_mask(batch["next_legal"], self.num_actions) if self.masked else None
        return double_dqn_loss(q_all.float(), q_next_online.float(), q_next_target.float(), batch["actions"],
                               batch["returns"], batch["discounts"], weights, next_legal)

    def update(self, updates_done: int, progress: float) -> torch.Tensor:
        """One prioritized double-DQN step; `progress` in [0, 1] anneals beta (and the lr). Returns the loss as
        a 0-d tensor on the learner's device (float() reads it; the update itself reads nothing).
        A step whose loss or gradient is not finite is skipped (the weights, Adam's state and the
        priorities stay as they were), as sync PPO's, decided on the device; guards.max_nonfinite_skips of
        them in a row raise NonFiniteError, at the first read of the guard after (every guard_every updates, and
        every update once the budget is spent; once tripped, no later step is taken, so nothing moves in between)."""
        d, t = self.d, self.t
        beta = d.per_beta + (1.0 - d.per_beta) * min(1.0, progress)
        if t.anneal_lr:  # linearly to 0 over the run's budget (the last updates settle the policy)
            for group in self.opt.param_groups:
                group["lr"] = t.learning_rate * max(1.0 - progress, 0.02)
        idx, batch, w = self.replay.sample(d.batch_size, beta, device=self.device)
        if d.mirror_augment:  # the rows to mirror drawn on the host as before, the mirroring on the device
            flip = torch.from_numpy(self.aug_rng.random(d.batch_size) < 0.5).to(self.device, non_blocking=True)
            mirror_half_device(batch, flip, self.num_actions)
        loss, td = self.td_loss(batch, w)
        self.adam.zero_grad()
        loss.backward()
        loss = loss.detach()
        norm = self.adam.clip_(t.max_grad_norm)  # not finite if a gradient is not
        ok = self.guard.admit(torch.isfinite(loss) & torch.isfinite(norm))
        self.adam.step(ok)
        self.replay.update_priorities(idx, td, ok)
        self.loss_stats += torch.stack([torch.where(ok, loss.double(), 0.0), ok.double()])
        if (updates_done + 1) % self.guard_every == 0 or progress >= 1.0:  # (and every one of a run's last)
            streak, _, tripped = self.read_guard()
            if tripped:
                raise NonFiniteError(nonfinite_message("the TD loss", streak, self.max_nonfinite,
                                                       self.t.learning_rate, float(loss)))
        if (updates_done + 1) % d.target_update_period == 0:
            self.target.load_state_dict(self.q.state_dict())
        return loss

    # ------------------------------------------------ what the learner logs and reports
    def log(self, writer, x: int, loss) -> None:
        """TensorBoard: the replay's size and the mean TD loss of the steps taken since the last log (the
        last loss when none was)."""
        writer.add_scalar(tags.learner("replay_size"), self.replay.size, x)
        total, n = self.loss_stats.tolist()
        self.loss_stats.zero_()
        writer.add_scalar(tags.loss("td_loss"), total / n if n else float(loss), x)

    def console(self) -> str:
        return f"replay {self.replay.size:,}"

    def summary(self, updates: int, transitions: int) -> dict:
        return {"replay_size": self.replay.size, "replay_ratio": updates * self.d.batch_size / max(transitions, 1),
                "epsilons": self.epsilons.tolist(), "nonfinite_skips": self.skipped}

    def closing_note(self, s: dict) -> str:
        return f"replay ratio {s['replay_ratio']:.2f}"

    def state_dict(self) -> dict:
        """The learner's state beyond the network: the target, Adam (its step count read from the device),
        the replay's RNGs (`replay_generator`: the device generator that draws the samples; `replay_rng`:
        the numpy one that seeds it) and torch's."""
        self.adam.sync()
        return {"target": self.target.state_dict(), "optimizer": self.opt.state_dict(),
                "replay_rng": self.replay.rng.bit_generator.state, "replay_generator": self.replay.generator.get_state(),
                "torch_rng": torch.get_rng_state(), "replay_file": None}  # (save_side_files names it)

    def load_state_dict(self, st: dict, ckpt_dir, updates: int) -> str:
        """Restore from a checkpoint (already checked by ckpt_schema); returns a note for the start-up line.
        A checkpoint written before the replay sampled on its device (no replay_generator), or on another
        kind of device, reseeds the sampling from its numpy state: a continuation, not the same draws."""
        self.target.load_state_dict(st["target"])
        self.opt.load_state_dict(st["optimizer"])
        self.adam.adopt()
        self.replay.rng.bit_generator.state = st["replay_rng"]
        note = ""
        try:
            if st.get("replay_generator") is None:
                raise ValueError("none saved")
            self.replay.generator.set_state(st["replay_generator"])
        except (RuntimeError, ValueError, TypeError):
            self.replay.reseed()
            if st.get("replay_generator") is not None:
                note = f"; replay sampling reseeded (its generator state is not one of {self.replay.device.type})"
        torch.set_rng_state(st["torch_rng"])
        if not st.get("replay_file"):
            return note + f"; {'no replay in the checkpoint' if self.d.save_replay else 'dqn.save_replay is off'}: " \
                          f"{self._refills()}"
        why = self.replay.load(ckpt_dir / st["replay_file"], updates, self.num_actions)
        return note + (f"; restored replay of {self.replay.size:,} transitions" if why is None else
                       f"; warning: replay file not used ({why}), {self._refills()}")

    def _refills(self) -> str:
        """A resume without its replay trains nothing until the buffer holds learning_starts again: said,
        or a short resume's 0 updates looks like a hang."""
        wait = f" (no update before dqn.learning_starts {self.d.learning_starts:,} new transitions)"
        return "the buffer refills from empty" + (wait if self.d.learning_starts > 0 else "")

    def save_side_files(self, ckpt_dir, updates: int, write) -> dict:
        """Files a checkpoint names, written before it (write = atomic_write_with); the checkpoint's keys
        naming them. Each replay has its update's name: one fixed name, replaced before the checkpoint, had
        left a replay newer than the checkpoint wherever the writer died between the two (kill -9, a full
        disk), and the resume started from an empty buffer."""
        if not self.d.save_replay:
            return {}
        name = f"replay_{updates:010d}.npz"
        write(ckpt_dir / name, lambda f: self.replay.save(f, updates))
        return {"replay_file": name}

    def prune_side_files(self, ckpt_dir, named: dict) -> None:
        """The replays no checkpoint of this run's line will be resumed from (every one but `named`'s, which
        latest.pt now names): each is as large as the buffer."""
        keep = named.get("replay_file")
        for entry in os.scandir(ckpt_dir):
            if entry.name != keep and (entry.name == REPLAY_FILE or REPLAY_NAMED.fullmatch(entry.name)) \
                    and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)

    @staticmethod
    def check_checkpoint(state: dict, cfg, net) -> None:
        """What state_dict and the learner wrote: the target network, the replay's RNGs, the replay
        file's name and, with self-play, the opponent pool (ckpt_schema's primitives)."""
        schema.check_learner(state, net)
        schema.mapping(state, "checkpoint", ("target", "replay_rng", "torch_rng"))
        schema.check_weights(state["target"], "target", net)
        schema.pcg64(state["replay_rng"], "replay_rng")
        schema.torch_generator(state["torch_rng"], "torch_rng")
        if state.get("replay_generator") is not None:  # the replay's device generator (CPU or CUDA: the learner's)
            schema.tensor(state["replay_generator"], "replay_generator", None, torch.uint8)
        named = state.get("replay_file")
        schema.need(named in (None, REPLAY_FILE) or (isinstance(named, str) and REPLAY_NAMED.fullmatch(named)),
                    "replay_file", f"expected null, '{REPLAY_FILE}' or replay_<update>.npz (a file beside the "
                    f"checkpoint), got {schema.show(named)}")
        if "selfplay" in state:
            LearnerHook.check_state(state["selfplay"], net)


class ApeXActing:
    """One actor's half of Ape-X: epsilon-greedy actions and n-step transitions packed for a chunk."""

    def __init__(self, algo: ApeX, eps: np.ndarray, net: torch.nn.Module, num_envs: int, rng: np.random.Generator):
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

    def transitions(self, obs, actions, rew, first, next_obs, next_mask, cut=None) -> dict | None:
        """The n-step transitions this step completes, as chunk fields (None while warming up); `cut`:
        the episodes a time limit ended at this step (env.truncated()), bootstrapped from their final obs."""
        out = self.acc.push(obs, actions, rew, first, next_obs, cut)
        if out is None:
            return None
        o, a, r, disc, nxt = out
        legal = (mask_bits(next_mask) if next_mask is not None
                 else np.full((len(a), self.algo.legal_words()), -1, dtype=np.int64))
        return {"obs": o, "actions": a, "returns": r, "discounts": disc, "next_obs": nxt, "next_legal": legal}
