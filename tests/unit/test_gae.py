import torch

from mpippo.algos.policy_gradient import compute_gae


def test_gae_hand_computed_with_episode_boundary():
    # one env, 3 steps; obs 2 starts a new episode (dones[2] = 1), so step 1 ended one.
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    dones = torch.tensor([[0.0], [0.0], [1.0]])
    next_value, next_done = torch.tensor([2.0]), torch.tensor([0.0])
    adv, ret = compute_gae(rewards, values, dones, next_value, next_done, gamma, lam)

    d2 = 3.0 + 0.9 * 2.0 - 1.5          # bootstraps from next_value
    a2 = d2
    d1 = 2.0 + 0.0 - 1.0                # episode ended: no bootstrap, no carry
    a1 = d1
    d0 = 1.0 + 0.9 * 1.0 - 0.5
    a0 = d0 + gamma * lam * a1
    assert torch.allclose(adv[:, 0], torch.tensor([a0, a1, a2]))
    assert torch.allclose(ret, adv + values)


def test_gae_terminal_at_last_step_drops_bootstrap():
    rewards, values = torch.ones(2, 1), torch.zeros(2, 1)
    adv, _ = compute_gae(rewards, values, torch.zeros(2, 1), torch.tensor([100.0]), torch.tensor([1.0]), 0.99, 0.95)
    assert adv[1, 0] == 1.0  # next_done = 1: the 100 must not leak in
    assert torch.isclose(adv[0, 0], torch.tensor(1.0 + 0.99 * 0.95 * 1.0))


def test_gae_lambda_one_gives_discounted_return_minus_value():
    T, gamma = 5, 0.9
    rewards = torch.arange(1.0, T + 1).unsqueeze(1)
    values = torch.full((T, 1), 0.3)
    adv, ret = compute_gae(rewards, values, torch.zeros(T, 1), torch.tensor([0.0]), torch.tensor([1.0]), gamma, 1.0)
    expected = [sum(gamma ** k * rewards[t + k, 0].item() for k in range(T - t)) for t in range(T)]
    assert torch.allclose(ret[:, 0], torch.tensor(expected))
