"""The Nature DQN's convolutional network (Mnih et al. 2015), the Atari network of CleanRL's
ppo_atari_envpool.py and of the Ape-X paper: conv 32 8x8/4, conv 64 4x4/2, conv 64 3x3/1, a dense
layer of hidden_size (512 in the configs), ReLU after each. On 84x84x4 frames and 6 actions with a
dense layer of 512: 1,687,719 parameters for the actor-critic.

Weights orthogonal with gain sqrt(2) and zero biases (CleanRL's; `model.init: glorot` or `torch`
as for the IMPALA-CNN); the heads as the IMPALA-CNN's (models/heads.py).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from mpippo.models.heads import DuelingQHead, PolicyValueHeads
from mpippo.netshape import NATURE_LAYERS, nature_out


class NatureTrunk(nn.Module):
    """uint8 HWC frames -> (B, hidden_size) features."""

    def __init__(self, obs_shape: tuple[int, int, int], hidden_size: int = 512):
        super().__init__()
        h, w, c = obs_shape
        layers, in_ch = [], c
        for out_ch, k, s in NATURE_LAYERS:
            layers += [nn.Conv2d(in_ch, out_ch, k, s), nn.ReLU()]
            in_ch = out_ch
        self.convs = nn.Sequential(*layers)
        oh, ow = nature_out(h, w)
        self.fc = nn.Linear(in_ch * oh * ow, hidden_size)

    def init_trunk_(self, scheme: str) -> "NatureTrunk":
        for layer in [*self.convs, self.fc]:
            if not isinstance(layer, (nn.Conv2d, nn.Linear)) or scheme == "torch":
                continue
            if scheme == "orthogonal":
                nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
            else:  # glorot
                nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        return self

    def features(self, obs_u8: torch.Tensor) -> torch.Tensor:
        x = obs_u8.permute(0, 3, 1, 2).float().div_(255.0)
        return torch.relu(self.fc(torch.flatten(self.convs(x), 1)))


class NatureCNNPolicy(PolicyValueHeads, NatureTrunk):
    """Actor-critic: policy logits and a state value."""

    def __init__(self, obs_shape: tuple[int, int, int], num_actions: int, hidden_size: int = 512):
        NatureTrunk.__init__(self, obs_shape, hidden_size)
        self.add_heads(hidden_size, num_actions)


class NatureQNetwork(DuelingQHead, NatureTrunk):
    """Q-values, with a dueling head unless dueling is false."""

    def __init__(self, obs_shape: tuple[int, int, int], num_actions: int, hidden_size: int = 512,
                 dueling: bool = True):
        NatureTrunk.__init__(self, obs_shape, hidden_size)
        self.add_head(hidden_size, num_actions, dueling)
