#!/usr/bin/env python
"""The balanced cut-off against a slow rank: steps/s with and without training.rollout_cutoff.

    python benchmarks/cutoff_bench.py [--ranks 2] [--slow 0 0.3 0.5] [--cutoff 0.5] [--out result.json]

For each slowdown F, the last rank is made F slower (MPIPPO_FAULT kind=lag: after each env step and
each backward pass it sleeps F times what that took, as a slow node would run) and the same job runs
twice: every rank collecting n_steps (the default), and with the cut-off. Reported per pair: env
steps/s (steady), the ratio, and what the cut-off took (iterations cut, the least share of n_steps a
rank kept). F = 0 is the even-ranks case: what the cut-off costs when there is nothing to gain. Then
toy-cue learning at the largest F, with and without it: the final returns (the learning test's bar
is 12 of 16). The ranks share this machine's cores: run it alone.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results_file: the repository on the path
from results_file import check_out, write_result  # noqa: E402
from mpippo import launch  # noqa: E402
from mpippo.toolcli import (ROOT, Parser, about, check_trainer, count, distinct, number, ranks_fit, run,  # noqa: E402
                            run_trainer)

TOOL = "benchmarks/cutoff_bench.py"


def make_parser() -> Parser:
    p = Parser(prog=TOOL, description=about(__doc__))
    p.add_argument("--ranks", type=count(2, 64, "a whole number of ranks from 2"), default=2)
    p.add_argument("--slow", type=number(0, 10, lo_open=False, what="a slowdown factor"), nargs="+",
                   default=[0.0, 0.3, 0.5], help="slowdowns of the last rank (0.3: 30%%)")
    p.add_argument("--cutoff", type=number(0, 1, what="a fraction of the ranks"), default=0.5)
    p.add_argument("--env", default="starpilot")
    p.add_argument("--iterations", type=count(2, 10_000), default=16)
    p.add_argument("--envs-per-rank", type=count(1, 4096), default=8)
    p.add_argument("--n-steps", type=count(8, 1 << 16), default=64)
    p.add_argument("--no-learning", action="store_true", help="skip the toy-cue learning pair")
    p.add_argument("--out", type=Path, help="result file (default benchmarks/results/<date>-cutoff.json)")
    return p


def trainer_argv(args, cutoff: float | None, toy: bool) -> list[str]:
    base = (["--config", str(ROOT / "configs/toy_cue.yaml")] if toy else
            ["--config", str(ROOT / "configs/smoke.yaml"), "--set", f"env.name={args.env}", "--num-envs-per-rank",
             str(args.envs_per_rank), "--n-steps", str(args.n_steps), "--total-timesteps",
             str(args.ranks * args.envs_per_rank * args.n_steps * args.iterations),
             "--set", "training.num_minibatches=4", "--set", "logging.log_interval=4"])
    argv = base + ["--no-progress", "--set", "logging.tensorboard=false", "--set", "parallel.threads_per_rank=1"] + (
        ["--set", f"training.rollout_cutoff={cutoff}"] if cutoff is not None else [])
    return argv


def job(args, slow: float, cutoff: float | None, out: Path, toy: bool = False) -> dict:
    what = f"{'toy-cue' if toy else args.env} with the last rank {slow:g} slower, cut-off {cutoff}"
    argv = trainer_argv(args, cutoff, toy)
    env = {"MPIPPO_FAULT": f"rank={args.ranks - 1},kind=lag,factor={slow}"} if slow > 0 else {}
    print(f"cutoff_bench: {what} ...", flush=True)
    m = run_trainer(args.ranks, argv, out, what, threads=1, timeout=1800, extra_env=env)
    cut = m.get("rollout_cutoff") or {}
    return {"slow": slow, "cutoff": cutoff, "steps_per_s": m.get("fps_steady") or m["fps"],
            "return": m.get("episode_return_mean"), "iterations": m["iterations"],
            "iterations_cut": cut.get("iterations_cut", 0), "least_share": cut.get("least_share_collected", 1.0),
            "mean_share": cut.get("mean_share_collected", 1.0), "total_timesteps": m["total_timesteps"]}


def main(argv: list[str] | None = None) -> int:
    return run(TOOL, _main, argv)


def _main(argv: list[str] | None) -> int:
    args = make_parser().parse_args(argv)
    args.slow = distinct(args.slow, "--slow")
    ranks_fit(args.ranks, "--ranks")
    check_trainer(trainer_argv(args, args.cutoff, toy=False), args.ranks, "the benchmark's run")
    check_out(args.out)
    rows, learning = [], []
    with launch.temp_folder("cutoff") as tmp:
        for i, slow in enumerate(args.slow):
            pair = [job(args, slow, c, Path(tmp) / f"{i}-{c}") for c in (None, args.cutoff)]
            rows.append({"slow": slow, "off": pair[0], "on": pair[1],
                         "gain": pair[1]["steps_per_s"] / pair[0]["steps_per_s"]})
        if not args.no_learning:
            worst = max(args.slow)
            learning = [job(args, worst, c, Path(tmp) / f"toy-{c}", toy=True) for c in (None, args.cutoff)]
    print(f"\n{args.ranks} ranks x {args.envs_per_rank} envs x {args.n_steps} steps of {args.env}, the last rank slowed; "
          f"cut-off {args.cutoff} (the rollout ends when {args.cutoff:g} of the ranks have their steps)")
    print(f"{'slower by':>10} {'off steps/s':>12} {'on steps/s':>11} {'on/off':>7} {'cut':>9} {'least kept':>11}")
    for r in rows:
        print(f"{r['slow']:>10.0%} {r['off']['steps_per_s']:>12.0f} {r['on']['steps_per_s']:>11.0f} {r['gain']:>7.2f} "
              f"{r['on']['iterations_cut']:>4}/{r['on']['iterations']:<4} {r['on']['least_share']:>11.2f}")
    for r in learning:
        print(f"toy-cue, last rank {r['slow']:.0%} slower, cut-off {r['cutoff']}: return {r['return']:.2f} "
              f"after {r['total_timesteps']:,} steps ({r['steps_per_s']:.0f} steps/s)")
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cores": len(os.sched_getaffinity(0)),
              "settings": vars(args) | {"out": None}, "rows": rows, "learning": learning}
    print(f"cutoff_bench: wrote {write_result(json.loads(json.dumps(result, default=str)), '-cutoff', args.out)}")
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
