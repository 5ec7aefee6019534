#!/usr/bin/env python
"""Does mpippo learn per sample like the reference PPO? Runs against the Procgen paper's curves.

    python analysis/parity.py RUN_DIR [RUN_DIR ...] [--out analysis/data/parity] [--reference CSV]

Groups the runs by game and variant (precision, and the normalization choices when they are not
the defaults), and for each group: the mean return of the last 100 episodes vs env steps, each
seed thin and their mean thick, over the paper's PPO curve (easy mode, all levels: mean and +-1
std of its 3 seeds, drawn as a band). Prints and writes (parity.md, parity.json) a table: each
seed's return at the paper's last sampled step the runs reached, their mean, the paper's mean and
std there, and whether the mean lands within the tolerance: the larger of two of the paper's
standard deviations and 0.5 (the standard error of a 100-episode window).
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mpippo, without an install
from mpippo.runs import load_each  # noqa: E402
from mpippo.toolcli import Parser, about, panels, output_folder, pyplot, run, save_figure, shown, write_json, write_text  # noqa: E402

from mpippo.usage import UsageError  # noqa: E402
from mpippo.files import RUN_CONFIG, read_yaml  # noqa: E402
from mpippo.suite.reference import REFERENCE, reference_curves  # noqa: E402

TOOL = "parity"
OUTPUTS = ("parity.png", "parity.md", "parity.json")

HERE = Path(__file__).resolve().parent
WINDOW_SE = 0.5  # a 100-episode mean's standard error on these games, roughly


def variant(run) -> str:
    """precision, and the normalization choices when they are not the defaults (a config without
    those keys is from before they existed, when both were 'rollout')."""
    if run.config is None:
        raise UsageError(f"'{shown(run.path)}' has no config.yaml; parity groups runs by their config")
    cfg = run.config.training  # checked (runs.load_runs); the raw file tells which keys it holds
    path = run.path / RUN_CONFIG if (run.path / RUN_CONFIG).exists() else run.path.parent / RUN_CONFIG
    t = {k: getattr(cfg, k) for k in read_yaml(path, "run config").get("training") or {} if hasattr(cfg, k)}
    name = t.get("precision", "fp32")
    if name == "auto":  # (config.yaml keeps auto as asked; the metrics say what it resolved to)
        name = run.metrics.get("precision") or name
    old = [f"{k} {t.get(k, 'rollout')}" for k, default in (("adv_norm", "minibatch"), ("reward_norm", "step"))
           if t.get(k, "rollout") != default]
    return name + (f" ({', '.join(old)})" if old else "")


def value_at(run, step: int) -> float | None:
    """The run's last logged 100-episode mean at or before `step` (None if it never got there)."""
    i = np.searchsorted(run.curve_steps, step, side="right") - 1
    if i < 0 or run.curve_steps[-1] < step * 0.98:
        return None
    return float(run.curve_returns[i])


def score(groups: dict, ref: dict) -> list[dict]:
    rows = []
    for (game, var), runs in sorted(groups.items()):
        if game not in ref:
            continue
        steps, mean, std = ref[game]
        reached = min(int(r.curve_steps[-1]) for r in runs if len(r.curve_steps))
        candidates = [i for i, s in enumerate(steps) if s <= reached * 1.02]
        if not candidates:
            continue
        i = candidates[-1]
        seeds = {r.name: value_at(r, int(steps[i])) for r in runs}
        devices = {r.name: r.metrics.get("device_used") or r.metrics.get("device", "cpu") for r in runs}
        values = [v for v in seeds.values() if v is not None]
        tol = max(2 * std[i], WINDOW_SE)
        m = float(np.mean(values)) if values else None
        rows.append({"game": game, "variant": var, "step": int(steps[i]), "seeds": seeds,
                     "devices": devices, "mean": m,
                     "paper_mean": float(mean[i]), "paper_std": float(std[i]), "tolerance": tol,
                     "within": None if m is None else bool(abs(m - mean[i]) <= tol)})
    return rows


def plot(groups: dict, ref: dict, out: Path) -> Path:
    plt = pyplot()
    games = sorted({g for g, _ in groups})
    fig, axes = panels(plt, len(games), 6, 4.5, "games")
    for ax, game in zip(axes, games):
        if game in ref:
            steps, mean, std = ref[game]
            keep = steps <= max(r.curve_steps[-1] for (g, _), rs in groups.items() if g == game for r in rs) * 1.5
            ax.fill_between(steps[keep], (mean - std)[keep], (mean + std)[keep], color="grey", alpha=0.3)
            ax.plot(steps[keep], mean[keep], "k--o", label="Procgen paper PPO (3 seeds, +-1 std)")
        for k, ((g, var), runs) in enumerate(sorted(groups.items())):
            if g != game:
                continue
            color = f"C{k}"
            for r in runs:
                ax.plot(r.curve_steps, r.curve_returns, color=color, alpha=0.35, lw=0.8)
            grid = np.linspace(0, min(r.curve_steps[-1] for r in runs), 200)
            avg = np.mean([np.interp(grid, r.curve_steps, r.curve_returns) for r in runs], axis=0)
            ax.plot(grid, avg, color=color, lw=2, label=f"mpippo {var} ({len(runs)} seed{'s' * (len(runs) > 1)})")
        ax.set_title(f"{game} (easy, all levels)")
        ax.set_xlabel("env steps")
        ax.set_ylabel("mean return, last 100 episodes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, out / OUTPUTS[0], "--out")


def report(rows: list[dict]) -> str:
    lines = ["| game | variant | step | seeds (return, last 100 ep.) | mean | paper (mean +- std) | tolerance | within |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        # the device beside each seed: a GPU run learns the same algorithm, but not bit for bit
        seeds = ", ".join(f"{'-' if v is None else f'{v:.2f}'}" + (f" ({d})" if (d := r["devices"][k]) != "cpu" else "")
                          for k, v in r["seeds"].items())
        mean = "-" if r["mean"] is None else f"{r['mean']:.2f}"
        within = {None: "-", True: "yes", False: "**no**"}[r["within"]]
        lines.append(f"| {r['game']} | {r['variant']} | {r['step']:,} | {seeds} | {mean} | "
                     f"{r['paper_mean']:.2f} +- {r['paper_std']:.2f} | {r['tolerance']:.2f} | {within} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return run(TOOL, _main, argv)


def _main(argv) -> int:
    p = Parser(prog="parity.py", description=about(__doc__))
    p.add_argument("runs", nargs="+", type=Path, help="run folders (their config.yaml names game and variant)")
    p.add_argument("--out", type=Path, default=HERE / "data" / "parity")
    p.add_argument("--reference", type=Path, default=REFERENCE)
    args = p.parse_args(argv)
    output_folder(args.out, "--out", OUTPUTS)
    ref = reference_curves(args.reference)
    groups = defaultdict(list)
    for r in load_each(args.runs):
        key = (r.metrics.get("env") or "unknown", variant(r))
        if len(r.curve_steps):
            groups[key].append(r)
    if not groups:
        raise UsageError("no run has logged an episode yet")
    rows = score(groups, ref)
    figure = plot(groups, ref, args.out)
    text = report(rows)
    write_text(args.out / OUTPUTS[1], text, "--out")
    write_json(args.out / OUTPUTS[2], rows, "--out")
    print(text + f"\nfigure: {figure}")
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
