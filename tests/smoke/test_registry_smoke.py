"""Every registered algorithm, run for real through the command line: a few updates, a checkpoint,
a resume that finishes a larger budget, and an evaluation of the checkpoint. A new registry entry
is covered by being registered (its toy config: configs/<name>_toy.yaml, else configs/toy_cue.yaml)."""
import json
import sys

import pytest

from conftest import ROOT, metrics, ok, run, trainer
from mpippo.algos import registry

pytestmark = pytest.mark.slow  # two 2-rank runs and an evaluation per algorithm


def toy_config(name: str) -> str:
    own = ROOT / "configs" / f"{name}_toy.yaml"
    return str(own.relative_to(ROOT)) if own.exists() else "configs/toy_cue.yaml"


@pytest.mark.parametrize("name", registry.NAMES)
def test_every_algorithm_trains_checkpoints_resumes_and_evaluates(tmp_path, name):
    entry, run_dir = registry.get(name), tmp_path / "run"
    # 2 ranks: two replicas (sync) or a learner and an actor (actor-learner)
    ok(trainer(2, ["--config", toy_config(name), "--set", f"training.algo={name}", "--output-dir", str(run_dir),
                   "--total-timesteps", "2048", "--no-progress", "--set", "logging.tensorboard=false"], timeout=120))
    first = metrics(run_dir)
    assert first["algo"] == name and first["total_timesteps"] == 2048
    assert (run_dir / "checkpoints" / "latest.pt").exists()

    res = ok(trainer(2, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", "4096"], timeout=120))
    assert "resuming at 2,048" in res.stdout
    assert metrics(run_dir)["total_timesteps"] == 4096

    out = tmp_path / "eval.json"
    ok(run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "4",
            "--num-envs", "4", "--json", str(out)], 120))
    r = json.loads(out.read_text())
    assert r["algo"] == name and r["episodes"] == 4 and r["trained_timesteps"] == 4096
    assert r["deterministic"] == entry.greedy_eval  # Q-values act greedily, a policy samples
