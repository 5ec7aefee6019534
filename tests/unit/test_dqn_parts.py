import numpy as np
import pytest
import torch

from mpippo.algos.dqn import NStepAccumulator, PrioritizedReplay, SumTree, apex_epsilons, double_dqn_loss


def test_sum_tree_totals_and_prefix_search():
    tree = SumTree(5)  # rounds up to 8 leaves
    tree.update(np.arange(5), np.array([1.0, 2.0, 3.0, 4.0, 0.0]))
    assert tree.total == 10.0
    # prefix sums: [0,1) -> 0, [1,3) -> 1, [3,6) -> 2, [6,10) -> 3; leaf 4 has zero mass
    assert list(tree.find(np.array([0.0, 0.99, 1.0, 2.5, 3.0, 5.99, 6.0, 9.99]))) == [0, 0, 1, 1, 2, 2, 3, 3]
    tree.update(np.array([1, 1]), np.array([5.0, 7.0]))  # duplicate index: last write wins
    assert tree.total == 1.0 + 7.0 + 3.0 + 4.0


def test_prioritized_sampling_follows_priorities():
    buf = PrioritizedReplay(4, (2, 2, 1), alpha=1.0, eps=0.0, seed=0)
    frames = np.arange(4, dtype=np.uint8).reshape(4, 1, 1, 1).repeat(2, 1).repeat(2, 2)
    buf.add(frames, np.arange(4), np.zeros(4), np.ones(4), frames, priorities=np.array([1.0, 1.0, 2.0, 4.0]))
    counts = np.zeros(4)
    for _ in range(500):
        idx, batch, w = buf.sample(8, beta=1.0)
        counts += np.bincount(idx, minlength=4)
        assert np.array_equal(batch["actions"], idx)  # rows stay aligned with their indices
    freq = counts / counts.sum()
    np.testing.assert_allclose(freq, [1 / 8, 1 / 8, 2 / 8, 4 / 8], atol=0.02)
    # importance weights undo the bias: w ~ 1/p, normalized to max 1
    idx, _, w = buf.sample(64, beta=1.0)
    p = np.array([1, 1, 2, 4])[idx]
    np.testing.assert_allclose(w, (1 / p) / (1 / p).max(), rtol=1e-6)


def test_priority_update_and_ring_overwrite():
    buf = PrioritizedReplay(3, (1, 1, 1), alpha=1.0, eps=0.0)
    z = np.zeros((2, 1, 1, 1), np.uint8)
    buf.add(z, np.array([0, 1]), np.zeros(2), np.ones(2), z)
    buf.add(z, np.array([2, 3]), np.zeros(2), np.ones(2), z)  # wraps: slot 0 now holds action 3
    assert buf.size == 3 and list(buf.actions) == [3, 1, 2]
    buf.update_priorities(np.array([0, 1, 2]), np.array([0.0, 0.0, 5.0]))
    idx, _, _ = buf.sample(16, beta=0.4)
    assert set(idx) == {2}
    assert PrioritizedReplay.nbytes(1000, (64, 64, 3)) > 1000 * 2 * 64 * 64 * 3


def test_n_step_returns_truncate_at_episode_end():
    gamma = 0.5
    acc = NStepAccumulator(3, gamma, num_envs=2, obs_shape=(1, 1, 1))
    obs = lambda t: np.full((2, 1, 1, 1), t, np.uint8)  # noqa: E731
    rewards = [np.array([1.0, 1.0]), np.array([2.0, 2.0]), np.array([4.0, 4.0]), np.array([8.0, 8.0])]
    dones = [np.array([False, False]), np.array([False, True]), np.array([False, False]), np.array([False, False])]
    out = [acc.push(obs(t), np.array([t, t]), rewards[t], dones[t], obs(t + 1)) for t in range(4)]
    assert out[0] is None and out[1] is None
    o, a, R, disc, nxt = out[2]  # the transition of step 0
    assert list(a) == [0, 0]
    np.testing.assert_allclose(R, [1 + 0.5 * 2 + 0.25 * 4, 1 + 0.5 * 2])  # env 1: episode ended at step 1
    np.testing.assert_allclose(disc, [0.125, 0.0])
    assert nxt[0, 0, 0, 0] == 3  # obs after the 3rd step
    o, a, R, disc, nxt = out[3]  # the transition of step 1
    np.testing.assert_allclose(R, [2 + 0.5 * 4 + 0.25 * 8, 2.0])
    np.testing.assert_allclose(disc, [0.125, 0.0])


def test_apex_epsilon_ladder():
    eps = apex_epsilons(8, 0.4, 7.0)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert np.all(np.diff(eps) < 0)
    assert apex_epsilons(1)[0] == pytest.approx(0.4)


def test_double_dqn_target_uses_online_argmax_and_target_values():
    q_online = torch.tensor([[1.0, 2.0]], requires_grad=True)
    q_next_online = torch.tensor([[0.0, 5.0]])   # online picks action 1
    q_next_target = torch.tensor([[10.0, 3.0]])  # target's value of action 1 is 3 (not its max, 10)
    loss, td = double_dqn_loss(q_online, q_next_online, q_next_target, torch.tensor([0]),
                               torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([1.0]))
    assert td.item() == pytest.approx(1.0 + 0.5 * 3.0 - 1.0)
    loss.backward()
    assert q_online.grad[0, 1] == 0 and q_online.grad[0, 0] < 0  # only the taken action's value moves


def test_double_dqn_target_takes_the_best_legal_next_action_only():
    import torch
    from mpippo.algos.dqn import double_dqn_loss
    from mpippo.envs import bits_to_mask
    q_online = torch.zeros(1, 3, requires_grad=True)
    q_next_online = torch.tensor([[5.0, 1.0, 2.0]])   # argmax 0, but action 0 is illegal next
    q_next_target = torch.tensor([[100.0, 10.0, 20.0]])
    legal = bits_to_mask(torch.tensor([0b110]), 3)
    assert legal.tolist() == [[False, True, True]]
    args = (q_online, q_next_online, q_next_target, torch.tensor([1]), torch.tensor([1.0]), torch.tensor([0.5]),
            torch.ones(1))
    _, td_masked = double_dqn_loss(*args, next_legal=legal)
    _, td_free = double_dqn_loss(*args)
    assert td_masked.item() == 1.0 + 0.5 * 20.0  # online argmax over legal {1, 2} is 2; target value 20
    assert td_free.item() == 1.0 + 0.5 * 100.0


def test_mask_bits_round_trip_and_replay_keeps_them():
    import numpy as np
    from mpippo.algos.dqn import PrioritizedReplay
    from mpippo.envs import bits_to_mask, mask_bits
    from mpippo.envs.connect4 import ConnectFourVecEnv
    env = ConnectFourVecEnv(4, seed=0)
    env.board[1, :, 3] = np.array([1, -1, 1, -1, 1, -1])  # column 3 full in env 1
    bits = mask_bits(env.action_mask())
    assert (bits_to_mask(bits, 7) == env.action_mask()).all() and not bits_to_mask(bits, 7)[1, 3]
    replay = PrioritizedReplay(8, (6, 7, 2), seed=0)
    obs = np.zeros((4, 6, 7, 2), np.uint8)
    replay.add(obs, np.zeros(4, np.int64), np.zeros(4, np.float32), np.ones(4, np.float32), obs, next_legal=bits)
    idx, batch, _ = replay.sample(4, 0.4)
    assert (batch["next_legal"] == bits[idx]).all()


def _apex_learner(max_skips=3, returns=0.0):
    """An Ape-X learner half on toy-cue frames whose replay holds 64 transitions of `returns`."""
    from mpippo import config as C
    from mpippo.algos.apex import ApeX
    cfg = C.build(C.load_yaml(C.DEFAULT_CONFIG.parent / "dqn_toy.yaml"),
                  [("guards", "max_nonfinite_skips", max_skips), ("training", "precision", "fp32")], 3)
    obs_shape = C.obs_shape_of("toy-cue")
    algo = ApeX(cfg, obs_shape, 4, num_actors=2, masked=False)
    torch.manual_seed(0)
    algo.setup_learner(algo.new_net(), torch.device("cpu"), seed=0, aug_seed=1)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (64,) + obs_shape, dtype=np.uint8)
    algo.replay.add(frames, rng.integers(0, 4, 64), np.full(64, returns, np.float32), np.full(64, 0.5, np.float32),
                    frames)
    return algo


def test_a_non_finite_td_loss_is_skipped_and_ends_the_learner_after_the_guard():
    """As sync PPO: the step is skipped (weights and priorities as they were), counted, and after
    guards.max_nonfinite_skips in a row NonFiniteError names the learning rate."""
    from mpippo.errors import NonFiniteError
    algo = _apex_learner(max_skips=3, returns=float("inf"))
    weights = [p.detach().clone() for p in algo.q.parameters()]
    leaves = algo.replay.tree.get(np.arange(64)).copy()
    for k in range(2):
        assert not np.isfinite(algo.update(k, 0.0))
    assert algo.skipped == algo.nonfinite_streak == 2
    assert all(torch.equal(p, q) for p, q in zip(weights, algo.q.parameters()))
    assert np.array_equal(algo.replay.tree.get(np.arange(64)), leaves) and np.isfinite(algo.replay.tree.total)
    with pytest.raises(NonFiniteError, match=r"not finite .* in 3 consecutive learner updates.*"
                                             r"guards.max_nonfinite_skips = 3.*lower training.learning_rate \(now 0.001\)"):
        algo.update(2, 0.0)
    assert algo.summary(3, 64)["nonfinite_skips"] == 3


def test_a_finite_step_resets_the_non_finite_streak():
    algo = _apex_learner(max_skips=2, returns=float("nan"))
    algo.update(0, 0.0)
    assert algo.nonfinite_streak == 1
    algo.replay.returns[:] = 1.0
    assert np.isfinite(algo.update(1, 0.0)) and algo.nonfinite_streak == 0 and algo.skipped == 1
    algo.replay.returns[:] = np.nan
    algo.update(2, 0.0)  # one in a row again: below the guard's 2
    assert algo.nonfinite_streak == 1


def test_a_huge_learning_rate_never_crashes_the_learner_only_the_guard_ends_it():
    """Before the guard, lr 1e15 made inf/nan priorities and the sum tree's sampling overflowed
    (numpy OverflowError, an MPI abort)."""
    from mpippo.errors import NonFiniteError
    algo = _apex_learner(max_skips=3, returns=1.0)
    for group in algo.opt.param_groups:
        group["lr"] = 1e15
    algo.t.learning_rate = 1e15
    with pytest.raises(NonFiniteError, match=r"now 1e\+15"):
        for k in range(50):
            algo.update(k, 0.0)
    assert np.isfinite(algo.replay.tree.total)
    assert all(bool(torch.isfinite(p).all()) for p in algo.q.parameters())  # skipped steps change nothing


def test_elo_ratings_far_apart_do_not_overflow():
    """10 ** (gap / 400) overflowed Python's float (OverflowError) for gaps beyond ~123,000 points."""
    from mpippo.selfplay import OpponentPool, elo_expected
    assert elo_expected(0.0, 1e9) == pytest.approx(0.0, abs=1e-299) and elo_expected(1e9, 0.0) == 1.0
    assert elo_expected(0.0, 400.0) == pytest.approx(1 / 11)
    pool = OpponentPool(size=2, elo_k=400.0)
    pool.snapshot(0, np.zeros(3, np.float32))
    pool.learner_rating = 1e12
    pool.record(0, wins=0, draws=0, losses=3)  # upsets at an absurd gap: finite ratings, no exception
    assert np.isfinite(pool.learner_rating) and np.isfinite(pool.members[0]["rating"])
