"""APPO's learner-side pieces without MPI: targets from episode-start flags, both losses' gradients,
and the policy-lag accounting (stale segments counted and dropped)."""
import math

import pytest
import torch

from mpippo.algos import appo
from mpippo.algos.ppo import logprob_entropy


def test_discounts_are_zero_where_the_next_step_starts_an_episode():
    firsts = torch.tensor([[1, 0], [0, 0], [1, 0], [0, 1]])
    assert torch.allclose(appo.discounts(firsts, 0.9), torch.tensor([[0.9, 0.9], [0.0, 0.9], [0.9, 0.0]]))


def test_on_policy_targets_are_the_n_step_returns_with_bootstrap():
    T, N, gamma = 5, 3, 0.99
    torch.manual_seed(1)
    logp, rewards = torch.randn(T, N), torch.randn(T, N)
    values, firsts = torch.randn(T + 1, N), (torch.rand(T + 1, N) < 0.3).long()
    vs, _ = appo.targets(logp, logp, rewards, values, firsts, gamma, rho_bar=math.inf, c_bar=math.inf)
    ret = values[-1].clone()
    d = appo.discounts(firsts, gamma)
    for t in range(T - 1, -1, -1):
        ret = rewards[t] + d[t] * ret
        assert torch.allclose(vs[t], ret, atol=1e-5)


def test_vtrace_pg_gradient_is_minus_advantage_times_grad_logp():
    torch.manual_seed(2)
    logits = torch.randn(6, 4, requires_grad=True)
    actions = torch.randint(0, 4, (6,))
    adv, vs = torch.randn(6), torch.randn(6)
    values = torch.randn(6, requires_grad=True)
    logp, ent = logprob_entropy(logits, actions)
    out = appo.appo_loss("vtrace_pg", logp, ent, values, logp.detach(), adv, vs, values.detach(), 0.2, 0.0, 0.5)
    out.loss.backward()
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref_logp, _ = logprob_entropy(ref_logits, actions)
    (-(adv * ref_logp).mean()).backward()
    assert torch.allclose(logits.grad, ref_logits.grad, atol=1e-6)
    assert torch.allclose(values.grad, 0.5 * (values.detach() - vs) / 6, atol=1e-6)


def test_ppo_clip_stops_the_gradient_of_a_stale_action_beyond_the_clip():
    logits = torch.zeros(1, 2, requires_grad=True)
    logp, ent = logprob_entropy(logits, torch.tensor([0]))  # pi(a) = 0.5
    behaviour = torch.log(torch.tensor([0.25]))             # ratio 2 > 1 + 0.2
    out = appo.appo_loss("ppo_clip", logp, ent, torch.zeros(1, requires_grad=True), behaviour,
                         torch.ones(1), torch.zeros(1), torch.zeros(1), 0.2, 0.0, 0.5)
    out.loss.backward()
    assert logits.grad.abs().max() == 0 and out.clipfrac == 1.0


def test_policy_lag_histogram_and_dropping():
    lag = appo.PolicyLag(max_lag=3, bins=4)
    learner = 10
    verdicts = [lag.admit(learner, v) for v in (10, 9, 7, 6, 2, 8)]  # lags 0 1 3 4 8 2
    assert verdicts == [True, True, True, False, False, True]
    assert lag.accepted == 4 and lag.dropped == 2
    assert lag.hist.tolist() == [1, 1, 1, 1, 2]  # the last bin holds lags >= 4
    assert lag.mean() == pytest.approx((0 + 1 + 2 + 3 + 4 * 2) / 6)
    with pytest.raises(ValueError):
        lag.admit(5, 6)
