"""benchmarks/learner_bench.py, the learners alone (make gpu-check's learner-only rows), on the CPU with
tiny sizes: the DQN learner over a prefilled replay and the APPO learner over prefilled segments, no
actors. Only that they run and count what they measure; their rates are the benchmark's to report."""
import json
import sys

import pytest

from conftest import ok, run

TINY = ["--", "--set", "model.channels=[4]", "--set", "model.hidden_size=16", "--set", "appo.batch_segments=4",
        "--set", "appo.rollout_length=8"]


def test_learners_alone_run_and_count_their_samples(tmp_path):
    out = tmp_path / "learners.json"
    res = ok(run([sys.executable, "benchmarks/learner_bench.py", "--device", "cpu", "--threads", "1", "--what", "dqn",
                  "appo", "--dqn-batch", "16", "--dqn-prefill", "200", "--seconds", "0.2", "--out", str(out), *TINY],
                 timeout=120))
    r = json.loads(out.read_text())
    assert json.loads(res.stdout.strip().splitlines()[-1]) == r
    dqn, appo = r["dqn"], r["appo"]
    assert dqn["device"] == appo["device"] == "cpu" and dqn["finite"] and appo["finite"]
    assert dqn["batch"] == 16 and dqn["replay_size"] == 200 and dqn["updates"] >= 3
    assert dqn["samples_per_s"] == pytest.approx(dqn["updates"] * 16 / dqn["seconds"])
    assert (appo["batch_segments"], appo["rollout_length"], appo["batch"]) == (4, 8, 32) and appo["updates"] >= 2
    # samples count the epochs, as a run's learner_samples_per_s does; env steps do not
    assert appo["samples_per_s"] == pytest.approx(appo["updates"] * 32 * appo["epochs"] / appo["seconds"])
    assert appo["env_steps_per_s"] == pytest.approx(appo["samples_per_s"] / appo["epochs"])
    assert 0 <= appo["ingest_share"] < 1


def test_the_atari_dqn_learner_runs_on_its_own_frames(tmp_path):
    """configs/dqn_atari.yaml's learner (the Nature CNN) on 84x84x4 frames and Pong's 6 actions."""
    out = tmp_path / "atari.json"
    ok(run([sys.executable, "benchmarks/learner_bench.py", "--device", "cpu", "--threads", "1", "--what", "dqn_atari",
            "--dqn-batch", "8", "--dqn-prefill", "100", "--seconds", "0.2", "--out", str(out), "--",
            "--set", "model.hidden_size=16"], timeout=120))
    r = json.loads(out.read_text())["dqn_atari"]
    assert r["config"] == "configs/dqn_atari.yaml" and r["finite"] and r["batch"] == 8 and r["updates"] >= 1
    assert r["samples_per_s"] == pytest.approx(r["updates"] * 8 / r["seconds"])


def test_bad_input_is_one_line(tmp_path):
    res = run([sys.executable, "benchmarks/learner_bench.py", "--dqn-batch", "0"], timeout=60)
    assert res.returncode == 2 and "--dqn-batch: 0 is out of range" in res.stderr and "Traceback" not in res.stderr
    res = run([sys.executable, "benchmarks/learner_bench.py", "--device", "cpu", "--what", "profile"], timeout=60)
    assert res.returncode == 2 and "--profile-out: needed" in res.stderr
