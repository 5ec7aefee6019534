"""The sync layout's runner (SyncTrainer): synchronous data-parallel training for every algorithm
whose registry entry names this layout, PPO and A2C (the runner calls the entry's optimizer and
update, so it knows no algorithm by name): every rank steps its own envs with
its own replica of the policy; gradients are averaged with one Allreduce per minibatch, so
replicas stay identical.

One iteration on each rank:
  rollout (no communication) -> reward normalizer moments (1 small Allreduce) -> GAE ->
  advantage mean/std (1 small Allreduce) -> epochs x minibatches of
  [backward -> 1 Allreduce of the flat gradient buffer -> clip -> Adam step] ->
  stop/preempt flags (1 small Allreduce) -> every log_interval: stats Gather to rank 0.
"""
from __future__ import annotations

import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from mpippo import ckpt_schema as schema
from mpippo import models, resume
from mpippo.algos import implementations
from mpippo.algos.buffers import ObsNormalizer, RolloutBuffer, RunningMeanStd
from mpippo.algos.contracts import REPORTED_STATS
from mpippo.algos.policy_gradient import (GumbelSampler, PolicyStep, autocast, compute_gae, device_mean_std,
                                          minibatch_shares)
from mpippo.checkpoint import checkpoint_dir, save_checkpoint, write_failed
from mpippo.comm import World
from mpippo.comm.collectives import (GradAllreduce, RolloutCutoff, check_replicas, global_mean_std, global_moments,
                                     global_step_moments)
from mpippo.config import Config, UsageError, algorithm, sync_minibatches
from mpippo.rules import cutoff_min_steps
from mpippo import envs
from mpippo.envs import make_env, rank_seed, resume_seed
from mpippo.errors import CheckpointError, ReplicaDivergence
from mpippo.faults import maybe_inject, phase_timer
from mpippo.preemption import SignalFlags
from mpippo.metrics.sinks import WandbStart
from mpippo.runctl import Deadline, EpisodeWindow, bf16_native, cuda_determinism, env_threads, pick_device
from mpippo.runctl import budget_end, resolve_precision, threads_per_rank
from mpippo.runctl import stop_reason as stop_reason_now
from mpippo.metrics.reporter import FIELDS, IDX, Reporter, cpu_seconds, peak_rss_mb
from mpippo.models.flat import flat_model_, num_params

REWARD_CLIP = 10.0


class SyncTrainer:
    def __init__(self, cfg: Config, world: World, run_dir: Path, resume_state: dict | None = None):
        self.cfg, self.world, self.run_dir = cfg, world, Path(run_dir)
        self.wandb_run = None  # rank 0's W&B run (start_wandb)
        t = cfg.training
        warn = print if world.is_root else (lambda *a, **k: None)  # one warning per job, not per rank
        self.device = pick_device(t.device, world.local_rank, warn)
        cuda_determinism(self.device, t.deterministic)
        self.precision_why = self._settle_precision(warn)
        self.threads = threads_per_rank(cfg.parallel.threads_per_rank, world.cpu_share)
        torch.set_num_threads(self.threads)
        cfg.parallel.threads_per_rank = self.threads

        seed = rank_seed(t.seed, world.rank)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        self.generator = torch.Generator(device="cpu").manual_seed(seed + 1)  # minibatch shuffles

        self.num_envs = cfg.env.num_envs_per_rank
        self.env_threads = env_threads(cfg.env.num_threads, self.device, self.threads)
        cfg.env.num_threads = self.env_threads  # the metrics state what ran (config.yaml keeps it as asked)
        self.family = envs.family(cfg)
        self.env = make_env(cfg, self.num_envs, seed=seed, num_threads=self.env_threads)
        self.bootstraps = hasattr(self.env, "truncated")  # episodes a time limit cuts: bootstrapped
        self.spaces = self.family.spaces(cfg)
        obs_dtype = torch.uint8 if self.spaces.image else torch.float32
        action_dim = self.spaces.num_actions if self.spaces.continuous else 0
        self.batch_size = cfg.env.num_envs * t.n_steps  # global: all ranks

        # the algorithm (its registry entry's code: optimizer, update) and its network
        self.entry = algorithm(cfg)
        self.algo = implementations.load(cfg.training.algo)(cfg)
        self.model = self.entry.build_network(cfg, self.env.obs_shape, self.env.num_actions, self.device,
                                              self.spaces.continuous)
        self.sampler = GumbelSampler(self.device, seed + 2)  # actions, drawn on the policy's device
        self.policy_step = PolicyStep(self.model, self.sampler, self.env.obs_shape, self.num_envs,
                                      self.env.num_actions, self.device, t.precision, t.cuda_graph, warn, obs_dtype)
        self.policy_mode = None  # the job's: graph where every rank's step is one (after the first rollout)
        # on a GPU, observations and actions cross through fixed pinned host buffers
        pin = self.device.type == "cuda"
        self.obs_host = torch.zeros((self.num_envs, *self.env.obs_shape), dtype=obs_dtype, pin_memory=pin) if pin else None
        self.act_host = (torch.zeros((self.num_envs, action_dim), pin_memory=pin) if action_dim else
                         torch.zeros(self.num_envs, dtype=torch.long, pin_memory=pin))
        self.grad_sync = GradAllreduce(world, num_params(self.model), self.device)
        # params and grads become views of two flat buffers; the grads' buffer is the MPI buffer.
        # the optimizer (PPO's Adam) over the one flat tensor: one fused update instead of one per layer.
        self.flat_params, _ = flat_model_(self.model, self.grad_sync.grad)
        self.optimizer = self.algo.optimizer([self.flat_params])

        self.ret_rms = RunningMeanStd()
        self.obs_norm = ObsNormalizer(self.spaces.obs_shape[0], t.obs_clip) if t.normalize_obs else None
        self.global_step, self.iteration = 0, 0
        # the balanced cut-off: a rollout ends once enough ranks have their n_steps (off: None)
        self.cutoff = (RolloutCutoff(world, math.ceil(t.rollout_cutoff * world.size))
                       if t.rollout_cutoff is not None and world.size > 1 else None)
        self._warn_of_settings(warn)
        self.min_steps = cutoff_min_steps(t)
        self.steps = t.n_steps  # this rank's steps in the current rollout
        self.counts = None      # every rank's steps in the current rollout (with the cut-off)
        self.cut_log = np.zeros(4)  # iterations, iterations cut, sum and min of the share collected
        self.cut_log[3] = 1.0
        # per-rank running state (saved per rank in checkpoints for exact resume)
        self.buf = RolloutBuffer(t.n_steps, self.num_envs, self.env.obs_shape, self.device, obs_dtype, action_dim)
        self.ret_tracker = np.zeros(self.num_envs, dtype=np.float64)
        self.ep_ret = np.zeros(self.num_envs, dtype=np.float64)
        self.ep_len = np.zeros(self.num_envs, dtype=np.int64)
        # episode_return_mean: the last 100 finished episodes of the job; the ranks step in lockstep,
        # so each keeps its last ceil(100 / ranks) and the count-weighted mean joins them
        self.win_returns = EpisodeWindow(size=-(-100 // world.size))
        self.episodes_total = 0
        self.interval_ep = np.zeros(3)  # finished-episode return sum, count, length sum since last log
        self.interval_ev = np.zeros(5)  # explained-variance sums since last log
        self.obs = self.first = None    # the observation the next step acts on
        self.resume_note = None
        self.replica_checks = 0
        if resume_state is not None:
            self._load(resume_state)
        self.timer = phase_timer(world.rank)

    # ---- state ----
    def _warn_of_settings(self, warn) -> None:
        """Settings that run but do little, said once at start-up."""
        t = self.cfg.training
        if t.rollout_cutoff is not None and self.world.size == 1:
            warn(f"mpippo: warning: training.rollout_cutoff={t.rollout_cutoff:g} has no effect on 1 rank (no other "
                 f"rank to wait for): every rollout collects training.n_steps", flush=True)
        if (bounds := self.spaces.bounds_off_zero()) is not None:
            warn(f"mpippo: warning: env.name: '{self.cfg.env.name}' has action bounds {bounds} that do not hold 0, "
                 f"where the Gaussian policy starts (mean 0, std 1): many early actions are clipped to a bound (all "
                 f"of them where 0 lies outside), which teaches the policy little; rescale the env's actions to about "
                 f"[-1, 1] (Gymnasium's RescaleAction wrapper, in env.import's module)", flush=True)

    def _settle_precision(self, warn) -> str:
        """training.precision made concrete (auto -> bf16 | fp32) and the same on every rank: the
        replicas must compute alike, so auto takes bf16 only if every rank has it natively."""
        t = self.cfg.training
        native, evidence = bf16_native(self.device)
        lacking = int(self.world.agree([0 if native else 1])[0])  # a rank without it vetoes auto
        if lacking and native:
            evidence += ", but not on every rank"
        t.precision, why, warning = resolve_precision(t.precision, native and not lacking, evidence,
                                                      mlp=not envs.spaces_of(self.cfg).image)
        if warning:
            warn(warning)
        return why

    def model_spec(self) -> dict:
        return {**models.spec(self.env.obs_shape, self.env.num_actions, self.cfg.model, self.spaces.continuous),
                "channels": list(self.cfg.model.channels), "hidden_size": self.cfg.model.hidden_size}

    def rank_state(self) -> dict:
        """What differs between ranks: RNG streams, env states, episode statistics (the keys are
        resume.RANK_STATE's, which the checkpoint check and the re-sharding read)."""
        return {
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                    "shuffle": self.generator.get_state(), "sampler": self.sampler.get_state(),
                    "cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None},
            "env": self.env.get_state(), "obs": self.obs.copy(), "first": self.first.copy(),
            "ret_tracker": self.ret_tracker.copy(), "ep_ret": self.ep_ret.copy(), "ep_len": self.ep_len.copy(),
            "win_returns": list(self.win_returns.returns), "episodes_total": self.episodes_total,
            "interval_ep": self.interval_ep.copy(), "interval_ev": self.interval_ev.copy(),
        }

    def state_dict(self, rank_states: list) -> dict:
        return {
            **schema.top_level(self.entry.name, self.model.state_dict(), self.optimizer.state_dict(), self.global_step,
                               self.iteration, self.cfg.to_dict(), self.world.size, self.model_spec()),
            "ret_rms": self.ret_rms.state_dict(), "ranks": rank_states,
            "obs_rms": self.obs_norm.state_dict() if self.obs_norm is not None else None,
        }

    def _load(self, state: dict) -> None:
        if state["algo"] != self.entry.name:
            raise UsageError(f"checkpoint: it is from algorithm '{state['algo']}', this run is {self.entry.name}")
        # the same game, levels and algorithm, or one line; another env split is said below
        notes = resume.check(state["config"], self.cfg, per_rank_note=False)
        resume.load_network(self.model, state, self.cfg, self.model_spec())  # copies into the flat views
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise UsageError(f"checkpoint: optimizer state does not fit ({str(e).splitlines()[0][:160]})") from None
        self.global_step, self.iteration = int(state["timesteps"]), int(state["iteration"])
        self.ret_rms.load_state_dict(state["ret_rms"])
        if self.obs_norm is not None and state.get("obs_rms") is not None:  # (resume.check: normalize_obs is fixed)
            self.obs_norm.load_state_dict(state["obs_rms"])
        ranks = state.get("ranks") or []
        how, was_envs, now_envs = resume.plan(state, self.cfg, self.world.size)
        lines = [f"warning: {n}" for n in notes]
        if how != "exact":
            lines.append(resume.elsewhere_note(how, int(state["world_size"]), self.world.size, was_envs, now_envs,
                                               self.family.exact_resume))
        elif not self.family.exact_resume:
            lines.append(resume.fresh_episodes_note(self.cfg.env.name))
        self.resume_note = "; ".join(lines) or None
        try:  # ckpt_schema checked every field; a failure here is a state the envs themselves refuse
            if how == "exact":
                self._restore_rank(ranks[self.world.rank])
            else:
                self._restore_elsewhere(ranks, how == "reshard")
        except (TypeError, ValueError, KeyError, RuntimeError) as e:
            raise UsageError(f"checkpoint: the state of rank {self.world.rank} cannot be restored "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})") from None

    def _restore_rank(self, r: dict) -> None:
        random.setstate(r["rng"]["python"])
        np.random.set_state(r["rng"]["numpy"])
        torch.set_rng_state(r["rng"]["torch"])
        self.generator.set_state(r["rng"]["shuffle"])
        if r["rng"].get("sampler") is not None:  # (checkpoints before the device sampler: a fresh one)
            self._restore_sampler(r["rng"]["sampler"])
        if r["rng"]["cuda"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(r["rng"]["cuda"], self.device)
        self._restore_envs(r)
        self._restore_episode_stats(r)

    def _restore_elsewhere(self, ranks: list[dict], reshard: bool) -> None:
        """A resume on another world size or env split (resume.plan): this rank's share of the job's
        episode statistics, and of its envs' states when the totals match (reshard: every episode in
        progress goes on), else fresh envs. The RNG streams, whose old per-rank sequences cannot be
        split, are seeded from (seed, rank, iteration): two resumes of one checkpoint run alike."""
        world = self.world
        seed = resume_seed(self.cfg.training.seed, world.rank, self.iteration)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)  # (and every CUDA device's)
        self.generator.manual_seed(seed + 1)
        self.sampler.generator.manual_seed(seed + 2)
        self._restore_episode_stats(resume.episode_stats(ranks, world.size, world.rank))
        if reshard:
            self._restore_envs(resume.reshard(ranks, self.cfg.env.name, world.size, world.rank, seed + 3))

    def _restore_envs(self, r: dict) -> None:
        """The envs' states and the runner's per-env arrays (resume.RUNNER_PER_ENV), in one order;
        envs that cannot save their state start fresh episodes instead (seeded from the iteration,
        so a resume does not replay the start's episodes)."""
        if not self.family.exact_resume:
            self.env.close()
            seed = resume_seed(self.cfg.training.seed, self.world.rank, self.iteration) + 3
            self.env = make_env(self.cfg, self.num_envs, seed=seed, num_threads=self.env_threads)
            return
        self.env.set_state(r["env"])
        self.obs, self.first = r["obs"], r["first"]
        self.ret_tracker, self.ep_ret, self.ep_len = r["ret_tracker"], r["ep_ret"], r["ep_len"]

    def _restore_episode_stats(self, r: dict) -> None:
        self.win_returns.add(r["win_returns"])
        self.episodes_total = int(r["episodes_total"])
        self.interval_ep, self.interval_ev = r["interval_ep"], r["interval_ev"]

    def _restore_sampler(self, state: torch.Tensor) -> None:
        """The action sampler's stream; a checkpoint from another kind of device (a GPU run resumed
        on CPUs) holds another generator's state: the stream starts fresh there, with a note."""
        try:
            self.sampler.set_state(state)
        except RuntimeError:
            self.resume_note = ((self.resume_note + "; ") if self.resume_note else "") + (
                f"warning: the action sampler's state is from another device; its stream starts fresh on "
                f"{self.device.type} (not an exact resume)")

    def _broadcast_parameters(self) -> None:
        host = self.flat_params.detach().cpu().numpy().copy() if self.device.type != "cpu" else self.flat_params.numpy()
        self.world.bcast_(host, root=0, name="bcast_params")
        if self.device.type != "cpu":
            self.flat_params.data.copy_(torch.from_numpy(host))

    # ---- one iteration, in pieces ----
    @torch.inference_mode()
    def collect_rollout(self, obs, first):
        buf, env, timer, gamma = self.buf, self.env, self.timer, self.cfg.training.norm_gamma()
        cut, n_steps = self.cutoff, self.cfg.training.n_steps
        ep_ret_sum = ep_len_sum = ep_count = 0.0
        if self.bootstraps:
            buf.trunc_values.zero_()
        for step in range(n_steps):
            with timer("inference"):
                obs_t = buf.obs[step]
                if self.device.type == "cuda":  # to the pinned staging buffer, then one asynchronous copy up
                    self.obs_host.numpy()[:] = self._policy_obs(obs)
                    obs_t.copy_(self.obs_host, non_blocking=True)
                else:
                    obs_t.copy_(torch.from_numpy(self._policy_obs(obs)))
                buf.dones[step].copy_(torch.from_numpy(first), non_blocking=True)
                action, logprob, value = self.policy_step(obs_t)
                buf.actions[step] = action
                buf.logprobs[step] = logprob
                buf.values[step] = value
                self.act_host.copy_(action)  # the step's one wait for the device
                action_np = self.act_host.numpy()
            with timer("env_step"):
                env.act(action_np)
                rew, obs, first = env.observe()
            if self.bootstraps:
                with timer("inference"):
                    self._bootstrap_truncated(step)
            # episode bookkeeping on raw rewards; discounted-return tracker for the normalizer
            self.ep_ret += rew
            self.ep_len += 1
            self.ret_tracker = self.ret_tracker * gamma + rew
            buf.disc_returns[step] = self.ret_tracker
            buf.rewards[step].copy_(torch.from_numpy(rew))
            if first.any():
                _, done_ret, done_len = envs.ended_episodes(env, first, self.ep_ret, self.ep_len)
                ep_ret_sum += done_ret.sum()
                ep_len_sum += done_len.sum()
                ep_count += len(done_ret)
                self.win_returns.add(done_ret.tolist())
                self.ep_ret[first] = 0.0
                self.ep_len[first] = 0
                self.ret_tracker[first] = 0.0
            if cut is not None and self.min_steps <= step + 1 < n_steps and cut.enough():
                break  # enough ranks have their whole rollout: this one keeps what it has
        self.steps = step + 1
        if cut is not None and self.steps == n_steps:
            cut.full()
        self.episodes_total += int(ep_count)
        return obs, first, (ep_ret_sum, ep_count, ep_len_sum)

    def _policy_obs(self, obs: np.ndarray, count: bool = True) -> np.ndarray:
        """Observations as the network sees them: normalized with training.normalize_obs (the
        statistics as of the rollout's start; `count`: add them to this rollout's sums), else as is."""
        if self.obs_norm is None:
            return obs
        if count:
            self.obs_norm.add(obs)
        return self.obs_norm(obs)

    def _bootstrap_truncated(self, step: int) -> None:
        """An episode a time limit cut at this step is not over: its reward gains gamma * V(its final
        observation), added after reward scaling (`advantages`: the value is in the scaled units); a
        termination gains nothing (the gym family's docstring)."""
        idx, final = self.env.truncated()
        if len(idx):
            with autocast(self.device, self.cfg.training.precision):
                _, value = self.model(torch.from_numpy(self._policy_obs(final, count=False)).to(self.device))
            self.buf.trunc_values[step, torch.from_numpy(idx).to(self.device)] = self.cfg.training.gamma * value.float()

    def normalize_rewards(self) -> None:
        """Divide the rollout's rewards by the running std of discounted returns (all ranks' envs),
        clipped to +-REWARD_CLIP. "step": as baselines' VecNormalize, the statistics are updated
        with every env step's returns and each step's rewards use the statistics up to that step;
        computed after the rollout from one Allreduce of per-step moments, which gives the same
        numbers (the scale only enters training, never acting). "rollout": one update per rollout."""
        t, buf = self.cfg.training, self.buf
        if t.reward_norm == "step":
            scales = self.ret_rms.scales_per_step(global_step_moments(self.world, buf.disc_returns, self.steps))
            buf.rewards.div_(torch.tensor(scales, dtype=buf.rewards.dtype, device=buf.rewards.device)[:, None])
        else:
            self.ret_rms.update_from_moments(*global_moments(self.world, buf.disc_returns[:self.steps]))
            buf.rewards.div_(math.sqrt(self.ret_rms.var + 1e-8))
        buf.rewards.clamp_(-REWARD_CLIP, REWARD_CLIP)

    def advantages(self, next_obs, next_first):
        """GAE on the (normalized) rewards; advantages normalized here only with adv_norm: rollout
        (per minibatch, ppo_update does it)."""
        t, buf = self.cfg.training, self.buf
        if t.normalize_reward:
            self.normalize_rewards()
        if self.bootstraps:
            buf.rewards.add_(buf.trunc_values)
        with torch.inference_mode(), autocast(self.device, t.precision):
            _, next_value = self.model(torch.from_numpy(self._policy_obs(next_obs, count=False)).to(self.device))
        next_value = next_value.float()
        next_done = torch.from_numpy(next_first.astype(np.float32)).to(self.device)
        T = self.steps  # a rollout the cut-off ended early bootstraps from the observation it stopped at
        adv, ret = compute_gae(buf.rewards[:T], buf.values[:T], buf.dones[:T], next_value, next_done, t.gamma,
                               self.algo.gae_lambda)
        if t.norm_adv and t.adv_norm == "rollout":
            mean, std = global_mean_std(self.world, adv)
            adv = (adv - mean) / (std + 1e-8)
        return adv, ret

    def learn(self, nonfinite_streak: int = 0) -> dict:
        """The learning half of an iteration, on the rollout in self.buf: reward scaling, GAE,
        advantages, then the algorithm's update (minibatch steps, one gradient Allreduce each).
        Returns its statistics (ppo_update's)."""
        shares = None  # each rank's weight in the gradient average, when the cut-off made the ranks unequal
        with self.timer("gae"):
            if self.cutoff is not None:
                self.counts = self.cutoff.end(self.steps, self.cfg.training.n_steps)
                self._log_cut()
                shares = minibatch_shares(self.counts * self.num_envs, self.world.rank, sync_minibatches(self.cfg)[1])
            adv, ret = self.advantages(self.obs, self.first)
            if self.obs_norm is not None:  # the rollout's observations join the job's statistics: one Allreduce
                self.obs_norm.update(self.world.allreduce_(self.obs_norm.sums.copy(), "sum", name="obs_moments"))
            batch = self.buf.flat_batch(adv, ret, self.steps)
            y, v = batch["b_returns"].double(), batch["b_values"].double()
            self.interval_ev += [y.numel(), float(y.sum()), float((y * y).sum()), float((y - v).sum()),
                                 float(((y - v) ** 2).sum())]
        return self.algo.update(self.model, self.optimizer, batch, self.grad_sync, self.generator, self.timer,
                                nonfinite_streak, self.cfg.guards.max_nonfinite_skips,
                                adv_moments=device_mean_std if self.world.size == 1 else
                                (lambda x: global_mean_std(self.world, x)), shares=shares)

    def _log_cut(self) -> None:
        """The cut-off's record: iterations, those cut short, the mean and least share collected."""
        share = self.counts / self.cfg.training.n_steps
        self.cut_log += [1, float(share.min() < 1), float(share.mean()), 0.0]
        self.cut_log[3] = min(self.cut_log[3], float(share.min()))

    def steps_collected(self) -> int:
        """Env steps of all ranks in this iteration's rollout."""
        return self.batch_size if self.counts is None else int(self.counts.sum()) * self.num_envs

    def _lr(self) -> float:
        t = self.cfg.training
        if not t.anneal_lr:
            return t.learning_rate
        # by steps, not iterations, so the schedule survives a resume with another batch size
        return t.learning_rate * max(1.0 - self.global_step / t.total_timesteps, 0.0)

    def save_checkpoint(self) -> None:
        """Collective: gather every rank's state to rank 0, which writes atomically; all agree on success."""
        rank_states = self.world.gather_obj(self.rank_state())
        error = ""
        if self.world.is_root:
            folder = checkpoint_dir(self.run_dir)
            try:
                save_checkpoint(folder, self.state_dict(rank_states), self.iteration, self.cfg.checkpoint.keep_last)
            except OSError as e:  # disk full, quota, permissions: the previous latest.pt is untouched
                error = write_failed(f"iteration {self.iteration}", folder, e)
        (failed,) = self.world.agree([bool(error)])
        if failed:
            raise CheckpointError(error or "checkpoint: rank 0 could not write the checkpoint")

    def _agree_policy_step(self, reporter) -> None:
        """Collective, once, after the first rollout (the capture): the job's policy step is a graph
        only where every rank's is; rank 0 names the ranks whose capture fell back to eager."""
        modes = self.world.allgather_obj(self.policy_step.mode)
        self.policy_mode = "graph" if all(m == "graph" for m in modes) else "eager"
        if reporter is not None:
            reporter.extra["policy_step"] = self.policy_mode
        fell_back = [r for r, m in enumerate(modes) if m == "eager"]
        if self.world.is_root and self.policy_step.wanted and fell_back and len(fell_back) < len(modes):
            print(f"mpippo: warning: the policy step runs eagerly on rank(s) {fell_back} (their CUDA graph "
                  f"capture failed), as a graph on the others", flush=True)

    # ---- the loop ----
    def report(self, reporter, stats_vec: np.ndarray, update_stats: dict, lr: float, stop: bool, done: bool) -> None:
        """Collective: this rank's statistics since the last report, gathered on rank 0, which logs them."""
        stats_vec[:] = 0.0
        stats_vec[[IDX["ep_ret_sum"], IDX["ep_count"], IDX["ep_len_sum"]]] = self.interval_ep
        stats_vec[IDX["win_ret_sum"]] = sum(self.win_returns.returns)
        stats_vec[IDX["win_count"]] = len(self.win_returns)
        stats_vec[IDX["episodes_total"]] = self.episodes_total
        for key in REPORTED_STATS:  # (algos/contracts.py: what every sync algorithm's update returns)
            stats_vec[IDX[key]] = update_stats[key]
        stats_vec[IDX["ev_n"]:IDX["ev_sum_r2"] + 1] = self.interval_ev
        stats_vec[IDX["peak_rss_mb"]] = peak_rss_mb()
        stats_vec[IDX["cpu_seconds"]] = cpu_seconds()
        stats_vec[IDX["replica_checks"]] = self.replica_checks
        stats_vec[IDX["t_env_step"]:IDX["iter_0"]] = self.timer.vector()
        stats_vec[IDX["iter_0"]:] = self.timer.summary()  # per-iteration times: the straggler statistics
        M = self.world.gather(stats_vec, name="stats_gather")
        self.interval_ep[:] = 0.0
        self.interval_ev[:] = 0.0
        if reporter is not None:
            if self.device.type == "cuda":  # rank 0's GPU: the ranks' work is the same
                reporter.extra["gpu_peak_mem_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
            if self.cutoff is not None:
                n, cut, share_sum, least = self.cut_log
                reporter.extra["rollout_cutoff"] = {
                    "ranks_needed": self.cutoff.needed, "iterations": int(n), "iterations_cut": int(cut),
                    "mean_share_collected": share_sum / max(n, 1), "least_share_collected": least}
            print_line = stop or self.iteration % self.cfg.logging.print_interval == 0 or self.iteration == 1
            reporter.log(M, self.global_step, self.iteration, lr, print_line)
            reporter.write_benchmark(done=done)

    def start_wandb(self) -> WandbStart | None:
        """Rank 0's W&B run (logging.wandb), begun before anything of the run is written; a refusal
        is a UsageError that the job agrees on."""
        if not self.world.is_root or self.cfg.logging.wandb == "off":
            return None
        started = WandbStart(self.cfg, self.run_dir)
        self.wandb_run = started.run
        return started

    def _reporter(self) -> Reporter | None:
        """Rank 0's console, metrics and TensorBoard (None elsewhere); the end of start-up."""
        cfg, world, t = self.cfg, self.world, self.cfg.training
        hosts = world.allgather_obj((world.hostname, world.node))
        reporter = None
        if world.is_root:
            end = budget_end(cfg, self.global_step, self.batch_size, world.size) or t.total_timesteps
            reporter = Reporter(cfg, self.run_dir, world.size, hosts, self.global_step, self.iteration,
                                end, cfg.logging.progress, self.wandb_run)  # (the bar and ETA: where it ends)
            reporter.extra = {"device_used": str(self.device), "env_threads": self.env_threads,
                              "affinity_cores": world.affinity, "cpu_share": world.cpu_share,
                              "deterministic": t.deterministic, "policy_step": self.policy_step.mode,
                              "precision_why": self.precision_why,
                              "allreduce_bytes": int(self.grad_sync.host.numel() * 4),
                              "allreduce_calls_per_iteration": self.algo.allreduces_per_iteration,
                              "rollout_cutoff": None}
        # start-up ends here, for every rank together: rank 0's reporter (git, TensorBoard's import) was
        # its last part, under start-up's longer watch (runctl.STARTUP_TIMEOUT_S); the run's own from now
        world.barrier()
        world.set_collective_timeout(cfg.guards.collective_timeout_s)
        return reporter

    def train(self, signals: SignalFlags | None = None) -> dict:
        cfg, world, t = self.cfg, self.world, self.cfg.training
        self._broadcast_parameters()  # rule: initial weights come from rank 0, never from equal seeds
        reporter = self._reporter()
        signals = signals or SignalFlags()
        stats_vec = np.zeros(len(FIELDS), dtype=np.float64)
        deadline = Deadline(t.duration_hours)
        ck_every_s = cfg.checkpoint.interval_minutes * 60
        last_ckpt = time.monotonic()
        nonfinite_streak, updates_since_check = 0, 0
        if self.obs is None:
            _, self.obs, self.first = self.env.observe()
        train_t0 = time.perf_counter()
        update_stats = {}
        stop_reason = "done" if self.global_step >= t.total_timesteps else None
        while stop_reason is None:
            self.iteration += 1
            signals.reclaim()  # (an env's library may set its own handlers late: in a step, not its constructor)
            self.grad_sync.poison_steps += maybe_inject(world.rank, self.iteration)
            lr = self._lr()
            for group in self.optimizer.param_groups:
                group["lr"] = lr

            self.obs, self.first, ep = self.collect_rollout(self.obs, self.first)
            if self.policy_mode is None:
                self._agree_policy_step(reporter)
            self.interval_ep += ep
            update_stats = self.learn(nonfinite_streak)
            nonfinite_streak = update_stats["nonfinite_streak"]
            self.global_step += self.steps_collected()
            updates_since_check += update_stats["updates"]

            # ---- decisions all ranks take together: one Allreduce(MAX) of flags ----
            now = time.monotonic()
            time_up, ckpt_due, requeue, stop_req = world.agree([
                deadline.reached(),
                ck_every_s > 0 and now - last_ckpt >= ck_every_s,
                signals.requeue, signals.stop])
            stop_reason = stop_reason_now(self.global_step >= t.total_timesteps, requeue, stop_req, time_up)
            stop = stop_reason is not None
            if updates_since_check >= cfg.guards.checksum_interval or stop:
                bad = check_replicas(world, self.flat_params)
                self.replica_checks += 1
                if bad:
                    raise ReplicaDivergence(f"replica parameters diverged: ranks {bad} differ from rank 0 "
                                       f"at iteration {self.iteration}")
                updates_since_check = 0

            self.timer.add_other(time.perf_counter() - train_t0)
            self.timer.end_iteration()
            if stop or self.iteration % cfg.logging.log_interval == 0:
                self.report(reporter, stats_vec, update_stats, lr, stop, stop_reason == "done")
            if reporter is not None:
                reporter.progress(self.global_step)

            ck = cfg.checkpoint.interval_iterations
            if stop or ckpt_due or (ck > 0 and self.iteration % ck == 0):
                self.save_checkpoint()
                last_ckpt = time.monotonic()

        summary = {}
        if reporter is not None:
            summary = reporter.write_benchmark(done=stop_reason == "done", stop_reason=stop_reason)
            reporter.close()
        self.env.close()
        summary["stop_reason"] = stop_reason
        return summary

