import copy
import os

import numpy as np
import pytest
import torch

from mpippo.algos.dqn import NStepAccumulator, PrioritizedReplay, apex_epsilons, double_dqn_loss


def test_prioritized_sampling_follows_priorities():
    buf = PrioritizedReplay(4, (2, 2, 1), alpha=1.0, eps=0.0, seed=0)
    frames = np.arange(4, dtype=np.uint8).reshape(4, 1, 1, 1).repeat(2, 1).repeat(2, 2)
    buf.add(frames, np.arange(4), np.zeros(4), np.ones(4), frames, priorities=np.array([1.0, 1.0, 2.0, 4.0]))
    counts = np.zeros(4)
    for _ in range(500):
        idx, batch, w = buf.sample(8, beta=1.0)
        counts += np.bincount(idx.numpy(), minlength=4)
        assert torch.equal(batch["actions"], idx)  # rows stay aligned with their indices
        assert torch.equal(batch["obs"][:, 0, 0, 0].long(), idx) and torch.equal(batch["next_obs"][:, 1, 1, 0].long(), idx)
    freq = counts / counts.sum()
    np.testing.assert_allclose(freq, [1 / 8, 1 / 8, 2 / 8, 4 / 8], atol=0.02)
    # importance weights undo the bias: w ~ 1/p, normalized to max 1
    idx, _, w = buf.sample(64, beta=1.0)
    p = np.array([1, 1, 2, 4])[idx.numpy()]
    np.testing.assert_allclose(w.numpy(), (1 / p) / (1 / p).max(), rtol=1e-6)
    assert w.dtype == torch.float32


def test_sampling_frequencies_follow_priorities_to_the_alpha():
    """Statistical: 128,000 draws over 8 slots of priorities p: frequencies p**alpha / sum (alpha 0.6)."""
    p = np.array([0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0])
    buf = PrioritizedReplay(8, (1, 1, 1), alpha=0.6, eps=1e-6, seed=123)
    z = np.zeros((8, 1, 1, 1), np.uint8)
    buf.add(z, np.arange(8), np.zeros(8), np.ones(8), z, priorities=p)
    counts = np.zeros(8)
    for _ in range(2000):
        idx, _, _ = buf.sample(64, beta=0.4)
        counts += np.bincount(idx.numpy(), minlength=8)
    want = (p + 1e-6) ** 0.6 / ((p + 1e-6) ** 0.6).sum()
    np.testing.assert_allclose(counts / counts.sum(), want, atol=0.01)


def test_importance_weights_are_size_times_probability_to_the_minus_beta_over_their_max():
    p = np.array([0.5, 1.0, 3.0, 0.2, 2.0])
    buf = PrioritizedReplay(8, (1, 1, 1), alpha=0.7, eps=0.01, seed=3)
    z = np.zeros((5, 1, 1, 1), np.uint8)
    buf.add(z, np.arange(5), np.zeros(5), np.ones(5), z, priorities=p)
    idx, _, w = buf.sample(32, beta=0.4)
    prob = (p + 0.01) ** 0.7 / ((p + 0.01) ** 0.7).sum()
    ref = (5 * prob[idx.numpy()]) ** -0.4
    np.testing.assert_allclose(w.numpy(), ref / ref.max(), rtol=1e-6)
    assert set(idx.tolist()) <= set(range(5))  # never an empty slot (priority 0)


def test_new_items_get_the_largest_priority_seen_and_a_skipped_step_changes_nothing():
    buf = PrioritizedReplay(8, (1, 1, 1), alpha=0.5, eps=1e-6)
    z = np.zeros((2, 1, 1, 1), np.uint8)
    buf.add(z, np.array([0, 1]), np.zeros(2), np.ones(2), z)
    assert torch.equal(buf.prio[:2], torch.ones(2, dtype=torch.float64))  # max priority 1 at first
    buf.update_priorities(torch.tensor([1, 1]), torch.tensor([-9.0, 3.0]))  # drawn twice: the larger stays
    assert buf.prio[1].item() == pytest.approx((9.0 + 1e-6) ** 0.5) and float(buf.max_priority) == pytest.approx(9.0 + 1e-6)
    before, top = buf.prio.clone(), buf.max_priority.clone()
    buf.update_priorities(torch.tensor([0, 1]), torch.tensor([float("nan"), 100.0]), ok=torch.tensor(False))
    assert torch.equal(buf.prio, before) and torch.equal(buf.max_priority, top)
    buf.add(z[:1], np.array([2]), np.zeros(1), np.ones(1), z[:1])
    assert buf.prio[2].item() == pytest.approx((9.0 + 1e-6) ** 0.5)


def test_priority_update_and_ring_overwrite():
    buf = PrioritizedReplay(3, (1, 1, 1), alpha=1.0, eps=0.0)
    z = np.zeros((2, 1, 1, 1), np.uint8)
    buf.add(z, np.array([0, 1]), np.zeros(2), np.ones(2), z)
    buf.add(z, np.array([2, 3]), np.zeros(2), np.ones(2), z)  # wraps: slot 0 now holds action 3
    assert buf.size == 3 and buf.pos == 1 and buf.actions.tolist() == [3, 1, 2]
    buf.update_priorities(np.array([0, 1, 2]), np.array([0.0, 0.0, 5.0]))
    idx, _, _ = buf.sample(16, beta=0.4)
    assert set(idx.tolist()) == {2}
    assert PrioritizedReplay.nbytes(1000, (64, 64, 3)) > 1000 * 2 * 64 * 64 * 3
    big = PrioritizedReplay(3, (1, 1, 1))
    big.add(np.zeros((5, 1, 1, 1), np.uint8), np.arange(5), np.zeros(5), np.ones(5), np.zeros((5, 1, 1, 1), np.uint8))
    assert big.actions.tolist() == [3, 4, 2] and big.pos == 2 and big.size == 3  # as slot = (pos + i) % capacity


def filled_replay(seed=0, capacity=50, n=70, obs_shape=(3, 2, 1), device="cpu"):
    """A wrapped buffer of random transitions with updated priorities."""
    rng = np.random.default_rng(seed)
    buf = PrioritizedReplay(capacity, obs_shape, alpha=0.6, seed=seed, device=device)
    for start in range(0, n, 16):
        k = min(16, n - start)
        buf.add(rng.integers(0, 255, (k, *obs_shape), dtype=np.uint8), rng.integers(0, 4, k),
                rng.normal(size=k).astype(np.float32), rng.random(k).astype(np.float32),
                rng.integers(0, 255, (k, *obs_shape), dtype=np.uint8), next_legal=rng.integers(-1, 15, (k, 1)))
    idx, _, _ = buf.sample(16, 0.4)
    buf.update_priorities(idx, torch.from_numpy(rng.normal(size=16) * 3).to(device))
    return buf


FIELDS = ("obs", "next_obs", "actions", "returns", "discounts", "next_legal", "prio")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def no_tf32():
    """fp32 convolutions and matmuls on a GPU (TF32 by default for cuDNN), for comparisons at 1e-6."""
    if not torch.cuda.is_available():
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_replay_save_load_round_trip_is_bit_exact_and_reads_the_previous_format(tmp_path):
    buf = filled_replay()
    with open(tmp_path / "replay.npz", "wb") as f:
        buf.save(f, tag=7)
    back = PrioritizedReplay(50, (3, 2, 1), alpha=0.6)
    assert back.load(tmp_path / "replay.npz", tag=7) is None
    for name in FIELDS:
        assert torch.equal(getattr(back, name), getattr(buf, name)), name
    assert (back.pos, back.size) == (buf.pos, buf.size) and torch.equal(back.max_priority, buf.max_priority)
    assert "belongs to update 7" in PrioritizedReplay(50, (3, 2, 1)).load(tmp_path / "replay.npz", tag=8)
    assert "holds 50 transitions" in PrioritizedReplay(40, (3, 2, 1)).load(tmp_path / "replay.npz", tag=7)
    # the file the numpy replay wrote (np.savez, the same names): loads the same
    n = buf.size
    np.savez(tmp_path / "old.npz", tag=np.int64(7), capacity=np.int64(50), pos=np.int64(buf.pos), size=np.int64(n),
             max_priority=np.float64(float(buf.max_priority)), leaves=buf.prio[:n].numpy(),
             **{k: getattr(buf, k)[:n].numpy() for k in FIELDS[:-1]})
    old = PrioritizedReplay(50, (3, 2, 1), alpha=0.6)
    assert old.load(tmp_path / "old.npz", tag=7) is None
    assert all(torch.equal(getattr(old, k), getattr(buf, k)) for k in FIELDS)
    with np.load(tmp_path / "replay.npz", allow_pickle=False) as a, np.load(tmp_path / "old.npz") as b:
        assert sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype
                                                          for k in a.files)


def test_a_replay_file_that_is_a_fifo_or_folder_is_not_used_and_never_waited_on(tmp_path):
    """A resume reads checkpoints/replay.npz back: a FIFO by that name would hold a plain open (and
    the learner) until someone wrote to it; it is named and the buffer refills from empty."""
    os.mkfifo(tmp_path / "replay.npz")
    (tmp_path / "folder.npz").mkdir()
    buf = PrioritizedReplay(50, (3, 2, 1))
    assert buf.load(tmp_path / "replay.npz", tag=7) == "it is a FIFO, not a file" and buf.size == 0
    assert buf.load(tmp_path / "folder.npz", tag=7) == "it is a folder, not a file" and buf.size == 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_a_replay_restored_from_its_file_and_generator_draws_the_same_batches(tmp_path, device):
    """Exact resume: the buffer saved with its generator's state and loaded elsewhere samples, and
    updates its priorities, as the original goes on doing."""
    buf = filled_replay(seed=4, device=device)
    with open(tmp_path / "r.npz", "wb") as f:
        buf.save(f, tag=1)
    rng_state, gen_state = buf.rng.bit_generator.state, buf.generator.get_state()
    back = PrioritizedReplay(50, (3, 2, 1), alpha=0.6, seed=99, device=device)
    assert back.load(tmp_path / "r.npz", tag=1) is None
    back.rng.bit_generator.state, _ = rng_state, back.generator.set_state(gen_state)
    for step in range(5):
        got = [r.sample(8, 0.5 + 0.1 * step) for r in (buf, back)]
        (ia, ba, wa), (ib, bb, wb) = got
        assert torch.equal(ia, ib) and torch.equal(wa, wb)
        assert all(torch.equal(ba[k], bb[k]) for k in ba)
        td = torch.linspace(-2, 2, 8, device=device) * (step + 1)
        buf.update_priorities(ia, td)
        back.update_priorities(ib, td)
    assert torch.equal(buf.prio, back.prio)


def test_replay_on_the_host_for_a_cpu_learner():
    from mpippo.algos.dqn import replay_device
    assert replay_device(torch.device("cpu"), 10**12) == torch.device("cpu")


def test_device_adam_steps_as_torch_adam_and_a_refused_step_moves_nothing():
    from mpippo.algos.adam import Adam
    from mpippo.algos.learner_parts import DeviceAdam, flat_parameters
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    ref = copy.deepcopy(net)
    flat_parameters(net)
    opt = Adam(net.parameters(), lr=1e-2, eps=1e-5)
    adam = DeviceAdam(net.parameters(), opt)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5)
    x = torch.randn(16, 5)
    for k in range(6):
        adam.zero_grad()
        net(x).pow(2).mean().backward()
        ref_opt.zero_grad()
        ref(x).pow(2).mean().backward()
        norm = adam.clip_(0.5)
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        assert float(norm) == pytest.approx(float(ref_norm), rel=1e-5)
        if k == 3:  # a refused step: parameters, moments and the step count stay
            before = [t.clone() for t in (adam.p, adam.m, adam.v, adam.steps)]
            adam.g[0] = float("nan")
            adam.step(torch.tensor(False))
            assert all(torch.equal(a, b) for a, b in zip(before, (adam.p, adam.m, adam.v, adam.steps)))
            continue
        adam.step(torch.tensor(True))
        ref_opt.step()
    assert max(float((p - q).detach().abs().max()) for p, q in zip(net.parameters(), ref.parameters())) < 2e-6
    adam.sync()
    sd = opt.state_dict()
    ref_sd = ref_opt.state_dict()
    assert all(float(sd["state"][i]["step"]) == float(ref_sd["state"][i]["step"]) == 5 for i in sd["state"])
    assert all(torch.allclose(sd["state"][i][k], ref_sd["state"][i][k], atol=1e-7)
               for i in sd["state"] for k in ("exp_avg", "exp_avg_sq"))


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


def test_n_step_returns_bootstrap_from_the_final_observation_of_a_time_limit():
    """A time limit (env.truncated()) is not the end of the task: the transition keeps the discount of
    the steps up to the cut and takes the episode's final observation as next_obs; a termination in the
    same step of another env still gets 0. Vector observations stay float32."""
    gamma = 0.5
    acc = NStepAccumulator(3, gamma, num_envs=3, obs_shape=(2,))
    obs = lambda t: np.full((3, 2), t + 0.25, np.float32)  # noqa: E731
    dones = [np.array([False, False, False]), np.array([True, True, False]), np.array([False, False, False])]
    final = np.full((1, 2), 99.5, np.float32)  # env 0's last observation before the reset
    cuts = [None, (np.array([0]), final), None]
    out = [acc.push(obs(t), np.zeros(3, np.int64), np.ones(3, np.float32), dones[t], obs(t + 1), cuts[t])
           for t in range(3)]
    o, a, R, disc, nxt = out[2]  # the transitions of step 0
    assert o.dtype == np.float32 and nxt.dtype == np.float32
    np.testing.assert_allclose(R, [1.5, 1.5, 1.75])
    np.testing.assert_allclose(disc, [gamma ** 2, 0.0, gamma ** 3])  # cut after 2 steps; terminated; running
    np.testing.assert_allclose(nxt[0], [99.5, 99.5])
    np.testing.assert_allclose(nxt[2], [3.25, 3.25])
    out = acc.push(obs(3), np.zeros(3, np.int64), np.ones(3, np.float32), dones[0], obs(4))  # step 1's
    np.testing.assert_allclose(out[3], [gamma, 0.0, gamma ** 3])
    np.testing.assert_allclose(out[4][0], [99.5, 99.5])
    out = acc.push(obs(4), np.zeros(3, np.int64), np.ones(3, np.float32), dones[0], obs(5))  # step 2's: no cut left
    np.testing.assert_allclose(out[3], [gamma ** 3] * 3)
    np.testing.assert_allclose(out[4][0], [5.25, 5.25])


def test_the_replay_keeps_vector_observations_as_float32_and_refuses_a_file_of_frames(tmp_path):
    rep = PrioritizedReplay(8, (3,), seed=0)
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    rep.add(obs, np.arange(4), np.ones(4, np.float32), np.ones(4, np.float32), obs + 0.5)
    _, batch, _ = rep.sample(4, 0.4)
    assert batch["obs"].dtype == torch.float32 and batch["frames"].shape == (8, 3)
    assert set(map(tuple, batch["obs"].numpy().round(5))) <= set(map(tuple, obs.round(5)))  # not rounded to bytes
    assert PrioritizedReplay.nbytes(8, (3,)) > PrioritizedReplay.nbytes(8, (3, 1, 1))  # 4 bytes a number
    with open(tmp_path / "r.npz", "wb") as f:
        rep.save(f, 7)
    back = PrioritizedReplay(8, (3,), seed=0)
    assert back.load(tmp_path / "r.npz", 7) is None and torch.equal(back.obs[:4], rep.obs[:4])
    z = dict(np.load(tmp_path / "r.npz"))  # the same file with byte observations (a frames run's)
    z["obs"], z["next_obs"] = z["obs"].astype(np.uint8), z["next_obs"].astype(np.uint8)
    np.savez(tmp_path / "bytes.npz", **z)
    assert "uint8" in back.load(tmp_path / "bytes.npz", 7)


def test_apex_epsilon_ladder():
    eps = apex_epsilons(8, 0.4, 7.0)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert np.all(np.diff(eps) < 0)
    assert apex_epsilons(1)[0] == pytest.approx(0.4)


@pytest.mark.parametrize("num_actors", [1, 2])
def test_the_apex_ladder_runs_over_every_env_of_every_actor(num_actors):
    """Each env explores at its own rung of one ladder over all actors' envs (the paper's actors
    stepped one env each): one actor alone still spans 0.4 .. 0.4^8, and a greedy action is kept
    at each env's own rate."""
    from mpippo import config as C
    from mpippo.algos.apex import ApeX
    cfg = C.build(C.load_yaml(C.DEFAULT_CONFIG.parent / "dqn_toy.yaml"),
                  [("env", "num_envs_per_rank", 4), ("training", "precision", "fp32")], num_actors + 1)
    algo = ApeX(cfg, C.obs_shape_of(cfg), 4, num_actors=num_actors, masked=False)
    assert np.allclose(algo.epsilons, apex_epsilons(4 * num_actors))
    net = lambda obs: torch.tensor([[0.0, 0.0, 9.0, 0.0]]).repeat(len(obs), 1)  # greedy: action 2  # noqa: E731
    rungs = []
    for i in range(num_actors):
        acting = algo.actor(i, net, 4, np.random.default_rng(i))
        kept = np.mean([acting.act(np.zeros((4, 1)), None) == 2 for _ in range(4000)], axis=0)
        rungs.append(acting.eps)
        assert np.allclose(1 - kept, 0.75 * acting.eps, atol=0.03)  # a random action is action 2 a quarter of the time
    assert np.allclose(np.concatenate(rungs), algo.epsilons)
    assert algo.epsilons[0] == pytest.approx(0.4) and algo.epsilons[-1] == pytest.approx(0.4 ** 8)


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
    legal = bits_to_mask(torch.tensor([[0b110]]), 3)
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
    assert (batch["next_legal"].numpy() == bits[idx.numpy()]).all()


@pytest.mark.parametrize("num_actions", [7, 64, 65, 130])
def test_legal_moves_of_any_count_travel_as_bits_through_the_replay_and_its_file(tmp_path, num_actions):
    """A game's legal moves travel as mask_bits' int64 words, 64 moves a word (one word carried 63 at most,
    and DQN refused larger games: Othello's 65 moves, Go's 82): numpy and torch agree, words of -1 read as
    all legal, and the replay keeps, saves and loads them; a file of before (one word a transition, saved
    as a vector) loads into a one-word buffer."""
    import numpy as np
    from mpippo.algos.dqn import PrioritizedReplay
    from mpippo.envs import bits_to_mask, mask_bits, mask_words
    rng = np.random.default_rng(num_actions)
    legal = rng.random((6, num_actions)) < 0.5
    bits = mask_bits(legal)
    assert bits.shape == (6, mask_words(num_actions)) and (bits_to_mask(bits, num_actions) == legal).all()
    assert torch.equal(mask_bits(torch.from_numpy(legal)), torch.from_numpy(bits))
    assert (bits_to_mask(torch.from_numpy(bits), num_actions).numpy() == legal).all()
    assert bits_to_mask(np.full((1, bits.shape[1]), -1), num_actions).all()
    words = bits.shape[1]
    replay = PrioritizedReplay(8, (3,), seed=0, legal_words=words)
    obs = np.zeros((6, 3), np.float32)
    replay.add(obs, np.zeros(6, np.int64), np.zeros(6, np.float32), np.ones(6, np.float32), obs, next_legal=bits)
    with open(tmp_path / "r.npz", "wb") as f:
        replay.save(f, 1)
    again = PrioritizedReplay(8, (3,), seed=0, legal_words=words)
    assert again.load(tmp_path / "r.npz", 1, num_actions) is None
    assert torch.equal(again.next_legal[:6], torch.from_numpy(bits))
    with np.load(tmp_path / "r.npz") as z:
        old = {k: z[k] for k in z.files} | {"next_legal": z["next_legal"][:, 0]}
    np.savez(tmp_path / "old.npz", **old)
    said = PrioritizedReplay(8, (3,), seed=0, legal_words=words).load(tmp_path / "old.npz", 1, num_actions)
    assert said is None if words == 1 else said == f"its next_legal has shape (6,), this buffer's (6, {words})"
    np.savez(tmp_path / "float.npz", **(old | {"next_legal": np.full((6, words), 1e30)}))  # (read as other moves)
    said = PrioritizedReplay(8, (3,), seed=0, legal_words=words).load(tmp_path / "float.npz", 1, num_actions)
    assert said == "its next_legal are float64, not int64 bit words"
    none, past = bits.copy(), bits.copy()  # (values save() never writes)
    none[2] = 0
    past[3, -1] = -2  # every bit of the last word but its first
    cases = [(none, "its next_legal hold a state with no legal move")]
    if num_actions % 64:  # (64 moves fill their word: no bit lies past them)
        cases.append((past, f"its next_legal hold moves past the game's {num_actions}"))
    for edited, why in cases:
        np.savez(tmp_path / "edited.npz", **(old | {"next_legal": edited}))
        said = PrioritizedReplay(8, (3,), seed=0, legal_words=words).load(tmp_path / "edited.npz", 1, num_actions)
        assert said == why, (said, why)


def test_the_target_masks_moves_of_every_word_and_the_replay_takes_only_its_own_width():
    """70 moves: the best next move by the online network, 66, sits in the second word and is illegal; the
    target takes the best legal one. Rows of another width are refused (copy_ would have broadcast them
    silently into the buffer: other moves masked)."""
    import numpy as np
    from mpippo.algos.dqn import PrioritizedReplay, double_dqn_loss
    from mpippo.envs import bits_to_mask, mask_bits
    legal = np.ones((1, 70), bool)
    legal[0, 66] = False
    q_next, target = torch.zeros(1, 70), torch.zeros(1, 70)
    q_next[0, 66], q_next[0, 3], target[0, 66], target[0, 3] = 5.0, 1.0, 100.0, 10.0
    args = (torch.zeros(1, 70), q_next, target, torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0.5]), torch.ones(1))
    _, td = double_dqn_loss(*args, next_legal=bits_to_mask(torch.from_numpy(mask_bits(legal)), 70))
    assert td.item() == 1.0 + 0.5 * 10.0
    replay, obs = PrioritizedReplay(4, (3,), legal_words=2), np.zeros((2, 3), np.float32)
    for words in (np.full((2, 1), -1), np.full(2, -1)):
        with pytest.raises(ValueError, match="rows of shape"):
            replay.add(obs, np.zeros(2, np.int64), np.zeros(2, np.float32), np.ones(2, np.float32), obs, next_legal=words)
    assert bits_to_mask(np.zeros((0, 2), np.int64), 70).shape == (0, 70)


def _apex_learner(max_skips=3, returns=0.0, sets=(), device="cpu"):
    """An Ape-X learner half on toy-cue frames whose replay holds 64 transitions of `returns`."""
    from mpippo import config as C
    from mpippo.algos.apex import ApeX
    cfg = C.build(C.load_yaml(C.DEFAULT_CONFIG.parent / "dqn_toy.yaml"),
                  [("guards", "max_nonfinite_skips", max_skips), ("training", "precision", "fp32"), *sets], 3)
    obs_shape = C.obs_shape_of(cfg)
    algo = ApeX(cfg, obs_shape, 4, num_actors=2, masked=False)
    torch.manual_seed(0)
    algo.setup_learner(algo.new_net().to(device), torch.device(device), seed=0, aug_seed=1)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (64,) + obs_shape, dtype=np.uint8)
    algo.replay.add(frames, rng.integers(0, 4, 64), np.full(64, returns, np.float32), np.full(64, 0.5, np.float32),
                    frames[::-1].copy())
    return algo


def test_a_non_finite_td_loss_is_skipped_and_ends_the_learner_after_the_guard():
    """As sync PPO: the step is skipped (weights and priorities as they were), counted, and after
    guards.max_nonfinite_skips in a row NonFiniteError names the learning rate."""
    from mpippo.errors import NonFiniteError
    algo = _apex_learner(max_skips=3, returns=float("inf"))
    weights = [p.detach().clone() for p in algo.q.parameters()]
    leaves = algo.replay.prio.clone()
    for k in range(2):
        assert not np.isfinite(float(algo.update(k, 0.0)))
    assert algo.skipped == algo.nonfinite_streak == 2
    assert all(torch.equal(p, q) for p, q in zip(weights, algo.q.parameters()))
    assert torch.equal(algo.replay.prio, leaves) and bool(torch.isfinite(algo.replay.prio).all())
    with pytest.raises(NonFiniteError, match=r"not finite .* in 3 consecutive learner updates.*"
                                             r"guards.max_nonfinite_skips = 3.*lower training.learning_rate \(now 0.001\)"):
        algo.update(2, 0.0)
    assert algo.summary(3, 64)["nonfinite_skips"] == 3


def test_a_finite_step_resets_the_non_finite_streak():
    algo = _apex_learner(max_skips=2, returns=float("nan"))
    algo.update(0, 0.0)
    assert algo.nonfinite_streak == 1
    algo.replay.returns[:] = 1.0
    assert np.isfinite(float(algo.update(1, 0.0))) and algo.nonfinite_streak == 0 and algo.skipped == 1
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
    assert bool(torch.isfinite(algo.replay.prio).all())
    assert all(bool(torch.isfinite(p).all()) for p in algo.q.parameters())  # skipped steps change nothing


def test_with_the_guard_read_rarely_nothing_moves_after_it_trips_and_it_raises_at_the_read():
    """A GPU learner reads the guard every guard_every updates: the steps after it tripped are not
    taken (weights, Adam, priorities), the count stops at the guard, and the read raises."""
    from mpippo.errors import NonFiniteError
    algo = _apex_learner(max_skips=3, returns=float("nan"))
    algo.guard_every = 8
    weights, leaves = algo.adam.p.clone(), algo.replay.prio.clone()
    for k in range(7):  # tripped at the third, not read yet
        algo.update(k, 0.0)
    algo.replay.returns[:] = 1.0  # finite again: still nothing is taken after the guard tripped
    with pytest.raises(NonFiniteError, match="in 3 consecutive learner updates"):
        algo.update(7, 0.0)
    assert torch.equal(algo.adam.p, weights) and torch.equal(algo.replay.prio, leaves)
    assert algo.skipped == 3 and float(algo.adam.steps) == 0


def _reference_update(algo, idx_batch_w):
    """The previous learner's step on a given batch: two passes of the online network (obs with
    gradient, next_obs without), the target on next_obs, clip_grad_norm_, Adam; returns (parameters, |td|)."""
    from mpippo.algos.adam import Adam
    q, target = copy.deepcopy(algo.q), copy.deepcopy(algo.target)
    for p in q.parameters():
        p.grad = None
    opt = Adam(q.parameters(), lr=algo.t.learning_rate, eps=algo.t.adam_eps)
    algo.adam.sync()  # the step count, kept on the device, into the optimizer's state
    opt.load_state_dict(copy.deepcopy(algo.opt.state_dict()))
    _, b, w = idx_batch_w
    q_all = q(b["obs"])
    with torch.no_grad():
        q_next_target = target(b["next_obs"])
        q_next_online = q(b["next_obs"])
    loss, td = double_dqn_loss(q_all, q_next_online, q_next_target, b["actions"], b["returns"], b["discounts"], w)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(q.parameters(), algo.t.max_grad_norm)
    opt.step()
    return [p.detach() for p in q.parameters()], td


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("joint", [True, False])
def test_one_update_on_cat_obs_next_obs_equals_the_two_pass_step(joint, device, no_tf32):
    algo = _apex_learner(returns=0.7, device=device)
    algo.joint_forward = joint
    for k in range(3):  # Adam's moments under way
        algo.update(k, 0.1)
    state = algo.replay.generator.get_state()
    beta = algo.d.per_beta + (1.0 - algo.d.per_beta) * 0.1
    sampled = algo.replay.sample(algo.d.batch_size, beta)
    algo.replay.generator.set_state(state)  # the update draws the same batch
    ref_params, ref_td = _reference_update(algo, sampled)
    algo.update(3, 0.1)
    gaps = torch.cat([(p.detach() - r).abs().reshape(-1) for p, r in zip(algo.q.parameters(), ref_params)]).cpu()
    if device == "cpu":
        assert float(gaps.max()) < 1e-6, float(gaps.max())
    else:  # cuDNN may pick other algorithms for 2B rows than for B: a parameter whose gradients were all
        # near 0 can take another Adam step (m / sqrt(v) of rounding noise), so the bulk is compared
        assert float(gaps.mean()) < 1e-7 and float(gaps.max()) < 1e-3, (float(gaps.mean()), float(gaps.max()))
    idx = sampled[0]
    prio = (ref_td.double().abs() + algo.replay.eps) ** algo.replay.alpha  # a slot drawn twice: the larger
    want = torch.zeros_like(algo.replay.prio).scatter_reduce_(0, idx, prio, "amax", include_self=False)[idx]
    assert torch.allclose(algo.replay.prio[idx], want, rtol=1e-6, atol=1e-9)


def test_joint_and_two_pass_learners_stay_together():
    a, b = _apex_learner(returns=0.3), _apex_learner(returns=0.3)
    a.joint_forward, b.joint_forward = True, False
    for k in range(10):
        la, lb = a.update(k, k / 10), b.update(k, k / 10)
        assert float(la) == pytest.approx(float(lb), rel=1e-5, abs=1e-6)
    assert float((a.adam.p - b.adam.p).abs().max()) < 1e-5
    assert torch.allclose(a.replay.prio, b.replay.prio, rtol=1e-4)


def write_with(path, fn):
    """files.atomic_write_with's part here: fn writes the open file."""
    with open(path, "wb") as f:
        fn(f)


def _resumed_pair(tmp_path, **kw):
    """Learner A after 10 updates, and learner B (another buffer, other weights) loaded from A's
    checkpoint of update 5 that then made updates 5-9 itself."""
    a = _apex_learner(returns=0.5, sets=[("dqn", "save_replay", True)], **kw)
    for k in range(5):
        a.update(k, k / 20)
    named = a.save_side_files(tmp_path, 5, write_with)
    torch.save({"model": a.q.state_dict(), **a.state_dict(), **named}, tmp_path / "ckpt.pt")
    for k in range(5, 10):
        a.update(k, k / 20)
    st = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    b = _apex_learner(returns=9.0, **kw)
    b.q.load_state_dict(st["model"])
    assert b.load_state_dict(st, tmp_path, 5) == "; restored replay of 64 transitions"
    for k in range(5, 10):
        b.update(k, k / 20)
    return a, b


def test_a_learner_resumed_from_its_checkpoint_goes_on_exactly(tmp_path):
    """Exact resume on the CPU: the state_dict (through torch.save), the model and the replay file of
    learner A after 5 updates, loaded into a fresh learner B: the next 5 updates are A's, bit for bit."""
    a, b = _resumed_pair(tmp_path)
    assert (tmp_path / "replay_0000000005.npz").exists()
    assert torch.equal(a.adam.p, b.adam.p) and torch.equal(a.adam.m, b.adam.m) and torch.equal(a.replay.prio, b.replay.prio)
    assert all(torch.equal(x, y) for x, y in zip(a.target.parameters(), b.target.parameters()))


def test_a_writer_killed_between_its_replay_and_its_checkpoint_keeps_the_checkpoints_replay(tmp_path):
    """The replay had one name, replaced before the checkpoint: a writer killed between the two (kill -9, a
    full disk) left a replay of a newer update than latest.pt, and the resume refilled from empty. Each replay
    has its update's name now; the checkpoint names its own, and the older ones go only once it is written."""
    from mpippo.algos.apex import REPLAY_FILE
    a = _apex_learner(returns=0.5, sets=[("dqn", "save_replay", True)])
    for k in range(5):
        a.update(k, k / 20)
    named = a.save_side_files(tmp_path, 5, write_with)
    (tmp_path / REPLAY_FILE).write_bytes(b"a replay of an earlier checkpoint's kind")
    torch.save({"model": a.q.state_dict(), **a.state_dict(), **named}, tmp_path / "ckpt.pt")
    a.prune_side_files(tmp_path, named)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "replay_0000000005.npz"]
    a.update(5, 0.25)
    a.save_side_files(tmp_path, 6, write_with)  # ... and killed here, before its checkpoint
    st = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    b = _apex_learner(returns=9.0)
    assert b.load_state_dict(st, tmp_path, 5) == "; restored replay of 64 transitions"


@pytest.mark.parametrize("sets, said", [
    ((("dqn", "save_replay", True),), "; no replay in the checkpoint: the buffer refills from empty (no update before "
                                       "dqn.learning_starts 1,000 new transitions)"),
    ((("dqn", "learning_starts", 0),), "; dqn.save_replay is off: the buffer refills from empty")])
def test_a_resume_without_its_replay_says_the_updates_wait_for_learning_starts(sets, said):
    """A short resume's 0 updates had looked like a hang: the start-up line says why there are none."""
    a = _apex_learner()
    b = _apex_learner(sets=sets)
    assert b.load_state_dict(a.state_dict(), None, 0) == said


def test_a_checkpoint_of_the_numpy_replay_still_loads():
    """Before the device replay: no replay_generator, Adam's moments per parameter, step on the host."""
    from mpippo import ckpt_schema
    a = _apex_learner(returns=0.5)
    for k in range(3):
        a.update(k, 0.0)
    st = a.state_dict()
    old = {k: v for k, v in st.items() if k != "replay_generator"}
    old["optimizer"] = copy.deepcopy(old["optimizer"])  # separate tensors per parameter, as torch's Adam saved
    b = _apex_learner(returns=0.5)
    assert b.load_state_dict(old, None, 3) == ("; dqn.save_replay is off: the buffer refills from empty (no update "
                                               "before dqn.learning_starts 1,000 new transitions)")
    assert torch.equal(b.adam.m, a.adam.m) and float(b.adam.steps) == 3.0
    assert b.opt.state_dict()["state"][0]["exp_avg"].data_ptr() == b.adam.m.data_ptr()  # views of the flat buffer
    b.update(3, 0.0)  # and it trains on
    ckpt_schema.tensor(st["replay_generator"], "replay_generator", None, torch.uint8)


def test_logged_td_loss_is_the_mean_over_the_interval():
    class Writer:
        def __init__(self):
            self.points = {}

        def add_scalar(self, tag, value, x):
            self.points[tag] = value
    algo = _apex_learner(returns=0.5)
    losses = [float(algo.update(k, 0.0)) for k in range(4)]
    w = Writer()
    algo.log(w, 1, losses[-1])
    assert w.points["losses/td_loss"] == pytest.approx(np.mean(losses)) and w.points["learner/replay_size"] == 64
    algo.log(w, 2, float("nan"))  # nothing since: the last loss given
    assert np.isnan(w.points["losses/td_loss"])


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


def test_a_gpu_style_update_reads_nothing_from_the_device(monkeypatch):
    """With the guard read every guard_every updates (a GPU's cadence), the updates between read nothing:
    the sample, the step and the priorities stay on the device; the log reads the summed losses."""
    algo = _apex_learner(returns=0.5)
    algo.guard_every, algo.joint_forward = 1000, True
    algo.d.mirror_augment = True  # (refused for toy-cue by the config: the mirroring's path here all the same)
    reads = []
    for name in ("tolist", "item", "__float__", "__bool__", "numpy", "cpu", "__int__", "__index__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *x, _o=original, _n=name, **k: (reads.append(_n), _o(self, *x, **k))[1])
    for k in range(3):
        algo.update(k, 0.5)
    assert reads == [], reads


# ---- on a GPU (skipped without CUDA): what the CPU tests cannot see ----
@cuda
def test_cuda_the_replay_lives_on_the_gpu_and_updates_never_synchronize():
    """The learner's defaults on a GPU (replay there, joint forward, rare guard reads), and updates plus
    ingests of actors' chunks that never wait for the device (torch's sync debug mode raises if they do)."""
    algo = _apex_learner(returns=0.5, device="cuda")
    assert algo.replay.device.type == "cuda" and algo.replay.obs.is_cuda and algo.joint_forward
    assert algo.guard_every > 1 and algo.adam.p.is_cuda
    algo.guard_every = 1000
    algo.d.mirror_augment = True  # (the mirroring's path too)
    rng = np.random.default_rng(1)
    chunk = {"obs": rng.integers(0, 255, (32, 8, 8, 3), dtype=np.uint8), "actions": rng.integers(0, 4, 32),
             "returns": rng.normal(size=32).astype(np.float32), "discounts": np.full(32, 0.5, np.float32),
             "next_legal": np.full((32, 1), -1, np.int64)}
    chunk["next_obs"] = chunk["obs"][::-1].copy()
    algo.update(0, 0.5)  # warm-up: cuDNN's choices, the allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for k in range(1, 6):
            loss = algo.update(k, 0.5)
            algo.ingest(chunk, 32)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert np.isfinite(float(loss)) and algo.replay.size == 64 + 5 * 32 and algo.skipped == 0


@cuda
def test_cuda_a_replay_on_the_host_feeds_the_gpu_learner(monkeypatch):
    """The fallback for a buffer larger than the GPU's free memory: storage on the host, each batch
    gathered into pinned memory and copied over, the TD errors brought back for the priorities."""
    import mpippo.algos.apex as apex
    monkeypatch.setattr(apex, "replay_device", lambda device, nbytes: torch.device("cpu"))
    algo = _apex_learner(returns=0.5, device="cuda")
    assert algo.replay.device.type == "cpu" and algo.adam.p.is_cuda
    before = algo.replay.prio.clone()
    for k in range(3):
        loss = algo.update(k, 0.5)
    assert np.isfinite(float(loss)) and not torch.equal(algo.replay.prio, before)
    idx, batch, w = algo.replay.sample(16, 0.5, device="cuda")
    assert batch["frames"].is_cuda and w.is_cuda and not idx.is_cuda


@cuda
def test_cuda_a_learner_checkpoint_resumes_on_the_gpu(tmp_path):
    """As the CPU test above, on the GPU: the CUDA generator's state goes with the checkpoint (cuDNN
    deterministic, as training.deterministic makes it; compared in bulk, see the test of one update)."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        a, b = _resumed_pair(tmp_path, device="cuda")
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved
    gap = (a.adam.p - b.adam.p).abs()
    assert float(gap.mean()) < 1e-7 and float(gap.max()) < 1e-3, (float(gap.mean()), float(gap.max()))
    assert float(((a.replay.prio - b.replay.prio).abs() / a.replay.prio.clamp(min=1e-12)).mean()) < 1e-5


@pytest.mark.parametrize("edit, why", [
    (lambda a: a["actions"].__setitem__(0, 99), "its actions are not integers 0 to 5"),
    (lambda a: a["actions"].__setitem__(0, -1), "its actions are not integers 0 to 5"),
    (lambda a: a.__setitem__("actions", a["actions"].astype(np.float32)), "its actions are not integers"),
    (lambda a: a["returns"].__setitem__(3, np.nan), "its returns holds a value that is not finite"),
    (lambda a: a["leaves"].__setitem__(3, np.inf), "its leaves holds a value that is not finite"),
    (lambda a: a["leaves"].__setitem__(3, -1.0), "its priorities are not positive"),
    (lambda a: a["discounts"].__setitem__(3, 2.0), "its discounts lie outside [0, 1]"),
    (lambda a: a.__setitem__("max_priority", np.float64(0.0)), "its priorities are not positive"),
    (lambda a: a["leaves"].__setitem__(slice(None), 0.0), "its priorities do not sum to a finite positive number"),
    (lambda a: a["leaves"].__setitem__(slice(None), 1e308), "its priorities do not sum to a finite positive number"),
    (lambda a: a.__setitem__("next_obs", a["next_obs"][:, :1]), "its next_obs has shape (50, 1, 2, 1), this buffer's "
                                                                 "(50, 3, 2, 1)"),
    (lambda a: a.__setitem__("returns", np.repeat(a["returns"][:, None], 2, 1)), "its returns has shape (50, 2)"),
    (lambda a: a.__setitem__("next_obs", a["next_obs"].astype(np.float64)), "its next observations are float64")])
def test_a_replay_file_edited_out_of_range_is_not_used(tmp_path, edit, why):
    """Values save() never writes (an action past the network's six, a NaN return or priority)
    would fail an update later, an index error or a non-finite loss far from the file: the file is
    not used (the resume says so) and the buffer refills from empty."""
    with open(tmp_path / "replay.npz", "wb") as f:
        filled_replay().save(f, tag=7)
    with np.load(tmp_path / "replay.npz", allow_pickle=False) as z:
        arrays = {k: z[k].copy() for k in z.files}
    edit(arrays)
    np.savez(tmp_path / "replay.npz", **arrays)
    buf = PrioritizedReplay(50, (3, 2, 1))
    got = buf.load(tmp_path / "replay.npz", tag=7, num_actions=6)
    assert got is not None and why in got and buf.size == 0, got


@pytest.mark.parametrize("damage", ["cut short", "a block zeroed"])
def test_a_damaged_replay_file_is_not_used(tmp_path, damage):
    """A file cut short (a full disk, a copy stopped part-way) or with a block of zeros inside (a bad
    sector): the zip's or NumPy's own checks fail (BadZipFile, a bad CRC, a header that does not
    parse), and the resume goes on with an empty buffer, saying why."""
    path = tmp_path / "replay.npz"
    with open(path, "wb") as f:
        filled_replay().save(f, tag=7)
    data = bytearray(path.read_bytes())
    if damage == "cut short":
        del data[-200:]
    else:
        data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    path.write_bytes(bytes(data))
    buf = PrioritizedReplay(50, (3, 2, 1))
    got = buf.load(path, tag=7, num_actions=6)
    assert got is not None and got.startswith("unreadable (") and buf.size == 0, got


def test_the_restore_thread_makes_the_learners_gpu_its_current_device(monkeypatch):
    """The learner restores its checkpoint (the replay buffer: minutes for many GB) in a thread of its
    own, and a CUDA device is current per thread: the thread makes the learner's GPU its own first,
    or whatever it made on "the current GPU" would land on GPU 0 of every learner. CPU: nothing. Its
    logs' writers are opened there too, after the restore (a fresh run: no restore)."""
    from mpippo.runners.actor_learner import start_on
    made_current, done = [], []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)

    class Learner:
        def restore(self, state):
            done.append("restore")
            return f"restored {state['n']}"

        def open_logs(self):
            done.append("logs")
    assert start_on(torch.device("cuda", 3), Learner(), {"n": 7}) == "restored 7"
    assert made_current == [torch.device("cuda", 3)] and done == ["restore", "logs"]
    assert start_on(torch.device("cpu"), Learner(), {"n": 1}) == "restored 1" and len(made_current) == 1
    del done[:]
    assert start_on(torch.device("cpu"), Learner(), None) == "" and done == ["logs"]
