#!/usr/bin/env python
"""mpippo beside CleanRL's ppo_atari_envpool.py on one Atari game: steps/s on this machine, one run
after the other (each has the whole machine), the same settings (configs/ppo_atari.yaml is that
script's: 8 envs x 128 steps per update, 4 minibatches x 4 epochs, the Nature CNN).

    python benchmarks/atari_throughput.py [--game Pong] [--steps 40960] [--who mpippo cleanrl]
        [--precision fp32] [--out benchmarks/results/atari-throughput]

mpippo runs as `python -m mpippo.launch -n 2 --config configs/ppo_atari.yaml` (ale-py's vector env,
one thread per rank, each rank bound to its core); CleanRL's script as one process with torch's
default threads and EnvPool's default threads (as its users run it). Both report their steady rate,
the first iteration (set-up, warm-up) left out: mpippo's fps_steady, and CleanRL's from its
cumulative `SPS:` lines as bench.py computes it (peers.steady_sps; the rate from its start is kept too).

CleanRL's script is not stored here: it is read at a pinned commit (MPIPPO_CLEANRL_ATARI: a copy of
cleanrl/ppo_atari_envpool.py at CLEANRL_COMMIT, or downloaded) into .venv-peers/, with the edits
EnvPool 1.2.5 and Gymnasium 1.x need and nothing else (ADAPT: gymnasium for gym, the 5-tuple step,
reset's (obs, info), the per-env spaces set on the wrapper, not on the pool,
whose properties they are now). EnvPool itself (about 930 MB with its
dependencies, mostly MuJoCo assets) is installed with pip --target into .venv-peers/envpool, never
into the project's environment.

Before and after the runs it measures the machine's ceiling and kernel bound for this game and
network (benchmarks/ceiling.py, as bench.py does for Procgen: the env step, the policy step and the
updates of configs/ppo_atari.yaml at 2 ranks' per-rank sizes, one core each), and each row's share
of them (--no-ceiling: the runs only).

Writes --out/atari-throughput.json (both rates, the ratio, the ceiling, the machine) and prints one table.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # mpippo, without an install
from mpippo.toolcli import (Parser, about, ToolFailure, check_trainer, count, number, output_folder, run,  # noqa: E402
                            run_trainer, write_json)
from peers import CLEANRL_COMMIT, adapted_script, cleanrl_ready, steady_sps, target_install  # noqa: E402 (peers' set-up)
import ceiling  # noqa: E402 (this folder's)
from mpippo import files  # noqa: E402
from mpippo.envs.atari import unknown_game  # noqa: E402
from mpippo.machine import describe  # noqa: E402
from mpippo.runctl import bf16_native  # noqa: E402

CONFIG = "configs/ppo_atari.yaml"
RANKS = 2

CLEANRL_BATCH = 8 * 128  # its envs x steps: one "SPS:" line per iteration of this many steps
ENVPOOL = ["envpool==1.2.5", "numpy==1.26.4", "gymnasium==1.4.0"]
TYRO = "tyro==1.0.17"
ADAPT = [  # (the script's text, what EnvPool 1.2.5 / Gymnasium 1.x need)
    ("import gym\n", "import gymnasium as gym\n"),
    ("        observations, rewards, dones, infos = super().step(action)\n",
     "        observations, rewards, terminated, truncated, infos = super().step(action)\n"
     "        dones = terminated | truncated\n"),
    ("    envs.num_envs = args.num_envs\n    envs.single_action_space = envs.action_space\n"
     "    envs.single_observation_space = envs.observation_space\n    envs = RecordEpisodeStatistics(envs)\n",
     "    envs = RecordEpisodeStatistics(envs)\n    envs.single_action_space = envs.action_space\n"
     "    envs.single_observation_space = envs.observation_space\n"),
    ("    next_obs = torch.Tensor(envs.reset()).to(device)\n", "    next_obs = torch.Tensor(envs.reset()[0]).to(device)\n"),
]


def game_name(text: str) -> str:
    """A game as both sides name it (EnvPool's '<Game>-v5', mpippo's 'atari:<Game>')."""
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]{1,40}", text):
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not an ALE game in CamelCase such as Pong or MsPacman")
    unknown = unknown_game(text, prefix="")  # before any run starts: a name no side can play
    if unknown:
        raise argparse.ArgumentTypeError(unknown)
    return text


def cleanrl_script() -> Path:
    return adapted_script("ppo_atari_envpool.py", "MPIPPO_CLEANRL_ATARI", ADAPT, "cleanrl_ppo_atari_envpool_gymnasium1.py")


def peer_path() -> str:
    """tyro (the script's CLI) and EnvPool, each in its own --target folder under .venv-peers/."""
    return os.pathsep.join([target_install("site", "tyro", [TYRO]), target_install("envpool", "envpool", ENVPOOL)])


def run_cleanrl(game: str, steps: int, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "stdout.txt"
    cmd = [sys.executable, str(cleanrl_script()), "--env-id", f"{game}-v5", "--total-timesteps", str(steps),
           "--no-cuda", "--no-track"]
    t0 = time.monotonic()
    files.remove_file(log)  # a new file (a hard link's other name keeps its bytes)
    with files.open_append(log, "CleanRL's output") as out:  # (never through a link, nor a FIFO's wait)
        done = subprocess.run(cmd, cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                              env=os.environ | {"PYTHONPATH": peer_path()})
    text = files.read_text(log, "CleanRL's output", files.LOG_LIMIT)
    if done.returncode != 0:
        tail = text.strip().splitlines()[-1:] or [""]
        raise ToolFailure(f"CleanRL on {game} failed (exit {done.returncode}): {tail[0][:300]}")
    rates = steady_sps(text, CLEANRL_BATCH)
    if rates is None:
        raise ToolFailure(f"CleanRL on {game} printed no rate (its log: {log})")
    steady, overall = rates
    return {"who": "cleanrl ppo_atari_envpool.py (EnvPool)", "precision": "fp32", "steps_per_s": steady, "steps_per_s_from_start": overall,
            "wall_s": time.monotonic() - t0}


def mpippo_argv(game: str, steps: int, precision: str | None) -> list[str]:
    return ["--config", str(ROOT / CONFIG), "--set", f"env.name=atari:{game}", "--total-timesteps", str(steps),
            "--no-progress", "--set", "logging.tensorboard=false",
            *(["--set", f"training.precision={precision}"] if precision else [])]


def run_mpippo(game: str, steps: int, folder: Path, precision: str | None) -> dict:
    argv = mpippo_argv(game, steps, precision)
    t0 = time.monotonic()
    m = run_trainer(RANKS, argv, folder, f"mpippo on atari:{game}", timeout=3 * 3600)
    # (a run of one iteration has no steady rate: its overall one, as bench.py takes)
    return {"who": "mpippo, 2 ranks (ale-py)", "steps_per_s": m["fps_steady"] or m["fps"], "wall_s": time.monotonic() - t0,
            "precision": m.get("precision"), "phase_seconds": m.get("phase_seconds")}


def components(cfg, precision: str, seconds: float) -> dict:
    """The ceiling at the per-rank sizes of mpippo's run (`cfg`, resolved on RANKS ranks)."""
    envs, t = cfg.env.num_envs_per_rank, cfg.training
    return ceiling.components(precision, cfg.env.name, envs, envs * t.n_steps // t.num_minibatches, seconds,
                              str(ROOT / CONFIG))


def shares(rows: dict, c: dict) -> None:
    """Each row's steps/s as a share of the machine's ceiling and kernel bound at its precision (in
    place): both sides use every core, so both are measured against the whole machine."""
    for r in rows.values():
        if r.get("precision") != c["precision"]:
            continue
        r["of_ceiling"] = r["steps_per_s"] / c["ceiling"]
        r["of_kernel_bound"] = r["steps_per_s"] / (c["kernel_bound_per_core"] * c["cores"])


def main(argv: list[str] | None = None) -> int:
    return run("atari_throughput", _main, argv)


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="atari_throughput.py", description=about(__doc__))
    p.add_argument("--game", default="Pong", type=game_name, help="an ALE game in CamelCase (Pong, Breakout)")
    p.add_argument("--steps", type=count(1024, 10**8), default=40960, help="env steps per run (a multiple of 1,024)")
    p.add_argument("--who", nargs="+", choices=("mpippo", "cleanrl"), default=["mpippo", "cleanrl"])
    p.add_argument("--precision", choices=("fp32", "bf16"), default=None, help="mpippo's (default: auto)")
    p.add_argument("--ceiling", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the machine's ceiling and kernel bound before and after the runs")
    p.add_argument("--component-seconds", type=number(0, 600), default=8.0, help="timing per component cost")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "atari-throughput")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "atari-throughput")
    args = p.parse_args(argv)
    out = output_folder(args.out, "--out", ("atari-throughput.json",))
    args.runs = output_folder(args.runs, "--runs")  # now: not a failed run after a minute of component costs
    import torch  # here: a refused command line costs no torch import
    # the ceiling at the precision mpippo runs (auto: bf16 where the CPU has it natively)
    precision = args.precision or ("bf16" if bf16_native(torch.device("cpu"))[0] else "fp32")
    _, cfg = check_trainer(mpippo_argv(args.game, args.steps, args.precision), RANKS, "mpippo's run")
    args.who = cleanrl_ready(args.who, lambda: (cleanrl_script(), peer_path()), "atari_throughput")
    c = None
    if args.ceiling:
        print(f"atari_throughput: component costs ({precision}) ...", flush=True)
        c = components(cfg, precision, args.component_seconds)
    rows = {}
    for who in args.who:  # one after the other: each measured on the whole machine
        folder = args.runs / f"{who}-{args.game}-{time.strftime('%Y%m%d-%H%M%S')}"
        print(f"atari_throughput: {who} on {args.game}, {args.steps:,} steps", flush=True)
        rows[who] = (run_mpippo(args.game, args.steps, folder, args.precision) if who == "mpippo"
                     else run_cleanrl(args.game, args.steps, folder))
        print(f"atari_throughput: {who}: {rows[who]['steps_per_s']:,.0f} steps/s", flush=True)
    if c:
        print(f"atari_throughput: component costs ({precision}) again, after the runs ...", flush=True)
        c = ceiling.faster(c, components(cfg, precision, args.component_seconds))
        shares(rows, c)
    ratio = (rows["mpippo"]["steps_per_s"] / rows["cleanrl"]["steps_per_s"]
             if {"mpippo", "cleanrl"} <= set(rows) and rows["cleanrl"]["steps_per_s"] else None)
    result = {"game": args.game, "steps": args.steps, "machine": describe(), "rows": rows, "mpippo_over_cleanrl": ratio,
              "ceiling": c,
              "cleanrl_commit": CLEANRL_COMMIT, "date": time.strftime("%Y-%m-%d")}
    write_json(out / "atari-throughput.json", result, "--out")
    if c:
        print(f"ceiling ({precision}, one thread per core): {ceiling.describe(c)}")
        print(f"arithmetic ({precision}): {ceiling.arithmetic(c)}")
    for who, r in rows.items():
        share = (f"   {100 * r['of_ceiling']:.0f}% of the ceiling, {100 * r['of_kernel_bound']:.0f}% of the kernel bound"
                 if "of_ceiling" in r else "")
        print(f"{r['who']:<44} {r['steps_per_s']:>10,.0f} steps/s{share}")
    if ratio:
        print(f"mpippo / CleanRL: {ratio:.2f}x (target >= 2x)")
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
