"""`python -m mpippo.machine`: which kind of CPU machine this is, in one line, for a log that will
be compared with another (CI prints it before `make test`).

The line holds the CPU's model and cores, the kernels
torch runs (AVX-512 or AVX2: ATEN_CPU_CAPABILITY may lower them), and what `training.precision:
auto` chooses here and why (ONEDNN_MAX_CPU_ISA may rule bf16 out). Speeds are comparable only
between lines that match. VMs that answer to one model name differ (an "AMD EPYC" has been a Zen 3
with AVX2 only and a Zen 4 with AVX-512 BF16), so the CPU's family and model numbers are given, and, in a
process that has not yet imported torch, the CPU seconds its import took: a rough speed index of the VM
(about 1-1.5 s on this project's fast 2-core VMs, 2 s and more on its slow ones), and most of what a
test process costs (docs/testing.md).
"""
from __future__ import annotations

import os
import sys
import time

from mpippo.runctl import bf16_native
from mpippo.toolcli import Parser, about, exit_process, run


def cpu_model() -> str:
    """The model name, with the family and model numbers where /proc/cpuinfo gives them."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = dict(line.split(":", 1) for line in f.read().split("\n\n", 1)[0].splitlines() if ":" in line)
    except OSError:
        return "unknown CPU"
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name = fields.get("model name", "unknown CPU")
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def describe() -> str:
    fresh = "torch" not in sys.modules
    start = time.process_time()
    import torch
    took = f", its import {time.process_time() - start:.1f} s of CPU" if fresh else ""
    native, evidence = bf16_native(torch.device("cpu"))
    return (f"machine: {cpu_model()}, {len(os.sched_getaffinity(0))} core(s); torch {torch.__version__} CPU kernels "
            f"{torch.backends.cpu.get_cpu_capability()}{took}; precision auto -> {'bf16' if native else 'fp32'} "
            f"({evidence})")


def _main(argv: list[str] | None) -> int:
    Parser(prog="python -m mpippo.machine", description=about(__doc__)).parse_args(argv)  # --help; no options
    print(describe(), flush=True)
    return 0


if __name__ == "__main__":
    exit_process(run("machine", _main))
