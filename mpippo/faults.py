"""Fault injection for tests of fail-stop behaviour.

MPIPPO_FAULT="rank=1,iteration=3,kind=raise|kill|hang|nan|slow[,count=N][,seconds=S]" makes
that rank (rank=0+2: each of those, e.g. both learners of a two-agent job), at the start of that
iteration, raise an exception, die with SIGKILL, block forever, (nan) poison its next `count`
gradient steps, or (slow) sleep S seconds in each of `count` iterations from there on (a slow
learner: in the actor-learner layout an iteration is an update).
kind=lag,factor=F makes that rank of the sync layout F slower throughout (0.3: 30%): after each
env step and each backward pass it sleeps F times what that took (a slow node; the balanced
cut-off's measurement). kind=kill_in_save|enospc act inside the checkpoint
write of that iteration on rank 0: die half-way through writing the temp file, or fail
there as a full disk would. kind=slow_restore,seconds=S: that learner takes S seconds more to
restore its checkpoint on a resume (a replay buffer on a slow file system); kind=slow_start,seconds=S:
that rank reaches the trainer's construction S seconds after the others (a slow import). Unset (the normal
case) it costs one lookup per iteration.
MPIPPO_FAULT_STAMP=<file>: a raise, kill or hang first writes its wall-clock time there, so a test
times the job's end from the fault, not from a launch whose start-up a slow machine stretches.
"""
from __future__ import annotations

import os
import signal
import time

import errno
from contextlib import contextmanager

from mpippo.metrics.timers import PhaseTimer
from mpippo.rules import show

KINDS = ("raise", "kill", "hang", "nan", "slow", "lag", "kill_in_save", "enospc", "slow_restore", "slow_start")


class InjectedFault(RuntimeError):
    pass


def parse(spec: str | None) -> dict | None:
    if not spec:
        return None
    fields = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    try:
        fault = {"ranks": frozenset(int(r) for r in fields.get("rank", "0").split("+")),
                 "iteration": int(fields.get("iteration", 1)), "kind": fields.get("kind", "raise"),
                 "count": int(fields.get("count", 1)), "seconds": float(fields.get("seconds", 1.0)),
                 "factor": float(fields.get("factor", 0.0))}
    except ValueError:
        raise ValueError(f"MPIPPO_FAULT: {show(spec)} is not rank=R[+R...],iteration=N,kind=K[,count=N][,seconds=S]"
                         f"[,factor=F] (a test hook: unset it to train)") from None
    if fault["kind"] not in KINDS:
        raise ValueError(f"MPIPPO_FAULT: kind {show(fault['kind'])} is not one of {', '.join(KINDS)} (a test hook: "
                         f"unset it to train)")
    return fault


def _from_environment() -> tuple[dict | None, str | None]:
    """The fault the environment asks for, or the one line saying why it cannot be read (the entry
    points refuse to start with it: importing this module must not fail)."""
    try:
        return parse(os.environ.get("MPIPPO_FAULT")), None
    except ValueError as e:
        return None, str(e)


FAULT, ERROR = _from_environment()


def maybe_inject(rank: int, iteration: int) -> int:
    """Trigger the configured fault here; returns how many gradient steps to poison with NaN."""
    if FAULT is None or rank not in FAULT["ranks"]:
        return 0
    kind = FAULT["kind"]
    if kind == "slow" and FAULT["iteration"] <= iteration < FAULT["iteration"] + FAULT["count"]:
        time.sleep(FAULT["seconds"])
        return 0
    if FAULT["iteration"] != iteration:
        return 0
    if kind in ("raise", "kill", "hang") and os.environ.get("MPIPPO_FAULT_STAMP"):
        with open(os.environ["MPIPPO_FAULT_STAMP"], "w") as f:
            f.write(repr(time.time()))
    if kind == "raise":
        raise InjectedFault(f"injected fault on rank {rank} at iteration {iteration}")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        while True:
            time.sleep(3600)
    return FAULT["count"] if kind == "nan" else 0


class LaggingTimer(PhaseTimer):
    """kind=lag: the phase timer of a rank made slower; the sleep counts in the phase, as a slow
    node's time would."""
    SLOWED = ("env_step", "backward")

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        with super().__call__(phase):
            yield
            if phase in self.SLOWED:
                time.sleep(self.factor * (time.perf_counter() - t0))


def phase_timer(rank: int) -> PhaseTimer:
    """The sync layout's phase timer: a LaggingTimer on the rank MPIPPO_FAULT makes lag."""
    if FAULT is not None and FAULT["kind"] == "lag" and rank in FAULT["ranks"]:
        return LaggingTimer(FAULT["factor"])
    return PhaseTimer()


def restore_delay(rank: int) -> None:
    """kind=slow_restore: sleep in this learner's restore."""
    if FAULT is not None and FAULT["kind"] == "slow_restore" and rank in FAULT["ranks"]:
        time.sleep(FAULT["seconds"])


def start_delay(rank: int) -> None:
    """kind=slow_start: this rank comes late to the trainer's construction (start-up's collectives)."""
    if FAULT is not None and FAULT["kind"] == "slow_start" and rank in FAULT["ranks"]:
        time.sleep(FAULT["seconds"])


def save_fault(iteration: int):
    """A callback for files.atomic_write_bytes, run after half the bytes are written; or None."""
    if FAULT is None or FAULT["iteration"] != iteration or FAULT["kind"] not in ("kill_in_save", "enospc"):
        return None

    def fail():
        if FAULT["kind"] == "kill_in_save":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return fail
