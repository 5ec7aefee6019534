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
    Contention is left out.
  - a straggler term (issue 31): the ranks step in lockstep, so an iteration's busy part
    (rollout + update: env_step, inference, backward, optimizer) lasts as long as the slowest
    rank's. Each rank's busy time is modeled as the iteration's mean times an independent draw
    z from the measured distribution of busy time over the iteration's mean over ranks (the
    run's `straggler_busy_rel`, mpippo/metrics/timers.py), and the busy part at p ranks as
    mean * E[max of p draws] / E[z]. The draws are the measured distribution itself
    (resampling; the expectation over all resamples is computed exactly, not by Monte Carlo),
    so it can never exceed the largest deviation measured: at p much larger than the sample
    it is a floor. A normal fit of the same deviations extrapolates the tail instead. A slow
    node multiplies the draws of its ranks (NODE_RANKS of them) by its slowdown.
    Modeled, not measured: no run here had more than a few ranks.
"""
from __future__ import annotations

import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mpippo, without an install
from mpippo.toolcli import COUNT, NUMBER, TEXT, Maybe, conform, shown  # noqa: E402

from mpippo.usage import UsageError  # noqa: E402
from mpippo.files import check_metrics, read_json  # noqa: E402
from mpippo.metrics.timers import PARTS, PHASES, REL_PROBS as WRITTEN_AT  # noqa: E402 (what the runs wrote)

# what the model reads of a sweep (analysis/scaling_sweep.py's sweep.json: a run's metrics per size)
RUN_SPEC = {"world_size": COUNT, "fps": NUMBER, "fps_steady": Maybe(NUMBER), "iterations": Maybe(COUNT),
            "num_envs_per_rank": COUNT, "n_steps": COUNT, "phase_seconds": {p: NUMBER for p in PHASES},
            "phase_seconds_per_rank": {"allreduce": [NUMBER]}, "allreduce_bytes": Maybe(NUMBER),
            "allreduce_calls_per_iteration": Maybe(NUMBER), "straggler_busy_rel": Maybe([NUMBER])}
SWEEP_SPEC = {"mode": TEXT, "cores": Maybe(COUNT), "runs": [RUN_SPEC]}
# (latency alpha in s, bandwidth beta in bytes/s) per link; effective figures, not line rates
NETWORKS = {"InfiniBand HDR (200 Gb/s)": (1.5e-6, 23e9), "10 GbE": (25e-6, 1.15e9)}
BUSY = PARTS["rollout"] + PARTS["update"]  # no collective inside: a rank's own pace
NODE_RANKS = 48  # ranks per node (slurm/ppo_multinode.sh: 48-core nodes, one rank per core)
SLOW_NODE = 1.3  # the slow-node scenario: one node's ranks take 30% longer
REL_PROBS = np.asarray(WRITTEN_AT)  # the probabilities straggler_busy_rel is written at


def read_sweep(path: str | Path) -> dict:
    """A sweep.json, checked: what load_sweep uses is there and typed, every run's metrics as
    mpippo/files.py checks them, measured throughput > 0; else one UsageError line naming the file."""
    path = Path(path)
    sweep = conform(read_json(path, "sweep file"), SWEEP_SPEC, path, "sweep file")
    for i, m in enumerate(sweep["runs"]):
        try:
            check_metrics(m, path)
        except UsageError as e:  # "metrics file '<path>': <key>: ..." -> "sweep file '<path>': runs[i].<key>: ..."
            why = e.errors[0].removeprefix(f"metrics file '{shown(path)}': ")
            raise UsageError(f"sweep file '{shown(path)}': runs[{i}].{why}") from None
        if not (m.get("fps_steady") or m["fps"]) > 0:
            raise UsageError(f"sweep file '{shown(path)}': runs[{i}].fps: expected a measured throughput > 0, "
                              f"got {m['fps']}")
        if len(m["phase_seconds_per_rank"]["allreduce"]) != m["world_size"]:
            raise UsageError(f"sweep file '{shown(path)}': runs[{i}].phase_seconds_per_rank.allreduce: expected one "
                              f"time per rank ({m['world_size']}), got {len(m['phase_seconds_per_rank']['allreduce'])}")
        if (why := rel_problem(m.get("straggler_busy_rel"))):
            raise UsageError(f"sweep file '{shown(path)}': runs[{i}].straggler_busy_rel: {why}")
    return sweep


def rel_problem(busy_rel) -> str | None:
    """What makes a straggler_busy_rel unusable (None when absent or fine): the quantiles at
    REL_PROBS of busy time over the mean, finite, positive and nondecreasing."""
    if busy_rel is None:
        return None
    q = np.asarray(busy_rel, dtype=float)
    if q.shape != REL_PROBS.shape:
        return f"expected {len(REL_PROBS)} quantiles, got {len(q)}"
    if not np.all(np.isfinite(q)) or np.any(q <= 0) or np.any(np.diff(q) < 0):
        return "expected positive, finite, nondecreasing quantiles (busy time over the mean)"
    return None


def load_sweep(path: str | Path) -> dict:
    sweep = read_sweep(path)
    runs = sorted(sweep["runs"], key=lambda m: m["world_size"])
    p = np.array([m["world_size"] for m in runs], dtype=float)
    fps = np.array([m.get("fps_steady") or m["fps"] for m in runs], dtype=float)
    speedup = fps / fps[0] * p[0]  # relative to one rank (scaled when the sweep starts higher)
    phases = {ph: np.array([m["phase_seconds"][ph] for m in runs]) for ph in PHASES}
    iters = np.array([max(m.get("iterations") or 1, 1) for m in runs], dtype=float)  # (null: not recorded)
    per_rank_allreduce = [np.array(m["phase_seconds_per_rank"]["allreduce"]) for m in runs]
    total = sum(phases.values())
    return {
        "mode": sweep["mode"], "cores": sweep.get("cores"), "ranks": p, "fps": fps, "speedup": speedup,
        "efficiency": speedup / p, "phases": phases, "phase_share": {k: v / total for k, v in phases.items()},
        "iterations": iters, "allreduce_per_rank": per_rank_allreduce,
        "wait_per_rank": [a - a.min() for a in per_rank_allreduce],
        "allreduce_share": phases["allreduce"] / total,
        "steps_per_rank_iteration": np.array([m["num_envs_per_rank"] * m["n_steps"] for m in runs], dtype=float),
        "allreduce_bytes": runs[0].get("allreduce_bytes") or 4 * (626_256 + 2),  # (absent or null: the default
        "allreduce_calls": runs[0].get("allreduce_calls_per_iteration") or 24,  # network's, as sweeps before them)
        "oversubscribed": p > (sweep.get("cores") or np.inf),
        "straggler_runs": [(int(m["world_size"]), m["straggler_busy_rel"]) for m in runs
                           if m.get("straggler_busy_rel") and m["world_size"] > 1
                           and m["world_size"] <= (sweep.get("cores") or np.inf)],
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


def project(s: dict, ranks=(1, 2, 4, 8, 16, 48, 96, 480), networks=NETWORKS, straggle=None) -> dict:
    """Projected weak-scaling throughput from the measured compute time per iteration of the
    smallest non-oversubscribed run (its allreduce time removed). straggle: p -> the factor by
    which the busy part of an iteration grows at p ranks (straggler_factor); None: even ranks."""
    i = 0
    compute = (sum(s["phases"].values())[i] - s["phases"]["allreduce"][i]) / s["iterations"][i]
    busy = sum(s["phases"][ph][i] for ph in BUSY) / s["iterations"][i]
    steps = s["steps_per_rank_iteration"][i]
    ranks = np.array(ranks, dtype=float)
    factor = np.array([straggle(int(p)) if straggle else 1.0 for p in ranks])
    compute_p = compute + busy * (factor - 1.0)
    out = {"ranks": ranks, "compute_s_per_iteration": compute, "busy_s_per_iteration": busy,
           "straggler_factor": factor, "ideal": ranks * steps / compute}
    for name, (alpha, beta) in networks.items():
        t = compute_p + s["allreduce_calls"] * ring_allreduce_seconds(ranks, s["allreduce_bytes"], alpha, beta)
        out[name] = ranks * steps / t
    return out


# ---- stragglers ----
def rel_samples(busy_rel, world_size: int, points: int = 2000) -> np.ndarray:
    """The measured straggler_busy_rel (quantiles at REL_PROBS) as `points` equally likely values.
    A rank's time was divided by the mean over the run's ranks, itself among them, which pulls it
    towards the mean: with R ranks of independent deviations the measured ones are sqrt((R-1)/R)
    of the deviations from the true mean, so they are widened by sqrt(R/(R-1)) (2 ranks: x1.41)."""
    q = np.asarray(busy_rel, dtype=float)
    if (why := rel_problem(q)):  # read_sweep and straggler_source checked theirs: a caller's own data
        raise UsageError(f"straggler_busy_rel: {why}")
    u = (np.arange(points) + 0.5) / points
    z = np.interp(u, REL_PROBS, q)
    widen = np.sqrt(world_size / (world_size - 1)) if world_size > 1 else 1.0
    return 1.0 + (z - z.mean()) * widen


def normal_samples(samples, points: int = 2000) -> np.ndarray:
    """A normal distribution of the samples' mean and standard deviation, as `points` equally
    likely values: the tail beyond the largest measured deviation, extrapolated."""
    x = np.asarray(samples, dtype=float)
    dist = NormalDist(float(x.mean()), float(x.std()) or 1e-300)
    return np.array([dist.inv_cdf((k + 0.5) / points) for k in range(points)])


def expected_max(samples, groups) -> float:
    """E[max over all ranks] where groups = [(ranks, scale), ...]: every rank's time is `scale`
    times an independent draw from `samples` (equally likely values). Exact: the maximum's
    distribution function is the product of the ranks' ones, prod F(t / scale) ** ranks."""
    x = np.sort(np.asarray(samples, dtype=float))
    groups = [(int(n), float(c)) for n, c in groups if n > 0]
    support = np.unique(np.concatenate([c * x for _, c in groups]))
    cdf = np.ones_like(support)
    for n, c in groups:  # (1 + 1e-12): c * x / c must find x itself
        cdf *= (np.searchsorted(x, support / c * (1 + 1e-12), side="right") / len(x)) ** n
    return float(np.sum(support * np.diff(cdf, prepend=0.0)))


def straggler_factor(samples, ranks: int, slow: float = 1.0, node_ranks: int = NODE_RANKS) -> float:
    """How much longer the busy part of an iteration lasts at `ranks` ranks than one rank's mean:
    E[max of `ranks` draws] / E[draw]; with slow > 1, one node of `node_ranks` ranks (all of them
    when fewer) runs that much slower. A constant distribution gives 1 (times slow)."""
    x = np.asarray(samples, dtype=float)
    n_slow = min(node_ranks, ranks) if slow != 1.0 else 0
    return expected_max(x, [(n_slow, slow), (ranks - n_slow, 1.0)]) / float(x.mean())


def straggler_source(s: dict, fallback: str | Path) -> tuple[int, list, str]:
    """(ranks, straggler_busy_rel, where from): the sweep's largest run that measured it on its own
    cores, else the run metrics at `fallback` (a benchmark_metrics.json)."""
    if s["straggler_runs"]:
        ranks, rel = s["straggler_runs"][-1]
        return ranks, rel, f"this sweep's {ranks}-rank run"
    m = conform(read_json(Path(fallback), "metrics file"), {"world_size": COUNT, "straggler_busy_rel": [NUMBER]},
                Path(fallback))
    if (why := rel_problem(m["straggler_busy_rel"])):
        raise UsageError(f"metrics file '{shown(Path(fallback))}': straggler_busy_rel: {why}")
    return m["world_size"], m["straggler_busy_rel"], f"{m['world_size']}-rank run in {shown(Path(fallback))}"


def straggler_scenarios(s: dict, samples, ranks=(1, 2, 4, 8, 16, 48, 96, 480)) -> dict:
    """The projections with and without stragglers: name -> project()'s output."""
    fit = normal_samples(samples)
    return {
        "even ranks (no stragglers)": project(s, ranks),
        "stragglers, resampled": project(s, ranks, straggle=lambda p: straggler_factor(samples, p)),
        "stragglers, normal fit": project(s, ranks, straggle=lambda p: straggler_factor(fit, p)),
        f"one node {SLOW_NODE - 1:.0%} slower": project(s, ranks, straggle=lambda p: straggler_factor(
            np.ones(1), p, SLOW_NODE)),
        f"one node {SLOW_NODE - 1:.0%} slower + stragglers": project(s, ranks, straggle=lambda p: straggler_factor(
            samples, p, SLOW_NODE)),
    }
