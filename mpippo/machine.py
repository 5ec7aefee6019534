"""`python -m mpippo.machine`: which kind of CPU machine this is, in one line, for a log that will
be compared with another (CI prints it before `make test`): the CPU's model and cores, the kernels
torch runs (AVX-512 or AVX2: ATEN_CPU_CAPABILITY may lower them), and what `training.precision:
auto` chooses here and why (ONEDNN_MAX_CPU_ISA may rule bf16 out). Speeds are comparable only
between lines that match.
"""
from __future__ import annotations

import os

from mpippo.runctl import bf16_native


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((x.partition(":")[2].strip() for x in f if x.startswith("model name")), "unknown CPU")
    except OSError:
        return "unknown CPU"


def describe() -> str:
    import torch
    native, evidence = bf16_native(torch.device("cpu"))
    return (f"machine: {cpu_model()}, {len(os.sched_getaffinity(0))} core(s); torch {torch.__version__} CPU kernels "
            f"{torch.backends.cpu.get_cpu_capability()}; precision auto -> {'bf16' if native else 'fp32'} ({evidence})")


if __name__ == "__main__":
    print(describe(), flush=True)
