#!/usr/bin/env python
"""Throughput of synchronous PPO against the machine's ceiling and a peer, in one run.

Runs the real trainer (`mpirun -n K run_mpi.py`) on coinrun with the default network and
hyperparameters (per rank: the default job's 32 envs x 256 steps, minibatch 1024), one torch
thread per rank (weak scaling: per-rank batch fixed), and reads each run's
benchmark_metrics.json. Also measures: the component costs that give the machine ceiling
(benchmarks/components.py), bf16 at the full-machine rank count, CleanRL's stock
ppo_procgen.py on the same machine (benchmarks/peers.py), and peak memory over a longer run.
Prints the comparison table and each target, and writes benchmarks/results/<date>.json.
Throughput is measured after the first iteration (warm-up), for the peer too.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mpippo import hostmem, launch  # noqa: E402
from mpippo.envs.procgen import GAMES as PROCGEN_GAMES  # noqa: E402
import ceiling  # noqa: E402  (benchmarks/)
from results_file import check_out, write_result  # noqa: E402  (benchmarks/)
from mpippo.toolcli import (MAX_RANKS, UsageError, Parser, about, ToolFailure, check_trainer, count, distinct,  # noqa: E402
                     number, ranks_fit, run)
from mpippo.toolcli import run_trainer as run_checked  # noqa: E402
from mpippo.files import LOGS  # noqa: E402
from mpippo.metrics import tags  # noqa: E402
from mpippo.metrics.timers import PHASES  # noqa: E402

TOOL = "bench"
MEMORY_RUN = {"ranks": 2, "envs_per_rank": 8, "n_steps": 64}  # the memory-growth run: many small iterations


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def trainer_args(ranks: int, args, precision: str = "fp32", envs_per_rank: int | None = None,
                 n_steps: int | None = None, iterations: int | None = None, tensorboard: bool = False,
                 device: str = "cpu") -> list[str]:
    envs_per_rank, n_steps = envs_per_rank or args.envs_per_rank, n_steps or args.n_steps
    steps = ranks * envs_per_rank * n_steps * (iterations or args.iterations)
    return ["--set", f"env.name={args.env}", "--num-envs-per-rank", str(envs_per_rank), "--n-steps", str(n_steps),
            "--total-timesteps", str(steps), "--no-progress",
            "--set", f"parallel.threads_per_rank={args.threads}", "--set", "checkpoint.interval_iterations=0",
            "--set", f"logging.tensorboard={str(tensorboard).lower()}",
            "--set", f"training.num_minibatches={args.minibatches}", "--set", f"training.n_epochs={args.epochs}",
            "--set", f"training.precision={precision}", "--device", device]


def run_trainer(ranks: int, args, out_dir: Path, precision: str = "fp32", envs_per_rank: int | None = None,
                n_steps: int | None = None, iterations: int | None = None, tensorboard: bool = False,
                allocator: str = "retain", device: str = "cpu") -> dict:
    argv = trainer_args(ranks, args, precision, envs_per_rank, n_steps, iterations, tensorboard, device)
    return run_checked(ranks, argv, out_dir, f"the {ranks}-rank {precision} run", threads=args.threads,
                       extra_env={hostmem.ENV: allocator})


def components(args, precision: str) -> dict:
    """The component costs and the ceiling (benchmarks/ceiling.py) at this bench's per-rank sizes."""
    return ceiling.components(precision, args.env, args.envs_per_rank,
                              args.envs_per_rank * args.n_steps // args.minibatches, args.component_seconds)


def peer(args) -> dict | None:
    try:
        res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--env", args.env,
                              "--iterations", str(args.peer_iterations)], capture_output=True, text=True, timeout=7200)
    except subprocess.TimeoutExpired:
        print("bench: peer skipped: no result within 2 hours", flush=True)
        return None
    if res.returncode != 0:
        print(f"bench: peer skipped: {res.stderr.strip()[-500:]}", flush=True)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def memory_growth(args, out_dir: Path) -> dict:
    """A longer 2-rank run with small iterations: peak RSS (max over ranks) after each iteration."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    m = MEMORY_RUN
    run_trainer(m["ranks"], args, out_dir, envs_per_rank=m["envs_per_rank"], n_steps=m["n_steps"],
                iterations=args.memory_iterations, tensorboard=True)
    acc = EventAccumulator(str(out_dir / LOGS))
    acc.Reload()
    curve = [e.value for e in acc.Scalars(tags.chart("peak_rss_mb_max_rank"))]
    half = len(curve) // 2
    return {"iterations": len(curve), "peak_rss_mb_max_rank": curve,
            "growth_mb_after_iteration_2": curve[-1] - curve[1] if len(curve) > 2 else None,
            "growth_mb_second_half": curve[-1] - curve[half] if len(curve) > 2 else None}


def allreduce_seconds(ranks: int) -> float:
    """Pure transfer time of one gradient Allreduce at this rank count (microbenchmark)."""
    if ranks == 1:
        return 0.0
    cmd, env = launch.mpirun_command(ranks, [str(ROOT / "benchmarks" / "allreduce_micro.py")])
    env["PYTHONPATH"] = str(ROOT)
    try:
        with launch.own_shm_folder(env):
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise ToolFailure(f"the Allreduce microbenchmark at {ranks} ranks failed ({e})") from None
    return json.loads(res.stdout.strip().splitlines()[-1])["seconds_per_call"]


def make_parser() -> Parser:
    p = Parser(prog="bench.py", description=about(__doc__))
    p.add_argument("--ranks", type=count(1, MAX_RANKS), nargs="+", default=[1, 2])
    p.add_argument("--env", default="coinrun", choices=PROCGEN_GAMES, metavar="GAME", help="a Procgen game")
    p.add_argument("--envs-per-rank", type=count(1), default=32, help="default: the default job (64 envs) on 2 ranks")
    p.add_argument("--n-steps", type=count(1), default=256)
    p.add_argument("--minibatches", type=count(1), default=8)
    p.add_argument("--epochs", type=count(1, 100), default=3)
    p.add_argument("--iterations", type=count(1, 1000), default=3, help="per run; the first is warm-up")
    p.add_argument("--threads", type=count(1, 1024), default=1, help="torch threads per rank")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure training.precision=bf16 at the largest rank count that fits the cores")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                   help="run CleanRL's ppo_procgen.py side by side (benchmarks/peers.py)")
    p.add_argument("--peer-iterations", type=count(1, 100), default=2)
    p.add_argument("--gpu", action="store_true",
                   help="also run 1 rank on the GPU (training.device=cuda), fp32 and bf16; skipped without CUDA")
    p.add_argument("--component-seconds", type=number(0, 600), default=8.0, help="timing per component cost")
    p.add_argument("--ceiling-after", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the component costs again after the runs; the faster measurement sets the ceiling")
    p.add_argument("--allocator-baseline", action=argparse.BooleanOptionalAction, default=True,
                   help="also run fp32 at the full-machine rank count with malloc left as it is "
                        f"({hostmem.ENV}=system, THP for torch): what keeping freed memory gains")
    p.add_argument("--memory-iterations", type=count(0, 10_000), default=21,
                   help="0 = skip the memory-growth run; else at least 3")
    p.add_argument("--out", type=Path, default=None, help="the result file (default benchmarks/results/<date>.json)")
    return p


def check(args, cores: int) -> None:
    """Every option and every run's trainer options, before the first measurement."""
    distinct(args.ranks, "--ranks")
    if args.memory_iterations in (1, 2):
        raise UsageError(f"--memory-iterations: {args.memory_iterations} is too few to see growth after the second "
                          f"iteration; allowed: 0 (skip) or 3 to 10,000")
    if args.envs_per_rank * args.n_steps < args.minibatches:
        raise UsageError(f"--minibatches: {args.minibatches} minibatches of a {args.envs_per_rank} x {args.n_steps} "
                          f"batch per rank leave them empty; allowed: 1 to {args.envs_per_rank * args.n_steps}")
    ranks_fit(max(args.ranks), "--ranks")
    full = max((n for n in args.ranks if n * args.threads <= cores), default=args.ranks[0])
    for n in args.ranks:
        check_trainer(trainer_args(n, args), n, f"the {n}-rank run")
    if args.envs_per_rank * args.n_steps // args.minibatches > ceiling.MAX_MINIBATCH:  # (the trainer's checks first)
        raise UsageError(f"--minibatches: minibatches of {args.envs_per_rank * args.n_steps // args.minibatches:,} "
                         f"samples are more than the ceiling's measurement takes ({ceiling.MAX_MINIBATCH:,}); "
                         f"give more minibatches")
    if args.envs_per_rank > ceiling.MAX_ENVS:
        raise UsageError(f"--envs-per-rank: {args.envs_per_rank} is more than the ceiling's measurement takes "
                         f"({ceiling.MAX_ENVS:,})")
    if args.bf16:
        check_trainer(trainer_args(full, args, "bf16"), full, f"the {full}-rank bf16 run")
    if args.memory_iterations:
        m = MEMORY_RUN
        check_trainer(trainer_args(m["ranks"], args, envs_per_rank=m["envs_per_rank"], n_steps=m["n_steps"],
                                   iterations=args.memory_iterations, tensorboard=True), m["ranks"],
                      "the memory run (--memory-iterations)")
    check_out(args.out)


def main(argv: list[str] | None = None) -> int:
    return run(TOOL, _main, argv)


def _main(argv: list[str] | None) -> int:
    args = make_parser().parse_args(argv)
    check(args, len(os.sched_getaffinity(0)))
    cores = len(os.sched_getaffinity(0))
    print(f"bench: {args.env}, {args.envs_per_rank} envs x {args.n_steps} steps per rank, {args.iterations} "
          f"iterations, {args.threads} thread(s)/rank, ranks {args.ranks} on {cores} cores ({cpu_model()})", flush=True)
    precisions = ["fp32"] + (["bf16"] if args.bf16 else [])
    ceilings = {}
    for prec in precisions:
        print(f"bench: component costs ({prec}) ...", flush=True)
        ceilings[prec] = components(args, prec)
    full = max((n for n in args.ranks if n * args.threads <= cores), default=args.ranks[0])
    rows, peer_runs, memory = measure(args, plan(args, precisions, full), full, cores)
    if args.ceiling_after:
        for prec in precisions:
            print(f"bench: component costs ({prec}) again, after the runs ...", flush=True)
            ceilings[prec] = ceiling.faster(ceilings[prec], components(args, prec))
    cleanrl = relate(rows, ceilings, peer_runs)
    print_report(rows, ceilings, cleanrl, full)
    default = print_targets(rows, cleanrl, memory)

    import torch
    from mpippo.comm import mpi_library
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
              "cpu": cpu_model(), "cores": cores, "torch": torch.__version__,
              "mpi": mpi_library(), "settings": vars(args) | {"out": None},
              "ceilings": ceilings, "peer": cleanrl, "memory": memory, "results": rows, "default": default}
    out = write_result(result, out=args.out)
    print(f"bench: wrote {out}")
    return 0


def plan(args, precisions: list[str], full: int) -> list[tuple]:
    """The trainer runs, as (ranks, precision, allocator asked for, device)."""
    runs = [(n, "fp32", "retain", "cpu") for n in args.ranks] + [(full, prec, "retain", "cpu") for prec in precisions[1:]]
    runs += [(full, "fp32", "system", "cpu")] if args.allocator_baseline else []
    if args.gpu:
        import torch
        if torch.cuda.is_available():
            runs += [(1, prec, "retain", "cuda") for prec in precisions]
        else:
            print("bench: --gpu: no CUDA device here, GPU runs skipped", flush=True)
    return runs


def measure(args, runs: list[tuple], full: int, cores: int) -> tuple[list[dict], list, dict | None]:
    """Every planned run (CleanRL's right before and after the full-machine fp32 one), then the
    memory run: (rows, CleanRL's runs, memory growth)."""
    rows, peer_runs, memory = [], [], None

    def run_peer():
        if args.peers:
            print(f"bench: CleanRL ppo_procgen.py (stock), {args.peer_iterations} iterations of 64 envs x 256 steps ...",
                  flush=True)
            peer_runs.append(peer(args))

    with launch.temp_folder("bench") as tmp:
        for n, prec, alloc, device in runs:
            # The peer runs right before and right after the full-machine fp32 run: on a shared VM the
            # machine's speed drifts over the bench's half hour, so the ratio compares neighbours in time.
            headline = (n, prec, alloc, device) == (full, "fp32", "retain", "cpu")
            if headline:
                run_peer()
            print(f"bench: running {n} rank(s), {prec}{'' if alloc == 'retain' else ', malloc as is + THP'}"
                  f"{', on the GPU' if device == 'cuda' else ''} ...", flush=True)
            m = run_trainer(n, args, Path(tmp) / f"r{n}-{prec}-{alloc}-{device}", precision=prec, allocator=alloc,
                            device=device)
            if headline:
                run_peer()
            rows.append(row(args, m, n, prec, alloc, device, cores))
        if args.memory_iterations:
            print(f"bench: memory over {args.memory_iterations} iterations (2 ranks, 8 envs x 64 steps) ...", flush=True)
            memory = memory_growth(args, Path(tmp) / "memory")
    return rows, peer_runs, memory


def row(args, m: dict, n: int, prec: str, alloc: str, device: str, cores: int) -> dict:
    """One run's line of the table, from its metrics."""
    ph = m["phase_seconds"]
    total = sum(ph.values())
    calls = args.iterations * args.epochs * args.minibatches  # gradient Allreduces in the run
    transfer = allreduce_seconds(n) * calls
    return {"ranks": n, "precision": prec, "device": device, "allocator": alloc,
            "host_allocator": m["host_allocator"],  # in effect: "system (not glibc)" on macOS
            "oversubscribed": n * args.threads > cores, "fps": m["fps_steady"] or m["fps"],
            "fps_all": m["fps"], "cores_used": min(n * args.threads, cores), "phase_seconds": ph,
            "phase_share": {k: v / total for k, v in ph.items()},
            "allreduce_share": ph["allreduce"] / total,
            "allreduce_transfer_share": transfer / total,
            "peak_rss_mb_per_rank": max(m["peak_rss_mb_per_rank"]),
            "peak_rss_mb_total": m["peak_rss_mb_total"], "duration_s": m["duration_s"]}


def relate(rows: list[dict], ceilings: dict, peer_runs: list) -> dict | None:
    """Each row against the ceiling, the kernel bound, the 1-rank fp32 row and CleanRL (in place);
    returns CleanRL's rate (the mean of its runs), or None."""
    for r in rows:
        # the ceiling is the CPU's: a GPU row's share of it says how far past the CPU it goes
        c = ceilings[r["precision"]]
        r["ceiling"] = c["ceiling_per_core"] * r["cores_used"]
        r["kernel_bound"] = c["kernel_bound_per_core"] * r["cores_used"]
        r["of_kernel_bound"] = r["fps"] / r["kernel_bound"]
    cleanrl = None
    if peer_runs and all(peer_runs):
        rates = [r["fps_steady"] for r in peer_runs]
        cleanrl = dict(peer_runs[0], fps_steady=float(np.mean(rates)), fps_steady_runs=rates,
                       fps=float(np.mean([r["fps"] for r in peer_runs])))
    fp32 = cpu_fp32(rows)
    base = next((r for r in fp32 if r["ranks"] == 1), fp32[0])
    for r in rows:
        r["speedup"] = r["fps"] / base["fps"]
        r["efficiency"] = r["speedup"] / (r["ranks"] / base["ranks"])
        r["of_ceiling"] = r["fps"] / r["ceiling"]
        r["vs_cleanrl"] = r["fps"] / cleanrl["fps_steady"] if cleanrl else None
    return cleanrl


def cpu_fp32(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["precision"] == "fp32" and r["allocator"] == "retain" and r["device"] == "cpu"]


def print_report(rows: list[dict], ceilings: dict, cleanrl: dict | None, full: int) -> None:
    """The ceilings and arithmetic per precision, the table of runs, and each run's phases."""
    for prec, c in ceilings.items():
        print(f"\nceiling ({prec}, one thread per core): {ceiling.describe(c)}")
        print(f"arithmetic ({prec}): {ceiling.arithmetic(c)}")
    hdr = (f"{'run':<36} {'steps/s':>8} {'vs CleanRL':>10} {'ceiling':>8} {'of ceil.':>8} {'speedup':>8} {'eff.':>6} "
           f"{'allreduce':>9} {'transfer':>8} {'MB/rank':>8}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    if cleanrl:
        print(f"{cleanrl['peer']:<36} {cleanrl['fps_steady']:>8.1f} {'1.00x':>10}   (mean of the runs before and "
              f"after mpippo {full} ranks fp32: " + ", ".join(f"{x:.1f}" for x in cleanrl["fps_steady_runs"]) + ")")
    for r in rows:
        name = (f"mpippo {r['ranks']} rank(s) {r['precision']}" + (" (oversub.)" if r["oversubscribed"] else "")
                + ("" if r["allocator"] == "retain" else " malloc as is") + (" GPU" if r["device"] != "cpu" else ""))
        vs = f"{r['vs_cleanrl']:.2f}x" if r["vs_cleanrl"] else "-"
        print(f"{name:<36} {r['fps']:>8.1f} {vs:>10} {r['ceiling']:>8.1f} {100 * r['of_ceiling']:>7.1f}% "
              f"{r['speedup']:>7.2f}x {100 * r['efficiency']:>5.1f}% {100 * r['allreduce_share']:>8.2f}% "
              f"{100 * r['allreduce_transfer_share']:>7.2f}% {r['peak_rss_mb_per_rank']:>8.0f}")
    print("\nphases (share of an iteration):")
    for r in rows:
        print(f"  {r['ranks']} rank(s) {r['precision']} {r['host_allocator']} {r['device']}: "
              + ", ".join(f"{p} {100 * r['phase_share'][p]:.1f}%" for p in PHASES))


def print_targets(rows: list[dict], cleanrl: dict | None, memory: dict | None) -> dict | None:
    """The targets, reached or not, with the numbers; returns the default config's row."""
    two = next((r for r in cpu_fp32(rows) if r["ranks"] == 2), None)
    bf = next((r for r in rows if r["precision"] == "bf16" and r["device"] == "cpu"), None)
    sysm = next((r for r in rows if r["allocator"] == "system"), None)
    print("\ntargets:")
    if two and cleanrl:
        print(f"  1. 2 ranks fp32 vs CleanRL stock: {two['vs_cleanrl']:.2f}x (target >= 2x)")
    if two:
        print(f"  2. 2 ranks fp32 at {100 * two['of_ceiling']:.1f}% of the machine ceiling (target >= 90%); "
              f"{100 * two['of_kernel_bound']:.1f}% of the kernel bound ({two['kernel_bound']:.1f}: every FLOP at "
              f"the fastest convolution's rate)")
        print(f"  3. weak scaling 1 -> 2 ranks {100 * two['efficiency']:.1f}% (target >= 95%); allreduce "
              f"{100 * two['allreduce_share']:.2f}% of an iteration as seen (transfer + waiting for the slower rank), "
              f"{100 * two['allreduce_transfer_share']:.2f}% pure transfer (target <= 2%)")
    if memory:
        print(f"  4. peak memory per rank {max(r['peak_rss_mb_per_rank'] for r in rows):.0f} MB; growth from iteration 2 "
              f"to {memory['iterations']}: {memory['growth_mb_after_iteration_2']:+.1f} MB, over the second half "
              f"{memory['growth_mb_second_half']:+.1f} MB (target: flat)")
    if bf and two:
        print(f"  5. bf16 {bf['fps']:.1f} steps/s = {bf['fps'] / two['fps']:.2f}x fp32 at {bf['ranks']} ranks"
              + (f", {bf['vs_cleanrl']:.2f}x CleanRL stock" if cleanrl else ""))
    for g in (r for r in rows if r["device"] != "cpu"):
        print(f"  GPU: 1 rank {g['precision']} {g['fps']:.1f} steps/s"
              + (f" = {g['fps'] / two['fps']:.2f}x the 2-rank CPU fp32 run" if two else "")
              + (f", {g['vs_cleanrl']:.2f}x CleanRL stock (on the CPU)" if cleanrl else ""))
    # the default job's precision on the most ranks that ran (bf16 runs on the full node only)
    widest = max(cpu_fp32(rows), key=lambda r: r["ranks"], default=None)
    default = default_row(bf, widest, *cpu_bf16_native())
    if default and cleanrl:
        print(f"  6. the default config ({default['why']}): {default['fps']:.1f} steps/s = "
              f"{default['vs_cleanrl']:.2f}x CleanRL stock")
    if sysm and two:
        print(f"  kept freed memory: {two['fps'] / sysm['fps']:.2f}x the steps/s of malloc as is + THP at 2 ranks "
              f"({sysm['fps']:.1f} -> {two['fps']:.1f}); peak {sysm['peak_rss_mb_per_rank']:.0f} -> "
              f"{two['peak_rss_mb_per_rank']:.0f} MB per rank")
    return default


def cpu_bf16_native() -> tuple[bool, str]:
    import torch
    from mpippo import runctl
    return runctl.bf16_native(torch.device("cpu"))


def default_row(bf: dict | None, fp32: dict | None, native: bool, evidence: str) -> dict | None:
    """The run that the default config (training.precision auto) would be on this CPU, and why."""
    row = bf if native else fp32
    if row is None:
        return None
    return {"precision": row["precision"], "why": f"precision auto -> {row['precision']}: {evidence}",
            "fps": row["fps"], "vs_cleanrl": row.get("vs_cleanrl")}


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
