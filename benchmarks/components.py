#!/usr/bin/env python
"""The machine's PPO ceiling from measured component costs, on one core (one process, one thread).

Per env step a rank pays: one procgen step (per frame), one policy inference (per sample, at the
rollout batch) and n_epochs training steps (loss + backward + clip + Adam, per sample, at the
minibatch size). With every core running one rank and nothing else:
    ceiling = cores / (env + inference + epochs x update)   steps/s.
Prints one JSON line. Host memory set up as run_mpi.py does (mpippo/hostmem.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mpippo import hostmem  # noqa: E402

ALLOCATOR = hostmem.configure()  # as run_mpi.py does, before torch allocates

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mpippo.algos.ppo import autocast, local_grad_check, ppo_update  # noqa: E402
from mpippo.config import TrainingConfig  # noqa: E402
from mpippo.models import ImpalaCNNPolicy  # noqa: E402


def timed(fn, min_seconds: float) -> float:
    """Seconds per call, after one warm-up call, over at least min_seconds."""
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_seconds:
            return dt / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", default="coinrun")
    p.add_argument("--envs-per-rank", type=int, default=32)
    p.add_argument("--minibatch", type=int, default=1024, help="samples per rank per training step")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--seconds", type=float, default=8.0, help="per component")
    args = p.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")

    from procgen import ProcgenGym3Env
    env = ProcgenGym3Env(num=args.envs_per_rank, env_name=args.env, distribution_mode="easy", num_threads=0)
    rng = np.random.default_rng(0)
    n = args.envs_per_rank

    def env_step():
        env.act(rng.integers(15, size=n))
        env.observe()
    env_s = timed(env_step, args.seconds / 4) / n

    model = ImpalaCNNPolicy((64, 64, 3), 15)
    obs = torch.from_numpy(env.observe()[1]["rgb"].copy())

    @torch.inference_mode()
    def infer():
        with autocast(device, args.precision):
            logits, _ = model(obs)
        torch.multinomial(torch.softmax(logits.float(), -1), 1)
    infer_s = timed(infer, args.seconds) / n

    cfg = TrainingConfig()
    cfg.precision, cfg.n_epochs, cfg.num_minibatches = args.precision, 1, 2
    B = 2 * args.minibatch
    batch = {"b_obs": torch.randint(0, 255, (B, 64, 64, 3), dtype=torch.uint8),
             "b_actions": torch.randint(0, 15, (B,)), "b_logprobs": torch.full((B,), -2.7),
             "b_advantages": torch.randn(B), "b_returns": torch.randn(B), "b_values": torch.randn(B)}
    opt = torch.optim.Adam(model.parameters(), lr=5e-4, eps=1e-5)
    sync = local_grad_check(model.parameters())
    update_s = timed(lambda: ppo_update(model, opt, batch, cfg, sync), args.seconds) / B

    epochs = TrainingConfig().n_epochs
    per_step = env_s + infer_s + epochs * update_s
    cores = len(os.sched_getaffinity(0))
    print(json.dumps({"precision": args.precision, "env_step_s": env_s, "inference_s": infer_s, "update_s": update_s,
                      "epochs": epochs, "seconds_per_step": per_step, "ceiling_per_core": 1.0 / per_step,
                      "cores": cores, "ceiling": cores / per_step,
                      "thp": os.environ.get("THP_MEM_ALLOC_ENABLE") == "1", "host_allocator": ALLOCATOR}))


if __name__ == "__main__":
    main()
