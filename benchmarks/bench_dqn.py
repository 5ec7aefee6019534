#!/usr/bin/env python
"""DQN (Ape-X layout) throughput: actor collection scaling with 1, 2, 3 actors, and learner samples/s.

Collection: the learner stores but does not train (replay_ratio 0), so actors run unthrottled;
steps/s per actor and in total show how collection scales. Learner: 1 actor, replay ratio 4,
learning from the start: learner updates/s and samples/s on this machine's device (CPU here;
the GPU where training.device finds one). --env atari measures the same on Atari with
configs/dqn_atari.yaml (the Nature CNN, Ape-X's batch of 512) instead of Procgen's config.
Writes benchmarks/results/<date>-dqn.json (-dqn-atari.json for Atari).
"""
from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from results_file import check_out, write_result  # noqa: E402  (benchmarks/)
from mpippo import launch  # noqa: E402
from mpippo.machine import describe  # noqa: E402
from mpippo.toolcli import MAX_RANKS, UsageError, Parser, about, check_trainer, count, distinct, ranks_fit, run_trainer  # noqa: E402
from mpippo.toolcli import run as run_tool  # noqa: E402

TOOL = "bench_dqn"
CONFIGS = {"procgen": "configs/dqn_procgen.yaml", "atari": "configs/dqn_atari.yaml"}


def config(args) -> list[str]:
    return ["--config", str(ROOT / CONFIGS[args.env]), "--set", "logging.tensorboard=false"]


def collection_args(n: int, args) -> list[str]:
    """n actors, the learner storing without training (replay ratio 0): collection alone."""
    return [*config(args), "--num-envs-per-rank", str(args.envs_per_actor), "--total-timesteps", str(n * args.steps_per_actor),
            "--set", "dqn.replay_ratio=0", "--set", "dqn.buffer_size=20000", "--set", "dqn.learning_starts=500",
            "--set", f"training.device={args.device}"]


def learner_args(args) -> list[str]:
    return [*config(args), "--num-envs-per-rank", str(args.envs_per_actor), "--total-timesteps", str(args.learner_steps),
            "--set", "dqn.learning_starts=500", "--set", "dqn.buffer_size=20000", "--set", f"training.device={args.device}"]


def main(argv: list[str] | None = None) -> int:
    return run_tool(TOOL, _main, argv)


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="bench_dqn.py", description=about(__doc__))
    p.add_argument("--env", choices=sorted(CONFIGS), default="procgen", help="the family (its shipped DQN config)")
    p.add_argument("--actors", type=count(1, MAX_RANKS - 1), nargs="+", default=[1, 2, 3])
    p.add_argument("--envs-per-actor", type=count(1), default=8)
    p.add_argument("--steps-per-actor", type=count(1, 10**9), default=8000)
    p.add_argument("--learner-steps", type=count(1, 10**9), default=4000, help="env steps of the learner measurement")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--out", type=Path, default=None, help="the result file (default benchmarks/results/<date>-dqn.json, "
                   "-dqn-atari.json for Atari)")
    args = p.parse_args(argv)
    distinct(args.actors, "--actors")
    ranks_fit(max(args.actors) + 1, "--actors")
    for n in args.actors:
        check_trainer(collection_args(n, args), n + 1, f"the run with {n} actor(s)")
    check_trainer(learner_args(args), 2, "the learner run")
    check_out(args.out)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise UsageError("--device: 'cuda' requested but CUDA is not usable here; allowed here: auto, cpu")
    rows = []
    with launch.temp_folder("bench-dqn") as tmp:
        for n in args.actors:
            print(f"bench_dqn: {args.env}, collection with {n} actor(s) ...", flush=True)
            m = run_trainer(n + 1, collection_args(n, args), Path(tmp) / f"c{n}", f"the run with {n} actor(s)")
            rows.append({"actors": n, "steps_per_s": m["fps"], "steps_per_s_per_actor": m["actor_steps_per_s"],
                         "transitions_sent": m["transitions_sent"], "transitions_received": m["transitions_received"]})
        print("bench_dqn: learner ...", flush=True)
        lm = run_trainer(2, learner_args(args), Path(tmp) / "learner", "the learner run")
    base = rows[0]["steps_per_s"]
    print(f"\n{'actors':>6} {'steps/s':>9} {'per actor':>10} {'scaling':>8}")
    for r in rows:
        r["scaling"] = r["steps_per_s"] / base
        print(f"{r['actors']:>6} {r['steps_per_s']:>9.0f} {r['steps_per_s_per_actor']:>10.0f} {r['scaling']:>7.2f}x")
    batch = round(lm["learner_samples_per_s"] / lm["learner_updates_per_s"]) if lm["learner_updates_per_s"] else 0
    print(f"\nlearner on {lm['learner_device']}: {lm['learner_updates_per_s']:.1f} updates/s, "
          f"{lm['learner_samples_per_s']:.0f} samples/s (batch {batch}), replay ratio reached {lm['replay_ratio']:.2f}, "
          f"weight lag {lm['weight_lag']:.1f} updates")
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cores": len(os.sched_getaffinity(0)),
              "env": args.env, "machine": describe(),
              "settings": vars(args) | {"out": None}, "collection": rows,
              "learner": {k: lm[k] for k in ("learner_device", "learner_updates_per_s", "learner_samples_per_s",
                                             "replay_ratio", "weight_lag", "fps")}}
    out = write_result(result, "-dqn" if args.env == "procgen" else f"-dqn-{args.env}", args.out)
    print(f"bench_dqn: wrote {out}")
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
