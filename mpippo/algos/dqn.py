"""DQN pieces for the Ape-X layout, pure numpy/torch (no MPI): prioritized replay on a sum
tree, n-step returns computed on the actors, the Ape-X epsilon ladder, and the double-DQN
loss with importance weights.

Transition layout everywhere: obs (uint8 HWC), action, n-step return R, discount
(gamma^n, or 0 when the episode ended inside the n steps), next_obs (obs n steps later).
Target: R + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a)).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def apex_epsilons(num_actors: int, eps: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Ape-X: actor i explores with eps ** (1 + alpha * i / (N - 1)); one actor gets eps."""
    if num_actors == 1:
        return np.array([eps])
    i = np.arange(num_actors)
    return eps ** (1.0 + alpha * i / (num_actors - 1))


class SumTree:
    """Binary tree of priorities: O(log n) update and prefix-sum search, vectorized over batches."""

    def __init__(self, capacity: int):
        self.capacity = 1 << max(int(capacity - 1).bit_length(), 0)  # leaves: a power of two
        self.tree = np.zeros(2 * self.capacity, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def update(self, idx: np.ndarray, priority: np.ndarray) -> None:
        pos = np.asarray(idx, dtype=np.int64) + self.capacity
        self.tree[pos] = priority  # with duplicate indices the last write wins, as for a loop
        pos = np.unique(pos // 2)
        while pos[0] >= 1:
            self.tree[pos] = self.tree[2 * pos] + self.tree[2 * pos + 1]
            if pos[0] == 1:
                break
            pos = np.unique(pos // 2)

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(idx, dtype=np.int64) + self.capacity]

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaf index whose prefix-sum interval holds each `mass` value (0 <= mass < total)."""
        pos = np.ones(len(mass), dtype=np.int64)
        mass = np.asarray(mass, dtype=np.float64).copy()
        while pos[0] < self.capacity:
            left = 2 * pos
            go_right = mass >= self.tree[left]
            mass -= np.where(go_right, self.tree[left], 0.0)
            pos = left + go_right
        return pos - self.capacity


class PrioritizedReplay:
    """Proportional prioritized replay (Schaul et al. 2016) over uint8 frames."""

    def __init__(self, capacity: int, obs_shape, alpha: float = 0.6, eps: float = 1e-6, seed: int = 0):
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.obs = np.zeros((capacity,) + tuple(obs_shape), dtype=np.uint8)
        self.next_obs = np.zeros((capacity,) + tuple(obs_shape), dtype=np.uint8)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.returns = np.zeros(capacity, dtype=np.float32)
        self.discounts = np.zeros(capacity, dtype=np.float32)
        self.next_legal = np.full(capacity, -1, dtype=np.int64)  # legal actions of next_obs, bitmask; -1 = all
        self.tree = SumTree(capacity)
        self.max_priority = 1.0
        self.size = self.pos = 0
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def nbytes(capacity: int, obs_shape) -> int:
        """Memory the buffer will take, to check before allocating."""
        frame = int(np.prod(obs_shape))
        return capacity * (2 * frame + 8 + 4 + 4 + 8) + 2 * (1 << max(int(capacity - 1).bit_length(), 0)) * 8

    def add(self, obs, actions, returns, discounts, next_obs, priorities=None, next_legal=None) -> None:
        n = len(actions)
        idx = (self.pos + np.arange(n)) % self.capacity
        self.obs[idx], self.next_obs[idx] = obs, next_obs
        self.actions[idx], self.returns[idx], self.discounts[idx] = actions, returns, discounts
        self.next_legal[idx] = -1 if next_legal is None else next_legal
        if priorities is None:
            p = np.full(n, self.max_priority)
        else:
            p = np.abs(np.asarray(priorities, dtype=np.float64)) + self.eps
            self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.update(idx, p ** self.alpha)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, beta: float):
        """Stratified proportional sample -> (indices, batch dict, importance weights normalized to max 1)."""
        total = self.tree.total
        bounds = np.linspace(0.0, total, batch_size + 1)
        mass = self.rng.uniform(bounds[:-1], bounds[1:])
        idx = np.minimum(self.tree.find(np.minimum(mass, np.nextafter(total, 0))), self.size - 1)
        probs = self.tree.get(idx) / total
        weights = (self.size * probs) ** (-beta)
        weights /= weights.max()
        batch = {"obs": self.obs[idx], "actions": self.actions[idx], "returns": self.returns[idx],
                 "discounts": self.discounts[idx], "next_obs": self.next_obs[idx], "next_legal": self.next_legal[idx]}
        return idx, batch, weights.astype(np.float32)

    def save(self, f, tag: int) -> None:
        """Write the stored transitions, their priorities and the write position to the open binary
        file `f` (npz, uncompressed); `tag` names the checkpoint this file belongs to."""
        n = self.size  # until the buffer wraps, the first `size` slots are the stored ones
        np.savez(f, tag=np.int64(tag), capacity=np.int64(self.capacity), pos=np.int64(self.pos), size=np.int64(n),
                 max_priority=np.float64(self.max_priority), leaves=self.tree.get(np.arange(n)),
                 obs=self.obs[:n], next_obs=self.next_obs[:n], actions=self.actions[:n],
                 returns=self.returns[:n], discounts=self.discounts[:n], next_legal=self.next_legal[:n])

    def load(self, path, tag: int) -> str | None:
        """Refill from a file written by save(); returns why it was not used, or None when it was."""
        try:
            with np.load(path, allow_pickle=False) as z:  # never unpickles: a file we load runs no code
                if int(z["tag"]) != tag:
                    return f"it belongs to update {int(z['tag'])}, the checkpoint to update {tag}"
                if int(z["capacity"]) != self.capacity or z["obs"].shape[1:] != self.obs.shape[1:]:
                    return (f"it holds {int(z['capacity'])} transitions of shape {z['obs'].shape[1:]}, this buffer "
                            f"{self.capacity} of {self.obs.shape[1:]}")
                n = int(z["size"])
                for name in ("obs", "next_obs", "actions", "returns", "discounts", "next_legal"):
                    getattr(self, name)[:n] = z[name]
                if n:
                    self.tree.update(np.arange(n), z["leaves"])
                self.pos, self.size, self.max_priority = int(z["pos"]), n, float(z["max_priority"])
        except FileNotFoundError:
            return "the file is missing"
        except (OSError, ValueError, KeyError) as e:
            return f"unreadable ({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})"
        return None

    def update_priorities(self, idx: np.ndarray, td_errors: np.ndarray) -> None:
        p = np.abs(td_errors).astype(np.float64) + self.eps
        self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.update(idx, p ** self.alpha)


class NStepAccumulator:
    """Turns a vectorized env's step stream into n-step transitions, on the actor.

    Call `push(obs, actions, rewards, dones, next_obs)` every step (dones[i]: the episode of
    env i ended with this step). Once n steps are held it returns, for every env, the
    transition that started n steps ago: R = sum_k gamma^k r_k up to the first done,
    discount = gamma^n (0 if a done came first), next_obs = the obs after the n-th step.
    """

    def __init__(self, n: int, gamma: float, num_envs: int, obs_shape):
        self.n, self.gamma = n, gamma
        self.obs = np.zeros((n, num_envs) + tuple(obs_shape), dtype=np.uint8)
        self.actions = np.zeros((n, num_envs), dtype=np.int64)
        self.rewards = np.zeros((n, num_envs), dtype=np.float32)
        self.dones = np.zeros((n, num_envs), dtype=bool)
        self.count = 0

    def push(self, obs, actions, rewards, dones, next_obs):
        k = self.count % self.n  # ring slot of this step
        self.obs[k], self.actions[k], self.rewards[k], self.dones[k] = obs, actions, rewards, dones
        self.count += 1
        if self.count < self.n:
            return None
        first = self.count % self.n  # oldest slot
        order = (first + np.arange(self.n)) % self.n
        ret = np.zeros(self.obs.shape[1], dtype=np.float32)
        alive = np.ones(self.obs.shape[1], dtype=bool)
        for j, slot in enumerate(order):
            ret += alive * (self.gamma ** j) * self.rewards[slot]
            alive &= ~self.dones[slot]
        discount = np.where(alive, self.gamma ** self.n, 0.0).astype(np.float32)
        return self.obs[first].copy(), self.actions[first].copy(), ret, discount, next_obs


def double_dqn_loss(q_online, q_next_online, q_next_target, actions, returns, discounts, weights,
                    next_legal=None):
    """Importance-weighted Huber loss of the double-DQN target. Returns (loss, |td error|).
    next_legal (B, A) bool: the target's argmax only over the legal actions of next_obs."""
    q = q_online.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        if next_legal is not None:
            q_next_online = q_next_online.masked_fill(~next_legal, float("-inf"))
        best = q_next_online.argmax(dim=1, keepdim=True)
        target = returns + discounts * q_next_target.gather(1, best).squeeze(1)
    td = target - q
    loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
    return loss, td.detach().abs()


def mirror_half(batch: dict, rng: np.random.Generator, num_actions: int) -> dict:
    """Left-right mirror a random half of a batch (in place), for games whose rules are symmetric
    under it (Connect Four): the board flips along its width, action a becomes num_actions-1-a,
    and the next state's legal-move bits reverse. Twice the distinct data at no env cost."""
    from mpippo.envs import bits_to_mask, mask_bits
    flip = rng.random(len(batch["actions"])) < 0.5
    if flip.any():
        for key in ("obs", "next_obs"):  # (N, H, W, C)
            batch[key][flip] = batch[key][flip][:, :, ::-1]
        batch["actions"][flip] = num_actions - 1 - batch["actions"][flip]
        legal = batch["next_legal"][flip]
        batch["next_legal"][flip] = np.where(legal == -1, -1, mask_bits(bits_to_mask(legal, num_actions)[:, ::-1]))
    return batch
