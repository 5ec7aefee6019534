"""MPIPPO_TEST_PROCS=<file>: every Python process the tests start (ranks, tools, Slurm jobs' ranks) adds
a JSON line at its exit: its CPU seconds, what it imported that costs seconds to load (torch; procgen,
whose first env loads every game's assets) and the test that started it. The tests' conftest puts this
folder first on the jobs' PYTHONPATH only when that variable is set, and prints the table at the end.
(Processes killed by a signal write nothing; os._exit is wrapped, as the fail-stop path ends with it.)"""
import atexit
import json
import os
import resource
import sys
import time

_START = time.monotonic()
_DONE: list[int] = []
_WARM = False


def not_a_job() -> None:
    """The tests' warm-start server is no job of a test: it writes no record (its children do)."""
    _DONE[:] = [1]


def warm_start() -> None:
    """Called by the tests' warm start in each child it forks (tests/warmstart_server.py): the child
    writes its own record, counted from now, saying it was forked with torch already imported."""
    global _START, _WARM
    _START, _WARM = time.monotonic(), True
    _DONE.clear()


def _record() -> None:
    if _DONE:  # (mpippo.shutdown.end_process runs atexit's functions, then os._exit: one line a process)
        return
    _DONE.append(1)
    try:
        use = resource.getrusage(resource.RUSAGE_SELF)
        line = json.dumps({"pid": os.getpid(), "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
                           "argv": sys.argv[:2], "cpu_s": round(use.ru_utime + use.ru_stime, 2),
                           "wall_s": round(time.monotonic() - _START, 2),
                           "torch": "torch" in sys.modules, "warm": _WARM, "procgen": "procgen" in sys.modules})
        fd = os.open(os.environ["MPIPPO_TEST_PROCS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (line + "\n").encode())  # one write of a short line: whole under O_APPEND
        os.close(fd)
    except (OSError, KeyError):
        pass  # a measurement must never change how a test's process ends


if os.environ.get("MPIPPO_TEST_PROCS"):
    atexit.register(_record)
    _exit = os._exit

    def _recorded_exit(code):
        _record()
        _exit(code)
    os._exit = _recorded_exit
