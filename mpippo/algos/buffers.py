"""Rollout storage (allocated once) and the shared running reward normalizer."""
from __future__ import annotations

import numpy as np
import torch


class RolloutBuffer:
    def __init__(self, n_steps: int, num_envs: int, obs_shape, device: torch.device, obs_dtype=torch.uint8,
                 action_dim: int = 0):
        """action_dim: the dimensions of continuous actions (float32 vectors); 0: discrete (int64)."""
        T, N = n_steps, num_envs
        self.obs = torch.zeros((T, N) + tuple(obs_shape), dtype=obs_dtype, device=device)
        self.actions = (torch.zeros((T, N, action_dim), device=device) if action_dim else
                        torch.zeros((T, N), dtype=torch.long, device=device))
        self.logprobs = torch.zeros((T, N), device=device)
        self.rewards = torch.zeros((T, N), device=device)
        self.dones = torch.zeros((T, N), device=device)
        self.values = torch.zeros((T, N), device=device)
        self.trunc_values = torch.zeros((T, N), device=device)  # gamma * V(final obs) of time-limit cuts
        self.disc_returns = np.zeros((T, N), dtype=np.float64)  # for the reward normalizer

    def flat_batch(self, advantages: torch.Tensor, returns: torch.Tensor, steps: int | None = None) -> dict:
        """(T, N, ...) -> (T*N, ...) views, named as ppo_update expects; of the first `steps` steps
        (a rollout the balanced cut-off ended early; advantages and returns have that many)."""
        T = self.obs.shape[0] if steps is None else steps
        return {
            "b_obs": self.obs[:T].reshape((-1,) + self.obs.shape[2:]),
            "b_actions": self.actions[:T].reshape((-1,) + self.actions.shape[2:]),
            "b_logprobs": self.logprobs[:T].reshape(-1),
            "b_values": self.values[:T].reshape(-1),
            "b_advantages": advantages.reshape(-1),
            "b_returns": returns.reshape(-1),
        }


class RunningMeanStd:
    """Running mean/var, updated from (count, mean, var) of a batch (Chan et al.)."""

    def __init__(self, epsilon: float = 1e-4):
        self.mean, self.var, self.count = 0.0, 1.0, epsilon

    def update_from_moments(self, batch_count: float, batch_mean: float, batch_var: float) -> None:
        if batch_count <= 0:
            return
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count + delta * delta * self.count * batch_count / total
        self.mean, self.var, self.count = self.mean + delta * batch_count / total, m2 / total, total

    def scales_per_step(self, step_moments, epsilon: float = 1e-8):
        """Update with each step's (count, mean, var) in turn, as VecNormalize does every env step;
        returns the reward scale of each step, sqrt(var + epsilon) right after its own update."""
        scales = []
        for count, mean, var in step_moments:
            self.update_from_moments(count, mean, var)
            scales.append((self.var + epsilon) ** 0.5)
        return scales

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, d: dict) -> None:
        self.mean, self.var, self.count = float(d["mean"]), float(d["var"]), float(d["count"])


class ObsNormalizer(RunningMeanStd):
    """Observation normalization for vector observations, as the reference PPO for continuous
    control (Gymnasium's NormalizeObservation, then a clip): (obs - mean) / sqrt(var + 1e-8), clipped
    to +-clip, per dimension: RunningMeanStd's statistics with one entry per dimension. They are the
    job's, not a rank's: each rollout's raw observations are summed on every rank (`add`), the sums
    joined by one Allreduce (the runner's collective) and folded in once per rollout (`update`), so
    every replica normalizes alike; a rollout is normalized with the statistics as of its start.
    Saved in checkpoints, applied in evaluation."""

    def __init__(self, dim: int, clip: float):
        super().__init__()
        self.mean, self.var, self.clip = np.zeros(dim), np.ones(dim), clip
        self.sums = np.zeros(2 * dim + 1)  # this rollout's count, sum and sum of squares, per dimension

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        out = (obs - self.mean) / np.sqrt(self.var + 1e-8)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    def add(self, obs: np.ndarray) -> None:
        x = np.asarray(obs, dtype=np.float64)
        d = x.shape[-1]
        self.sums[0] += x.shape[0]
        self.sums[1:d + 1] += x.sum(0)
        self.sums[d + 1:] += (x * x).sum(0)

    def update(self, sums: np.ndarray) -> None:
        """Fold in every rank's rollout sums; this rank's sums start over."""
        n, d = sums[0], len(self.mean)
        mean = sums[1:d + 1] / max(n, 1.0)
        self.update_from_moments(n, mean, np.maximum(sums[d + 1:] / max(n, 1.0) - mean * mean, 0.0))
        self.sums[:] = 0.0

    def state_dict(self) -> dict:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": float(self.count)}

    def load_state_dict(self, d: dict) -> None:
        self.mean, self.var, self.count = np.array(d["mean"], np.float64), np.array(d["var"], np.float64), float(d["count"])
