"""A2C's parts without MPI: the loss, RMSprop against torch.optim's, one pass per rollout through
ppo_update's loop, its config checks and its checkpoint check."""
import dataclasses

import pytest
import torch

from mpippo import config as C
from mpippo.algos import registry
from mpippo.algos.a2c import A2C, a2c_loss, make_rmsprop
from mpippo.algos.policy_gradient import local_grad_check
from mpippo.models import build


def test_the_loss_is_the_actor_critic_loss_without_ratio_or_clip():
    torch.manual_seed(0)
    logp, ent, v = torch.randn(6, requires_grad=True), torch.rand(6), torch.randn(6, requires_grad=True)
    adv, ret, old_v = torch.randn(6), torch.randn(6), torch.randn(6)
    out = a2c_loss(logp, ent, v, logp.detach(), adv, ret, old_v, clip_range=0.2, clip_vloss=True, ent_coef=0.01,
                   vf_coef=0.5)
    assert torch.allclose(out.pg_loss, -(adv * logp).mean())
    assert torch.allclose(out.v_loss, 0.5 * ((v - ret) ** 2).mean())  # no clip around the old values
    assert torch.allclose(out.loss, out.pg_loss - 0.01 * ent.mean() + 0.5 * out.v_loss)
    assert out.approx_kl == 0 and out.clipfrac == 0  # the rollout's own policy
    out.loss.backward()  # raising the log-probability of an action is rewarded by its advantage
    assert torch.allclose(logp.grad, -adv / 6)


def test_rmsprop_is_torch_optim_rmsprop_and_its_state_round_trips():
    def model():
        torch.manual_seed(1)
        return torch.nn.Linear(5, 3)
    mine, ref = model(), model()
    opt, ref_opt = make_rmsprop(mine.parameters(), 1e-2, 0.99, 1e-5), torch.optim.RMSprop(
        ref.parameters(), lr=1e-2, alpha=0.99, eps=1e-5)
    x = torch.randn(8, 5)
    for _ in range(5):
        for m, o in ((mine, opt), (ref, ref_opt)):
            o.zero_grad()
            (m(x) ** 2).sum().backward()
            o.step()
    for p, q in zip(mine.parameters(), ref.parameters()):
        assert torch.equal(p, q)  # bit for bit: the same function with the same arguments
    again = make_rmsprop(model().parameters(), 1e-2, 0.99, 1e-5)
    again.load_state_dict(opt.state_dict())
    assert torch.equal(again.state_dict()["state"][0]["square_avg"], ref_opt.state_dict()["state"][0]["square_avg"])


def _cfg(**a2c) -> C.Config:
    cfg = C.Config()
    cfg.training.algo, cfg.a2c = "a2c", dataclasses.replace(cfg.a2c, **a2c)
    cfg.training.precision = "fp32"
    return cfg


@pytest.mark.parametrize("optimizer,minibatches", [("rmsprop", 1), ("adam", 4)])
def test_one_pass_per_rollout_in_the_configured_steps(optimizer, minibatches):
    cfg = _cfg(optimizer=optimizer, num_minibatches=minibatches)
    torch.manual_seed(2)
    net = build("actor_critic", (8, 8, 3), 4, cfg.model)
    algo = A2C(cfg)
    opt = algo.optimizer(net.parameters())
    B = 32
    batch = {"b_obs": torch.randint(0, 255, (B, 8, 8, 3), dtype=torch.uint8), "b_actions": torch.randint(0, 4, (B,)),
             "b_logprobs": torch.full((B,), -1.386), "b_advantages": torch.randn(B), "b_returns": torch.randn(B),
             "b_values": torch.zeros(B)}
    before = [p.detach().clone() for p in net.parameters()]
    stats = algo.update(net, opt, batch, local_grad_check(net.parameters()), torch.Generator().manual_seed(0))
    assert stats["updates"] == minibatches == algo.allreduces_per_iteration and stats["epochs_done"] == 1
    assert stats["clipfrac"] == 0 and stats["skipped"] == 0
    assert any(not torch.equal(p, q) for p, q in zip(net.parameters(), before))
    assert algo.gae_lambda == 1.0  # nstep: bootstrapped n-step returns
    assert A2C(_cfg(returns="gae")).gae_lambda == cfg.training.gae_lambda


@pytest.mark.parametrize("key,value,expect", [
    ("optimizer", "sgd", "a2c.optimizer: 'sgd' is not one of rmsprop, adam"),
    ("returns", "td", "a2c.returns: 'td' is not one of nstep, gae"),
    ("rmsprop_alpha", 1.0, "a2c.rmsprop_alpha: must be in [0, 1), got 1.0"),
    ("rmsprop_eps", 0.0, "a2c.rmsprop_eps: must be > 0, got 0.0"),
    ("num_minibatches", 0, "a2c.num_minibatches: must be >= 1, got 0"),
    ("num_minibatches", 3, "a2c.num_minibatches: the per-rank batch (64 envs x 256 steps = 16384) is not divisible"),
])
def test_bad_a2c_settings_are_one_line_each(key, value, expect):
    with pytest.raises(C.UsageError) as e:
        C.build({}, [("training", "algo", "a2c"), ("a2c", key, value)], 1)
    assert len(e.value.errors) == 1 and e.value.errors[0].startswith(expect), e.value.errors


def test_the_entry_and_the_checkpoint_check():
    a = registry.get("a2c")
    assert a.layout == registry.SYNC and a.section == "a2c" and not a.greedy_eval
    cfg = _cfg()
    net = build("actor_critic", (8, 8, 3), 4, cfg.model)
    opt = A2C(cfg).optimizer([torch.nn.Parameter(torch.zeros(sum(p.numel() for p in net.parameters())))])
    opt.params[0].grad = torch.ones_like(opt.params[0])
    opt.step()
    from mpippo import ckpt_schema
    ckpt_schema.check_optimizer(opt.state_dict(), "optimizer", [tuple(opt.params[0].shape)], ("square_avg",))
    with pytest.raises(ckpt_schema.Bad, match="optimizer.state\\[0\\]: missing key"):
        ckpt_schema.check_optimizer(opt.state_dict(), "optimizer", [tuple(opt.params[0].shape)],
                                    ("exp_avg", "exp_avg_sq"))
