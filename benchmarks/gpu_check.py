#!/usr/bin/env python
"""Every CUDA path of mpippo in one go (make gpu-check): PPO on one GPU in fp32 and bf16, two ranks
sharing it (the gradient Allreduce through a pinned host copy), an exact resume on the GPU, and the
DQN and APPO learners on it (fed by CPU actors). Prints a table and writes benchmarks/results/<date>-gpu.json.

    make gpu-check                      # on a machine with a GPU: about 5-8 minutes
    make gpu-check ARGS=--dry-run       # the same steps on the CPU with tiny budgets (make test runs it)

Without CUDA and without --dry-run it says so and exits 2. Targets (issue: 1 rank >= 10,000 steps/s
fp32, bf16 >= 1.5x that, 2 ranks >= 1.6x one, DQN learner >= 50,000 samples/s; APPO learner >= the
23,500 samples/s that 47 CPU actors at 250 steps/s need with 2 epochs) are reported as reached or
not, with the numbers.
"""
from __future__ import annotations

import datetime
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "analysis"))
from results_file import check_out, write_result  # noqa: E402  (benchmarks/)
from toolcli import ConfigError, Parser, count, run, run_trainer  # noqa: E402  (analysis/)

TOOL = "gpu-check"
MAX_PPO_ITERATIONS = 200  # 200 x 16,384 steps at the measured 6,500-7,500 steps/s: about 8 of a run's 10 minutes

# the default config (64 envs x 256 steps = 16,384 per iteration) on the GPU; smoke-sized on the CPU
REAL = {"ppo": [], "ppo_steps": 12 * 16384, "resume_half": 2 * 16384, "dqn_steps": 60_000, "dqn_batch": 512,
        "appo": [], "appo_batch": (64, 64), "appo_steps": 40 * 4096}
DRY = {"ppo": ["--config", "configs/smoke.yaml"], "ppo_steps": 512, "resume_half": 256, "dqn_steps": 1200,
       "dqn_batch": 32, "appo": ["--set", "model.channels=[4]", "--set", "model.hidden_size=16"], "appo_batch": (8, 8),
       "appo_steps": 1024}


def trainer(ranks: int, args: list[str], out: Path, device: str) -> dict:
    common = ["--no-progress", "--device", device, "--set", "logging.tensorboard=false", "--set", "logging.print_interval=1000"]
    return run_trainer(ranks, [*args, *common], out, f"the {ranks}-rank run", timeout=600)


def ppo_rows(budget: dict, device: str, tmp: Path) -> list[dict]:
    rows = []
    for name, ranks, extra in (("ppo fp32, 1 rank", 1, []), ("ppo bf16, 1 rank", 1, ["--set", "training.precision=bf16"]),
                               ("ppo fp32, 2 ranks on one device", 2, [])):
        folder = tmp / name.replace(" ", "_").replace(",", "")
        m = trainer(ranks, [*budget["ppo"], "--total-timesteps", str(budget["ppo_steps"]), *extra], folder, device)
        rows.append({"check": name, "device": m.get("device_used"), "steps_per_s": m.get("fps_steady") or m["fps"],
                     "gpu_peak_mem_mb": m.get("gpu_peak_mem_mb"), "ok": m["finished"]})
    return rows


def resume_row(budget: dict, device: str, tmp: Path) -> dict:
    """2+2 iterations against 4 on the same device, and 4 against 4 (the kernels' own run-to-run
    gap: resume can be no more exact than that): the parameters, compared."""
    import torch
    half, base = budget["resume_half"], budget["ppo"]
    for name in ("whole", "again"):
        trainer(1, [*base, "--total-timesteps", str(2 * half)], tmp / name, device)
    trainer(1, [*base, "--total-timesteps", str(half)], tmp / "halves", device)
    run_trainer(1, ["--resume", "--total-timesteps", str(2 * half), "--no-progress"], tmp / "halves", "the resumed run",
                timeout=600)
    a, b, c = (torch.load(tmp / d / "checkpoints" / "latest.pt", weights_only=False)["model"]
               for d in ("whole", "halves", "again"))
    gap = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    repeat = max(float((a[k].float() - c[k].float()).abs().max()) for k in a)
    return {"check": "exact resume (2+2 vs 4 iterations)", "device": device, "max_param_gap": gap,
            "repeat_gap": repeat, "ok": gap == 0.0}


def dqn_row(budget: dict, device: str, tmp: Path) -> dict:
    args = ["--config", "configs/dqn_procgen.yaml", "--total-timesteps", str(budget["dqn_steps"]),
            "--set", "dqn.learning_starts=800", "--set", f"dqn.batch_size={budget['dqn_batch']}", "--set", "dqn.replay_ratio=8",
            "--set", "dqn.buffer_size=20000", "--num-envs-per-rank", "8"]
    m = trainer(3, args, tmp / "dqn", device)
    return {"check": "dqn learner", "batch": budget["dqn_batch"], "device": m["learner_device"],
            "samples_per_s": m["learner_samples_per_s"],
            "ok": m["transitions_sent"] == m["transitions_received"]}


def appo_row(budget: dict, device: str, tmp: Path) -> dict:
    """The APPO learner's rate (V-trace and two PPO epochs per batch of segments) fed by 3 actors."""
    segments, T = budget["appo_batch"]
    args = ["--config", "configs/appo_procgen.yaml", "--total-timesteps", str(budget["appo_steps"]),
            "--num-envs-per-rank", "16", "--set", f"appo.batch_segments={segments}", "--set", f"appo.rollout_length={T}",
            *budget["appo"]]
    m = trainer(4, args, tmp / "appo", device)
    return {"check": "appo learner", "batch": segments * T, "device": m["learner_device"],
            "samples_per_s": m["learner_samples_per_s"], "ok": m["transitions_sent"] == m["transitions_received"]}


def main(argv=None) -> int:
    return run(TOOL, _main, argv)


def _main(argv) -> int:
    p = Parser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU with tiny budgets")
    p.add_argument("--out", type=Path, default=None, help="the result file (default benchmarks/results/<date>-gpu.json)")
    p.add_argument("--ppo-iterations", type=count(1, MAX_PPO_ITERATIONS), default=12,
                   help="PPO updates per timed row (GPU runs)")
    args = p.parse_args(argv)
    early = args.dry_run or args.out is not None  # a given --out (or a dry run's) first: it needs no torch
    if early:
        check_out(args.out)
    import torch
    if not args.dry_run and not torch.cuda.is_available():
        raise ConfigError("no CUDA device here; run it on a GPU machine, or with --dry-run")
    if not early:
        check_out(args.out)  # the default, benchmarks/results/: probed only where the check will run
    budget, device = (DRY, "cpu") if args.dry_run else (dict(REAL, ppo_steps=args.ppo_iterations * 16384), "cuda")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = ppo_rows(budget, device, tmp) + [resume_row(budget, device, tmp), dqn_row(budget, device, tmp),
                                                appo_row(budget, device, tmp)]
    print_table(rows)
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
              "dry_run": args.dry_run, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "targets": targets(rows), "rows": rows}
    out = write_result(result, "-gpu-dryrun" if args.dry_run else "-gpu", args.out)
    print(f"gpu-check: wrote {out}")
    return 0 if all(r["ok"] for r in rows) else 1


def targets(rows: list[dict]) -> dict:
    by = {r["check"]: r for r in rows}
    fp32, bf16 = by["ppo fp32, 1 rank"]["steps_per_s"], by["ppo bf16, 1 rank"]["steps_per_s"]
    two, dqn = by["ppo fp32, 2 ranks on one device"]["steps_per_s"], by["dqn learner"]["samples_per_s"]
    appo = by["appo learner"]["samples_per_s"]
    # APPO: one GPU learner must train what 47 CPU actors collect (about 47 x 250 steps/s, x 2 epochs)
    return {"ppo_fp32_steps_per_s": [fp32, fp32 >= 10_000], "bf16_over_fp32": [bf16 / fp32, bf16 / fp32 >= 1.5],
            "two_ranks_over_one": [two / fp32, two / fp32 >= 1.6], "dqn_samples_per_s": [dqn, dqn >= 50_000],
            "appo_samples_per_s": [appo, appo >= 2 * 47 * 250]}


def print_table(rows: list[dict]) -> None:
    print(f"\n{'check':<38} {'device':<8} {'result':<34} ok")
    for r in rows:
        if "steps_per_s" in r:
            mem = f", {r['gpu_peak_mem_mb']:.0f} MB GPU" if r.get("gpu_peak_mem_mb") else ""
            res = f"{r['steps_per_s']:,.0f} steps/s{mem}"
        elif "samples_per_s" in r:
            res = f"{r['samples_per_s']:,.0f} samples/s (batch {r['batch']})"
        else:
            res = f"gap {r['max_param_gap']:.3g} (two fresh runs: {r['repeat_gap']:.3g})"
        print(f"{r['check']:<38} {str(r['device']):<8} {res:<34} {'yes' if r['ok'] else 'NO'}")


if __name__ == "__main__":
    raise SystemExit(main())
