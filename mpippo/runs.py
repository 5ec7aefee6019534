"""Reading mpippo run folders for the analysis tools: metrics, curves, and what kind of run it is.

A run folder holds benchmark_metrics.json (rewritten as the run goes), config.yaml and logs/
(TensorBoard). A multi-agent DQN run holds one such folder per agent (agent_<k>/). Runs that
are still going or were resumed are fine: metrics are the latest written, curves are read from
the event files (a resume purges the steps it repeats, so each step appears once).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mpippo.errors import os_reason
from mpippo.usage import UsageError, reason
from mpippo.metrics.tags import chart, readable
from mpippo.files import LOGS, METRICS, RUN_CONFIG, not_utf8, read_metrics, read_run_config
from mpippo.toolcli import COUNT, NUMBER, TEXT, Maybe, conform, shown


class NotARun(UsageError):
    """A folder that is not an mpippo run, or whose files are damaged: one line naming it."""


# the metrics keys the tools use beyond those mpippo/files.py checks
METRICS_USED = {"algo": Maybe(TEXT), "env": Maybe(TEXT), "device": Maybe(TEXT), "device_used": Maybe(TEXT),
                "precision": Maybe(TEXT),
                "peak_rss_mb_total": Maybe(NUMBER), "peak_rss_mb_learner": Maybe(NUMBER),
                # sync PPO's straggler statistics (compare_results prints them); absent in older runs
                **{k: Maybe({q: NUMBER for q in ("p50", "p90", "p99", "max")})
                   for k in ("straggler_spread", "straggler_wait_s")},
                "straggler_slowest_rank": Maybe(COUNT), "straggler_slowest_counts": Maybe([COUNT])}


@dataclass
class Run:
    path: Path
    name: str
    metrics: dict
    budget_hours: float | None = None  # the run's training.duration_hours (config.yaml)
    config: object = None  # the run's config.yaml as a Config (None when it has none)
    curve_steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    curve_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    curve_wall: np.ndarray = field(default_factory=lambda: np.zeros(0))  # seconds of training (gaps removed)

    @property
    def ranks(self) -> int:
        return int(self.metrics.get("world_size") or 1)

    @property
    def cores(self) -> int:
        """Cores the run used: ranks x torch threads per rank (a 1-rank run may use several threads),
        at most the node's CPUs for a one-node actor-learner job (its learner shares the actors' cores)."""
        cores = self.ranks * int(self.metrics.get("threads_per_rank") or 1)
        m = self.metrics
        if m.get("node_cpus") and m.get("ranks_on_learner_node") == m.get("world_size"):
            cores = min(cores, int(m["node_cpus"]))
        return cores

    @property
    def fps(self) -> float:
        return float(self.metrics.get("fps_steady") or self.metrics.get("fps") or 0.0)

    @property
    def status(self) -> str:
        m = self.metrics
        if m.get("stop_reason") in ("requeue", "stopped"):
            return "stopped (resumable)"
        if m.get("finished") or m.get("stop_reason") == "done":
            return "finished"
        if m.get("stop_reason") == "duration" or (self.budget_hours and (m.get("duration_s") or 0) >= 0.99 * self.budget_hours * 3600):
            return "finished (time budget)"
        return "running or ended early"

    @property
    def peak_memory_mb(self) -> float:
        return float(self.metrics.get("peak_rss_mb_total") or self.metrics.get("peak_rss_mb_learner") or 0.0)

    @property
    def final_return(self):
        if len(self.curve_returns):
            return float(self.curve_returns[-1])
        return self.metrics.get("episode_return_mean")

    @property
    def best_return(self):
        return float(self.curve_returns.max()) if len(self.curve_returns) else self.metrics.get("episode_return_mean")


def training_seconds(wall: np.ndarray) -> np.ndarray:
    """Elapsed training time at each logged point, with downtime between segments of a resumed
    run removed (a gap much longer than the usual logging interval counts as one usual interval)."""
    if len(wall) == 0:
        return wall
    d = np.diff(wall, prepend=wall[0])
    if len(d) > 2:
        usual = float(np.median(d[1:]))
        d = np.where((d > 300.0) & (d > 10 * usual), usual, d)
    return np.cumsum(d)


def read_curve(logs: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 100-episode mean return over env steps from a run's TensorBoard logs (empty without any;
    a truncated event file gives what it holds; one that cannot be read is a NotARun)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.errors import OpError
    if not logs.is_dir():
        return np.zeros(0), np.zeros(0), np.zeros(0)
    if (why := not_utf8(logs)):  # (TensorBoard encodes the path: its error would blame the event files)
        raise NotARun(f"logs '{shown(logs)}': {why}, which TensorBoard's reader cannot open; rename the folder")
    try:  # TensorBoard opens each event file plainly: a FIFO by such a name would hold it forever
        odd = [e.name for e in os.scandir(logs) if "tfevents" in e.name and not e.is_file()]
    except OSError as e:
        raise NotARun(f"logs '{shown(logs)}': cannot list it ({os_reason(e)})") from None
    if odd:
        raise NotARun(f"logs '{shown(logs)}': '{shown(odd[0])}' is not a file (an event file's name on something else)")
    acc = EventAccumulator(str(logs), size_guidance={"scalars": 0})
    # A resumed run logs again from its checkpoint's step: TensorBoard drops the first life's later
    # events (wanted: the run redid those steps) and warns of "a TensorFlow restart", not ours to print.
    quiet = logging.getLogger("tensorboard")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        acc.Reload()
    except (OSError, OpError) as e:
        raise NotARun(f"logs '{shown(logs)}': cannot read its event files ({getattr(e, 'strerror', None) or e})") from None
    except Exception as e:  # noqa: BLE001 (a damaged record: protobuf's DecodeError; a length of a TB: MemoryError)
        raise NotARun(f"logs '{shown(logs)}': an event file there is damaged ({reason(e, 120)})") from None
    finally:
        quiet.setLevel(level)
    tags = acc.Tags().get("scalars", [])
    tag = next((t for t in (*readable(chart("episode_return_mean")), *readable(chart("episode_return"))) if t in tags),
               None)
    if tag is None:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    ev = sorted(acc.Scalars(tag), key=lambda e: e.step)
    steps = np.array([e.step for e in ev], dtype=np.int64)
    wall = np.array([e.wall_time for e in ev], dtype=np.float64)
    return steps, np.array([e.value for e in ev], dtype=np.float64), training_seconds(wall)


def run_config(folder: Path, top: Path):
    """The run's config.yaml as a Config (a multi-agent run keeps it at its top), or None when there is none."""
    for f in (folder, top):
        if (f / RUN_CONFIG).exists() or (f / RUN_CONFIG).is_symlink():
            return read_run_config(f)
    return None


def _exists(file: Path, run: Path) -> bool:
    """Whether `file` exists; a folder this user may not search is a NotARun (Path.exists raises there)."""
    try:
        return file.exists()
    except OSError as e:
        raise NotARun(f"'{shown(run)}': cannot read it ({os_reason(e)})") from None


def load_runs(path: str | Path) -> list[Run]:
    """The run(s) in a folder: one, or one per agent for a multi-agent DQN run. Its metrics and
    config.yaml are checked (mpippo/files.py); a damaged one is a NotARun naming the file."""
    path = Path(path)
    try:
        if not path.is_dir():
            raise NotARun(f"'{shown(path)}': no such folder (give a run folder)" if not path.exists() else
                          f"'{shown(path)}' is a file, not a run folder")
        agents = sorted(path.glob(f"agent_*/{METRICS}"))
    except OSError as e:
        raise NotARun(f"'{shown(path)}': cannot read it ({os_reason(e)})") from None
    folders = [a.parent for a in agents] if agents else [path]
    runs = []
    for f in folders:
        if not _exists(f / METRICS, path):
            raise NotARun(f"'{shown(path)}' is not an mpippo run folder (no {METRICS}; a run writes it "
                          f"after its first iteration)")
        try:
            metrics = conform(read_metrics(f), METRICS_USED, f / METRICS)
            cfg = run_config(f, path)
        except UsageError as e:
            raise NotARun(e.errors[0]) from None
        name = path.name if f == path else f"{path.name}/{f.name}"
        steps, returns, wall = read_curve(f / LOGS)
        runs.append(Run(f, name, metrics, cfg.training.duration_hours if cfg else None, cfg, steps, returns, wall))
    return runs


def load_each(folders: list[Path]) -> list[Run]:
    """The runs of the folders a tool was given, each once: a run given twice (by two names: x and ./x/, a
    link to it; or as a multi-agent run's folder and one of its agents' own) had been drawn and scored as
    two runs, a speedup of 1.00x over itself. One line names the folder that repeats it."""
    runs: list[Run] = []
    seen: dict[str, tuple[Path, Path]] = {}  # a run's real path: (its folder, the folder given that holds it)
    for folder in map(Path, folders):
        for r in load_runs(folder):
            key = os.path.realpath(r.path)  # (never raises, a link loop included)
            if key in seen:
                was, given = seen[key]
                what = f"'{shown(folder)}'" + ("" if r.path == folder else f": its run '{shown(r.path)}'")
                also = "" if given == folder else f" (also {'as' if was == given else 'in'} '{shown(given)}')"
                raise NotARun(f"{what} is given twice{also}: give each run once")
            seen[key] = (r.path, folder)
            runs.append(r)
    return distinct_names(runs)


def distinct_names(runs: list[Run]) -> list[Run]:
    """Runs whose names repeat (a run and its copy, both 'run' in two folders) named by as many of their
    parent folders as tell them apart: the tables and legends had shown two rows alike."""
    given = {id(r): len(Path(r.name).parts) for r in runs}  # (a multi-agent run's 'run/agent_0': two)
    for depth in range(1, 9):
        names = [r.name for r in runs]
        if len(set(names)) == len(runs):
            break
        for r, name in zip(runs, names):
            if names.count(name) > 1:
                r.name = "/".join(r.path.absolute().parts[-given[id(r)] - depth:])
    return runs


def no_curve_notes(runs: list[Run]) -> list[str]:
    """A note for each run with no return to draw: an empty chart with exit 0 had said nothing (a run too
    young, an event file overwritten). The tools that draw curves print them."""
    return [f"note: {r.name}: no return to draw: its logs/ hold no readable return points (none written yet, "
            f"or its event files damaged)" for r in runs if not len(r.curve_returns)]
