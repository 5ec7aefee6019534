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

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEEP = ROOT / "analysis" / "data" / "parity" / "runs"  # the small files of finished runs, committed
BUDGETS = {"coinrun": 524_288, "starpilot": 1_048_576}  # the paper's values there: 6.50 +- 0.08, 9.35 +- 0.89


def keep(run_dir: Path) -> Path:
    """Copy a finished run's curves and metrics (not its checkpoints) to analysis/data/parity/runs."""
    import shutil
    dest = KEEP / run_dir.name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(run_dir / "logs", dest / "logs")
    for name in ("benchmark_metrics.json", "config.yaml"):
        shutil.copy2(run_dir / name, dest / name)
    return dest


def finished(run_dir: Path) -> bool:
    try:
        return bool(json.loads((run_dir / "benchmark_metrics.json").read_text()).get("finished"))
    except (OSError, ValueError):
        return False


def run_command(run_dir: Path, game: str, seed: int, args) -> list[str]:
    """The launcher line of one run: a fresh start, or a resume from its checkpoint."""
    cmd = [sys.executable, "-m", "mpippo.launch", "-n", str(args.ranks), f"--mpirun-args={args.mpirun_args}",
           "--output-dir", str(run_dir), "--no-progress", "--set", "logging.print_interval=4",
           "--set", "checkpoint.interval_iterations=4"]
    if args.parallel > 1:  # runs side by side share the cores, and none may bind (they would stack)
        cores = len(os.sched_getaffinity(0))
        cmd += ["--set", f"parallel.threads_per_rank={max(1, cores // (args.parallel * args.ranks))}"]
    if (run_dir / "checkpoints" / "latest.pt").is_file():
        return cmd + ["--resume"]
    return cmd + ["--set", f"env.name={game}", "--total-timesteps", str(BUDGETS[game]), "--seed", str(seed),
                  "--set", f"training.precision={args.precision}", *[a for s in args.set for a in ("--set", s)]]


def run_queue(todo: list[tuple[Path, list[str]]], parallel: int, stop_after: float | None) -> int:
    """Run the launcher lines, `parallel` at a time; after `stop_after` seconds the running ones get
    SIGINT (they checkpoint and stop: the next call resumes them) and no new one starts."""
    t0, running, worst = time.monotonic(), {}, 0
    while todo or running:
        late = stop_after is not None and time.monotonic() - t0 > stop_after
        while todo and len(running) < parallel and not late:
            run_dir, cmd = todo.pop(0)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log = open(run_dir.parent / f"{run_dir.name}.log", "a") if parallel > 1 else None
            print(f"parity: {run_dir.name}: {'resuming' if '--resume' in cmd else 'starting'}", flush=True)
            running[run_dir] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT if log else None), log)
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", nargs="+", default=list(BUDGETS), choices=sorted(BUDGETS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--tag", default=None, help="folder tag (default: the precision)")
    p.add_argument("--set", action="append", default=[], help="config overrides for a variant")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "parity")
    p.add_argument("--parallel", type=int, default=1, help="runs at once (a machine with many cores or a GPU); "
                   "their output goes to <out>/<run>.log")
    p.add_argument("--stop-after", type=float, default=None, metavar="SECONDS",
                   help="then the running runs checkpoint and stop, and no new one starts")
    p.add_argument("--mpirun-args", default="--oversubscribe --bind-to none")
    args = p.parse_args(argv)
    tag = args.tag or args.precision
    folders, todo = [], []
    for game in args.games:
        for seed in args.seeds:
            run_dir = args.out / f"{game}-{tag}-s{seed}"
            folders.append(run_dir)
            if finished(run_dir):
                print(f"parity: {run_dir.name}: finished earlier", flush=True)
            else:
                todo.append((run_dir, run_command(run_dir, game, seed, args)))
    rc = run_queue(todo, max(1, args.parallel), args.stop_after)
    done = [keep(f) for f in folders if finished(f)]
    kept = sorted(set(done) | set(p for p in KEEP.iterdir() if p.is_dir())) if KEEP.is_dir() else done
    report = subprocess.call([sys.executable, str(ROOT / "analysis" / "parity.py"), *map(str, kept)], cwd=ROOT)
    return rc or report


if __name__ == "__main__":
    raise SystemExit(main())
