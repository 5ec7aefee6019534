"""Actor <-> learner messages of the actor-learner layout (DQN's transitions, APPO's segments):
fixed-layout numpy buffers, Isend/Irecv, no pickle.

Actor -> learner, tag CHUNK: one contiguous byte buffer per chunk of transitions (layout
below). Flow control by credits: an actor has at most `max_inflight` chunks not yet
acknowledged; the learner acknowledges (tag ACK) a chunk when its replay-ratio budget lets
it take more data, so fast actors wait for a slow learner instead of flooding it.
Actor -> learner, tag STOP: [transitions sent, env steps, checksum, chunks, reason, peak RSS in
KiB] after the last chunk; reason is nonzero when a signal made the actor stop early (the learner
then stops the other actors too).
Learner -> actor, tag WEIGHTS: [version, table, flat parameters] (float64 version and table
slots + float32 params in one buffer), sent without blocking; an actor picks it up when it has
arrived. The table (self-play: the opponent sampling table) is empty otherwise.
Learner -> actor, tag SNAPSHOT: [member id, flat parameters] of a new opponent-pool member
(self-play), sent once to every actor without blocking; every one is received, in order.
Learner -> actor, tag STOPREQ: stop stepping early (an episode budget was reached).
Learner -> actor, tag DONE: everything of this actor was received; the actor may exit.

MPI keeps messages of one sender in order only per matching receive, so the learner does not
rely on STOP arriving last: it keeps draining an actor's chunks until it has as many as the
STOP message announced. At the end the learner compares, per actor, the CRC of everything it
received with the one the actor announced: a mismatch ends the run naming the actor.

Progress guard (guards.collective_timeout_s, 0 = off): each side knows when it last heard from
the other. The learner counts an actor as silent only while that actor holds credit (it owes
the actor nothing, so the actor should be sending); an actor counts the learner as silent when
nothing at all came from it (credit, weights, snapshots, or the keepalive: an ACK of 0 credits
the learner sends to an actor it has sent nothing for a quarter of the timeout, also while it
restores a checkpoint's replay buffer, which may take minutes). Silence longer
than the timeout ends the whole job with one line naming the silent rank and what it was last
seen doing. Waiting for credit from a learner that keeps talking is not silence.
"""
from __future__ import annotations

import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as StillRunning  # (not the builtin's before 3.11)

import numpy as np

from mpippo.comm.world import MPI, World

CHUNK, ACK, STOP, WEIGHTS, DONE, STOPREQ, SNAPSHOT = 101, 102, 103, 104, 105, 106, 107


# The chunk header, the one place it is defined (int64 and float64 slots, 8 bytes each)
HEADER = np.dtype([("count", "<i8"), ("actor", "<i8"), ("seq", "<i8"), ("version", "<i8"), ("episodes", "<i8"),
                   ("length_sum", "<i8"), ("env_steps", "<i8"), ("spare", "<i8")])


class ChunkLayout:
    """Byte offsets of one chunk: the HEADER, then `chunk_size` items of the algorithm's
    `item_fields` [(name, dtype, shape of one item)] (Ape-X: algos/apex.chunk_fields), the
    returns of the episodes that ended since the previous chunk (header `episodes` of
    `episode_capacity` slots), and `results_rows` rows of game results (self-play: opponent id,
    wins, draws, losses; all-zero rows are empty)."""

    def __init__(self, chunk_size: int, item_fields, results_rows: int = 0, episode_capacity: int | None = None):
        self.chunk_size = C = chunk_size
        self.item_names = [name for name, _, _ in item_fields]
        self.episode_capacity = episode_capacity or chunk_size
        fields = [("header", HEADER, ()), ("results", np.int64, (results_rows, 4)),
                  ("episode_returns", np.float64, (self.episode_capacity,)),
                  *[(name, dtype, (C,) + tuple(shape)) for name, dtype, shape in item_fields]]
        self.fields, offset = [], 0
        for name, dtype, shape in fields:
            offset = (offset + 7) // 8 * 8  # 8-byte alignment for every field
            self.fields.append((name, dtype, shape, offset))
            offset += int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.nbytes = (offset + 7) // 8 * 8

    def new_buffer(self) -> np.ndarray:
        return np.zeros(self.nbytes, dtype=np.uint8)

    def views(self, raw: np.ndarray) -> dict:
        """Named views into a chunk buffer; views["header"] is a 0-d record: h["count"], h["version"] ..."""
        out = {}
        for name, dtype, shape, offset in self.fields:
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            out[name] = raw[offset:offset + n].view(dtype).reshape(shape)
        return out


class ProgressGuard:
    """When each peer was last heard from and doing what; `check()` ends the job if one that should
    be talking was quiet for too long. `due()` rations the checks: callers sit in hot loops."""

    CHECK_EVERY_S = 0.05

    def __init__(self, world: World, peers: list[int], timeout_s: float, role: str):
        self.world, self.timeout_s, self.role = world, timeout_s, role
        now = time.monotonic()
        self.next_check = self.last_due = now
        self.last = {p: (now, "nothing yet (starting)") for p in peers}
        self.exempt: set[int] = set()  # peers not expected to talk now

    def heard(self, peer: int, what: str) -> None:
        self.last[peer] = (time.monotonic(), what)

    def restart(self, peer: int) -> None:
        """The peer's clock starts now (it was waiting on us), keeping what it did last."""
        self.last[peer] = (time.monotonic(), self.last[peer][1])

    def due(self) -> bool:
        """True at most every CHECK_EVERY_S (and never with the guard off)."""
        if self.timeout_s <= 0:
            return False
        now = time.monotonic()
        if now - self.last_due > self.timeout_s / 2:  # this side was stopped (a suspended job) or could not
            for peer in self.last:                    # look: what its peers sent meanwhile is unread, so
                self.restart(peer)                    # their clocks start again (a hang is still seen)
        self.last_due = now
        if now < self.next_check:
            return False
        self.next_check = now + self.CHECK_EVERY_S
        return True

    def check(self) -> None:
        if self.due():
            self.check_now()

    def check_now(self) -> None:
        """End the job if a peer that should be talking has been silent longer than the timeout."""
        now = time.monotonic()
        for peer, (when, what) in self.last.items():
            if peer not in self.exempt and now - when > self.timeout_s:
                sys.stderr.write(f"mpippo: error: rank {self.world.job_rank(peer)} ({self.role}) was silent for "
                                 f"{now - when:.0f} s (guards.collective_timeout_s = {self.timeout_s:g}); last seen: "
                                 f"{what}; rank {self.world.job_rank()} ends the job\n")
                sys.stderr.flush()
                self.world.ask_where(peer)  # (a hung peer says where: in its env's code, the user's line)
                self.world.abort(1)


def chunk_checksum(layout: ChunkLayout, views: dict, count: int) -> int:
    """CRC of the first `count` items and the episode returns (to prove nothing was lost or mangled)."""
    crc = zlib.crc32(views["episode_returns"][:int(views["header"]["episodes"])].tobytes())
    for name in layout.item_names:
        crc = zlib.crc32(np.ascontiguousarray(views[name][:count]).tobytes(), crc)
    return crc


def combine(total: int, crc: int) -> int:
    """Order-independent sum of chunk CRCs: chunks that complete together are handled in buffer order."""
    return (total + crc) % (1 << 62)


class ActorChannel:
    """Actor side: send chunks with credits, receive weights, finish with STOP/DONE; watch the learner."""

    def __init__(self, world: World, learner: int, layout: ChunkLayout, n_params: int, max_inflight: int = 4,
                 table_size: int = 0, snapshots: bool = False, timeout_s: float = 0.0):
        comm = world.comm
        self.comm, self.learner, self.layout, self.max_inflight = comm, learner, layout, max_inflight
        self.guard = ProgressGuard(world, [learner], timeout_s, "learner")
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
        self._latest = None  # weights taken off the wire, not yet handed to the actor
        self.snapshot = np.zeros(2 + n_params, dtype=np.float32) if snapshots else None
        self.snapshot_req = comm.Irecv(self.snapshot, source=learner, tag=SNAPSHOT) if snapshots else None
        self.sent = self.seq = 0
        self.checksum = 0
        self.stopreq = np.zeros(1, dtype=np.int64)
        self.stopreq_req = comm.Irecv(self.stopreq, source=learner, tag=STOPREQ)
        self._stop_requested = False

    def check(self) -> None:
        """End the job if the learner has been silent too long (call it as often as convenient).
        Credit and keepalives are taken first: before its first weights (a learner restoring its
        replay) the actor waits for weights only, and they are what the learner sends then."""
        if self.guard.due():
            self._drain_acks(block=False)
            self.guard.check_now()

    def stop_requested(self) -> bool:
        """True once the learner asked this actor to stop early (checked without blocking)."""
        if not self._stop_requested and self.stopreq_req.Test():
            self._stop_requested = True
            self.guard.heard(self.learner, "asked the actors to stop")
        return self._stop_requested

    def _drain_acks(self, block: bool) -> None:
        while True:
            if block:  # Test and nap instead of Wait: MPI's Wait spins, taking a core from the learner
                while not self.ack_req.Test():                # wherever actors and learner share cores
                    self._take_weights()  # weights also show the learner is alive; kept for poll_weights
                    self.guard.check()
                    time.sleep(0.0005)
            elif not self.ack_req.Test():
                return
            credit = int(self.ack[0])
            self.inflight -= credit
            self.guard.heard(self.learner, f"credit for {credit} chunk(s)" if credit else "keepalive")
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
        views = self.layout.views(self.buffers[slot])
        views["header"]["episodes"] = 0
        return views

    def send(self, count: int, actor_id: int) -> None:
        slot = self.next_slot
        views = self.layout.views(self.buffers[slot])
        h = views["header"]
        h["count"], h["actor"], h["seq"] = count, actor_id, self.seq
        self.checksum = combine(self.checksum, chunk_checksum(self.layout, views, count))
        self.send_reqs[slot] = self.comm.Isend(self.buffers[slot], dest=self.learner, tag=CHUNK)
        self.next_slot = (slot + 1) % self.max_inflight
        self.inflight += 1
        self.sent += count
        self.seq += 1

    def _take_weights(self) -> None:
        """Keep the newest weights that arrived (for poll_weights); any arrival is news from the learner."""
        head = 2 + 2 * self.table_size
        while self.weights_req.Test():
            meta = self.weights[:head].view(np.float64)
            self._latest = (int(meta[0]), self.weights[head:].copy(), meta[1:].copy())
            self.weights_req = self.comm.Irecv(self.weights, source=self.learner, tag=WEIGHTS)
            self.guard.heard(self.learner, f"sent weights version {self._latest[0]}")

    def poll_weights(self):
        """(version, flat params, table) of the newest weights that arrived since the last call, or None."""
        self._take_weights()
        latest, self._latest = self._latest, None
        return latest

    def poll_snapshots(self) -> list:
        """[(member id, flat params)] of the pool snapshots that arrived since the last call, in order."""
        out = []
        while self.snapshot_req is not None and self.snapshot_req.Test():
            out.append((int(self.snapshot[:2].view(np.float64)[0]), self.snapshot[2:].copy()))
            self.snapshot_req = self.comm.Irecv(self.snapshot, source=self.learner, tag=SNAPSHOT)
            self.guard.heard(self.learner, f"sent pool member {out[-1][0]}")
        return out

    def finish(self, env_steps: int, reason: int = 0, peak_rss_kib: int = 0) -> None:
        """Announce the totals, then keep taking acks, weights and snapshots until the learner says DONE."""
        stop = np.array([self.sent, env_steps, self.checksum, self.seq, reason, peak_rss_kib], dtype=np.int64)
        self.comm.Send(stop, dest=self.learner, tag=STOP)
        done = np.zeros(1, dtype=np.int64)
        done_req = self.comm.Irecv(done, source=self.learner, tag=DONE)
        while not done_req.Test():
            self._drain_acks(block=False)
            self.poll_weights()
            self.poll_snapshots()
            self.guard.check()
            time.sleep(0.0005)
        spare = [self.ack_req, self.weights_req] + ([self.snapshot_req] if self.snapshot_req is not None else [])
        for req in spare + ([] if self._stop_requested else [self.stopreq_req]):
            req.Cancel()
            req.Wait()
        for req in self.send_reqs:
            if req is not None:
                req.Wait()


class LearnerChannel:
    """Learner side: one posted Irecv per actor buffer; never blocks on one actor; watches the actors."""

    def __init__(self, world: World, actors: list[int], layout: ChunkLayout, n_params: int, max_inflight: int = 4,
                 table_size: int = 0, timeout_s: float = 0.0):
        comm = world.comm
        self.comm, self.actors, self.layout = comm, actors, layout
        self.guard = ProgressGuard(world, actors, timeout_s, "actor")
        self.keepalive_s = timeout_s / 4
        self.last_sent = {a: time.monotonic() for a in actors}
        self.table_size = table_size
        self.buffers = {a: [layout.new_buffer() for _ in range(max_inflight)] for a in actors}
        self.reqs, self.owners = [], []
        for a in actors:
            for buf in self.buffers[a]:
                self.reqs.append(comm.Irecv(buf, source=a, tag=CHUNK))
                self.owners.append((a, buf))
        self.stop_bufs = {a: np.zeros(6, dtype=np.int64) for a in actors}
        self.stop_reqs = {a: comm.Irecv(self.stop_bufs[a], source=a, tag=STOP) for a in actors}
        self.received = {a: 0 for a in actors}
        self.checksums = {a: 0 for a in actors}
        self.chunks = {a: 0 for a in actors}
        self.stopped: dict[int, np.ndarray] = {}
        self.unacked = {a: 0 for a in actors}
        self.held_since = {a: 0.0 for a in actors}  # when this learner began to owe the actor credit
        self.longest_hold_s = 0.0  # the longest an actor waited on this learner for credit (at most)
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
            h = views["header"]
            count = int(h["count"])
            self.received[actor] += count
            self.chunks[actor] += 1
            self.checksums[actor] = combine(self.checksums[actor], chunk_checksum(self.layout, views, count))
            self.guard.heard(actor, f"sent chunk #{int(h['seq'])} ({int(h['env_steps']):,} env steps)")
            out.append((i, actor, views, count))
        for a, req in self.stop_reqs.items():
            if a not in self.stopped and req.Test():
                self.stopped[a] = self.stop_bufs[a]
                self.guard.heard(a, f"finished ({int(self.stop_bufs[a][0]):,} transitions sent)")
        return out

    def release(self, i: int) -> None:
        """The chunk in slot i was copied out: post the receive again and owe its actor a credit."""
        actor, buf = self.owners[i]
        self.reqs[i] = self.comm.Irecv(buf, source=actor, tag=CHUNK)
        if not self.unacked[actor]:
            self.held_since[actor] = time.monotonic()
        self.unacked[actor] += 1

    def _ack(self, actor: int, credit: int) -> None:
        msg = np.array([credit], dtype=np.int64)
        self.pending_sends.append((self.comm.Isend(msg, dest=actor, tag=ACK), msg))
        self.last_sent[actor] = time.monotonic()

    def grant(self, actor: int | None = None) -> None:
        """Acknowledge the chunks taken so far (all actors, or one), letting actors send more."""
        for a in ([actor] if actor is not None else self.actors):
            if self.unacked[a]:
                self._ack(a, self.unacked[a])
                self.unacked[a] = 0
                self.longest_hold_s = max(self.longest_hold_s, time.monotonic() - self.held_since[a])
                self.guard.restart(a)  # it may have waited for this credit: its clock starts now
        self.pending_sends = [(r, m) for r, m in self.pending_sends if not r.Test()]

    def check(self) -> None:
        """Keepalives to actors this learner has sent nothing for a while; then end the job if an
        actor that holds credit (so it should be sending) has been silent too long."""
        if not self.guard.due():
            return
        self._keepalives(older_than=self.keepalive_s)
        self.guard.exempt = {a for a in self.actors if self.unacked[a] or self._finished(a)}
        self.guard.check_now()

    def talking_while(self, work):
        """work()'s result, run in a thread while this one sends every actor a keepalive each quarter
        of the timeout: the learner's start-up (restoring a replay buffer of many GB from a slow file
        system, its logs' writers) must not look like a hung learner. Only this thread calls MPI. The
        actors' chunks wait unread meanwhile, so their clocks start again when it is done."""
        if self.guard.timeout_s <= 0:
            return work()
        pool = ThreadPoolExecutor(1, thread_name_prefix="mpippo-learner-start")
        job = pool.submit(work)
        try:
            while True:  # (the first at once: the learner's start-up before this took some of their time)
                self._keepalives(older_than=0.0)
                try:
                    result = job.result(timeout=self.keepalive_s)
                    break
                except StillRunning:
                    continue
        finally:  # (a second Ctrl-C here ends the process now, not once the restore is done)
            pool.shutdown(wait=job.done(), cancel_futures=True)
        for a in self.actors:
            self.guard.restart(a)
        return result

    def _keepalives(self, older_than: float) -> None:
        """An ACK of 0 credits to each actor still sending that got nothing for `older_than` seconds."""
        now = time.monotonic()
        for a in self.actors:
            if now - self.last_sent[a] >= older_than and a not in self.stopped:
                self._ack(a, 0)
        self.pending_sends = [(r, m) for r, m in self.pending_sends if not r.Test()]

    def _finished(self, a: int) -> bool:
        return a in self.stopped and self.received[a] == int(self.stopped[a][0])

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
        self.last_sent.update({a: time.monotonic() for a in self.actors})
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
        return len(self.stopped) == len(self.actors) and all(self._finished(a) for a in self.actors)

    def corrupted(self) -> list[int]:
        """Actors whose chunks' combined CRC differs from the one their STOP announced (after all_done)."""
        return [a for a in self.actors if self.checksums[a] != int(self.stopped[a][2])]

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
