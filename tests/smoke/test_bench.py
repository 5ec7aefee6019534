"""make bench end to end on a tiny job: component costs, the trainer under mpirun, the table, the result file."""
import json
import sys

import pytest

from conftest import ROOT, ok, run

pytestmark = pytest.mark.slow


def test_bench_prints_the_table_and_writes_its_result(tmp_path, monkeypatch):
    # as on a CPU without native bf16 (AVX2 kernels, auto -> fp32), whatever this one has: the branch
    # that bf16 machines never took (test_default_row_is_the_run_auto_would_choose has the other)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
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
    # the default's row: the fp32 run of the most ranks, as auto chose fp32 here
    assert r["default"]["precision"] == "fp32" and r["default"]["fps"] == rows[(1, "retain")]["fps"]
    assert r["default"]["why"].startswith("precision auto -> fp32: ")
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


def test_components_take_the_env_and_network_of_a_config():
    """components.py on Atari: configs/ppo_atari.yaml's Nature CNN on 84x84x4 frames and its 4 epochs;
    the hooks' count (the same arithmetic times the fastest convolution) against the layers written out."""
    res = ok(run([sys.executable, str(ROOT / "benchmarks" / "components.py"), "--config", "configs/ppo_atari.yaml",
                  "--env", "atari:Pong", "--envs-per-rank", "2", "--minibatch", "16", "--seconds", "0.05"], timeout=120))
    c = json.loads(res.stdout.strip().splitlines()[-1])
    conv = lambda hw_out, k, cin, cout: 2 * hw_out * hw_out * cin * cout * k * k  # noqa: E731
    first = conv(20, 8, 4, 32)  # 84 -> 20 at stride 4: the strided convolutions count their output's points
    forward = first + conv(9, 4, 32, 64) + conv(7, 3, 64, 64) + 2 * (3136 * 512 + 512 * 6 + 512)  # Pong: 6 actions
    assert (c["env"], c["epochs"]) == ("atari:Pong", 4)
    assert c["flops_forward"] == forward and c["flops_train"] == 3 * forward - first
    assert c["env_step_s"] > 0 and c["kernel_bound_per_core"] == pytest.approx(c["conv_peak_flops_rate"] / c["flops_per_step"])


def test_default_row_is_the_run_auto_would_choose():
    """Both branches on every machine: native bf16 -> the bf16 run (None when none ran), else fp32."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench
    bf, fp = {"precision": "bf16", "fps": 2.0}, {"precision": "fp32", "fps": 1.0, "vs_cleanrl": 3.0}
    assert bench.default_row(bf, fp, True, "CPU flag amx_bf16") == {
        "precision": "bf16", "why": "precision auto -> bf16: CPU flag amx_bf16", "fps": 2.0, "vs_cleanrl": None}
    assert bench.default_row(bf, fp, False, "no flag")["fps"] == 1.0
    assert bench.default_row(None, fp, True, "CPU flag amx_bf16") is None
    assert bench.default_row(bf, None, False, "no flag") is None
