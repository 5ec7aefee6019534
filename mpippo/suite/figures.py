"""The suite report's figures: each game's curves over the paper's, and the aggregate scores."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mpippo.files import atomic_write_bytes
from mpippo.toolcli import panels, render_figure
from mpippo.runs import NotARun, load_runs
from mpippo.suite import state
from mpippo.suite.spec import Suite



def _plt():
    from mpippo.toolcli import pyplot  # (matplotlib: imported only where a figure is drawn)
    return pyplot()


def _save(fig, path: Path) -> None:
    atomic_write_bytes(path, render_figure(fig, path, "the report's figure", dpi=100))


def member_curves(suite: Suite) -> tuple[dict, list[str]]:
    """{(variant, game): [(steps, returns, done), ...]} of every member that has logged a return, and
    the keys of the members whose runs hold none to draw (logs/ damaged or lost): left out in silence,
    a panel would look complete."""
    out, blank = {}, []
    for m in suite.members():
        try:
            runs = load_runs(m.folder)
        except NotARun:
            continue
        done = state.finished(m, suite.budget)
        for r in runs:
            if len(r.curve_steps):
                out.setdefault((m.variant, m.game), []).append((r.curve_steps, r.curve_returns, done))
            elif m.key not in blank:
                blank.append(m.key)
    return out, blank


def _seed_mean(cs: list) -> tuple[np.ndarray, np.ndarray, int]:
    """The mean curve over the finished members (as the tables), or over all while none is:
    a member stopped early would otherwise cut every seed's mean short at its last step."""
    use = [c for c in cs if c[2]] or cs
    grid = np.linspace(0, min(s[-1] for s, _, _ in use), 100)
    return grid, np.mean([np.interp(grid, s, r) for s, r, _ in use], axis=0), len(use)


def curves(suite: Suite, ref: dict, path: Path) -> tuple[dict, list[str]]:
    """One panel per game: each member thin, each variant's seed mean thick, the paper's PPO mean
    dashed with its +-1 std band behind. Returns {game: reference points drawn} and the members with
    no curve to draw."""
    plt = _plt()
    data, blank = member_curves(suite)
    fig, axes = panels(plt, len(suite.games), 4.2, 3.3, "games", dpi=100)
    drawn = {}
    for ax, game in zip(axes, suite.games):
        reached = max((c[0][-1] for (v, g), cs in data.items() if g == game for c in cs), default=suite.budget)
        if game in ref:
            steps, mean, std = ref[game]
            keep = steps <= max(max(reached, suite.budget) * 1.05, steps[0])  # the suite's range, done or not
            ax.fill_between(steps[keep], (mean - std)[keep], (mean + std)[keep], color="grey", alpha=0.3, lw=0)
            ax.plot(steps[keep], mean[keep], "k--o", ms=3, lw=1, label="paper PPO (+-1 std)")
            drawn[game] = int(keep.sum())
        for k, variant in enumerate(suite.variants):
            cs = data.get((variant, game), [])
            for s, r, _ in cs:
                ax.plot(s, r, color=f"C{k}", alpha=0.3, lw=0.7)
            if cs:
                grid, avg, n = _seed_mean(cs)
                ax.plot(grid, avg, color=f"C{k}", lw=2, label=f"{variant} ({n} seed{'s' * (n > 1)})")
        ax.set_title(game, fontsize=10)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="upper left")
    fig.supxlabel("env steps", fontsize=9)
    fig.supylabel("mean return, last 100 episodes", fontsize=9)
    fig.suptitle(f"suite {suite.name} ({suite.distribution_mode}) against the Procgen paper", fontsize=11)
    _save(fig, path)
    return drawn, blank


def aggregate(agg: dict, path: Path) -> None:
    """IQM and mean normalized score per variant with their 95% intervals."""
    plt = _plt()
    variants = list(agg["variants"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 1.2 + 0.5 * len(variants)), squeeze=False)
    for ax, key in zip(axes[0], ("iqm", "mean")):
        for i, v in enumerate(variants):
            a = agg["variants"][v]
            lo, hi = a[f"{key}_ci"]
            ax.plot([lo, hi], [i, i], color=f"C{i}", lw=6, alpha=0.5, solid_capstyle="butt")
            ax.plot([a[key]], [i], "k|", ms=14)
        ax.set_yticks(range(len(variants)), variants)
        ax.set_title(f"{key.upper() if key == 'iqm' else 'mean'} normalized score (95% CI)", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    _save(fig, path)
