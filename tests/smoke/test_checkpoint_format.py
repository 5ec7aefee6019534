"""Checkpoint formats (ckpt_schema.FORMAT, `upgrade`): files written before the format key existed
(format 1, committed under tests/data/checkpoints/format1/: a sync PPO run, an Ape-X DQN and an APPO
agent, toy-cue with a tiny network) load, upgraded, in the trainer's check, resume to a larger budget
and evaluate; today's files say their format; a file of a newer format is one line, exit 2."""
import io
import shutil
import sys

import pytest
import torch

from conftest import ROOT, metrics, ok, run, trainer
from mpippo import ckpt_schema
from mpippo.checkpoint import load_checkpoint, safe_globals

SAMPLES = ROOT / "tests" / "data" / "checkpoints" / "format1"
RANKS = {"ppo": None, "dqn": 3, "appo": 3}


def raw(path):
    """A checkpoint's dict as written, not checked or upgraded (the numpy types mpippo saves allowed)."""
    with torch.serialization.safe_globals(safe_globals()):
        return torch.load(path, weights_only=True)


@pytest.mark.parametrize("algo", list(RANKS))
def test_a_format_1_checkpoint_is_upgraded_and_checked(algo):
    assert "format" not in raw(SAMPLES / algo / "checkpoints" / "latest.pt")  # what the writers wrote before the key existed
    state = load_checkpoint((SAMPLES / algo / "checkpoints" / "latest.pt").read_bytes(), "sample", algo)
    assert state["format"] == ckpt_schema.FORMAT and state["algo"] == algo


@pytest.mark.parametrize("algo", list(RANKS))
def test_a_format_1_run_resumes_under_todays_code_and_writes_todays_format(algo, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(SAMPLES / algo, run_dir)
    before = metrics(run_dir)["total_timesteps"]
    ok(trainer(RANKS[algo], ["--resume", "--output-dir", str(run_dir), "--no-progress",
                             "--total-timesteps", str(2 * before)], timeout=300))
    assert metrics(run_dir)["total_timesteps"] >= 2 * before - 64
    assert raw(run_dir / "checkpoints" / "latest.pt")["format"] == ckpt_schema.FORMAT
    res = ok(run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "2"], 120))
    assert "toy-cue" in res.stdout


def test_a_newer_format_is_refused_in_one_line(tmp_path):
    state = raw(SAMPLES / "ppo" / "checkpoints" / "latest.pt")
    run_dir = tmp_path / "run"
    shutil.copytree(SAMPLES / "ppo", run_dir)
    buf = io.BytesIO()
    torch.save({**state, "format": ckpt_schema.FORMAT + 1}, buf)
    (run_dir / "checkpoints" / "latest.pt").write_bytes(buf.getvalue())
    res = run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "2"], 120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"format: {ckpt_schema.FORMAT + 1} is newer than this mpippo reads (1 to {ckpt_schema.FORMAT})" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
