"""Rank-0 outputs: TensorBoard scalars, benchmark_metrics.json, progress bar and console lines.

Ranks contribute a fixed-layout float64 vector (the fields of `FIELDS`, filled by the sync runner's
`report()`); one Gather brings them to rank 0, which turns them into count-weighted means over ranks.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mpippo.files import read_metrics, write_metrics
from mpippo.usage import UsageError
from mpippo import hostmem
from mpippo.algos import registry
from mpippo.metrics import keys, tags
from mpippo.metrics.sinks import Sinks
from mpippo.metrics.timers import PHASES, SUMMARY_LEN, StragglerStats

# layout of the per-rank vector gathered to rank 0; it ends with PhaseTimer.summary() (per-iteration
# times for the straggler statistics), which so rides this Gather instead of a collective of its own
FIELDS = ("ep_ret_sum", "ep_count", "ep_len_sum", "win_ret_sum", "win_count", "episodes_total",
          "pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "updates", "skipped",
          "ev_n", "ev_sum_y", "ev_sum_y2", "ev_sum_r", "ev_sum_r2",
          "peak_rss_mb", "cpu_seconds", "replica_checks") + tuple(f"t_{p}" for p in PHASES) + \
         tuple(f"iter_{i}" for i in range(SUMMARY_LEN))
IDX = {name: i for i, name in enumerate(FIELDS)}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def cpu_seconds() -> float:
    t = resource.getrusage(resource.RUSAGE_SELF)
    return t.ru_utime + t.ru_stime


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _fmt_duration(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Reporter:
    """Lives on rank 0 only."""

    def __init__(self, cfg, run_dir: Path, world_size: int, hosts: list[tuple[str, str]], start_step: int,
                 start_iteration: int, total_timesteps: int, progress: bool, wandb_run=None):
        self.cfg, self.run_dir, self.world_size = cfg, run_dir, world_size
        self.losses = registry.get(cfg.training.algo).logs  # (the losses its algorithm logs)
        self.hostnames, self.nodes = [h for h, _ in hosts], [n for _, n in hosts]
        self.total = total_timesteps
        self.start_step, self.t0 = start_step, time.perf_counter()
        self.prev = None  # previous gathered matrix, for per-interval phase deltas
        self.prev_step, self.prev_t = start_step, self.t0
        self.last = {}
        self.first_log = None  # (time, step) at the first logged iteration: start of steady state
        self.commit = git_commit()
        self.extra: dict = {}  # set by the runner: facts of the job that the metrics file should carry
        self.stragglers = StragglerStats(world_size)
        self.writer = Sinks(cfg, run_dir, purge_step=start_step + 1 if start_iteration > 0 else None,
                            wandb_run=wandb_run) or None
        self.bar = None
        if progress:
            from tqdm import tqdm
            self.bar = tqdm(total=total_timesteps, initial=start_step, unit="step", unit_scale=True,
                            **_bar_width(), file=sys.stderr, smoothing=0.1, mininterval=1.0,
                            # on a terminal only; under mpirun the launcher says whether there is one
                            disable=False if os.environ.get("MPIPPO_TTY") == "1" else None)

    def progress(self, global_step: int) -> None:
        if self.bar is not None:
            self.bar.update(global_step - self.bar.n)

    def log(self, M: np.ndarray, global_step: int, iteration: int, lr: float, print_line: bool) -> dict:
        """M: (world_size, len(FIELDS)) cumulative/interval stats of every rank."""
        col = lambda name: M[:, IDX[name]]
        now = time.perf_counter()
        ep_count = col("ep_count").sum()
        win_count = col("win_count").sum()
        ev_n = col("ev_n").sum()
        var_y = col("ev_sum_y2").sum() / ev_n - (col("ev_sum_y").sum() / ev_n) ** 2
        var_r = col("ev_sum_r2").sum() / ev_n - (col("ev_sum_r").sum() / ev_n) ** 2
        phases = np.stack([col(f"t_{p}") for p in PHASES], axis=1)  # cumulative seconds (ranks, phases)
        d_phases = phases - (self.prev if self.prev is not None else 0.0)
        self.stragglers.add(M[:, IDX["iter_0"]:])
        self.prev = phases
        interval_fps = (global_step - self.prev_step) / max(now - self.prev_t, 1e-9)
        self.prev_step, self.prev_t = global_step, now
        elapsed = now - self.t0
        if self.first_log is None:
            self.first_log = (now, global_step)
        t_first, step_first = self.first_log
        m = {
            "iteration": iteration,
            "timesteps": global_step,
            "episode_return": float(col("ep_ret_sum").sum() / ep_count) if ep_count else None,
            "episode_length": float(col("ep_len_sum").sum() / ep_count) if ep_count else None,
            "episode_return_mean": float(col("win_ret_sum").sum() / win_count) if win_count else None,
            "episodes": int(col("episodes_total").sum()),
            "policy_loss": float(col("pg_loss").mean()), "value_loss": float(col("v_loss").mean()),
            "entropy": float(col("entropy").mean()), "approx_kl": float(col("approx_kl").mean()),
            "clipfrac": float(col("clipfrac").mean()),
            "explained_variance": float(1.0 - var_r / var_y) if var_y > 0 else float("nan"),
            "skipped_steps": int(col("skipped").max()),
            "replica_checks": int(col("replica_checks").min()),  # a global decision: every rank skipped the same steps
            "learning_rate": lr, "steps_per_s": interval_fps,
            "fps": (global_step - self.start_step) / max(elapsed, 1e-9),
            "fps_steady": (global_step - step_first) / (now - t_first) if now > t_first else None,
            "elapsed_s": elapsed,
            "phase_seconds": dict(zip(PHASES, phases.mean(0).tolist())),
            "phase_seconds_per_rank": {p: phases[:, i].tolist() for i, p in enumerate(PHASES)},
            "interval_phase_seconds": dict(zip(PHASES, d_phases.mean(0).tolist())),
            "peak_rss_mb_per_rank": col("peak_rss_mb").tolist(),
            "cpu_percent_per_rank": (100.0 * col("cpu_seconds") / max(elapsed, 1e-9)).tolist(),
        }
        self.last = m
        if self.writer is not None:
            w, s = self.writer, global_step
            for key in ("episode_return", "episode_length", "episode_return_mean"):
                if m[key] is not None:
                    w.add_scalar(tags.chart(key), m[key], s)
            for key in self.losses:
                w.add_scalar(tags.loss(key), m[key], s)
            w.add_scalar(tags.chart("learning_rate"), lr, s)
            w.add_scalar(tags.chart("skipped_steps"), m["skipped_steps"], s)
            w.add_scalar(tags.chart("steps_per_s"), interval_fps, s)
            w.add_scalar(tags.chart("peak_rss_mb_max_rank"), max(m["peak_rss_mb_per_rank"]), s)
            for p, sec in m["interval_phase_seconds"].items():
                w.add_scalar(tags.phase(p), sec, s)
        if self.bar is not None:
            ret = m["episode_return_mean"]
            self.bar.set_postfix_str(f"return {ret:.2f}" if ret is not None else "return -", refresh=False)
        if print_line:
            ret = m["episode_return_mean"]
            eta = (self.total - global_step) / max(m["fps"], 1e-9)
            hours = self.cfg.training.duration_hours
            if hours:  # timed training ends at whichever budget comes first
                eta = min(eta, max(hours * 3600 - elapsed, 0.0))
            line = (f"iter {iteration:5d} | {global_step:>11,} steps | return(100) "
                    f"{'   -  ' if ret is None else f'{ret:6.2f}'} | {interval_fps:8.1f} steps/s | "
                    f"kl {m['approx_kl']:.4f} | elapsed {_fmt_duration(elapsed)} | ETA {_fmt_duration(eta)}")
            (self.bar.write if self.bar is not None else print)(line)
        return m

    def write_benchmark(self, done: bool, stop_reason: str | None = None) -> dict:
        """benchmark_metrics.json from what this job logged. A job that logged nothing (a resume of a
        run already at its budget: no iteration runs) keeps the run's earlier file, which holds its
        figures, and returns it; only a missing or unreadable one is written anew."""
        if not self.last:
            try:
                return read_metrics(self.run_dir)
            except UsageError:
                pass
        cfg, m = self.cfg, self.last
        rss = m.get("peak_rss_mb_per_rank", [peak_rss_mb()])
        cpu = m.get("cpu_percent_per_rank", [0.0])
        out = {
            "algo": cfg.training.algo, "env": cfg.env.name, "world_size": self.world_size,
            "num_envs_per_rank": cfg.env.num_envs_per_rank, "num_envs": cfg.env.num_envs,
            "n_steps": cfg.training.n_steps, "total_timesteps": m.get("timesteps", self.start_step),
            "target_timesteps": cfg.training.total_timesteps, "iterations": m.get("iteration", 0),
            "duration_s": m.get("elapsed_s", 0.0), "fps": m.get("fps", 0.0),
            "fps_steady": m.get("fps_steady"),  # excludes the first iteration (warm-up)
            "phase_seconds": m.get("phase_seconds", {}), "phase_seconds_per_rank": m.get("phase_seconds_per_rank", {}),
            "peak_rss_mb_per_rank": rss, "peak_rss_mb_total": float(sum(rss)),
            "cpu_percent": float(np.mean(cpu)), "cpu_percent_per_rank": cpu,
            "episode_return_mean": m.get("episode_return_mean"), "episodes": m.get("episodes", 0),
            "replica_checks": m.get("replica_checks", 0),
            "hostnames": self.hostnames, "nodes": self.nodes, "git_commit": self.commit, "finished": done,
            "stop_reason": stop_reason,
            "device": cfg.training.device, "precision": cfg.training.precision,
            "threads_per_rank": cfg.parallel.threads_per_rank, "host_allocator": hostmem.current(),
            **self.stragglers.metrics(), **self.extra,
        }
        return write_metrics(self.run_dir, out, keys.SYNC_PPO)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


def _bar_width() -> dict:
    """The bar's width: the terminal's, or under the launcher (stderr a pipe to mpirun, which tqdm cannot
    measure: it drew 140 columns on a 5-column terminal) the COLUMNS it passes with MPIPPO_TTY."""
    cols = os.environ.get("COLUMNS", "") if os.environ.get("MPIPPO_TTY") == "1" else ""
    if cols.isascii() and cols.isdigit() and 0 < int(cols) <= 10_000:
        return {"ncols": int(cols), "dynamic_ncols": False}
    return {"dynamic_ncols": True}
