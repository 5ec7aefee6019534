"""IMPALA-CNN actor-critic (Espeholt et al. 2018), the network of the Procgen paper.

Per stage: conv3x3 -> maxpool3x3/2 -> two residual blocks. Then ReLU -> dense(hidden)
-> ReLU -> policy logits and value. With channels 16-32-32 and hidden 256 on 64x64x3
frames and 15 actions it has 626,256 parameters.
"""
from __future__ import annotations

import torch
from torch import nn

from mpippo.models.heads import DuelingQHead, PolicyValueHeads


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ConvSequence(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, downsample: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1) if downsample else nn.Identity()
        self.res0 = ResidualBlock(out_channels)
        self.res1 = ResidualBlock(out_channels)

    def forward(self, x):
        return self.res1(self.res0(self.pool(self.conv(x))))


class ImpalaTrunk(nn.Module):
    """Conv stages + dense layer: uint8 HWC frames -> (B, hidden_size) features."""

    def __init__(self, obs_shape: tuple[int, int, int], channels=(16, 32, 32), hidden_size: int = 256,
                 downsample: bool = True):
        super().__init__()
        h, w, c = obs_shape  # frames arrive as uint8 HWC, as procgen gives them
        stages, in_ch = [], c
        for out_ch in channels:
            stages.append(ConvSequence(in_ch, out_ch, downsample))
            in_ch = out_ch
            if downsample:
                h, w = (h + 1) // 2, (w + 1) // 2
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_ch * h * w, hidden_size)

    def init_trunk_(self, scheme: str) -> "ImpalaTrunk":
        """`model.init`: torch keeps PyTorch's defaults (nothing drawn: runs stay as they were);
        glorot redraws the conv and dense weights Glorot-uniform with zero biases, TensorFlow's
        defaults, which the Procgen paper's IMPALA-CNN (tf.layers) started from."""
        if scheme in ("glorot", "orthogonal"):  # (orthogonal: CleanRL's gain sqrt(2), as for the Nature CNN)
            for layer in [*self.stages.modules(), self.fc]:
                if isinstance(layer, (nn.Conv2d, nn.Linear)):
                    if scheme == "glorot":
                        nn.init.xavier_uniform_(layer.weight)
                    else:
                        nn.init.orthogonal_(layer.weight, gain=2 ** 0.5)
                    nn.init.zeros_(layer.bias)
        return self

    def features(self, obs_u8: torch.Tensor) -> torch.Tensor:
        # (B, H, W, C) uint8 -> (B, C, H, W) float in [0, 1]
        x = obs_u8.permute(0, 3, 1, 2).float().div_(255.0)
        x = self.stages(x)
        return torch.relu(self.fc(torch.relu(torch.flatten(x, 1))))


class ImpalaCNNPolicy(PolicyValueHeads, ImpalaTrunk):
    """Actor-critic for PPO: policy logits and a state value."""

    def __init__(self, obs_shape: tuple[int, int, int], num_actions: int,
                 channels=(16, 32, 32), hidden_size: int = 256):
        ImpalaTrunk.__init__(self, obs_shape, channels, hidden_size)
        self.add_heads(hidden_size, num_actions)


class DuelingQNetwork(DuelingQHead, ImpalaTrunk):
    """Q-values for DQN with a dueling head (Wang et al. 2016): Q = V + A - mean(A)."""

    def __init__(self, obs_shape: tuple[int, int, int], num_actions: int,
                 channels=(16, 32, 32), hidden_size: int = 256, dueling: bool = True, downsample: bool = True):
        ImpalaTrunk.__init__(self, obs_shape, channels, hidden_size, downsample)
        self.add_head(hidden_size, num_actions, dueling)
