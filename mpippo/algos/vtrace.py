"""V-trace (Espeholt et al. 2018, IMPALA, section 4.1): off-policy value targets and policy-gradient
advantages for segments collected by a policy (mu) that lags the one being trained (pi).

For a segment of T steps, with rho_t = min(rho_bar, pi/mu), c_t = lam * min(c_bar, pi/mu) and
delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)):

    v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))        (v_T = V(x_T), the bootstrap)
    A_s = min(pg_rho_bar, pi/mu) (r_s + gamma_s v_{s+1} - V(x_s))

gamma_t is the discount of the step t -> t+1: 0 where an episode ended there. With pi == mu and no
clipping, v_s is the discounted n-step return to the segment's end (the tests check both cases).
"""
from __future__ import annotations

import torch


@torch.no_grad()
def vtrace(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
           bootstrap: torch.Tensor, discounts: torch.Tensor, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0, pg_rho_bar: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, N) tensors (bootstrap: (N,)) -> (value targets v, policy-gradient advantages), both (T, N)."""
    ratio = torch.exp(target_logp - behaviour_logp)
    rho = ratio.clamp(max=rho_bar)
    c = lam * ratio.clamp(max=c_bar)
    next_values = torch.cat([values[1:], bootstrap[None]], dim=0)
    delta = rho * (rewards + discounts * next_values - values)
    vs = values + backward_scan(discounts * c, delta)  # v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))
    next_vs = torch.cat([vs[1:], bootstrap[None]], dim=0)
    pg_rho = ratio.clamp(max=rho_bar if pg_rho_bar is None else pg_rho_bar)
    return vs, pg_rho * (rewards + discounts * next_vs - values)


def backward_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x_t = b_t + a_t x_{t+1} over the first dimension, x_T = 0: the recursion of V-trace's corrections
    (and of discounted returns), by recursive doubling: after the round of stride d, each row holds the
    composition of its next 2d affine maps (x -> B + A x), so ceil(log2 T) rounds of a few whole-tensor
    ops replace the T sequential steps of a loop (on a GPU: ~5 log2 T kernels instead of 3 T)."""
    A, B = a.clone(), b.clone()
    T, d = a.shape[0], 1
    while d < T:
        B[:T - d] = B[:T - d] + A[:T - d] * B[d:]
        A[:T - d] = A[:T - d] * A[d:]
        d *= 2
    return B
