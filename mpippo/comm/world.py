"""World: rank, size, node-local rank, and the few buffer collectives mpippo uses.

Under a launcher (mpirun, srun) it wraps COMM_WORLD; as plain `python run_mpi.py` MPI is not
started, the same object has size 1 and every collective is an identity, so one code path serves both.
Collectives take contiguous numpy arrays and use mpi4py's uppercase (buffer) methods:
no pickling. The lowercase object methods are only used at start-up (config, run dir).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import threading
import time
import traceback

import numpy as np

from mpippo import leftovers, preemption, shutdown
from mpippo.errors import (FILE_SYSTEM_FULL, RankFailure, SecondInterrupt, file_system_failure, folder_gone,
                           limit_failure, main_thread_at, name_rank, say_interrupted)
from mpippo.preemption import EXIT_INTERRUPTED, PauseClock

# What MPI launchers (mpirun of Open MPI, MPICH's hydra, srun --mpi=pmix|pmi2, MVAPICH) put in each
# rank's environment. Without any of them this is one process (plain `python run_mpi.py`, a tool, a
# test) and MPI is not started: a singleton MPI_Init waits about a second for Open MPI's runtime and
# gives one rank nothing. MPIPPO_MPI_INIT=1 starts it anyway.
LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD", "MPI_LOCALNRANKS",
                 "MV2_COMM_WORLD_SIZE")


def launched() -> bool:
    """Whether an MPI launcher started this process (or MPIPPO_MPI_INIT=1 asks for MPI anyway)."""
    return os.environ.get("MPIPPO_MPI_INIT") == "1" or any(v in os.environ for v in LAUNCHER_VARS)


# where no launcher of ours chose one, this rank keeps its shared-memory file in a folder named after it
# (leftovers.py says why)
_SHM_FOLDER = leftovers.own_rank_shm_folder() if launched() else None


def _remove_shm_folder() -> None:
    if _SHM_FOLDER:
        shutil.rmtree(_SHM_FOLDER, ignore_errors=True)


try:
    import mpi4py
    if not launched():
        mpi4py.rc.initialize = False  # the module still names the library (mpi_library) and its types
    from mpi4py import MPI
except ImportError:  # no MPI library: single-process mode only
    MPI = None


def _orphan_check() -> None:
    """A rank whose mpirun died before MPI started (kill -9 in its first moments) finds no runtime and
    starts a world of one, and trained the whole budget alone, its output gone, the run folder locked:
    a world of another size than its launcher started ends here, in one line."""
    started = os.environ.get("OMPI_COMM_WORLD_SIZE", "")
    if MPI is not None and MPI.Is_initialized() and started.isdecimal() and int(started) != MPI.COMM_WORLD.Get_size():
        with contextlib.suppress(Exception):
            sys.stderr.write(f"mpippo: error: OMPI_COMM_WORLD_SIZE={started}: mpirun started this rank as one of {started}, "
                             f"but MPI made it a world of {MPI.COMM_WORLD.Get_size()} (mpirun gone before MPI started? "
                             f"or a variable left from another job's environment: unset it); ending it\n")
            sys.stderr.flush()
        _remove_shm_folder()
        os._exit(1)


_orphan_check()

_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def mpi_library() -> str:
    """The MPI library's name and version (benchmark records), or 'none'."""
    return MPI.Get_library_version().splitlines()[0] if MPI is not None else "none"


_MPI_IN_THREADS = threading.Lock()  # held by a watchdog thread while it calls MPI


def _finalize_mpi() -> None:
    """shutdown.end_process's last step. The watchdog threads (daemons) still run then: none may call
    MPI from here on. (The interpreter's teardown froze them instead: a daemon thread stops at its next
    attempt to run Python.)"""
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        _MPI_IN_THREADS.acquire()
        MPI.Finalize()


shutdown.last(_finalize_mpi)
shutdown.last(_remove_shm_folder)  # (after MPI_Finalize: no peer opens this rank's file any more)


def cpu_share(mine: list[int], node_masks: list[list[int]]) -> int:
    """The cores this rank may count as its own: its affinity mask shared by the ranks on the node
    whose masks overlap it. A bound launch (disjoint masks) gives each rank its mask; an unbound
    one (every rank sees the node, or the job's cgroup) divides the mask by the ranks in it."""
    me = set(mine)
    sharing = sum(1 for m in node_masks if me & set(m)) or 1
    return max(1, len(me) // sharing)


class World:
    def __init__(self, collective_timeout_s: float = 0.0, _comm=None, _parent: "World | None" = None):
        self.comm = _comm if _comm is not None else (MPI.COMM_WORLD if MPI is not None and MPI.Is_initialized()
                                                     else None)
        self.parent = _parent  # the World this one was split from (None: the whole job)
        self.rank = self.comm.Get_rank() if self.comm else 0
        self.size = self.comm.Get_size() if self.comm else 1
        self.hostname = socket.gethostname()
        # Slurm's node name: differs from the hostname when several slurmd emulate nodes on one host
        self.node = os.environ.get("SLURMD_NODENAME", self.hostname)
        mask = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        if _parent is not None:  # where this process sits on its node does not change with the split
            self.local_rank, self.local_size = _parent.local_rank, _parent.local_size
            self.affinity, self.cpu_share = _parent.affinity, _parent.cpu_share
        elif self.comm is not None and self.size > 1:
            node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
            self.affinity, self.cpu_share = len(mask), cpu_share(mask, node.allgather(mask))  # start-up only
            node.Free()
        else:
            self.local_rank, self.local_size = 0, 1
            self.affinity, self.cpu_share = len(mask), len(mask)
        self._watch_name: str | None = None
        self._watch_since = 0.0
        self._left_at = time.monotonic()  # when this rank last left a collective (the watchdog's answer)
        self._seq = 0  # collectives entered so far: equal on all ranks that are in step
        # A private communicator for the watchdog's diagnosis, so its messages never mix with training's.
        self._diag = self.comm.Dup() if self.comm is not None and self.size > 1 else None
        self.collective_timeout_s = 0.0
        self.set_collective_timeout(collective_timeout_s)
        if _parent is None and self.size > 1:
            name_rank(f"rank {self.rank}: ")

    def split(self, color: int, key: int | None = None) -> "World":
        """The ranks of the same `color` as a World of their own, ordered by `key` (default: rank);
        collective over this World. With one process, a World of one."""
        if self.comm is None or self.size == 1:
            return self
        sub = self.comm.Split(color, self.rank if key is None else key)
        return World(_comm=sub, _parent=self)

    def job_rank(self, rank: int | None = None) -> int:
        """The rank in the whole job (what mpirun and error messages name) of `rank` of this World."""
        rank = self.rank if rank is None else rank
        if self.parent is None or self.comm is None:
            return rank
        return self.parent.job_rank(MPI.Group.Translate_ranks(self.comm.Get_group(), [rank],
                                                              self.parent.comm.Get_group())[0])

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # ---- watchdog: a collective that never completes must not hang the job ----
    def set_collective_timeout(self, seconds: float) -> None:
        start = seconds > 0 and self.size > 1 and self.collective_timeout_s == 0
        self.collective_timeout_s = seconds
        if start:
            threading.Thread(target=self._watchdog, name="mpippo-watchdog", daemon=True).start()

    _QUERY, _REPLY = 7001, 7002

    def _watchdog(self) -> None:
        """Answers other ranks' "where are you?" queries; aborts when this rank's collective stalls."""
        threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        query, status, pending, said = np.zeros(1, np.int64), MPI.Status(), [], False
        req = self._diag.Irecv(query, source=MPI.ANY_SOURCE, tag=self._QUERY) if threaded else None
        pause = PauseClock(0.5)  # (a suspended job: the other ranks were stopped too, so that time is no one's wait)
        while True:
            time.sleep(0.5)
            with _MPI_IN_THREADS:  # (end_process holds it from before MPI_Finalize to the process's end)
                pause.tick()
                req, said = self._answer(req, query, status, pending, said)
                pending[:] = [(r, b) for r, b in pending if not r.Test()]
                self._check_stall(threaded, pause)

    def _answer(self, req, query, status, pending: list, said: bool):
        """Reply to each rank that asked where this one is (its collective's number, whether it waits in
        one, for how long it has been outside them); the next query's receive, and whether it said where."""
        while req is not None and req.Test(status):
            busy = int(time.monotonic() - self._left_at)  # outside collectives: its envs, its update
            if self._watch_name is None and not said:  # the rank the others wait for: once, where it is
                self._say_where(status.Get_source(), busy if query[0] >= 0 else None)
                said = True
            reply = np.array([self._seq, self._watch_name is not None, busy], dtype=np.int64)
            pending.append((self._diag.Isend(reply, dest=status.Get_source(), tag=self._REPLY), reply))
            req = self._diag.Irecv(query, source=MPI.ANY_SOURCE, tag=self._QUERY)
        return req, said

    def _check_stall(self, threaded: bool, pause: PauseClock) -> None:
        name, since, seq = self._watch_name, self._watch_since, self._seq
        if name is not None and time.monotonic() - max(since, pause.resumed) > self.collective_timeout_s:
            where = self._diagnose(seq) if threaded else "ranks not known (MPI without THREAD_MULTIPLE)"
            sys.stderr.write(f"[rank {self.rank}] collective '{name}' (#{seq}) waited more than "
                             f"{self.collective_timeout_s:.0f} s for other ranks; {where}; aborting the job\n")
            sys.stderr.flush()
            self.abort(1)

    def _say_where(self, asker: int, busy: int | None) -> None:
        """The line of a rank that others wait for, before their abort ends it: where its main thread
        is, in the user's code if it is in any (an env's step), so a hang names its place, not only
        its rank. `busy` None: asked by a progress guard (ask_where), whose layout has no collectives
        to count time from."""
        at = main_thread_at()
        why = (f"waits for this rank, outside collectives for {busy} s" if busy is not None else
               "finds this rank silent (its progress guard)")
        sys.stderr.write(f"[rank {self.rank}] rank {asker} {why}{at}\n")
        sys.stderr.flush()

    def ask_where(self, rank: int, wait_s: float = 3.0) -> None:
        """Ask `rank` of this World (a peer gone silent) where it is, before this rank ends the job:
        its watchdog thread, which runs while its main thread hangs (an env's native code), prints
        its place (_say_where). Through the job's World, whose watchdog thread every rank runs; a
        dead rank, or MPI without THREAD_MULTIPLE, gives no answer and costs `wait_s` at most."""
        top = self
        while top.parent is not None:
            top = top.parent
        if top._diag is None or MPI.Query_thread() != MPI.THREAD_MULTIPLE or top.collective_timeout_s <= 0:
            return
        peer, reply = self.job_rank(rank), np.full(3, -1, dtype=np.int64)
        ask = np.array([-1], dtype=np.int64)  # (-1: a progress guard's question, not a collective's)
        try:
            send = top._diag.Isend(ask, dest=peer, tag=self._QUERY)
            recv = top._diag.Irecv(reply, source=peer, tag=self._REPLY)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not recv.Test():
                time.sleep(0.05)
            del send  # (the abort that follows ends whatever is still pending)
        except MPI.Exception:  # a dead peer (MPI returns errors here): nothing to say; the abort follows
            return

    def _diagnose(self, seq: int, wait_s: float = 5.0) -> str:
        """Ask every other rank which collective it is in; name those that did not arrive."""
        others = [r for r in range(self.size) if r != self.rank]
        ask = np.array([seq], dtype=np.int64)
        replies = {r: np.full(3, -1, dtype=np.int64) for r in others}
        sends = [self._diag.Isend(ask, dest=r, tag=self._QUERY) for r in others]
        recvs = {r: self._diag.Irecv(replies[r], source=r, tag=self._REPLY) for r in others}
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not all(q.Test() for q in recvs.values()):
            time.sleep(0.05)
        missing, notes = [], []
        for r in others:
            r_seq, inside, busy = replies[r]
            if r_seq < 0:
                missing.append(r)
                notes.append(f"rank {r}: no answer (dead or stuck)")
            elif r_seq != seq or not inside:
                missing.append(r)
                state = "waiting in" if inside else f"not in a collective for {busy} s, last entered"
                notes.append(f"rank {r}: {state} #{r_seq}")
        del sends
        if not missing:
            return "every rank is in it (a slow network or MPI stall)"
        return f"ranks that did not arrive: {missing} ({'; '.join(notes)})"

    def _run(self, name: str, fn, *args):
        self._seq += 1
        self._watch_since, self._watch_name = time.monotonic(), name
        try:
            return fn(*args)
        finally:
            self._watch_name, self._left_at = None, time.monotonic()

    # ---- buffer collectives (hot path) ----
    def allreduce_(self, buf: np.ndarray, op: str = "sum", name: str = "allreduce") -> np.ndarray:
        """In-place Allreduce of a contiguous numpy array."""
        if self.size > 1:
            self._run(name, self.comm.Allreduce, MPI.IN_PLACE, buf, getattr(MPI, _OPS[op]))
        return buf

    def bcast_(self, buf: np.ndarray, root: int = 0, name: str = "bcast") -> np.ndarray:
        if self.size > 1:
            self._run(name, self.comm.Bcast, buf, root)
        return buf

    def gather(self, buf: np.ndarray, root: int = 0, name: str = "gather") -> np.ndarray | None:
        """Stack every rank's same-shaped `buf` on `root` -> (size, *buf.shape); None elsewhere."""
        buf = np.ascontiguousarray(buf)
        if self.size == 1:
            return buf[None].copy()
        out = np.empty((self.size,) + buf.shape, buf.dtype) if self.rank == root else None
        self._run(name, self.comm.Gather, buf, out, root)
        return out

    def allgather(self, buf: np.ndarray, name: str = "allgather") -> np.ndarray:
        buf = np.ascontiguousarray(buf)
        if self.size == 1:
            return buf[None].copy()
        out = np.empty((self.size,) + buf.shape, buf.dtype)
        self._run(name, self.comm.Allgather, buf, out)
        return out

    def agree(self, flags) -> np.ndarray:
        """Collective decision: element-wise MAX of every rank's int flags (one small Allreduce)."""
        arr = np.asarray(flags, dtype=np.int64).copy()
        return self.allreduce_(arr, "max", name="agree")

    # ---- off the hot path (pickles small Python objects): start-up, the end-of-run verdicts, and the
    # ranks' RNG and env states at checkpoint time; never per step or per minibatch ----
    def bcast_obj(self, obj, root: int = 0):
        return self._run("bcast_obj", self.comm.bcast, obj, root) if self.size > 1 else obj

    def gather_obj(self, obj, root: int = 0) -> list | None:
        """Checkpoint time only: every rank's (picklable) state, as a list on root."""
        return self._run("gather_obj", self.comm.gather, obj, root) if self.size > 1 else [obj]

    def allgather_obj(self, obj) -> list:
        return self._run("allgather_obj", self.comm.allgather, obj) if self.size > 1 else [obj]

    def barrier(self) -> None:
        if self.size > 1:
            self._run("barrier", self.comm.Barrier)

    def max_unwatched(self, value: int) -> int:
        """The largest `value` over the ranks, outside the watchdog: for the job's last agreement,
        which ranks may reach minutes apart (agents that end at different times)."""
        return int(self.comm.allreduce(int(value), op=MPI.MAX)) if self.size > 1 else int(value)

    # ---- fail-stop ----
    def abort(self, code: int = 1) -> None:
        """End the whole job (not only this World's ranks)."""
        if self.parent is not None:
            self.parent.abort(code)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # (a closed terminal: ending must not fail, from any thread)
                stream.flush()
        preemption.announce_exit(code)
        _remove_shm_folder()  # (the job ends: a peer's mapping outlives the name)
        if self.comm is not None and self.size > 1:
            self.comm.Abort(code)
        os._exit(code)

    def interrupted(self, how: str = "a second Ctrl-C") -> None:
        """A person's "now": one line, the whole job ends with 130. From the exception hook, or from a
        one-rank run's hang watch where native code kept the main thread from raising it (the line is
        said once, whichever comes first)."""
        say_interrupted(f"rank {self.rank}: " if self.size > 1 else "", how)
        self.abort(EXIT_INTERRUPTED)

    def install_abort_hook(self) -> None:
        """An unhandled exception on any rank takes the whole job down, never a hang."""
        def hook(exc_type, exc, tb):
            who = f"rank {self.rank}: " if self.size > 1 else ""
            if isinstance(exc, RankFailure):  # a failure that says itself in one line (a user's env mid-run)
                sys.stderr.write(f"mpippo: error: {who}{exc}\n")
                self.abort(exc.exit_code)
            if isinstance(exc, KeyboardInterrupt):  # a person's second Ctrl-C (preemption.py): their "now"
                self.interrupted("a second Ctrl-C" if isinstance(exc, SecondInterrupt) else "Ctrl-C (KeyboardInterrupt)")
            if isinstance(exc, OSError) and exc.errno in FILE_SYSTEM_FULL:  # the disk, not a bug: any writer
                sys.stderr.write(f"mpippo: error: {who}{file_system_failure(exc)}\n")  # (TensorBoard's thread too)
                self.abort(1)
            if (said := limit_failure(exc) or folder_gone(exc)):  # a limit (ulimit), a folder moved away: no bug
                sys.stderr.write(f"mpippo: error: {who}{said}\n")
                self.abort(1)
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            sys.stderr.write("".join(f"[rank {self.rank}] {line}\n" for line in text.rstrip().splitlines()))
            self.abort(1)

        sys.excepthook = hook
        threading.excepthook = lambda args: hook(args.exc_type, args.exc_value, args.exc_traceback)
