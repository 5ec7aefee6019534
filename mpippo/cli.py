"""`python run_mpi.py ...`: parse -> validate on every rank -> agree -> train.

Start-up is split in phases, each ending in a step all ranks reach, so a problem found
on any rank ends every rank with the same one-line message and exit code 2, never a hang:
  A. every rank: parse the command line;
  B. rank 0: choose/check the run folder; broadcast the outcome;
  C. every rank: load and check the config, agree;
  D. every rank: build the trainer (rank 0 reads the checkpoint for everyone), agree again.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import sys
from pathlib import Path

import yaml

from mpippo import config as C
from mpippo import hostmem
from mpippo.checkpoint import LATEST, atomic_write_bytes, load_checkpoint, read_checkpoint_bytes, require_checkpoint
from mpippo.comm import World
from mpippo.errors import JobFailure
from mpippo.preemption import EXIT_FAILURE, EXIT_OK, EXIT_REQUEUE, EXIT_STOPPED, EXIT_USAGE, SignalFlags

EXIT_CODES = {"done": EXIT_OK, "duration": EXIT_OK, "requeue": EXIT_REQUEUE, "stopped": EXIT_STOPPED}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage wall
        raise C.ConfigError(f"command line: {message} (see --help)")


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="run_mpi.py", description="Synchronous data-parallel PPO on Procgen over MPI. "
                "Run as `mpirun -n K python run_mpi.py ...`, under srun, or as plain python (one rank).")
    p.add_argument("--config", help=f"YAML config (default: {C.DEFAULT_CONFIG.relative_to(C.DEFAULT_CONFIG.parent.parent)}; "
                   "with --resume: the run's own config.yaml)")
    p.add_argument("--total-timesteps", type=int, help="env steps over all ranks (training.total_timesteps)")
    p.add_argument("--duration", type=float, metavar="HOURS", help="wall-clock budget in hours (training.duration_hours)")
    p.add_argument("--num-envs", type=int, help="envs over all ranks, divided evenly (env.num_envs)")
    p.add_argument("--num-envs-per-rank", type=int, help="envs per rank; wins over --num-envs (env.num_envs_per_rank)")
    p.add_argument("--n-steps", type=int, help="rollout length per env (training.n_steps)")
    p.add_argument("--seed", type=int, help="base seed (training.seed)")
    p.add_argument("--device", help="cpu | cuda | auto (training.device)")
    p.add_argument("--output-dir", help="run folder (default: runs/<timestamp>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --output-dir from checkpoints/latest.pt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logging.progress=false)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config key, repeatable, e.g. --set training.learning_rate=3e-4")
    return p


FLAG_KEYS = {"total_timesteps": ("training", "total_timesteps"), "duration": ("training", "duration_hours"),
             "num_envs": ("env", "num_envs"), "num_envs_per_rank": ("env", "num_envs_per_rank"),
             "n_steps": ("training", "n_steps"), "seed": ("training", "seed"), "device": ("training", "device")}


def _overrides(args) -> list:
    out = [C.parse_override(item) for item in args.set]
    out += [(sec, key, getattr(args, flag)) for flag, (sec, key) in FLAG_KEYS.items() if getattr(args, flag) is not None]
    if args.no_progress:
        out.append(("logging", "progress", False))
    return out


def _agree_or_exit(world: World, errors: list[str] | None) -> None:
    """All ranks learn whether any rank failed; all exit 2 with the lowest failing rank's message."""
    every = world.allgather_obj(errors or None)
    failed = next((e for e in every if e), None)
    if failed:
        if world.is_root:
            for line in failed:
                sys.stderr.write(f"mpippo: error: {line}\n")
            sys.stderr.flush()
        sys.exit(EXIT_USAGE)


def _on_root(world: World, fn):
    """fn() on rank 0 only (file system decisions); every rank gets its result, or raises the
    same ConfigError, so the next agreement sees one verdict."""
    outcome = None
    if world.is_root:
        try:
            outcome = ("ok", fn())
        except C.ConfigError as e:
            outcome = ("error", e.errors)
    outcome = world.bcast_obj(outcome)
    if outcome[0] == "error":
        raise C.ConfigError(outcome[1])
    return outcome[1]


def _choose_run_dir(args) -> Path:
    """Rank 0 only: the run folder (checked: new and writable, or holding a checkpoint to resume)."""
    if args.output_dir:
        run_dir = Path(args.output_dir)
    else:
        run_dir = Path("runs") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if args.resume:
        if not (run_dir / "agent_0" / "checkpoints" / LATEST).is_file():  # several DQN agents: one folder each
            require_checkpoint(run_dir / "checkpoints" / LATEST)
        return run_dir
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise C.ConfigError(f"--output-dir: '{run_dir}' exists and is not empty; pass --resume to continue "
                            f"that run, or choose a new folder")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise C.ConfigError(f"--output-dir: cannot write to '{run_dir}' ({e.strerror})") from None
    return run_dir


def _ppo_checkpoint_bytes(run_dir: Path) -> bytes:
    if not (run_dir / "checkpoints" / LATEST).is_file():
        raise C.ConfigError(f"--resume: '{run_dir}' holds DQN agent checkpoints (agent_*/), not a PPO run")
    return read_checkpoint_bytes(run_dir / "checkpoints" / LATEST)


def main(argv: list[str] | None = None) -> int:
    return run(argv)[0]


def run(argv: list[str] | None = None) -> tuple[int, dict | None]:
    """The whole program; returns (exit code, this rank's summary: rank 0's run summary for PPO,
    each learner's metrics and each actor's counts for DQN)."""
    hostmem.configure()  # before the first large tensor (run_mpi.py did it already)
    world = World()
    world.install_abort_hook()
    signals = SignalFlags().install()  # from here on a signal is only a flag, acted on together
    argv = sys.argv[1:] if argv is None else argv

    # A. every rank parses and validates (same inputs -> same verdict; agreed anyway)
    args = overrides = None
    try:
        quiet = contextlib.redirect_stdout(io.StringIO()) if not world.is_root else contextlib.nullcontext()
        with quiet:
            args = make_parser().parse_args(argv)
        overrides = _overrides(args)
        errors = None
    except C.ConfigError as e:
        errors = e.errors
    if (bad_allocator := hostmem.error()):
        errors = (errors or []) + [bad_allocator]
    _agree_or_exit(world, errors)

    # B. rank 0 decides the run folder; everyone gets the outcome
    run_dir = errors = None
    try:
        run_dir = _on_root(world, lambda: _choose_run_dir(args))
    except C.ConfigError as e:
        errors = e.errors
    _agree_or_exit(world, errors)

    # C. config on every rank (the run's own config.yaml when resuming without --config), agreed
    # before any trainer is built: the trainers' constructors use collectives
    try:
        config_path = args.config
        if config_path is None and args.resume and (run_dir / "config.yaml").is_file():
            config_path = run_dir / "config.yaml"
        cfg_data = C.load_yaml(config_path or C.DEFAULT_CONFIG)
        cfg = C.resolve(C.build(cfg_data, overrides, world.size), world.size)
        world.set_collective_timeout(cfg.guards.collective_timeout_s)
    except C.ConfigError as e:
        errors = e.errors
    _agree_or_exit(world, errors)

    # D. checkpoint and trainer
    trainer = None
    try:
        if cfg.training.algo == "dqn":  # each learner reads its own agent's checkpoint
            from mpippo.runners.dqn import ApeXDQN
            trainer = ApeXDQN(cfg, world, run_dir, resume=args.resume)
        else:
            state = None
            if args.resume:  # rank 0 reads, every rank needs it (the per-rank states)
                path = run_dir / "checkpoints" / LATEST
                state = load_checkpoint(_on_root(world, lambda: _ppo_checkpoint_bytes(run_dir)), str(path))
            from mpippo.runners.sync_ppo import SyncPPO
            trainer = SyncPPO(cfg, world, run_dir, resume_state=state)
    except C.ConfigError as e:
        errors = e.errors
    _agree_or_exit(world, errors)

    if world.is_root:
        atomic_write_bytes(run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False).encode())
    if cfg.training.algo == "dqn":
        summary = trainer.train(signals)
        # every agent has written its outputs; all ranks exit with the same code. Agents may end
        # minutes apart, so this waits without the collective watchdog (a tiny pickled int, once).
        from mpippo.runners.dqn import STOP_REASONS
        from mpippo.comm.world import MPI
        code = STOP_REASONS.index(summary.get("stop_reason", "done"))
        code = world.comm.allreduce(code, op=MPI.MAX) if world.size > 1 else code
        if world.is_root and code:
            print(f"mpippo: {STOP_WHY[STOP_REASONS[code]]}", flush=True)
        return EXIT_CODES[STOP_REASONS[code]], summary
    if world.is_root:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        if trainer.resume_note:
            print(f"mpippo: {trainer.resume_note}", flush=True)
        verb = f"resuming at {trainer.global_step:,} steps" if args.resume else "starting"
        print(f"mpippo: {verb}: ppo on {cfg.env.name} ({cfg.env.distribution_mode}), {world.size} rank(s) x "
              f"{cfg.env.num_envs_per_rank} envs x {cfg.training.n_steps} steps = {trainer.batch_size:,} per update, "
              f"{trainer.threads} thread(s)/rank, device {trainer.device}; output {run_dir}", flush=True)
    try:
        summary = trainer.train(signals)
    except JobFailure as e:  # detected by all ranks together: one message, clean exit
        if world.is_root:
            sys.stderr.write(f"mpippo: error: {e}\n")
        return EXIT_FAILURE, None
    if world.is_root:
        print_summary(summary, run_dir)
    return EXIT_CODES[summary["stop_reason"]], summary


STOP_WHY = {"done": "run finished", "duration": "run finished (time budget reached)",
            "requeue": f"stopped by SIGUSR1 after a checkpoint; exit {EXIT_REQUEUE} asks the batch script to requeue",
            "stopped": f"stopped by a signal after a checkpoint (exit {EXIT_STOPPED}); continue with --resume"}


def print_summary(s: dict, run_dir: Path) -> None:
    ret = s.get("episode_return_mean")
    rows = [
        ("timesteps", f"{s['total_timesteps']:,} of {s['target_timesteps']:,}"),
        ("wall time", f"{s['duration_s']:.1f} s"),
        ("throughput", f"{s['fps']:.1f} steps/s over {s['world_size']} rank(s)"),
        ("return (last 100 ep.)", "-" if ret is None else f"{ret:.2f} over {s['episodes']:,} episodes"),
        ("peak memory", f"{s['peak_rss_mb_total']:.0f} MB total, {max(s['peak_rss_mb_per_rank']):.0f} MB max per rank"),
        ("phases (s, mean/rank)", ", ".join(f"{k} {v:.1f}" for k, v in s["phase_seconds"].items())),
        ("outputs", f"{run_dir}/ (config.yaml, logs/, checkpoints/, benchmark_metrics.json)"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"\nmpippo: {STOP_WHY[s['stop_reason']]}")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    sys.stdout.flush()
