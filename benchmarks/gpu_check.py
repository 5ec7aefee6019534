#!/usr/bin/env python
"""Every CUDA path of mpippo in one go (make gpu-check), measured against the GPU issue's targets.

    make gpu-check                      # on a machine with a GPU: about 5-8 minutes
    make gpu-check ARGS=--dry-run       # the same steps on the CPU, tiny budgets on toy-cue (make test runs it)

Rows, in the order they run (a row that fails is recorded as failed and the next one runs):
  - PPO on 1 rank, fp32 and bf16, each with training.deterministic true (the default) and false (the
    fastest kernels): steady env steps/s, peak GPU memory, the phases of an iteration (env_step,
    inference, update = backward + optimizer, allreduce, other = gae + other; seconds per iteration,
    from benchmark_metrics.json's phase_seconds, the first iteration included) and the placement the
    run got (affinity_cores, cpu_share, threads_per_rank, env_threads, device_used, precision,
    deterministic, policy_step). Each rank is bound to 8 cores (fewer where the machine has fewer), what each GPU's
    rank gets on the 6-GPU, 48-core node the model below is about; on GPUs deterministic's cost is
    stated as the fast row's rate over the deterministic one's;
  - PPO on 1 rank, bf16, deterministic, with the policy step eager (training.cuda_graph false): what
    the CUDA graph of the rollout's policy step gains is the bf16 deterministic row's rate over this
    one's (and their inference phases side by side);
  - PPO on 2 ranks sharing the one GPU, fp32, 64 envs per rank (weak scaling: each rank does what the
    1-rank run does, so its phases compare with the 1-rank row's);
  - PPO on Atari on 1 rank, bf16, fast kernels: configs/ppo_atari.yaml (the Nature CNN on 84x84x4
    frames, ale-py's threaded vector env), 32 envs x 128 steps per iteration: the rate of one GPU rank
    on the field's second benchmark (on the CPU, benchmarks/atari_throughput.py measures it against
    CleanRL's ppo_atari_envpool.py);
  - the 6-GPU node, MODELED from those rows (nothing runs):
      six independent runs (the suite's layout, one 1-rank run per GPU, 8 cores each)
          = 6 x one rank's steps/s measured here with 8 cores: the node's 48 cores feed six ranks
          as this machine's 8 fed one (the model holds while a rank is bound by its own CPU share
          and its own GPU, and says nothing of a node whose cores are slower);
      one synchronous 6-rank run (64 envs per rank, weak scaling)
          = 6 x 16,384 / (T1 + 5 x max(A2 - A1, 0)) steps/s, where T1 = the 1-rank iteration
          (16,384 / its steps/s), A1 and A2 = the allreduce phase per iteration of the 1-rank and
          2-rank fp32 runs (on a GPU that phase also holds the wait for the backward's kernels,
          which A1 removes): A2 - A1 is what one exchange between two ranks adds to an iteration,
          and a ring over 6 ranks takes 5 such steps where 2 ranks take 1. Pessimistic: the two
          measured ranks share one GPU, so A2 also holds their contention for it; the bandwidth-only
          model (2(p-1)/p: 5/3 instead of 5) is given beside it;
  - the DQN learner alone (prefilled replay, no actors, batch 512) and the APPO learner alone
    (prefilled segments, no actors): samples/s (benchmarks/learner_bench.py), and one PPO iteration
    under torch.profiler, its key_averages table saved beside the result (<result>-profile.txt);
  - the DQN learner + 7 actors and the APPO learner + 7 actors, end to end (samples/s of the learner
    as the run reports it, actors included);
  - exact resume on the GPU: parameters after 2+2 iterations against 4, and 4 against 4 (the floor).

Targets of the GPU issue, reported as reached or not (benchmarks, never test assertions): one rank
>= 25,000 env steps/s bf16 and >= 15,000 fp32; the 6-GPU node (modeled) >= 150,000 over six
independent runs and >= 50,000 for one synchronous 6-rank run; the DQN learner alone >= 100,000
samples/s at batch 512; the APPO learner alone >= 50,000 samples/s. Judged on the default settings
(deterministic kernels, bf16 where the issue says so); the fast kernels' numbers are given beside.

Prints a table and writes benchmarks/results/<date>-gpu.json (--out: elsewhere), rewritten after
every row ("complete": false until the last), so a check cut short keeps what it measured. Without
CUDA and without --dry-run it says so and exits 2.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from results_file import check_out, result_path  # noqa: E402  (benchmarks/)
from mpippo import launch  # noqa: E402
from mpippo.checkpoint import latest_path, load_checkpoint  # noqa: E402
from mpippo.toolcli import (UsageError, Parser, about, ToolFailure, count, number, output_file, run, run_trainer,  # noqa: E402
                            write_json)

TOOL = "gpu-check"
MAX_PPO_ITERATIONS = 200  # timed iterations per PPO row (16,384 steps each on the default config)
NODE_GPUS, NODE_CORES = 6, 48  # the node the model is about: one rank per GPU, 8 cores each
PHASE_GROUPS = {"env_step": ("env_step",), "inference": ("inference",), "update": ("backward", "optimizer"),
                "allreduce": ("allreduce",), "other": ("gae", "other")}
PLACEMENT = ("affinity_cores", "cpu_share", "threads_per_rank", "env_threads", "device_used", "precision",
             "deterministic", "policy_step")
EAGER_ROW = "ppo bf16, 1 rank, deterministic, eager policy step"
ATARI_ROW = "ppo bf16 on Atari (Nature CNN), 1 rank, fast kernels"

# the default config (64 envs x 256 steps = 16,384 per rank and iteration) on the GPU; smoke-sized on the CPU
# (Atari: configs/ppo_atari.yaml, its network and game, 32 envs per rank: a GPU rank steps them on its cores)
REAL = {"ppo": [], "envs_per_rank": 64, "n_steps": 256, "resume_half": 2 * 16384,
        "atari": {"ppo": ["--config", str(ROOT / "configs/ppo_atari.yaml")], "envs_per_rank": 32, "n_steps": 128},
        "dqn_actors": 7, "dqn_steps": 40_000, "dqn_batch": 512, "appo_actors": 7, "appo": [], "appo_batch": (64, 64),
        "appo_steps": 24 * 4096, "learner": [], "dqn": []}
# (dry PPO runs: one torch thread, as tiny sizes gain nothing from more and a busy machine's cores slow them;
# a tiny network, as a CPU without native bf16 runs the bf16 rows in software: 20 s a row with smoke's, 5 s so;
# toy-cue for procgen's games, whose assets cost each process about 4 s of CPU to load: the dry run proves
# the steps, which step no differently on a toy game)
TOY = ["--set", "env.name=toy-cue", "--set", "model.channels=[4]", "--set", "model.hidden_size=16"]
DRY = {"ppo": ["--config", str(ROOT / "configs/smoke.yaml"), "--set", "parallel.threads_per_rank=1", *TOY], "envs_per_rank": 8,
       "n_steps": 16, "resume_half": 256,
       "atari": {"ppo": ["--config", str(ROOT / "configs/ppo_atari.yaml"), "--set", "parallel.threads_per_rank=1", "--set",
                         "model.hidden_size=16"], "envs_per_rank": 2, "n_steps": 16},
       "dqn_actors": 2, "dqn_steps": 1200, "dqn_batch": 32, "appo_actors": 3,
       "dqn": TOY, "appo": TOY, "appo_batch": (8, 8),
       "appo_steps": 1024, "learner": ["--dry-run"]}
TARGETS = {  # name: (row, field, target, what)
    "one_rank_bf16_steps_per_s": ("ppo bf16, 1 rank, deterministic", "steps_per_s", 25_000, "env steps/s"),
    "one_rank_fp32_steps_per_s": ("ppo fp32, 1 rank, deterministic", "steps_per_s", 15_000, "env steps/s"),
    "node_six_independent_runs_steps_per_s": ("6-GPU node: six independent 1-rank runs (modeled)", "steps_per_s",
                                              150_000, "env steps/s"),
    "node_one_sync_6_rank_run_steps_per_s": ("6-GPU node: one synchronous 6-rank run (modeled)", "steps_per_s",
                                             50_000, "env steps/s"),
    "dqn_learner_alone_samples_per_s": ("dqn learner alone (prefilled replay, no actors)", "samples_per_s", 100_000,
                                        "samples/s"),
    "appo_learner_alone_samples_per_s": ("appo learner alone (prefilled segments, no actors)", "samples_per_s",
                                         50_000, "samples/s"),
}


def cores_per_rank(ranks: int) -> int:
    """What each rank is bound to: the node's share per GPU (8 cores), or this machine's share if smaller."""
    return max(1, min(NODE_CORES // NODE_GPUS, len(os.sched_getaffinity(0)) // ranks))


def trainer(ranks: int, args: list[str], out: Path, device: str, threads: int | None = None) -> dict:
    common = ["--no-progress", "--device", device, "--set", "logging.tensorboard=false",
              "--set", "logging.print_interval=1000"]
    return run_trainer(ranks, [*args, *common], out, f"the {ranks}-rank run", timeout=600, threads=threads)


def phases(m: dict) -> dict:
    """Seconds per iteration of each phase group (rank mean, the first iteration included), and shares."""
    sec, its = m.get("phase_seconds") or {}, max(int(m.get("iterations") or 1), 1)
    per = {g: sum(float(sec.get(p, 0.0)) for p in parts) / its for g, parts in PHASE_GROUPS.items()}
    total = sum(per.values()) or 1.0
    return {"seconds_per_iteration": per, "share": {g: v / total for g, v in per.items()}}


def ppo_row(budget: dict, device: str, tmp: Path, iterations: int, ranks: int, precision: str,
            deterministic: bool, graph: bool = True, atari: bool = False) -> dict:
    """A PPO row; atari: budget["atari"]'s config and sizes (the Nature CNN on ale-py's games), not procgen's."""
    name = (f"ppo {precision}" + (" on Atari (Nature CNN)" if atari else "")
            + f", {ranks} rank{'s' if ranks > 1 else ''}"
            + (" on one device" if ranks > 1 else "") + (", deterministic" if deterministic else ", fast kernels")
            + ("" if graph else ", eager policy step"))
    work = budget["atari"] if atari else budget
    per_rank, n_steps = work["envs_per_rank"], work["n_steps"]
    batch = per_rank * n_steps  # per rank and iteration
    args = [*work["ppo"], "--num-envs-per-rank", str(per_rank), "--n-steps", str(n_steps),
            "--total-timesteps", str(ranks * batch * (iterations + 1)),
            "--set", f"training.precision={precision}", "--set", f"training.deterministic={str(deterministic).lower()}",
            "--set", f"training.cuda_graph={str(graph).lower()}"]
    m = trainer(ranks, args, tmp / name.replace(" ", "_").replace(",", ""), device, cores_per_rank(ranks))
    rate = m.get("fps_steady") or m["fps"]
    return {"check": name, "device": m.get("device_used"), "ranks": ranks, "envs_per_rank": per_rank,
            "precision": m.get("precision"), "deterministic": m.get("deterministic"), "steps_per_s": rate,
            "iteration_s": ranks * batch / rate, "iterations": m.get("iterations"),
            "gpu_peak_mem_mb": m.get("gpu_peak_mem_mb"), "phases": phases(m),
            "placement": {k: m.get(k) for k in PLACEMENT}, "ok": m["finished"]}


def node_rows(by: dict, batch: int) -> list[dict]:
    """The 6-GPU node, modeled from the measured rows (see the docstring)."""
    def rate(precision, det=True):
        r = by.get(f"ppo {precision}, 1 rank, {'deterministic' if det else 'fast kernels'}")
        return r["steps_per_s"] if r and r.get("ok") else None
    cores = (by.get("ppo bf16, 1 rank, deterministic") or {}).get("placement", {}).get("affinity_cores")
    fed = (f"each rank measured here on {cores} core(s)" if cores == NODE_CORES // NODE_GPUS else
           f"each rank measured here on {cores} core(s), not the node's {NODE_CORES // NODE_GPUS}: the model "
           f"scales nothing by cores, so it holds only as far as that share stands for 8")
    indep = {"check": "6-GPU node: six independent 1-rank runs (modeled)", "device": "modeled", "modeled": True,
             "model": f"{NODE_GPUS} x one rank's steps/s (deterministic rows), each of the node's {NODE_GPUS} "
                      f"GPUs fed by {NODE_CORES // NODE_GPUS} of its {NODE_CORES} cores; {fed}",
             "by_precision": {p: (NODE_GPUS * rate(p) if rate(p) else None) for p in ("fp32", "bf16")},
             "fast_kernels": {p: (NODE_GPUS * rate(p, False) if rate(p, False) else None) for p in ("fp32", "bf16")}}
    indep["steps_per_s"] = indep["by_precision"]["bf16"]
    indep["ok"] = indep["steps_per_s"] is not None
    one, two = by.get("ppo fp32, 1 rank, deterministic"), by.get("ppo fp32, 2 ranks on one device, deterministic")
    sync = {"check": "6-GPU node: one synchronous 6-rank run (modeled)", "device": "modeled", "modeled": True,
            "model": f"{NODE_GPUS} x {batch:,} / (T1 + {NODE_GPUS - 1} x max(A2 - A1, 0)) steps/s: T1 the 1-rank "
                     f"iteration, A1 / A2 the fp32 1-rank / 2-rank runs' allreduce phase per iteration (a ring of "
                     f"{NODE_GPUS} ranks: {NODE_GPUS - 1} exchange steps where 2 ranks take 1; weak scaling, "
                     f"{batch:,} env steps per rank and iteration); pessimistic: the 2 measured ranks share one GPU",
            "ok": False}
    if one and two and one.get("ok") and two.get("ok"):
        a1 = one["phases"]["seconds_per_iteration"]["allreduce"]
        a2 = two["phases"]["seconds_per_iteration"]["allreduce"]
        step = max(a2 - a1, 0.0)
        ring, bandwidth = (NODE_GPUS - 1) * step, 2 * (NODE_GPUS - 1) / NODE_GPUS * step

        def model(r, extra):
            return NODE_GPUS * batch / (batch / r + extra) if r else None
        sync.update({"allreduce_1_rank_s": a1, "allreduce_2_ranks_s": a2, "exchange_2_ranks_s": step,
                     "allreduce_6_ranks_s": ring, "by_precision": {p: model(rate(p), ring) for p in ("fp32", "bf16")},
                     "fast_kernels": {p: model(rate(p, False), ring) for p in ("fp32", "bf16")},
                     "bandwidth_model": {p: model(rate(p), bandwidth) for p in ("fp32", "bf16")}})
        sync["steps_per_s"] = sync["by_precision"]["bf16"]
        sync["ok"] = sync["steps_per_s"] is not None
    return [indep, sync]


def learner_rows(budget: dict, device: str, tmp: Path, profile_out: Path, seconds: float) -> list[dict]:
    """benchmarks/learner_bench.py in its own process, bound as one rank: the DQN and APPO learners
    alone, then the profiled PPO iteration (its table goes to profile_out)."""
    out = tmp / "learners.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "learner_bench.py"), "--device", device, "--seconds", str(seconds),
           "--out", str(out), "--profile-out", str(profile_out), *budget["learner"]]
    cores = sorted(os.sched_getaffinity(0))[:cores_per_rank(1)]
    from mpippo.launch import die_with_parent
    dies = die_with_parent(signal.SIGTERM)  # a check cut short (timeout) takes it along

    def bound():
        os.sched_setaffinity(0, cores)
        dies()
    limit = 600 + 4 * seconds  # three learners of `seconds` each, the profiled iteration and set-up
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=bound)
    try:
        _, err = proc.communicate(timeout=limit)
        res = subprocess.CompletedProcess(cmd, proc.returncode, "", err)
    except BaseException as e:  # its own time out, or this check's: stopped through its cleanup (SIGTERM)
        proc.terminate()
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        res = None
    got = json.loads(out.read_text()) if out.exists() else {}
    why = (f"did not end within {limit:g} s" if res is None else
           f"exit {res.returncode}: {(res.stderr.strip().splitlines() or [''])[-1][:300]}")
    if res is not None and res.returncode != 0:
        sys.stderr.write("".join(f"  {ln}\n" for ln in res.stderr.strip().splitlines()[-20:]))
    rows = []
    for key, check in (("dqn", "dqn learner alone (prefilled replay, no actors)"),
                       ("dqn_atari", "dqn learner alone on Atari (the Nature CNN, 84x84x4)"),
                       ("appo", "appo learner alone (prefilled segments, no actors)"),
                       ("profile", "ppo iteration profile (torch.profiler)")):
        r = got.get(key)
        if r and "error" not in r:
            rows.append({"check": check, **r, "ok": r.get("finite", True)})
        else:
            rows.append({"check": check, "device": device, "ok": False, "error": (r or {}).get("error") or why})
    return rows


def dqn_row(budget: dict, device: str, tmp: Path) -> dict:
    n = budget["dqn_actors"]
    args = ["--config", str(ROOT / "configs/dqn_procgen.yaml"), "--total-timesteps", str(budget["dqn_steps"]),
            "--set", "dqn.learning_starts=800", "--set", f"dqn.batch_size={budget['dqn_batch']}",
            "--set", "dqn.replay_ratio=8",
            "--set", "dqn.buffer_size=20000", "--num-envs-per-rank", "8", *budget["dqn"]]
    m = trainer(n + 1, args, tmp / "dqn", device)
    return {"check": f"dqn learner + {n} actors (end to end)", "batch": budget["dqn_batch"],
            "device": m["learner_device"],
            "actors": n, "samples_per_s": m["learner_samples_per_s"], "env_steps_per_s": m["fps"],
            "replay_ratio": m.get("replay_ratio"), "ok": m["transitions_sent"] == m["transitions_received"]}


def appo_row(budget: dict, device: str, tmp: Path) -> dict:
    """The APPO learner's rate (V-trace and two PPO epochs per batch of segments) fed by CPU actors."""
    segments, T = budget["appo_batch"]
    n = budget["appo_actors"]
    args = ["--config", str(ROOT / "configs/appo_procgen.yaml"), "--total-timesteps", str(budget["appo_steps"]),
            "--num-envs-per-rank", "16", "--set", f"appo.batch_segments={segments}",
            "--set", f"appo.rollout_length={T}",
            *budget["appo"]]
    m = trainer(n + 1, args, tmp / "appo", device)
    return {"check": f"appo learner + {n} actors (end to end)", "batch": segments * T, "device": m["learner_device"],
            "actors": n, "samples_per_s": m["learner_samples_per_s"], "env_steps_per_s": m["fps"],
            "ok": m["transitions_sent"] == m["transitions_received"]}


def resume_row(budget: dict, device: str, tmp: Path) -> dict:
    """2+2 iterations against 4 on the same device, and 4 against 4 (the kernels' own run-to-run
    gap: resume can be no more exact than that): the parameters, compared."""
    half, base = budget["resume_half"], budget["ppo"]
    for name in ("whole", "again"):
        trainer(1, [*base, "--total-timesteps", str(2 * half)], tmp / name, device, cores_per_rank(1))
    trainer(1, [*base, "--total-timesteps", str(half)], tmp / "halves", device, cores_per_rank(1))
    run_trainer(1, ["--resume", "--total-timesteps", str(2 * half), "--no-progress"], tmp / "halves", "the resumed run",
                timeout=600, threads=cores_per_rank(1))
    a, b, c = (load_checkpoint(latest_path(tmp / d).read_bytes(), f"{d}'s checkpoint")["model"]
               for d in ("whole", "halves", "again"))  # (never code: the loader every reader uses)
    gap = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    repeat = max(float((a[k].float() - c[k].float()).abs().max()) for k in a)
    return {"check": "exact resume (2+2 vs 4 iterations)", "device": device, "max_param_gap": gap,
            "repeat_gap": repeat, "ok": gap == 0.0}


def cpu_seconds() -> float:
    """CPU time of this process and of the runs it started and saw end (their ranks included)."""
    import resource
    return sum(t for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for t in resource.getrusage(who)[:2])


def main(argv=None) -> int:
    return run(TOOL, _main, argv)


def _main(argv) -> int:
    p = Parser(prog="gpu_check.py", description=about(__doc__))
    p.add_argument("--dry-run", action="store_true",
                   help="the same steps on the CPU with tiny budgets, on toy-cue instead of procgen")
    p.add_argument("--out", type=Path, default=None,
                   help="the result file (default benchmarks/results/<date>-gpu.json)")
    p.add_argument("--ppo-iterations", type=count(1, MAX_PPO_ITERATIONS), default=6,
                   help="timed PPO iterations per PPO row (GPU runs; one more runs untimed)")
    p.add_argument("--learner-seconds", type=number(0, 300), default=5.0,
                   help="timed seconds of each learner alone (GPU runs)")
    args = p.parse_args(argv)
    early = args.dry_run or args.out is not None  # a given --out (or a dry run's) first: it needs no torch
    if early:
        check_out(args.out)
    import torch
    if not args.dry_run and not torch.cuda.is_available():
        raise UsageError("no CUDA device here; run it on a GPU machine, or with --dry-run")
    if not early:
        check_out(args.out)  # the default, benchmarks/results/: probed only where the check will run
    budget, device = (DRY, "cpu") if args.dry_run else (REAL, "cuda")
    iterations = 1 if args.dry_run else args.ppo_iterations
    path = result_path("-gpu-dryrun" if args.dry_run else "-gpu", args.out)
    profile_out = output_file(path.with_name(path.stem + "-profile.txt"), "--out's profile")  # now, not minutes on
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
              "dry_run": args.dry_run, "complete": False, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "cores": len(os.sched_getaffinity(0)), "cores_per_rank": cores_per_rank(1),
              "ppo_timed_iterations": iterations, "node_model": {"gpus": NODE_GPUS, "cores": NODE_CORES},
              "profile": profile_out.name, "rows": []}
    rows = result["rows"]
    t_start = time.perf_counter()

    def step(make, name: str) -> None:
        """One row (or a few): timed, recorded, written; a failure is the row's, and the next one runs."""
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        try:
            got = make()
        except ToolFailure as e:
            got = {"check": name, "device": device, "ok": False, "error": str(e)}
        for r in got if isinstance(got, list) else [got]:
            r.setdefault("wall_s", time.perf_counter() - t0)
            rows.append(r)
        result["wall_s"] = time.perf_counter() - t_start
        write_json(path, result, "--out")
        print(f"gpu-check: {name}: {time.perf_counter() - t0:.0f} s ({cpu_seconds() - cpu0:.0f} s of CPU)", flush=True)

    # a SIGTERM (timeout, a session's end) ends the check through its cleanup (toolcli.run): its runs
    # end and their folders go; the result file holds the rows done
    with launch.temp_folder("gpu-check") as tmp:
        tmp = Path(tmp)
        for precision in ("fp32", "bf16"):
            for det in (True, False):
                step(lambda: ppo_row(budget, device, tmp, iterations, 1, precision, det),
                     f"ppo {precision}, 1 rank, {'deterministic' if det else 'fast kernels'}")
        step(lambda: ppo_row(budget, device, tmp, iterations, 1, "bf16", True, graph=False), EAGER_ROW)
        step(lambda: ppo_row(budget, device, tmp, iterations, 2, "fp32", True),
             "ppo fp32, 2 ranks on one device, deterministic")
        step(lambda: ppo_row(budget, device, tmp, iterations, 1, "bf16", False, atari=True), ATARI_ROW)
        by = {r["check"]: r for r in rows}
        step(lambda: node_rows(by, budget["envs_per_rank"] * budget["n_steps"]), "6-GPU node (modeled)")
        step(lambda: learner_rows(budget, device, tmp, profile_out, args.learner_seconds),
             "learners alone and the profile")
        step(lambda: dqn_row(budget, device, tmp), "dqn end to end")
        step(lambda: appo_row(budget, device, tmp), "appo end to end")
        step(lambda: resume_row(budget, device, tmp), "exact resume")
    result["targets"] = targets(rows)
    result["deterministic_cost"] = deterministic_cost(rows)
    result["cuda_graph_gain"] = graph_gain(rows)
    result["complete"] = True
    write_json(path, result, "--out")
    print_table(result)
    print(f"gpu-check: wrote {path} and {profile_out.name} beside it ({result['wall_s']:.0f} s)")
    return 0 if all(r["ok"] for r in rows) else 1


def targets(rows: list[dict]) -> dict:
    by = {r["check"]: r for r in rows}
    out = {}
    for name, (check, field, target, unit) in TARGETS.items():
        row = by.get(check) or {}
        value = row.get(field) if row.get("ok") else None
        out[name] = {"value": value, "target": target, "unit": unit, "reached": value is not None and value >= target,
                     "basis": check}
        fast = row.get("fast_kernels", {}).get("bf16") if "node" in name else \
            (by.get(check.replace("deterministic", "fast kernels")) or {}).get(field) if "one_rank" in name else None
        if fast is not None:
            out[name]["value_fast_kernels"] = fast
    return out


def deterministic_cost(rows: list[dict]) -> dict:
    """Per precision: the fast kernels' steps/s over the deterministic kernels' (1.0: no cost)."""
    by = {r["check"]: r for r in rows}
    out = {}
    for p in ("fp32", "bf16"):
        det, fast = by.get(f"ppo {p}, 1 rank, deterministic"), by.get(f"ppo {p}, 1 rank, fast kernels")
        if det and fast and det.get("ok") and fast.get("ok"):
            out[p] = {"deterministic_steps_per_s": det["steps_per_s"], "fast_steps_per_s": fast["steps_per_s"],
                      "fast_over_deterministic": fast["steps_per_s"] / det["steps_per_s"]}
    return out


def graph_gain(rows: list[dict]) -> dict | None:
    """The bf16 deterministic row (policy step graphed where CUDA is) against the same run eager."""
    by = {r["check"]: r for r in rows}
    graphed, eager = by.get("ppo bf16, 1 rank, deterministic"), by.get(EAGER_ROW)
    if not (graphed and eager and graphed.get("ok") and eager.get("ok")):
        return None
    inference = [r["phases"]["seconds_per_iteration"]["inference"] for r in (graphed, eager)]
    return {"policy_step": graphed["placement"].get("policy_step"), "steps_per_s": graphed["steps_per_s"],
            "eager_steps_per_s": eager["steps_per_s"], "over_eager": graphed["steps_per_s"] / eager["steps_per_s"],
            "inference_s_per_iteration": inference[0], "eager_inference_s_per_iteration": inference[1]}


def summary(r: dict) -> str:
    if not r["ok"] and r.get("error"):
        return f"FAILED: {r['error'][:120]}"
    if r.get("modeled"):
        bp = r.get("by_precision") or {}
        return ", ".join(f"{p} {v:,.0f}" for p, v in bp.items() if v) + " steps/s (modeled)"
    if "phases" in r:
        mem = f", {r['gpu_peak_mem_mb']:,.0f} MB GPU" if r.get("gpu_peak_mem_mb") else ""
        return f"{r['steps_per_s']:,.0f} steps/s{mem}, {r['placement'].get('affinity_cores')} cores/rank"
    if "iteration_s" in r:
        busy = f", device busy {r['device_busy_share']:.0%}" if r.get("device_busy_share") is not None else ""
        return f"{r['iteration_s']:.2f} s/iteration{busy} -> {r['table']}"
    if "samples_per_s" in r:
        return f"{r['samples_per_s']:,.0f} samples/s (batch {r['batch']})"
    return f"gap {r['max_param_gap']:.3g} (two fresh runs: {r['repeat_gap']:.3g})"


def print_table(result: dict) -> None:
    rows = result["rows"]
    print(f"\n{'check':<52} {'device':<8} {'result':<58} ok")
    for r in rows:
        print(f"{r['check']:<52} {str(r.get('device')):<8} {summary(r):<58} {'yes' if r['ok'] else 'NO'}")
    print("\nphases, seconds per iteration (share): env_step, inference, update, allreduce, other")
    for r in rows:
        if "phases" in r:
            ph = r["phases"]
            print(f"  {r['check']:<50} " + ", ".join(f"{ph['seconds_per_iteration'][g]:.3f} ({ph['share'][g]:.0%})"
                                                      for g in PHASE_GROUPS))
    for p, c in result["deterministic_cost"].items():
        print(f"deterministic kernels, {p}: fast kernels run {c['fast_over_deterministic']:.2f}x their rate")
    g = result.get("cuda_graph_gain")
    if g:
        print(f"policy step {g['policy_step']} vs eager (bf16): {g['over_eager']:.2f}x the rate; inference "
              f"{g['inference_s_per_iteration']:.3f} vs {g['eager_inference_s_per_iteration']:.3f} s per iteration")
    print("\ntargets (issue 28):")
    for name, t in result["targets"].items():
        value = "not measured" if t["value"] is None else f"{t['value']:,.0f}"
        fast = f" (fast kernels: {t['value_fast_kernels']:,.0f})" if t.get("value_fast_kernels") else ""
        print(f"  {name:<40} {value} {t['unit']}{fast} vs >= {t['target']:,}: "
              f"{'reached' if t['reached'] else 'NOT reached'}")


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
