"""make bench end to end on a tiny job: component costs, the trainer under mpirun, the table, the result file."""
import json
import sys

import pytest

from conftest import ROOT, ok, run

pytestmark = pytest.mark.slow


def test_bench_prints_the_table_and_writes_its_result(tmp_path):
    out = tmp_path / "result.json"
    res = ok(run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--ranks", "1", "--envs-per-rank", "4",
                  "--n-steps", "16", "--minibatches", "2", "--iterations", "2", "--no-peers", "--no-bf16",
                  "--memory-iterations", "0", "--component-seconds", "0.1", "--gpu", "--out", str(out)], timeout=240))
    assert "ceiling (fp32" in res.stdout and "mpippo 1 rank(s) fp32" in res.stdout
    assert "malloc as is" in res.stdout  # the allocator baseline ran beside the default
    assert "no CUDA device here, GPU runs skipped" in res.stdout  # CI has no GPU; the device machine runs them
    r = json.loads(out.read_text())
    rows = {(x["ranks"], x["host_allocator"]): x for x in r["results"]}
    assert set(rows) == {(1, "retain"), (1, "system")}
    assert r["ceilings"]["fp32"]["alone"]["host_allocator"] == "retain"
    for x in rows.values():
        assert x["device"] == "cpu" and x["fps"] > 0 and abs(sum(x["phase_share"].values()) - 1) < 1e-6
        assert x["ceiling"] == pytest.approx(r["ceilings"]["fp32"]["ceiling_per_core"])
