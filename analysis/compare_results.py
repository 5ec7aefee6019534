#!/usr/bin/env python
"""Compare mpippo runs: is the parallel run faster than the sequential one, by how much, and
does it learn the same?

    python analysis/compare_results.py RUN_DIR [RUN_DIR ...] [--out DIR]
    python analysis/compare_results.py --sequential runs/seq --parallel runs/par

Prints a table (duration, timesteps, steps/s, speedup against the first run, parallel
efficiency, peak memory, final and best return, status) and writes, to --out (default
./comparison): comparison.png (return vs timesteps, return vs wall-clock, steps/s, memory)
and comparison_report.txt (the table and how each number was computed).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mpippo, without an install
from mpippo.runs import Run, load_each, no_curve_notes  # noqa: E402
from mpippo.toolcli import UsageError, Parser, about, drawable, output_folder, pyplot, run, save_figure, write_text  # noqa: E402

TOOL = "compare_results"
OUTPUTS = ("comparison.png", "comparison_report.txt")


def table(runs: list[Run]) -> tuple[list[str], list[dict]]:
    base = runs[0]
    rows = []
    for r in runs:
        speedup = r.fps / base.fps if base.fps else float("nan")
        rows.append({
            "run": r.name, "algo": r.metrics.get("algo") or "ppo", "ranks": r.ranks,
            "duration_s": float(r.metrics.get("duration_s") or 0.0),
            "timesteps": int(r.metrics.get("total_timesteps") or 0), "steps_per_s": r.fps,
            "cores": r.cores, "speedup": speedup, "efficiency": speedup / (r.cores / base.cores),
            "peak_memory_mb": r.peak_memory_mb, "final_return": r.final_return, "best_return": r.best_return,
            "status": r.status,
        })

    def ret(x):
        return "-" if x is None else f"{x:.2f}"
    header = (f"{'run':<28} {'algo':<4} {'ranks':>5} {'cores':>5} {'duration':>9} {'timesteps':>11} {'steps/s':>8} {'speedup':>8} "
              f"{'eff.':>6} {'memory MB':>9} {'final':>7} {'best':>7}  status")
    lines = [header, "-" * len(header)]
    for x in rows:
        lines.append(f"{x['run'][:28]:<28} {x['algo']:<4} {x['ranks']:>5} {x['cores']:>5} {x['duration_s']:>8.1f}s {x['timesteps']:>11,} "
                     f"{x['steps_per_s']:>8.1f} {x['speedup']:>7.2f}x {100 * x['efficiency']:>5.1f}% "
                     f"{x['peak_memory_mb']:>9.0f} {ret(x['final_return']):>7} {ret(x['best_return']):>7}  {x['status']}")
    return lines, rows


def straggler_lines(runs: list[Run]) -> list[str]:
    """Per multi-rank sync PPO run: how far its slowest rank set the pace (the straggler_* keys of
    benchmark_metrics.json, mpippo/metrics/keys.py); runs without them (older, 1 rank, actor-learner) are left out."""
    lines = []
    for r in runs:
        m = r.metrics
        spread, wait = m.get("straggler_spread"), m.get("straggler_wait_s")
        if r.ranks < 2 or spread is None or wait is None:  # (types checked by runs.METRICS_USED)
            continue
        counts, slowest = m.get("straggler_slowest_counts") or [], m.get("straggler_slowest_rank")
        share = f" ({counts[slowest]} of {sum(counts)} iterations)" if slowest is not None and slowest < len(counts) else ""
        lines.append(f"{r.name[:28]:<28} slowest/mean busy time p50 {spread['p50']:.3f} p90 {spread['p90']:.3f} "
                     f"max {spread['max']:.3f}; wait in collectives p50 {wait['p50']:.3f} s p90 {wait['p90']:.3f} s "
                     f"per iteration; slowest rank {slowest}{share}")
    return ["", "stragglers (per iteration, over its ranks):"] + lines if lines else []


def mismatch_lines(runs: list[Run]) -> list[str]:
    """A warning when the runs train different envs or algorithms: their speedup then divides the
    rates of different work (a step of one env is not a step of another)."""
    lines = []
    for key, what in (("env", "envs"), ("algo", "algorithms")):
        seen = sorted({str(r.metrics.get(key) or ("ppo" if key == "algo" else "?")) for r in runs})
        if len(seen) > 1:
            named = ", ".join(seen[:4]) + (f" and {len(seen) - 4} more" if len(seen) > 4 else "")
            lines.append(f"mpippo: warning: the runs train different {what} ({named}): speedup and efficiency "
                         f"compare steps of different work")
    return lines


def plot(runs: list[Run], path: Path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    for r in runs:
        label = f"{r.name} ({r.ranks} rank{'s' if r.ranks > 1 else ''})"
        if len(r.curve_steps):
            ax[0, 0].plot(r.curve_steps, r.curve_returns, label=label)
            ax[0, 1].plot(r.curve_wall / 60.0, r.curve_returns, label=label)
    ax[0, 0].set(title="Return vs timesteps", xlabel="env steps", ylabel="episode return (last 100)")
    ax[0, 1].set(title="Return vs wall-clock", xlabel="minutes of training", ylabel="episode return (last 100)")
    for a in ax[0]:
        a.grid(alpha=0.3)
        if any(len(r.curve_steps) for r in runs):
            a.legend(fontsize=8)
    names = [drawable(r.name) for r in runs]  # (categories: drawn from the names, not as set texts)
    colors = [f"C{i}" for i in range(len(runs))]
    bars = ax[1, 0].bar(names, [r.fps for r in runs], color=colors)
    base = runs[0].fps
    for b, r in zip(bars, runs):
        ax[1, 0].annotate(f"{r.fps:.0f}\n{r.fps / base:.2f}x" if base else f"{r.fps:.0f}",
                          (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    ax[1, 0].set(title="Throughput", ylabel="env steps / s")
    ax[1, 1].bar(names, [r.peak_memory_mb / 1024 for r in runs], color=colors)
    ax[1, 1].set(title="Peak memory (all ranks)", ylabel="GiB")
    for a in ax[1]:
        a.tick_params(axis="x", labelrotation=20, labelsize=8)
        a.grid(alpha=0.3, axis="y")
        a.margins(y=0.15)
    save_figure(fig, path, "--out")


def main(argv: list[str] | None = None) -> int:
    return run(TOOL, _main, argv)


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="compare_results.py", description=about(__doc__))
    p.add_argument("runs", nargs="*", type=Path, help="run folders; the first is the baseline")
    p.add_argument("--sequential", type=Path, help="the baseline run (same as giving it first)")
    p.add_argument("--parallel", type=Path, nargs="+", default=[], help="runs to compare against it")
    p.add_argument("--out", type=Path, default=Path("comparison"), help="folder for comparison.png and the report")
    args = p.parse_args(argv)
    folders = ([args.sequential] if args.sequential else []) + list(args.runs) + list(args.parallel)
    if not folders:
        raise UsageError("give at least one run folder (see --help)")
    output_folder(args.out, "--out", OUTPUTS)  # before the runs are read: nothing is written before all is checked
    runs: list[Run] = load_each(folders)
    lines, rows = table(runs)
    lines += straggler_lines(runs) + mismatch_lines(runs) + no_curve_notes(runs)
    print("\n".join(lines))
    png, report = args.out / OUTPUTS[0], args.out / OUTPUTS[1]
    plot(runs, png)
    notes = [
        "",
        f"baseline: {runs[0].name} ({runs[0].ranks} rank(s))",
        "steps/s: steady throughput after the first iteration (fps_steady), else over the whole run (fps)",
        "speedup: steps/s / the baseline's; efficiency: speedup / (cores / the baseline's cores), where cores = ranks x "
        "torch threads per rank (a 1-rank run uses all cores through threads)",
        "memory: peak resident memory summed over ranks (DQN: the learner's)",
        "final/best return: last and highest point of the 100-episode mean return curve",
        "stragglers: busy time = rollout + update of a rank in an iteration; wait = its seconds in the phases holding "
        "collectives (gae, allreduce) minus the iteration's smallest over the ranks (a lower bound)",
    ]
    write_text(report, "\n".join(lines + notes) + "\n", "--out")
    print(f"\nwrote {png} and {report}")
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
