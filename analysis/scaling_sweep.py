#!/usr/bin/env python
"""Run the trainer at several rank counts and collect one scaling table.

    python analysis/scaling_sweep.py --ranks 1 2 4 8 --mode weak --total-timesteps 65536
    python analysis/scaling_sweep.py --ranks 1 2 --mode strong --duration 0.05 -- --set env.name=starpilot

weak:   every rank keeps --envs-per-rank envs (the problem grows with the ranks);
strong: --num-envs envs in total are divided over the ranks (the same problem, split).
Each run gets the same budget: --total-timesteps (weak: per rank, so every size runs the same
number of iterations) or --duration hours. Each run's benchmark_metrics.json (phase times of
every rank, memory, throughput) goes into <out>/sweep.json, with a flat sweep.csv beside it;
analysis/scaling.ipynb reads sweep.json. Options after `--` go to run_mpi.py unchanged.
"""
from __future__ import annotations

import csv
import datetime
import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mpippo, without an install
from mpippo.toolcli import (MAX_RANKS, UsageError, Parser, about, check_trainer, count, distinct, number,  # noqa: E402
                     output_folder, ranks_fit, run, run_trainer, shown, write_json, write_text)
from mpippo.algos import registry  # noqa: E402
from mpippo.metrics.timers import PHASES  # noqa: E402

TOOL = "scaling_sweep"
OUTPUTS = ("sweep.json", "sweep.csv")
MAX_TIMESTEPS = 10**12  # the budget a --duration run is given: its clock ends it first


def trainer_args(ranks: int, args, extra: list[str]) -> list[str]:
    """run_mpi.py's options for the run at `ranks` ranks (its --output-dir comes from run_trainer)."""
    out = ["--no-progress", "--n-steps", str(args.n_steps), "--set", "checkpoint.interval_iterations=0",
           "--set", "parallel.threads_per_rank=1"]
    if args.config:
        out += ["--config", args.config]
    if args.mode == "weak":
        out += ["--num-envs-per-rank", str(args.envs_per_rank)]
        per_iteration = ranks * args.envs_per_rank * args.n_steps
    else:
        out += ["--num-envs", str(args.num_envs)]
        per_iteration = args.num_envs * args.n_steps
    if args.duration:
        out += ["--duration", str(args.duration), "--total-timesteps", str(MAX_TIMESTEPS)]
    else:
        budget = args.total_timesteps * (ranks if args.mode == "weak" else 1)
        out += ["--total-timesteps", str(max(budget, per_iteration))]
    return out + extra


def run_one(ranks: int, args, extra: list[str], run_dir: Path) -> dict:
    return run_trainer(ranks, trainer_args(ranks, args, extra), run_dir, f"the run at {ranks} rank(s)",
                       timeout=args.timeout)


def flat_row(m: dict) -> dict:
    row = {k: m.get(k) for k in ("world_size", "num_envs_per_rank", "num_envs", "n_steps", "total_timesteps",
                                 "iterations", "duration_s", "fps", "fps_steady", "peak_rss_mb_total")}
    row["peak_rss_mb_max_rank"] = max(m.get("peak_rss_mb_per_rank") or [0])
    for p in PHASES:
        per_rank = m.get("phase_seconds_per_rank", {}).get(p, [0.0])
        row[f"{p}_s_mean"] = sum(per_rank) / len(per_rank)
        row[f"{p}_s_min"], row[f"{p}_s_max"] = min(per_rank), max(per_rank)
    return row


def make_parser() -> Parser:
    p = Parser(prog="scaling_sweep.py", description=about(__doc__))
    p.add_argument("--ranks", type=count(1, MAX_RANKS), nargs="+", default=[1, 2])
    p.add_argument("--mode", choices=("weak", "strong"), default="weak")
    p.add_argument("--config", help="trainer config (default: the trainer's default)")
    p.add_argument("--envs-per-rank", type=count(1), default=32, help="weak scaling")
    p.add_argument("--num-envs", type=count(1), default=64, help="strong scaling: total, divided over the ranks")
    p.add_argument("--n-steps", type=count(1), default=256)
    p.add_argument("--total-timesteps", type=count(1, MAX_TIMESTEPS), default=3 * 32 * 256,
                   help="budget per run (weak: per rank); default 3 iterations of the default per-rank batch")
    p.add_argument("--duration", type=number(0, 24 * 365), help="budget per run in hours instead of timesteps")
    p.add_argument("--out", type=Path, help="default analysis/data/sweep-<mode>-<date>; a new folder")
    p.add_argument("--timeout", type=number(0, 30 * 86400), default=3600.0,
                   help="seconds per run before it counts as hung")
    return p


def check(args, extra: list[str]) -> Path:
    """Everything before the first run: options, every run's trainer options at its rank count, the
    output folder (new, or without a sweep in it). Returns the output folder."""
    distinct(args.ranks, "--ranks")
    if args.mode == "strong" and any(args.num_envs % n for n in args.ranks):
        raise UsageError(f"--num-envs {args.num_envs} must divide evenly over every rank count in {args.ranks}")
    if args.duration and args.duration * 3600 >= args.timeout:
        raise UsageError(f"--duration {args.duration:g} h is not below --timeout {args.timeout:g} s: every run "
                          f"would be ended as hung; raise --timeout")
    ranks_fit(max(args.ranks), "--ranks")
    for n in args.ranks:
        opts, cfg = check_trainer(trainer_args(n, args, extra), n, f"at {n} rank(s)")
        if opts.output_dir is not None or opts.resume:
            raise UsageError(f"options after --: the sweep chooses each run's folder; leave out --output-dir "
                              f"and --resume (give --out)")
        if registry.get(cfg.training.algo).layout != registry.SYNC:
            raise UsageError(f"training.algo: the sweep measures the sync layout (phase times of every rank: "
                              f"{', '.join(n for n in registry.NAMES if registry.get(n).layout == registry.SYNC)}); "
                              f"'{cfg.training.algo}' is not")
    out = args.out or ROOT / "analysis" / "data" / f"sweep-{args.mode}-{datetime.date.today().isoformat()}"
    taken = [out / name for name in (*OUTPUTS, *(f"ranks{n}" for n in args.ranks)) if (out / name).exists()]
    if taken and out.is_dir():
        raise UsageError(f"--out: '{shown(out)}' already holds a sweep ('{taken[0].name}'); give a new folder")
    return output_folder(out, "--out", OUTPUTS)


def main(argv: list[str] | None = None) -> int:
    return run(TOOL, _main, argv)


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    args = make_parser().parse_args(argv)
    # the trainer runs in the repository root: paths given relative to here are made absolute
    args.config = os.path.abspath(args.config) if args.config else None
    args.out = Path(os.path.abspath(args.out)) if args.out else None
    out = check(args, extra)
    cores = len(os.sched_getaffinity(0))
    print(f"scaling_sweep: {args.mode} scaling, ranks {args.ranks} on {cores} cores; output {out}", flush=True)
    results = []
    for i, n in enumerate(args.ranks):
        print(f"[{i + 1}/{len(args.ranks)}] {n} rank(s) ...", end=" ", flush=True)
        m = run_one(n, args, extra, out / f"ranks{n}")
        results.append(m)
        print(f"{m['fps_steady'] or m['fps']:.1f} steps/s, {m['duration_s']:.0f} s", flush=True)
    import torch
    sweep = {"mode": args.mode, "cores": cores, "date": datetime.datetime.now().isoformat(timespec="seconds"),
             "torch": torch.__version__, "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
             "extra_args": extra, "runs": results}
    write_json(out / OUTPUTS[0], sweep, "--out")
    rows = [flat_row(m) for m in results]
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    write_text(out / OUTPUTS[1], text.getvalue(), "--out")
    base = results[0]["fps_steady"] or results[0]["fps"]
    print(f"\n{'ranks':>5} {'steps/s':>9} {'speedup':>8} {'eff.':>6} {'allreduce':>9}")
    for m in results:
        fps = m["fps_steady"] or m["fps"]
        ph = m["phase_seconds"]
        n = m["world_size"] / results[0]["world_size"]  # ideal throughput grows with the ranks in both modes
        print(f"{m['world_size']:>5} {fps:>9.1f} {fps / base:>7.2f}x {100 * fps / base / n:>5.1f}% "
              f"{100 * ph['allreduce'] / max(sum(ph.values()), 1e-9):>8.2f}%")
    print(f"\nwrote {out / OUTPUTS[0]} and {out / OUTPUTS[1]}; plot it with analysis/scaling.ipynb")
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
