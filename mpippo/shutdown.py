"""A decided process's end, without the interpreter's teardown.

After torch's import, Python's teardown frees module by module what the kernel frees at once:
0.1-0.7 s of CPU per process (more on a slow node), a tenth to a quarter of a short run's. The
trainer (run_mpi.py) and the tools (toolcli.exit_process) end here once their outcome is decided
and their files are closed. What the teardown owed the process is done, in its order: threads that
are not daemons joined, atexit's functions (W&B's finish, logging's flush), the steps registered
with `last` (mpippo.comm: MPI_Finalize), the standard streams flushed.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

_LAST: list = []


def last(step) -> None:
    """Run `step()` at end_process, after atexit's functions (mpippo.comm registers MPI_Finalize:
    only a process that imported MPI pays for it)."""
    _LAST.append(step)


def end_process(code) -> None:
    """Exit with `code`, as SystemExit(code) would: None is 0, a text is printed on stderr and is 1."""
    if code is None or isinstance(code, int):
        code = code or 0
    else:
        with contextlib.suppress(Exception):
            print(code, file=sys.stderr)
        code = 1
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for step in _LAST:
        step()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # (a reader gone, or no stream at all: `tool >&-`)
            stream.flush()
    os._exit(code & 0xFF)  # (what the kernel keeps of any status)
