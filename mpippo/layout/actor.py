"""The actor role: step the envs with the newest weights at hand, pack the algorithm's items into
chunks, send them with credits, and never wait for learning (only for credit)."""
from __future__ import annotations

import time

import numpy as np
import torch

from mpippo import envs
from mpippo.comm.p2p import ActorChannel
from mpippo.faults import maybe_inject
from mpippo.metrics.reporter import peak_rss_mb
from mpippo.preemption import SignalFlags
from mpippo.runctl import STOP_REASONS, urgency


def signal_reason(signals: SignalFlags) -> int:
    """A signal on this rank as a stop code (0: none)."""
    return urgency("requeue") if signals.requeue else urgency("stopped") if signals.stop else 0


class Actor:
    """One actor rank. `acting` is the algorithm's actor half (act, transitions); `hook` the
    self-play hook or None; `steps` this segment's budget in env steps per env."""

    def __init__(self, ch: ActorChannel, acting, env, flat_params: torch.Tensor, steps: int, job_rank: int,
                 index: int, hook=None):
        self.ch, self.acting, self.env, self.flat, self.hook = ch, acting, env, flat_params, hook
        self.steps, self.job_rank, self.index = steps, job_rank, index
        self.num_envs = env.num_envs
        self.version = -1
        self.views, self.filled = None, 0
        self.episode_returns: list[float] = []  # finished since the last chunk, not sent yet
        self.episode_lengths: list[int] = []

    # ---- weights in ----
    def receive(self) -> None:
        """Take new weights (and, with self-play, snapshots and the opponent table) if any arrived."""
        snapshots = self.ch.poll_snapshots() if self.hook is not None else []
        w = self.ch.poll_weights()
        if self.hook is not None:
            self.hook.receive(snapshots, None if w is None else w[2])
        if w is not None:
            self.flat.copy_(torch.from_numpy(w[1]))
            self.version = w[0]
            self.acting.set_version(w[0])  # APPO's segments carry the version they were collected under

    def wait_for_weights(self) -> None:
        """Start with the learner's weights (and a first pool member), never with our own init."""
        while self.version < 0 or (self.hook is not None and not self.hook.ready()):
            self.receive()
            self.ch.check()
            time.sleep(0.001)

    # ---- the loop ----
    def run(self, signals: SignalFlags) -> dict:
        self.wait_for_weights()
        masked = hasattr(self.env, "action_mask")  # legal actions only (two-player games)
        truncates = hasattr(self.env, "truncated")  # episodes a time limit cuts are bootstrapped (gym)
        _, obs, _ = self.env.observe()
        mask = self.env.action_mask() if masked else None
        ep_ret, ep_len = np.zeros(self.num_envs), np.zeros(self.num_envs, dtype=np.int64)
        t0, steps_done, reason = time.perf_counter(), 0, 0
        for step in range(self.steps):
            if step % 256 == 0:  # an env's library may set its own handlers late: in a step, not its constructor
                signals.reclaim()
            reason = signal_reason(signals)
            if (reason or self.ch.stop_requested()) and self.acting.can_stop():
                break
            self.ch.check()
            steps_done = step + 1
            maybe_inject(self.job_rank, steps_done)  # tests only: MPIPPO_FAULT, counted in actor steps
            self.receive()
            actions = self.acting.act(obs, mask)
            self.env.act(actions)
            rew, next_obs, first = self.env.observe()
            next_mask = self.env.action_mask() if masked else None
            ep_ret += rew
            ep_len += 1
            if first.any():
                _, done_ret, done_len = envs.ended_episodes(self.env, first, ep_ret, ep_len)
                self.episode_returns += done_ret.tolist()
                self.episode_lengths += done_len.tolist()
                ep_ret[first], ep_len[first] = 0.0, 0
            items = self.acting.transitions(obs, actions, rew, first, next_obs, next_mask,
                                            cut=self.env.truncated() if truncates else None)
            obs, mask = next_obs, next_mask
            if items is not None:
                self.pack(items, steps_done)
        self.flush(steps_done)
        self.ch.finish(env_steps=steps_done * self.num_envs, reason=reason, peak_rss_kib=int(peak_rss_mb() * 1024))
        self.env.close()
        return {"role": "actor", "sent": self.ch.sent, "eps": self.acting.eps, "stop_reason": STOP_REASONS[reason],
                "steps_per_s": steps_done * self.num_envs / (time.perf_counter() - t0),
                **(self.hook.summary() if self.hook is not None else {})}

    # ---- items out ----
    def pack(self, items: dict, steps_done: int) -> None:
        """Copy a step's items into chunks (they may straddle two); send each chunk when full."""
        n, i = len(items["actions"]), 0
        cap = self.ch.layout.chunk_size
        while i < n:
            if self.views is None:
                self.views, self.filled = self.ch.chunk(), 0
            k = min(n - i, cap - self.filled)
            for name in self.ch.layout.item_names:
                self.views[name][self.filled:self.filled + k] = items[name][i:i + k]
            self.filled += k
            i += k
            if self.filled == cap:
                self.send(steps_done)

    def send(self, steps_done: int) -> None:
        """Stamp the header (weights version, finished episodes, env steps) and send the chunk."""
        if self.views is None:  # a chunk of episode statistics or game results only
            self.views, self.filled = self.ch.chunk(), 0
        views, room = self.views, self.ch.layout.episode_capacity
        returns, self.episode_returns = self.episode_returns[:room], self.episode_returns[room:]
        lengths, self.episode_lengths = self.episode_lengths[:room], self.episode_lengths[room:]
        views["episode_returns"][:len(returns)] = returns
        h = views["header"]
        h["version"], h["episodes"], h["length_sum"] = self.version, len(returns), sum(lengths)
        h["env_steps"] = steps_done * self.num_envs
        if self.hook is not None:
            self.hook.stamp(views["results"])
        self.ch.send(self.filled, self.index)
        self.views, self.filled = None, 0

    def flush(self, steps_done: int) -> None:
        """The last partial chunk, then chunks until every finished episode and game result is sent."""
        while self.views is not None or self.episode_returns or (self.hook is not None and self.hook.pending()):
            self.send(steps_done)
