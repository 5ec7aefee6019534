"""Python entry points, for scripts launched under mpirun:

    # train.py, run as: mpirun -n 8 python train.py
    from mpippo import train_dqn
    metrics = train_dqn(n_episodes=5000, episodes_per_batch=4, learning_steps_per_batch=8)

They map the familiar arguments of the earlier DQN trainer onto the config and run the same
code path as `run_mpi.py` (validation on every rank, the same errors and outputs).
"""
from __future__ import annotations

from pathlib import Path

from mpippo.config import DEFAULT_CONFIG


def train_dqn(n_episodes: int = 1000, num_workers: int | None = None, episodes_per_batch: int = 4,
              learning_steps_per_batch: int | None = None, device: str = "auto", *,
              config: str | Path | None = None, output_dir: str | Path | None = None,
              total_timesteps: int = 10**12, overrides: dict | None = None) -> dict | None:
    """Train Ape-X DQN on the ranks of this MPI job: rank 0 learns, the others act.

    n_episodes: stop once the actors finished this many episodes (dqn.max_episodes).
    num_workers: actor ranks expected (None: every rank but the learner); a mismatch with the
        job's size is an error, so a script never silently trains with fewer workers.
    episodes_per_batch, learning_steps_per_batch: the learner may do learning_steps_per_batch
        updates per episodes_per_batch finished episodes; None keeps dqn.replay_ratio.
    device: the learner's device, cpu | cuda | auto.
    config: a YAML config (default configs/dqn_procgen.yaml); overrides: {"section.key": value}.
    Returns the learner's metrics (benchmark_metrics.json) on the learner rank, None on actors.
    Exits with code 2 and a one-line message on bad input, like the command line.
    """
    from mpippo import cli  # the trainer and its MPI bindings: `import mpippo` loads neither

    sets = {"training.algo": "dqn", "training.device": device, "training.total_timesteps": total_timesteps,
            "dqn.max_episodes": n_episodes, "dqn.episodes_per_batch": episodes_per_batch,
            "dqn.learning_steps_per_batch": learning_steps_per_batch}
    if num_workers is not None:
        sets["dqn.num_agents"] = 1  # (the job's ranks: one learner and num_workers actors, checked by cli.run)
    sets.update(overrides or {})
    argv = ["--config", str(config or DEFAULT_CONFIG.parent / "dqn_procgen.yaml"), "--no-progress"]
    if output_dir is not None:
        argv += ["--output-dir", str(output_dir)]
    for key, value in sets.items():
        argv += ["--set", f"{key}={'null' if value is None else value}"]
    _, summary = cli.run(argv, workers=num_workers)
    return summary if summary is not None and summary.get("algo") == "dqn" else None
