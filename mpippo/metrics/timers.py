"""Per-phase wall-clock accounting for one rank, and the per-iteration straggler bookkeeping.

Each rank's PhaseTimer keeps cumulative seconds per phase and, at `end_iteration()`, the deltas
of the iteration just ended in a small fixed ring. `summary()` flattens the ring into a
fixed-length float vector that rides the report's existing Gather (no collective of its own),
and rank 0's StragglerStats turns the gathered rings into distributions over ranks and
iterations (`benchmark_metrics.json`: the `straggler_*` keys, mpippo/metrics/keys.py).

What an iteration's time is split into, per rank:
  rollout     env_step + inference: no collective inside, so it is this rank's own pace;
  update      backward + optimizer: the same, for the minibatch loop;
  collective  gae + allreduce: the phases that hold collectives. Each rank's time there is
              transfer plus waiting for the ranks that arrive later. gae holds the first
              collective after the rollout (the reward normalizer's or the advantages'
              moments), so a rank with a fast rollout waits there, not in allreduce; its own
              compute (one value forward, the GAE scan) is small and is counted here too;
  wall        every phase, `other` included (the whole iteration).
Wait versus transfer, without a barrier of our own: in each collective the rank that arrives
last waits (nearly) nothing, so per iteration the smallest collective time over the ranks is
taken as transfer and each rank's excess over it as its wait. The last arriver changes from one
collective to the next, so the minimum of the sums is at least the true transfer: the wait is a
lower bound.

The actor-learner layout's learner has its own phases (LEARNER_PHASES, a Stopwatch): ingest (chunks
out of MPI into the algorithm's buffers), wait (nothing to train on yet: credit granted, polling),
update (the algorithm's update: sample, loss, backward, optimizer), send (weights and pool members
out), checkpoint, log, other. Its `wait` share is what Sample Factory's learner reports as waiting
for data: a learner that waits is faster than its actors, one that never waits holds them back.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np

PHASES = ("env_step", "inference", "gae", "backward", "allreduce", "optimizer", "other")
LEARNER_PHASES = ("ingest", "wait", "update", "send", "checkpoint", "log", "other")
PARTS = {"rollout": ("env_step", "inference"), "update": ("backward", "optimizer"),
         "collective": ("gae", "allreduce"), "wall": PHASES}
RING = 32  # iterations kept between two reports (log_interval <= RING: none is lost)
SUMMARY_LEN = 1 + RING * len(PARTS)  # [iterations ended so far, then the ring, oldest row first]
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}
# probabilities at which the busy-time-relative-to-the-iteration-mean distribution is written, for
# the scaling model's expected maximum over N ranks (finer in the tail, where the maximum lives)
REL_PROBS = tuple(np.round(np.concatenate([np.arange(0, 100) / 100, [0.995, 0.999, 1.0]]), 3).tolist())
_COLS = [[PHASES.index(p) for p in phases] for phases in PARTS.values()]


def split_phases(delta) -> np.ndarray:
    """Per-phase seconds (in PHASES order) -> rollout, update, collective, wall."""
    d = np.asarray(delta, dtype=np.float64)
    return np.array([d[c].sum() for c in _COLS])


class Stopwatch:
    """Cumulative seconds per phase (`with timer("update"): ...`); the rest of the wall time is 'other'."""

    def __init__(self, phases=PHASES):
        self.phases = tuple(phases)
        self.seconds = {p: 0.0 for p in self.phases}
        self.phase: str | None = None  # the phase running now and since when: what a one-rank job's
        self.since = 0.0               # hang watch reads (runctl.watch_alone)

    @contextmanager
    def __call__(self, phase: str):
        self.since = t0 = time.perf_counter()  # (since before phase: the watch reads them in that order)
        self.phase = phase
        try:
            yield
        finally:
            self.phase = None
            self.seconds[phase] += time.perf_counter() - t0

    def add_other(self, wall: float) -> None:
        """Charge the unaccounted part of `wall` (time since the last reset) to 'other'."""
        known = sum(v for k, v in self.seconds.items() if k != "other")
        self.seconds["other"] = max(wall - known, 0.0)

    def vector(self):
        return [self.seconds[p] for p in self.phases]


class PhaseTimer(Stopwatch):
    """Sync PPO's phases, and the ring of its iterations' parts (rollout, update, collective, wall)."""

    def __init__(self, ring: int = RING):
        super().__init__(PHASES)
        self.ring = np.zeros((ring, len(PARTS)))
        self.iterations = 0  # iterations ended on this timer
        self._mark = np.zeros(len(PHASES))  # cumulative seconds at the last end_iteration

    def end_iteration(self) -> None:
        """Store the iteration's phase deltas (after add_other, so that `wall` is whole). The report
        that follows lands in the next iteration's `other`."""
        now = np.array(self.vector())
        self.ring[self.iterations % len(self.ring)] = split_phases(now - self._mark)
        self._mark = now
        self.iterations += 1

    def summary(self) -> np.ndarray:
        """Fixed length (SUMMARY_LEN for the default ring): the count of iterations ended, then the
        last min(count, ring) iterations' rows, oldest first, zero-padded."""
        n, size = self.iterations, len(self.ring)
        kept = min(n, size)
        rows = np.zeros_like(self.ring)
        rows[:kept] = np.roll(self.ring, -(n % size), axis=0)[size - kept:] if kept else rows[:0]
        return np.concatenate([[float(n)], rows.ravel()])


def quantiles(x) -> dict | None:
    x = np.asarray(x, dtype=np.float64).ravel()
    return {k: float(np.quantile(x, q)) for k, q in QUANTILES.items()} if x.size else None


class StragglerStats:
    """Rank 0: the gathered PhaseTimer summaries -> per-rank per-iteration times, kept within a
    fixed budget of samples (when full, every other stored iteration is dropped and only every
    second new one is kept, so the store stays an even sample of the whole run)."""

    def __init__(self, ranks: int, max_samples: int = 1 << 18):
        self.ranks = ranks
        self.cap = max(64, max_samples // max(ranks, 1))  # iterations stored
        self.rows = np.zeros((self.cap, ranks, len(PARTS)))
        self.stored = 0
        self.seen = 0     # iterations ended on the ranks' timers that were offered to add()
        self.stride = 1   # keep every stride-th iteration
        self.lost = 0     # iterations that fell out of a ring before a report (log_interval > RING)

    def add(self, S: np.ndarray) -> None:
        """S: (ranks, SUMMARY_LEN), every rank's PhaseTimer.summary(); the ranks are in lockstep,
        so their counts agree."""
        S = np.asarray(S, dtype=np.float64)
        n = int(S[0, 0])
        rings = S[:, 1:].reshape(S.shape[0], -1, len(PARTS))
        new = max(n - self.seen, 0)
        kept = min(new, rings.shape[1], n)
        self.lost += new - kept
        for k in range(kept):
            index = n - kept + k  # iteration number on the timers, from 0
            if index % self.stride == 0:
                self._store(rings[:, min(n, rings.shape[1]) - kept + k])
        self.seen = max(self.seen, n)

    def _store(self, row: np.ndarray) -> None:
        if self.stored == self.cap:
            self.rows[: self.cap // 2] = self.rows[0:self.cap:2][: self.cap // 2]  # iterations 0, 2s, 4s, ...
            self.stored, self.stride = self.cap // 2, self.stride * 2
        self.rows[self.stored] = row
        self.stored += 1

    def metrics(self) -> dict:
        """The straggler_* keys of benchmark_metrics.json (mpippo/metrics/keys.py): null before the
        first measured iteration."""
        r = self.rows[: self.stored]
        names = ("straggler_rollout_s", "straggler_update_s", "straggler_wait_s", "straggler_transfer_s",
                 "straggler_spread", "straggler_busy_rel", "straggler_slowest_rank",
                 "straggler_slowest_counts", "straggler_busy_p50_s_per_rank")
        if not self.stored:
            return {**{k: None for k in names}, "straggler_iterations": 0, "straggler_lost": self.lost}
        rollout, update, collective = r[..., 0], r[..., 1], r[..., 2]
        busy = rollout + update  # this rank's own work in the iteration
        mean = busy.mean(1, keepdims=True)
        rel = busy / np.where(mean > 0, mean, 1.0)
        transfer = collective.min(1, keepdims=True)
        counts = np.bincount(busy.argmax(1), minlength=self.ranks)
        return {
            "straggler_rollout_s": quantiles(rollout), "straggler_update_s": quantiles(update),
            "straggler_wait_s": quantiles(collective - transfer), "straggler_transfer_s": quantiles(transfer),
            "straggler_spread": quantiles(rel.max(1)),
            "straggler_busy_rel": [float(np.quantile(rel, q)) for q in REL_PROBS],
            "straggler_slowest_rank": int(counts.argmax()), "straggler_slowest_counts": counts.tolist(),
            "straggler_busy_p50_s_per_rank": np.median(busy, 0).tolist(),
            "straggler_iterations": int(self.stored), "straggler_lost": int(self.lost),
        }
