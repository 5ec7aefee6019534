#!/usr/bin/env python
"""The learning-parity runs against the Procgen paper, one after another, resumable.

    python benchmarks/parity.py                       # coinrun 524,288 and starpilot 1,048,576 steps,
                                                      # seeds 1 2, fp32; then analysis/parity.py
    python benchmarks/parity.py --precision bf16      # the same in bf16
    python benchmarks/parity.py --set training.adv_norm=rollout --tag old   # a variant

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
import subprocess
import sys
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", nargs="+", default=list(BUDGETS), choices=sorted(BUDGETS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--tag", default=None, help="folder tag (default: the precision)")
    p.add_argument("--set", action="append", default=[], help="config overrides for a variant")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "parity")
    args = p.parse_args(argv)
    tag = args.tag or args.precision
    folders = []
    for game in args.games:
        for seed in args.seeds:
            run_dir = args.out / f"{game}-{tag}-s{seed}"
            folders.append(run_dir)
            if finished(run_dir):
                print(f"parity: {run_dir.name}: finished earlier", flush=True)
                continue
            resume = (run_dir / "checkpoints" / "latest.pt").is_file()
            cmd = [sys.executable, "-m", "mpippo.launch", "-n", str(args.ranks), "--mpirun-args=--oversubscribe",
                   "--output-dir", str(run_dir), "--no-progress", "--set", "logging.print_interval=4",
                   "--set", "checkpoint.interval_iterations=4"]
            cmd += ["--resume"] if resume else ["--set", f"env.name={game}", "--total-timesteps", str(BUDGETS[game]),
                                                 "--seed", str(seed), "--set", f"training.precision={args.precision}",
                                                 *[a for s in args.set for a in ("--set", s)]]
            print(f"parity: {run_dir.name}: {'resuming' if resume else 'starting'}", flush=True)
            rc = subprocess.call(cmd, cwd=ROOT)
            if rc != 0:
                print(f"parity: {run_dir.name} ended with exit {rc}; run the same command again to resume", flush=True)
                return rc
    done = [keep(f) for f in folders if finished(f)]
    kept = sorted(set(done) | set(p for p in KEEP.iterdir() if p.is_dir())) if KEEP.is_dir() else done
    return subprocess.call([sys.executable, str(ROOT / "analysis" / "parity.py"), *map(str, kept)], cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())
