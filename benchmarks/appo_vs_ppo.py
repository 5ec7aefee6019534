#!/usr/bin/env python
"""Synchronous PPO against APPO on the same cores for the same wall-clock budget (docs/algorithms.md, "Which
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

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mpippo.toolcli import (COUNT, MAX_RANKS, NUMBER, UsageError, Maybe, Parser, about, ToolFailure, check_trainer,  # noqa: E402
                     conform, count, number, output_folder, ranks_fit, run, run_trainer, shown, write_json)

from mpippo.config import agent_folder  # noqa: E402
from mpippo.checkpoint import latest_path  # noqa: E402
from mpippo.files import METRICS, RUN_CONFIG, read_metrics, read_run_config  # noqa: E402
from mpippo.runlock import LOCK_NAME  # noqa: E402

TOOL = "appo_vs_ppo"
OUTPUTS = ("comparison.png", "comparison_report.txt", "appo_vs_ppo.json")
KEPT = ("done", "duration")  # a run that ended so is kept as it is
# what the comparison and the model read of each run's metrics
SPEC = {"sync PPO": {"world_size": COUNT, "total_timesteps": COUNT, "fps": NUMBER, "episode_return_mean": Maybe(NUMBER),
                     "phase_seconds": {k: NUMBER for k in ("env_step", "inference", "backward", "optimizer")}},
        "APPO": {"fps": NUMBER, "epochs": COUNT, "episode_return_mean": Maybe(NUMBER)}}


def fresh_args(config: str, args) -> list[str]:
    return ["--config", config, "--set", f"env.name={args.env}", "--set", f"training.duration_hours={args.minutes / 60}",
            "--total-timesteps", str(10**9), "--set", "logging.progress=false"]


def checkpoint_of(folder: Path) -> Path | None:
    return next((p for p in (latest_path(folder), latest_path(agent_folder(folder, 0, 2)))
                 if p.is_file()), None)


def kept_metrics(name: str, folder: Path) -> dict | None:
    """The metrics of a run that ended (checked for what the comparison reads), else None."""
    if not (folder / METRICS).exists():
        return None
    m = read_metrics(folder)
    if m.get("stop_reason") not in KEPT:
        return None
    return check_costs(name, conform(m, SPEC[name], folder / METRICS), folder)


def check_costs(name: str, m: dict, folder: Path) -> dict:
    """What the model divides by, in a sync PPO run's metrics: steps, and time spent acting."""
    if name != "sync PPO":
        return m
    if not m["total_timesteps"]:
        raise UsageError(f"metrics file '{shown(folder / METRICS)}': total_timesteps: 0 steps to compare")
    ph = m["phase_seconds"]
    if not ph["env_step"] + ph["inference"] > 0:
        raise UsageError(f"metrics file '{shown(folder / METRICS)}': phase_seconds: env_step + inference is "
                         f"{ph['env_step'] + ph['inference']}, expected a positive time spent acting")
    return m


def check_run(name: str, ranks: int, config: str, args, folder: Path) -> None:
    """Before anything runs: the folder is new, holds a run that ended, or one to resume (its
    config as the trainer will read it); the options pass the trainer's checks at `ranks`."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--root: '{shown(folder)}' is a file, where the {name} run folder goes")
    if kept_metrics(name, folder) is not None:
        return
    if checkpoint_of(folder):
        read_run_config(folder)
        check_trainer(["--config", str(folder / RUN_CONFIG)], ranks, f"{name} (resumed)")
        return
    if folder.is_dir() and any(p.name != LOCK_NAME for p in folder.iterdir()):
        raise UsageError(f"--root: '{shown(folder)}' holds an unfinished {name} run without a checkpoint to resume "
                          f"from; move it away to start afresh")
    check_trainer(fresh_args(config, args), ranks, name)


def run_one(name: str, ranks: int, config: str, args, folder: Path) -> dict:
    if (m := kept_metrics(name, folder)) is not None:
        print(f"{name}: finished before, kept ({folder})", flush=True)
        return m
    cmd = ["--resume"] if checkpoint_of(folder) else fresh_args(config, args)
    print(f"{name}: {ranks} ranks, {args.minutes:g} minutes on {args.env} -> {folder}", flush=True)
    # its console lines (progress) come through; a stop of this tool is the run's checkpoint and stop
    m = run_trainer(ranks, cmd, folder, name, resume="run the same command again to resume it", threads=1,
                    timeout=args.minutes * 60 + 900, capture=False)
    return check_costs(name, conform(m, SPEC[name], folder / METRICS), folder)


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
    return run(TOOL, _main, argv)


def _main(argv) -> int:
    p = Parser(prog="appo_vs_ppo.py", description=about(__doc__))
    p.add_argument("--env", default="starpilot")
    p.add_argument("--minutes", type=number(0, 7 * 24 * 60), default=20.0)
    p.add_argument("--ranks", type=count(1, MAX_RANKS - 1), default=2,
                   help="sync PPO ranks = APPO actors (APPO adds a learner)")
    p.add_argument("--root", type=Path, default=ROOT / "runs" / "appo_vs_ppo")
    p.add_argument("--out", type=Path, default=ROOT / "analysis" / "data" / "appo_vs_ppo")
    args = p.parse_args(argv)
    args.root, args.out = Path(os.path.abspath(args.root)), Path(os.path.abspath(args.out))  # runs start in the root
    if args.root.exists() and not args.root.is_dir():
        raise UsageError(f"--root: '{shown(args.root)}' is a file; give a folder")
    ranks_fit(args.ranks + 1, "--ranks")
    plan = [("sync PPO", args.ranks, str(ROOT / "configs/ppo_procgen.yaml"), args.root / "sync_ppo"),
            ("APPO", args.ranks + 1, str(ROOT / "configs/appo_procgen.yaml"), args.root / "appo")]
    for name, ranks, config, folder in plan:
        check_run(name, ranks, config, args, folder)
    output_folder(args.out, "--out", OUTPUTS)
    ppo, appo = (run_one(name, ranks, config, args, folder) for name, ranks, config, folder in plan)
    res = subprocess.run([sys.executable, str(ROOT / "analysis" / "compare_results.py"), str(args.root / "sync_ppo"),
                          str(args.root / "appo"), "--out", str(args.out)], env=os.environ)
    if res.returncode != 0:
        raise ToolFailure(f"compare_results exited {res.returncode} (its line above says why)")
    keep = ("algo", "world_size", "total_timesteps", "duration_s", "fps", "episode_return_mean", "precision",
            "learner_samples_per_s", "policy_lag", "longest_credit_hold_s", "updates", "phase_seconds")
    result = {"env": args.env, "minutes": args.minutes, "cores": os.cpu_count(),
              "sync_ppo": {k: ppo[k] for k in keep if k in ppo}, "appo": {k: appo[k] for k in keep if k in appo},
              "model_48_cores_1_gpu": model(ppo, appo)}
    write_json(args.out / OUTPUTS[2], result, "--out")
    m = result["model_48_cores_1_gpu"]
    print(f"\nsync PPO {ppo['fps']:.0f} steps/s, return {ppo['episode_return_mean']}; APPO {appo['fps']:.0f} steps/s, "
          f"return {appo['episode_return_mean']} ({args.minutes:g} minutes each on {os.cpu_count()} cores)\n"
          f"modeled, 48 cores + 1 GPU: sync PPO on 48 CPU ranks {m['ppo_cpu_steps_per_s']:,.0f} steps/s; APPO's 47 "
          f"actors collect {m['appo_collection_steps_per_s']:,.0f} steps/s if the GPU learner trains "
          f"{m['appo_learner_samples_per_s_needed']:,.0f} samples/s\nwrote {args.out / OUTPUTS[2]}", flush=True)
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
