#!/usr/bin/env python
"""Learning curves of one or more runs, with the Procgen paper's PPO reference points.

    python analysis/learning_curves.py RUN_DIR [RUN_DIR ...] [--out learning_curves.png]

Left: mean return (last 100 episodes) vs env steps, with the paper's PPO results for the
runs' game (easy mode, all levels, 64 envs x 256 steps, mean of 3 seeds) at 1M, 2M, 5M and
25M steps. Right: the same returns vs wall-clock minutes of training (downtime between the
segments of a resumed run removed).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mpippo, without an install
from mpippo.runs import load_each, no_curve_notes  # noqa: E402
from mpippo.toolcli import Parser, about, output_file, pyplot, run, save_figure  # noqa: E402

TOOL = "learning_curves"

# Procgen paper (Cobbe et al. 2020), PPO, easy, all levels: mean return at these env steps
PAPER_PPO = {
    "coinrun": {1e6: 7.2, 2e6: 8.3, 5e6: 6.9, 25e6: 9.1},
    "starpilot": {1e6: 9.4, 2e6: 18.0, 5e6: 28.4, 25e6: 35.2},
    "bigfish": {1e6: 1.7, 2e6: 4.4, 5e6: 8.0, 25e6: 19.2},
    "bossfight": {1e6: 1.3, 2e6: 5.6, 5e6: 7.1, 25e6: 8.9},
    "fruitbot": {1e6: 11.9, 2e6: 20.8, 5e6: 26.7, 25e6: 29.3},
}


def plot_learning_curves(folders, out: Path) -> Path:
    plt = pyplot()

    runs = load_each(folders)
    for note in no_curve_notes(runs):
        print(note)
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    games = []
    for r in runs:
        label = f"{r.name} ({r.metrics.get('algo', 'ppo')}, {r.ranks} rank{'s' if r.ranks > 1 else ''})"
        ax[0].plot(r.curve_steps, r.curve_returns, label=label)
        ax[1].plot(r.curve_wall / 60.0, r.curve_returns, label=label)
        games.append(r.metrics.get("env"))
    max_steps = max((r.curve_steps.max() for r in runs if len(r.curve_steps)), default=0)
    for game in sorted({g for g in games if g in PAPER_PPO}):
        pts = {s: v for s, v in PAPER_PPO[game].items() if s <= max(max_steps * 1.5, 1e6)}
        ax[0].plot(list(pts), list(pts.values()), "k*", ms=10, label=f"Procgen paper PPO, {game}")
    ax[0].set(title="Return vs env steps", xlabel="env steps", ylabel="mean return (last 100 episodes)")
    ax[1].set(title="Return vs wall-clock", xlabel="minutes of training", ylabel="mean return (last 100 episodes)")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    return save_figure(fig, out, "--out")


def main(argv: list[str] | None = None) -> int:
    return run(TOOL, _main, argv)


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="learning_curves.py", description=about(__doc__))
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=Path("learning_curves.png"), help="a .png file")
    args = p.parse_args(argv)
    out = plot_learning_curves(args.runs, output_file(args.out, "--out", (".png",)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
