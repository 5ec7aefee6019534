"""Run under mpirun -n W: each rank holds 1/W of one fixed batch and takes PPO steps with the
real GradAllreduce; rank 0 saves the resulting parameters to argv[1]. The test compares
W = 1, 2, 3. Also checks the global advantage moments and replica equality in place."""
import sys

import numpy as np
import torch

from mpippo.algos.adam import Adam
from mpippo.algos.ppo import ppo_update
from mpippo.comm import World
from mpippo.comm.collectives import GradAllreduce, check_replicas, global_mean_std
from mpippo.config import TrainingConfig
from mpippo.models import ImpalaCNNPolicy
from mpippo.models.flat import flat_model_, num_params

world = World(collective_timeout_s=60)
world.install_abort_hook()
torch.set_num_threads(1)
W, r = world.size, world.rank

g = torch.Generator().manual_seed(123)  # the same global batch on every rank
B = 96
full = {
    "b_obs": torch.randint(0, 256, (B, 8, 8, 3), dtype=torch.uint8, generator=g),
    "b_actions": torch.randint(0, 4, (B,), generator=g),
    "b_logprobs": -torch.rand(B, generator=g) * 2,
    "b_values": torch.randn(B, generator=g),
    "b_returns": torch.randn(B, generator=g),
}
adv_raw = torch.randn(B, generator=g) * 3 + 1
lo, hi = r * B // W, (r + 1) * B // W
local = {k: v[lo:hi] for k, v in full.items()}

# Different init on every rank: only the broadcast may make the replicas equal.
torch.manual_seed(1000 + r)
model = ImpalaCNNPolicy((8, 8, 3), 4, channels=(4, 8), hidden_size=16)
sync = GradAllreduce(world, num_params(model), torch.device("cpu"))
flat, _ = flat_model_(model, sync.grad)
world.bcast_(flat.numpy())
opt = Adam([flat], lr=1e-3, eps=1e-5)

mean, std = global_mean_std(world, adv_raw[lo:hi])
ref = adv_raw.double()
assert abs(mean - ref.mean().item()) < 1e-9, (mean, ref.mean().item())
assert abs(std - ref.std(unbiased=False).item()) < 1e-9, (std, ref.std(unbiased=False).item())
local["b_advantages"] = adv_raw[lo:hi]  # normalized per global minibatch inside ppo_update (the default)


def global_moments(x):
    return global_mean_std(world, x)


cfg = TrainingConfig(n_epochs=3, num_minibatches=1, max_grad_norm=0.5)
stats = ppo_update(model, opt, local, cfg, sync, generator=torch.Generator().manual_seed(7), adv_moments=global_moments)
assert stats["updates"] == 3, stats
assert check_replicas(world, flat) == [], "replicas differ after identical updates"
if r == 0:
    np.save(sys.argv[1], flat.numpy())

# KL early stopping is a collective decision: with a tiny target every rank stops after epoch 1
cfg_kl = TrainingConfig(n_epochs=3, num_minibatches=2, target_kl=1e-12)
local["b_logprobs"] = local["b_logprobs"] - 0.5  # the old policy differs: KL > 0 from the first step
stats = ppo_update(model, opt, local, cfg_kl, sync, generator=torch.Generator().manual_seed(8), adv_moments=global_moments)
epochs = world.allgather(np.array([stats["epochs_done"]]))[:, 0]
assert list(epochs) == [1] * W, epochs
assert check_replicas(world, flat) == []
print(f"rank {r}/{W} ok", flush=True)
