"""The heads the image networks share, on top of a trunk's `features(obs)`: mixins, so that the
networks keep their parameters' names (`policy`, `value`, `advantage`) in checkpoints."""
from __future__ import annotations

import torch
from torch import nn


class PolicyValueHeads:
    """PPO's, APPO's and A2C's: policy logits and a state value."""

    def add_heads(self, hidden_size: int, num_actions: int) -> None:
        self.policy = nn.Linear(hidden_size, num_actions)
        self.value = nn.Linear(hidden_size, 1)
        # a small policy init -> a near-uniform first policy; a unit value init (as CleanRL, baselines)
        nn.init.orthogonal_(self.policy.weight, gain=0.01)
        nn.init.zeros_(self.policy.bias)
        nn.init.orthogonal_(self.value.weight, gain=1.0)
        nn.init.zeros_(self.value.bias)

    def forward(self, obs_u8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.features(obs_u8)
        return self.policy(x), self.value(x).squeeze(-1)


class DuelingQHead:
    """DQN's: Q = V + A - mean(A) (Wang et al. 2016), or A alone when not dueling."""

    def add_head(self, hidden_size: int, num_actions: int, dueling: bool) -> None:
        self.dueling = dueling
        self.advantage = nn.Linear(hidden_size, num_actions)
        self.value = nn.Linear(hidden_size, 1) if dueling else None

    def forward(self, obs_u8: torch.Tensor) -> torch.Tensor:
        x = self.features(obs_u8)
        adv = self.advantage(x)
        if not self.dueling:
            return adv
        return self.value(x) + adv - adv.mean(dim=1, keepdim=True)
