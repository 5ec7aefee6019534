"""Host memory (mpippo/hostmem.py): after configure(), freed blocks are reused without page faults."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

# Allocate, touch and free a 96 MB block (above glibc's largest mmap threshold) six times;
# count the minor page faults of the last five. With the memory kept, only the first
# allocation faults; handed back to the kernel, every one faults its ~24,000 pages in again.
PROBE = """
import json, os, resource, sys
sys.path.insert(0, sys.argv[1])
from mpippo import hostmem
state = hostmem.configure()
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
SIZE = 96 * 2**20
def cycle():  # what torch does with an activation: malloc, write, free
    p = libc.malloc(SIZE)
    ctypes.memset(p, 1, SIZE)
    libc.free(p)
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"state": state, "current": hostmem.current(), "faults": faults,
                  "thp": os.environ.get("THP_MEM_ALLOC_ENABLE")}))
"""


def probe(**env) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("MPIPPO_HOST_ALLOCATOR", "THP_MEM_ALLOC_ENABLE", "LD_PRELOAD")}
    e.update(env)
    res = subprocess.run([sys.executable, "-c", PROBE, str(ROOT)], env=e, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_freed_memory_is_reused_without_page_faults():
    kept, system = probe(), probe(MPIPPO_HOST_ALLOCATOR="system")
    assert kept["state"] == kept["current"] == "retain" and kept["thp"] is None
    assert system["state"] == "system" and system["thp"] == "1"  # huge pages for torch instead
    pages = 5 * 96 * 2**20 // 4096
    assert kept["faults"] < 0.02 * pages, kept
    assert system["faults"] > 0.5 * pages, system  # the probe can tell the two apart


def test_a_preloaded_allocator_is_left_alone():
    # the name is all that is looked at; the path does not exist, so the loader skips it with a
    # warning and glibc's malloc serves: the faults show nothing was changed
    got = probe(LD_PRELOAD="/nonexistent/libjemalloc.so.2")
    assert got["state"] == "preloaded jemalloc" and got["thp"] is None
    assert got["faults"] > 0.5 * 5 * 96 * 2**20 // 4096


def test_a_bad_setting_is_bad_input(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    env["MPIPPO_HOST_ALLOCATOR"] = "jemalloc"
    res = subprocess.run([sys.executable, "run_mpi.py", "--output-dir", str(tmp_path / "run")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "MPIPPO_HOST_ALLOCATOR='jemalloc'" in lines[0] and "retain | system" in lines[0]
    assert not (tmp_path / "run").exists()
