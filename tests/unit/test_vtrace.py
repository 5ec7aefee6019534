"""V-trace against a case computed by hand from the IMPALA paper's definition, and its on-policy
limit: with pi == mu and no clipping the targets are discounted n-step returns."""
import math

import pytest
import torch

from mpippo.algos.vtrace import vtrace


def col(*xs):
    return torch.tensor(xs, dtype=torch.float64)[:, None]


def test_hand_computed_segment_with_clipping_and_an_episode_end():
    # ratios pi/mu = 0.5, 2, 2 -> rho = c = 0.5, 1, 1 (clipped at 1); the episode ends after step 1
    mu, pi = col(math.log(0.5), math.log(0.5), math.log(0.25)), col(math.log(0.25), 0.0, math.log(0.5))
    rewards, values, bootstrap = col(1.0, 0.0, 2.0), col(0.5, 1.0, 1.5), torch.tensor([2.0], dtype=torch.float64)
    discounts = col(0.9, 0.0, 0.9)
    vs, adv = vtrace(mu, pi, rewards, values, bootstrap, discounts)
    # delta = 0.5 (1 + 0.9 - 0.5) = 0.7, 1 (0 + 0 - 1) = -1, 1 (2 + 1.8 - 1.5) = 2.3
    # v2 = 1.5 + 2.3 = 3.8; v1 = 1 - 1 = 0; v0 = 0.5 + 0.7 + 0.9 * 0.5 * (-1) = 0.75
    assert vs[:, 0].tolist() == pytest.approx([0.75, 0.0, 3.8])
    # A0 = 0.5 (1 + 0.9 * v1 - 0.5) = 0.25; A1 = 1 (0 + 0 - 1) = -1; A2 = 1 (2 + 0.9 * 2 - 1.5) = 2.3
    assert adv[:, 0].tolist() == pytest.approx([0.25, -1.0, 2.3])


def test_on_policy_without_clipping_gives_n_step_returns():
    torch.manual_seed(0)
    T, N, gamma = 7, 5, 0.97
    logp = torch.randn(T, N, dtype=torch.float64)
    rewards, values = torch.randn(T, N, dtype=torch.float64), torch.randn(T, N, dtype=torch.float64)
    bootstrap = torch.randn(N, dtype=torch.float64)
    discounts = gamma * (torch.rand(T, N) > 0.2).double()  # some episodes end inside the segment
    vs, adv = vtrace(logp, logp, rewards, values, bootstrap, discounts, rho_bar=math.inf, c_bar=math.inf)
    ret = bootstrap.clone()
    for t in range(T - 1, -1, -1):
        ret = rewards[t] + discounts[t] * ret
        assert torch.allclose(vs[t], ret)
    next_vs = torch.cat([vs[1:], bootstrap[None]])
    assert torch.allclose(adv, rewards + discounts * next_vs - values)


def test_clipping_bounds_the_weights_of_far_off_policy_steps():
    mu = torch.full((4, 1), math.log(0.01), dtype=torch.float64)  # pi/mu = 100: very stale behaviour
    pi = torch.zeros(4, 1, dtype=torch.float64)
    args = (torch.ones(4, 1, dtype=torch.float64), torch.zeros(4, 1, dtype=torch.float64),
            torch.zeros(1, dtype=torch.float64), torch.full((4, 1), 0.5, dtype=torch.float64))
    vs_clipped, adv = vtrace(mu, pi, *args)  # rho = c = 1: as if on-policy
    vs_plain, _ = vtrace(pi, pi, *args, rho_bar=math.inf, c_bar=math.inf)
    assert torch.allclose(vs_clipped, vs_plain) and adv.abs().max() <= 2.0


def sequential_vtrace(mu, pi, rewards, values, bootstrap, discounts, rho_bar=1.0, c_bar=1.0, lam=1.0):
    """The definition, step by step backward in time (the loop vtrace ran before its doubling scan)."""
    ratio = torch.exp(pi - mu)
    rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
    next_values = torch.cat([values[1:], bootstrap[None]])
    delta = rho * (rewards + discounts * next_values - values)
    acc, corrections = torch.zeros_like(bootstrap), torch.empty_like(values)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = delta[t] + discounts[t] * c[t] * acc
        corrections[t] = acc
    vs = values + corrections
    return vs, rho * (rewards + discounts * torch.cat([vs[1:], bootstrap[None]]) - values)


@pytest.mark.parametrize("T", [1, 2, 3, 7, 16, 65])
def test_the_doubling_scan_equals_the_step_by_step_recursion(T):
    from mpippo.algos.vtrace import backward_scan
    g = torch.Generator().manual_seed(T)
    N = 6
    mu, pi = torch.randn(T, N, generator=g, dtype=torch.float64), torch.randn(T, N, generator=g, dtype=torch.float64)
    rewards, values = torch.randn(T, N, generator=g, dtype=torch.float64), torch.randn(T, N, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(N, generator=g, dtype=torch.float64)
    discounts = 0.95 * (torch.rand(T, N, generator=g) > 0.15).double()
    for kw in ({}, {"rho_bar": 2.0, "c_bar": 0.9, "lam": 0.95}):
        vs, adv = vtrace(mu, pi, rewards, values, bootstrap, discounts, **kw)
        ref_vs, ref_adv = sequential_vtrace(mu, pi, rewards, values, bootstrap, discounts, **kw)
        assert torch.allclose(vs, ref_vs, rtol=1e-12, atol=1e-12) and torch.allclose(adv, ref_adv, rtol=1e-12, atol=1e-12)
    a, b = torch.rand(T, N, generator=g), torch.randn(T, N, generator=g)  # float32, as on the learner
    x, acc = backward_scan(a, b), torch.zeros(N)
    for t in range(T - 1, -1, -1):
        acc = b[t] + a[t] * acc
        assert torch.allclose(x[t], acc, rtol=1e-5, atol=1e-6)
