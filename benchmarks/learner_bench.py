#!/usr/bin/env python
"""The learners alone, and one PPO iteration under torch.profiler (make gpu-check's learner-only rows).

    python benchmarks/learner_bench.py --device cuda --out result.json --profile-out profile.txt

- **DQN learner alone**: the Ape-X learner of configs/dqn_procgen.yaml (ApeX: new_net, setup_learner,
  ingest, update) with its replay prefilled by random frames through `ingest`, as chunks from actors
  would fill it, and no actors: prioritized sampling, the double-DQN step at `--dqn-batch` and the
  priority update, timed over `--seconds` after a warm-up. samples/s = updates x batch / seconds.
  `dqn_atari` is the same on Atari (configs/dqn_atari.yaml: the Nature CNN on 84x84x4 frames, Pong's
  6 actions, at most 20,000 transitions prefilled), the learner the Ape-X paper's layout was made for.
- **APPO learner alone**: the APPO learner of configs/appo_procgen.yaml (APPO: new_net, setup_learner,
  ingest, updates_allowed, update) fed the same batch of random segments again and again, each time
  stamped with the learner's version (no policy lag, none dropped): the batch's ingest (the copy a
  chunk's segments take), reward scaling, V-trace targets and the PPO epochs. samples/s counts the
  epochs, as the run's learner_samples_per_s does (samples_per_update = segments x T x epochs);
  env_steps_per_s is the actor steps it can absorb (segments x T per update).
- **PPO iteration profile**: one iteration of the synchronous trainer (SyncTrainer: collect_rollout, learn)
  on one rank, after one warm-up iteration, under torch.profiler; written as the key_averages table
  (self time on the device, then on the CPU) with the iteration's phases, timed once more without the
  profiler, and the share of the iteration the device was busy: what bounds the rate. A Chrome trace
  goes beside it (<name>-trace.json.gz) only when it is small (under 300 KB compressed).

Random data: the rates are those of the arithmetic and data movement, which do not depend on what
the frames show. Prints one JSON line; --out writes it too. Options after `--` reach the configs
(e.g. `-- --set model.channels=[4]`); --dry-run sizes everything for a CPU in seconds.
"""
from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mpippo import launch  # noqa: E402
from mpippo import hostmem  # noqa: E402

ALLOCATOR = hostmem.configure()  # as a trainer does, before torch allocates

from mpippo.toolcli import UsageError, Parser, about, check_trainer, count, distinct_outputs, number, output_file, run, write_bytes, write_text  # noqa: E402

TOOL = "learner_bench"
OBS = (64, 64, 3)  # procgen frames
ACTIONS = 15
# each DQN learner row: (its config, observation shape, actions, the most replay it prefills: Atari's
# transitions are 56 KB, so 20,000 of them are 1.1 GB, and the sampled batch's cost does not grow with the replay)
DQN_ROWS = {"dqn": ("configs/dqn_procgen.yaml", OBS, ACTIONS, None),
            "dqn_atari": ("configs/dqn_atari.yaml", (84, 84, 4), 6, 20_000)}
TRACE_MAX = 300_000  # bytes of a gzipped Chrome trace kept beside the profile table
TRACE_EVENTS = 20_000  # ... which a trace of more events never is (about 25 bytes each, compressed)


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _setup(argv: list[str], ranks: int, what: str):
    """The config as the trainer would resolve it (its own checks), the device, the precision made
    concrete for it and its determinism setting, as a learner rank sets them up."""
    from mpippo import runctl
    _, cfg = check_trainer(argv, ranks, what, under_mpirun=False)
    t = cfg.training
    device = runctl.pick_device(t.device, 0, lambda *a, **k: None)
    runctl.cuda_determinism(device, t.deterministic)
    native, evidence = runctl.bf16_native(device)
    t.precision, _, _ = runctl.resolve_precision(t.precision, native, evidence)
    return cfg, device


def _random_items(fields, n: int, rng, version: int = 0, actions: int = ACTIONS) -> dict:
    """`n` chunk items of the algorithm's own fields (name, dtype, shape), filled plausibly."""
    import numpy as np
    out = {}
    for name, dtype, shape in fields:
        full = (n, *shape)
        if name == "obs" or name == "next_obs":
            out[name] = rng.integers(0, 256, size=full, dtype=np.uint8)
        elif name == "actions":
            out[name] = rng.integers(0, actions, size=full).astype(dtype)
        elif name == "next_legal":
            out[name] = np.full(full, -1, dtype=dtype)  # every action legal
        elif name == "discounts":
            out[name] = np.full(full, 0.99 ** 3, dtype=dtype) * (rng.random(full) > 0.01)
        elif name == "firsts":
            out[name] = (rng.random(full) < 0.005).astype(dtype)
        elif name == "version":
            out[name] = np.full(full, version, dtype=dtype)
        elif np.issubdtype(dtype, np.floating):
            out[name] = rng.normal(0.0, 1.0, size=full).astype(dtype)
        else:
            out[name] = np.zeros(full, dtype=dtype)
    return out


def _all_finite(losses: list) -> bool:
    """The losses an update returned (floats, or 0-d tensors on the device: read here, once, after the timing)."""
    import torch
    return bool(torch.stack([torch.as_tensor(x, dtype=torch.float64).cpu() for x in losses]).isfinite().all()) \
        if losses else True


def _timed(step, seconds: float, min_steps: int, device) -> tuple[int, float]:
    """(steps, seconds) of calling step() until both `seconds` and `min_steps` are reached."""
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while True:
        step()
        n += 1
        if n >= min_steps and time.perf_counter() - t0 >= seconds:
            break
    _sync(device)
    return n, time.perf_counter() - t0


def dqn_learner(device: str = "cuda", batch: int = 512, prefill: int = 100_000, seconds: float = 5.0,
                warmup: int = 10, extra: list[str] = (), row: str = "dqn") -> dict:
    """The Ape-X DQN learner with a prefilled replay and no actors (see the module's docstring);
    row: a key of DQN_ROWS (the config and the frames)."""
    import numpy as np
    import torch

    from mpippo.algos.apex import ApeX
    config, obs, actions, most = DQN_ROWS[row]
    prefill = min(prefill, most or prefill)
    argv = ["--config", str(ROOT / config), "--device", device, "--set", f"dqn.batch_size={batch}",
            "--set", f"dqn.buffer_size={prefill}", "--set", "dqn.learning_starts=0", *extra]
    cfg, dev = _setup(argv, 2, "the DQN learner bench")
    algo = ApeX(cfg, obs, actions, num_actors=1, masked=False)
    net = algo.new_net().to(dev)
    algo.setup_learner(net, dev, seed=1, aug_seed=2)
    rng = np.random.default_rng(0)
    chunk = min(prefill, 4096)
    items = _random_items(algo.fields(), chunk, rng, actions=actions)
    t0 = time.perf_counter()
    filled = 0
    while filled < prefill:  # as actors' chunks would, through the learner's own ingest
        n = min(chunk, prefill - filled)
        algo.ingest(items, n)
        filled += n
    _sync(dev)
    fill_s = time.perf_counter() - t0
    done = 0

    def step():
        nonlocal done
        loss = algo.update(done, 0.5)
        done += 1
        return loss
    for _ in range(warmup):
        step()
    losses = []  # as update() returns them: not read while timed (a read would wait for the device)
    n, dt = _timed(lambda: losses.append(step()), seconds, 3, dev)
    replay = getattr(getattr(algo, "replay", None), "device", None)
    return {"algo": "dqn", "config": config, "device": str(dev), "precision": cfg.training.precision,
            "deterministic": cfg.training.deterministic, "batch": batch, "replay_size": prefill,
            "replay_device": str(replay) if replay is not None else "host", "prefill_s": fill_s, "updates": n,
            "seconds": dt, "updates_per_s": n / dt, "ms_per_update": 1000 * dt / n,
            "samples_per_s": n * algo.samples_per_update / dt, "finite": _all_finite(losses),
            "skipped_updates": getattr(algo, "skipped", None), "torch_threads": torch.get_num_threads(),
            "host_allocator": ALLOCATOR}


def appo_learner(device: str = "cuda", seconds: float = 5.0, warmup: int = 2, extra: list[str] = ()) -> dict:
    """The APPO learner fed one batch of random segments again and again (see the module's docstring)."""
    import numpy as np
    import torch

    from mpippo.algos.appo import APPO
    argv = ["--config", str(ROOT / "configs/appo_procgen.yaml"), "--device", device, *extra]
    cfg, dev = _setup(argv, 2, "the APPO learner bench")
    algo = APPO(cfg, OBS, ACTIONS)
    model = algo.new_net().to(dev)
    algo.setup_learner(model, dev, seed=1)
    a = cfg.appo
    items = _random_items(algo.fields(), a.batch_segments, np.random.default_rng(0))
    done, ingest_s = 0, 0.0

    def step():  # one batch in, the updates it pays for (one)
        nonlocal done, ingest_s
        t0 = time.perf_counter()
        items["version"][:] = algo.version  # fresh: no policy lag
        algo.ingest(items, a.batch_segments)
        ingest_s += time.perf_counter() - t0
        losses = []
        while done < algo.updates_allowed(0, 0):
            losses.append(algo.update(done, 0.5))
            done += 1
        return losses
    for _ in range(warmup):
        step()
    done0, ingest_s = done, 0.0
    losses = []
    _, dt = _timed(lambda: losses.extend(step()), seconds, 2, dev)
    n = done - done0
    steps = a.batch_segments * a.rollout_length
    return {"algo": "appo", "device": str(dev), "precision": cfg.training.precision,
            "deterministic": cfg.training.deterministic, "batch_segments": a.batch_segments,
            "rollout_length": a.rollout_length, "epochs": a.epochs, "num_minibatches": a.num_minibatches,
            "batch": steps, "updates": n, "seconds": dt, "updates_per_s": n / dt, "ms_per_update": 1000 * dt / n,
            "samples_per_s": n * algo.samples_per_update / dt, "env_steps_per_s": n * steps / dt,
            "ingest_share": ingest_s / dt, "finite": _all_finite(losses),
            "torch_threads": torch.get_num_threads(), "host_allocator": ALLOCATOR}


def _device_us(evt) -> float:
    """An averaged profiler event's own time on the GPU, in us (the attribute's name changed in torch 2.4)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(evt, name, None)
        if v is not None:
            return float(v)
    return 0.0


def ppo_profile(device: str, table_out: Path, extra: list[str] = ()) -> dict:
    """One synchronous PPO iteration on one rank under torch.profiler (see the module's docstring).
    Builds the trainer (SyncTrainer) in this process, a World of one (no MPI job: comm/world.py)."""
    from torch.profiler import ProfilerActivity, profile

    from mpippo.comm import World
    from mpippo.metrics.timers import PhaseTimer
    from mpippo.runners.sync import SyncTrainer
    argv = ["--device", device, *extra]
    _, cfg = check_trainer(argv, 1, "the profiled PPO iteration", under_mpirun=False)
    with launch.temp_folder("profile") as tmp:
        trainer = SyncTrainer(cfg, World(), Path(tmp))
        dev = trainer.device
        trainer._broadcast_parameters()  # as train() starts (one rank: nothing moves)
        _, trainer.obs, trainer.first = trainer.env.observe()

        def iteration() -> float:
            _sync(dev)
            t0 = time.perf_counter()
            trainer.obs, trainer.first, _ = trainer.collect_rollout(trainer.obs, trainer.first)
            trainer.learn()
            _sync(dev)
            return time.perf_counter() - t0
        iteration()  # warm-up: allocations, cuDNN's choices, first-call costs
        trainer.timer = PhaseTimer()
        plain_s = iteration()
        phases = dict(trainer.timer.seconds)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=activities) as prof:
            profiled_s = iteration()
        trainer.env.close()
    return profile_report(prof, cfg, trainer, dev, plain_s, profiled_s, phases, table_out)


def profile_report(prof, cfg, trainer, dev, plain_s: float, profiled_s: float, phases: dict, table_out: Path) -> dict:
    """The profile's table (and a small Chrome trace when it fits) beside the result, and its summary."""
    import torch
    events = prof.key_averages()
    on_device = dev.type == "cuda"
    busy_us = sum(_device_us(e) for e in events) if on_device else 0.0
    top_key = "self_cuda_time_total" if on_device else "self_cpu_time_total"
    top = sorted(events, key=(_device_us if on_device else (lambda e: e.self_cpu_time_total)), reverse=True)[:5]
    t = cfg.training
    steps = cfg.env.num_envs_per_rank * t.n_steps
    head = [f"one PPO iteration on {dev} ({torch.cuda.get_device_name(dev) if on_device else 'CPU'}), "
            f"{t.precision}, deterministic {t.deterministic}, {cfg.env.name}: {cfg.env.num_envs_per_rank} envs x "
            f"{t.n_steps} steps = {steps:,} env steps, {t.n_epochs} epochs x {t.num_minibatches} minibatches, "
            f"torch {torch.__version__}, {trainer.threads} torch thread(s), {trainer.env_threads} env thread(s)",
            f"iteration without the profiler: {plain_s:.3f} s = {steps / plain_s:,.0f} env steps/s; "
            f"under it: {profiled_s:.3f} s",
            "phases of the iteration without the profiler (s): "
            + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()),
            (f"device busy (sum of kernel and copy self times): {busy_us / 1e6:.3f} s = "
             f"{busy_us / 1e6 / profiled_s:.0%} of the profiled iteration" if on_device else
             "device: the CPU (no device timeline)"), ""]
    tables = []
    if on_device:
        tables.append(("by self time on the GPU", events.table(sort_by="self_cuda_time_total", row_limit=40,
                                                                max_name_column_width=60)))
    tables.append(("by self time on the CPU", events.table(sort_by="self_cpu_time_total", row_limit=40,
                                                           max_name_column_width=60)))
    text = "\n".join(head) + "\n".join(f"\n== {title} ==\n{tab}" for title, tab in tables)
    write_text(table_out, text, "--profile-out")
    trace = None
    packed = b""
    if len(prof.events()) <= TRACE_EVENTS:  # a larger one cannot fit: not worth the seconds it takes
        with launch.temp_folder("trace") as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            packed = gzip.compress(raw.read_bytes())
        if len(packed) <= TRACE_MAX:
            trace = table_out.with_name(table_out.stem + "-trace.json.gz")
            write_bytes(trace, packed, "--profile-out")
    return {"device": str(dev), "precision": t.precision, "deterministic": t.deterministic, "env_steps": steps,
            "iteration_s": plain_s, "profiled_iteration_s": profiled_s, "steps_per_s": steps / plain_s,
            "phase_seconds": phases, "device_busy_s": busy_us / 1e6 if on_device else None,
            "device_busy_share": busy_us / 1e6 / profiled_s if on_device else None, "sorted_by": top_key,
            "top_ops": [{"name": e.key, "self_us": _device_us(e) if on_device else e.self_cpu_time_total,
                         "calls": e.count} for e in top],
            "table": table_out.name, "trace": trace.name if trace else None,
            "events": len(prof.events()),
            "trace_note": None if trace else (f"Chrome trace left out: {len(prof.events()):,} events, "
                                              f"{len(packed) or 'not'}{' bytes' if packed else ''} compressed "
                                              f"(kept up to {TRACE_MAX:,} bytes)")}


DRY_DQN = {"batch": 32, "prefill": 600, "seconds": 0.3, "warmup": 2}
DRY_HIDDEN = ["--set", "model.hidden_size=16"]  # the plumbing, not the network (the Nature CNN's convolutions are fixed)
DRY_MODEL = ["--set", "model.channels=[4]", *DRY_HIDDEN]
DRY_APPO = [*DRY_MODEL, "--set", "appo.batch_segments=8",
            "--set", "appo.rollout_length=8"]
DRY_PPO = ["--config", str(ROOT / "configs/smoke.yaml"), "--set", "parallel.threads_per_rank=1", "--num-envs-per-rank", "4",
           "--n-steps", "16"]


ORDER = ("dqn", "dqn_atari", "appo", "profile")


def main(argv=None) -> int:
    return run(TOOL, _main, argv)


def _main(argv) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = Parser(prog="learner_bench.py", description=about(__doc__))
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--what", nargs="+", default=["dqn", "dqn_atari", "appo", "profile"], choices=ORDER)
    p.add_argument("--dqn-batch", type=count(1, 1 << 16), default=512)
    p.add_argument("--dqn-prefill", type=count(1, 10_000_000), default=100_000, help="replay transitions")
    p.add_argument("--seconds", type=number(0, 600), default=5.0, help="timed seconds per learner")
    p.add_argument("--threads", type=count(0, 4096), default=0,
                   help="torch threads of the learners (0: torch's default; the profile's rank sets its own)")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, one thread (seconds)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--profile-out", type=Path, default=None, help="the profile's table (default: beside --out)")
    args = p.parse_args(argv)
    if args.out is not None:
        output_file(args.out, "--out")
    table = args.profile_out or (args.out.with_name(args.out.stem + "-profile.txt") if args.out else None)
    if "profile" in args.what:
        if table is None:
            raise UsageError("--profile-out: needed for the profile (or --out, beside which it goes)")
        output_file(table, "--profile-out")
        distinct_outputs((args.out, "--out"), (table, "--profile-out"))
    device = "cpu" if args.dry_run else args.device
    threads = 1 if args.dry_run else args.threads  # dry: tiny sizes gain nothing from more threads, and
    if threads:  # on a busy machine's cores they wait for each other at every operation (seen: 30x slower)
        import torch
        torch.set_num_threads(threads)
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise UsageError("--device: 'cuda' requested but CUDA is not usable here (or --device cpu)")
    result = {}

    def save():
        line = json.dumps(result)
        if args.out is not None:
            write_text(args.out, line + "\n", "--out")
        return line
    failed = []
    for what in sorted(set(args.what), key=ORDER.index):  # the profile last: it starts MPI
        try:
            if what in DQN_ROWS:
                sizes = DRY_DQN if args.dry_run else {"batch": args.dqn_batch, "prefill": args.dqn_prefill,
                                                      "seconds": args.seconds}
                dry = DRY_MODEL if what == "dqn" else DRY_HIDDEN
                result[what] = dqn_learner(device, extra=[*(dry if args.dry_run else []), *extra], row=what, **sizes)
            elif what == "appo":
                result["appo"] = appo_learner(device, 0.3 if args.dry_run else args.seconds,
                                              extra=[*(DRY_APPO if args.dry_run else []), *extra])
            else:
                result["profile"] = ppo_profile(device, table, [*(DRY_PPO if args.dry_run else []), *extra])
        except UsageError:
            raise  # bad input: one line, exit 2
        except Exception as e:  # noqa: BLE001  (one bench's failure is its own: the others still run)
            import traceback
            traceback.print_exc()
            result[what] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
            failed.append(what)
        save()
    print(save(), flush=True)
    if failed:
        sys.stderr.write(f"mpippo: error: {TOOL}: failed: {', '.join(failed)} (tracebacks above)\n")
    return 1 if failed else 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
