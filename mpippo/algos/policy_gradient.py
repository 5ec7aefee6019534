"""The policy-gradient toolkit the sync layout's algorithms share (PPO, A2C; APPO borrows its
pieces), pure torch (no MPI): GAE, autocast, log-probabilities, the rollout's policy step (a CUDA
graph on a GPU), advantage moments, the minibatch shares of a cut-off rollout, and the update loop
over epochs and minibatches that calls an algorithm's loss.

Distributed training enters through one argument of `minibatch_update`: `grad_sync`, called
after every backward. With one process it only checks for non-finite values; under MPI
it is comm.collectives.GradAllreduce. Names follow CleanRL (b_ = batch, mb_ = minibatch).
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mpippo.algos.adam import Adam
from mpippo.errors import DIVERGED, NonFiniteError


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor,
                next_value: torch.Tensor, next_done: torch.Tensor,
                gamma: float, gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over a (T, N) rollout.

    dones[t] = 1 when obs t starts a new episode (gym3's `first`), so step t-1 ended one;
    next_value/next_done belong to the observation after the last step.
    Returns (advantages, returns), both (T, N).
    """
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        if t == T - 1:
            nextnonterminal, nextvalues = 1.0 - next_done, next_value
        else:
            nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def autocast(device: torch.device, precision: str, cache: bool = True):
    """The network's mixed-precision context: bf16 autocast, or nothing for fp32. `cache` false for
    a step captured as a CUDA graph: a cached bf16 copy of a weight would be the one of capture time."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return nullcontext()


LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_logprob(mean: torch.Tensor, logstd: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log N(actions; mean, exp(logstd)^2), summed over the action's dimensions (a diagonal Gaussian)."""
    z = (actions - mean) * torch.exp(-logstd)
    return (-0.5 * z * z - logstd - LOG_SQRT_2PI).sum(-1)


def logprob_entropy(logits: torch.Tensor, actions: torch.Tensor,
                    logstd: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of `actions` and the policy's entropy, per sample: a categorical over
    logits, or with `logstd` a diagonal Gaussian whose means are `logits` (continuous actions)."""
    if logstd is not None:
        mean, logstd = logits.float(), logstd.float()
        entropy = (0.5 + LOG_SQRT_2PI + logstd).sum(-1).expand(mean.shape[0])
        return gaussian_logprob(mean, logstd, actions), entropy
    logits = logits.float()  # the softmax and the losses in fp32 whatever the network ran in
    logp_all = F.log_softmax(logits, dim=-1)
    logprob = logp_all.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprob, entropy


@dataclass
class PPOLoss:
    loss: torch.Tensor
    pg_loss: torch.Tensor
    v_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor


class GumbelSampler:
    """Categorical actions drawn on the policy's device with no host synchronization: Gumbel-max,
    argmax(logits + G) with G ~ Gumbel(0, 1), which is an exact draw from softmax(logits).
    (torch.multinomial on a GPU waits for the device.) Its generator lives on that device and its
    state is saved with the rank's other RNG states, so a resumed run draws the same actions."""

    def __init__(self, device: torch.device, seed: int):
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def uniform_(self, out: torch.Tensor) -> torch.Tensor:
        """Uniform noise for gumbel_max over logits shaped like `out`, drawn into `out`."""
        return torch.rand(out.shape, generator=self.generator, device=out.device, out=out)

    def normal_(self, out: torch.Tensor) -> torch.Tensor:
        """Standard normal noise for a Gaussian policy's draw (continuous actions), into `out`."""
        return torch.randn(out.shape, generator=self.generator, device=out.device, out=out)

    def get_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


def gumbel_max(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """argmax(logits + G), G = -log(-log(u)) from uniform noise u: one draw from softmax(logits)."""
    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
    return torch.argmax(logits.float() + gumbel, dim=-1)


class PolicyStep:
    """One rollout step of the policy: forward, a Gumbel-max action, its log-prob and the value.

    On a GPU with `graph` the step is captured once as a CUDA graph and replayed after: one launch
    instead of the ~80 kernels Python dispatches one by one, which bound a batch-64 step (its
    arithmetic takes a fraction of a millisecond). The graph reads fixed tensors: the observation is
    copied into `obs`, the noise drawn into `noise` by the sampler outside the graph, so graphed and
    eager steps draw the same actions from the same (checkpointed) generator state. It runs the
    current weights: the optimizer updates the flat parameters in place, where the graph reads them.
    Elsewhere (the CPU, `graph` false, a capture that fails) the same arithmetic runs eagerly."""

    WARMUP = 3  # eager steps on a side stream before capture (cuBLAS/cuDNN pick and allocate there)

    def __init__(self, model: nn.Module, sampler: GumbelSampler, obs_shape, num_envs: int, num_actions: int,
                 device: torch.device, precision: str, graph: bool, warn=print, obs_dtype=torch.uint8):
        self.model, self.sampler, self.device, self.precision, self.warn = model, sampler, device, precision, warn
        self.continuous = getattr(model, "continuous", False)  # a Gaussian policy (its logits are the means)
        self.noise = torch.zeros((num_envs, num_actions), device=device)
        self.wanted = graph and device.type == "cuda"
        self.mode = "graph" if self.wanted else "eager"  # what the next step will be
        self.obs = torch.zeros((num_envs, *obs_shape), dtype=obs_dtype, device=device) if self.wanted else None
        self.graph = self.out = None

    def _step(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with autocast(self.device, self.precision, cache=self.mode == "eager"):
            logits, value = self.model(obs)
        logits = logits.float()  # the softmax in fp32 whatever the network ran in
        if self.continuous:  # mean + std * N(0, 1): the draw the env gets clipped, its log-prob unclipped
            logstd = self.model.logstd.float()
            action = logits + torch.exp(logstd) * self.noise
            return action, gaussian_logprob(logits, logstd, action), value.float()
        action = gumbel_max(logits, self.noise)
        logprob = torch.log_softmax(logits, dim=-1).gather(1, action.unsqueeze(1)).squeeze(1)
        return action, logprob, value.float()

    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action, log-prob, value) for a batch of observations on the policy's device. Graphed,
        they are the graph's own output tensors, overwritten by the next step: copy them out."""
        (self.sampler.normal_ if self.continuous else self.sampler.uniform_)(self.noise)
        if self.mode == "eager":
            return self._step(obs)
        self.obs.copy_(obs)
        if self.graph is None:
            self._capture()
            if self.mode == "eager":
                return self._step(obs)
        self.graph.replay()
        return self.out

    def _capture(self) -> None:
        """Warm up on a side stream, capture there, then replay once against the eager step on the same
        input and noise: a graph that does not reproduce it (or a capture that fails) is dropped for
        eager, with one warning. The rank's GPU is its current device (runctl.pick_device), so the
        streams and the capture are on the GPU that holds the tensors."""
        previous = None
        try:
            previous = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(previous)
            with torch.cuda.stream(side):
                for _ in range(self.WARMUP):
                    self._step(self.obs)
            previous.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                out = self._step(self.obs)
            graph.replay()
            want = self._step(self.obs)
            same = torch.equal(out[0], want[0]) and all(torch.allclose(a, b, rtol=1e-3, atol=1e-3)
                                                        for a, b in zip(out[1:], want[1:]))
            if not same:
                return self._eager("the captured step did not reproduce the eager one")
            self.graph, self.out = graph, out
        except RuntimeError as e:  # a kernel that cannot be captured here (CUDA errors are RuntimeErrors)
            cause = e.__context__ if isinstance(e.__context__, RuntimeError) else e
            try:  # a failed capture can leave its stream current: give the step its own back
                if previous is not None:
                    torch.cuda.set_stream(previous)
                    torch.cuda.synchronize(self.device)
            except RuntimeError:
                pass
            self._eager(str(cause).splitlines()[0][:200] if str(cause) else type(cause).__name__)

    def _eager(self, why: str) -> None:
        self.mode, self.graph, self.out = "eager", None, None
        self.warn(f"mpippo: warning: the policy step could not be captured as a CUDA graph ({why}); it runs eagerly")


def local_grad_check(params):
    """grad_sync for a single process: no averaging, only the non-finite check (with approx_kl,
    one read from the device)."""
    params = list(params)

    def sync(approx_kl, weight: float | None = None) -> tuple[float, int]:  # one rank: its share is all
        finite = torch.stack([torch.isfinite(p.grad).all() for p in params]).all()
        kl = torch.as_tensor(approx_kl, dtype=torch.float32, device=finite.device)
        kl, bad = torch.stack([kl.reshape(()), (~finite).float()]).tolist()
        return kl, int(bad)
    return sync


def local_mean_std(x: torch.Tensor) -> tuple[float, float]:
    """Mean and population std (as ppo2's numpy), in float64."""
    x = x.detach().double()
    return float(x.mean()), (float(x.std(unbiased=False)) if x.numel() > 1 else 0.0)


def device_mean_std(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """local_mean_std's numbers as 0-d float64 tensors on x's device: nothing waits for a GPU."""
    x = x.detach().double()
    return x.mean(), (x.std(unbiased=False) if x.numel() > 1 else torch.zeros((), dtype=x.dtype, device=x.device))


def minibatch_shares(batch_sizes, rank: int, num_minibatches: int) -> list[float]:
    """Rank `rank`'s share of each global minibatch when the ranks hold `batch_sizes` samples (the
    balanced cut-off: a slow rank collected fewer): each rank splits its samples into
    num_minibatches near-equal parts (torch.tensor_split's sizes), minibatch k is the union of every
    rank's part k, and a rank's gradient (of its part's mean loss) counts by its part's size."""
    def parts(b: int) -> list[int]:
        return [b // num_minibatches + (1 if k < b % num_minibatches else 0) for k in range(num_minibatches)]
    sizes = [parts(int(b)) for b in batch_sizes]
    return [sizes[rank][k] / sum(s[k] for s in sizes) for k in range(num_minibatches)]


def minibatch_update(model: nn.Module, optimizer: Adam, batch: dict, cfg,
                     grad_sync, generator: torch.Generator | None = None, timer=None,
                     nonfinite_streak: int = 0, max_nonfinite_streak: int = 3, adv_moments=local_mean_std, *,
                     loss_fn, shares: list[float] | None = None) -> dict:
    """n_epochs x num_minibatches steps of `loss_fn` on this rank's share of the batch.

    batch: b_obs (B, H, W, C) uint8, b_actions, b_logprobs, b_advantages, b_returns,
    b_values -- all (B,). Every rank must have the same B. With cfg.norm_adv and
    cfg.adv_norm == "minibatch" each minibatch's advantages are normalized here by
    adv_moments(local share) -> (mean, std) of the global minibatch (under MPI: every rank's
    share, one small Allreduce); otherwise b_advantages arrive as they are to be used.
    Returns mean statistics over the steps taken. loss_fn: PPO's ppo_loss, A2C's a2c_loss (one signature).
    shares: with ranks of unequal B (the balanced cut-off), this rank's weight in each minibatch's
    gradient average (minibatch_shares); None: equal B everywhere, the plain mean.
    """
    phase = timer if timer is not None else (lambda name: nullcontext())
    per_minibatch = cfg.norm_adv and cfg.adv_norm == "minibatch"
    B = batch["b_actions"].shape[0]
    # the losses' sums stay on the device and are read once at the end: a GPU never waits for the
    # host within the update except where a verdict is needed (grad_sync: skip, early stop)
    sums = torch.zeros(len(SUMMED), dtype=torch.float64, device=batch["b_actions"].device)
    kl_sum, steps, skipped = 0.0, 0, 0
    for epoch in range(cfg.n_epochs):
        # drawn on the CPU generator whatever the device: the same minibatch order on CPU and GPU ranks
        perm = torch.randperm(B, generator=generator).to(batch["b_actions"].device)
        global_kl = 0.0
        # equal parts when B divides (config checks that it does); near-equal ones under the cut-off
        for k, mb in enumerate(torch.tensor_split(perm, cfg.num_minibatches)):
            mb_advantages = batch["b_advantages"][mb]
            if per_minibatch:
                with phase("allreduce"):
                    mean, std = adv_moments(mb_advantages)
                mb_advantages = (mb_advantages - mean) / (std + 1e-8)
            with phase("backward"):
                with autocast(batch["b_actions"].device, getattr(cfg, "precision", "fp32")):
                    logits, newvalue = model(batch["b_obs"][mb])
                newvalue = newvalue.float()
                newlogprob, entropy = logprob_entropy(logits, batch["b_actions"][mb], getattr(model, "logstd", None))
                out = loss_fn(newlogprob, entropy, newvalue, batch["b_logprobs"][mb],
                               mb_advantages, batch["b_returns"][mb], batch["b_values"][mb],
                               cfg.clip_range, cfg.clip_vloss, cfg.ent_coef, cfg.vf_coef)
                optimizer.zero_grad(set_to_none=False)  # keep .grad as views of the flat buffer
                out.loss.backward()
            with phase("allreduce"):
                global_kl, n_nonfinite = grad_sync(out.approx_kl.detach(), None if shares is None else shares[k])
            if n_nonfinite:
                # every rank sees the same count, so every rank skips this same step
                skipped += 1
                nonfinite_streak += 1
                if nonfinite_streak >= max_nonfinite_streak:
                    raise NonFiniteError(f"non-finite loss or gradients on {n_nonfinite} rank(s) in "
                                         f"{nonfinite_streak} consecutive steps, each skipped; {DIVERGED}")
                continue
            nonfinite_streak = 0
            with phase("optimizer"):
                nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
            steps += 1
            sums += torch.stack([getattr(out, k).detach().double() for k in SUMMED])
            kl_sum += global_kl
        if cfg.target_kl is not None and global_kl > cfg.target_kl:
            break  # global_kl is identical on all ranks, so all stop together
    stats = dict(zip(SUMMED, (sums / max(steps, 1)).tolist()))
    stats.update(approx_kl=kl_sum / max(steps, 1), updates=steps, skipped=skipped, epochs_done=epoch + 1,
                 nonfinite_streak=nonfinite_streak)
    return stats


SUMMED = ("pg_loss", "v_loss", "entropy", "clipfrac")  # minibatch_update's statistics kept on the device
