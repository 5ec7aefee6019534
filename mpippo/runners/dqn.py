"""DQN in the Ape-X layout: per agent, one learner rank and several actor ranks.

COMM_WORLD is split into `dqn.num_agents` contiguous groups; in each group rank 0 is the
learner (replay, target network, optimizer; on a GPU when there is one) and the others are
actors. Actors step their envs with their own epsilon, compute n-step transitions and stream
them in fixed-size chunks (comm.p2p); the learner drains chunks without blocking on any one
actor, trains at `dqn.replay_ratio` samples per env step, hands out credit so actors neither
flood nor starve it, and sends fresh weights every `weight_sync_period` updates.

Checkpoints (the learner's): online and target networks, Adam, counters, the return window,
the replay RNG and, with `dqn.save_replay`, the replay buffer in a separate file. They are
written every `dqn.checkpoint_interval_updates` updates / `checkpoint.interval_minutes`, on a
signal and at the end. A signal on any rank of an agent stops its actors (STOPREQ), the learner
drains every chunk in flight, checkpoints and the job exits 3 (SIGUSR1: requeue) or 4. A resume
continues the counters and budgets; it is not bit-exact (actor/learner timing is not), and after
a crash the env steps since the last checkpoint are collected again.

Self-play (`selfplay.enabled`, two-player games): the learner keeps an opponent pool of frozen
snapshots and ships each to the actors (tag SNAPSHOT) and the sampling table with the weights;
actors play a pool member per game and report results per opponent in the chunks; the learner
rates (mpippo.selfplay). The pool and the rating history are part of the checkpoint.
"""
from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from mpippo.algos.ppo import autocast
from mpippo.algos.dqn import NStepAccumulator, PrioritizedReplay, apex_epsilons, double_dqn_loss, mirror_half
from mpippo.checkpoint import (LATEST, atomic_write_json, atomic_write_with, load_checkpoint,
                               read_checkpoint_bytes, save_checkpoint)
from mpippo.comm import World
from mpippo.comm.p2p import ActorChannel, ChunkLayout, LearnerChannel
from mpippo.config import Config, ConfigError
from mpippo.envs import bits_to_mask, make_env, mask_bits, rank_seed
from mpippo.faults import maybe_inject
from mpippo.metrics.reporter import git_commit, peak_rss_mb
from mpippo.preemption import SignalFlags
from mpippo.selfplay import ILLEGAL, OpponentCache, OpponentPool
from mpippo.models import DuelingQNetwork
from mpippo.models.flat import flatten_parameters_

# chunk header slots (int64): count, actor, seq, weights version, episodes, return sum (float64), length sum, env steps
H_COUNT, H_ACTOR, H_SEQ, H_VERSION, H_EPISODES, H_RETSUM, H_LENSUM, H_STEPS = range(8)
# why a segment ended, in increasing precedence (the largest code over all ranks wins)
STOP_REASONS = ("done", "duration", "stopped", "requeue")
REPLAY_FILE = "replay.npz"


def signal_code(signals: SignalFlags) -> int:
    return STOP_REASONS.index("requeue") if signals.requeue else STOP_REASONS.index("stopped") if signals.stop else 0


def learner_device(cfg: Config, agent: int) -> torch.device:
    want = cfg.training.device
    if want in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", agent % torch.cuda.device_count())
    if want == "cuda" or (want == "auto" and os.environ.get("CUDA_VISIBLE_DEVICES")):
        print(f"mpippo: warning: agent {agent}: training.device is {want} and GPUs were allocated, but CUDA is not usable here "
              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}); the learner runs on the CPU",
              flush=True)
    return torch.device("cpu")


class ApeXDQN:
    def __init__(self, cfg: Config, world: World, run_dir: Path, resume: bool = False):
        self.cfg, self.world, d = cfg, world, cfg.dqn
        per_agent = world.size // d.num_agents
        self.agent = world.rank // per_agent
        self.comm = world.comm.Split(self.agent, world.rank) if world.size > 1 else None
        self.local_rank = self.comm.Get_rank()
        self.is_learner = self.local_rank == 0
        self.num_actors = per_agent - 1
        self.actor_index = self.local_rank - 1
        self.run_dir = Path(run_dir) / f"agent_{self.agent}" if d.num_agents > 1 else Path(run_dir)
        torch.set_num_threads(max(1, cfg.parallel.threads_per_rank or 1))
        seed = rank_seed(cfg.training.seed, world.rank)
        torch.manual_seed(rank_seed(cfg.training.seed, self.agent))  # same init on a group's ranks
        self.num_envs = cfg.env.num_envs_per_rank
        # the learner only needs the spaces; actors step envs
        self.env = make_env(cfg, self.num_envs if not self.is_learner else 1, seed=seed)
        self.obs_shape, self.num_actions = tuple(self.env.obs_shape), int(self.env.num_actions)
        self.model = self._new_net()
        self.selfplay = cfg.selfplay if cfg.selfplay.enabled else None
        sp = self.selfplay
        # self-play: the sampling table rides with the weights, game results with the chunks
        self.table_size = 1 + 2 * sp.pool_size if sp else 0
        self.layout = ChunkLayout(d.chunk_size, self.obs_shape, results_rows=sp.pool_size + 4 if sp else 0)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.resume_state = None
        start = self._resume_point(resume)  # env steps done so far, and how often this agent was resumed
        self.steps_before, self.resumes = start["steps"], start["resumes"]
        budget = cfg.training.total_timesteps // d.num_agents - self.steps_before  # this agent's remaining steps
        self.actor_steps = max(budget, 0) // self.num_actors // self.num_envs
        if start["resumes"] and not self.is_learner:  # fresh episodes and exploration, not a replay of segment 1
            self.env.close()
            self.env = make_env(cfg, self.num_envs, seed=seed + 7919 * self.resumes)
        if self.is_learner:
            need = PrioritizedReplay.nbytes(d.buffer_size, self.obs_shape)
            avail = psutil.virtual_memory().available
            if need > 0.9 * avail:
                raise ConfigError(f"dqn.buffer_size: {d.buffer_size} transitions need {need / 2**30:.1f} GiB, "
                                  f"more than the {avail / 2**30:.1f} GiB available; lower it")
            self.replay_gib = need / 2**30

    def _new_net(self) -> DuelingQNetwork:
        return DuelingQNetwork(self.obs_shape, self.num_actions, tuple(self.cfg.model.channels),
                               self.cfg.model.hidden_size, self.cfg.dqn.dueling, self.cfg.model.downsample)

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def _resume_point(self, resume: bool) -> dict:
        """The learner reads its agent's checkpoint; the group learns the outcome (one start-up bcast),
        so a bad checkpoint ends every rank with the same message."""
        outcome = {"steps": 0, "resumes": 0}
        if resume and self.is_learner:
            try:
                path = self.ckpt_dir / LATEST
                state = load_checkpoint(read_checkpoint_bytes(path), str(path), "dqn")
                if self.selfplay and "selfplay" not in state:
                    raise ConfigError("checkpoint: it has no opponent pool (trained without self-play); "
                                      "resume it with selfplay.enabled=false")
                spec = {"obs_shape": list(self.obs_shape), "num_actions": self.num_actions}
                if state.get("model_spec") != spec or state.get("agent", 0) != self.agent:
                    raise ConfigError(f"checkpoint: network {state.get('model_spec')} of agent {state.get('agent', 0)} "
                                      f"does not match this config's {spec} for agent {self.agent}")
                try:
                    self.model.load_state_dict(state["model"])
                except RuntimeError as e:
                    raise ConfigError(f"checkpoint: model state does not fit ({str(e).splitlines()[0][:160]})") from None
                self.resume_state = state
                outcome = {"steps": int(state["timesteps"]), "resumes": int(state.get("resumes", 0)) + 1}
            except ConfigError as e:
                outcome = {"error": e.errors}
        if self.comm is not None:
            outcome = self.comm.bcast(outcome, root=0)
        if "error" in outcome:
            raise ConfigError(outcome["error"])
        return outcome

    def train(self, signals: SignalFlags | None = None) -> dict:
        signals = signals or SignalFlags()
        return self._learn(signals) if self.is_learner else self._act(signals)

    # ------------------------------------------------------------------ actor
    def _act(self, signals: SignalFlags) -> dict:
        cfg, d = self.cfg, self.cfg.dqn
        flat = flatten_parameters_(self.model)
        sp = self.selfplay
        ch = ActorChannel(self.comm, 0, self.layout, self.n_params, d.max_inflight, self.table_size, snapshots=bool(sp))
        eps = float(apex_epsilons(self.num_actors, d.eps, d.eps_alpha)[self.actor_index])
        rng = np.random.default_rng(rank_seed(cfg.training.seed, self.world.rank) + 17 + 7919 * self.resumes)
        cache = None
        self.illegal_reported = 0
        if sp:  # the env's opponent: pool members (inference copies) and the heuristic players
            cache = OpponentCache(self._new_net, self.num_envs, np.random.default_rng(rng.integers(2**62)),
                                  sp.heuristic_prob, sp.pool_size,
                                  lambda: autocast(torch.device("cpu"), cfg.training.precision), sp.opponent_eps)

        def receive() -> int | None:
            """Take new weights (and the opponent table) and pool snapshots; the new version or None."""
            if cache is not None:
                for mid, params in ch.poll_snapshots():
                    cache.add(mid, params)
            w = ch.poll_weights()
            if w is None:
                return None
            flat.copy_(torch.from_numpy(w[1]))
            if cache is not None:
                n, size = int(w[2][0]), sp.pool_size
                cache.set_table(w[2][1:1 + n], w[2][1 + size:1 + size + n])
            return w[0]

        version = -1
        while version < 0 or (cache is not None and not cache.nets):  # start with the learner's weights (and pool)
            new = receive()
            version = version if new is None else new
            time.sleep(0.001)
        if cache is not None:
            self.env.set_opponent(cache)
        acc = NStepAccumulator(d.n_step, cfg.training.gamma, self.num_envs, self.obs_shape)
        _, obs, _ = self.env.observe()
        masked = hasattr(self.env, "action_mask")  # legal actions only (connect4)
        mask = self.env.action_mask() if masked else None
        ep_ret = np.zeros(self.num_envs)
        ep_len = np.zeros(self.num_envs, dtype=np.int64)
        views, filled = ch.chunk(), 0
        stats = np.zeros(3)  # episodes, return sum, length sum since the last chunk
        t0 = time.perf_counter()
        steps_done = reason = 0
        for step in range(self.actor_steps):
            reason = signal_code(signals)
            if reason or ch.stop_requested():
                break
            steps_done = step + 1
            maybe_inject(self.world.rank, steps_done)  # tests only: MPIPPO_FAULT, counted in actor steps
            new = receive()
            version = version if new is None else new
            with torch.inference_mode(), autocast(torch.device("cpu"), cfg.training.precision):
                q_values = self.model(torch.from_numpy(obs)).float()
            if mask is None:
                greedy = q_values.argmax(1).numpy()
                randoms = rng.integers(self.num_actions, size=self.num_envs)
            else:  # only legal actions, greedy or random
                greedy = q_values.masked_fill(~torch.from_numpy(mask), float("-inf")).argmax(1).numpy()
                randoms = (rng.random(mask.shape) + mask).argmax(1)
            explore = rng.random(self.num_envs) < eps
            actions = np.where(explore, randoms, greedy)
            self.env.act(actions)
            rew, next_obs, first = self.env.observe()
            if masked:
                mask = self.env.action_mask()
            ep_ret += rew
            ep_len += 1
            if first.any():
                stats += (first.sum(), ep_ret[first].sum(), ep_len[first].sum())
                ep_ret[first], ep_len[first] = 0.0, 0
            out = acc.push(obs, actions, rew, first, next_obs)
            obs = next_obs
            if out is None:
                continue
            o, a, r, disc, nxt = out
            legal = mask_bits(mask) if masked else -1  # of next_obs, which is the current obs
            i = 0
            while i < len(a):  # a step's transitions may straddle two chunks
                k = min(len(a) - i, d.chunk_size - filled)
                sl = slice(filled, filled + k)
                views["obs"][sl], views["next_obs"][sl] = o[i:i + k], nxt[i:i + k]
                views["actions"][sl], views["returns"][sl], views["discounts"][sl] = a[i:i + k], r[i:i + k], disc[i:i + k]
                views["next_legal"][sl] = legal if not masked else legal[i:i + k]
                filled += k
                i += k
                if filled == d.chunk_size:
                    self._stamp(views, version, stats, step + 1, cache)
                    ch.send(filled, self.local_rank)
                    views, filled = ch.chunk(), 0
        while filled or stats[0] or (cache is not None and cache.results):  # the rest, and every game result
            self._stamp(views, version, stats, steps_done, cache)
            ch.send(filled, self.local_rank)
            views, filled = ch.chunk(), 0
        ch.finish(env_steps=steps_done * self.num_envs, reason=reason)
        self.env.close()
        return {"role": "actor", "sent": ch.sent, "eps": eps, "stop_reason": STOP_REASONS[reason],
                "steps_per_s": steps_done * self.num_envs / (time.perf_counter() - t0),
                **({"opponents": cache.summary()} if cache is not None else {})}

    def _stamp(self, views, version, stats, steps, cache=None):
        h = views["header"]
        h[H_VERSION], h[H_EPISODES], h[H_LENSUM], h[H_STEPS] = version, int(stats[0]), int(stats[2]), steps * self.num_envs
        h[H_RETSUM:H_RETSUM + 1].view(np.float64)[0] = stats[1]
        stats[:] = 0.0
        if cache is not None:
            res = views["results"]
            res[:] = 0
            rows = cache.take_results(len(res) - 1)
            if rows:
                res[:len(rows)] = rows
            illegal, self.illegal_reported = self.env.illegal_moves - self.illegal_reported, self.env.illegal_moves
            res[-1] = (ILLEGAL, illegal, 0, 0)

    # ---------------------------------------------------------------- learner
    def _learn(self, signals: SignalFlags) -> dict:
        cfg, d, t = self.cfg, self.cfg.dqn, self.cfg.training
        device = learner_device(cfg, self.agent)
        q = self.model.to(device)
        flat = flatten_parameters_(q)
        target = copy.deepcopy(q)
        opt = torch.optim.Adam(q.parameters(), lr=t.learning_rate, eps=t.adam_eps)
        replay = PrioritizedReplay(d.buffer_size, self.obs_shape, d.per_alpha, seed=rank_seed(t.seed, self.world.rank))
        # counters over the whole run (all segments); `received` and the sent totals are this segment's,
        # so the run's transitions are c["transitions"] (before this segment) + received
        c = {"updates": 0, "episodes": 0, "transitions": 0, "lag_sum": 0, "lag_n": 0}
        ret_window: list[float] = []
        resumed = ""
        sp = self.selfplay
        pool = OpponentPool(sp.pool_size, sp.sampling, sp.drop, sp.elo_k, sp.priority_exponent) if sp else None
        ratings: list[dict] = []  # self-play: greedy games against the heuristic players, one row per round
        if self.resume_state is not None:
            st = self.resume_state
            target.load_state_dict(st["target"])
            try:
                opt.load_state_dict(st["optimizer"])
            except (ValueError, KeyError) as e:
                raise ConfigError(f"checkpoint: optimizer state does not fit ({str(e).splitlines()[0][:160]})") from None
            c.update(st["counters"])
            ret_window = list(st["ret_window"])
            replay.rng.bit_generator.state = st["replay_rng"]
            torch.set_rng_state(st["torch_rng"])
            if st.get("replay_file"):
                why = replay.load(self.ckpt_dir / st["replay_file"], c["updates"])
                resumed = (f"; restored replay of {replay.size:,} transitions" if why is None else
                           f"; warning: replay file not used ({why}), the buffer refills from empty")
            if pool is not None:  # (_resume_point checked that it has one)
                pool.load_state_dict(st["selfplay"]["pool"])
                ratings = list(st["selfplay"]["ratings"])
                resumed += f"; restored opponent pool of {len(pool.members)} (ids {[m['id'] for m in pool.members]})"
            self.resume_state = None
        masked = hasattr(self.env, "action_mask")  # the target's argmax over legal actions only
        aug_rng = np.random.default_rng(rank_seed(t.seed, self.world.rank) + 99 + 7919 * self.resumes)
        actors = list(range(1, self.num_actors + 1))
        ch = LearnerChannel(self.comm, actors, self.layout, self.n_params, d.max_inflight, self.table_size)
        eps = apex_epsilons(self.num_actors, d.eps, d.eps_alpha)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        from torch.utils.tensorboard import SummaryWriter
        writer = None
        if cfg.logging.tensorboard:  # continue the curves after the last logged point
            writer = SummaryWriter(str(self.run_dir / "logs"), purge_step=c["transitions"] + 1 if self.resumes else None)
        verb = f"resuming at {self.steps_before:,} env steps, {c['updates']:,} updates{resumed}" if self.resumes else "starting"
        print(f"mpippo: agent {self.agent}: {verb}: learner on {device}, {self.num_actors} actor(s) x {self.num_envs} envs, "
              f"replay {d.buffer_size:,} transitions = {self.replay_gib:.2f} GiB, epsilons "
              f"{', '.join(f'{e:.4f}' for e in eps)}", flush=True)

        def weights():
            return flat.detach().cpu().numpy()

        def table():
            """The opponent sampling table for the actors: [n, ids (pool_size slots), probabilities]."""
            if pool is None:
                return None
            ids, p = pool.table()
            out = np.zeros(self.table_size)
            out[0] = len(ids)
            out[1:1 + len(ids)], out[1 + sp.pool_size:1 + sp.pool_size + len(ids)] = ids, p
            return out

        def rate() -> None:
            """Greedy rating games against the heuristic players (the win-rate curve)."""
            from mpippo.envs.connect4 import lookahead_opponent, play_games, random_opponent

            @torch.inference_mode()
            def policy(obs, mask):
                with autocast(device, t.precision):
                    qv = q(torch.from_numpy(obs).to(device)).float()
                return qv.masked_fill(~torch.from_numpy(mask).to(device), float("-inf")).argmax(1).cpu().numpy()
            rng = np.random.default_rng(rank_seed(t.seed, self.world.rank) + len(ratings))
            row = {"update": c["updates"], "transitions": c["transitions"] + received,
                   "elo": round(pool.learner_rating, 1)}
            for name, opp in (("random", random_opponent(rng)), ("lookahead", lookahead_opponent(rng))):
                w_, d_, l_ = (int(x) for x in play_games(policy, opp, sp.eval_games))
                row[name] = {"wins": w_, "draws": d_, "losses": l_, "win_rate": w_ / sp.eval_games,
                             "score": (w_ + 0.5 * d_) / sp.eval_games}
                if writer is not None:
                    writer.add_scalar(f"selfplay/greedy_win_rate_vs_{name}", w_ / sp.eval_games, row["transitions"])
                    writer.add_scalar(f"selfplay/greedy_score_vs_{name}", row[name]["score"], row["transitions"])
            ratings.append(row)

        def snapshot() -> None:
            member, _ = pool.snapshot(c["updates"], weights())
            ch.send_snapshot(member["id"], member["params"])

        def env_steps(final: bool) -> int:
            """Env steps of the run so far: exact from the STOP messages at the end, else from chunk headers."""
            per_actor = {a: int(ch.stopped[a][1]) for a in actors} if final else seen_steps
            return self.steps_before + sum(per_actor.values())

        def checkpoint(final: bool) -> None:
            state = {"algo": "dqn", "agent": self.agent, "model": q.state_dict(), "target": target.state_dict(),
                     "optimizer": opt.state_dict(), "timesteps": env_steps(final), "iteration": c["updates"],
                     "counters": dict(c, transitions=c["transitions"] + received), "ret_window": list(ret_window),
                     "resumes": self.resumes,
                     "replay_rng": replay.rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                     "replay_file": REPLAY_FILE if d.save_replay else None, "config": cfg.to_dict(),
                     **({"selfplay": {"pool": pool.state_dict(), "ratings": list(ratings)}} if pool is not None else {}),
                     "world_size": self.world.size,
                     "model_spec": {"obs_shape": list(self.obs_shape), "num_actions": self.num_actions}}
            try:
                if d.save_replay:  # first the replay file, then the checkpoint that names it (by its tag)
                    atomic_write_with(self.ckpt_dir / REPLAY_FILE, lambda f: replay.save(f, c["updates"]))
                save_checkpoint(self.ckpt_dir, state, c["updates"], cfg.checkpoint.keep_last)
            except OSError as e:  # disk full, quota: one line, the previous checkpoint is intact; end the job
                sys.stderr.write(f"mpippo: error: checkpoint: writing update {c['updates']} of agent {self.agent} to "
                                 f"'{self.ckpt_dir}' failed ({e.strerror or e}); the previous checkpoint is intact\n")
                self.world.abort(1)

        received = 0
        illegal_moves = 0  # self-play: moves actors made into full columns (masking makes it 0)
        if pool is not None:
            if pool.members:  # resumed: every actor gets the whole pool again
                for m in pool.members:
                    ch.send_snapshot(m["id"], m["params"])
            else:
                snapshot()  # member 0: the starting network
            if not ratings:
                rate()
        ch.send_weights(c["updates"], weights(), table())
        seen_steps = {a: 0 for a in actors}  # env steps each actor had done at its latest chunk
        stop_sent = False
        reason = 0
        deadline = time.monotonic() + t.duration_hours * 3600 if t.duration_hours else None
        ck_every_s, last_ckpt = cfg.checkpoint.interval_minutes * 60, time.monotonic()
        t0 = last_log = time.perf_counter()
        last = {"received": 0, "updates": c["updates"]}
        updates0 = c["updates"]
        while not ch.all_done():
            for slot, actor, views, count in ch.poll():
                h = views["header"]
                if count:  # a last chunk may carry only episode statistics
                    replay.add(views["obs"][:count], views["actions"][:count], views["returns"][:count],
                               views["discounts"][:count], views["next_obs"][:count],
                               next_legal=views["next_legal"][:count])
                received += count
                seen_steps[actor] = max(seen_steps[actor], int(h[H_STEPS]))
                if h[H_EPISODES]:
                    c["episodes"] += int(h[H_EPISODES])
                    ret_window.append(float(h[H_RETSUM:H_RETSUM + 1].view(np.float64)[0]) / int(h[H_EPISODES]))
                    ret_window = ret_window[-100:]
                c["lag_sum"] += c["updates"] - int(h[H_VERSION])
                c["lag_n"] += 1
                if pool is not None:
                    for mid, w_, d_, l_ in views["results"]:
                        if mid == ILLEGAL:
                            illegal_moves += int(w_)
                        elif w_ or d_ or l_:
                            pool.record(int(mid), int(w_), int(d_), int(l_))
                ch.release(slot)
            # stop early: a signal here or at an actor, the time budget, or the episode budget
            reason = max(reason, signal_code(signals), ch.stop_reason(),
                         STOP_REASONS.index("duration") if deadline is not None and time.monotonic() >= deadline else 0)
            if not stop_sent and (reason or (d.max_episodes and c["episodes"] >= d.max_episodes)):
                ch.request_stop()
                stop_sent = True
            transitions = c["transitions"] + received
            if d.learning_steps_per_batch is not None:  # budget by episodes (the train_dqn() API)
                allowed = d.learning_steps_per_batch * c["episodes"] / d.episodes_per_batch
            else:  # budget by samples per env step
                allowed = d.replay_ratio * (transitions - d.learning_starts) / d.batch_size
            behind = not reason and replay.size >= d.learning_starts and c["updates"] < allowed
            if not behind:  # caught up, warming up, or stopping: let the actors send (their last) chunks
                ch.grant()
                time.sleep(0.0002)
                continue
            progress = max(transitions / (t.total_timesteps // d.num_agents), c["episodes"] / d.max_episodes if d.max_episodes else 0.0)
            beta = d.per_beta + (1.0 - d.per_beta) * min(1.0, progress)
            if t.anneal_lr:  # linearly to 0 over the run's budget (the last updates settle the policy)
                for group in opt.param_groups:
                    group["lr"] = t.learning_rate * max(1.0 - progress, 0.02)
            idx, batch, w = replay.sample(d.batch_size, beta)
            if d.mirror_augment:
                mirror_half(batch, aug_rng, self.num_actions)
            b = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
            with autocast(device, t.precision):
                q_all = q(b["obs"])
                with torch.no_grad():
                    q_next_target = target(b["next_obs"])
                    q_next_online = q(b["next_obs"]) if d.double else q_next_target
            q_all, q_next_target, q_next_online = q_all.float(), q_next_target.float(), q_next_online.float()
            next_legal = bits_to_mask(b["next_legal"], self.num_actions) if masked else None
            loss, td = double_dqn_loss(q_all, q_next_online, q_next_target, b["actions"], b["returns"],
                                       b["discounts"], torch.from_numpy(w).to(device), next_legal)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(q.parameters(), t.max_grad_norm)
            opt.step()
            replay.update_priorities(idx, td.cpu().numpy())
            c["updates"] += 1
            updates = c["updates"]
            maybe_inject(self.world.rank, updates - updates0)  # tests only: MPIPPO_FAULT, counted in this segment's updates
            if updates % d.target_update_period == 0:
                target.load_state_dict(q.state_dict())
            if pool is not None:
                if updates % sp.snapshot_interval_updates == 0:
                    snapshot()
                if sp.eval_interval_updates and updates % sp.eval_interval_updates == 0:
                    rate()
            if updates % d.weight_sync_period == 0:
                ch.send_weights(updates, weights(), table())
            now = time.perf_counter()
            if (d.checkpoint_interval_updates and updates % d.checkpoint_interval_updates == 0) or (
                    ck_every_s > 0 and time.monotonic() - last_ckpt >= ck_every_s):
                checkpoint(final=False)
                last_ckpt = time.monotonic()
            if now - last_log > 5.0:
                dt = now - last_log
                x = c["transitions"] + received
                if writer is not None:
                    writer.add_scalar("learner/updates_per_s", (updates - last["updates"]) / dt, x)
                    writer.add_scalar("learner/samples_per_s", (updates - last["updates"]) * d.batch_size / dt, x)
                    writer.add_scalar("charts/env_steps_per_s", (received - last["received"]) / dt, x)
                    writer.add_scalar("learner/replay_size", replay.size, x)
                    writer.add_scalar("losses/td_loss", float(loss.detach()), x)
                    writer.add_scalar("learner/weight_lag", c["lag_sum"] / max(c["lag_n"], 1), x)
                    if ret_window:
                        writer.add_scalar("charts/episode_return", float(np.mean(ret_window)), x)
                    if pool is not None:  # ratings of the acting policy, from the actors' games
                        writer.add_scalar("selfplay/learner_elo", pool.learner_rating, x)
                        writer.add_scalar("selfplay/lookahead_elo", pool.heuristics[-2]["rating"], x)
                        writer.add_scalar("selfplay/pool_size", len(pool.members), x)
                        writer.add_scalar("selfplay/snapshots", pool.snapshots_taken, x)
                        for name, score in pool.scores().items():  # (W + D/2) / games, over the run
                            writer.add_scalar(f"selfplay/acting_score_vs_{name}", score, x)
                last, last_log = {"received": received, "updates": updates}, now
                rated = (f" | elo {pool.learner_rating:6.0f} | pool {len(pool.members)} | greedy vs random "
                         f"{ratings[-1]['random']['win_rate']:.2f}, lookahead {ratings[-1]['lookahead']['win_rate']:.2f}"
                         if pool is not None else "")
                print(f"agent {self.agent} | {x:>10,} transitions | {updates:>8,} updates | "
                      f"return {np.mean(ret_window) if ret_window else float('nan'):6.2f} | replay {replay.size:,}{rated}",
                      flush=True)
        ch.finish()
        elapsed = time.perf_counter() - t0
        sent = {a: int(ch.stopped[a][0]) for a in actors}
        if sum(sent.values()) != received:
            raise RuntimeError(f"agent {self.agent}: actors sent {sum(sent.values())} transitions, learner got {received}")
        transitions = c["transitions"] + received
        if pool is not None and ratings[-1]["update"] != c["updates"]:
            rate()  # the final rating
        if writer is not None:
            if ret_window:
                writer.add_scalar("charts/episode_return", float(np.mean(ret_window)), transitions)
            writer.close()
        checkpoint(final=True)
        steps_segment = env_steps(final=True) - self.steps_before
        updates = c["updates"] - updates0
        summary = {
            "algo": "dqn", "env": cfg.env.name, "agent": self.agent, "world_size": self.world.size,
            "num_actors": self.num_actors, "num_envs_per_rank": self.num_envs,
            "total_timesteps": env_steps(final=True), "target_timesteps": t.total_timesteps // d.num_agents,
            "stop_reason": STOP_REASONS[reason], "resumes": self.resumes,
            "duration_s": elapsed, "fps": steps_segment / elapsed,
            "actor_steps_per_s": steps_segment / elapsed / self.num_actors,
            "learner_updates_per_s": updates / elapsed, "learner_samples_per_s": updates * d.batch_size / elapsed,
            "learner_device": str(device), "updates": c["updates"], "replay_size": replay.size,
            "replay_ratio": c["updates"] * d.batch_size / max(transitions, 1),
            "weight_lag": c["lag_sum"] / max(c["lag_n"], 1),
            "epsilons": eps.tolist(), "transitions_sent": sum(sent.values()), "transitions_received": received,
            "episode_return_mean": float(np.mean(ret_window)) if ret_window else None, "episodes": c["episodes"],
            "peak_rss_mb_learner": peak_rss_mb(), "git_commit": git_commit(),
        }
        if pool is not None:
            summary["selfplay"] = dict(pool.summary(), ratings=ratings, illegal_moves=illegal_moves)
        atomic_write_json(self.run_dir / "benchmark_metrics.json", summary)
        print(f"mpippo: agent {self.agent} {'finished' if not reason else 'stopped (' + STOP_REASONS[reason] + ')'}: "
              f"{summary['total_timesteps']:,} env steps ({steps_segment:,} in {elapsed:.1f} s, {summary['fps']:.0f} steps/s), "
              f"{c['updates']:,} updates ({summary['learner_samples_per_s']:.0f} samples/s), "
              f"replay ratio {summary['replay_ratio']:.2f}, return {summary['episode_return_mean']}, "
              f"transitions sent {summary['transitions_sent']:,} = received {received:,}", flush=True)
        if pool is not None:
            first, last_ = ratings[0], ratings[-1]
            print(f"mpippo: agent {self.agent} self-play: {pool.snapshots_taken} snapshots, pool {[m['id'] for m in pool.members]}, "
                  f"elo {pool.learner_rating:.0f}; greedy win rate vs random {first['random']['win_rate']:.2f} -> "
                  f"{last_['random']['win_rate']:.2f}, vs lookahead {first['lookahead']['win_rate']:.2f} -> "
                  f"{last_['lookahead']['win_rate']:.2f} ({sp.eval_games} games each)", flush=True)
        return summary
