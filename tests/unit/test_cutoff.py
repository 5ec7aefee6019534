"""The balanced cut-off's update: ranks that hold unequal numbers of samples (a slow rank collected
fewer) each split theirs into num_minibatches parts and weight their gradient by their part's share
of the minibatch; the result must be the update of one process holding every rank's samples, whose
minibatch k is the union of the ranks' parts k (advantages normalized over that union).

The ranks are threads here, their Allreduce a sum in rank order behind a barrier: the real
GradAllreduce and global_mean_std run on it, without MPI."""
from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from mpippo.algos.adam import Adam
from mpippo.algos.policy_gradient import logprob_entropy, minibatch_shares
from mpippo.algos.ppo import ppo_loss, ppo_update
from mpippo.comm.collectives import GradAllreduce, global_mean_std
from mpippo.models.flat import flat_model_, num_params


class ThreadWorld:
    """One rank of a job whose ranks are threads: allreduce_ sums every rank's buffer, in rank
    order (so every rank gets the same bits), as MPI's Allreduce would."""

    def __init__(self, rank: int, size: int, shared: dict):
        self.rank, self.size, self.shared = rank, size, shared

    def allreduce_(self, buf: np.ndarray, op: str = "sum", name: str = "") -> np.ndarray:
        assert op == "sum"
        self.shared["bufs"][self.rank] = buf.copy()
        self.shared["barrier"].wait()
        total = self.shared["bufs"][0].copy()
        for other in self.shared["bufs"][1:]:
            total += other
        self.shared["barrier"].wait()  # every rank has read every buffer before any is replaced
        buf[...] = total
        return buf


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.Tanh())
        self.pi, self.v = nn.Linear(16, 5), nn.Linear(16, 1)

    def forward(self, obs):
        h = self.body(obs.float() / 255.0)
        return self.pi(h), self.v(h).squeeze(-1)


CFG = SimpleNamespace(n_epochs=2, num_minibatches=3, norm_adv=True, adv_norm="minibatch", clip_range=0.2,
                      clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, target_kl=None, precision="fp32")


def batch(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"b_obs": torch.randint(0, 256, (n, 2, 2, 3), generator=g, dtype=torch.uint8),
            "b_actions": torch.randint(0, 5, (n,), generator=g),
            "b_logprobs": -1.6 + 0.1 * torch.randn(n, generator=g),
            "b_values": torch.randn(n, generator=g),
            "b_advantages": torch.randn(n, generator=g),
            "b_returns": torch.randn(n, generator=g)}


def ranks_update(init: nn.Module, batches: list[dict], shares_of=minibatch_shares) -> list[torch.Tensor]:
    """ppo_update on each rank (a thread) with the weighted Allreduce, each rank weighted by
    shares_of(sizes, rank, num_minibatches); each rank's final parameters."""
    size, shared = len(batches), {"barrier": threading.Barrier(len(batches)), "bufs": [None] * len(batches)}
    sizes = [len(b["b_actions"]) for b in batches]
    out, errors = [None] * size, []

    def rank(r: int) -> None:
        try:
            world, model = ThreadWorld(r, size, shared), copy.deepcopy(init)
            sync = GradAllreduce(world, num_params(model), torch.device("cpu"))
            flat, _ = flat_model_(model, sync.grad)
            opt = Adam([flat], lr=3e-3, eps=1e-5)
            ppo_update(model, opt, batches[r], CFG, sync, torch.Generator().manual_seed(100 + r),
                       adv_moments=lambda x: global_mean_std(world, x),
                       shares=shares_of(sizes, r, CFG.num_minibatches))
            out[r] = flat.detach().clone()
        except BaseException as e:  # noqa: BLE001 (re-raised by the test)
            errors.append(e)
            shared["barrier"].abort()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return out


def one_process_update(init: nn.Module, batches: list[dict]) -> torch.Tensor:
    """The same epochs on one process: minibatch k = the union of every rank's part k."""
    model = copy.deepcopy(init)
    flat, _ = flat_model_(model)
    opt = Adam([flat], lr=3e-3, eps=1e-5)
    gens = [torch.Generator().manual_seed(100 + r) for r in range(len(batches))]
    for _ in range(CFG.n_epochs):
        parts = [torch.tensor_split(torch.randperm(len(b["b_actions"]), generator=g), CFG.num_minibatches)
                 for b, g in zip(batches, gens)]
        for k in range(CFG.num_minibatches):
            mb = {key: torch.cat([b[key][p[k]] for b, p in zip(batches, parts)]) for key in batches[0]}
            adv = mb["b_advantages"].double()
            adv = ((adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8)).float()
            logits, value = model(mb["b_obs"])
            logprob, entropy = logprob_entropy(logits, mb["b_actions"])
            out = ppo_loss(logprob, entropy, value, mb["b_logprobs"], adv, mb["b_returns"], mb["b_values"],
                           CFG.clip_range, CFG.clip_vloss, CFG.ent_coef, CFG.vf_coef)
            opt.zero_grad(set_to_none=False)
            out.loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), CFG.max_grad_norm)
            opt.step()
    return flat.detach()


@pytest.mark.parametrize("sizes", [(24, 12), (24, 10, 17), (9, 9)])
def test_unequal_ranks_update_as_one_process_holding_all_samples(sizes):
    torch.manual_seed(0)
    init = Net()
    batches = [batch(n, seed) for seed, n in enumerate(sizes)]
    replicas = ranks_update(init, batches)
    assert all(torch.equal(replicas[0], r) for r in replicas[1:])  # the replicas stay bit-identical
    reference = one_process_update(init, batches)
    start = torch.cat([p.detach().flatten() for p in init.parameters()])
    assert (reference - start).abs().max() > 1e-3  # the update did move the weights
    torch.testing.assert_close(replicas[0], reference, rtol=0, atol=1e-5)


def test_equal_shares_without_the_weights_are_not_the_union_update_for_unequal_ranks():
    """The plain mean (every rank counted alike) is a different update when the ranks are unequal:
    the weights are what makes the test above pass."""
    torch.manual_seed(0)
    init = Net()
    batches = [batch(24, 0), batch(6, 1)]
    sizes = [24, 6]
    shares = [minibatch_shares(sizes, r, CFG.num_minibatches) for r in range(2)]
    assert shares[0] == pytest.approx([0.8] * 3) and shares[1] == pytest.approx([0.2] * 3)
    replicas = ranks_update(init, batches, shares_of=lambda sizes, rank, n: [0.5] * n)
    assert (replicas[0] - one_process_update(init, batches)).abs().max() > 1e-4


def test_shares_follow_tensor_split_sizes():
    # 10 samples split 4, 3, 3; 5 split 2, 2, 1
    assert minibatch_shares([10, 5], 0, 3) == pytest.approx([4 / 6, 3 / 5, 3 / 4])
    assert minibatch_shares([10, 5], 1, 3) == pytest.approx([2 / 6, 2 / 5, 1 / 4])
    assert sum(minibatch_shares([7, 7, 7], 2, 2)) == pytest.approx(2 / 3)
