"""Asynchronous PPO's learner-side pieces (APPO, as in Sample Factory; IMPALA with `vtrace_pg`):
the off-policy targets of a batch of segments, the loss, and the policy-lag accounting.

A segment is T steps of one actor's envs under the weights of version `v_behaviour`; by the time the
learner trains on it, its own version is higher. V-trace corrects the value targets and advantages
for that lag (mpippo/algos/vtrace.py); segments older than `max_policy_lag` are dropped and counted.

An update reads the device once: the batch of segments goes to the learner's device in one copy
(from pinned buffers on a GPU), the targets, the advantages' normalization, the skip of a step whose
gradient is not finite (learner_parts.DeviceAdam, learner_parts.NonFiniteGuard) and the statistics stay there, and
the statistics and the guard's counters come back together at the end.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from mpippo import ckpt_schema as schema
from mpippo import models
from mpippo.algos.adam import Adam
from mpippo.algos.buffers import RunningMeanStd
from mpippo.algos.learner_parts import DeviceAdam, NonFiniteGuard, flat_parameters, nonfinite_message
from mpippo.algos.policy_gradient import PPOLoss, autocast, device_mean_std, logprob_entropy
from mpippo.algos.ppo import ppo_loss
from mpippo.algos.vtrace import vtrace
from mpippo.envs import obs_dtype
from mpippo.errors import DIVERGED, NonFiniteError
from mpippo.metrics import tags


def discounts(firsts: torch.Tensor, gamma: float) -> torch.Tensor:
    """(T+1, N) episode-start flags -> (T, N) discounts of the steps t -> t+1 (0 where an episode ended)."""
    return gamma * (1.0 - firsts[1:].to(torch.float32))


def targets(behaviour_logp, target_logp, rewards, values, firsts, gamma: float, rho_bar: float, c_bar: float,
            lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace value targets and advantages of a batch of segments. values: (T+1, N) from the learner's
    current network (the last row bootstraps); the rest (T, N)."""
    return vtrace(behaviour_logp, target_logp, rewards, values[:-1], values[-1], discounts(firsts, gamma),
                  rho_bar=rho_bar, c_bar=c_bar, lam=lam)


def vtrace_pg_loss(new_logp, entropy, new_values, behaviour_logp, advantages, vs, old_values,
                   clip_range: float, clip_vloss: bool, ent_coef: float, vf_coef: float) -> PPOLoss:
    """IMPALA's policy gradient (the advantages already carry the clipped rho), in ppo_loss's signature."""
    pg_loss = -(advantages.detach() * new_logp).mean()
    v_loss = 0.5 * ((new_values - vs) ** 2).mean()
    ent = entropy.mean()
    with torch.no_grad():
        logratio = new_logp - behaviour_logp
        approx_kl = ((logratio.exp() - 1) - logratio).mean()
    zero = torch.zeros((), device=new_logp.device)
    return PPOLoss(pg_loss - ent_coef * ent + vf_coef * v_loss, pg_loss, v_loss, ent, approx_kl, zero)


# `ppo_clip`: PPO's clipped surrogate with the ratio to the behaviour policy and V-trace advantages (APPO)
LOSSES = {"ppo_clip": ppo_loss, "vtrace_pg": vtrace_pg_loss}


@dataclass
class PolicyLag:
    """Lag = learner version - behaviour version, per segment: kept as a histogram (for TensorBoard
    and benchmark_metrics.json); segments beyond `max_lag` are dropped and counted."""
    max_lag: int
    bins: int = 16
    hist: np.ndarray = field(default=None)
    dropped: int = 0
    accepted: int = 0

    def __post_init__(self):
        self.hist = np.zeros(self.bins + 1, dtype=np.int64)  # the last bin: lag >= bins

    def admit(self, learner_version: int, behaviour_version: int) -> bool:
        lag = learner_version - behaviour_version
        if lag < 0:
            raise ValueError(f"a segment from version {behaviour_version} is newer than the learner's {learner_version}")
        self.hist[min(lag, self.bins)] += 1
        if lag > self.max_lag:
            self.dropped += 1
            return False
        self.accepted += 1
        return True

    def mean(self) -> float:
        """Over every segment received, admitted or dropped; a lag of `bins` or more counts as `bins` (the
        histogram's last bin, which the checkpoint keeps: its size is the format's)."""
        n = self.hist.sum()
        return float((self.hist * np.arange(self.bins + 1)).sum() / n) if n else 0.0


def segment_targets(model, seg: dict, a, gamma: float, lam: float) -> dict:
    """Flat (B*T,) training tensors of a batch of B segments of T steps under the current network:
    V-trace targets and advantages (recomputed each epoch, as the network moves), its values.
    `lam` weights the traces as GAE's lambda does (the synchronous PPO's training.gae_lambda; 1: IMPALA's)."""
    obs, actions = seg["obs"], seg["actions"]
    B, T = actions.shape
    with torch.no_grad():
        logits, values = model(obs.reshape(B * (T + 1), *obs.shape[2:]))
        logits = logits.reshape(B, T + 1, -1)[:, :T].reshape(B * T, -1)
        target_logp = logprob_entropy(logits, actions.reshape(-1))[0].reshape(B, T)
        values = values.float().reshape(B, T + 1)
        vs, adv = targets(seg["logp"].T, target_logp.T, seg["rewards"].T, values.T, seg["firsts"].T, gamma,
                          rho_bar=a.rho_bar, c_bar=a.c_bar, lam=lam)
    flat = lambda x: x.reshape(B * T, *x.shape[2:])  # noqa: E731  (B, T, ...) -> (B*T, ...)
    return {"obs": flat(obs[:, :T]), "actions": flat(actions), "logp": flat(seg["logp"]), "vs": flat(vs.T),
            "adv": flat(adv.T), "values": flat(values[:, :T])}


STATS = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")  # an update's means over its steps taken


def appo_update(model, optimizer, seg: dict, a, t, generator: torch.Generator | None = None,
                nonfinite_streak: int = 0, max_nonfinite_streak: int = 3, adam=None) -> dict:
    """`a.epochs` passes over a batch of segments: V-trace targets from the current network at each
    epoch, then one epoch of PPO steps (minibatch_steps: minibatches, per-minibatch advantage
    normalization, autocast, non-finite skipping, clipping) with the `a.loss` objective. The
    minibatch size is (segments x T) / a.num_minibatches, which must divide (as sync PPO's).
    `nonfinite_streak`: steps skipped in a row before this batch (the count goes on over epochs and
    batches; NonFiniteError once it reaches max_nonfinite_streak, and no step is taken after that);
    the stats carry it on. `adam`: the learner's learner_parts.DeviceAdam over the model and `optimizer` (made
    here for this call when not given: the model's parameters become views of one flat buffer).
    The device is read once, at the end."""
    if a.loss not in LOSSES:
        raise ValueError(f"appo loss '{a.loss}' is not one of {', '.join(LOSSES)}")
    own = adam is None
    if own:
        flat_parameters(model)
        adam = DeviceAdam(model.parameters(), optimizer)
    device = seg["actions"].device
    guard = NonFiniteGuard(max_nonfinite_streak, device, streak=nonfinite_streak)
    sums = torch.zeros(len(STATS) + 1, dtype=torch.float64, device=device)
    for _ in range(a.epochs):
        b = segment_targets(model, seg, a, t.gamma, t.gae_lambda)
        sums += minibatch_steps(model, adam, guard, b, a, t, generator)
    *values, steps, streak, skipped, tripped = torch.cat([sums, guard.counts.double()]).tolist()  # the one read
    if own:
        adam.sync()
    if tripped:
        raise NonFiniteError(f"non-finite loss or gradients in {int(streak)} consecutive steps, each skipped; "
                             f"{DIVERGED}")
    return {k: v / max(steps, 1) for k, v in zip(STATS, values)} | {
        "updates": int(steps), "skipped": int(skipped), "nonfinite_streak": int(streak)}


def minibatch_steps(model, adam, guard, b: dict, a, t, generator: torch.Generator | None) -> torch.Tensor:
    """One epoch of PPO steps over the flat batch `b` (segment_targets'), as ppo_update's with
    n_epochs 1 and nothing read by the host: minibatches in the order of `generator` (a CPU generator:
    the same order on any device), each one's advantages normalized by their own mean and std, the
    `a.loss` objective, then the step, taken only where the gradient is finite and the guard allows
    (decided on the device), with the gradient clipped to t.max_grad_norm. Returns, on the device, the
    sums over the steps taken of STATS, then their number."""
    n = b["actions"].shape[0]
    mb_size, device = n // a.num_minibatches, b["actions"].device
    sums = torch.zeros(len(STATS) + 1, dtype=torch.float64, device=device)
    one = torch.ones(1, dtype=torch.float64, device=device)
    perm = torch.randperm(n, generator=generator).to(device, non_blocking=True)
    for start in range(0, n, mb_size):
        mb = perm[start:start + mb_size]
        adv = b["adv"][mb]
        if t.norm_adv:
            mean, std = device_mean_std(adv)
            adv = (adv - mean) / (std + 1e-8)
        with autocast(device, t.precision):
            logits, value = model(b["obs"][mb])
        logp, entropy = logprob_entropy(logits, b["actions"][mb])
        out = LOSSES[a.loss](logp, entropy, value.float(), b["logp"][mb], adv, b["vs"][mb], b["values"][mb],
                             t.clip_range, True, t.ent_coef, t.vf_coef)
        adam.zero_grad()
        out.loss.backward()
        ok = guard.admit(adam.grads_finite())
        adam.clip_(t.max_grad_norm)
        adam.step(ok)
        stats = torch.stack([getattr(out, k).detach().double().reshape(()) for k in STATS])
        sums += torch.where(ok, torch.cat([stats, one]), 0.0)
    return sums


def segment_fields(obs_shape, T: int) -> list[tuple[str, type, tuple]]:
    """What one segment (one env, T steps) carries in a chunk: (name, dtype, shape of one item).
    Observations as envs.obs_dtype (uint8 images, float32 vectors). `disc_returns` are the actor's
    running discounted returns (the learner's reward statistics); `bootstrap` is gamma * V(final
    observation) at a step whose episode a time limit cut (else 0), the learner adds it to the scaled
    reward (as the synchronous PPO does); `version` the weights version the segment started under."""
    obs_shape, dtype = tuple(obs_shape), np.dtype(obs_dtype(obs_shape))
    return [("obs", dtype, (T + 1, *obs_shape)), ("actions", np.int64, (T,)), ("logp", np.float32, (T,)),
            ("rewards", np.float32, (T,)), ("disc_returns", np.float32, (T,)), ("bootstrap", np.float32, (T,)),
            ("firsts", np.uint8, (T + 1,)), ("version", np.int64, ())]


class SegmentBatch:
    """`size` segments gathered for one update, admitted by policy lag; the learner's version is
    the number of updates it has made (what it stamps on the weights it sends)."""

    def __init__(self, size: int, T: int, obs_shape, max_lag: int):
        self.size, self.T = size, T
        self.arrays = {name: np.zeros((size, *shape), dtype) for name, dtype, shape in segment_fields(obs_shape, T)}
        self.filled = 0
        self.lag = PolicyLag(max_lag)
        self.overflow: list[dict] = []  # admitted segments beyond a full batch, kept for the next

    def ingest(self, views: dict, count: int, version: int) -> None:
        for i in range(count):
            if not self.lag.admit(version, int(views["version"][i])):
                continue
            row = {name: views[name][i] for name in self.arrays}
            if self.filled < self.size:
                self._put(row)
            else:  # kept for the next batch, at most one batch of them (the oldest go first)
                self.overflow.append({k: np.array(v) for k, v in row.items()})
                if len(self.overflow) > self.size:
                    self.overflow.pop(0)
                    self._recount_as_dropped()

    def _put(self, row: dict) -> None:
        for name, value in row.items():
            self.arrays[name][self.filled] = value
        self.filled += 1

    def _recount_as_dropped(self) -> None:
        self.lag.accepted -= 1
        self.lag.dropped += 1

    def ready(self) -> bool:
        return self.filled == self.size

    def pin(self, pinned: bool = True) -> None:
        """For a GPU learner: the batch's arrays in two sets used in turn (pinned host memory: take() copies
        to the GPU without waiting, and the set just sent is not written until the other one was)."""
        def new_set():
            if not pinned:
                return {k: np.zeros_like(v) for k, v in self.arrays.items()}
            return {k: torch.zeros(v.shape, dtype=torch.from_numpy(v[:0]).dtype, pin_memory=True).numpy()
                    for k, v in self.arrays.items()}
        first = new_set()
        for k, v in self.arrays.items():
            first[k][:] = v
        self.sets, self.sent = [first, new_set()], [None, None]
        self.arrays = first

    def take(self, device, version: int) -> dict:
        """The full batch as tensors on `device` (copied); then the kept overflow moves in, except what will be
        too old for the next batch, trained at `version` + 1 (counted as dropped, not admitted twice)."""
        device = torch.device(device)
        if device.type == "cpu":
            out = {k: torch.from_numpy(v.copy()) for k, v in self.arrays.items()}
        else:  # pinned (pin()): the copy runs on its own; pageable: staged by the driver before this returns
            out = {k: torch.from_numpy(v).to(device, non_blocking=True) for k, v in self.arrays.items()}
        if getattr(self, "sets", None):  # the next batch goes into the other set
            i = 0 if self.arrays is self.sets[0] else 1
            if device.type == "cuda":
                self.sent[i] = torch.cuda.Event()
                self.sent[i].record()
            if self.sent[1 - i] is not None:
                self.sent[1 - i].synchronize()  # (long done: it was the batch before)
            self.arrays = self.sets[1 - i]
        self.filled = 0
        pending, self.overflow = self.overflow, []
        for row in pending:
            if version + 1 - int(row["version"]) > self.lag.max_lag:
                self._recount_as_dropped()
            elif self.filled < self.size:
                self._put(row)
            else:
                self.overflow.append(row)
        return out


def normalize_rewards(seg: dict, rms, returns: np.ndarray | None = None) -> torch.Tensor:
    """Rewards divided by the running std of discounted returns, updated step by step with the
    moments over the batch's segments at that step (as the synchronous PPO does over its envs).
    `returns`: the batch's disc_returns (B, T) on the host, when at hand (then nothing is read from the device)."""
    ret = seg["disc_returns"].double().cpu().numpy() if returns is None else np.asarray(returns, np.float64)
    moments = [(ret.shape[0], float(ret[:, t].mean()), float(ret[:, t].var())) for t in range(ret.shape[1])]
    scales = torch.tensor(rms.scales_per_step(moments), dtype=seg["rewards"].dtype)
    return seg["rewards"] / scales.to(seg["rewards"].device, non_blocking=True)[None, :]


class APPOActing:
    """One actor's half: sample from the policy on the CPU, and cut each env's stream into segments
    of T steps (the last observation of one is the first of the next, so none is lost). The
    discounted-return tracker is the synchronous PPO's (the learner's reward statistics)."""

    eps = None  # (Ape-X actors report their epsilon; sampling from the policy has none)

    def __init__(self, net: torch.nn.Module, num_envs: int, T: int, obs_shape, gamma: float, precision: str,
                 generator: torch.Generator, discount: float | None = None):
        self.net, self.num_envs, self.T, self.gamma = net, num_envs, T, gamma
        self.discount = gamma if discount is None else discount  # training.gamma (gamma: the normalizer's)
        self.precision, self.generator, self.version = precision, generator, -1
        self.seg = {name: np.zeros((num_envs, *shape), dtype) for name, dtype, shape in segment_fields(obs_shape, T)}
        self.t, self.ret_tracker = 0, np.zeros(num_envs)
        self.first = np.ones(num_envs, dtype=np.uint8)  # the envs start an episode
        self.logp = np.zeros(num_envs, np.float32)

    def set_version(self, version: int) -> None:
        """The weights version now in use (the actor calls this when new weights arrive)."""
        self.version = version

    def can_stop(self) -> bool:
        """Only between segments, so every env step counted was also sent (a stop waits < T steps)."""
        return self.t == 0

    @torch.inference_mode()
    def act(self, obs: np.ndarray, mask=None) -> np.ndarray:
        with autocast(torch.device("cpu"), self.precision):
            logits, _ = self.net(torch.from_numpy(obs))
        logp_all = torch.log_softmax(logits.float(), dim=-1)  # once: sampling and the behaviour log-prob
        probs = logp_all.exp()
        broken = ~(torch.isfinite(probs).all(1) & (probs.sum(1) > 0))
        if broken.any():  # weights of a diverging learner (it ends the run): those envs act uniformly, and say so
            logp_all[broken] = -math.log(logp_all.shape[1])
            probs = logp_all.exp()
        actions = torch.multinomial(probs, 1, generator=self.generator)
        self.logp = logp_all.gather(1, actions).squeeze(1).numpy()
        return actions.squeeze(1).numpy()

    @torch.inference_mode()
    def value(self, obs: np.ndarray) -> np.ndarray:
        with autocast(torch.device("cpu"), self.precision):
            _, v = self.net(torch.from_numpy(obs))
        return v.float().numpy()

    def transitions(self, obs, actions, rew, first, next_obs, next_mask=None, cut=None) -> dict | None:
        """Record one step; every T steps, the envs' segments as chunk items (else None). `cut`: the
        episodes a time limit ended at this step (env.truncated()), bootstrapped from their final obs."""
        s, t = self.seg, self.t
        if t == 0:
            s["version"][:] = self.version
        s["bootstrap"][:, t] = 0.0
        if cut is not None and len(cut[0]):
            s["bootstrap"][cut[0], t] = self.discount * self.value(cut[1])
        s["obs"][:, t], s["firsts"][:, t] = obs, self.first
        s["actions"][:, t], s["logp"][:, t], s["rewards"][:, t] = actions, self.logp, rew
        self.ret_tracker = self.ret_tracker * self.gamma + rew
        s["disc_returns"][:, t] = self.ret_tracker
        self.ret_tracker[first] = 0.0
        self.first = first.astype(np.uint8)
        self.t += 1
        if self.t < self.T:
            return None
        s["obs"][:, self.T], s["firsts"][:, self.T] = next_obs, self.first
        self.t = 0
        return {name: arr.copy() for name, arr in s.items()}


class APPOLearning:
    """The learner's half, in the shape the layout's Learner drives (as Ape-X's): `ingest` chunks of
    segments, `updates_allowed` (one per full batch), `update` (reward scaling, then `appo_update`),
    and the checkpoint part. `a`: the APPO settings (batch_segments, rollout_length, max_policy_lag,
    epochs, num_minibatches, loss, rho_bar, c_bar); `t`: the training section."""

    def __init__(self, a, t, obs_shape, max_nonfinite: int = 3):
        self.a, self.t = a, t
        self.batch = SegmentBatch(a.batch_segments, a.rollout_length, obs_shape, a.max_policy_lag)
        self.ret_rms = RunningMeanStd()
        self.version, self.last_stats = 0, {}
        self.max_nonfinite = max_nonfinite  # guards.max_nonfinite_skips: skipped steps in a row that end the agent
        self.skipped = self.nonfinite_streak = 0

    def setup_learner(self, model: torch.nn.Module, device, seed: int) -> None:
        self.model, self.device = model, torch.device(device)
        flat_parameters(model)  # (the runner's model already is one flat buffer)
        # the state's holder: DeviceAdam takes the steps (its own kernels), not this one
        self.opt = Adam(model.parameters(), lr=self.t.learning_rate, eps=self.t.adam_eps, fused=False)
        self.adam = DeviceAdam(model.parameters(), self.opt)
        self.generator = torch.Generator().manual_seed(seed)  # the minibatches' order: on the host, any device
        if self.device.type == "cuda":
            self.batch.pin()

    def ingest(self, views: dict, count: int) -> None:
        self.batch.ingest(views, count, self.version)

    def updates_allowed(self, transitions: int, episodes: int) -> float:
        """Updates the data pays for: the ones done, plus one when a batch is full."""
        return self.version + (1 if self.batch.ready() else 0)

    def update(self, updates_done: int, progress: float) -> float:
        if self.t.anneal_lr:  # linearly to 0 over the run's budget, as the synchronous PPO
            for group in self.opt.param_groups:
                group["lr"] = self.t.learning_rate * max(1.0 - progress, 0.0)
        returns = self.batch.arrays["disc_returns"].copy() if self.t.normalize_reward else None  # (host: take refills)
        seg = self.batch.take(self.device, self.version)
        if self.t.normalize_reward:
            seg["rewards"] = normalize_rewards(seg, self.ret_rms, returns)
        seg["rewards"] = seg["rewards"].float() + seg["bootstrap"]  # (episodes a time limit cut: after scaling)
        try:  # steps with a non-finite loss or gradient are skipped; too many in a row end the agent
            self.last_stats = appo_update(self.model, self.opt, seg, self.a, self.t, self.generator,
                                          self.nonfinite_streak, self.max_nonfinite, adam=self.adam)
        except NonFiniteError:
            self.skipped += self.max_nonfinite - self.nonfinite_streak  # this batch's, up to the guard
            self.nonfinite_streak = self.max_nonfinite
            raise NonFiniteError(nonfinite_message("the APPO loss", self.max_nonfinite, self.max_nonfinite,
                                                   self.t.learning_rate, unit="minibatch steps")) from None
        self.skipped += self.last_stats["skipped"]
        self.nonfinite_streak = self.last_stats["nonfinite_streak"]
        self.version += 1
        return self.last_stats["pg_loss"] + self.t.vf_coef * self.last_stats["v_loss"]

    def state_dict(self) -> dict:
        lag = self.batch.lag
        self.adam.sync()  # Adam's step count, kept on the device, into its state
        return {"optimizer": self.opt.state_dict(), "ret_rms": self.ret_rms.state_dict(), "version": self.version,
                "shuffle": self.generator.get_state(), "lag_hist": lag.hist.copy(), "lag_dropped": lag.dropped,
                "lag_accepted": lag.accepted}

    def load_state_dict(self, st: dict, ckpt_dir=None, updates: int = 0) -> str:
        """Restore from a checkpoint (already checked by ckpt_schema); a note for the start-up line."""
        self.opt.load_state_dict(st["optimizer"])
        self.adam.adopt()
        self.ret_rms.load_state_dict(st["ret_rms"])
        self.version = int(st["version"])
        self.generator.set_state(st["shuffle"])
        lag = self.batch.lag
        lag.hist[:], lag.dropped, lag.accepted = st["lag_hist"], int(st["lag_dropped"]), int(st["lag_accepted"])
        return ""

    def save_side_files(self, ckpt_dir, updates: int, write) -> dict:
        """Nothing beside the checkpoint (a partial batch is not kept: its env steps are few)."""
        return {}

    def prune_side_files(self, ckpt_dir, named: dict) -> None:
        """Nothing to prune."""


class APPO(APPOLearning):
    """APPO as an algorithm of the actor-learner layout (mpippo/layout), as algos.apex.ApeX is for
    DQN: the network (the synchronous PPO's), what a chunk item is (a segment), the actor's half,
    and what the learner logs and reports (the policy lag above all)."""
    name = "appo"

    def __init__(self, cfg, obs_shape, num_actions: int, num_actors: int = 1, masked: bool = False):
        super().__init__(cfg.appo, cfg.training, obs_shape, cfg.guards.max_nonfinite_skips)
        self.cfg, self.obs_shape, self.num_actions = cfg, tuple(obs_shape), num_actions
        self.steps_per_item = self.a.rollout_length  # a chunk item is one env's segment of T steps
        self.samples_per_update = self.a.batch_segments * self.a.rollout_length * self.a.epochs
        self.hist_logged = np.zeros_like(self.batch.lag.hist)
        self.log_every_updates = cfg.logging.log_interval  # the learner's TensorBoard cadence, as sync PPO's

    # ------------------------------------------------- what the layout asks of an algorithm
    def new_net(self) -> torch.nn.Module:
        return models.build("actor_critic", self.obs_shape, self.num_actions, self.cfg.model)

    def fields(self) -> list[tuple[str, type, tuple]]:
        return segment_fields(self.obs_shape, self.a.rollout_length)

    def episode_capacity(self, chunk_size: int, num_envs: int) -> int:
        """Episodes one chunk's header can carry: chunk_size segments hold at most that many x T ends."""
        return chunk_size * self.a.rollout_length

    def actor_steps(self, budget: int, num_actors: int, index: int, num_envs: int) -> int:
        """Actor `index`'s share of the remaining env-step budget, in whole segments (so every step
        taken is sent and counted once), spread so that the shares add up to the budget: exact
        whenever the budget is a multiple of num_envs x rollout_length (resumes included, since
        actors stop between segments)."""
        T = self.a.rollout_length
        rounds = budget // (num_envs * T)
        return (rounds // num_actors + (1 if index < rounds % num_actors else 0)) * T

    def describe(self) -> str:
        a = self.a
        return (f"batch {a.batch_segments} segments x {a.rollout_length} steps, {a.epochs} epoch(s), loss {a.loss}, "
                f"max policy lag {a.max_policy_lag}")

    def actor(self, index: int, net: torch.nn.Module, num_envs: int, rng: np.random.Generator) -> APPOActing:
        generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
        return APPOActing(net, num_envs, self.a.rollout_length, self.obs_shape, self.t.norm_gamma(), self.t.precision,
                          generator, discount=self.t.gamma)

    def learner_bytes(self) -> int:
        """One batch and at most one batch of kept segments."""
        frame = int(np.prod(self.obs_shape)) * np.dtype(obs_dtype(self.obs_shape)).itemsize
        return 2 * self.a.batch_segments * (self.a.rollout_length + 1) * frame

    def learner_bytes_key(self) -> str:
        """The settings that size learner_bytes, for a refusal."""
        return f"appo.batch_segments: {self.a.batch_segments} segments of {self.a.rollout_length} steps"

    @staticmethod
    def check_checkpoint(state: dict, cfg, net) -> None:
        """What state_dict and the learner wrote (ckpt_schema's primitives)."""
        schema.check_learner(state, net)
        schema.mapping(state, "checkpoint", ("ret_rms", "version", "shuffle", "lag_hist", "lag_dropped",
                                             "lag_accepted"))
        schema.check_ret_rms(state["ret_rms"])
        schema.need(state["version"] == state["counters"]["updates"], "version",
                    f"{schema.show(state['version'])} is not the counters' {state['counters']['updates']} updates")
        schema.torch_generator(state["shuffle"], "shuffle")
        schema.array(state["lag_hist"], "lag_hist", "i", PolicyLag(0).hist.shape)
        schema.int_(state["lag_dropped"], "lag_dropped"), schema.int_(state["lag_accepted"], "lag_accepted")

    def setup_learner(self, model: torch.nn.Module, device, seed: int, aug_seed: int | None = None) -> None:
        super().setup_learner(model, device, seed)

    # ------------------------------------------------ what the learner logs and reports
    def log(self, writer, x: int, loss: float) -> None:
        lag = self.batch.lag
        for k in STATS:  # (the registry entry's logs: policy_loss, value_loss, ...)
            if k in self.last_stats:
                writer.add_scalar(tags.loss(k), self.last_stats[k], x)
        writer.add_scalar(tags.learner("policy_lag_mean"), lag.mean(), x)
        writer.add_scalar(tags.learner("segments_dropped"), lag.dropped, x)
        counts, self.hist_logged = lag.hist - self.hist_logged, lag.hist.copy()
        if counts.sum():  # this interval's lags (the last bucket: lag >= bins)
            values = np.arange(len(counts), dtype=np.float64)
            writer.add_histogram_raw(tags.learner("policy_lag"), min=float(values[counts > 0][0]),
                                     max=float(values[counts > 0][-1]), num=int(counts.sum()),
                                     sum=float((values * counts).sum()), sum_squares=float((values ** 2 * counts).sum()),
                                     bucket_limits=(values + 0.5).tolist(), bucket_counts=counts.tolist(), global_step=x)

    def console(self) -> str:
        lag = self.batch.lag
        return f"policy lag {lag.mean():.1f}, dropped {lag.dropped:,}"

    def summary(self, updates: int, transitions: int) -> dict:
        lag = self.batch.lag
        return {"policy_lag": {"histogram": lag.hist.tolist(), "mean": lag.mean(), "max_allowed": lag.max_lag,
                               "segments_accepted": lag.accepted, "segments_dropped": lag.dropped},
                "epochs": self.a.epochs, "loss": self.a.loss, "last_update": self.last_stats,
                "nonfinite_skips": self.skipped,
                "samples_per_env_step": updates * self.samples_per_update / max(transitions, 1)}

    def closing_note(self, s: dict) -> str:
        lag = s["policy_lag"]
        return (f"policy lag {lag['mean']:.2f} updates (dropped {lag['segments_dropped']:,} of "
                f"{lag['segments_dropped'] + lag['segments_accepted']:,} segments)")
