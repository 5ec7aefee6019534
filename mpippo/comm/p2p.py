"""Actor <-> learner messages of the DQN layout: fixed-layout numpy buffers, Isend/Irecv, no pickle.

Actor -> learner, tag CHUNK: one contiguous byte buffer per chunk of transitions (layout
below). Flow control by credits: an actor has at most `max_inflight` chunks not yet
acknowledged; the learner acknowledges (tag ACK) a chunk when its replay-ratio budget lets
it take more data, so fast actors wait for a slow learner instead of flooding it.
Actor -> learner, tag STOP: [transitions sent, env steps, checksum, chunks, reason] after the
last chunk; reason is nonzero when a signal made the actor stop early (the learner then stops
the other actors too).
Learner -> actor, tag WEIGHTS: [version, table, flat parameters] (float64 version and table
slots + float32 params in one buffer), sent without blocking; an actor picks it up when it has
arrived. The table (self-play: the opponent sampling table) is empty otherwise.
Learner -> actor, tag SNAPSHOT: [member id, flat parameters] of a new opponent-pool member
(self-play), sent once to every actor without blocking; every one is received, in order.
Learner -> actor, tag STOPREQ: stop stepping early (an episode budget was reached).
Learner -> actor, tag DONE: everything of this actor was received; the actor may exit.

MPI keeps messages of one sender in order only per matching receive, so the learner does not
rely on STOP arriving last: it keeps draining an actor's chunks until it has as many as the
STOP message announced.
"""
from __future__ import annotations

import time
import zlib

import numpy as np

from mpippo.comm.world import MPI

CHUNK, ACK, STOP, WEIGHTS, DONE, STOPREQ, SNAPSHOT = 101, 102, 103, 104, 105, 106, 107


class ChunkLayout:
    """Byte offsets of one chunk: header + C transitions (obs, next_obs, actions, returns, discounts,
    priorities, next_legal: the legal actions of next_obs as a bitmask, -1 = all) + `results_rows`
    rows of game results (self-play: opponent id, wins, draws, losses; all-zero rows are empty)."""

    HEADER = 8  # int64: count, actor, seq, then slots the runner may use (runners/dqn.py)

    def __init__(self, chunk_size: int, obs_shape, results_rows: int = 0):
        self.chunk_size, self.obs_shape = chunk_size, tuple(obs_shape)
        C = chunk_size
        fields = [("header", np.int64, (self.HEADER,)), ("results", np.int64, (results_rows, 4)),
                  ("actions", np.int64, (C,)),
                  ("returns", np.float32, (C,)), ("discounts", np.float32, (C,)), ("priorities", np.float32, (C,)),
                  ("next_legal", np.int64, (C,)),
                  ("obs", np.uint8, (C,) + self.obs_shape), ("next_obs", np.uint8, (C,) + self.obs_shape)]
        self.fields, offset = [], 0
        for name, dtype, shape in fields:
            offset = (offset + 7) // 8 * 8  # 8-byte alignment for every field
            self.fields.append((name, dtype, shape, offset))
            offset += int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.nbytes = (offset + 7) // 8 * 8

    def new_buffer(self) -> np.ndarray:
        return np.zeros(self.nbytes, dtype=np.uint8)

    def views(self, raw: np.ndarray) -> dict:
        out = {}
        for name, dtype, shape, offset in self.fields:
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            out[name] = raw[offset:offset + n].view(dtype).reshape(shape)
        return out


def chunk_checksum(views: dict, count: int) -> int:
    """CRC of the payload of the first `count` transitions (to prove nothing was lost or mangled)."""
    crc = 0
    for name in ("actions", "returns", "discounts", "next_legal", "obs", "next_obs"):
        crc = zlib.crc32(np.ascontiguousarray(views[name][:count]).tobytes(), crc)
    return crc


def combine(total: int, crc: int) -> int:
    """Order-independent sum of chunk CRCs: chunks that complete together are handled in buffer order."""
    return (total + crc) % (1 << 62)


class ActorChannel:
    """Actor side: send chunks with credits, receive weights, finish with STOP/DONE."""

    def __init__(self, comm, learner: int, layout: ChunkLayout, n_params: int, max_inflight: int = 4,
                 table_size: int = 0, snapshots: bool = False):
        self.comm, self.learner, self.layout, self.max_inflight = comm, learner, layout, max_inflight
        self.table_size = table_size
        self.buffers = [layout.new_buffer() for _ in range(max_inflight)]
        self.send_reqs: list = [None] * max_inflight
        self.next_slot = 0
        self.inflight = 0
        self.ack = np.zeros(1, dtype=np.int64)
        self.ack_req = comm.Irecv(self.ack, source=learner, tag=ACK)
        # [version and table as float64 (2 float32 each), params]
        self.weights = np.zeros(2 + 2 * table_size + n_params, dtype=np.float32)
        self.weights_req = comm.Irecv(self.weights, source=learner, tag=WEIGHTS)
        self.snapshot = np.zeros(2 + n_params, dtype=np.float32) if snapshots else None
        self.snapshot_req = comm.Irecv(self.snapshot, source=learner, tag=SNAPSHOT) if snapshots else None
        self.sent = self.seq = 0
        self.checksum = 0
        self.stopreq = np.zeros(1, dtype=np.int64)
        self.stopreq_req = comm.Irecv(self.stopreq, source=learner, tag=STOPREQ)
        self._stop_requested = False

    def stop_requested(self) -> bool:
        """True once the learner asked this actor to stop early (checked without blocking)."""
        if not self._stop_requested and self.stopreq_req.Test():
            self._stop_requested = True
        return self._stop_requested

    def _drain_acks(self, block: bool) -> None:
        while True:
            if block:  # Test and nap instead of Wait: MPI's Wait spins, taking a core from the learner
                while not self.ack_req.Test():                # wherever actors and learner share cores
                    time.sleep(0.0005)
            elif not self.ack_req.Test():
                return
            self.inflight -= int(self.ack[0])
            self.ack_req = self.comm.Irecv(self.ack, source=self.learner, tag=ACK)
            block = False

    def chunk(self) -> dict:
        """Views of a free chunk buffer to fill; blocks while max_inflight chunks await credit."""
        self._drain_acks(block=False)
        while self.inflight >= self.max_inflight:
            self._drain_acks(block=True)
        slot = self.next_slot
        if self.send_reqs[slot] is not None:
            self.send_reqs[slot].Wait()  # acknowledged, so long delivered; returns at once
        return self.layout.views(self.buffers[slot])

    def send(self, count: int, actor_id: int) -> None:
        slot = self.next_slot
        views = self.layout.views(self.buffers[slot])
        views["header"][:3] = (count, actor_id, self.seq)
        self.checksum = combine(self.checksum, chunk_checksum(views, count))
        self.send_reqs[slot] = self.comm.Isend(self.buffers[slot], dest=self.learner, tag=CHUNK)
        self.next_slot = (slot + 1) % self.max_inflight
        self.inflight += 1
        self.sent += count
        self.seq += 1

    def poll_weights(self):
        """(version, flat params, table) of the newest weights that arrived since the last call, or None."""
        latest = None
        head = 2 + 2 * self.table_size
        while self.weights_req.Test():
            meta = self.weights[:head].view(np.float64)
            latest = (int(meta[0]), self.weights[head:].copy(), meta[1:].copy())
            self.weights_req = self.comm.Irecv(self.weights, source=self.learner, tag=WEIGHTS)
        return latest

    def poll_snapshots(self) -> list:
        """[(member id, flat params)] of the pool snapshots that arrived since the last call, in order."""
        out = []
        while self.snapshot_req is not None and self.snapshot_req.Test():
            out.append((int(self.snapshot[:2].view(np.float64)[0]), self.snapshot[2:].copy()))
            self.snapshot_req = self.comm.Irecv(self.snapshot, source=self.learner, tag=SNAPSHOT)
        return out

    def finish(self, env_steps: int, reason: int = 0) -> None:
        """Announce the totals, then keep taking acks, weights and snapshots until the learner says DONE."""
        stop = np.array([self.sent, env_steps, self.checksum, self.seq, reason], dtype=np.int64)
        self.comm.Send(stop, dest=self.learner, tag=STOP)
        done = np.zeros(1, dtype=np.int64)
        done_req = self.comm.Irecv(done, source=self.learner, tag=DONE)
        while not done_req.Test():
            self._drain_acks(block=False)
            self.poll_weights()
            self.poll_snapshots()
        spare = [self.ack_req, self.weights_req] + ([self.snapshot_req] if self.snapshot_req is not None else [])
        for req in spare + ([] if self._stop_requested else [self.stopreq_req]):
            req.Cancel()
            req.Wait()
        for req in self.send_reqs:
            if req is not None:
                req.Wait()


class LearnerChannel:
    """Learner side: one posted Irecv per actor buffer; never blocks on one actor."""

    def __init__(self, comm, actors: list[int], layout: ChunkLayout, n_params: int, max_inflight: int = 4,
                 table_size: int = 0):
        self.comm, self.actors, self.layout = comm, actors, layout
        self.table_size = table_size
        self.buffers = {a: [layout.new_buffer() for _ in range(max_inflight)] for a in actors}
        self.reqs, self.owners = [], []
        for a in actors:
            for buf in self.buffers[a]:
                self.reqs.append(comm.Irecv(buf, source=a, tag=CHUNK))
                self.owners.append((a, buf))
        self.stop_bufs = {a: np.zeros(5, dtype=np.int64) for a in actors}
        self.stop_reqs = {a: comm.Irecv(self.stop_bufs[a], source=a, tag=STOP) for a in actors}
        self.received = {a: 0 for a in actors}
        self.checksums = {a: 0 for a in actors}
        self.chunks = {a: 0 for a in actors}
        self.stopped: dict[int, np.ndarray] = {}
        self.unacked = {a: 0 for a in actors}
        self.pending_sends: list = []
        self.weights = np.zeros(2 + 2 * table_size + n_params, dtype=np.float32)
        self.weight_reqs: list = []
        self.snapshot_sends: list = []  # (requests, buffer) of pool snapshots still in flight

    def poll(self) -> list[tuple[int, int, dict, int]]:
        """Chunks that have arrived: [(slot, actor, views, count)]; call release(slot) once copied out."""
        out = []
        idx = MPI.Request.Testsome(self.reqs)
        for i in idx or []:
            actor, buf = self.owners[i]
            views = self.layout.views(buf)
            count = int(views["header"][0])
            self.received[actor] += count
            self.chunks[actor] += 1
            self.checksums[actor] = combine(self.checksums[actor], chunk_checksum(views, count))
            out.append((i, actor, views, count))
        for a, req in self.stop_reqs.items():
            if a not in self.stopped and req.Test():
                self.stopped[a] = self.stop_bufs[a]
        return out

    def release(self, i: int) -> None:
        """The chunk in slot i was copied out: post the receive again and owe its actor a credit."""
        actor, buf = self.owners[i]
        self.reqs[i] = self.comm.Irecv(buf, source=actor, tag=CHUNK)
        self.unacked[actor] += 1

    def grant(self, actor: int | None = None) -> None:
        """Acknowledge the chunks taken so far (all actors, or one), letting actors send more."""
        for a in ([actor] if actor is not None else self.actors):
            if self.unacked[a]:
                msg = np.array([self.unacked[a]], dtype=np.int64)
                self.pending_sends.append((self.comm.Isend(msg, dest=a, tag=ACK), msg))
                self.unacked[a] = 0
        self.pending_sends = [(r, m) for r, m in self.pending_sends if not r.Test()]

    def send_weights(self, version: int, flat_params: np.ndarray, table: np.ndarray | None = None) -> bool:
        """Start sending weights (and the table) to every actor unless the previous round is still in flight."""
        if self.weight_reqs and not MPI.Request.Testall(self.weight_reqs):
            return False
        head = 2 + 2 * self.table_size
        meta = self.weights[:head].view(np.float64)
        meta[0] = version
        if self.table_size:
            meta[1:] = table
        self.weights[head:] = flat_params
        self.weight_reqs = [self.comm.Isend(self.weights, dest=a, tag=WEIGHTS) for a in self.actors]
        return True

    def send_snapshot(self, member_id: int, flat_params: np.ndarray) -> None:
        """Ship a new pool member to every actor; its own buffer lives until every send completed."""
        buf = np.empty(2 + len(flat_params), dtype=np.float32)
        buf[:2].view(np.float64)[0] = member_id
        buf[2:] = flat_params
        self.snapshot_sends = [(r, b) for r, b in self.snapshot_sends if not MPI.Request.Testall(r)]
        self.snapshot_sends.append(([self.comm.Isend(buf, dest=a, tag=SNAPSHOT) for a in self.actors], buf))

    def request_stop(self) -> None:
        """Ask every actor to stop stepping; they then send their last chunk and STOP as usual."""
        msg = np.zeros(1, dtype=np.int64)
        MPI.Request.Waitall([self.comm.Isend(msg, dest=a, tag=STOPREQ) for a in self.actors])

    def stop_reason(self) -> int:
        """The largest reason code in the STOP messages so far (0: none stopped early)."""
        return max((int(b[4]) for b in self.stopped.values()), default=0)

    def all_done(self) -> bool:
        """Every actor sent STOP and every transition it announced has arrived."""
        return len(self.stopped) == len(self.actors) and all(
            self.received[a] == int(self.stopped[a][0]) for a in self.actors)

    def finish(self) -> None:
        """Credit everything, let the weight sends complete, tell actors DONE, cancel spare receives."""
        self.grant()
        MPI.Request.Waitall([r for r, _ in self.pending_sends])
        MPI.Request.Waitall(self.weight_reqs)
        for reqs, _ in self.snapshot_sends:
            MPI.Request.Waitall(reqs)
        done = np.zeros(1, dtype=np.int64)
        MPI.Request.Waitall([self.comm.Isend(done, dest=a, tag=DONE) for a in self.actors])
        for req in self.reqs:
            req.Cancel()
        MPI.Request.Waitall(self.reqs)
