"""The networks for vector observations. The actor-critic is CleanRL's (`ppo.py`,
`ppo_continuous_action.py`): separate policy and value networks, each a stack of tanh layers,
orthogonal weights (gain sqrt 2, the policy head 0.01 so the first policy is near uniform, the value
head 1) and zero biases. The Q-network is DQN's usual MLP: ReLU layers, torch's default init, and
the dueling head of the image Q-network."""
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


class MLPQNetwork(nn.Module):
    """(B, D) float32 observations -> Q-values (B, A): ReLU layers of `sizes`, then a dueling head
    (Q = V + A - mean A, as models.impala_cnn.DuelingQNetwork) or, without `dueling`, A alone."""

    def __init__(self, obs_dim: int, num_actions: int, sizes=(64, 64), dueling: bool = True):
        super().__init__()
        layers, width = [], obs_dim
        for size in sizes:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.trunk = nn.Sequential(*layers)
        self.advantage = nn.Linear(width, num_actions)
        self.value = nn.Linear(width, 1) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.trunk(obs.float())
        adv = self.advantage(x)
        if self.value is None:
            return adv
        return self.value(x) + adv - adv.mean(dim=1, keepdim=True)
