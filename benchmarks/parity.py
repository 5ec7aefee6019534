#!/usr/bin/env python
"""The learning-parity runs against the Procgen paper, one after another, resumable.

    python benchmarks/parity.py                       # coinrun 524,288 and starpilot 1,048,576 steps,
                                                      # seeds 1 2, fp32; then analysis/parity.py
    python benchmarks/parity.py --precision bf16      # the same in bf16
    python benchmarks/parity.py --set training.adv_norm=rollout --tag old   # a variant
    python benchmarks/parity.py --parallel 4 --set training.device=cuda --stop-after 400   # a GPU machine

Each run is the default config (2 ranks unless --ranks), in runs/parity/<game>-<tag>-s<seed>.
A finished run is skipped; an interrupted one (a session that ended, a Ctrl-C) is resumed from
its checkpoint (written every 4 iterations and on a stop signal), so the whole set can be carried
over several sittings: run the same command again. An hour per starpilot run on 2 cores. The
curves and metrics of finished runs are copied to analysis/data/parity/runs/ (committed), and
analysis/parity.py reports on all of them.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mpippo.toolcli import (MAX_RANKS, UsageError, Parser, about, Stopped, ToolFailure, check_trainer, count,  # noqa: E402
                            distinct, number, output_folder, ranks_fit, run, seed, shown, stops_held)
from mpippo.launch import die_with_parent  # noqa: E402

from mpippo.checkpoint import latest_path  # noqa: E402
from mpippo.files import LOGS, METRICS, RUN_CONFIG, check_appendable, open_append, read_metrics, read_run_config  # noqa: E402
from mpippo.runlock import LOCK_NAME  # noqa: E402

TOOL = "benchmarks/parity"
KEEP = ROOT / "analysis" / "data" / "parity" / "runs"  # the small files of finished runs, committed
BUDGETS = {"coinrun": 524_288, "starpilot": 1_048_576}  # the paper's values there: 6.50 +- 0.08, 9.35 +- 0.89
TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def keep(run_dir: Path) -> Path:
    """Copy a finished run's curves and metrics (not its checkpoints) to analysis/data/parity/runs:
    into a new folder first, which then replaces the kept copy (a failed copy leaves the old one)."""
    import shutil
    dest = KEEP / run_dir.name
    tmp, old = KEEP / f".{run_dir.name}.new", KEEP / f".{run_dir.name}.old"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(run_dir / LOGS, tmp / LOGS)
        for name in (METRICS, RUN_CONFIG):
            shutil.copy2(run_dir / name, tmp / name)
        with stops_held():  # the kept copy set aside, the new one in its place: never neither
            shutil.rmtree(old, ignore_errors=True)
            if os.path.lexists(dest):
                dest.rename(old)
            try:
                tmp.rename(dest)
            except OSError:
                if os.path.lexists(old):
                    old.rename(dest)
                raise
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ToolFailure(f"copying '{shown(run_dir)}' to '{shown(dest)}' failed ({e.strerror or e})") from None
    return dest


def kept_runs() -> list[Path]:
    return sorted(p for p in KEEP.iterdir() if p.is_dir() and not p.name.startswith(".")) if KEEP.is_dir() else []


def finished(run_dir: Path) -> bool:
    """The run's metrics say it finished (they were checked before anything started)."""
    return (run_dir / METRICS).is_file() and bool(read_metrics(run_dir).get("finished"))


def trainer_args(run_dir: Path, game: str, seed_: int, args) -> list[str]:
    """run_mpi.py's options of one run (without --output-dir): a fresh start, or a resume from its checkpoint."""
    out = ["--no-progress", "--set", "logging.print_interval=4", "--set", "checkpoint.interval_iterations=4"]
    if args.parallel > 1:  # runs side by side share the cores, and none may bind (they would stack)
        cores = len(os.sched_getaffinity(0))
        out += ["--set", f"parallel.threads_per_rank={max(1, cores // (args.parallel * args.ranks))}"]
    if latest_path(run_dir).is_file():
        return out + ["--resume"]
    return out + ["--set", f"env.name={game}", "--total-timesteps", str(BUDGETS[game]), "--seed", str(seed_),
                  "--set", f"training.precision={args.precision}", *[a for s in args.set for a in ("--set", s)]]


def run_command(run_dir: Path, game: str, seed_: int, args) -> list[str]:
    """The launcher line of one run."""
    return [sys.executable, "-m", "mpippo.launch", "-n", str(args.ranks), f"--mpirun-args={args.mpirun_args}",
            "--output-dir", str(run_dir), *trainer_args(run_dir, game, seed_, args)]


def run_queue(todo: list[tuple[Path, list[str]]], parallel: int, stop_after: float | None) -> int:
    """Run the launcher lines, `parallel` at a time; after `stop_after` seconds the running ones get
    SIGINT (they checkpoint and stop: the next call resumes them) and no new one starts."""
    running = {}  # run folder -> (its launcher, its console log)
    try:
        return _run_queue(todo, parallel, stop_after, running)
    except Stopped:
        stop_runs([proc for proc, _ in running.values()])
        raise


def stop_runs(procs: list[subprocess.Popen], grace_s: float = 300.0) -> None:
    """A stop of this tool passed on to its launchers as their gentle stop (SIGTERM: each run
    checkpoints at its next iteration and exits; the next call resumes it), waited for up to
    `grace_s`, then their hard one (SIGINT after a stop). A second Ctrl-C at a terminal reaches the
    launchers too (one process group), which take it as "now" themselves."""
    alive = [p for p in procs if p.poll() is None]
    for proc in alive:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    try:
        for proc in alive:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        for proc in alive:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in alive:  # (a launcher that does not end even so is killed; its mpirun follows it)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _run_queue(todo, parallel, stop_after, running) -> int:
    t0, worst = time.monotonic(), 0
    while todo or running:
        late = stop_after is not None and time.monotonic() - t0 > stop_after
        while todo and len(running) < parallel and not late:
            run_dir, cmd = todo.pop(0)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log = open_append(run_dir.parent / f"{run_dir.name}.log", "the run's console log") if parallel > 1 else None
            print(f"parity: {run_dir.name}: {'resuming' if '--resume' in cmd else 'starting'}", flush=True)
            # (killed -9, this tool's launchers get their gentle stop from the kernel, not train on alone)
            running[run_dir] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT if log else None,
                                                 preexec_fn=die_with_parent(signal.SIGTERM)), log)
        if late:
            for proc, _ in running.values():
                if proc.poll() is None and not getattr(proc, "stopped", False):
                    proc.send_signal(signal.SIGINT)
                    proc.stopped = True
            todo.clear()
        time.sleep(1.0)
        for run_dir, (proc, log) in list(running.items()):
            if proc.poll() is not None:
                del running[run_dir]
                if log:
                    log.close()
                if proc.returncode != 0:
                    print(f"parity: {run_dir.name} ended with exit {proc.returncode}; run the same command "
                          "again to resume", flush=True)
                    worst = worst or proc.returncode
                else:
                    print(f"parity: {run_dir.name}: finished", flush=True)
    return worst


def make_parser() -> Parser:
    p = Parser(prog="benchmarks/parity.py", description=about(__doc__))
    p.add_argument("--games", nargs="+", default=list(BUDGETS), choices=sorted(BUDGETS))
    p.add_argument("--seeds", nargs="+", type=seed, default=[1, 2])
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--ranks", type=count(1, MAX_RANKS), default=2)
    p.add_argument("--tag", default=None, help="folder tag (default: the precision); letters, digits, . _ -")
    p.add_argument("--set", action="append", default=[], help="config overrides for a variant")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "parity")
    p.add_argument("--parallel", type=count(1, 64), default=1, help="runs at once (a machine with many cores or "
                   "a GPU); their output goes to <out>/<run>.log")
    p.add_argument("--stop-after", type=number(0, 30 * 86400), default=None, metavar="SECONDS",
                   help="then the running runs checkpoint and stop, and no new one starts")
    p.add_argument("--mpirun-args", default="--oversubscribe --bind-to none")
    return p


def check_run(run_dir: Path, game: str, seed_: int, args) -> None:
    """One run of the set: its folder is new, finished (metrics, curves and config to keep), or
    resumable (a checkpoint, and a config the trainer accepts); its options pass the trainer's checks."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"'{shown(run_dir)}' is a file, where the run folder of {game} seed {seed_} goes")
    check_appendable(run_dir.parent / f"{run_dir.name}.log", "the run's console log")  # (--parallel writes it)
    if (run_dir / METRICS).exists() and read_metrics(run_dir).get("finished"):
        read_run_config(run_dir)
        if not (run_dir / LOGS).is_dir():
            raise UsageError(f"'{shown(run_dir)}' finished but has no logs/ folder to keep")
        return
    argv = trainer_args(run_dir, game, seed_, args)
    if "--resume" in argv:  # the trainer reads the run's own config.yaml: checked as it will read it
        read_run_config(run_dir)
        argv = ["--config", str(run_dir / RUN_CONFIG), *[a for a in argv if a != "--resume"]]
    elif run_dir.is_dir() and any(p.name != LOCK_NAME for p in run_dir.iterdir()):
        raise UsageError(f"'{shown(run_dir)}' holds an unfinished run without a checkpoint to resume from; "
                          f"move it away to start {game} seed {seed_} afresh")
    check_trainer(argv, args.ranks, run_dir.name)


def check(args) -> list[tuple[Path, str, int]]:
    """Everything before the first run; returns the runs of the set (folder, game, seed)."""
    distinct(args.games, "--games")
    distinct(args.seeds, "--seeds")
    if args.tag is not None and not TAG.fullmatch(args.tag):
        raise UsageError(f"--tag: '{shown(args.tag)}' is not a folder tag; allowed: 1-64 letters, digits, '.', "
                          f"'_' or '-', not starting with '.' or '-'")
    try:
        shlex.split(args.mpirun_args)
    except ValueError as e:
        raise UsageError(f"--mpirun-args: '{shown(args.mpirun_args)}' is not a command-line fragment ({e})") from None
    ranks_fit(args.ranks * args.parallel, "--ranks x --parallel")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out: '{shown(args.out)}' is a file; give a folder")
    tag = args.tag or args.precision
    runs = [(args.out / f"{game}-{tag}-s{s}", game, s) for game in args.games for s in args.seeds]
    for run_dir, game, s in runs:
        check_run(run_dir, game, s, args)
    for kept in kept_runs():
        read_metrics(kept)
        read_run_config(kept)
    output_folder(args.out, "--out")  # last: the only check that writes (a probe, removed at once)
    return runs


def main(argv=None) -> int:
    return run(TOOL, _main, argv)


def _main(argv) -> int:
    args = make_parser().parse_args(argv)
    args.out = Path(os.path.abspath(args.out))  # the launcher runs in the repository root
    runs = check(args)
    todo = []
    for run_dir, game, s in runs:
        if finished(run_dir):
            print(f"parity: {run_dir.name}: finished earlier", flush=True)
        else:
            todo.append((run_dir, run_command(run_dir, game, s, args)))
    rc = run_queue(todo, args.parallel, args.stop_after)
    done = [keep(f) for f, _, _ in runs if finished(f)]
    kept = sorted(set(done) | set(kept_runs()))
    report = subprocess.call([sys.executable, str(ROOT / "analysis" / "parity.py"), *map(str, kept)], cwd=ROOT)
    return rc or report


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
