"""One vocabulary of metrics: both layouts (sync PPO; the actor-learner layout with DQN and APPO)
write every key of mpippo/metrics/keys.py into benchmark_metrics.json, with its documented type, and
the docs (docs/outputs.md) list exactly those keys."""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT, fake_wandb, metrics, ok, run, trainer
from mpippo.files import write_metrics
from mpippo.metrics import keys, tags

RUNS = {
    "ppo": (None, ["--config", "configs/toy_cue.yaml", "--total-timesteps", "1024"]),
    "a2c": (None, ["--config", "configs/a2c_toy.yaml", "--total-timesteps", "1024"]),
    "dqn": (3, ["--config", "configs/dqn_toy.yaml", "--total-timesteps", "3000", "--set", "dqn.learning_starts=500"]),
    "appo": (3, ["--config", "configs/appo_toy.yaml", "--total-timesteps", "2048"]),
}


@pytest.mark.mpi
@pytest.mark.parametrize("algo", list(RUNS))
def test_every_layout_writes_every_common_key(algo, tmp_path):
    ranks, args = RUNS[algo]
    ok(trainer(ranks, [*args, "--no-progress", "--output-dir", str(tmp_path / "run")]))
    m = metrics(tmp_path / "run")
    assert keys.problems(m) == []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "run" / "logs"))
    acc.Reload()
    written = set(acc.Tags()["scalars"])
    from mpippo.algos import registry
    # every tag is the vocabulary's; the losses are exactly the ones the registry entry names
    assert {t for t in written if t.startswith("losses/")} == {tags.loss(q) for q in registry.get(algo).logs}
    known = {t for table in (tags.CHARTS, tags.LOSSES, tags.LEARNER) for t, _ in table.values()}
    assert {t for t in written if not t.startswith(("time/", "selfplay/"))} <= known, written - known
    if algo in ("ppo", "a2c"):  # and the keys only sync PPO writes (the straggler statistics)
        assert keys.problems(m, keys.SYNC_PPO) == [] and m["straggler_iterations"] == m["iterations"]
    else:  # the learner's: its phases add up to its time, and it did update
        assert keys.problems(m, keys.ACTOR_LEARNER) == []
        assert set(m["phase_seconds"]) == {"ingest", "wait", "update", "send", "checkpoint", "log", "other"}
        assert sum(m["phase_seconds"].values()) == pytest.approx(m["duration_s"], rel=0.02)
        assert m["phase_seconds"]["update"] > 0 and sum(m["phase_share"].values()) == pytest.approx(1.0, rel=0.02)
        assert {tags.learner_phase(p) for p in m["phase_seconds"]} <= written
    assert m["algo"] == algo and m["finished"] is True and m["stop_reason"] == "done"
    assert len(m["peak_rss_mb_per_rank"]) == (ranks or 1) and all(x > 50 for x in m["peak_rss_mb_per_rank"])
    assert m["peak_rss_mb_total"] == pytest.approx(sum(m["peak_rss_mb_per_rank"]))


def test_problems_names_what_is_missing_or_mistyped():
    good = {k: {"str": "x", "int": 1, "number": 1.5, "bool": True, "list": []}[kind.rstrip("?")]
            for k, (kind, _) in keys.COMMON.items()}
    assert keys.problems(good) == []
    bad = dict(good, world_size=True, fps="fast")
    del bad["env"]
    assert keys.problems(bad) == ["env: missing", "world_size: expected int, got True", "fps: expected number, got 'fast'"]


def test_the_docs_document_exactly_these_keys():
    readme = (ROOT / "docs" / "outputs.md").read_text()
    assert keys.make_doc() in readme and keys.make_doc(keys.SYNC_PPO) in readme


def test_weights_and_biases_offline_keeps_one_run_across_a_resume(tmp_path):
    """logging.wandb=offline: the run under <run>/wandb/ (for `wandb sync`), its id kept in the run
    folder, so the resumed segment continues the same W&B run."""
    import wandb  # noqa: F401 (pinned in requirements.txt: present wherever make test runs)
    run_dir = tmp_path / "run"
    args = ["--config", "configs/toy_cue.yaml", "--no-progress", "--output-dir", str(run_dir),
            "--set", "logging.wandb=offline"]
    ok(trainer(None, [*args, "--total-timesteps", "1024"]))
    run_id = (run_dir / "wandb-id").read_text().strip()
    ok(trainer(None, [*args, "--resume", "--total-timesteps", "2048"]))
    segments = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(segments) == 2 and all(p.name.endswith(f"-{run_id}") for p in segments)
    assert all((p / f"run-{run_id}.wandb").stat().st_size > 0 for p in segments)


WANDB_FAILS_LATER = """
class Settings:
    def __init__(self, **kw): pass
class Run:
    logged = 0
    def log(self, row, step):
        Run.logged += 1
        if Run.logged > 3:
            raise OSError(28, 'No space left on device')
    def finish(self, exit_code=None):
        raise RuntimeError('wandb-core exited')
def init(**kw):
    return Run()
"""


def test_a_weights_and_biases_failure_mid_run_is_one_warning_and_the_run_goes_on(tmp_path):
    """W&B failing after start (its disk full, its service gone) costs W&B's charts, never the run."""
    run_dir = tmp_path / "run"
    res = ok(run([sys.executable, "run_mpi.py", "--config", "configs/toy_cue.yaml", "--no-progress", "--total-timesteps",
                  "2048", "--output-dir", str(run_dir), "--set", "logging.wandb=online"], 180,
                 env=fake_wandb(tmp_path, WANDB_FAILS_LATER)))
    warned = [x for x in res.stderr.splitlines() if x.startswith("mpippo: warning: logging.wandb")]
    assert warned == ["mpippo: warning: logging.wandb: W&B failed logging to it (OSError: [Errno 28] No space left on "
                      "device); TensorBoard and benchmark_metrics.json go on without it"], res.stderr[-2000:]
    assert "Traceback" not in res.stderr and metrics(run_dir)["finished"] is True
    assert any((run_dir / "logs").iterdir())


def test_weights_and_biases_without_the_package_is_one_line(monkeypatch):
    from mpippo import config as C
    monkeypatch.setattr(C.checks, "wandb_missing", lambda: True)
    with pytest.raises(C.UsageError, match="logging.wandb: 'offline' needs the wandb package"):
        C.build({}, [("logging", "wandb", "offline")], 1)
    assert C.build({"logging": {"wandb": False}}, [], 1).logging.wandb == "off"  # YAML's bare `off`


def test_a_weights_and_biases_failure_at_the_end_is_one_warning(tmp_path, capsys):
    """The run is done when W&B fails to close it (its service gone): one warning, no traceback."""
    from mpippo import config as C
    from mpippo.metrics.sinks import Sinks

    class Closing:
        logged = []

        def log(self, row, step):
            self.logged.append((row, step))

        def finish(self, exit_code=None):
            raise RuntimeError("wandb-core exited with code 255")
    cfg = C.build({}, [("logging", "tensorboard", False), ("logging", "wandb", "offline")], 1)
    sinks = Sinks(cfg, tmp_path, None, wandb_run=Closing())
    sinks.add_scalar("charts/episodic_return", 1.5, 7)
    sinks.close()
    assert Closing.logged == [({"charts/episodic_return": 1.5}, 7)] and sinks.wb is None
    assert capsys.readouterr().err == ("mpippo: warning: logging.wandb: W&B failed closing its run (RuntimeError: "
                                       "wandb-core exited with code 255); TensorBoard and benchmark_metrics.json go "
                                       "on without it\n")


def test_the_one_writer_says_what_a_layout_left_out_and_still_writes_the_file(tmp_path, capsys):
    good = {k: {"str": "x", "int": 1, "number": 1.5, "bool": True, "list": [], "dict": {}}[kind.rstrip("?")]
            for table in (keys.COMMON, keys.ACTOR_LEARNER) for k, (kind, _) in table.items()}
    assert write_metrics(tmp_path, good, keys.ACTOR_LEARNER) == good and capsys.readouterr().err == ""
    bad = dict(good)
    del bad["phase_seconds"]
    write_metrics(tmp_path, bad, keys.ACTOR_LEARNER)
    assert "benchmark_metrics.json: phase_seconds: missing" in capsys.readouterr().err
    assert metrics(tmp_path) == bad  # written all the same: it holds the run's figures
