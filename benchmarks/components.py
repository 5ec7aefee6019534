#!/usr/bin/env python
"""The machine's PPO ceiling from measured component costs, on one core (one process, one thread).

Per env step a rank pays: one env step (per frame), one policy inference (per sample, at the
rollout batch) and n_epochs training steps (loss + backward + clip + Adam, per sample, at the
minibatch size). The env, the network and n_epochs are the config's (--config, --env): Procgen with
configs/ppo_procgen.yaml by default, Atari with configs/ppo_atari.yaml. With every core running one
rank and nothing else:
    ceiling = cores / (env + inference + epochs x update)   steps/s.
It also counts the network's arithmetic (convolutions and dense layers, with forward hooks) and times
each of its convolutions alone at the minibatch size: the fastest one's rate is what this core does on
the network's best-suited kernel, and `kernel_bound = rate / FLOPs per env step` is the steps/s a core
would reach if every FLOP of an env step ran that fast (no memory-bound work, no slower shapes).
Prints one JSON line. Host memory set up as run_mpi.py does (mpippo/hostmem.py). A user's env
(env.import) that hangs, in its making or its steps, is ended as the trainer ends a one-rank run's
(guards.collective_timeout_s), and a stop signal ends it while it waits in native code.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mpippo import hostmem, preemption, runctl  # noqa: E402
from mpippo.errors import say_last  # noqa: E402
from mpippo.metrics.timers import Stopwatch  # noqa: E402
from mpippo.toolcli import (EXIT_STOPPED, Parser, about, check_trainer, count, first_stop, number, run,  # noqa: E402
                            signal_words, watch_startup)
from ceiling import MAX_ENVS, MAX_MINIBATCH  # noqa: E402 (this folder's: the bounds the benches check first)

ALLOCATOR = hostmem.configure()  # as run_mpi.py does, before torch allocates

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mpippo.algos.adam import Adam  # noqa: E402
from mpippo.algos.policy_gradient import autocast, local_grad_check  # noqa: E402
from mpippo.algos.ppo import ppo_update  # noqa: E402
from mpippo.envs import make_env, spaces_of  # noqa: E402
from mpippo.models import build  # noqa: E402


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


def conv_flops(mod: torch.nn.Conv2d, out: torch.Tensor) -> float:
    """2 x multiply-adds of a convolution, from its output's size (a strided one, as the Nature CNN's,
    computes fewer points than its input has)."""
    return 2.0 * out.numel() * (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]


def network_flops(model: torch.nn.Module, obs: torch.Tensor) -> tuple[float, float, list]:
    """(forward FLOPs per sample, FLOPs of the first layer's forward, [(conv module, input shape)]).

    FLOPs = 2 x multiply-adds of every Conv2d and Linear, counted by forward hooks on one forward."""
    counts, convs = [], []

    def hook(mod, inp, out):
        if isinstance(mod, torch.nn.Conv2d):
            counts.append(conv_flops(mod, out[0]))
            convs.append((mod, tuple(inp[0].shape[1:])))
        else:
            counts.append(2.0 * mod.in_features * mod.out_features)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model(obs[:1])
    for h in handles:
        h.remove()
    return sum(counts), counts[0], convs


def conv_peak(convs: list, batch: int, device, precision: str, seconds: float) -> float:
    """FLOP/s of the fastest of the network's convolutions, each timed alone (forward) at `batch`."""
    best, seen = 0.0, set()
    for mod, shape in convs:
        key = (mod.in_channels, mod.out_channels, shape)
        if key in seen:
            continue
        seen.add(key)
        c, h, w = shape  # channels-last, as the network's frames make it
        x = torch.randn(batch, h, w, c).permute(0, 3, 1, 2)
        with torch.no_grad(), autocast(device, precision):
            flops = conv_flops(mod, mod(x))
            best = max(best, flops / timed(lambda: mod(x), seconds))
    return best


ALONE = SimpleNamespace(abort=os._exit)  # what runctl.end_held ends: this one process


def watched_steps(timer: Stopwatch, timeout_s: float):
    """The env's steps under the trainer's hang watch (a step lasting timeout_s ends the process in one
    line naming where), which also ends a stop that an env waiting in native code keeps from Python."""
    def stopped(sig: int) -> None:
        say_last(f"mpippo: components: stopped by {signal_words(sig)} while its env was held in native code; "
                 f"nothing was written")
        os._exit(EXIT_STOPPED)
    return runctl.watch_alone(timer, timeout_s, os._exit, what="the benchmark", who="components: ", kept="",
                              stop_due=preemption.unheard(first_stop), stop_end=stopped)


def main(argv: list[str] | None = None) -> int:
    return run("components", _main, argv)


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="components.py", description=about(__doc__))
    p.add_argument("--config", type=Path, help="the run's config: its env, network and n_epochs (default: the "
                   "trainer's, configs/ppo_procgen.yaml)")
    p.add_argument("--env", help="env.name instead of the config's: a Procgen game, atari:<Game>")
    p.add_argument("--envs-per-rank", type=count(1, MAX_ENVS), default=32)
    p.add_argument("--minibatch", type=count(1, MAX_MINIBATCH), default=1024, help="samples per rank per training step")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--seconds", type=number(0, 600), default=8.0, help="per component")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device("cpu")

    argv = [*(["--config", str(args.config)] if args.config else []), *(["--set", f"env.name={args.env}"] if args.env else [])]
    hang = [runctl.STARTUP_TIMEOUT_S]  # (until the config says)
    with watch_startup("components", "", lambda: hang[0], lambda code, line: runctl.end_held(ALONE, code, line)):
        _, cfg = check_trainer(argv, 1, f"--config {args.config}" if args.config else "--env", under_mpirun=False)
        hang[0] = runctl.startup_timeout(cfg.guards.collective_timeout_s)
        spaces = spaces_of(cfg)
        env = make_env(cfg, args.envs_per_rank, seed=0)
    shape, actions = tuple(spaces.obs_shape), int(spaces.num_actions)
    rng, n, timer = np.random.default_rng(0), args.envs_per_rank, Stopwatch(("env_step",))

    def env_step():
        with timer("env_step"):
            env.act(rng.integers(actions, size=n))
            env.observe()
    with watched_steps(timer, cfg.guards.collective_timeout_s):
        env_s = timed(env_step, args.seconds / 4) / n

    model = build("actor_critic", shape, actions, cfg.model)
    obs = torch.from_numpy(env.observe()[1].copy())

    @torch.inference_mode()
    def infer():
        with autocast(device, args.precision):
            logits, _ = model(obs)
        torch.multinomial(torch.softmax(logits.float(), -1), 1)
    infer_s = timed(infer, args.seconds) / n

    epochs = cfg.training.n_epochs
    t = cfg.training  # one epoch of two minibatches per call: the config's losses, this many samples
    t.precision, t.n_epochs, t.num_minibatches = args.precision, 1, 2
    B = 2 * args.minibatch
    batch = {"b_obs": torch.randint(0, 255, (B, *shape), dtype=torch.uint8),
             "b_actions": torch.randint(0, actions, (B,)), "b_logprobs": torch.full((B,), -2.7),
             "b_advantages": torch.randn(B), "b_returns": torch.randn(B), "b_values": torch.randn(B)}
    opt = Adam(model.parameters(), lr=t.learning_rate, eps=t.adam_eps)
    sync = local_grad_check(model.parameters())
    update_s = timed(lambda: ppo_update(model, opt, batch, t, sync), args.seconds) / B

    per_step = env_s + infer_s + epochs * update_s
    # Training = forward + backward (input and weight gradients, 2x the forward) for every layer but
    # the first, whose input gradient autograd skips (frames need none).
    fwd, first, convs = network_flops(model, obs)
    train = 3 * fwd - first
    step_flops = fwd + epochs * train
    peak = conv_peak(convs, args.minibatch, device, args.precision, args.seconds / 16)
    cores = len(os.sched_getaffinity(0))
    print(json.dumps({"env": cfg.env.name, "precision": args.precision, "env_step_s": env_s, "inference_s": infer_s, "update_s": update_s,
                      "epochs": epochs, "seconds_per_step": per_step, "ceiling_per_core": 1.0 / per_step,
                      "cores": cores, "ceiling": cores / per_step,
                      "thp": os.environ.get("THP_MEM_ALLOC_ENABLE") == "1", "host_allocator": ALLOCATOR,
                      "flops_forward": fwd, "flops_train": train, "flops_per_step": step_flops,
                      "inference_flops_rate": fwd / infer_s, "update_flops_rate": train / update_s,
                      "step_flops_rate": step_flops / per_step, "conv_peak_flops_rate": peak,
                      "kernel_bound_per_core": peak / step_flops}))
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    preemption.log_signals()  # (the watches read them: a main thread in native code may never)
    exit_process(main())
