"""Self-play under mpirun (1 learner + 2 actors): snapshots join the pool on schedule, reach the
actors and are played; the pool stays bounded; a resume restores it (members, frozen weights,
ratings) and the schedule goes on."""
import sys

import pytest
import torch

from conftest import error_lines, metrics, ok, run, trainer

pytestmark = pytest.mark.slow

EVERY, SIZE = 20, 3
SMALL = ["--config", "configs/dqn_selfplay.yaml", "--no-progress",
         "--set", f"selfplay.snapshot_interval_updates={EVERY}", "--set", f"selfplay.pool_size={SIZE}",
         "--set", "selfplay.eval_interval_updates=50", "--set", "selfplay.eval_games=20",
         "--set", "selfplay.sampling=uniform", "--set", "dqn.learning_starts=1000", "--set", "dqn.save_replay=true",
         "--set", "logging.tensorboard=false"]


def load(run_dir):
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)


def test_pool_schedule_bound_reaches_actors_and_survives_a_resume(tmp_path):
    run_dir = tmp_path / "run"
    res = ok(trainer(3, SMALL + ["--output-dir", str(run_dir), "--total-timesteps", "12000"], timeout=180))
    m = metrics(run_dir)
    sp = m["selfplay"]
    updates = m["updates"]
    # on schedule: member 0 at the start, then one every EVERY updates; bounded, the oldest dropped
    assert sp["snapshots_taken"] == updates // EVERY + 1
    assert [p["update"] for p in sp["pool"]] == [EVERY * k for k in range(updates // EVERY + 1)][-SIZE:]
    assert [p["id"] for p in sp["pool"]] == list(range(sp["snapshots_taken"]))[-SIZE:]
    assert sp["dropped"] == list(range(sp["snapshots_taken"] - SIZE))
    # reached the actors and played: the actors reported games against members made during the run
    # (only the learner's messages could have told them those weights)
    assert sum(p["games"] for p in sp["pool"]) > 0
    assert any(p["games"] > 0 for p in sp["pool"] if p["id"] > 0)
    assert sp["heuristics"]["random"]["games"] > 0 and sp["heuristics"]["lookahead"]["games"] > 0
    games = sum(p["games"] for p in sp["pool"]) + sum(h["games"] for h in sp["heuristics"].values())
    assert games <= m["episodes"]  # every rated game is a finished episode (dropped members' games uncounted)
    assert sp["illegal_moves"] == 0  # actors only pick legal columns
    assert [r["update"] for r in sp["ratings"]][0] == 0 and sp["ratings"][-1]["update"] == updates
    assert "self-play:" in res.stdout
    # the win-rate curve of the run
    import sys
    from conftest import run
    res = ok(run([sys.executable, "analysis/selfplay_curve.py", str(run_dir)], 60))
    assert (run_dir / "selfplay.png").stat().st_size > 10_000 and "pool: #" in res.stdout
    bad = run([sys.executable, "analysis/selfplay_curve.py", str(tmp_path)], 60)
    assert bad.returncode == 2 and "no benchmark_metrics.json" in bad.stderr

    # resume: the pool comes back as it was (ids, frozen weights, ratings), snapshots continue
    before = load(run_dir)["selfplay"]
    res = ok(trainer(3, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", "13024", "--no-progress"],
                     timeout=180))
    ids = [p["id"] for p in sp["pool"]]
    assert f"restored opponent pool of {SIZE} (ids {ids})" in res.stdout
    after = load(run_dir)["selfplay"]
    m2 = metrics(run_dir)
    sp2 = m2["selfplay"]
    assert m2["resumes"] == 1 and m2["total_timesteps"] == 13024 and m2["updates"] > m["updates"]
    assert sp2["snapshots_taken"] == m2["updates"] // EVERY + 1  # the schedule counts updates over both segments
    assert [p["id"] for p in sp2["pool"]] == list(range(sp2["snapshots_taken"]))[-SIZE:]
    assert sp2["ratings"][:len(sp["ratings"])] == sp["ratings"]  # the rating history continues
    old = {x["id"]: x for x in before["pool"]["members"]}
    kept = [mem for mem in after["pool"]["members"] if mem["id"] in old]
    assert kept  # 1,024 more steps (about 32 updates) make fewer than SIZE new snapshots
    for mem in kept:  # members from before the restart: the same frozen weights and ratings history
        assert (mem["params"] == old[mem["id"]]["params"]).all() and mem["update"] == old[mem["id"]]["update"]
    # restored members reached the actors again and were played after the resume
    assert any(mem["wdl"].sum() > old[mem["id"]]["wdl"].sum() for mem in kept)


def test_a_checkpoint_without_a_pool_is_refused_for_self_play(tmp_path):
    """(1 learner + 1 actor: the refusal is the learner's check of the checkpoint)"""
    run_dir = tmp_path / "run"
    ok(trainer(2, ["--config", "configs/dqn_connect4.yaml", "--output-dir", str(run_dir), "--total-timesteps", "2048",
                   "--set", "dqn.learning_starts=500", "--set", "logging.tensorboard=false"], timeout=120))
    before = (run_dir / "checkpoints" / "latest.pt").read_bytes()
    res = trainer(2, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", "4096",
                      "--set", "selfplay.enabled=true"], timeout=120)
    assert res.returncode == 2
    lines = error_lines(res.stderr)
    assert lines == ["mpippo: error: checkpoint: it has no opponent pool (trained without self-play); "
                     "resume it with selfplay.enabled=false"]  # once, one line
    assert (run_dir / "checkpoints" / "latest.pt").read_bytes() == before  # nothing written over
    video = tmp_path / "games.mp4"  # docs/selfplay.md's evaluation with a video: the boards drawn
    ok(run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "4",
            "--opponent", "lookahead", "--video", str(video), "--video-episodes", "2"], 120))
    import imageio.v2 as imageio
    assert imageio.get_reader(video).get_data(0).shape == (6 * 32, 7 * 32, 3)
