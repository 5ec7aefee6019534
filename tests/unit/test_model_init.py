"""model.init: PyTorch's defaults (the runs so far, untouched) or Glorot-uniform with zero biases,
the TensorFlow defaults the Procgen paper's IMPALA-CNN started from."""
import math

import torch
from torch import nn

from mpippo.models import DuelingQNetwork, ImpalaCNNPolicy
from test_config import errors_of


def _policy(seed: int) -> ImpalaCNNPolicy:
    torch.manual_seed(seed)
    return ImpalaCNNPolicy((64, 64, 3), 15, (16, 32, 32), 256)


def _trunk_layers(net):
    return [m for m in [*net.stages.modules(), net.fc] if isinstance(m, (nn.Conv2d, nn.Linear))]


def test_torch_init_changes_nothing_and_draws_nothing():
    a, b = _policy(3), _policy(3)
    rng = torch.get_rng_state()
    b.init_trunk_("torch")
    assert torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_glorot_redraws_the_trunk_to_tensorflows_bounds_and_keeps_the_heads():
    torch_init, glorot = _policy(3), _policy(3).init_trunk_("glorot")
    for layer in _trunk_layers(glorot):
        w = layer.weight.detach()
        fan_in, fan_out = w.shape[1] * w[0, 0].numel(), w.shape[0] * w[0, 0].numel()
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert float(w.abs().max()) <= bound and torch.count_nonzero(layer.bias) == 0
        if w.numel() > 10_000:  # enough draws to see the uniform's spread
            assert abs(float(w.std()) - bound / math.sqrt(3)) < 0.05 * bound
    # the dense layer: glorot's bound is about 2.3x PyTorch's 1/sqrt(fan_in) here
    assert float(glorot.fc.weight.detach().abs().max()) > 2 * float(torch_init.fc.weight.detach().abs().max())
    for head in ("policy", "value"):
        assert torch.equal(getattr(glorot, head).weight, getattr(torch_init, head).weight)


def test_the_dqn_network_takes_it_too_and_a_wrong_name_is_one_line():
    torch.manual_seed(0)
    q = DuelingQNetwork((64, 64, 3), 15, (16, 32, 32), 256, True, True).init_trunk_("glorot")
    assert all(torch.count_nonzero(layer.bias) == 0 for layer in _trunk_layers(q))
    assert errors_of({"model.init": "xavier"}) == ["model.init: 'xavier' is not one of torch, glorot"]
