"""The machine's ceiling and kernel bound for one env and network (benchmarks/components.py's costs),
for the throughput benches (bench.py on Procgen, atari_throughput.py on Atari). No torch here: the
costs are measured in child processes, so that several can run at once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from mpippo.toolcli import ToolFailure

COMPONENTS = Path(__file__).resolve().parent / "components.py"
MAX_ENVS, MAX_MINIBATCH = 4096, 1 << 16  # what components.py measures at most, per rank


def components(precision: str, env: str, envs_per_rank: int, minibatch: int, seconds: float,
               config: str | None = None) -> dict:
    """Per-step component costs and the machine ceiling, measured twice: one process alone, and one
    process per core at once. A core is slower when the others work too (shared L3 and memory
    bandwidth, clocks, the host of a VM), so the machine ceiling uses the loaded figure: it is what
    all cores can do together."""
    cmd = [sys.executable, str(COMPONENTS), "--env", env, "--envs-per-rank", str(envs_per_rank),
           "--precision", precision, "--minibatch", str(minibatch), "--seconds", str(seconds),
           *(["--config", config] if config else [])]

    def measure(copies: int) -> list[dict]:
        procs = []
        try:  # (ended however this ends: a stop, a timeout, one that failed; none left on the cores)
            for _ in range(copies):  # (one by one: a stop between two starts leaves the first in the list)
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            outs = [p.communicate(timeout=300 + 4 * seconds) for p in procs]  # (it times ~2.3 x seconds)
        except subprocess.TimeoutExpired:
            raise ToolFailure(f"the component costs ({precision}) did not end within {300 + 4 * seconds:g} s") from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for p, (_, err) in zip(procs, outs):
            if p.returncode:
                why = (err.strip().splitlines() or [f"exit {p.returncode}"])[-1][:300]
                raise ToolFailure(f"the component costs ({precision}) failed: {why}")
        return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]

    alone = measure(1)[0]
    loaded = measure(len(os.sched_getaffinity(0)))
    out = {k: float(np.mean([c[k] for c in loaded])) for k in ("env_step_s", "inference_s", "update_s", "seconds_per_step")}
    out.update(precision=precision, epochs=alone["epochs"], cores=alone["cores"], alone=alone)
    # the arithmetic bound: every FLOP of an env step at the fastest convolution's rate (the faster measurement)
    peak = max(c["conv_peak_flops_rate"] for c in [alone, *loaded])
    out.update(flops_per_step=alone["flops_per_step"], conv_peak_flops_rate=peak,
               kernel_bound_per_core=peak / alone["flops_per_step"])
    return with_ceiling(out)


def faster(first: dict, second: dict) -> dict:
    """Of two component measurements (before and after the runs), the one with the higher ceiling,
    the other kept beside it: the VM's speed drifts over the bench, and a ceiling taken at a slow
    moment would be one the runs pass easily."""
    best, other = (first, second) if first["ceiling_per_core"] >= second["ceiling_per_core"] else (second, first)
    return dict(best, other_measurement=other)


def with_ceiling(c: dict) -> dict:
    """Per-core ceiling: the faster of the two measurements (on a shared VM either can come out
    slow), so that the ceiling is a bound the runs must live up to, never an easy one."""
    best = min(c["seconds_per_step"], c["alone"]["seconds_per_step"])
    c.update(ceiling_per_core=1.0 / best, ceiling=c["cores"] / best)
    return c


def describe(c: dict) -> str:
    """The ceiling's line of a report: the loaded costs, one core alone, the faster, the other measurement."""
    return (f"all cores busy: env {1e6 * c['env_step_s']:.0f} us + inference {1e6 * c['inference_s']:.0f} us + "
            f"{c['epochs']} x update {1e6 * c['update_s']:.0f} us per step = {1 / c['seconds_per_step']:.1f} steps/s "
            f"per core; one core alone: {c['alone']['ceiling_per_core']:.1f}; ceiling (the faster) "
            f"{c['ceiling_per_core']:.1f} per core, {c['ceiling']:.1f} on {c['cores']} cores"
            + (f" (the other measurement, before or after the runs: {c['other_measurement']['ceiling_per_core']:.1f}"
               " per core)" if "other_measurement" in c else ""))


def arithmetic(c: dict) -> str:
    """The arithmetic's line of a report: FLOPs per env step, the rates one core reached, the kernel bound."""
    a = c["alone"]
    return (f"{a['flops_per_step'] / 1e6:.0f} MFLOP per env step (forward {a['flops_forward'] / 1e6:.1f}, training "
            f"{a['flops_train'] / 1e6:.1f} per sample and epoch); one core alone runs inference at "
            f"{a['inference_flops_rate'] / 1e9:.1f} GFLOP/s, training at {a['update_flops_rate'] / 1e9:.1f}; the "
            f"network's fastest convolution at {c['conv_peak_flops_rate'] / 1e9:.1f}: kernel bound "
            f"{c['kernel_bound_per_core']:.1f} steps/s per core, the ceiling is "
            f"{100 * c['ceiling_per_core'] / c['kernel_bound_per_core']:.0f}% of it")
