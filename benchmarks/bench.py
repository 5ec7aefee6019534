#!/usr/bin/env python
"""Throughput of synchronous PPO at several rank counts (weak scaling: per-rank batch fixed).

Runs the real trainer (`mpirun -n K run_mpi.py`) on coinrun with the default network,
one torch thread per rank, and reads each run's benchmark_metrics.json. Prints steps/s,
speedup and efficiency against 1 rank, the phase breakdown, the allreduce share and peak
memory, and writes benchmarks/results/<date>.json. Throughput is measured after the first
iteration (warm-up). Ranks beyond the core count are oversubscribed: expect them to share cores.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("env_step", "inference", "gae", "backward", "allreduce", "optimizer", "other")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_trainer(ranks: int, args, out_dir: Path) -> dict:
    steps = ranks * args.envs_per_rank * args.n_steps * args.iterations
    cmd = [str(Path(sys.executable).parent / "mpirun"), "--oversubscribe", "-n", str(ranks), sys.executable,
           str(ROOT / "run_mpi.py"), "--set", f"env.name={args.env}",
           "--num-envs-per-rank", str(args.envs_per_rank), "--n-steps", str(args.n_steps),
           "--total-timesteps", str(steps), "--output-dir", str(out_dir), "--no-progress",
           "--set", f"parallel.threads_per_rank={args.threads}", "--set", "checkpoint.interval_iterations=0",
           "--set", "logging.tensorboard=false", "--set", f"training.num_minibatches={args.minibatches}",
           "--set", f"training.n_epochs={args.epochs}"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if ranks * args.threads > len(os.sched_getaffinity(0)):
        env["PRTE_MCA_hwloc_default_binding_policy"] = "none"  # oversubscribed: binding would stack ranks
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        sys.exit(f"bench: run with {ranks} rank(s) failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    m = json.loads((out_dir / "benchmark_metrics.json").read_text())
    m["wall_s_with_startup"] = time.perf_counter() - t0
    return m


def allreduce_seconds(ranks: int) -> float:
    """Pure transfer time of one gradient Allreduce at this rank count (microbenchmark)."""
    if ranks == 1:
        return 0.0
    cmd = [str(Path(sys.executable).parent / "mpirun"), "--oversubscribe", "-n", str(ranks), sys.executable,
           str(ROOT / "benchmarks" / "allreduce_micro.py")]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PRTE_MCA_hwloc_default_binding_policy="none", PYTHONPATH=str(ROOT))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])["seconds_per_call"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--env", default="coinrun")
    p.add_argument("--envs-per-rank", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=256)
    p.add_argument("--minibatches", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--iterations", type=int, default=3, help="per run; the first is warm-up")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    cores = len(os.sched_getaffinity(0))
    print(f"bench: {args.env}, {args.envs_per_rank} envs x {args.n_steps} steps per rank, {args.iterations} "
          f"iterations, {args.threads} thread(s)/rank, ranks {args.ranks} on {cores} cores ({cpu_model()})", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mpippo-bench-") as tmp:
        for n in args.ranks:
            print(f"bench: running {n} rank(s) ...", flush=True)
            m = run_trainer(n, args, Path(tmp) / f"r{n}")
            ph = m["phase_seconds"]
            total = sum(ph.values())
            calls = args.iterations * args.epochs * args.minibatches  # gradient Allreduces in the run
            transfer = allreduce_seconds(n) * calls
            rows.append({"ranks": n, "oversubscribed": n * args.threads > cores, "fps": m["fps_steady"] or m["fps"],
                         "fps_all": m["fps"], "phase_seconds": ph,
                         "phase_share": {k: v / total for k, v in ph.items()},
                         "allreduce_share": ph["allreduce"] / total,
                         "allreduce_transfer_share": transfer / total,
                         "peak_rss_mb_per_rank": max(m["peak_rss_mb_per_rank"]),
                         "peak_rss_mb_total": m["peak_rss_mb_total"], "duration_s": m["duration_s"]})
    base = next((r for r in rows if r["ranks"] == 1), rows[0])
    for r in rows:
        r["speedup"] = r["fps"] / base["fps"]
        r["efficiency"] = r["speedup"] / (r["ranks"] / base["ranks"])

    hdr = (f"{'ranks':>5} {'steps/s':>9} {'speedup':>8} {'eff.':>6} {'allreduce':>9} {'transfer':>8} "
           + " ".join(f"{p[:8]:>8}" for p in PHASES) + f" {'MB/rank':>8}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in rows:
        note = " (oversubscribed)" if r["oversubscribed"] else ""
        print(f"{r['ranks']:>5} {r['fps']:>9.1f} {r['speedup']:>7.2f}x {100 * r['efficiency']:>5.1f}% "
              f"{100 * r['allreduce_share']:>8.2f}% {100 * r['allreduce_transfer_share']:>7.2f}% " + " ".join(f"{100 * r['phase_share'][p]:>7.1f}%" for p in PHASES)
              + f" {r['peak_rss_mb_per_rank']:>8.0f}{note}")
    two = next((r for r in rows if r["ranks"] == 2), None)
    if two:
        print(f"\n2-rank weak-scaling efficiency {100 * two['efficiency']:.1f}% (target >= 90%); allreduce "
              f"{100 * two['allreduce_share']:.2f}% of an iteration including waiting for the slower rank, "
              f"{100 * two['allreduce_transfer_share']:.2f}% pure transfer (target <= 2%)")
    print("allreduce = time inside the gradient Allreduce as the trainer sees it (transfer + waiting for the "
          "slowest rank); transfer = microbenchmarked Allreduce of the same buffer x calls per run")

    import torch
    from mpi4py import MPI
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
              "cpu": cpu_model(), "cores": cores, "torch": torch.__version__,
              "mpi": MPI.Get_library_version().splitlines()[0], "settings": vars(args) | {"out": None},
              "results": rows}
    out = args.out or ROOT / "benchmarks" / "results" / f"{datetime.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"bench: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
