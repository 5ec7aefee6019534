"""Python entry points, for scripts launched under mpirun:

    # train.py, run as: mpirun -n 8 python train.py
    from mpippo import train_dqn
    metrics = train_dqn(n_episodes=5000, episodes_per_batch=4, learning_steps_per_batch=8)

They map the familiar arguments of the earlier DQN trainer onto the config and run the same
code path as `run_mpi.py` (validation on every rank, the same errors and outputs). A call leaves
the caller's process as it found it: its signal handlers, and no lock on the run folder.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path

import yaml

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
    config: a YAML config (default configs/dqn_procgen.yaml); overrides: {"section.key": value},
        values as Python gives them (None, strings, lists, dicts).
    Returns the learner's metrics (benchmark_metrics.json) on the learner rank, None on actors.
    Exits with code 2 and a one-line message on bad input, like the command line. An exception on
    any rank (a user's env failing) ends the whole job, as it does the command line's: the other
    ranks cannot train on without it.
    """
    from mpippo import cli, preemption, runlock  # the trainer and its MPI bindings: `import mpippo` loads neither

    sets = {"training.algo": "dqn", "training.device": device, "training.total_timesteps": total_timesteps,
            "dqn.max_episodes": n_episodes, "dqn.episodes_per_batch": episodes_per_batch,
            "dqn.learning_steps_per_batch": learning_steps_per_batch}
    if num_workers is not None:
        sets["dqn.num_agents"] = 1  # (the job's ranks: one learner and num_workers actors, checked by cli.run)
    argv = _argv(sets, overrides, num_workers, config, output_dir)
    before = runlock.held()
    with preemption.lent_signals(), _consoles_open():
        try:
            _, summary = cli.run(argv, workers=num_workers)
        except (Exception, KeyboardInterrupt) as e:  # fail-stop: a caller's `except` had left the others hung
            sys.excepthook(type(e), e, e.__traceback__)  # (cli.run's: one line and the job's end, any rank)
            raise
        finally:
            runlock.let_go(runlock.held() - before)  # (a later call, or run_mpi.py, may resume the folder)
    return summary if summary is not None and summary.get("algo") == "dqn" else None


@contextlib.contextmanager
def _consoles_open():
    """A caller's closed sys.stdout or sys.stderr (a closed StringIO) writes to /dev/null for the call, as a
    console nobody reads: the first print had ended rank 0 in a ValueError traceback, the others hung."""
    saved = sys.stdout, sys.stderr
    swapped = [name for name in ("stdout", "stderr") if getattr(getattr(sys, name), "closed", False)]
    for name in swapped:
        setattr(sys, name, open(os.devnull, "w"))
    try:
        yield
    finally:
        for name in swapped:
            getattr(sys, name).close()
        sys.stdout, sys.stderr = saved


def _argv(sets: dict, overrides, num_workers, config, output_dir) -> list[str]:
    """The command line of the call (each value as YAML, as a config file gives it: what --set reads back),
    or one line and exit 2 for an argument of the wrong kind."""
    problems = []
    if threading.current_thread() is not threading.main_thread():
        problems.append(f"train_dqn: called in thread '{threading.current_thread().name}'; call it in the main "
                        f"thread (stop and requeue signals reach only that one)")
    if not (overrides is None or isinstance(overrides, dict) and all(isinstance(k, str) for k in overrides)):
        problems.append(f"overrides: expected a dict of 'section.key' strings to values, got {type(overrides).__name__}")
    elif (algo := (overrides or {}).get("training.algo", "dqn")) != "dqn":
        problems.append(f"overrides: training.algo {algo!r}: train_dqn trains dqn; run run_mpi.py for {algo}")
    if num_workers is not None and (type(num_workers) is not int or num_workers < 1):
        problems.append(f"num_workers: expected a whole number >= 1 or None, got {num_workers!r}")
    for name, value in (("config", config), ("output_dir", output_dir)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            problems.append(f"{name}: expected a path (str or pathlib.Path) or None, got {type(value).__name__}")
    argv = ["--config", str(config or DEFAULT_CONFIG.parent / "dqn_procgen.yaml"), "--no-progress"]
    if output_dir is not None and not problems:
        argv += ["--output-dir", os.path.expanduser(os.fspath(output_dir))]
    for key, value in {**sets, **(overrides if isinstance(overrides, dict) else {})}.items():
        try:
            text = yaml.safe_dump(_plain(value), default_flow_style=True, width=2**30).strip()
        except yaml.YAMLError:  # (a numpy scalar, an object: not a value a config holds)
            problems.append(f"{key}: {value!r} ({type(value).__name__}) is not a config value; give a number, "
                            f"a string, a bool, None, or a list or dict of them")
            continue
        argv += ["--set", f"{key}={text.removesuffix(chr(10) + '...')}"]  # (a scalar's document end)
    if problems:
        sys.stderr.write(f"mpippo: error: {problems[0]}\n")
        raise SystemExit(2)
    return argv


def _plain(value):
    """Tuples as lists (YAML's safe form), within lists and dicts too; other values as they are."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
