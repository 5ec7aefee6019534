"""Under mpirun -n 3: check_replicas must see equal replicas as equal, and name exactly the
rank whose parameters were nudged by one ulp-sized step."""
import json

import torch

from mpippo.comm import World
from mpippo.comm.collectives import check_replicas

world = World(collective_timeout_s=60)
world.install_abort_hook()
flat = torch.linspace(-1, 1, 1000)
same = check_replicas(world, flat)
if world.rank == 1:
    flat[500] = torch.nextafter(flat[500], torch.tensor(2.0))
diverged = check_replicas(world, flat)
print(json.dumps({"rank": world.rank, "same": same, "diverged": diverged}), flush=True)
