import math

import pytest
import torch

from mpippo.algos.policy_gradient import local_grad_check, logprob_entropy
from mpippo.algos.ppo import ppo_loss, ppo_update
from mpippo.config import TrainingConfig
from mpippo.models import ImpalaCNNPolicy
from mpippo.models.flat import flat_model_


def loss(newlp, oldlp, adv, newv=None, oldv=None, ret=None, clip_vloss=True):
    n = len(newlp)
    z = torch.zeros(n)
    return ppo_loss(torch.tensor(newlp), torch.zeros(n), z if newv is None else torch.tensor(newv),
                    torch.tensor(oldlp), torch.tensor(adv), z if ret is None else torch.tensor(ret),
                    z if oldv is None else torch.tensor(oldv), 0.2, clip_vloss, 0.0, 0.5)


def test_policy_loss_is_clipped_pessimistic_bound():
    r = math.log(1.5)  # ratio 1.5 > 1 + clip
    out = loss([r], [0.0], [2.0])
    assert out.pg_loss.item() == pytest.approx(-2.0 * 1.2)  # positive advantage: clipped at 1.2
    out = loss([r], [0.0], [-2.0])
    assert out.pg_loss.item() == pytest.approx(2.0 * 1.5)   # negative advantage: unclipped is worse
    assert out.clipfrac.item() == 1.0


def test_identical_policies_have_zero_kl_and_no_clipping():
    out = loss([-1.0, -2.0], [-1.0, -2.0], [1.0, -1.0])
    assert out.approx_kl.item() == pytest.approx(0.0)
    assert out.clipfrac.item() == 0.0
    assert out.pg_loss.item() == pytest.approx(0.0)


def test_value_loss_clipping():
    # old value 0, new 1, return 1: clipped prediction is 0.2 -> (0.8)^2 dominates
    out = loss([0.0], [0.0], [0.0], newv=[1.0], oldv=[0.0], ret=[1.0])
    assert out.v_loss.item() == pytest.approx(0.5 * 0.8 ** 2)
    out = loss([0.0], [0.0], [0.0], newv=[1.0], oldv=[0.0], ret=[1.0], clip_vloss=False)
    assert out.v_loss.item() == pytest.approx(0.0)


def test_logprob_and_entropy_match_torch_categorical():
    logits = torch.randn(6, 5)
    actions = torch.randint(0, 5, (6,))
    lp, ent = logprob_entropy(logits, actions)
    dist = torch.distributions.Categorical(logits=logits)
    assert torch.allclose(lp, dist.log_prob(actions), atol=1e-6)
    assert torch.allclose(ent, dist.entropy(), atol=1e-6)


def test_flat_gradient_views_survive_backward_and_update():
    torch.manual_seed(0)
    model = ImpalaCNNPolicy((8, 8, 3), 4, channels=(4,), hidden_size=8)
    flat, grad = flat_model_(model)
    opt = torch.optim.Adam([flat], lr=1e-2)
    before = flat.clone()
    B = 16
    batch = {"b_obs": torch.randint(0, 255, (B, 8, 8, 3), dtype=torch.uint8),
             "b_actions": torch.randint(0, 4, (B,)), "b_logprobs": torch.full((B,), -math.log(4)),
             "b_advantages": torch.randn(B), "b_returns": torch.randn(B), "b_values": torch.zeros(B)}
    cfg = TrainingConfig(n_epochs=2, num_minibatches=2)
    stats = ppo_update(model, opt, batch, cfg, local_grad_check([flat]))
    assert stats["updates"] == 4
    for p in model.parameters():  # still views of the flat buffers after backward + step
        assert p.grad.untyped_storage().data_ptr() == grad.untyped_storage().data_ptr()
        assert p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    assert grad.abs().sum() > 0
    assert not torch.equal(before, flat)


def test_nonfinite_gradients_skip_steps_then_abort():
    model = ImpalaCNNPolicy((8, 8, 3), 4, channels=(4,), hidden_size=8)
    flat, grad = flat_model_(model)
    opt = torch.optim.Adam([flat], lr=1e-2)
    B = 8
    batch = {"b_obs": torch.zeros((B, 8, 8, 3), dtype=torch.uint8), "b_actions": torch.zeros(B, dtype=torch.long),
             "b_logprobs": torch.zeros(B), "b_advantages": torch.full((B,), float("nan")),
             "b_returns": torch.zeros(B), "b_values": torch.zeros(B)}
    before = flat.clone()
    cfg = TrainingConfig(n_epochs=1, num_minibatches=2)
    stats = ppo_update(model, opt, batch, cfg, local_grad_check([flat]), max_nonfinite_streak=5)
    assert stats["skipped"] == 2 and stats["updates"] == 0
    assert torch.equal(before, flat)  # no step taken with NaN
    with pytest.raises(FloatingPointError, match="consecutive"):
        ppo_update(model, opt, batch, cfg, local_grad_check([flat]), nonfinite_streak=2, max_nonfinite_streak=3)


def test_atomic_write_failure_keeps_previous_file(tmp_path):
    from mpippo.files import atomic_write_bytes
    target = tmp_path / "latest.pt"
    atomic_write_bytes(target, b"old contents")

    def disk_full():
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new contents that never fully arrive", _midway=disk_full)
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["latest.pt"]
