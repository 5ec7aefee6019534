"""Hostile inputs to the actor-learner layouts (Ape-X DQN, APPO, self-play), one table on the shared
harness (hostile.py): huge sizes of the dqn, appo and selfplay sections, learning rates that overflow
or make the loss non-finite, and combinations under which no update could ever happen.

Config cases are refused before training (exit 2, one `mpippo: error:` line naming the value and what
is allowed, nothing written). A learning rate that makes the loss diverge is a run that fails: the
learner skips the non-finite steps, and after guards.max_nonfinite_skips of them in a row it stops
its actors and the job exits 1 with one line, no traceback, no MPI abort, no final checkpoint.
The cases run two at a time (2 ranks each under mpirun, a learner and an actor: both roles meet the
input; a second actor only added a rank's start); each has its own test.
"""
from __future__ import annotations

import json

import pytest

import hostile
from hostile import Case

DQN = ["--config", "configs/dqn_toy.yaml", "--no-progress"]
APPO = ["--config", "configs/appo_toy.yaml", "--no-progress"]
SELFPLAY = ["--config", "configs/dqn_selfplay.yaml", "--no-progress"]


def train(base: list[str], *sets: str, extra=(), output: str = "out", ranks: int = 2):
    """2 ranks (a learner, an actor) of the trainer with `--set` overrides; TMP/<output> is the run folder."""
    def setup(tmp, shared):
        argv = ["run_mpi.py", *base, *extra, "--output-dir", f"{tmp}/{output}"]
        for item in sets:
            argv += ["--set", item]
        return ranks, argv
    return setup


def failed_without_a_checkpoint(tmp) -> bool:
    """What a diverged run leaves: its metrics say failed; no checkpoint of the diverged weights."""
    m = json.loads((tmp / "run" / "benchmark_metrics.json").read_text())
    return (m["stop_reason"] == "failed" and m["nonfinite_skips"] >= 3
            and not (tmp / "run" / "checkpoints" / "latest.pt").exists())


SHORT_DQN = ("--total-timesteps", "3000")
CASES = [
    # ---- huge dqn sizes ----
    Case("dqn-huge-buffer", train(DQN, "dqn.buffer_size=1000000000000"), "lower dqn.buffer_size"),
    Case("dqn-huge-inflight", train(DQN, "dqn.max_inflight=1000000000"), "lower dqn.chunk_size, dqn.max_inflight"),
    Case("dqn-huge-batch", train(DQN, "dqn.batch_size=1000000000000"),
         "dqn.batch_size: 1,000,000,000,000 is above dqn.buffer_size=20,000"),
    Case("dqn-huge-n-step", train(DQN, "dqn.n_step=1000000000"), "fewer than dqn.n_step=1,000,000,000"),
    # ---- huge appo sizes ----
    Case("appo-huge-batch", train(APPO, "appo.batch_segments=1000000000", "appo.num_minibatches=1"),
         "appo.batch_segments: 1,000,000,000 segments per update, but the actors make only 2,560"),
    Case("appo-huge-batch-memory", train(APPO, "appo.batch_segments=100000000", "appo.num_minibatches=1",
                                         "training.total_timesteps=1000000000000"),
         "lower appo.batch_segments, appo.rollout_length"),
    Case("appo-huge-rollout", train(APPO, "appo.rollout_length=1000000000"), "no segment would ever be made"),
    Case("appo-huge-inflight", train(APPO, "appo.max_inflight=1000000000"), "lower appo.chunk_size, appo.max_inflight"),
    # ---- huge selfplay sizes ----
    Case("selfplay-huge-pool", train(SELFPLAY, "selfplay.pool_size=1000000000000"), "lower selfplay.pool_size"),
    Case("selfplay-huge-eval-games", train(SELFPLAY, "selfplay.eval_games=1000000000000"),
         "selfplay.eval_games: must be in [1, 100000], got 1000000000000"),
    Case("selfplay-huge-network", train(SELFPLAY, "model.hidden_size=10000000"),
         "lower selfplay.pool_size, model.hidden_size, model.channels"),
    Case("selfplay-huge-elo-k", train(SELFPLAY, "selfplay.elo_k=1e18"), "selfplay.elo_k: must be in [0, 400], got 1e+18"),
    # ---- learning rates: overflowing, non-finite, diverging ----
    Case("lr-dqn-1e308", train(DQN, "training.learning_rate=1e308"), "training.learning_rate: 1e+308 is out of range"),
    Case("lr-appo-inf", train(APPO, "training.learning_rate=.inf"),
         "training.learning_rate: must be a finite number, got inf"),
    Case("lr-dqn-diverges", train(DQN, "training.learning_rate=1e15", "dqn.learning_starts=500", extra=SHORT_DQN,
                                  output="run"),
         "agent 0: the TD loss or its gradient was not finite", code=1, check=failed_without_a_checkpoint),
    Case("lr-appo-diverges", train(APPO, "training.learning_rate=1e15", extra=("--total-timesteps", "2048"),
                                   output="run"),
         "agent 0: the APPO loss or its gradient was not finite", code=1, check=failed_without_a_checkpoint),
    Case("lr-two-dqn-agents-diverge", train(DQN, "training.learning_rate=1e15", "dqn.learning_starts=500",
                                            "dqn.num_agents=2", extra=("--total-timesteps", "6000"), output="run",
                                            ranks=4),
         "(and 1 other agent(s) failed)", code=1),  # two failing agents: still one line for the job
    # ---- impossible combinations: no update could ever happen ----
    Case("combo-dqn-starts-above-buffer", train(DQN, "dqn.learning_starts=30000"),
         "dqn.learning_starts: 30,000 is above dqn.buffer_size=20,000"),
    Case("combo-dqn-starts-beyond-budget", train(DQN, "dqn.learning_starts=3000", extra=SHORT_DQN),
         "dqn.learning_starts: 3,000 is not below the transitions the actors make over the budget"),
    Case("combo-dqn-replay-ratio", train(DQN, "dqn.replay_ratio=0.001"), "= 0 updates over the budget"),
    Case("combo-dqn-chunk-beyond-actor", train(DQN, "dqn.chunk_size=1000000"),
         "dqn.chunk_size: 1,000,000 transitions per message, but each actor makes only 24,000"),
    Case("combo-appo-chunk-beyond-batch", train(APPO, "appo.chunk_size=100"),
         "appo.chunk_size: a message of 100 segments is more than the learner keeps between two updates"),
]


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict:
    return hostile.outcomes(request, tmp_path_factory, CASES, "test_hostile_layout_input", lambda: {})


@pytest.mark.parametrize("case", hostile.params(CASES))
def test_hostile_layout_input(case: Case, outcomes):
    hostile.check(case, outcomes[case.id].result())


def test_every_case_class_is_covered():
    """The issue's classes, at least two cases each."""
    for prefix in ("dqn-huge-", "appo-huge-", "selfplay-huge-", "lr-", "combo-"):
        assert sum(c.id.startswith(prefix) for c in CASES) >= 2, prefix
    assert sum(c.code == 1 for c in CASES) >= 2  # diverging runs, one per learner
