"""Scaling analysis of a sweep (analysis/scaling_sweep.py -> sweep.json), used by scaling.ipynb.

Measured: throughput, speedup and parallel efficiency per rank count, the time of every phase
on every rank, and the allreduce time each rank saw. Derived:
  - wait for the slowest rank: a rank's allreduce time minus the smallest of any rank (the
    slowest rank arrives last and waits least; the difference is time spent waiting for it);
  - Karp-Flatt serial fraction e(p) = (1/S - 1/p) / (1 - 1/p): flat e = a fixed serial part,
    growing e = overhead that grows with p (communication, stragglers);
  - Amdahl fit S(p) = 1 / (f + (1 - f) / p), least squares over the measured points;
  - a communication model: one ring Allreduce of B bytes over p ranks takes
    2 (p - 1) alpha + 2 (p - 1) / p * B / beta (latency alpha per message, bandwidth beta), and
    an iteration does `calls` of them on top of the measured compute time per rank, so
    throughput(p) = p * steps per rank per iteration / (compute + calls * allreduce(p)).
    Stragglers and contention are left out: the projection is an upper bound.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toolcli import COUNT, NUMBER, TEXT, Maybe, conform, shown  # noqa: E402

from mpippo.config import ConfigError  # noqa: E402
from mpippo.files import check_metrics, read_json  # noqa: E402

PHASES = ("env_step", "inference", "gae", "backward", "allreduce", "optimizer", "other")
# what the model reads of a sweep (analysis/scaling_sweep.py's sweep.json: a run's metrics per size)
RUN_SPEC = {"world_size": COUNT, "fps": NUMBER, "fps_steady": Maybe(NUMBER), "iterations": Maybe(COUNT),
            "num_envs_per_rank": COUNT, "n_steps": COUNT, "phase_seconds": {p: NUMBER for p in PHASES},
            "phase_seconds_per_rank": {"allreduce": [NUMBER]}, "allreduce_bytes": Maybe(NUMBER),
            "allreduce_calls_per_iteration": Maybe(NUMBER)}
SWEEP_SPEC = {"mode": TEXT, "cores": Maybe(COUNT), "runs": [RUN_SPEC]}
# (latency alpha in s, bandwidth beta in bytes/s) per link; effective figures, not line rates
NETWORKS = {"InfiniBand HDR (200 Gb/s)": (1.5e-6, 23e9), "10 GbE": (25e-6, 1.15e9)}


def read_sweep(path: str | Path) -> dict:
    """A sweep.json, checked: what load_sweep uses is there and typed, every run's metrics as
    mpippo/files.py checks them, measured throughput > 0; else one ConfigError line naming the file."""
    path = Path(path)
    sweep = conform(read_json(path, "sweep file"), SWEEP_SPEC, path, "sweep file")
    for i, m in enumerate(sweep["runs"]):
        try:
            check_metrics(m, path)
        except ConfigError as e:  # "metrics file '<path>': <key>: ..." -> "sweep file '<path>': runs[i].<key>: ..."
            why = e.errors[0].removeprefix(f"metrics file '{shown(path)}': ")
            raise ConfigError(f"sweep file '{shown(path)}': runs[{i}].{why}") from None
        if not (m.get("fps_steady") or m["fps"]) > 0:
            raise ConfigError(f"sweep file '{shown(path)}': runs[{i}].fps: expected a measured throughput > 0, "
                              f"got {m['fps']}")
    return sweep


def load_sweep(path: str | Path) -> dict:
    sweep = read_sweep(path)
    runs = sorted(sweep["runs"], key=lambda m: m["world_size"])
    p = np.array([m["world_size"] for m in runs], dtype=float)
    fps = np.array([m.get("fps_steady") or m["fps"] for m in runs], dtype=float)
    speedup = fps / fps[0] * p[0]  # relative to one rank (scaled when the sweep starts higher)
    phases = {ph: np.array([m["phase_seconds"][ph] for m in runs]) for ph in PHASES}
    iters = np.array([max(m.get("iterations", 1), 1) for m in runs], dtype=float)
    per_rank_allreduce = [np.array(m["phase_seconds_per_rank"]["allreduce"]) for m in runs]
    total = sum(phases.values())
    return {
        "mode": sweep["mode"], "cores": sweep.get("cores"), "ranks": p, "fps": fps, "speedup": speedup,
        "efficiency": speedup / p, "phases": phases, "phase_share": {k: v / total for k, v in phases.items()},
        "iterations": iters, "allreduce_per_rank": per_rank_allreduce,
        "wait_per_rank": [a - a.min() for a in per_rank_allreduce],
        "allreduce_share": phases["allreduce"] / total,
        "steps_per_rank_iteration": np.array([m["num_envs_per_rank"] * m["n_steps"] for m in runs], dtype=float),
        "allreduce_bytes": runs[0].get("allreduce_bytes", 4 * (626_256 + 2)),
        "allreduce_calls": runs[0].get("allreduce_calls_per_iteration", 24),
        "oversubscribed": p > (sweep.get("cores") or np.inf),
    }


def karp_flatt(speedup: np.ndarray, p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        e = (1.0 / speedup - 1.0 / p) / (1.0 - 1.0 / p)
    return np.where(p > 1, e, np.nan)


def amdahl_fit(p: np.ndarray, speedup: np.ndarray) -> float:
    """Serial fraction f in [0, 1] that best fits the measured speedups (grid + refinement)."""
    grid = np.linspace(0.0, 1.0, 10001)
    pred = 1.0 / (grid[:, None] + (1.0 - grid[:, None]) / p[None, :])
    return float(grid[np.argmin(((pred - speedup[None, :]) ** 2).sum(1))])


def amdahl(p, f: float):
    return 1.0 / (f + (1.0 - f) / np.asarray(p, dtype=float))


def ring_allreduce_seconds(p, nbytes: float, alpha: float, beta: float):
    p = np.asarray(p, dtype=float)
    return np.where(p > 1, 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta, 0.0)


def project(s: dict, ranks=(1, 2, 4, 8, 16, 48, 96, 480), networks=NETWORKS) -> dict:
    """Projected weak-scaling throughput from the measured compute time per iteration of the
    smallest non-oversubscribed run (its allreduce time removed)."""
    i = 0
    compute = (sum(s["phases"].values())[i] - s["phases"]["allreduce"][i]) / s["iterations"][i]
    steps = s["steps_per_rank_iteration"][i]
    ranks = np.array(ranks, dtype=float)
    out = {"ranks": ranks, "compute_s_per_iteration": compute, "ideal": ranks * steps / compute}
    for name, (alpha, beta) in networks.items():
        t = compute + s["allreduce_calls"] * ring_allreduce_seconds(ranks, s["allreduce_bytes"], alpha, beta)
        out[name] = ranks * steps / t
    return out
