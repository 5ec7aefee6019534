"""The hostile-input harness shared by the test_hostile*.py tables.

A case builds its inputs in a fresh folder, runs one real command (a trainer, a launcher, a tool;
plain python or under mpirun), and the table's test checks its outcome: the exit code, exactly one
`mpippo: error:` line naming the problem, no `Traceback`, every file that existed before has the
same bytes after, nothing new left in the case folder's `out`, and no process of the case still
running (every process a case starts carries a marker in its environment, found however it
detached: own session, reparented, under mpirun).
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil
import pytest

import warmstart
from conftest import MPIRUN, ROOT, error_lines, mpi_env, relaunched, run_warm, warm_ranks

MARK = "MPIPPO_HOSTILE_CASE"


@dataclass
class Case:
    id: str
    setup: Callable  # (case folder, shared inputs) -> (ranks or None, argv after python) or a Popen-ready dict
    expect: str
    code: int = 2
    check: Callable | None = field(default=None)
    kept: Callable | None = field(default=None)  # (case folder, shared inputs) -> more folders whose files must not change
    slow: bool = False  # needs the module's trained runs (left out by make test-fast)


@dataclass
class Outcome:
    res: subprocess.CompletedProcess
    seconds: float
    before: dict
    after: dict
    folder: Path
    left_running: list[str]


BIG = 64 << 20  # a larger file (a sparse terabyte a case planted) is compared by size and time, not read


def _digest(p: Path) -> str:
    st = p.stat()
    if st.st_size > BIG:
        return f"{st.st_size}:{st.st_mtime_ns}"
    return hashlib.sha256(p.read_bytes()).hexdigest()


def hashes(*folders: Path) -> dict:
    return {p: _digest(p) for f in folders for p in Path(f).rglob("*") if p.is_file()}


def marked_processes(tag: str) -> list[psutil.Process]:
    """Processes whose environment carries this case's marker (any session, any parent; a warm job's
    processes by the job's environment)."""
    out = []
    for p in psutil.process_iter():
        try:
            if warmstart.environ(p).get(MARK) == tag:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # ended between the listing and the look
        return False


def survivors(tag: str, timeout: float) -> list[str]:
    """The case's processes still alive (zombies aside) after waiting up to `timeout` seconds for
    them to end, as 'pid command'; those are killed. The wait is for a loaded machine (CI's two
    cores), where a rank can still be in MPI_Finalize for a moment after mpirun returned."""
    deadline = time.monotonic() + timeout
    seen: dict[int, psutil.Process] = {}
    while True:
        # a process seen once is waited for until it is gone: one that is exiting has already
        # lost its environment (so the marker) but not yet its descriptors, and so its locks
        for p in marked_processes(tag):
            seen.setdefault(p.pid, p)
        alive = [p for p in seen.values() if _running(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    left = []
    for p in alive:
        try:
            left.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            p.kill()
        except psutil.Error:
            pass
    return left


def run_marked(cmd: list[str], tag: str, timeout: float = 90, env: dict | None = None) -> tuple:
    """Run cmd with the case marker; returns (CompletedProcess, processes of the case still alive
    shortly after it ended, as 'pid name'), and kills those."""
    left: list = []

    def once() -> subprocess.CompletedProcess:
        res, left[:] = _run_marked_once(cmd, tag, timeout, env)
        return res
    return relaunched(once), left


def _run_marked_once(cmd: list[str], tag: str, timeout: float, env: dict | None) -> tuple:
    full_env = {k: v for k, v in (mpi_env() | {MARK: tag} | (env or {})).items() if v is not None}  # (None: unset)
    try:
        res = run_warm(cmd, full_env, ROOT, timeout)
    except BaseException:  # (the test fails on its timeout: the case's other processes go first)
        stop_case_processes(tag)
        raise
    if res is not None:
        return res, survivors(tag, timeout=3.0)
    started, full_env = warm_ranks(cmd, full_env)
    proc = subprocess.Popen(started, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in marked_processes(tag):
            p.kill()
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout} s (a hang): {' '.join(cmd)}\n{out[-3000:]}\n{err[-3000:]}")
    left = survivors(tag, timeout=3.0)  # mpirun's last ranks may take a moment to be reaped
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), left


def play(case: Case, folder: Path, shared: dict) -> Outcome:
    """Build the case's inputs in its folder, run it, hash what existed before and after."""
    made = case.setup(folder, shared)
    ranks, argv = made[:2]
    env = made[2] if len(made) > 2 else None
    kept = [folder, *(case.kept(folder, shared) if case.kept else [])]
    before = hashes(*kept)
    cmd = [sys.executable, *argv] if ranks is None else [MPIRUN, "--oversubscribe", "-n", str(ranks), sys.executable,
                                                          *argv]
    t0 = time.monotonic()
    res, left = run_marked(cmd, f"{case.id}-{os.getpid()}-{time.monotonic_ns()}", env=env)
    return Outcome(res, time.monotonic() - t0, before, hashes(*kept), folder, left)


def outcomes(request, tmp_path_factory, cases: list[Case], test_name: str, shared: Callable[[], dict]) -> dict:
    """The cases of `test_name` this session selected, run two at a time (most are one short process
    whose start-up leaves the other core idle). An error in a case is raised in that case's test."""
    ids = {item.callspec.params["case"].id for item in request.session.items
           if getattr(item, "originalname", "") == test_name and item.module.__name__ == request.module.__name__}
    selected = [c for c in cases if c.id in ids]
    inputs = shared() if any(c.slow for c in selected) else {}
    pool = ThreadPoolExecutor(max_workers=2)
    request.addfinalizer(pool.shutdown)
    return {c.id: pool.submit(play, c, tmp_path_factory.mktemp(c.id[:40]), inputs) for c in selected}


def params(cases: list[Case]) -> list:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in cases]


def check(case: Case, o: Outcome) -> None:
    """The promise, for one case's outcome."""
    res = o.res
    assert res.returncode == case.code, (res.returncode, res.stdout[-1500:], res.stderr[-2500:])
    errors = error_lines(res.stderr + res.stdout)
    assert len(errors) == 1, res.stderr[-2500:]  # once per job, not once per rank
    assert case.expect in errors[0], errors[0]
    assert "Traceback" not in res.stderr + res.stdout, res.stderr[-2500:]
    assert o.seconds < 60
    assert {p: h for p, h in o.after.items() if p in o.before} == o.before  # nothing that existed changed
    assert not (o.folder / "out").exists()  # nothing new written either
    assert not o.left_running, o.left_running  # nothing left running
    if case.check is not None:
        assert case.check(o.folder), sorted(str(p) for p in o.folder.rglob("*"))[:50]


def stop_case_processes(tag: str, sig=signal.SIGKILL) -> None:
    for p in marked_processes(tag):
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def uncovered(cases: list[Case], words) -> list[str]:
    """The words (classes of input a table promises to cover) that no case's id contains."""
    return [w for w in words if not any(w in c.id for c in cases)]


def table(cases: list[Case], test_name: str, shared_fixture: str | None = None):
    """A table module's fixture and test, as `outcomes, <test_name> = hostile.table(...)`: the
    fixture runs the selected cases two at a time (`outcomes`), the test checks each (`check`);
    shared_fixture: the module fixture whose value the slow cases build on."""
    @pytest.fixture(scope="module")
    def fixture(request, tmp_path_factory) -> dict:
        return outcomes(request, tmp_path_factory, cases, test_name,
                        lambda: request.getfixturevalue(shared_fixture) if shared_fixture else {})

    @pytest.mark.parametrize("case", params(cases))
    def test(case: Case, outcomes):
        check(case, outcomes[case.id].result())
    test.__name__ = test_name
    return fixture, test
