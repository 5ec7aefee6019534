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
    assert errors_of({"model.init": "xavier"}) == ["model.init: 'xavier' is not one of glorot, torch, orthogonal"]


def test_orthogonal_draws_gain_sqrt2_orthogonal_weights_and_zero_biases_in_both_trunks():
    """model.init orthogonal (CleanRL's): every conv and dense weight, flattened to (out, in), has
    orthogonal rows (or columns) of norm sqrt(2), for the IMPALA-CNN and the Nature CNN alike."""
    from mpippo.models.nature_cnn import NatureQNetwork
    torch.manual_seed(0)
    nets = [DuelingQNetwork((64, 64, 3), 15, (16, 32, 32), 256, True, True).init_trunk_("orthogonal"),
            NatureQNetwork((84, 84, 4), 6, 512).init_trunk_("orthogonal")]
    for net in nets:
        layers = [m for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))
                  and m not in (net.advantage, net.value)]
        for layer in layers:
            w = layer.weight.detach().flatten(1)
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            assert torch.allclose(gram, 2 * torch.eye(len(gram)), atol=1e-4) and torch.count_nonzero(layer.bias) == 0
