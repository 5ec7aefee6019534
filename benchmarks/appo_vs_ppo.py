#!/usr/bin/env python
"""Synchronous PPO against APPO on the same cores for the same wall-clock budget (README, "Which
algorithm?"): the default configs on one Procgen game, one run after the other, then
analysis/compare_results.py on both and a cost model of a 48-core node with one GPU.

    python benchmarks/appo_vs_ppo.py                          # starpilot, 20 minutes each, 2 cores
    python benchmarks/appo_vs_ppo.py --minutes 5 --env coinrun --out /tmp/cmp

Sync PPO runs on `--ranks` ranks; APPO on one learner and `--ranks` actors (the same envs in all,
the same cores: the learner shares them). A run that already finished is kept (the script can be
rerun after an interruption); one that did not is resumed for the rest of its time budget.
Writes <out>/comparison.png, comparison_report.txt (compare_results) and appo_vs_ppo.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mpippo import launch  # noqa: E402


def run(name: str, ranks: int, config: str, args, folder: Path) -> dict:
    metrics = folder / "benchmark_metrics.json"
    if metrics.exists() and json.loads(metrics.read_text()).get("stop_reason") in ("done", "duration"):
        print(f"{name}: finished before, kept ({folder})", flush=True)
        return json.loads(metrics.read_text())
    resume = (folder / "checkpoints" / "latest.pt").exists() or (folder / "config.yaml").exists()
    cmd = ["--resume"] if resume else ["--config", config, "--set", f"env.name={args.env}",
                                       "--set", f"training.duration_hours={args.minutes / 60}",
                                       "--total-timesteps", str(10**9), "--set", "logging.progress=false"]
    print(f"{name}: {ranks} ranks, {args.minutes:g} minutes on {args.env} -> {folder}", flush=True)
    command, env = launch.mpirun_command(ranks, [str(ROOT / "run_mpi.py"), "--output-dir", str(folder), *cmd], 1)
    res = subprocess.run(command, cwd=ROOT, env=env, timeout=args.minutes * 60 + 900)  # its console lines: progress
    if res.returncode != 0:
        sys.exit(f"mpippo: error: appo_vs_ppo: {name} exited {res.returncode}")
    return json.loads(metrics.read_text())


def model(ppo: dict, appo: dict, cores: int = 48) -> dict:
    """What the measured costs predict for a node of `cores` CPU cores and one GPU (modeled, not
    measured): sync PPO on all cores, each rank as fast as one here; APPO's collection on
    cores - 1 actors at the CPU cost of acting measured in the PPO run (env step + inference per
    env step and core), its learner on the GPU needing epochs x that many samples/s."""
    ph, ranks = ppo["phase_seconds"], ppo["world_size"]
    steps_per_rank = ppo["total_timesteps"] / ranks
    act_s = (ph["env_step"] + ph["inference"]) / steps_per_rank  # CPU seconds per env step, acting
    learn_s = (ph["backward"] + ph["optimizer"]) / steps_per_rank  # CPU seconds per env step, learning
    actors = cores - 1
    collect = actors / act_s
    return {"cores": cores, "ppo_cpu_steps_per_s": cores * ppo["fps"] / ranks,
            "act_cpu_ms_per_step": 1e3 * act_s, "learn_cpu_ms_per_step": 1e3 * learn_s,
            "appo_collection_steps_per_s": collect, "appo_learner_samples_per_s_needed": collect * appo["epochs"],
            "label": "modeled from this machine's measured per-step costs; not measured on such a node"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="starpilot")
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--ranks", type=int, default=2, help="sync PPO ranks = APPO actors (APPO adds a learner)")
    p.add_argument("--root", type=Path, default=ROOT / "runs" / "appo_vs_ppo")
    p.add_argument("--out", type=Path, default=ROOT / "analysis" / "data" / "appo_vs_ppo")
    args = p.parse_args(argv)
    ppo = run("sync PPO", args.ranks, "configs/ppo_procgen.yaml", args, args.root / "sync_ppo")
    appo = run("APPO", args.ranks + 1, "configs/appo_procgen.yaml", args, args.root / "appo")
    args.out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(ROOT / "analysis" / "compare_results.py"), str(args.root / "sync_ppo"),
                    str(args.root / "appo"), "--out", str(args.out)], check=True, env=os.environ)
    keep = ("algo", "world_size", "total_timesteps", "duration_s", "fps", "episode_return_mean", "precision",
            "learner_samples_per_s", "policy_lag", "longest_credit_hold_s", "updates", "phase_seconds")
    result = {"env": args.env, "minutes": args.minutes, "cores": os.cpu_count(),
              "sync_ppo": {k: ppo[k] for k in keep if k in ppo}, "appo": {k: appo[k] for k in keep if k in appo},
              "model_48_cores_1_gpu": model(ppo, appo)}
    (args.out / "appo_vs_ppo.json").write_text(json.dumps(result, indent=1))
    m = result["model_48_cores_1_gpu"]
    print(f"\nsync PPO {ppo['fps']:.0f} steps/s, return {ppo['episode_return_mean']}; APPO {appo['fps']:.0f} steps/s, "
          f"return {appo['episode_return_mean']} ({args.minutes:g} minutes each on {os.cpu_count()} cores)\n"
          f"modeled, 48 cores + 1 GPU: sync PPO on 48 CPU ranks {m['ppo_cpu_steps_per_s']:,.0f} steps/s; APPO's 47 "
          f"actors collect {m['appo_collection_steps_per_s']:,.0f} steps/s if the GPU learner trains "
          f"{m['appo_learner_samples_per_s_needed']:,.0f} samples/s\nwrote {args.out / 'appo_vs_ppo.json'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
