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
    # backward recursion over time: acc_s = v_s - V(x_s)
    acc = torch.zeros_like(bootstrap)
    corrections = torch.empty_like(values)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = delta[t] + discounts[t] * c[t] * acc
        corrections[t] = acc
    vs = values + corrections
    next_vs = torch.cat([vs[1:], bootstrap[None]], dim=0)
    pg_rho = ratio.clamp(max=rho_bar if pg_rho_bar is None else pg_rho_bar)
    return vs, pg_rho * (rewards + discounts * next_vs - values)
