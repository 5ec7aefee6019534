"""Under mpirun: mean time of one in-place Allreduce(SUM) of N float32 (the gradient buffer),
each call started together after a barrier, so it measures transfer, not waiting for a slow rank."""
import argparse
import json
import time

import numpy as np

from mpippo.comm import World

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=626_256 + 2)
p.add_argument("--calls", type=int, default=50)
args = p.parse_args()
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
