"""Placement: a rank runs on its share of the node's cores, never on one core by accident.

Open MPI binds each of 1-2 ranks to one core by default: a 1-rank job on this machine saw one core
(one torch thread, procgen stepping serially while the other cores idled). The launcher binds each
rank to cores // ranks cores (--map-by slot:PE=n), or leaves ranks unbound when they do not fit.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, metrics, mpi_env

CORES = len(os.sched_getaffinity(0))


def _launch(ranks: int, out, *extra: str) -> dict:
    """The launcher as a user runs it: without the tests' environment-wide "bind nothing" policy."""
    env = {k: v for k, v in mpi_env().items() if k not in ("PRTE_MCA_hwloc_default_binding_policy",
                                                             "OMPI_MCA_rmaps_base_oversubscribe")}
    res = subprocess.run([sys.executable, "-m", "mpippo.launch", "-n", str(ranks), *extra, "--config", "configs/toy_cue.yaml",
                          "--no-progress", "--total-timesteps", "1024", "--output-dir", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return metrics(out)


@pytest.mark.mpi
def test_one_rank_sees_every_core(tmp_path):
    m = _launch(1, tmp_path / "one")
    assert m["affinity_cores"] == CORES and m["cpu_share"] == CORES
    assert m["threads_per_rank"] == CORES  # torch threads: the whole share


@pytest.mark.mpi
@pytest.mark.skipif(CORES < 2, reason="needs two cores to give two ranks one each")
def test_two_ranks_get_half_each(tmp_path):
    """Also with --oversubscribe given (as suites and older Makefiles did): Open MPI unbinds every
    rank with it, so the launcher drops it where the ranks fit."""
    m = _launch(2, tmp_path / "two", "--mpirun-args=--oversubscribe")
    assert m["affinity_cores"] == CORES // 2 and m["threads_per_rank"] == CORES // 2


@pytest.mark.mpi
def test_more_ranks_than_cores_share_them_unbound(tmp_path):
    m = _launch(CORES + 1, tmp_path / "over")
    assert m["affinity_cores"] == CORES  # unbound: the rank may run on any core
    assert m["cpu_share"] == 1 and m["threads_per_rank"] == 1


def test_placement_options(monkeypatch):
    from mpippo.launch import BINDING_ENV, placement
    for var in BINDING_ENV:
        monkeypatch.delenv(var, raising=False)
    assert placement(1, threads=None)[0] == ["--map-by", f"slot:PE={CORES}"]
    assert placement(CORES + 1)[0][:1] == ["--oversubscribe"]
    assert placement(1, ["--bind-to", "none"]) == ([], {})  # the user's own binding is left alone
    assert placement(1, ["--map-by=ppr:1:node"]) == ([], {})
    monkeypatch.setenv(BINDING_ENV[0], "none")
    assert placement(1) == ([], {})  # and so is a policy set in the environment
    assert placement(CORES + 1) == (["--oversubscribe"], {})  # but more ranks than cores still may start


def test_a_launcher_confined_to_some_cores_leaves_its_ranks_unbound(monkeypatch):
    """Open MPI would bind from core 0 whatever the launcher's own mask (taskset, a cpuset): the ranks
    stay unbound inside the mask instead."""
    from mpippo.launch import BINDING_ENV, placement
    for var in BINDING_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: CORES + 4)  # the node has more cores than this mask
    where, env = placement(1)
    assert where == ["--bind-to", "none"] and env
