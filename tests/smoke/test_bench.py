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
    assert "arithmetic (fp32)" in res.stdout and "of the kernel bound" not in res.stdout  # no 2-rank row here
    assert "malloc as is" in res.stdout  # the allocator baseline ran beside the default
    assert "no CUDA device here, GPU runs skipped" in res.stdout  # CI has no GPU; the device machine runs them
    r = json.loads(out.read_text())
    rows = {(x["ranks"], x["host_allocator"]): x for x in r["results"]}
    assert set(rows) == {(1, "retain"), (1, "system")}
    assert r["ceilings"]["fp32"]["alone"]["host_allocator"] == "retain"
    # the default's row: fp32 here unless this CPU computes bf16 natively (then the bf16 run, not made here)
    from mpippo import runctl
    native = runctl.bf16_native(__import__("torch").device("cpu"))[0]
    assert (r["default"] is None) if native else (r["default"]["precision"] == "fp32")
    # measured before and after the runs; the higher ceiling is the one used
    c, other = r["ceilings"]["fp32"], r["ceilings"]["fp32"]["other_measurement"]
    assert "component costs (fp32) again, after the runs" in res.stdout
    assert c["ceiling_per_core"] >= other["ceiling_per_core"] > 0
    for x in rows.values():
        assert x["device"] == "cpu" and x["fps"] > 0 and abs(sum(x["phase_share"].values()) - 1) < 1e-6
        assert x["ceiling"] == pytest.approx(r["ceilings"]["fp32"]["ceiling_per_core"])
        assert x["of_kernel_bound"] == pytest.approx(x["fps"] / r["ceilings"]["fp32"]["kernel_bound_per_core"])
    # the hooks' count of the default IMPALA-CNN, against the layer arithmetic written out
    conv = lambda hw, cin, cout: 2 * hw * hw * cin * cout * 9  # noqa: E731
    forward = (conv(64, 3, 16) + 4 * conv(32, 16, 16) + conv(32, 16, 32) + 4 * conv(16, 32, 32) + conv(16, 32, 32)
               + 4 * conv(8, 32, 32) + 2 * (2048 * 256 + 256 * 15 + 256))
    c = r["ceilings"]["fp32"]["alone"]
    assert c["flops_forward"] == forward
    assert c["flops_train"] == 3 * forward - conv(64, 3, 16)  # no input gradient for the frames
    assert c["flops_per_step"] == forward + c["epochs"] * c["flops_train"]
