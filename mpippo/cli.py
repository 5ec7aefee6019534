"""`python run_mpi.py ...`: parse -> validate on every rank -> agree -> train.

Start-up is split in phases, each ending in a step all ranks reach, so a problem found
on any rank ends every rank with the same one-line message and exit code 2, never a hang:
  A. every rank: parse the command line;
  B. rank 0: choose/check the run folder; broadcast the outcome;
  C. every rank: load and check the config (and its memory floor), agree;
  D. every rank: build the trainer (rank 0 reads the checkpoint for everyone), agree again.
Each agreement also carries the signal flags (installed by run_mpi.py's first line): a
SIGUSR1 or SIGTERM during start-up ends the job there, exit 3 or 4, nothing trained or
written. A bad-input or signal exit removes the run folder if this job created it and it is
still empty. torch loads only in phase D, so bad input is refused within a second or two.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import signal
import sys
import tempfile
from pathlib import Path

import yaml

from mpippo import config as C
from mpippo import envs, faults, hostmem, preemption, runctl, runlock
from mpippo.checkpoint import (CHECKPOINTS, LATEST, checkpoint_dir, checkpoint_size, latest_missing, latest_path,
                               load_checkpoint, reading_problem, read_checkpoint_bytes, require_checkpoint, sweep_partial)
from mpippo.files import LOGS, RUN_CONFIG, absolute, atomic_write_bytes, is_number, missing_folders, not_utf8, remove_if_empty
from mpippo.comm import World
from mpippo.envs import gym as gym_envs
from mpippo.errors import JobFailure, in_users_code_since, os_reason, run_folder_is, say_last
from mpippo.usage import Parser, file_kind, one_line, refusal
from mpippo.preemption import EXIT_FAILURE, EXIT_REQUEUE, EXIT_STOPPED, EXIT_USAGE, SignalFlags


def make_parser() -> argparse.ArgumentParser:
    p = Parser(prog="run_mpi.py", description=f"Reinforcement learning over MPI on Procgen, Atari, Gymnasium and PettingZoo envs (training.algo: "
                f"{', '.join(C.ALGOS)}). Run as `mpirun -n K python run_mpi.py ...`, under srun, or as plain python "
                "(one rank).")
    p.add_argument("--config", help=f"YAML config (default: {C.DEFAULT_CONFIG.relative_to(C.DEFAULT_CONFIG.parent.parent)}; "
                   "with --resume: the run's own config.yaml)")
    p.add_argument("--total-timesteps", type=int, help="env steps over all ranks (training.total_timesteps)")
    p.add_argument("--duration", type=float, metavar="HOURS", help="wall-clock budget in hours (training.duration_hours)")
    p.add_argument("--num-envs", type=int, help="envs over all ranks, divided over them, rounded up (env.num_envs)")
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


class _StartUp:
    """What start-up must undo if it ends early: the run folder this job created (while empty)."""

    def __init__(self, world: World, signals: SignalFlags):
        self.world, self.signals = world, signals
        self.created: list[Path] = []  # folders made by this job, outermost first
        self.locked: list[Path] = []  # the folders whose locks rank 0 holds: the run's, each agent's
        self.undo: list = []  # this rank's undo of what it began (a W&B run), called before anything else
        self.exiting = False  # agree_or_exit is ending start-up: the start-up watch leaves it to it
        # a start-up held in the user's code this long ends (one rank): the default's until the config is known
        self.hang_s = runctl.startup_timeout(C.GuardsConfig().collective_timeout_s)
        self.asked: C.Config | None = None  # the config as asked, before the job resolved it (config.yaml)

    def agree_or_exit(self, errors: list[str] | None) -> None:
        """All ranks learn whether any rank failed or got a signal; all exit together: 2 with the
        lowest failing rank's message, else 3 (SIGUSR1) or 4 (SIGTERM/SIGINT) if a signal came."""
        every = self.world.allgather_obj((errors or None, self.signals.requeue, self.signals.stop))
        failed = next((e for e, _, _ in every if e), None)
        requeue, stop = any(r for _, r, _ in every), any(s for _, _, s in every)
        if not (failed or requeue or stop):
            if self.world.is_root:  # every rank got here, so all catch signals (creating it again: harmless)
                preemption.announce_listening()
            return
        self.exiting = True
        for undo in self.undo:  # every rank first, then rank 0 removes what is left empty
            undo()
        self.world.barrier()
        if self.world.is_root:
            self._leave_nothing()
            if failed:
                sys.stderr.write(refusal(failed))
            else:
                code = EXIT_REQUEUE if requeue else EXIT_STOPPED
                say_last(f"mpippo: {'SIGUSR1' if requeue else 'a stop signal'} arrived during start-up: nothing "
                         f"was trained yet and nothing is saved; exit {code} (a requeued job starts afresh)")
            sys.stderr.flush()
        sys.exit(EXIT_USAGE if failed else EXIT_REQUEUE if requeue else EXIT_STOPPED)

    def _leave_nothing(self) -> None:
        for folder in reversed(self.locked):  # each lock file as it was: nothing new is left
            runlock.release(folder)
        remove_if_empty(self.created)

    def watched(self):
        """One rank: a start-up held in the user's code (a hang in its env's constructor or first reset)
        still ends on a stop (runctl.watch_startup). Several ranks: the others' start-up collectives
        time out on a held rank, and end the job naming it."""
        if self.world.size > 1:
            return contextlib.nullcontext()
        wanted = (*self.signals.stops, signal.SIGUSR1)
        log = preemption.unheard(lambda came: next((sig for sig in came if sig in wanted), None))

        def seen() -> int | None:  # (0: a stop whose signal no log names, a Python API caller's)
            flagged = signal.SIGUSR1 if self.signals.requeue else 0 if self.signals.stop else None
            return (log() if log is not None else None) or flagged
        return runctl.watch_startup(seen, self._end_held, held=in_users_code_since, hang_s=lambda: self.hang_s,
                                    end_hung=self._end_hung)

    def _end_hung(self, lasted: float) -> None:
        """The start-up watch's end of a start-up held in the user's code past its timeout, no stop asked."""
        self._end_from_watch(EXIT_FAILURE, lambda at: (
            f"mpippo: error: {runctl.held_words(lasted)}{at}: ending it; nothing was trained yet and nothing is saved"))

    def _end_held(self, sig: int) -> None:
        """The start-up watch's end of a start-up held in the user's code after a stop."""
        code = EXIT_REQUEUE if sig == signal.SIGUSR1 else EXIT_STOPPED
        self._end_from_watch(code, lambda at: (
            f"mpippo: {signal.Signals(sig).name if sig else 'a stop signal'} arrived during start-up, which is "
            f"held{at} and has not gone on for {runctl.STOP_GRACE_S:g} s: ending it; nothing was trained yet and "
            f"nothing is saved; exit {code}"))

    def _end_from_watch(self, code: int, line) -> None:
        """From the watch's thread, the main thread held: what agree_or_exit leaves (the lock as it was, no new
        empty folder), then line(where the main thread is) and exit `code`; unless agree_or_exit is ending
        start-up itself (its undo goes first)."""
        if self.exiting:
            return
        with contextlib.suppress(Exception):
            self._leave_nothing()
        runctl.end_held(self.world, code, line)


def _choose_run_dir(args, start: _StartUp) -> Path:
    """Rank 0 only: the run folder (checked: new and writable, or holding a checkpoint to resume),
    locked for this job (one writer per run folder). Folders it makes are appended to
    `start.created`; any file-system error is one line."""
    if args.output_dir == "":  # (`--output-dir "$UNSET"`: not the default folder in silence)
        raise C.UsageError("--output-dir: '' is empty; give a folder, or leave the option out for runs/<date-time>")
    run_dir = Path(args.output_dir) if args.output_dir else (
        Path("runs") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    full = absolute(run_dir, "--output-dir")  # now: a user's env may change the working folder (os.chdir)
    if (why := not_utf8(full)):  # before anything is made: TensorBoard's writer fails on it
        where = "" if run_dir.is_absolute() else f" (in full, from the current folder: '{C.show(str(full))[1:-1]}')"
        raise C.UsageError(f"--output-dir: '{C.show(str(run_dir))[1:-1]}' cannot be used: {why}{where}, and "
                           f"TensorBoard's event files need a UTF-8 path; choose another name")
    try:
        return _check_run_dir(full, args.resume, start)
    except OSError as e:  # a name too long, a read-only or full file system, permissions
        raise C.UsageError(f"--output-dir: '{C.show(str(run_dir))[1:-1]}' cannot be used ({os_reason(e)})") from None


def _check_run_dir(run_dir: Path, resume: bool, start: _StartUp) -> Path:
    if resume:
        if run_dir.is_dir():  # first: a run still training there may not have written its checkpoint yet
            _lock(run_dir, start)
        _not_inside_a_live_run(run_dir)
        if not latest_path(C.agent_folder(run_dir, 0, 2)).is_file():  # several agents (DQN, APPO): one folder each
            require_checkpoint(latest_path(run_dir))
        _resume_writable(run_dir)
        return run_dir
    if run_dir.exists() and not run_dir.is_dir():  # (a file, a device: /dev/null)
        raise C.UsageError(f"--output-dir: '{C.show(str(run_dir))[1:-1]}' is {file_kind(run_dir.stat().st_mode)}, "
                           f"not a folder; choose a new folder")
    if run_dir.exists() and any(p.name != runlock.LOCK_NAME for p in run_dir.iterdir()):
        if (who := runlock.holder(run_dir)):
            raise runlock.FolderBusy(f"--output-dir: '{run_dir}' is in use: {who} is training there; one writer "
                                     f"per run folder: choose a new folder")
        raise C.UsageError(f"--output-dir: '{run_dir}' exists and is not empty; {_what_to_do_with(run_dir)}")
    _not_inside_a_live_run(run_dir)
    start.created.extend(missing_folders(run_dir))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_probe(run_dir)
    except OSError as e:
        raise C.UsageError(f"--output-dir: cannot write to '{run_dir}' ({os_reason(e)})") from None
    _lock(run_dir, start)
    return run_dir


def _write_probe(folder: Path) -> None:
    """OSError where a file cannot be made in `folder`. The probe has a name of its own (another trainer may
    probe the same new folder this instant; one killed here leaves what sweep_partial removes)."""
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".write_test.")
    os.close(fd)
    os.unlink(probe)


def _resume_writable(run_dir: Path) -> None:
    """A resume writes in the run folder, its checkpoints/ and logs/, and each agent's: a restored copy with
    one of them read-only had failed an iteration in (checkpoints/) or in TensorBoard's thread (logs/, a
    traceback). One line now, before anything is written."""
    for top in (run_dir, *sorted(run_dir.glob("agent_*"))):
        for folder in (top, checkpoint_dir(top), top / LOGS):
            if not folder.is_dir():
                continue
            try:
                _write_probe(folder)
            except OSError as e:
                raise C.UsageError(f"--resume: '{folder}' cannot be written ({os_reason(e)}), "
                                   f"and the run writes its checkpoints and logs there: make it writable "
                                   f"(chmod -R u+w), or copy the run to a folder you can write") from None


def _what_to_do_with(run_dir: Path) -> str:
    """The advice for a folder a fresh run may not write in: --resume only where there is a checkpoint (a
    run that failed before its first had been sent to --resume, which sent it back)."""
    if latest_path(run_dir).is_file() or latest_path(C.agent_folder(run_dir, 0, 2)).is_file():
        return "pass --resume to continue that run, or choose a new folder"
    if (newest := latest_missing(checkpoint_dir(run_dir))):  # (its latest.pt lost in a copy: not "no checkpoint")
        return f"it holds a run without its {LATEST}, but {newest}, then pass --resume; or choose a new folder"
    if (run_dir / RUN_CONFIG).is_file():
        return ("it holds a run that wrote no checkpoint, so there is nothing to resume: choose a new folder, or "
                "move that one aside (its logs are kept there)")
    return "it holds no run of mpippo's: choose a new folder"


def _not_inside_a_live_run(run_dir: Path) -> None:
    """A run folder inside another live run's folder would mix two writers' files (that run may set its
    folder aside, copy it, or meet a name it writes): refused. (A suite's folder is not a run's: its
    members train inside it.)"""
    if (found := runlock.held_above(run_dir)):
        above, who = found
        raise runlock.FolderBusy(f"--output-dir: '{C.show(str(run_dir))[1:-1]}' is inside '{C.show(str(above))[1:-1]}', "
                                 f"a folder in use: {who} holds its lock; one writer per run folder: choose a folder "
                                 f"outside it")


def _lock(run_dir: Path, start: _StartUp, what: str = "--output-dir") -> None:
    """Hold a folder's lock for the job's life: a second trainer there is refused in one line. So is its
    checkpoints/ where it links elsewhere (a larger file system): a copy of the run (cp -r keeps the link)
    shares it, and had written the original's checkpoints while it trained. What killed writers left is
    swept once both are held: never a live writer's file met through the link."""
    held = runlock.acquire(run_dir, what)
    if held:
        start.locked.append(run_dir)
    ckpts = checkpoint_dir(run_dir)
    if ckpts.is_symlink() and ckpts.is_dir() and os.path.realpath(ckpts) != os.path.realpath(run_dir):
        where = (f"{what}: {CHECKPOINTS}/ links to '{os.path.realpath(ckpts)}' (a copy of a run shares what its "
                 f"links point to), and")
        linked = runlock.acquire(ckpts, where)
        if linked:
            start.locked.append(ckpts)
        held = held and linked
    if held and (note := sweep_partial(run_dir)):  # (held: no other writer can be mid-write there)
        print(f"mpippo: note: {note}", flush=True)


def _lock_agents(run_dir: Path, cfg: C.Config, start: _StartUp) -> None:
    """Rank 0 only: each agent's folder of a multi-agent job locked too (made if new), so that no
    other job resumes one agent's run while this one trains it."""
    if not C.actor_learner(cfg) or (n := C.layout_section(cfg).num_agents) < 2:
        return
    for k in range(n):
        folder = C.agent_folder(run_dir, k, n)
        try:
            start.created.extend(missing_folders(folder))
            folder.mkdir(parents=True, exist_ok=True)
            _lock(folder, start, f"--output-dir: agent {k}'s folder")
        except OSError as e:
            raise C.UsageError(f"--output-dir: agent {k}'s folder '{C.show(str(folder))[1:-1]}' cannot be used "
                               f"({os_reason(e)})") from None


def _resume_state(world: World, run_dir: Path, cfg: C.Config, start: _StartUp) -> dict:
    """The sync run's checkpoint: rank 0 measures it, every rank asks its own node's memory for the copies
    that node's ranks will hold (agreed: a node short of it refuses instead of being killed in the bcast),
    then rank 0 reads it for everyone (each rank's own read could meet another latest.pt)."""
    path, errors = latest_path(run_dir), None
    try:
        size = runctl.on_root(world, lambda: _sync_checkpoint_size(run_dir, cfg.training.algo))
        if (problem := reading_problem(path, size, world.local_size)):
            raise C.UsageError(problem)
    except C.UsageError as e:
        errors = e.errors
    start.agree_or_exit(errors)
    data = runctl.on_root(world, lambda: read_checkpoint_bytes(path, world.local_size))
    return load_checkpoint(data, str(path), cfg.training.algo)


def _sync_checkpoint_size(run_dir: Path, algo: str) -> int:
    if not run_dir.is_dir():  # (checked at phase B: moved or deleted since)
        raise C.UsageError(f"--output-dir: the run folder '{run_dir}' is gone: moved or deleted during start-up; if "
                           f"it was moved, --resume there")
    if not latest_path(run_dir).is_file() and any(latest_path(a).is_file() for a in run_dir.glob("agent_*")):
        raise C.UsageError(f"--resume: '{run_dir}' holds actor-learner agent checkpoints (agent_*/), not a "
                            f"{algo} run")
    return checkpoint_size(latest_path(run_dir))


def _console_lines() -> None:
    """Each console line leaves the process when printed: a Slurm job's log is a file, where Python
    would hold the progress lines in an 8 KB buffer (minutes of a run) unless PYTHONUNBUFFERED is set."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if hasattr(stream, "reconfigure") and not getattr(stream, "line_buffering", True):
                stream.reconfigure(line_buffering=True)
        except (ValueError, OSError):  # a closed console (the Python API's caller's), or one that cannot flush
            pass


def main(argv: list[str] | None = None) -> int:
    return run(argv)[0]


def run(argv: list[str] | None = None, workers: int | None = None) -> tuple[int, dict | None]:
    """The whole program; returns (exit code, this rank's summary: rank 0's run summary for PPO,
    each learner's metrics and each actor's counts for DQN). `workers`: the actor ranks the Python
    API's caller expects (train_dqn's num_workers), refused unless the job has them."""
    signals = preemption.install()  # run_mpi.py did it first thing; the Python API gets it here
    _console_lines()
    hostmem.configure()  # before the first large tensor (run_mpi.py did it already)
    world = World()
    signals.install()  # again: MPI_Init set its own SIGHUP handler (a hangup did nothing)
    world.install_abort_hook()
    start = _StartUp(world, signals)
    gym_envs.quiet_start_up(not world.is_root)  # every rank makes the same env: its warnings said once
    try:
        with start.watched():
            args, overrides = _parse(world, sys.argv[1:] if argv is None else argv, start, workers)
            run_dir = _run_dir(world, args, start)
            run_folder_is(run_dir)  # (a file of it not found later: the folder moved away, said so)
            cfg, note = _config(world, args, overrides, run_dir, start)
            trainer = _trainer(world, args, cfg, run_dir, start)
    finally:  # (the Python API's caller may start another run in this process)
        gym_envs.quiet_start_up(False)
    if (undone := signals.reclaim() + gym_envs.undone()) and world.is_root:  # the envs' code ran: undone
        print(f"mpippo: warning: the env's code {' and '.join(undone)}; mpippo's is back "
              f"(a stop or a requeue checkpoints as usual)", flush=True)
    runctl.end_startup_gc_pause()
    if note and world.is_root:
        print(f"mpippo: note: {note}", flush=True)
    if (unread := C.ignored_note(cfg)) and world.is_root:
        print(f"mpippo: warning: {unread}", flush=True)
    if C.actor_learner(cfg):  # dqn, appo: learners and actors
        world.set_collective_timeout(cfg.guards.collective_timeout_s)  # (their start-ups talk: p2p.talking_while)
        return _train_actor_learner(world, trainer, signals)
    if world.is_root:
        if trainer.resume_note:
            print(f"mpippo: {trainer.resume_note}", flush=True)
        if (over := budget_note(cfg, trainer.global_step, trainer.batch_size, world.size)) is not None:
            print(f"mpippo: note: {over}", flush=True)
        verb = f"resuming at {trainer.global_step:,} steps" if args.resume else "starting"
        mode = f" ({cfg.env.distribution_mode})" if "distribution_mode" in envs.family(cfg).keys else ""
        print(f"mpippo: {verb}: {cfg.training.algo} on {cfg.env.name}{mode}, {world.size} rank(s) x "
              f"{cfg.env.num_envs_per_rank} envs x {cfg.training.n_steps} steps = {trainer.batch_size:,} per update, "
              f"{trainer.threads} thread(s)/rank, {placement_words(world, trainer)}, device {trainer.device}, "
              f"{cfg.training.precision} ({trainer.precision_why}){', deterministic' if cfg.training.deterministic and trainer.device.type == 'cuda' else ''}"
              f"{', policy step as a CUDA graph' if trainer.policy_step.mode == 'graph' else ''}"
              f"; output {one_line(run_dir)}", flush=True)
    try:
        with runctl.watch_alone(trainer.timer, cfg.guards.collective_timeout_s if world.size == 1 else 0, world.abort,
                                stop_due=preemption.unheard(preemption.second_ctrl_c_in),
                                stop_end=lambda _: world.interrupted()):
            summary = trainer.train(signals)
    except JobFailure as e:  # detected by all ranks together: one message, clean exit
        if world.is_root:
            sys.stderr.write(refusal([str(e)]))
        return EXIT_FAILURE, None
    if world.is_root:
        print_summary(summary, run_dir)
    return runctl.RunResult(summary["stop_reason"], summary).exit_code, summary


def _parse(world: World, argv: list[str], start: _StartUp, workers: int | None = None):
    """A. every rank parses and validates (same inputs -> same verdict; agreed anyway)."""
    args = overrides = errors = None
    try:
        quiet = contextlib.redirect_stdout(io.StringIO()) if not world.is_root else contextlib.nullcontext()
        with quiet:
            args = make_parser().parse_args(argv)
        overrides = _overrides(args)
        errors = _launched_wrongly(args, overrides, world.size) or None
        if workers is not None and workers != world.size - 1:  # (beside what the launch check said, if anything)
            errors = (errors or []) + [f"num_workers: {workers} actor rank(s), but this job has {world.size} rank(s), a learner and "
                      f"{world.size - 1} actor(s); allowed: {world.size - 1}, or a job of {workers + 1} ranks "
                      f"(mpirun -n {workers + 1})"]
    except C.UsageError as e:
        errors = e.errors
    environment = [e for e in (hostmem.error(), faults.ERROR) if e]  # (variables set beside the command)
    start.agree_or_exit((errors or []) + environment or None)
    return args, overrides


def _launched_wrongly(args, overrides: list, world_size: int) -> list[str]:
    """parallel.expected_world_size (the Slurm scripts' --set, or the --config file's), asked before
    the run folder is touched: srun without PMIx starts N jobs of one rank each, and all N would race
    for the same folder's lock (the loser's "in use" line, or srun killing the rest, hid the real
    mistake). A file that cannot be read, or a value of the wrong type, is left to phase C's checks."""
    asked = [v for sec, key, v in overrides if (sec, key) == ("parallel", "expected_world_size")]
    value = asked[-1] if asked else None
    if not asked and args.config is not None:
        try:
            section = C.load_yaml(args.config).get("parallel")
            value = section.get("expected_world_size") if isinstance(section, dict) else None
        except (C.UsageError, OSError, AttributeError):
            return []
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > C.INT64_MAX:
        return []
    return C.world_size_problems(value, world_size)


def _run_dir(world: World, args, start: _StartUp) -> Path:
    """B. rank 0 decides the run folder; everyone gets the outcome."""
    run_dir = errors = None
    try:
        run_dir = runctl.on_root(world, lambda: _choose_run_dir(args, start))
    except C.UsageError as e:
        errors = e.errors
    start.agree_or_exit(errors)
    return run_dir


def _config(world: World, args, overrides, run_dir: Path, start: _StartUp):
    """C. the config on every rank (the run's own config.yaml when resuming without --config), and
    what this node can hold; agreed before any trainer is built (their constructors use collectives).
    Returns (config, a note when the envs that run differ from those asked for)."""
    cfg = note = errors = None
    try:
        if args.config is None and args.resume:
            if not (run_dir / RUN_CONFIG).is_file():  # the defaults in its place had changed every setting in silence
                raise C.UsageError(f"--resume: '{run_dir / RUN_CONFIG}' is missing, and a resume "
                                   f"continues with the run's own settings: copy it back from where the run came "
                                   f"from, or pass --config with the run's settings")
            data = C.with_earlier_defaults(C.load_yaml(run_dir / RUN_CONFIG, ours=True))  # the run's own, as it ran
            C.check_saved_imports(data, overrides)
        else:
            data = C.load_yaml(args.config or C.DEFAULT_CONFIG)
        asked = start.asked = C.build(data, overrides, world.size)
        cfg = C.resolve(asked, world.size)
        note = C.envs_note(asked, cfg, world.size)
        errors = C.host_problems(cfg, world.size, world.local_size) or None
        start.hang_s = runctl.startup_timeout(cfg.guards.collective_timeout_s)
        world.set_collective_timeout(start.hang_s)
    except C.UsageError as e:
        errors = e.errors
    except OSError as e:  # the run folder vanished or became unreadable since phase B
        errors = [f"config file: cannot read it ({os_reason(e)})"]
    start.agree_or_exit(errors)
    try:
        runctl.on_root(world, lambda: _lock_agents(run_dir, cfg, start))
    except C.UsageError as e:
        errors = e.errors
    start.agree_or_exit(errors)
    return cfg, note


def _trainer(world: World, args, cfg: C.Config, run_dir: Path, start: _StartUp):
    """D. checkpoint (rank 0 reads it for everyone; every rank checks it) and trainer; then rank 0
    records the config in the run folder (config.layout.saved_form)."""
    trainer = errors = None
    faults.start_delay(world.rank)  # tests only: MPIPPO_FAULT kind=slow_start
    try:
        if C.actor_learner(cfg):  # each learner reads its own agent's checkpoint
            from mpippo.runners.actor_learner import ActorLearnerRun  # torch: after the config is agreed
            runctl.freeze_imports()
            trainer = ActorLearnerRun(cfg, world, run_dir, resume=args.resume)
        else:
            from mpippo.runners.sync import SyncTrainer  # torch: after the config is agreed
            runctl.freeze_imports()
            state = _resume_state(world, run_dir, cfg, start) if args.resume else None
            trainer = SyncTrainer(cfg, world, run_dir, resume_state=state)
    except C.UsageError as e:
        errors = e.errors
    start.agree_or_exit(errors)
    try:  # before config.yaml is written: a refused W&B run leaves the folder as it was
        if (began := trainer.start_wandb()) is not None:
            start.undo.append(began.undo)
    except C.UsageError as e:
        errors = e.errors
    start.agree_or_exit(errors)
    try:
        # config.yaml says what ran: a resume at its budget trains nothing, and keeps the file as it is
        keep = args.resume and _at_budget(trainer, cfg, world)
        runctl.on_root(world, lambda: None if keep and (run_dir / RUN_CONFIG).is_file() else _write_config(run_dir, cfg, start.asked))
    except C.UsageError as e:
        errors = e.errors
    start.agree_or_exit(errors)
    return trainer


def _at_budget(trainer, cfg: C.Config, world: World) -> bool:
    """A resume with nothing left to train (its budget reached: it only says so). In the actor-learner
    layout an agent's ranks know its steps only: the job agrees that no actor has a step left."""
    if not C.actor_learner(cfg):
        return trainer.global_step >= cfg.training.total_timesteps
    return not world.agree([int(trainer.actor_steps() > 0)])[0]


def _write_config(run_dir: Path, cfg: C.Config, asked: C.Config) -> None:
    try:
        atomic_write_bytes(run_dir / RUN_CONFIG, yaml.safe_dump(C.saved_form(cfg, asked), sort_keys=False).encode())
        if not C.actor_learner(cfg):  # (a learner makes its agent's folder)
            checkpoint_dir(run_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise C.UsageError(f"--output-dir: writing '{run_dir / 'config.yaml'}' failed ({os_reason(e)})") from None


def _train_actor_learner(world: World, trainer, signals: SignalFlags) -> tuple[int, dict]:
    summary = trainer.train(signals)
    # every agent has written its outputs; all ranks exit with the same code: the most urgent
    # reason of any agent. Agents may end minutes apart, so this waits outside the watchdog.
    result = runctl.RunResult(runctl.URGENCY[world.max_unwatched(runctl.urgency(summary.get("stop_reason", "done")))],
                              summary)
    errors = [e for e in world.allgather_obj(summary.get("error")) if e]  # learners that failed: one line per job
    if world.is_root and errors:
        more = f" (and {len(errors) - 1} other agent(s) failed)" if len(errors) > 1 else ""
        sys.stderr.write(refusal([f"{errors[0]}{more}"]))
        sys.stderr.flush()
    if world.is_root and result.stop_reason != "done":
        print(f"mpippo: {runctl.STOP_WHY[result.stop_reason]}", flush=True)
    return result.exit_code, summary


def budget_note(cfg: C.Config, done: int, batch: int, ranks: int) -> str | None:
    """The sync layout trains whole updates: a budget that is not a whole number of them from here ends
    past it, said at start (a budget below one update ran it once, 16,384 steps for 2,048, without a
    word), as is a budget reached already (runctl.spent_note). None where it is whole, where the balanced
    cut-off varies the update's size (on more than one rank), and in timed training (its budget is a cap,
    often far off)."""
    t = cfg.training
    if (spent := runctl.spent_note(f"training.total_timesteps {t.total_timesteps:,}", t.total_timesteps, done,
                                   max(t.total_timesteps - done, 0))) is not None:
        return spent
    end = runctl.budget_end(cfg, done, batch, ranks)
    if end is None or end == t.total_timesteps:
        return None
    return (f"training.total_timesteps {t.total_timesteps:,} is not a whole number of updates of {batch:,} env steps "
            f"(envs x n_steps) from {done:,}: the run ends at {end:,}, after {(end - done) // batch:,} update(s)")


def placement_words(world: World, trainer) -> str:
    """Where rank 0 runs, for the start-up line: the cores it may use (its affinity mask), its
    share of them, and the env threads it gives its envs (procgen's; ale-py runs at least one)."""
    cores = f"{world.affinity} core(s) in its affinity" + (f", {world.cpu_share} its share" if world.cpu_share !=
                                                           world.affinity else "")
    return f"rank 0: {cores}, {trainer.env_threads} env thread(s)"


def print_summary(s: dict, run_dir: Path) -> None:
    """The run's summary; a figure the metrics file lacks or holds in another type (the file of a
    finished run, edited by hand, is shown as it is, never rewritten) is a '-'."""
    def num(v, spec: str = ",") -> str:
        return format(v, spec) if is_number(v) else "-"
    rss = s.get("peak_rss_mb_per_rank")
    per_rank = [v for v in rss if is_number(v)] if isinstance(rss, list) else []
    phases = s["phase_seconds"] if isinstance(s.get("phase_seconds"), dict) else {}
    ret = s.get("episode_return_mean")
    rows = [
        ("timesteps", f"{num(s.get('total_timesteps'))} of {num(s.get('target_timesteps'))}"),
        ("wall time", f"{num(s.get('duration_s'), '.1f')} s"),
        ("throughput", f"{num(s.get('fps'), '.1f')} steps/s over {num(s.get('world_size'))} rank(s)"),
        ("return (last 100 ep.)", "-" if not is_number(ret) else f"{ret:.2f} over {num(s.get('episodes'))} episodes"),
        ("peak memory", f"{num(s.get('peak_rss_mb_total'), '.0f')} MB total, "
                        f"{num(max(per_rank) if per_rank else None, '.0f')} MB max per rank"),
        ("phases (s, mean/rank)", ", ".join(f"{k} {v:.1f}" for k, v in phases.items() if is_number(v)) or "-"),
        ("outputs", f"{one_line(run_dir)}/ (config.yaml, logs/, checkpoints/, benchmark_metrics.json)"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"\nmpippo: {runctl.STOP_WHY.get(s.get('stop_reason'), 'run ended')}")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    sys.stdout.flush()
