"""Per-phase wall-clock accounting for one rank."""
from __future__ import annotations

import time
from contextlib import contextmanager

PHASES = ("env_step", "inference", "gae", "backward", "allreduce", "optimizer", "other")


class PhaseTimer:
    def __init__(self):
        self.seconds = {p: 0.0 for p in PHASES}

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t0

    def add_other(self, wall: float) -> None:
        """Charge the unaccounted part of `wall` (time since the last reset) to 'other'."""
        known = sum(v for k, v in self.seconds.items() if k != "other")
        self.seconds["other"] = max(wall - known, 0.0)

    def vector(self):
        return [self.seconds[p] for p in PHASES]
