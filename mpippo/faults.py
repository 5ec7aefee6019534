"""Fault injection for tests of fail-stop behaviour.

MPIPPO_FAULT="rank=1,iteration=3,kind=raise|kill|hang|nan" makes that rank, at the start
of that iteration, raise an exception, die with SIGKILL, block forever, or (nan) poison
its next gradients. Unset (the normal case) it costs one dict lookup per iteration.
"""
from __future__ import annotations

import os
import signal
import time

KINDS = ("raise", "kill", "hang", "nan")


class InjectedFault(RuntimeError):
    pass


def parse(spec: str | None) -> dict | None:
    if not spec:
        return None
    fields = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    fault = {"rank": int(fields.get("rank", 0)), "iteration": int(fields.get("iteration", 1)),
             "kind": fields.get("kind", "raise")}
    if fault["kind"] not in KINDS:
        raise ValueError(f"MPIPPO_FAULT: kind '{fault['kind']}' is not one of {', '.join(KINDS)}")
    return fault


FAULT = parse(os.environ.get("MPIPPO_FAULT"))


def maybe_inject(rank: int, iteration: int) -> str | None:
    """Trigger the configured fault here; returns 'nan' for the caller to poison gradients."""
    if FAULT is None or FAULT["rank"] != rank or FAULT["iteration"] != iteration:
        return None
    kind = FAULT["kind"]
    if kind == "raise":
        raise InjectedFault(f"injected fault on rank {rank} at iteration {iteration}")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        while True:
            time.sleep(3600)
    return kind
