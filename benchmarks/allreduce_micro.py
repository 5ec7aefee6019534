"""Under mpirun: mean time of one in-place Allreduce(SUM) of N float32 (the gradient buffer),
each call started together after a barrier, so it measures transfer, not waiting for a slow rank."""
import json
import os
import sys
import time

from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mpippo, without an install
from mpippo.toolcli import EXIT_USAGE, Parser, about, UsageError, count  # noqa: E402


def options(argv=None):
    p = Parser(prog="allreduce_micro.py", description=about(__doc__))
    p.add_argument("--n", type=count(1, 1 << 28), default=626_256 + 2, help="float32 values (at most 1 GiB)")
    p.add_argument("--calls", type=count(1, 100_000), default=50)
    return p.parse_args(argv)


def measure(args) -> None:
    from mpippo.comm import World
    world = World()
    buf = np.ones(args.n, dtype=np.float32)
    times = []
    for i in range(args.calls + 5):
        world.barrier()
        t0 = time.perf_counter()
        world.allreduce_(buf)
        if i >= 5:  # warm-up
            times.append(time.perf_counter() - t0)
    worst = world.gather(np.array([np.mean(times)]))
    if world.is_root:
        print(json.dumps({"ranks": world.size, "bytes": buf.nbytes, "seconds_per_call": float(worst.max())}))


if __name__ == "__main__":
    try:
        measure(options())
    except UsageError as e:  # every rank reaches the same verdict before MPI starts; the first one says it
        if all(os.environ.get(k, "0") == "0" for k in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK")):
            sys.stderr.write(f"mpippo: error: allreduce_micro: {e.errors[0]}\n")
        raise SystemExit(EXIT_USAGE) from None
