"""make gpu-check's script, dry: every step of the GPU check on the CPU with tiny budgets (the real
run needs a GPU; it prints the same table with the GPU's numbers). Rates are never asserted: the
targets are the benchmark's to report, reached or not."""
import json
import sys

import pytest

from conftest import ROOT, ok, run

pytestmark = pytest.mark.slow  # 40-50 s on an idle 2-core machine (95 s with both cores busy): not in make test-fast

PPO = ["ppo fp32, 1 rank, deterministic", "ppo fp32, 1 rank, fast kernels", "ppo bf16, 1 rank, deterministic",
       "ppo bf16, 1 rank, fast kernels", "ppo bf16, 1 rank, deterministic, eager policy step",
       "ppo fp32, 2 ranks on one device, deterministic", "ppo bf16 on Atari (Nature CNN), 1 rank, fast kernels"]
NODE = ["6-GPU node: six independent 1-rank runs (modeled)", "6-GPU node: one synchronous 6-rank run (modeled)"]
ALONE = ["dqn learner alone (prefilled replay, no actors)", "dqn learner alone on Atari (the Nature CNN, 84x84x4)",
         "appo learner alone (prefilled segments, no actors)",
         "ppo iteration profile (torch.profiler)"]
END = ["dqn learner + 2 actors (end to end)", "appo learner + 3 actors (end to end)",
       "exact resume (2+2 vs 4 iterations)"]
PHASES = {"env_step", "inference", "update", "allreduce", "other"}
PLACEMENT = {"affinity_cores", "cpu_share", "threads_per_rank", "env_threads", "device_used", "precision",
             "deterministic", "policy_step"}


def test_gpu_check_dry_run_runs_every_step_and_writes_its_result(tmp_path):
    """Started in another folder than the repository's (its default configs are the repository's: they
    were looked for in the working folder)."""
    out = tmp_path / "gpu.json"
    res = ok(run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--out", str(out)], timeout=400,
                 cwd=tmp_path))
    r = json.loads(out.read_text())
    rows = {row["check"]: row for row in r["rows"]}
    assert [row["check"] for row in r["rows"]] == PPO + NODE + ALONE + END
    assert r["dry_run"] is True and r["complete"] is True
    assert all(row["ok"] and "error" not in row for row in r["rows"]), [row for row in r["rows"] if not row["ok"]]
    assert all(row["device"] == "cpu" for c, row in rows.items() if c not in NODE)
    for name in PPO:  # the phases and the placement facts of every PPO row
        row = rows[name]
        assert row["steps_per_s"] > 0 and row["iteration_s"] > 0
        assert set(row["phases"]["seconds_per_iteration"]) == PHASES == set(row["phases"]["share"])
        assert abs(sum(row["phases"]["share"].values()) - 1.0) < 1e-6
        assert set(row["placement"]) == PLACEMENT and row["placement"]["device_used"] == "cpu"
        assert row["precision"] == name.split()[1].rstrip(",") and row["deterministic"] == ("deterministic" in name)
        assert row["placement"]["policy_step"] == "eager"  # the CPU never graphs it
    assert rows[PPO[5]]["ranks"] == 2 and rows[PPO[5]]["envs_per_rank"] == rows[PPO[0]]["envs_per_rank"]
    indep, sync = rows[NODE[0]], rows[NODE[1]]
    assert indep["modeled"] and sync["modeled"] and "modeled" == indep["device"] == sync["device"]
    assert indep["by_precision"]["bf16"] == pytest.approx(6 * rows[PPO[2]]["steps_per_s"])
    batch = rows[PPO[0]]["iteration_s"] * rows[PPO[0]]["steps_per_s"]  # env steps per rank and iteration
    ring = 5 * max(sync["allreduce_2_ranks_s"] - sync["allreduce_1_rank_s"], 0.0)
    assert sync["allreduce_6_ranks_s"] == pytest.approx(ring)
    assert sync["by_precision"]["fp32"] == pytest.approx(6 * batch / (batch / rows[PPO[0]]["steps_per_s"] + ring))
    assert "T1" in sync["model"] and "8" in indep["model"]
    for name in ALONE[:3] + END[:2]:
        assert rows[name]["samples_per_s"] > 0 and rows[name]["batch"] > 0
    dqn = rows[ALONE[0]]
    assert dqn["samples_per_s"] == pytest.approx(dqn["updates"] * dqn["batch"] / dqn["seconds"])
    assert rows[ALONE[1]]["config"] == "configs/dqn_atari.yaml"
    prof = rows[ALONE[3]]
    table = tmp_path / "gpu-profile.txt"
    assert r["profile"] == prof["table"] == table.name and table.stat().st_size < 300_000
    assert "one PPO iteration on cpu" in table.read_text() and prof["top_ops"]
    assert rows[END[2]]["max_param_gap"] == 0.0  # bit-exact on the CPU
    assert set(r["targets"]) == {"one_rank_bf16_steps_per_s", "one_rank_fp32_steps_per_s",
                                 "node_six_independent_runs_steps_per_s", "node_one_sync_6_rank_run_steps_per_s",
                                 "dqn_learner_alone_samples_per_s", "appo_learner_alone_samples_per_s"}
    assert all(isinstance(t["reached"], bool) and t["value"] > 0 for t in r["targets"].values())
    assert set(r["deterministic_cost"]) == {"fp32", "bf16"}
    gain = r["cuda_graph_gain"]
    assert gain["over_eager"] == pytest.approx(rows[PPO[2]]["steps_per_s"] / rows[PPO[4]]["steps_per_s"])
    assert gain["eager_inference_s_per_iteration"] == rows[PPO[4]]["phases"]["seconds_per_iteration"]["inference"]
    assert all(c in res.stdout for c in PPO + NODE + ALONE + END) and "targets (issue 28)" in res.stdout


def test_gpu_check_without_cuda_says_so():
    res = run([sys.executable, "benchmarks/gpu_check.py"], timeout=120)
    assert res.returncode == 2 and "no CUDA device here" in res.stderr and "Traceback" not in res.stderr
