"""Host memory: keep freed memory in the process instead of handing it back to the kernel.

A PPO training step on the CPU allocates and frees gigabytes of activations (a 1,024-sample
minibatch through IMPALA-CNN: ~2 GB, most tensors 30-270 MB each). glibc's malloc serves every
block above 32 MB (its largest mmap threshold) with a fresh mmap and returns it with munmap
on free, so every step the kernel hands out, zero-fills and maps the same gigabytes again: on
a 2-core VM, a third of a ReLU's time and 15-35% of a training step went to page faults.

`retain_freed_memory()` tells glibc (mallopt) to take every block from its heap and never
trim the heap: after the first minibatch the activations reuse memory that is already mapped.
The resident size then stays at the peak of the run (which it reaches anyway, every step);
it does not grow beyond it. Measured in `make bench` (README, Performance).

Set MPIPPO_HOST_ALLOCATOR=system to leave malloc as it is (for a comparison, or with an
allocator preloaded by the cluster, e.g. jemalloc or tcmalloc). Not glibc (macOS, musl):
nothing is changed. Where malloc is left as it is, `configure()` turns on transparent huge
pages for torch's CPU allocator instead (THP_MEM_ALLOC_ENABLE, read when torch first
allocates): each fault then maps 2 MB. Not both: on the heap, torch's 2 MB-aligned blocks
fragment it, and the pair measured slower than either alone.
"""
from __future__ import annotations

import ctypes
import os

ENV = "MPIPPO_HOST_ALLOCATOR"
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_NEVER = -1  # for M_TRIM_THRESHOLD: never trim (mallopt(3))

_state: str | None = None


def retain_freed_memory() -> str:
    """Apply the setting once per process; returns what is in effect (for the run's metrics)."""
    global _state
    if _state is not None:
        return _state
    choice = os.environ.get(ENV, "retain").strip().lower()
    if choice == "system":
        _state = "system"
        return _state
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        _state = "system (not glibc)"
        return _state
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    ok = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, _NEVER) == 1
    _state = "retain" if ok else "system (mallopt refused)"
    return _state


def current() -> str:
    """The setting in effect in this process (for a run's metrics)."""
    return _state or "system (not configured)"


def configure() -> str:
    """What every process that trains calls first, before torch allocates: retain freed memory
    or, where that is off or not possible, huge pages for torch's allocator."""
    state = retain_freed_memory()
    if state != "retain":
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return state
