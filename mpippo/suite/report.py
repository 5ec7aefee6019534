"""A suite's report against the Procgen paper: curves, final returns, normalized scores, and the
suite-level statistics of rliable (IQM and mean with stratified-bootstrap 95% intervals,
probability of improvement between variants). Writes report.md, report.json and PNG figures,
each atomically; a partial suite is reported on what is done, and report.md lists what is missing.

Normalized score = (R - R_min) / (R_max - R_min) on the env family's published scale: the Procgen
paper's per-game constants (Cobbe et al. 2020; easy and hard differ), Atari's random and human
scores (human-normalized). An env with no such scale (a Gymnasium env) has none: its returns are
reported, the aggregates leave it out.
"""
from __future__ import annotations

import io
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from mpippo import config as C
from mpippo.files import RUN_CONFIG, atomic_write_bytes, read_run_config
from mpippo import envs
from mpippo.suite import state
from mpippo.suite.reference import REFERENCE, reference_curves
from mpippo.suite.spec import Suite

def normalized(game: str, mode: str, value: float) -> float | None:
    """The return on its family's published scale (envs/family.py: score_range); None without one."""
    family = envs.family_of(game)
    scale = family.score_range(game, mode) if family is not None else None
    if scale is None:
        return None  # no published scale (a Gymnasium env)
    lo, hi = scale
    return (value - lo) / (hi - lo)


def reference(mode: str) -> dict:
    """{game: (steps, mean, std)}: the paper's PPO curves, all levels (analysis/parity.py reads them)."""
    return reference_curves(REFERENCE, mode=mode, levels="all", split="train")


def paper_at(ref: dict, game: str, step: int) -> tuple[float, float] | tuple[None, None]:
    """The paper's mean and std at `step`, interpolated between its samples; None before its first."""
    if game not in ref:
        return None, None
    steps, mean, std = ref[game]
    if step < steps[0] * 0.98:
        return None, None
    return float(np.interp(step, steps, mean)), float(np.interp(step, steps, std))


def collect(suite: Suite) -> tuple[list[dict], list[str]]:
    """One row per member with a final return (done members), and the others with the reason.
    A member folder that is not the member's run, or a damaged file of one, refuses the report
    (SuiteError) before anything is written: it would be scored as what it is not."""
    rows, missing = [], []
    for m in suite.members():
        met = state.check(suite, m)
        if not state.finished(m, suite.budget, met):
            missing.append(f"{m.key} (not done)")
            continue
        if met.get("episode_return_mean") is None:
            missing.append(f"{m.key} (done, but no episode finished)")
            continue
        ret = float(met["episode_return_mean"])
        if ret != ret:
            missing.append(f"{m.key} (done, but its return is NaN)")
            continue
        steps = met.get("total_timesteps") or met.get("target_timesteps") or suite.budget
        rows.append({"member": m.key, "variant": m.variant, "game": m.game, "seed": m.seed, "steps": int(steps),
                     "return": ret, "normalized": normalized(m.game, suite.distribution_mode, ret),
                     "folder": str(m.folder),
                     "differs": differs_from_default(suite, read_run_config(m.folder).to_dict())
                     if (m.folder / RUN_CONFIG).is_file() else []})
    return rows, missing


def tolerance(paper_std: float) -> float:
    """How far a seed mean may lie from the paper's mean and still count as the paper's result:
    two of the paper's standard deviations over its seeds, at least 0.5 (a game whose seeds
    agreed closely still leaves room for ours)."""
    return max(2.0 * paper_std, 0.5)


def seed_mean_ci(values: np.ndarray, reps: int, seed: int = 0) -> list[float]:
    """A percentile-bootstrap 95% interval of the mean over seeds (resampling the seeds)."""
    if len(values) < 2:
        return [float(values.mean())] * 2
    rng = np.random.default_rng(seed)
    means = values[rng.integers(len(values), size=(min(reps, 10_000), len(values)))].mean(1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def per_game(rows: list[dict], ref: dict, reps: int = 2000) -> list[dict]:
    """Per (variant, game): every seed's return, their mean, std and bootstrap CI, beside the paper at
    the same step and whether the mean lies within the paper's tolerance."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["variant"], r["game"])].append(r)
    out = []
    for (variant, game), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        vals = np.array([r["return"] for r in rs])
        step = min(r["steps"] for r in rs)
        p_mean, p_std = paper_at(ref, game, step)
        inside = None if p_mean is None else bool(abs(vals.mean() - p_mean) <= tolerance(p_std))
        out.append({"variant": variant, "game": game, "seeds": len(rs), "step": step, "mean": float(vals.mean()),
                    "std": float(vals.std(ddof=1)) if len(vals) > 1 else 0.0,
                    "per_seed": {str(r["seed"]): r["return"] for r in rs}, "ci": seed_mean_ci(vals, reps),
                    "normalized": None if rs[0]["normalized"] is None else float(np.mean([r["normalized"] for r in rs])),
                    "paper_mean": p_mean,
                    "paper_std": p_std, "tolerance": None if p_std is None else tolerance(p_std), "inside": inside})
    return out


def verdicts(games: list[dict]) -> dict:
    """Per variant: does every game's seed mean lie within the paper's tolerance? And which do not."""
    out: dict = {}
    for g in games:
        v = out.setdefault(g["variant"], {"every_game_inside": True, "outside": [], "games": 0})
        v["games"] += 1
        if g["inside"] is False:
            v["every_game_inside"] = False
            v["outside"].append(f"{g['game']} {g['mean']:.2f} (paper {g['paper_mean']:.2f} +- "
                                f"{g['tolerance']:.2f})")
    return out


# keys that say how a member learned (not where, how fast or for how long): compared with today's default
NOT_LEARNING = {"parallel", "logging", "checkpoint", "guards"}
RUN_KEYS = {("env", "name"), ("env", "distribution_mode"), ("env", "num_threads"), ("env", "num_envs_per_rank"),
            ("training", "seed"), ("training", "total_timesteps"), ("training", "duration_hours"),
            ("training", "device"), ("training", "deterministic")}


def differs_from_default(suite: Suite, member_cfg: dict) -> list[str]:
    """What in a member's config differs from today's base config (its learning settings only):
    'model.init: torch (today: glorot)'. `auto` precision today matches what a member resolved it to."""
    # values only, not validated: the base config need not suit the suite's budget (the variants make it fit)
    errors: list[str] = []
    today = C.from_dict(C.load_yaml(suite.config_file), errors).to_dict()
    algo = today["training"]["algo"]
    out = []
    for section, keys in today.items():
        if section in NOT_LEARNING or (section in (*C.registry.algorithm_sections(), "selfplay") and section != algo):
            continue
        for key, now in keys.items():
            was = member_cfg.get(section, {}).get(key)
            if (section, key) in RUN_KEYS or was == now or (key == "precision" and now == "auto"):
                continue
            out.append(f"{section}.{key}: {C.show(was)} (today: {C.show(now)})")
    return out


def score_matrices(rows: list[dict]) -> tuple[dict, list[str]]:
    """{variant: (runs x games) normalized scores} over the games every variant has complete with
    the same number of seeds (rliable needs a rectangle), and those games."""
    by = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["normalized"] is not None:  # (games without a published range are not aggregated)
            by[r["variant"]][r["game"]].append(r["normalized"])
    variants = sorted(by)
    games = sorted(set.intersection(*(set(by[v]) for v in variants))) if variants else []
    seeds = {v: min((len(by[v][g]) for g in games), default=0) for v in variants}
    mats = {v: np.array([[by[v][g][i] for g in games] for i in range(seeds[v])]) for v in variants if seeds[v]}
    return mats, games


def aggregates(mats: dict, reps: int) -> dict:
    """IQM and mean normalized score with stratified-bootstrap 95% CIs, and the probability of
    improvement of each variant over each other one, by rliable."""
    from rliable import library as rly
    from rliable import metrics
    if not mats:
        return {}
    fn = lambda s: np.array([metrics.aggregate_iqm(s), metrics.aggregate_mean(s)])  # noqa: E731
    point, ci = rly.get_interval_estimates(mats, fn, reps=reps)
    out = {"variants": {v: {"iqm": float(point[v][0]), "iqm_ci": [float(x) for x in ci[v][:, 0]],
                            "mean": float(point[v][1]), "mean_ci": [float(x) for x in ci[v][:, 1]]} for v in mats}}
    pairs = {f"{a},{b}": (mats[a], mats[b]) for a in mats for b in mats if a < b}  # P(b > a) = 1 - P(a > b)
    if pairs:
        p, pci = rly.get_interval_estimates(pairs, metrics.probability_of_improvement, reps=reps)
        out["probability_of_improvement"] = {k: {"p": float(p[k]), "ci": [float(x) for x in np.ravel(pci[k])]}
                                             for k in pairs}
    return out


def main(suite: Suite, out: str | None, reps: int) -> int:
    out_dir = Path(out) if out else suite.folder / "report"
    ref = reference(suite.distribution_mode)
    rows, missing = collect(suite)
    games = per_game(rows, ref, reps)
    mats, common = score_matrices(rows)
    agg = aggregates(mats, reps)
    from mpippo.suite import figures  # matplotlib: loaded for the figures only
    drawn, blank = figures.curves(suite, ref, out_dir / "curves.png")
    scored = {r["member"] for r in rows}
    if agg:
        figures.aggregate(agg, out_dir / "aggregate.png")
    result = {"suite": suite.name, "mode": suite.distribution_mode, "budget": suite.budget, "members": rows,
              "games": games, "verdicts": verdicts(games), "aggregate_games": common, "aggregate": agg,
              "missing": missing,
              "reference_drawn": drawn, "undrawn": [k for k in blank if k in scored]}
    atomic_write_bytes(out_dir / "report.json", (json.dumps(result, indent=1) + "\n").encode())
    text = markdown(suite, result)
    atomic_write_bytes(out_dir / "report.md", text.encode(errors="backslashreplace"))
    print(text)
    print(f"suite {suite.name}: report in {out_dir} (report.md, report.json, curves.png"
          f"{', aggregate.png' if agg else ''})")
    return 0


def markdown(suite: Suite, r: dict) -> str:
    f = io.StringIO()
    total = len(suite.members())
    f.write(f"# Suite {suite.name}\n\n{suite.distribution_mode} mode, {suite.budget:,} steps per member, "
            f"{total - len(r['missing'])} of {total} members done.\n\n")
    f.write("## Final return per game (last 100 episodes)\n\n"
            "Every seed, their mean with a bootstrap 95% interval over seeds, and the paper at the same step; "
            "*within* means the seed mean lies within max(2 x the paper's std, 0.5) of the paper's mean.\n\n")
    f.write("| variant | game | seeds: return | mean [95% CI] | paper (same step) | within | normalized |\n"
            "|---|---|---|---|---|---|---|\n")
    for g in r["games"]:
        paper = "-" if g["paper_mean"] is None else f"{g['paper_mean']:.2f} +- {g['paper_std']:.2f}"
        seeds = ", ".join(f"{k}: {v:.2f}" for k, v in g["per_seed"].items())
        within = "-" if g["inside"] is None else ("yes" if g["inside"] else f"**no** (+- {g['tolerance']:.2f})")
        f.write(f"| {g['variant']} | {g['game']} | {seeds} | {g['mean']:.2f} [{g['ci'][0]:.2f}, {g['ci'][1]:.2f}] | "
                f"{paper} | {within} | {'-' if g['normalized'] is None else format(g['normalized'], '.3f')} |\n")
    f.write("\n" + "".join(f"- **{v}**: " + ("every game within the paper's tolerance\n" if d["every_game_inside"] else
                                          f"outside on {', '.join(d['outside'])}\n") for v, d in r["verdicts"].items()))
    marked = [m for m in r["members"] if m["differs"]]
    if marked:
        f.write(f"\n## Members trained with settings that are not today's default ({len(marked)})\n\n"
                + "".join(f"- {m['variant']}/{m['game']}/seed_{m['seed']}: {'; '.join(m['differs'])}\n" for m in marked))
    if r["aggregate"]:
        n = len(r["aggregate_games"])
        f.write(f"\n## Normalized score over {n} game{'s' * (n != 1)} (rliable, 95% stratified-bootstrap CIs)\n\n"
                "| variant | IQM | IQM 95% CI | mean | mean 95% CI |\n|---|---|---|---|---|\n")
        for v, a in r["aggregate"]["variants"].items():
            f.write(f"| {v} | {a['iqm']:.3f} | [{a['iqm_ci'][0]:.3f}, {a['iqm_ci'][1]:.3f}] | {a['mean']:.3f} | "
                    f"[{a['mean_ci'][0]:.3f}, {a['mean_ci'][1]:.3f}] |\n")
        for pair, p in r["aggregate"].get("probability_of_improvement", {}).items():
            a, b = pair.split(",")
            f.write(f"\nP({a} > {b}) = {p['p']:.3f} [{p['ci'][0]:.3f}, {p['ci'][1]:.3f}]")
        f.write("\n")
    f.write("\n![curves against the paper](curves.png)\n")
    if r["undrawn"]:
        n = len(r["undrawn"])
        f.write(f"\nNot drawn: {n} scored member{'s' * (n > 1)} whose logs/ hold no readable return points "
                f"(event files lost or damaged): {', '.join(r['undrawn'])}.\n")
    if r["aggregate"]:
        f.write("\n![aggregate normalized scores](aggregate.png)\n")
    if r["missing"]:
        f.write(f"\n## Missing ({len(r['missing'])} members without a final return: left out above)\n\n"
                + "".join(f"- {k}\n" for k in r["missing"]))
    return f.getvalue()
