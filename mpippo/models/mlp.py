"""The actor-critic for vector observations (CleanRL's `ppo.py` and `ppo_continuous_action.py`):
separate policy and value networks, each a stack of tanh layers, orthogonal weights (gain sqrt 2,
the policy head 0.01 so the first policy is near uniform, the value head 1) and zero biases."""
from __future__ import annotations

import math

import torch
from torch import nn


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _tower(n_in: int, sizes, n_out: int, head_gain: float) -> nn.Sequential:
    layers, width = [], n_in
    for size in sizes:
        layers += [_layer(width, size, math.sqrt(2)), nn.Tanh()]
        width = size
    return nn.Sequential(*layers, _layer(width, n_out, head_gain))


class MLPPolicy(nn.Module):
    """(B, D) float32 observations -> policy outputs (B, A) and values (B,). The outputs are logits
    of A choices, or with `continuous` the means of a diagonal Gaussian over A dimensions whose
    log-std is one learned vector, the same in every state (`logstd`, starting at 0: std 1)."""

    def __init__(self, obs_dim: int, num_actions: int, sizes=(64, 64), continuous: bool = False):
        super().__init__()
        self.continuous = continuous
        self.policy = _tower(obs_dim, sizes, num_actions, 0.01)
        self.value = _tower(obs_dim, sizes, 1, 1.0)
        if continuous:
            self.logstd = nn.Parameter(torch.zeros(1, num_actions))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        obs = obs.float()
        return self.policy(obs), self.value(obs).squeeze(-1)
