#!/usr/bin/env python
"""DQN (Ape-X layout) throughput: actor collection scaling with 1, 2, 3 actors, and learner samples/s.

Collection: the learner stores but does not train (replay_ratio 0), so actors run unthrottled;
steps/s per actor and in total show how collection scales. Learner: 1 actor, replay ratio 4,
learning from the start: learner updates/s and samples/s on this machine's device (CPU here;
the GPU where training.device finds one). Writes benchmarks/results/<date>-dqn.json.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mpippo import launch  # noqa: E402
from results_file import write_result  # noqa: E402  (benchmarks/)


def run(ranks: int, extra: list[str], out: Path) -> dict:
    args = ["--config", "configs/dqn_procgen.yaml", "--set", "logging.tensorboard=false", *extra]
    try:
        return launch.run_trainer(ranks, args, out)
    except RuntimeError as e:
        sys.exit(f"bench_dqn: {e}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--envs-per-actor", type=int, default=8)
    p.add_argument("--steps-per-actor", type=int, default=8000)
    p.add_argument("--learner-steps", type=int, default=4000, help="env steps of the learner measurement")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mpippo-bench-dqn-") as tmp:
        for n in args.actors:
            print(f"bench_dqn: collection with {n} actor(s) ...", flush=True)
            m = run(n + 1, ["--num-envs-per-rank", str(args.envs_per_actor), "--total-timesteps",
                            str(n * args.steps_per_actor), "--set", "dqn.replay_ratio=0",
                            "--set", "dqn.buffer_size=20000", "--set", f"training.device={args.device}"],
                    Path(tmp) / f"c{n}")
            rows.append({"actors": n, "steps_per_s": m["fps"], "steps_per_s_per_actor": m["actor_steps_per_s"],
                         "transitions_sent": m["transitions_sent"], "transitions_received": m["transitions_received"]})
        print("bench_dqn: learner ...", flush=True)
        lm = run(2, ["--num-envs-per-rank", str(args.envs_per_actor), "--total-timesteps", str(args.learner_steps),
                     "--set", "dqn.learning_starts=500", "--set", "dqn.buffer_size=20000",
                     "--set", f"training.device={args.device}"], Path(tmp) / "learner")
    base = rows[0]["steps_per_s"]
    print(f"\n{'actors':>6} {'steps/s':>9} {'per actor':>10} {'scaling':>8}")
    for r in rows:
        r["scaling"] = r["steps_per_s"] / base
        print(f"{r['actors']:>6} {r['steps_per_s']:>9.0f} {r['steps_per_s_per_actor']:>10.0f} {r['scaling']:>7.2f}x")
    print(f"\nlearner on {lm['learner_device']}: {lm['learner_updates_per_s']:.1f} updates/s, "
          f"{lm['learner_samples_per_s']:.0f} samples/s (batch {64}), replay ratio reached {lm['replay_ratio']:.2f}, "
          f"weight lag {lm['weight_lag']:.1f} updates")
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cores": len(os.sched_getaffinity(0)),
              "settings": vars(args) | {"out": None}, "collection": rows,
              "learner": {k: lm[k] for k in ("learner_device", "learner_updates_per_s", "learner_samples_per_s",
                                             "replay_ratio", "weight_lag", "fps")}}
    out = write_result(result, "-dqn", args.out)
    print(f"bench_dqn: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
