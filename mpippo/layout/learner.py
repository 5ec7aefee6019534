"""The learner role: ingest chunks, update, sync weights, checkpoint, log; decide when to stop.

It never blocks on one actor: chunks are polled, credit is granted only while the algorithm's
update budget is met (so fast actors wait for a slow learner instead of flooding it), weights go
out every `weight_sync_period` updates without blocking, and the progress guard ends the job if
an actor that holds credit falls silent.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from mpippo import ckpt_schema as schema
from mpippo import hostmem
from mpippo.checkpoint import save_checkpoint, write_failed
from mpippo.files import atomic_write_with, write_metrics
from mpippo.comm.p2p import LearnerChannel
from mpippo.errors import CheckpointError, NonFiniteError
from mpippo.faults import maybe_inject, restore_delay
from mpippo.metrics.reporter import git_commit, peak_rss_mb
from mpippo.metrics import keys, tags
from mpippo.metrics.sinks import Sinks
from mpippo.metrics.timers import LEARNER_PHASES, Stopwatch
from mpippo.preemption import SignalFlags
from mpippo.runctl import STOP_REASONS, Deadline, EpisodeWindow, urgency
from mpippo.layout.actor import signal_reason

LOG_EVERY_S = 5.0  # TensorBoard points at least this often; console lines every logging.print_interval of these


class Learner:
    """One agent's learner. `algo` is the algorithm's learner half (ingest, updates_allowed, update,
    state_dict, ...); `hook` the self-play hook or None; `agent` carries the agent's facts (cfg, index,
    run folder, actors, budget, resume point)."""

    def __init__(self, agent, algo, ch: LearnerChannel, flat_params, hook=None):
        self.a, self.algo, self.ch, self.flat, self.hook = agent, algo, ch, flat_params, hook
        self.cfg, self.d = agent.cfg, agent.section  # cfg.dqn or cfg.appo: the layout's settings
        self.max_episodes = getattr(self.d, "max_episodes", 0)  # an episode budget: DQN's train_dqn() API
        # counters over the whole run (all segments); `received` is this segment's items (transitions,
        # or APPO's segments of T steps), so the run's transitions are c["transitions"] (before this
        # segment) + received x algo.steps_per_item
        self.c = {"updates": 0, "episodes": 0, "transitions": 0, "lag_sum": 0, "lag_n": 0}
        self.window = EpisodeWindow()
        self.received, self.reason, self.stop_sent, self.error = 0, 0, False, None
        self.seen_steps = {a: 0 for a in ch.actors}  # env steps each actor had done at its latest chunk
        self.deadline = Deadline(self.cfg.training.duration_hours)
        self.writer, self.loss = None, float("nan")
        self.first_log: tuple[float, int] | None = None  # (time, env steps) at the first log: fps_steady
        self.interval = [0.0, 0]  # return sum and count of the episodes finished since the last log
        self.timer = Stopwatch(LEARNER_PHASES)  # where the learner's time goes (metrics/timers.py)
        self.logged_phases = [0.0] * len(LEARNER_PHASES)  # the timer's vector at the last log

    @property
    def transitions(self) -> int:
        return self.c["transitions"] + self.received * self.algo.steps_per_item

    def weights(self) -> np.ndarray:
        return self.flat.detach().cpu().numpy()

    def table(self):
        return self.hook.table() if self.hook is not None else None

    # ---- resume ----
    def restore(self, st: dict) -> str:
        """Counters, episode window, algorithm and hook state from a checkpoint; a note for the start line."""
        restore_delay(self.a.job_rank)
        self.c.update(st["counters"])
        self.window.add(st["ret_window"])
        note = self.algo.load_state_dict(st, self.a.ckpt_dir, self.c["updates"])
        if self.hook is not None:  # (the runner checked that it has one)
            note += self.hook.load_state_dict(st["selfplay"])
        return note

    # ---- the loop ----
    def run(self, signals: SignalFlags) -> dict:
        """The loop; the caller has restored the learner (on a resume) and opened its logs."""
        self.updates0, self.t0 = self.c["updates"], time.perf_counter()
        self.last_log, self.last_print, self.last_ckpt = self.t0, self.t0, time.monotonic()
        # an algorithm whose updates are few and large (APPO) also logs every log_interval updates
        self.log_every = self.algo.log_every_updates
        self.last = {"received": 0, "updates": self.c["updates"]}
        if self.hook is not None:
            self.hook.start(self.ch.send_snapshot, self.weights(), self.c["updates"], self.transitions)
        self.ch.send_weights(self.c["updates"], self.weights(), self.table())
        while not self.ch.all_done():
            with self.timer("ingest"):
                self.ingest()
            self.decide_stop(signals)
            if not self.behind():  # caught up, warming up, or stopping: let the actors send (their last) chunks
                with self.timer("wait"):
                    self.ch.grant()
                    self.ch.check()
                    time.sleep(0.0002)
                continue
            self.step()
        return self.finish()

    def ingest(self) -> None:
        """Every chunk that arrived: into the algorithm, episodes into the window, results to the hook."""
        for slot, actor, views, count in self.ch.poll():
            h = views["header"]
            if count:  # a last chunk may carry only episode statistics
                self.algo.ingest(views, count)
            self.received += count
            self.seen_steps[actor] = max(self.seen_steps[actor], int(h["env_steps"]))
            if h["episodes"]:
                self.c["episodes"] += int(h["episodes"])
                returns = views["episode_returns"][:int(h["episodes"])]
                self.window.add(returns)
                self.interval = [self.interval[0] + float(returns.sum()), self.interval[1] + len(returns)]
            self.c["lag_sum"] += self.c["updates"] - int(h["version"])
            self.c["lag_n"] += 1
            if self.hook is not None:
                self.hook.record(views["results"])
            self.ch.release(slot)

    def decide_stop(self, signals: SignalFlags) -> None:
        """Stop early: a signal here or at an actor, the time budget, the episode budget, a failure."""
        duration = urgency("duration") if self.deadline.reached() else 0
        self.reason = max(self.reason, signal_reason(signals), self.ch.stop_reason(), duration)
        episodes_done = self.max_episodes and self.c["episodes"] >= self.max_episodes
        if not self.stop_sent and (self.reason or episodes_done or self.error):
            self.ch.request_stop()
            self.stop_sent = True

    def behind(self) -> bool:
        """True while the data received pays for more updates than were done (and nothing stops us)."""
        if self.reason or self.error:
            return False
        return self.c["updates"] < self.algo.updates_allowed(self.transitions, self.c["episodes"])

    def progress(self) -> float:
        per_agent = self.cfg.training.total_timesteps // self.d.num_agents
        by_episodes = self.c["episodes"] / self.max_episodes if self.max_episodes else 0.0
        return max(self.transitions / per_agent, by_episodes)

    def step(self) -> None:
        """One update, then what follows it on its schedule: hook, weights, checkpoint, log. An algorithm
        whose steps kept failing (non-finite loss) stops the agent with one line, exit 1, as a failed
        checkpoint does: the actors are told to stop and drained, nothing of the diverged state is saved."""
        try:
            with self.timer("update"):
                self.loss = self.algo.update(self.c["updates"], self.progress())
        except NonFiniteError as e:
            self.error = f"agent {self.a.index}: {e}"
            return
        self.c["updates"] += 1
        updates = self.c["updates"]
        maybe_inject(self.a.job_rank, updates - self.updates0)  # tests only: counted in this segment's updates
        with self.timer("send"):
            if self.hook is not None:
                self.hook.after_update(updates, self.transitions, self.ch.send_snapshot, self.weights)
            if updates % self.d.weight_sync_period == 0:
                self.ch.send_weights(updates, self.weights(), self.table())
        every_s = self.cfg.checkpoint.interval_minutes * 60
        if (self.d.checkpoint_interval_updates and updates % self.d.checkpoint_interval_updates == 0) or (
                every_s > 0 and time.monotonic() - self.last_ckpt >= every_s):
            with self.timer("checkpoint"):
                self.checkpoint(final=False)
            self.last_ckpt = time.monotonic()
        if time.perf_counter() - self.last_log > LOG_EVERY_S or (self.log_every and updates % self.log_every == 0):
            with self.timer("log"):
                self.log()
        self.ch.check()

    # ---- checkpoints ----
    def env_steps(self, final: bool) -> int:
        """Env steps of the run so far: exact from the STOP messages at the end, else from chunk headers."""
        per_actor = {a: int(self.ch.stopped[a][1]) for a in self.ch.actors} if final else self.seen_steps
        return self.a.steps_before + sum(per_actor.values())

    def checkpoint(self, final: bool) -> None:
        """Write the checkpoint (its side files first); a failure stops the agent with one line, exit 1."""
        a, c = self.a, self.c
        algo_state = self.algo.state_dict()  # (its optimizer's state among it)
        state = {**schema.top_level(self.algo.name, self.algo.model.state_dict(), algo_state.pop("optimizer"),
                                    self.env_steps(final), c["updates"], self.cfg.to_dict(), a.world_size, a.model_spec),
                 **algo_state, "agent": a.index,
                 "counters": dict(c, transitions=self.transitions), "ret_window": list(self.window.returns),
                 "resumes": a.resumes,
                 **({"selfplay": self.hook.state_dict()} if self.hook is not None else {})}
        try:
            named = self.algo.save_side_files(a.ckpt_dir, c["updates"], atomic_write_with)
            save_checkpoint(a.ckpt_dir, {**state, **named}, c["updates"], self.cfg.checkpoint.keep_last)
            self.algo.prune_side_files(a.ckpt_dir, named)  # (only now: latest.pt names the new ones)
        except OSError as e:  # disk full, quota: the previous checkpoint is intact
            self.error = write_failed(f"update {c['updates']} of agent {a.index}", Path(a.ckpt_dir), e)
            if final:
                raise CheckpointError(self.error) from None

    # ---- logs ----
    def open_logs(self) -> None:
        purge = self.c["transitions"] + 1 if self.a.resumes else None  # continue after the last logged point
        self.writer = Sinks(self.cfg, self.a.run_dir, purge_step=purge, wandb_run=self.a.wandb_run) or None
        if self.hook is not None:
            self.hook.writer = self.writer

    def log(self) -> None:
        now = time.perf_counter()
        if self.first_log is None:
            self.first_log = (now, self.env_steps(final=False))
        dt, x, updates = now - self.last_log, self.transitions, self.c["updates"]
        w, mean = self.writer, self.window.mean()
        if w is not None:
            done = updates - self.last["updates"]
            w.add_scalar(tags.learner("updates_per_s"), done / dt, x)
            w.add_scalar(tags.learner("samples_per_s"), done * self.algo.samples_per_update / dt, x)
            w.add_scalar(tags.chart("steps_per_s"), (self.received - self.last["received"]) * self.algo.steps_per_item / dt, x)
            w.add_scalar(tags.learner("weight_lag"), self.c["lag_sum"] / max(self.c["lag_n"], 1), x)
            self.algo.log(w, x, self.loss)
            self.log_phases(now)
            if self.interval[1]:  # as PPO: the episodes of this interval, and the last-100 window
                w.add_scalar(tags.chart("episode_return"), self.interval[0] / self.interval[1], x)
            if mean is not None:
                w.add_scalar(tags.chart("episode_return_mean"), mean, x)
            if self.hook is not None:
                self.hook.log(x)
        self.last, self.last_log = {"received": self.received, "updates": updates}, now
        self.interval = [0.0, 0]
        if now - self.last_print < LOG_EVERY_S * self.cfg.logging.print_interval:
            return
        self.last_print = now
        share = {p: 100 * s / max(now - self.t0, 1e-9) for p, s in self.timer.seconds.items()}
        print(f"agent {self.a.index} | {x:>10,} transitions | {updates:>8,} updates | return "
              f"{float('nan') if mean is None else mean:6.2f} | update {share['update']:.0f}% wait "
              f"{share['wait']:.0f}% | {self.algo.console()}"
              f"{self.hook.console() if self.hook is not None else ''}", flush=True)

    def log_phases(self, now: float) -> None:
        """TensorBoard: each phase's seconds since the last log (as sync PPO's time/<phase>_s)."""
        self.timer.add_other(now - self.t0)
        phases = self.timer.vector()
        for p, sec, before in zip(LEARNER_PHASES, phases, self.logged_phases):
            self.writer.add_scalar(tags.learner_phase(p), sec - before, self.transitions)
        self.logged_phases = phases

    # ---- the end ----
    def finish(self) -> dict:
        """Everything received: check it, rate, write the last checkpoint and the metrics."""
        self.ch.finish()
        sent = {a: int(self.ch.stopped[a][0]) for a in self.ch.actors}
        if sum(sent.values()) != self.received or self.ch.corrupted():
            bad = [self.ch.guard.world.job_rank(a) for a in self.ch.corrupted()]
            self.error = self.error or (f"agent {self.a.index}: actors sent {sum(sent.values()):,} items, the "
                                        f"learner got {self.received:,}; chunks from rank(s) {bad} arrived changed "
                                        f"(CRC mismatch); nothing of this segment is saved")
        if self.hook is not None:
            self.hook.finish(self.c["updates"], self.transitions)
        if self.writer is not None:
            if len(self.window):
                self.writer.add_scalar(tags.chart("episode_return_mean"), self.window.mean(), self.transitions)
            if self.interval[1]:
                self.writer.add_scalar(tags.chart("episode_return"), self.interval[0] / self.interval[1], self.transitions)
            if self.c["updates"] > self.updates0:  # the losses' last point (a short run may have logged none)
                self.algo.log(self.writer, self.transitions, self.loss)
            if self.hook is not None:  # (its points too: log() writes on a 5 s clock a fast run may beat)
                self.hook.log(self.transitions)
            self.log_phases(time.perf_counter())
            self.writer.close()
        if self.error is None:
            try:
                self.checkpoint(final=True)
            except CheckpointError:
                pass
        summary = self.summary(sent)
        write_metrics(self.a.run_dir, summary, keys.ACTOR_LEARNER)
        self.closing_lines(summary)
        return summary

    def summary(self, sent: dict) -> dict:
        a, c, d = self.a, self.c, self.d
        elapsed = time.perf_counter() - self.t0
        steps = self.env_steps(final=True) - a.steps_before
        updates = c["updates"] - self.updates0
        out = {
            "algo": self.algo.name, "env": self.cfg.env.name, "agent": a.index, "world_size": a.world_size,
            "num_actors": len(self.ch.actors), "num_envs_per_rank": a.num_envs,
            "total_timesteps": self.env_steps(final=True), "target_timesteps": self.cfg.training.total_timesteps // d.num_agents,
            "stop_reason": "failed" if self.error else STOP_REASONS[self.reason], "error": self.error,
            "resumes": a.resumes, "duration_s": elapsed, "fps": steps / elapsed,
            "actor_steps_per_s": steps / elapsed / len(self.ch.actors),
            "learner_updates_per_s": updates / elapsed,
            "learner_samples_per_s": updates * self.algo.samples_per_update / elapsed,
            "learner_device": str(self.algo.device), "updates": c["updates"],
            "weight_lag": c["lag_sum"] / max(c["lag_n"], 1), **self.algo.summary(c["updates"], self.transitions),
            "longest_credit_hold_s": self.ch.longest_hold_s, **self.phase_metrics(elapsed),
            "transitions_sent": sum(sent.values()) * self.algo.steps_per_item,
            "transitions_received": self.received * self.algo.steps_per_item,
            "episode_return_mean": self.window.mean(), "episodes": c["episodes"],
            "git_commit": git_commit(), "node_cpus": os.cpu_count(), "ranks_on_learner_node": a.ranks_on_node,
            **self.common(),
        }
        if self.hook is not None:
            out["selfplay"] = self.hook.summary()
        return out

    def phase_metrics(self, elapsed: float) -> dict:
        """`phase_seconds` (LEARNER_PHASES, the whole segment: they add up to duration_s) and each one's share."""
        self.timer.add_other(elapsed)
        sec = dict(self.timer.seconds)
        return {"phase_seconds": sec, "phase_share": {p: v / max(elapsed, 1e-9) for p, v in sec.items()}}

    def common(self) -> dict:
        """The keys every run's metrics hold (metrics/keys.py) as this agent knows them."""
        t, a = self.cfg.training, self.a
        rss = [peak_rss_mb()] + [int(self.ch.stopped[x][5]) / 1024 if x in self.ch.stopped else 0.0
                                 for x in self.ch.actors]
        steady = None
        if self.first_log is not None and time.perf_counter() > self.first_log[0]:
            now = time.perf_counter()
            steady = (self.env_steps(final=True) - self.first_log[1]) / (now - self.first_log[0])
        return {"fps_steady": steady, "peak_rss_mb_per_rank": rss, "peak_rss_mb_total": float(sum(rss)),
                "finished": not self.error and STOP_REASONS[self.reason] == "done", "device_used": str(self.algo.device),
                "precision": t.precision, "deterministic": t.deterministic,
                "threads_per_rank": self.cfg.parallel.threads_per_rank, "affinity_cores": a.affinity,
                "cpu_share": a.cpu_share, "env_threads": 0,  # actors step their envs in their own thread
                "host_allocator": hostmem.current()}

    def closing_lines(self, s: dict) -> None:
        """The agent's summary line (its error, if any, is the job's to print once: cli)."""
        state = "finished" if not self.reason and not self.error else f"stopped ({s['stop_reason']})"
        ret = "-" if s["episode_return_mean"] is None else f"{s['episode_return_mean']:.2f}"
        print(f"mpippo: agent {self.a.index} {state}: {s['total_timesteps']:,} env steps "
              f"({s['total_timesteps'] - self.a.steps_before:,} in {s['duration_s']:.1f} s, {s['fps']:.0f} steps/s), "
              f"{s['updates']:,} updates ({s['learner_samples_per_s']:.0f} samples/s), {self.algo.closing_note(s)}, "
              f"return {ret}, transitions sent {s['transitions_sent']:,} = received {s['transitions_received']:,}",
              flush=True)
        if self.hook is not None:
            print(self.hook.closing_line(self.a.index), flush=True)

