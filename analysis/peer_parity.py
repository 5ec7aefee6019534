#!/usr/bin/env python
"""mpippo beside CleanRL (MuJoCo, Atari): curves, a table, a verdict.

    python analysis/peer_parity.py [--data analysis/data/mujoco_parity | analysis/data/atari_parity]

Reads what benchmarks/peer_parity.py wrote (a CSV per run, runs.json) and writes to the same
folder <folder>.png (the mean return of the last 100 episodes over env steps: each seed thin,
the seeds' mean thick), <folder>.md and <folder>.json: per env each side's final return
per seed and mean, the peer's seed range, and whether mpippo's mean lies inside that range or above
it; and each side's steps/s on this machine with their ratio. The .md adds each run's curve at a
quarter, half, three quarters and all of its budget. Runs of mpippo's Ape-X DQN (`apex`, Atari)
get their own curves and a table of their own below (no CleanRL script to pair them with), as do
mpippo's runs on another rank count than 2 (`--ranks`: runs.json's `ranks`), so that a layout's
runs never mix into the seeds' verdict.
"""
from __future__ import annotations

import csv
import io
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mpippo, without an install
from mpippo.toolcli import Parser, about, output_folder, panels, pyplot, run, save_figure, shown, write_json, write_text  # noqa: E402
from mpippo.files import NotAFile, is_count, is_number, open_regular, read_json  # noqa: E402
from mpippo.usage import UsageError  # noqa: E402

HERE = Path(__file__).resolve().parent
WINDOW = 100
SIDES = {"mpippo": ("mpippo", "tab:blue"), "cleanrl": ("CleanRL", "tab:orange"),
         "apex": ("mpippo Ape-X DQN", "tab:green")}  # runs.json's `who`: (label, color)


KIND_NAMES = {int: "a non-negative integer below 2**63", float: "a number", str: "a string", None: "a number or null"}
KEYS = {"who": str, "env": str, "seed": int, "budget": int, "final_return": float, "steps_per_s": None}  # None: a number or null
OTHER_COLORS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive")  # mpippo's runs on other rank counts


def side(r: dict) -> str:
    """A run's side: its `who`, or `<who>@<ranks>` for mpippo's runs on another rank count than the 2 of
    the comparison (`--ranks`): a layout's runs are shown apart, never mixed into the seeds' verdict."""
    ranks = r.get("ranks", 2)
    return r["who"] if r["who"] == "cleanrl" or ranks == 2 else f"{r['who']}@{ranks}"


def side_order(key: str) -> tuple[str, int]:
    """Sides by who, then by rank count as a number (mpippo@4 before mpippo@16)."""
    who, _, ranks = key.partition("@")
    return who, int(ranks or 2)


def side_label(key: str, i: int = 0) -> tuple[str, str]:
    """(label, color) of a side key."""
    if key in SIDES:
        return SIDES[key]
    who, ranks = key.split("@")
    return f"{SIDES[who][0]}, {ranks} rank{'s' if ranks != '1' else ''}", OTHER_COLORS[i % len(OTHER_COLORS)]


def load_runs(data: Path) -> dict:
    """runs.json as benchmarks/peer_parity.py writes it, or one line naming what is wrong."""
    path = data / "runs.json"
    if not os.path.lexists(path):
        raise UsageError(f"--data: no '{shown(path)}'; run benchmarks/peer_parity.py first")
    runs = read_json(path, "--data's runs file", kind=object)  # (its size, kind, text and JSON checked)
    if not isinstance(runs, dict) or not runs:
        raise UsageError(f"--data: '{shown(path)}' holds no runs (expected a mapping of run names)")
    for name, r in runs.items():
        where = f"--data: '{shown(path)}': run {name[:60]!r}"
        if not isinstance(r, dict) or r.get("who") not in SIDES:
            who = r.get("who") if isinstance(r, dict) else r
            raise UsageError(f"{where}: who is {who!r:.60}; allowed: {', '.join(SIDES)}")
        for key, kind in KEYS.items():
            value = r.get(key)
            ok = (is_count(value) if kind is int else is_number(value) if kind is float
                  else value is None or is_number(value) if kind is None else isinstance(value, kind))
            if not ok:
                raise UsageError(f"{where}: {key} is {value!r:.60}; expected "
                                 f"{KIND_NAMES[kind]}")
        ranks = r.get("ranks", 2)  # (runs written before --ranks have none: 2)
        if type(ranks) is not int or not 1 <= ranks <= 64:
            raise UsageError(f"{where}: ranks is {ranks!r:.60}; expected an int from 1 to 64")
    return runs


def curve(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(env steps, mean return of the last 100 episodes) from one run's CSV: mpippo's is logged as
    that mean; CleanRL's lists every episode, averaged here the same way."""
    try:
        with open_regular(path) as f:
            rows = list(csv.reader(io.TextIOWrapper(f, encoding="utf-8")))
        column = rows[0][1]
        steps = np.array([int(r[0]) for r in rows[1:]])
        values = np.array([float(r[1]) for r in rows[1:]])
    except NotAFile as e:
        raise UsageError(f"--data: cannot read the curve '{shown(path)}' ({e})") from None
    except (OSError, ValueError, IndexError, UnicodeDecodeError, csv.Error) as e:  # (csv: a field past its limit)
        raise UsageError(f"--data: cannot read the curve '{shown(path)}' ({type(e).__name__}: {str(e)[:80]})") from None
    if column == "episode_return":
        values = np.array([values[max(0, i - WINDOW + 1):i + 1].mean() for i in range(len(values))])
    return steps, values


def scores(xs) -> str:
    """Returns for the tables: a game's score to a tenth, a MuJoCo return to a unit; never "-0"."""
    return ", ".join(f"{x + 0.0:.1f}" if abs(x) < 100 else f"{x:.0f}" for x in xs) or "-"


def table(runs: dict) -> tuple[list[dict], str]:
    by_env = defaultdict(lambda: defaultdict(dict))
    for r in runs.values():
        by_env[r["env"]][side(r)][r["seed"]] = r
    rows, lines = [], ["| env | mpippo (seeds) | mean | CleanRL (seeds) | mean | inside or above the peer's range | "
                       "steps/s mpippo / CleanRL |", "|---|---|---:|---|---:|---|---:|"]
    for env, sides in sorted(by_env.items()):
        ours, peer = sides.get("mpippo", {}), sides.get("cleanrl", {})
        mine = [ours[s]["final_return"] for s in sorted(ours)]
        theirs = [peer[s]["final_return"] for s in sorted(peer)]
        ok = bool(mine and theirs and np.mean(mine) >= min(theirs))
        rate = [float(np.mean(r)) if (r := [x["steps_per_s"] for x in side.values() if x["steps_per_s"]]) else None
                for side in (ours, peer)]
        ratio = rate[0] / rate[1] if None not in rate else None
        rows.append({"env": env, "mpippo": mine, "cleanrl": theirs, "inside_or_above": ok,
                     "steps_per_s": {"mpippo": rate[0], "cleanrl": rate[1]}, "ratio": ratio})
        verdict = ("yes" if ok else "no") if mine and theirs else "(a side has no runs)"
        speeds = " / ".join("-" if r is None else f"{r:.0f}" for r in rate) + (f" ({ratio:.2f}x)" if ratio else "")
        lines.append(f"| {env} | {scores(mine)} | {scores([np.mean(mine)] if mine else [])} | {scores(theirs)} | "
                     f"{scores([np.mean(theirs)] if theirs else [])} | {verdict} | {speeds} |")
    others = sorted({k for sides in by_env.values() for k in sides} - {"mpippo", "cleanrl"}, key=side_order)
    return rows, "\n".join(lines) + "\n" + "".join(other_table(by_env, rows, key) for key in others)


def other_table(by_env: dict, rows: list[dict], key: str) -> str:
    """The final returns per env of a side beside the comparison (Ape-X DQN, mpippo on another rank
    count), added to `rows` under its key, or nothing without such runs."""
    lines = []
    for row in rows:
        runs = by_env[row["env"]].get(key, {})
        if runs:
            row[key] = [runs[s]["final_return"] for s in sorted(runs)]
            rate = [r["steps_per_s"] for r in runs.values() if r["steps_per_s"]]
            lines.append(f"| {row['env']} | {scores(row[key])} | {scores([np.mean(row[key])])} | "
                         f"{f'{np.mean(rate):.0f}' if rate else '-'} |")
    label = "Ape-X DQN" if key == "apex" else side_label(key)[0]
    head = ["", f"| env | {label} (seeds) | mean | steps/s |", "|---|---|---:|---:|"]
    return "\n".join(head + lines) + "\n" if lines else ""


def waypoints(data: Path, runs: dict) -> str:
    """Each run's curve at a quarter, half, three quarters and all of its budget (the last point logged
    at or before each): where the curves part, in numbers the docs can quote instead of reading the figure."""
    fractions = (0.25, 0.5, 0.75, 1.0)
    lines = ["", "| run | " + " | ".join(f"{f:.0%} of the budget" for f in fractions) + " |",
             "|---|" + "---:|" * len(fractions)]
    order = sorted(runs, key=lambda n: (runs[n]["env"], list(SIDES).index(runs[n]["who"]), side(runs[n]), runs[n]["seed"]))
    for name in order:
        x, y = curve(data / f"{name}.csv")
        at = [np.searchsorted(x, f * runs[name]["budget"], side="right") - 1 for f in fractions]
        cells = [scores([y[i]]) if i >= 0 else "-" for i in at]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figure(data: Path, runs: dict, out: Path) -> None:
    plt = pyplot()
    envs = sorted({r["env"] for r in runs.values()})
    fig, axes = panels(plt, len(envs), 6, 4, "envs")
    keys = [k for k in SIDES if any(side(r) == k for r in runs.values())]
    keys += sorted({side(r) for r in runs.values()} - set(keys), key=side_order)
    for ax, env in zip(axes, envs):
        for i, key in enumerate(keys):
            label, color = side_label(key, i)
            names = [n for n, r in runs.items() if r["env"] == env and side(r) == key]
            grid = np.linspace(0, max(r["budget"] for r in runs.values()), 200)
            ys = []
            for n in names:
                x, y = curve(data / f"{n}.csv")
                if len(x):
                    ax.plot(x, y, color=color, alpha=0.3 if len(names) > 1 else 1.0, lw=1,
                            label=None if len(names) > 1 else f"{label} (1 seed)")
                    ys.append(np.interp(grid, x, y, left=np.nan))
            if len(ys) > 1:  # (before any seed's first episode the mean is empty: left out, not warned about)
                ys = np.array(ys)
                some = ~np.isnan(ys).all(0)
                ax.plot(grid[some], np.nanmean(ys[:, some], axis=0), color=color, lw=2, label=f"{label} ({len(ys)} seeds)")
        ax.set(title=env, xlabel="env steps", ylabel="return (last 100 episodes)")
        ax.legend()
    save_figure(fig, out, "--data")


def main(argv: list[str] | None = None) -> int:
    return run("peer_parity", _main, argv)


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="peer_parity.py", description=about(__doc__))
    p.add_argument("--data", type=Path, default=HERE / "data" / "mujoco_parity")
    args = p.parse_args(argv)
    runs = load_runs(args.data)
    name = args.data.resolve().name  # mujoco_parity.png in analysis/data/mujoco_parity/
    output_folder(args.data, "--data", (f"{name}.png", f"{name}.md", f"{name}.json"))  # before the work
    rows, md = table(runs)
    md += waypoints(args.data, runs)
    figure(args.data, runs, args.data / f"{name}.png")
    write_text(args.data / f"{name}.md", md, "--data")
    write_json(args.data / f"{name}.json", rows, "--data")
    print(md, end="")
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
