"""Host memory: keep freed memory in the process instead of handing it back to the kernel.

A PPO training step on the CPU allocates and frees gigabytes of activations (a 1,024-sample
minibatch through IMPALA-CNN: ~2 GB, most tensors 30-270 MB each). glibc's malloc serves every
block above 32 MB (its largest mmap threshold) with a fresh mmap and returns it with munmap
on free, so every step the kernel hands out, zero-fills and maps the same gigabytes again: on
a 2-core VM, 716,000 page faults per 1,024-sample step, 4.0 s per step instead of 2.3 s (with
transparent huge pages for torch, fewer faults but still 10-37% of the throughput).

`retain_freed_memory()` tells glibc (mallopt) to take every block from its heap and never
trim the heap: after a few minibatches the activations reuse memory that is already mapped.
The resident size then stays at its high-water mark, 0.4-0.7 GB per rank above the peak with
malloc as it is, flat over the run: torch asks for 64-byte-aligned blocks (posix_memalign), and
the hole a freed block leaves is a few bytes short of the next request of the same size, so the
heap grows by a few such blocks (about four steps) before the holes fit.
Measured in `make bench` (docs/performance.md).

Set MPIPPO_HOST_ALLOCATOR=system to leave malloc as it is (for a comparison, or where memory
is tighter than time). With jemalloc, tcmalloc or mimalloc in LD_PRELOAD nothing is changed
(they keep memory their own way); nor where malloc is not glibc's (macOS, musl). Where
malloc is left as it is, `configure()` turns on transparent huge pages for torch's CPU
allocator instead (THP_MEM_ALLOC_ENABLE, read when torch first allocates): each fault then
maps 2 MB. Not both: on the heap, torch's 2 MB-aligned blocks fragment it, and the pair
measured slower than either alone, with 40% more memory.
"""
from __future__ import annotations

import ctypes
import os

ENV = "MPIPPO_HOST_ALLOCATOR"
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_NEVER = -1  # for M_TRIM_THRESHOLD: never trim (mallopt(3))
PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")  # allocators a cluster may LD_PRELOAD

CHOICES = ("retain", "system")
_state: str | None = None
_error: str | None = None


def error() -> str | None:
    """A bad MPIPPO_HOST_ALLOCATOR, for the trainer to report as bad input (exit 2); read from the
    environment where this process has not applied it (a tool that checks a run it will start)."""
    return _error if _state is not None else _refusal(os.environ.get(ENV, "retain"))


def _refusal(value: str) -> str | None:
    return None if value.strip().lower() in CHOICES else f"{ENV}={value!r} is not allowed: {' | '.join(CHOICES)}"


def retain_freed_memory() -> str:
    """Apply the setting once per process; returns what is in effect (for the run's metrics)."""
    global _state
    if _state is not None:
        return _state
    choice = os.environ.get(ENV, "retain").strip().lower()
    if choice not in CHOICES:
        global _error
        _error = _refusal(os.environ[ENV])
        choice = "system"
    if choice == "system":
        _state = "system"
        return _state
    preloaded = [n for n in PRELOADED if n in os.environ.get("LD_PRELOAD", "")]
    if preloaded:  # that allocator keeps memory its own way; glibc's settings would not reach it
        _state = f"preloaded {preloaded[0]}"
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
    if state.startswith("system"):
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return state
