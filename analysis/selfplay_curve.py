"""Win-rate curve of a self-play run: `python analysis/selfplay_curve.py RUN_DIR [--out PNG]`.

Reads the rating rounds the learner logged in RUN_DIR/benchmark_metrics.json (greedy games against
the random player and, on Connect Four, the one-step-lookahead player every `selfplay.eval_interval_updates` updates, and the
learner's Elo at each round) and draws them over env steps; prints the first and last rounds and the
final pool with its ratings.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mpippo, without an install
from mpippo.toolcli import COUNT, NUMBER, TEXT, Maybe, Parser, about, conform, output_file, pyplot, run, save_figure, shown  # noqa: E402

from mpippo.usage import UsageError  # noqa: E402
from mpippo.files import METRICS, read_metrics  # noqa: E402

TOOL = "selfplay_curve"
_GAMES = {"win_rate": NUMBER, "wins": COUNT, "draws": COUNT, "losses": COUNT}
# what this tool reads of a self-play run's metrics (the learner's `selfplay` block)
SPEC = {"env": TEXT, "total_timesteps": COUNT, "updates": COUNT,
        "selfplay": {"learner_elo": NUMBER, "sampling": TEXT, "pool_size": COUNT, "snapshots_taken": COUNT,
                     "heuristics": {"lookahead": Maybe({"elo": NUMBER})},  # (Connect Four's only)
                     "pool": [{"id": COUNT, "update": COUNT, "elo": NUMBER, "score": Maybe(NUMBER)}],
                     "ratings": [{"transitions": COUNT, "update": COUNT, "elo": Maybe(NUMBER),
                                  "random": _GAMES, "lookahead": Maybe(_GAMES)}]}}


class BadRun(UsageError):
    pass


def load(run_dir: Path) -> dict:
    path = run_dir / METRICS
    if not path.exists():
        raise BadRun(f"no {METRICS} in '{shown(run_dir)}' (give a self-play run folder)")
    m = read_metrics(run_dir)
    if "selfplay" not in m:
        raise BadRun(f"'{shown(run_dir)}' is not a self-play run (its metrics have no 'selfplay' block)")
    return conform(m, SPEC, path)


def plot(m: dict, out: Path) -> None:
    plt = pyplot()
    rounds = m["selfplay"]["ratings"]
    x = [r["transitions"] for r in rounds]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, style in ((n, s) for n, s in (("random", "o-"), ("lookahead", "s-")) if rounds[0].get(n)):
        ax1.plot(x, [r[name]["win_rate"] for r in rounds], style, ms=3, label=f"vs {name} player")
    ax1.axhline(0.5, color="grey", lw=0.5)
    ax1.set(xlabel="env steps", ylabel="greedy win rate", ylim=(0, 1.02),
            title=f"win rate ({rounds[-1]['random']['wins'] + rounds[-1]['random']['draws'] + rounds[-1]['random']['losses']}"
                  " games per point)")
    ax1.legend(loc="center right")
    if all("elo" in r for r in rounds):
        ax2.plot(x, [r["elo"] for r in rounds], "-", color="C2", label="learner")
    sp = m["selfplay"]
    if sp["heuristics"].get("lookahead"):
        ax2.axhline(sp["heuristics"]["lookahead"]["elo"], color="C1", ls="--", label="lookahead player (final)")
    ax2.axhline(0.0, color="C0", ls=":", label="random player (anchor)")
    ax2.set(xlabel="env steps", ylabel="Elo", title=f"Elo ({sp['sampling']} sampling, pool of {sp['pool_size']})")
    ax2.legend(loc="upper left")
    fig.suptitle(f"self-play DQN on {m['env']}: {m['total_timesteps']:,} env steps, {m['updates']:,} updates")
    save_figure(fig, out, "--out")


def main(argv: list[str] | None = None) -> int:
    return run(TOOL, _main, argv)


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="selfplay_curve.py", description=about(__doc__))
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, help="PNG to write (default RUN_DIR/selfplay.png)")
    args = p.parse_args(argv)
    m = load(args.run_dir)
    out = output_file(args.out or args.run_dir / "selfplay.png", "--out", (".png",))
    sp, rounds = m["selfplay"], m["selfplay"]["ratings"]
    plot(m, out)
    print(f"self-play run {args.run_dir}: {m['total_timesteps']:,} env steps, {sp['snapshots_taken']} snapshots, "
          f"learner Elo {sp['learner_elo']:.0f}")
    names = [n for n in ("random", "lookahead") if rounds[0].get(n)]
    print(f"  {'env steps':>10} {'update':>7}" + "".join(f" {'vs ' + n:>13}" for n in names))
    for r in (rounds[0], rounds[-1]):
        print(f"  {r['transitions']:>10,} {r['update']:>7,}" + "".join(f" {r[n]['win_rate']:>13.2f}" for n in names))
    print("  pool: " + ", ".join(f"#{e['id']} (update {e['update']}, Elo {e['elo']:.0f}, learner score "
                                 f"{'-' if e['score'] is None else format(e['score'], '.2f')})" for e in sp["pool"]))
    print(f"  figure: {out}")
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
