"""APPO's learner-side pieces without MPI: targets from episode-start flags, both losses' gradients,
and the policy-lag accounting (stale segments counted and dropped)."""
import math

import numpy as np
import pytest
import torch

from mpippo.algos import appo
from mpippo.algos.policy_gradient import logprob_entropy


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
    out = appo.LOSSES["vtrace_pg"](logp, ent, values, logp.detach(), adv, vs, values.detach(), 0.2, True, 0.0, 0.5)
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
    out = appo.LOSSES["ppo_clip"](logp, ent, torch.zeros(1, requires_grad=True), behaviour,
                                  torch.ones(1), torch.zeros(1), torch.zeros(1), 0.2, True, 0.0, 0.5)
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


def tiny_net():
    from mpippo.models.impala_cnn import ImpalaCNNPolicy
    torch.manual_seed(3)
    return ImpalaCNNPolicy((8, 8, 3), 4, channels=(4,), hidden_size=16)


def test_on_policy_appo_epoch_equals_a_ppo_epoch_with_n_step_advantages():
    """Behaviour == the current network, one epoch: APPO's step is PPO's with lambda = 1 (V-trace
    targets are the n-step returns, advantages returns - values), same minibatch order."""
    import copy
    from types import SimpleNamespace
    from mpippo.algos.policy_gradient import local_grad_check
    from mpippo.algos.ppo import ppo_update
    B, T, gamma = 4, 6, 0.9
    net = tiny_net()
    obs = torch.randint(0, 255, (B, T + 1, 8, 8, 3), dtype=torch.uint8)
    actions = torch.randint(0, 4, (B, T))
    rewards = torch.randn(B, T)
    firsts = (torch.rand(B, T + 1) < 0.2).long()
    with torch.no_grad():
        logits, values = net(obs.reshape(B * (T + 1), 8, 8, 3))
        logp = logprob_entropy(logits.reshape(B, T + 1, 4)[:, :T].reshape(-1, 4), actions.reshape(-1))[0].reshape(B, T)
        values = values.reshape(B, T + 1)
    seg = {"obs": obs, "actions": actions, "logp": logp, "rewards": rewards, "firsts": firsts}
    a = SimpleNamespace(epochs=1, num_minibatches=3, loss="ppo_clip", rho_bar=1.0, c_bar=1.0)
    t = SimpleNamespace(gamma=gamma, gae_lambda=1.0, precision="fp32", clip_range=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, norm_adv=True)
    ref = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    appo.appo_update(net, opt, seg, a, t, torch.Generator().manual_seed(7))
    # the reference: returns by the backward recursion, advantages = returns - values, ppo_update
    ret, returns = values[:, T], torch.zeros(B, T)
    d = appo.discounts(firsts.T, gamma).T
    for s in range(T - 1, -1, -1):
        ret = rewards[:, s] + d[:, s] * ret
        returns[:, s] = ret
    batch = {"b_obs": obs[:, :T].reshape(B * T, 8, 8, 3), "b_actions": actions.reshape(-1),
             "b_logprobs": logp.reshape(-1), "b_advantages": (returns - values[:, :T]).reshape(-1),
             "b_returns": returns.reshape(-1), "b_values": values[:, :T].reshape(-1)}
    cfg = SimpleNamespace(n_epochs=1, num_minibatches=3, norm_adv=True, adv_norm="minibatch", clip_range=0.2,
                          clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, target_kl=None)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    ppo_update(ref, ref_opt, batch, cfg, local_grad_check(ref.parameters()), torch.Generator().manual_seed(7))
    gap = max(float((p - q).detach().abs().max()) for p, q in zip(net.parameters(), ref.parameters()))
    assert gap < 1e-6, gap
    assert any(float((p - q).detach().abs().max()) > 1e-4 for p, q in zip(net.parameters(), tiny_net().parameters()))


def fake_segments(n, T, version, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": rng.integers(0, 255, (n, T + 1, 8, 8, 3), dtype=np.uint8),
            "actions": rng.integers(0, 4, (n, T)), "logp": np.full((n, T), np.log(0.25), np.float32),
            "rewards": rng.normal(size=(n, T)).astype(np.float32),
            "disc_returns": rng.normal(size=(n, T)).astype(np.float32), "bootstrap": np.zeros((n, T), np.float32),
            "firsts": (rng.random((n, T + 1)) < 0.1).astype(np.uint8), "version": np.asarray(version)}


def test_segment_batch_admits_by_lag_fills_and_keeps_the_overflow():
    batch = appo.SegmentBatch(size=4, T=5, obs_shape=(8, 8, 3), max_lag=2)
    batch.ingest(fake_segments(3, 5, [10, 7, 9]), 3, version=10)  # lags 0, 3 (dropped), 1
    assert batch.filled == 2 and batch.lag.dropped == 1 and not batch.ready()
    segs = fake_segments(3, 5, [10, 10, 9], seed=1)
    batch.ingest(segs, 3, version=10)  # all admitted: 2 fill the batch, 1 waits
    assert batch.ready() and len(batch.overflow) == 1
    out = batch.take("cpu", version=10)
    assert out["obs"].shape == (4, 6, 8, 8, 3) and out["actions"].dtype == torch.int64
    assert torch.equal(out["obs"][3], torch.from_numpy(segs["obs"][1]))
    assert batch.filled == 1 and not batch.overflow  # the waiting one moved in
    assert np.array_equal(batch.arrays["obs"][0], segs["obs"][2])


def test_rewards_are_scaled_step_by_step_like_the_synchronous_ppo():
    from mpippo.algos.buffers import RunningMeanStd
    seg = {k: torch.from_numpy(np.asarray(v)) for k, v in fake_segments(6, 4, [0] * 6).items()}
    rms, ref = RunningMeanStd(), RunningMeanStd()
    got = appo.normalize_rewards(seg, rms)
    ret = seg["disc_returns"].double().numpy()
    for t in range(4):
        ref.update_from_moments(6, ret[:, t].mean(), ret[:, t].var())
        assert torch.allclose(got[:, t], seg["rewards"][:, t] / math.sqrt(ref.var + 1e-8))
    assert rms.count == pytest.approx(ref.count) and rms.var == pytest.approx(ref.var)


def test_actor_cuts_each_env_stream_into_segments_with_the_behaviour_log_probs():
    from mpippo.envs.toy import CueEnv
    from mpippo.models.impala_cnn import ImpalaCNNPolicy
    env = CueEnv(num_envs=3, seed=0)
    torch.manual_seed(0)
    net = ImpalaCNNPolicy(env.obs_shape, env.num_actions, channels=(4,), hidden_size=16)
    acting = appo.APPOActing(net, 3, T=4, obs_shape=env.obs_shape, gamma=0.9, precision="fp32",
                             generator=torch.Generator().manual_seed(0))
    acting.set_version(7)
    _, obs, _ = env.observe()
    got, seen = [], []
    for step in range(8):
        actions = acting.act(obs)
        env.act(actions)
        rew, next_obs, first = env.observe()
        seen.append((obs.copy(), actions.copy(), rew.copy(), acting.logp.copy()))
        items = acting.transitions(obs, actions, rew, first, next_obs)
        assert (items is None) == (step % 4 != 3)
        if items is not None:
            got.append((items, next_obs.copy()))
        obs = next_obs
    assert len(got) == 2
    for k, (items, last_obs) in enumerate(got):
        assert items["obs"].shape == (3, 5, *env.obs_shape) and (items["version"] == 7).all()
        for t in range(4):
            o, a, r, lp = seen[4 * k + t]
            assert np.array_equal(items["obs"][:, t], o) and np.array_equal(items["actions"][:, t], a)
            assert np.allclose(items["rewards"][:, t], r) and np.allclose(items["logp"][:, t], lp)
        assert np.array_equal(items["obs"][:, 4], last_obs)  # the bootstrap observation
    assert np.array_equal(got[0][0]["obs"][:, 4], got[1][0]["obs"][:, 0])  # consecutive segments join
    with torch.no_grad():  # the recorded log-probs are the network's for the sampled actions
        o, a, _, lp = seen[0]
        logits, _ = net(torch.from_numpy(o))
        assert np.allclose(logprob_entropy(logits, torch.from_numpy(a))[0].numpy(), lp, atol=1e-6)


def test_a_segment_carries_the_bootstrap_of_an_episode_a_time_limit_cut():
    """Vector observations travel as float32; a step whose episode a time limit ended carries
    training.gamma * V(final obs) for the learner to add after reward scaling; other steps 0."""
    from mpippo.models.mlp import MLPPolicy
    torch.manual_seed(0)
    net = MLPPolicy(3, 2)
    acting = appo.APPOActing(net, 2, T=2, obs_shape=(3,), gamma=0.5, precision="fp32",
                             generator=torch.Generator().manual_seed(0), discount=0.9)
    obs, final = np.full((2, 3), 0.5, np.float32), np.full((1, 3), 2.0, np.float32)
    first = np.array([False, True])
    assert acting.transitions(obs, acting.act(obs), np.ones(2, np.float32), first, obs, cut=(np.array([1]), final)) is None
    items = acting.transitions(obs, acting.act(obs), np.ones(2, np.float32), first * 0, obs, cut=None)
    assert items["obs"].dtype == np.float32 and items["bootstrap"].shape == (2, 2)
    with torch.no_grad():
        v = net(torch.from_numpy(final))[1].item()
    np.testing.assert_allclose(items["bootstrap"], [[0.0, 0.0], [0.9 * v, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(items["disc_returns"][:, 1], [1.5, 1.0])  # the normalizer's returns restart as before


def settings(**kw):
    from types import SimpleNamespace
    a = SimpleNamespace(batch_segments=4, rollout_length=5, max_policy_lag=1, epochs=2, num_minibatches=2,
                        loss="ppo_clip", rho_bar=1.0, c_bar=1.0)
    t = SimpleNamespace(learning_rate=1e-3, precision="fp32", clip_range=0.2, anneal_lr=False, adam_eps=1e-5, gamma=0.99, gae_lambda=0.95, ent_coef=0.01, vf_coef=0.5,
                        max_grad_norm=0.5, norm_adv=True, normalize_reward=True)
    for k, v in kw.items():
        setattr(a if hasattr(a, k) else t, k, v)
    return a, t


def test_learning_half_updates_once_per_full_batch_and_its_state_round_trips():
    a, t = settings()
    algo = appo.APPOLearning(a, t, (8, 8, 3))
    algo.setup_learner(tiny_net(), "cpu", seed=0)
    algo.ingest(fake_segments(3, 5, [0, 0, 0]), 3)
    assert algo.updates_allowed(0, 0) == 0  # 3 of 4 segments
    algo.ingest(fake_segments(2, 5, [0, 0], seed=1), 2)
    assert algo.updates_allowed(0, 0) == 1
    before = [p.detach().clone() for p in algo.model.parameters()]
    loss = algo.update(0, 0.0)
    assert math.isfinite(loss) and algo.version == 1 and algo.last_stats["updates"] == a.epochs * a.num_minibatches
    assert any(not torch.equal(p, q) for p, q in zip(before, algo.model.parameters()))
    assert algo.updates_allowed(0, 0) == 1  # one update done; the kept segment does not fill a batch
    algo.ingest(fake_segments(4, 5, [1, 0, 0, 1], seed=2), 4)  # lags 0, 1, 1, 0 at version 1: all kept
    st = algo.state_dict()
    other = appo.APPOLearning(a, t, (8, 8, 3))
    other.setup_learner(tiny_net(), "cpu", seed=5)
    other.load_state_dict(st)
    assert other.version == 1 and other.ret_rms.count == algo.ret_rms.count
    assert other.batch.lag.accepted == algo.batch.lag.accepted and torch.equal(other.generator.get_state(),
                                                                                algo.generator.get_state())


def test_a_slow_learner_drops_stale_segments_and_counts_them():
    a, t = settings(max_policy_lag=2)
    algo = appo.APPOLearning(a, t, (8, 8, 3))
    algo.setup_learner(tiny_net(), "cpu", seed=0)
    algo.version = 5  # five updates made while these actors still ran version 1 or 2
    algo.ingest(fake_segments(4, 5, [1, 2, 3, 5]), 4)  # lags 4, 3 (dropped), 2, 0
    assert algo.batch.lag.dropped == 2 and algo.batch.filled == 2
    assert algo.batch.lag.hist[:5].tolist() == [1, 0, 1, 1, 1]


def test_kept_segments_are_not_admitted_twice_and_expire_with_the_learner():
    batch = appo.SegmentBatch(size=1, T=2, obs_shape=(8, 8, 3), max_lag=1)
    batch.ingest(fake_segments(3, 2, [10, 10, 10]), 3, version=10)  # 1 in the batch, 1 kept, 1 over the cap
    assert batch.lag.accepted == 2 and batch.lag.dropped == 1 and len(batch.overflow) == 1
    batch.take("cpu", version=10)  # the next batch trains at 11: lag 1, still fine
    assert batch.filled == 1 and batch.lag.accepted == 2 and batch.lag.hist[0] == 3
    batch.ingest(fake_segments(1, 2, [11], seed=3), 1, version=11)  # kept behind the full batch
    batch.take("cpu", version=11)
    assert batch.filled == 1  # the version-11 one moved in
    batch.ingest(fake_segments(1, 2, [11], seed=4), 1, version=11)
    batch.take("cpu", version=12)  # at 13 a version-11 segment would be 2 behind: dropped
    assert batch.filled == 0 and batch.lag.dropped == 2


def test_actor_shares_are_whole_segments_that_add_up_to_the_budget():
    """3 actors x 5 envs, T = 4: 7 rounds of 20 steps go 3, 2, 2; a budget that is no multiple of
    the 20 steps of a round loses only its remainder."""
    from mpippo import config as C
    cfg = C.build({}, [("training", "algo", "appo"), ("env", "name", "toy-cue"), ("appo", "rollout_length", 4),
                       ("appo", "batch_segments", 4), ("appo", "num_minibatches", 1), ("model", "channels", [4]),
                       ("model", "hidden_size", 8)], 4)
    algo = appo.APPO(cfg, (8, 8, 3), 4)
    shares = [algo.actor_steps(7 * 20, 3, i, 5) for i in range(3)]
    assert shares == [12, 8, 8] and sum(shares) * 5 == 7 * 20
    assert sum(algo.actor_steps(7 * 20 + 19, 3, i, 5) for i in range(3)) * 5 == 7 * 20


def test_non_finite_steps_are_skipped_counted_across_batches_and_end_the_learner():
    """As sync PPO and the DQN learner: a minibatch step whose loss or gradient is not finite is
    skipped (the weights stay), the streak goes on over epochs and batches, and guards.max_nonfinite_skips
    in a row raise NonFiniteError naming the learning rate."""
    from mpippo.errors import NonFiniteError
    a, t = settings(normalize_reward=False)  # 2 epochs x 2 minibatches: 4 steps per update
    algo = appo.APPOLearning(a, t, (8, 8, 3), max_nonfinite=6)
    algo.setup_learner(tiny_net(), "cpu", seed=0)
    before = [p.detach().clone() for p in algo.model.parameters()]
    bad = fake_segments(4, 5, [0] * 4)
    bad["rewards"][:] = np.inf
    algo.ingest(bad, 4)
    algo.update(0, 0.0)
    assert algo.skipped == algo.nonfinite_streak == 4 and algo.last_stats["updates"] == 0 and algo.version == 1
    assert all(torch.equal(p, q) for p, q in zip(before, algo.model.parameters()))
    bad["version"][:] = 1
    algo.ingest(bad, 4)
    with pytest.raises(NonFiniteError, match=r"the APPO loss .* not finite in 6 consecutive minibatch steps.*"
                                             r"lower training.learning_rate \(now 0.001\)"):
        algo.update(1, 0.0)
    assert algo.skipped == 6


def test_a_finite_batch_resets_the_streak():
    a, t = settings(normalize_reward=False)
    algo = appo.APPOLearning(a, t, (8, 8, 3), max_nonfinite=5)
    algo.setup_learner(tiny_net(), "cpu", seed=0)
    bad = fake_segments(4, 5, [0] * 4)
    bad["rewards"][:] = np.nan
    algo.ingest(bad, 4)
    algo.update(0, 0.0)
    assert algo.nonfinite_streak == 4
    algo.ingest(fake_segments(4, 5, [1] * 4, seed=1), 4)
    algo.update(1, 0.0)
    assert algo.nonfinite_streak == 0 and algo.skipped == 4 and algo.last_stats["updates"] == 4


def test_an_actor_with_diverged_weights_acts_uniformly_instead_of_crashing():
    """Weights whose logits overflow (a diverging learner: it ends the run) made torch.multinomial
    raise on the actor, an MPI abort; those envs now act uniformly and record that log-prob."""
    net = tiny_net()
    with torch.no_grad():
        net.policy.bias[0] = float("inf")
        net.policy.bias[1] = float("nan")
    acting = appo.APPOActing(net, 3, T=4, obs_shape=(8, 8, 3), gamma=0.9, precision="fp32",
                             generator=torch.Generator().manual_seed(0))
    actions = acting.act(np.zeros((3, 8, 8, 3), np.uint8))
    assert ((actions >= 0) & (actions < 4)).all()
    assert np.allclose(acting.logp, np.log(0.25))


def test_two_sets_of_batch_arrays_in_turn_keep_every_batch_and_the_overflow():
    """A GPU learner's batch (pin(): two sets used in turn, pinned there; plain arrays here)."""
    plain, turns = appo.SegmentBatch(size=2, T=3, obs_shape=(8, 8, 3), max_lag=5), \
        appo.SegmentBatch(size=2, T=3, obs_shape=(8, 8, 3), max_lag=5)
    turns.ingest(fake_segments(1, 3, [0], seed=9), 1, version=0)
    turns.pin(pinned=False)  # what was in the batch moves along
    plain.ingest(fake_segments(1, 3, [0], seed=9), 1, version=0)
    for k in range(4):
        segs = fake_segments(3, 3, [k] * 3, seed=k)
        for b in (plain, turns):
            b.ingest(segs, 3, version=k)
        a, b = plain.take("cpu", version=k), turns.take("cpu", version=k)
        assert all(torch.equal(a[name], b[name]) for name in a) and turns.filled == plain.filled
        assert turns.arrays is turns.sets[(k + 1) % 2]


def test_the_learner_reads_the_device_once_per_update(monkeypatch):
    """Everything of an update stays on the device until its one read (the stats and the guard together)."""
    a, t = settings(normalize_reward=True)
    algo = appo.APPOLearning(a, t, (8, 8, 3))
    algo.setup_learner(tiny_net(), "cpu", seed=0)
    algo.ingest(fake_segments(4, 5, [0] * 4), 4)
    reads = []
    for name in ("tolist", "item", "__float__", "__bool__", "numpy", "cpu", "__int__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *x, _o=original, _n=name, **k: (reads.append(_n), _o(self, *x, **k))[1])
    algo.update(0, 0.0)
    assert reads == ["tolist"], reads


# ---- on a GPU (skipped without CUDA): what the CPU tests cannot see ----
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_learner_matches_the_cpu_learner_and_waits_for_the_device_once_per_update():
    """The same batches on a CPU and a GPU learner (pinned double buffer there): the same weights (fp32,
    no TF32) and statistics; on the GPU at most two waits per update (the one read, and the pinned set's
    event, long done)."""
    import warnings
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        learners = []
        for device in ("cpu", "cuda"):
            a, t = settings(normalize_reward=True)
            algo = appo.APPOLearning(a, t, (8, 8, 3))
            algo.setup_learner(tiny_net().to(device), device, seed=0)
            learners.append(algo)
        assert learners[1].batch.sets is not None  # pinned, two sets
        syncs = []
        for k in range(3):
            segs = fake_segments(5, 5, [k] * 5, seed=k)  # one more than a batch: the overflow moves in
            for algo in learners:
                algo.ingest(segs, 5)
            learners[0].update(k, 0.0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    learners[1].update(k, 0.0)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs.append(sum("synchroniz" in str(w.message) for w in caught))
        assert max(syncs) <= 2, syncs
        cpu, gpu = learners
        # a parameter whose gradients were all near 0 may take another Adam step on either device (m / sqrt(v)
        # of rounding noise): the bulk is compared
        gap = torch.cat([(p - q.cpu()).abs().reshape(-1) for p, q in zip(cpu.model.parameters(), gpu.model.parameters())])
        assert float(gap.mean()) < 1e-6 and float(gap.max()) < 1e-2, (float(gap.mean()), float(gap.max()))
        assert cpu.last_stats["updates"] == gpu.last_stats["updates"] == 4
        assert cpu.last_stats["pg_loss"] == pytest.approx(gpu.last_stats["pg_loss"], rel=1e-4, abs=1e-6)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
