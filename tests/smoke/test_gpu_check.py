"""make gpu-check's script, dry: every step of the GPU check on the CPU with tiny budgets (the real
run needs a GPU; it prints the same table with the GPU's numbers)."""
import json
import sys

import pytest

from conftest import ok, run

pytestmark = pytest.mark.slow  # about 1.5 minutes: left out by make test-fast


def test_gpu_check_dry_run_runs_every_step_and_writes_its_result(tmp_path):
    out = tmp_path / "gpu.json"
    res = ok(run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(out)], timeout=300))
    r = json.loads(out.read_text())
    checks = [row["check"] for row in r["rows"]]
    assert checks == ["ppo fp32, 1 rank", "ppo bf16, 1 rank", "ppo fp32, 2 ranks on one device",
                      "exact resume (2+2 vs 4 iterations)", "dqn learner", "appo learner"]
    assert all(row["ok"] and row["device"] == "cpu" for row in r["rows"]), r["rows"]
    assert r["rows"][3]["max_param_gap"] == 0.0  # bit-exact on the CPU
    assert r["dry_run"] is True and set(r["targets"]) == {"ppo_fp32_steps_per_s", "bf16_over_fp32",
                                                         "two_ranks_over_one", "dqn_samples_per_s",
                                                         "appo_samples_per_s"}
    assert all(c in res.stdout for c in checks)


def test_gpu_check_without_cuda_says_so():
    res = run([sys.executable, "benchmarks/gpu_check.py"], timeout=120)
    assert res.returncode == 2 and "no CUDA device here" in res.stderr and "Traceback" not in res.stderr
