"""Signals only set flags; the ranks act on them together at the next iteration boundary.

SIGUSR1        -> checkpoint, exit EXIT_REQUEUE (3): "stopped early, requeue me" (Slurm --signal).
SIGTERM/SIGINT -> checkpoint, exit EXIT_STOPPED (4): stopped on request, resumable with --resume.
SIGUSR2        -> the same as SIGTERM; `python -m mpippo.launch` relays SIGTERM/SIGINT as SIGUSR2,
                  because mpirun kills the ranks right after forwarding a SIGTERM.
A second SIGINT while the first is pending raises KeyboardInterrupt (the job then aborts).
Whichever rank or ranks got the signal, the flags are combined with one Allreduce(MAX), so
a signal delivered to mpirun (which forwards it) or to a single rank works the same.

`install()` is the first statement of run_mpi.py, before any slow import: a signal that
arrives while torch and MPI load (seconds on a busy node) is only a flag too. Start-up
checks the flags at each of its agreement points; a signal there ends the job before any
training with exit 3 or 4 and nothing written (tested from the first instant).
"""
from __future__ import annotations

import signal

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_REQUEUE, EXIT_STOPPED = 0, 1, 2, 3, 4


_FLAGS: "SignalFlags | None" = None


def install() -> "SignalFlags":
    """The process's flags, with the handlers installed on the first call (idempotent), so
    a signal received before the trainer exists is still seen by it."""
    global _FLAGS
    if _FLAGS is None:
        _FLAGS = SignalFlags().install()
    return _FLAGS


class SignalFlags:
    def __init__(self):
        self.requeue = False  # SIGUSR1
        self.stop = False     # SIGTERM / SIGINT

    def install(self) -> "SignalFlags":
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR2, self._on_stop)
        return self

    @staticmethod
    def uninstall() -> None:
        """Back to the default actions (terminate), for runners that do not check the flags."""
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)

    def name(self) -> str:
        return "SIGUSR1" if self.requeue else "SIGTERM/SIGINT/SIGUSR2"

    def _on_usr1(self, signum, frame):
        self.requeue = True

    def _on_stop(self, signum, frame):
        if signum == signal.SIGINT and self.stop:
            raise KeyboardInterrupt  # impatient second Ctrl-C
        self.stop = True
