#!/usr/bin/env python
"""mpippo beside CleanRL on the field's benchmarks: learning curves at the same budget, same machine.

    python benchmarks/peer_parity.py --family mujoco [--envs HalfCheetah-v5 Hopper-v5] [--seeds 1 2]
        [--steps 1000000] [--who mpippo cleanrl] [--runs runs/mujoco-parity] [--out analysis/data/mujoco_parity]
        [--precision bf16]
    python benchmarks/peer_parity.py --family atari [--envs Pong Breakout] [--seeds 1 2] [--steps 2000000]
        [--who mpippo cleanrl apex]

Each family pairs a config of mpippo with the CleanRL script it copies (FAMILIES):
- mujoco: `configs/ppo_mujoco.yaml` (2 envs x 1,024 steps per update, 1 torch thread per rank) beside
  `ppo_continuous_action.py` (1 env x 2,048 steps, the same batch and hyperparameters), Gymnasium ids;
- atari: `configs/ppo_atari.yaml` (ale-py) beside `ppo_atari_envpool.py` (EnvPool; the settings are
  that script's), ALE games in CamelCase (mpippo's `atari:Pong`, EnvPool's `Pong-v5`); both report the
  real game's return (all lives), and anneal the learning rate to 0 over --steps. `--who apex` adds
  mpippo's Ape-X DQN (`configs/dqn_atari.yaml`, 1 learner + 1 actor of 64 envs on the 2 cores) at the same
  budget, with the settings a budget of millions of steps needs (APEX_SHORT: the paper's target
  period, 2,500 updates of 512, would be 320,000 env steps at its replay ratio of 4).

Runs go one after another (never two at once: the throughput of each is measured on the whole
machine): mpippo as `python -m mpippo.launch -n 2 --config <config>`, CleanRL's script as one process
with torch's default threads. A run --out already records at this budget is not run again; a run
stopped early (mpippo's, CleanRL's on Atari) resumes: hours-long runs continue across sessions.

CleanRL's scripts are not stored here: they are read at a pinned commit into .venv-peers/ (offline:
MPIPPO_CLEANRL_CONTINUOUS / MPIPPO_CLEANRL_ATARI name a copy), with the edits Gymnasium 1.x (and EnvPool
1.2.5) need, nothing in how they learn. For MuJoCo: TransformObservation's observation space argument, and the
episode statistics in the vector env's info (1.x reports them under `episode` with a `_episode` mask
instead of `final_info`); the script keeps Gymnasium's default autoreset mode and treats a time limit as
a termination. For Atari: the edits listed in benchmarks/atari_throughput.py, and RESUMABLE's below (a
checkpoint at an iteration's end on SIGTERM or Ctrl-C, a resume from it with fresh games, the final weights
kept): its 2M steps take longer than a sitting.

Writes, per run, `<who>-<env>-s<seed>.csv` (env steps, episode return) and `runs.json` (steps/s,
wall time, final return: the mean of the last 100 episodes) to --out; `analysis/peer_parity.py`
draws and tabulates them. `--precision bf16` runs mpippo's side in bf16 instead of the config's
(its runs named `mpippo-<env>-s<seed>-bf16`): `make bench` puts the two side by side on HalfCheetah,
the measurement behind `precision: auto` taking fp32 for the MLPs.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # mpippo, without an install
from mpippo.toolcli import (EXIT_STOPPED, Parser, about, RunStopped, Stopped, ToolFailure, check_trainer, count,  # noqa: E402
                            output_file, output_folder, run, run_trainer, shown, write_bytes)
import atari_throughput  # noqa: E402 (this folder's: CleanRL's Atari script and EnvPool)
from mpippo.checkpoint import latest_path  # noqa: E402
from mpippo import files, runlock  # noqa: E402
from mpippo.files import LOGS, read_json  # noqa: E402
from mpippo.usage import UsageError, file_kind  # noqa: E402
from mpippo.envs.gym import unknown_id  # noqa: E402
from peers import adapted_script, cleanrl_ready, sps_lines, target_install  # noqa: E402 (the peers' set-up)

TYRO = "tyro==1.0.17"
# (what the script says, what Gymnasium 1.x needs): the two adaptations described above
ADAPT = [
    ("gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))",
     "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)"),
    ('''            if "final_info" in infos:
                for info in infos["final_info"]:
                    if info and "episode" in info:
                        print(f"global_step={global_step}, episodic_return={info['episode']['r']}")''',
     '''            if "episode" in infos:
                ended = infos["_episode"]
                for info in [{"episode": {"r": r, "l": n}} for r, n in zip(infos["episode"]["r"][ended],
                                                                            infos["episode"]["l"][ended])]:
                    if info and "episode" in info:
                        print(f"global_step={global_step}, episodic_return={info['episode']['r']}")'''),
]


# CleanRL's Atari run takes hours on 2 cores, longer than one sitting: beside the Gymnasium edits, the parity
# runs' copy of ppo_atari_envpool.py checkpoints at an iteration's end on SIGTERM or Ctrl-C (exit 4, as mpippo's
# trainer) and resumes from it with fresh games (EnvPool cannot save them; mpippo's Atari resume does the same),
# and keeps its final weights (agent_final.pt) for a look at the policy. The learning code is untouched.
RESUMABLE = [
    ('    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")\n',
     '    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")\n'
     '    import signal  # (peer_parity) stop at an iteration\'s end with a checkpoint; resume from it\n'
     '    stop_requests = []\n'
     '    for sig in (signal.SIGTERM, signal.SIGINT):\n'
     '        signal.signal(sig, lambda *_: stop_requests.append(1))\n'
     '    resumed = torch.load("checkpoint.pt", weights_only=True) if os.path.exists("checkpoint.pt") else None\n'),
    ("        seed=args.seed,\n    )\n",
     '        seed=args.seed + (resumed["iteration"] if resumed else 0),  # a resume plays fresh games\n    )\n'),
    ("    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)\n",
     "    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)\n"
     "    if resumed:\n"
     '        agent.load_state_dict(resumed["agent"])\n'
     '        optimizer.load_state_dict(resumed["optimizer"])\n'),
    ("    global_step = 0\n",
     '    global_step = resumed_step = resumed["global_step"] if resumed else 0\n'),
    ("    for iteration in range(1, args.num_iterations + 1):\n",
     '    for iteration in range((resumed["iteration"] if resumed else 0) + 1, args.num_iterations + 1):\n'),
    ('        print("SPS:", int(global_step / (time.time() - start_time)))\n'
     '        writer.add_scalar("charts/SPS", int(global_step / (time.time() - start_time)), global_step)\n',
     '        print("SPS:", int((global_step - resumed_step) / (time.time() - start_time)))\n'
     '        writer.add_scalar("charts/SPS", int((global_step - resumed_step) / (time.time() - start_time)), global_step)\n'
     "        if stop_requests:\n"
     '            torch.save({"agent": agent.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration,\n'
     '                        "global_step": global_step}, "checkpoint.tmp")\n'
     '            os.replace("checkpoint.tmp", "checkpoint.pt")\n'
     '            print(f"stopped at global_step={global_step} with checkpoint.pt written", flush=True)\n'
     "            raise SystemExit(4)\n"),
    ("    envs.close()\n    writer.close()\n",
     '    torch.save(agent.state_dict(), "agent_final.pt")\n    envs.close()\n    writer.close()\n'),
]


def atari_script() -> Path:
    """ppo_atari_envpool.py with the Gymnasium edits (atari_throughput.ADAPT) and RESUMABLE's."""
    return adapted_script("ppo_atari_envpool.py", "MPIPPO_CLEANRL_ATARI", atari_throughput.ADAPT + RESUMABLE,
                          "cleanrl_ppo_atari_envpool_resumable.py")


def gym_id(text: str) -> str:
    """A Gymnasium id as both sides take it (name-vN), registered here."""
    if not re.fullmatch(r"[A-Za-z0-9_./-]{1,100}-v\d+", text):
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a Gymnasium id such as HalfCheetah-v5")
    unknown = unknown_id(text, prefix="")  # before any run starts: an id neither side can make
    if unknown:
        raise argparse.ArgumentTypeError(unknown)
    return text


def continuous_script() -> Path:
    return adapted_script("ppo_continuous_action.py", "MPIPPO_CLEANRL_CONTINUOUS", ADAPT,
                          "cleanrl_ppo_continuous_action_gymnasium1.py")


# Ape-X at a budget of a few million env steps: batches of 128 (4x the updates at the same replay ratio),
# the target network every 2,000 updates (64,000 env steps, Dopamine's DQN's cadence in updates), learning
# from 20,000 transitions (Dopamine's) instead of 50,000
APEX_SHORT = ("--set", "dqn.batch_size=128", "--set", "dqn.target_update_period=2000",
              "--set", "dqn.learning_starts=20000")


@dataclass(frozen=True)
class Family:
    """One benchmark family: mpippo's config and env name beside the CleanRL script it copies."""
    config: str
    env_arg: Callable[[str], str]  # the argparse type of --envs: one line for a name that is not one
    ours: str  # mpippo's env.name, from the name both sides are given
    theirs: str  # the script's --env-id
    script: Callable[[], Path]
    peer_path: Callable[[], str]  # PYTHONPATH for the script (its packages, in .venv-peers/)
    envs: tuple[str, ...]
    steps: int
    data: str  # the default --out (under analysis/data) and --runs (under runs/)
    apex: tuple[str, ...] = ()  # mpippo's Ape-X DQN (--who apex): its config and settings; () = none


FAMILIES = {
    "mujoco": Family(str(ROOT / "configs/ppo_mujoco.yaml"), gym_id, "gym:{}", "{}", continuous_script,
                     lambda: target_install("site", "tyro", [TYRO]), ("HalfCheetah-v5", "Hopper-v5"), 1_000_000,
                     "mujoco_parity"),
    "atari": Family(str(ROOT / "configs/ppo_atari.yaml"), atari_throughput.game_name, "atari:{}", "{}-v5",
                    atari_script, atari_throughput.peer_path, ("Pong", "Breakout"), 2_000_000,
                    "atari_parity", ("--config", str(ROOT / "configs/dqn_atari.yaml"), *APEX_SHORT)),
}


def mpippo_argv(fam: Family, env: str, seed: int, steps: int, precision: str | None, apex: bool) -> list[str]:
    """The trainer's options for mpippo's run (its PPO config, or with `apex` its Ape-X DQN)."""
    return [*(fam.apex if apex else ("--config", fam.config)), "--set", f"env.name={fam.ours.format(env)}",
            "--seed", str(seed), "--total-timesteps", str(steps), "--no-progress",
            *(["--set", f"training.precision={precision}"] if precision else [])]


def run_mpippo(fam: Family, env: str, seed: int, steps: int, folder: Path, precision: str | None = None,
               apex: bool = False, ranks: int = 2) -> dict:
    """`ranks` ranks (the launcher's placement: each bound to its core; the configs' env count is the
    job's, so the data per update is the same on any); a run stopped early resumes, and then its wall
    time and steps/s are those of the resumed part (`resumed` says so). `apex`: the family's Ape-X DQN
    instead of its PPO config."""
    from mpippo.runs import read_curve
    resume = ["--resume"] if latest_path(folder).is_file() else []
    if not resume and (aside := runlock.set_aside(folder, "--runs: run folder")):  # nothing to continue: kept aside
        print(f"peer_parity: {folder.name} holds no checkpoint to resume; set aside as {aside.name}", flush=True)
    argv = [*mpippo_argv(fam, env, seed, steps, precision, apex), *resume]
    t0 = time.monotonic()
    metrics = run_trainer(ranks, argv, folder, ("mpippo's Ape-X DQN" if apex else "mpippo") + f" on {env}", timeout=12 * 3600,
                          resume="the same command resumes it")
    steps_, returns, _ = read_curve(folder / LOGS)
    curve = [(int(a), float(b)) for a, b in zip(steps_, returns)]
    return {"wall_s": time.monotonic() - t0, "steps_per_s": metrics["fps_steady"], "curve": curve,
            "final_return": metrics["episode_return_mean"], "episodes": metrics["episodes"],
            "precision": metrics.get("precision"), "resumed": bool(resume)}


def run_cleanrl(fam: Family, env: str, seed: int, steps: int, folder: Path) -> dict:
    """The family's CleanRL script in `folder` (its output to stdout.txt); a run the script checkpointed
    (Atari's, RESUMABLE) continues from it, its output appended, and its rate is then the resumed part's."""
    folder.mkdir(parents=True, exist_ok=True)
    log, finished = folder / "stdout.txt", folder / "finished"
    resumed = (folder / "checkpoint.pt").exists()
    if not finished.exists():  # CleanRL prints as it goes: only its exit says the run reached its budget
        cmd = [sys.executable, str(fam.script()), "--env-id", fam.theirs.format(env), "--seed", str(seed),
               "--total-timesteps", str(steps), "--no-cuda"]
        if not resumed:
            files.remove_file(log)  # a fresh run's output starts a new file (a hard link's other name keeps its bytes)
        with files.open_append(log, "CleanRL's output") as out:  # (never through a link, nor a FIFO's wait)
            code = wait_passing_stop(subprocess.Popen(cmd, cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                                                      env=os.environ | {"PYTHONPATH": fam.peer_path()}))
        if code == EXIT_STOPPED:
            raise RunStopped(f"CleanRL on {env} in '{shown(folder)}' stopped on a signal with its checkpoint "
                             f"written; the same command resumes it")
        if code != 0:
            tail = files.read_text(log, "CleanRL's output", files.LOG_LIMIT).strip().splitlines()[-1:] or [""]
            raise ToolFailure(f"CleanRL on {env} failed (exit {code}): {tail[0][:300]}")
        files.atomic_write_bytes(finished, b"exit 0\n")
    text = files.read_text(log, "CleanRL's output", files.LOG_LIMIT)
    # (a number whole: a run killed mid-line leaves 'episodic_return=[-' in its output, which stays)
    pairs = [(int(s), float(r)) for s, r in re.findall(r"global_step=(\d+), episodic_return=\[?(-?\d+(?:\.\d*)?"
                                                       r"(?:e[+-]?\d+)?)(?![\d.e])", text)]
    sps = sps_lines(text)
    returns = [r for _, r in pairs]
    return {"wall_s": steps / sps[-1] if sps else None, "steps_per_s": sps[-1] if sps else None, "curve": pairs,
            "final_return": sum(returns[-100:]) / max(len(returns[-100:]), 1), "episodes": len(returns),
            "resumed": resumed}


def check_folder(folder: Path, who: str) -> None:
    """A run's folder under --runs, before any run starts: nothing, or a folder no live process writes
    (a run killed before its first checkpoint is set aside when its turn comes: runlock.set_aside)."""
    if not os.path.lexists(folder):
        return
    if folder.is_symlink() or not folder.is_dir():
        raise UsageError(f"--runs: '{shown(folder)}' is {file_kind(os.lstat(folder).st_mode)}, not a run's folder; "
                         f"move it away")
    if (who_holds := runlock.holder(folder)):
        raise UsageError(f"--runs: '{shown(folder)}' is in use: {who_holds} holds its lock; one writer per folder")
    ckpt = folder / "checkpoint.pt"  # CleanRL's script opens it blind: a FIFO there would hang it
    if who == "cleanrl" and os.path.lexists(ckpt) and (ckpt.is_symlink() or not ckpt.is_file()):
        raise UsageError(f"--runs: '{shown(ckpt)}' is {file_kind(os.lstat(ckpt).st_mode)}, not CleanRL's "
                         f"checkpoint; move it away")


def run_one(fam: Family, args, env: str, seed: int, who: str, name: str, summary: dict) -> None:
    """One run: its curve and its row in runs.json."""
    summary_path = args.out / "runs.json"
    if args.fresh and (args.runs / name).exists():
        shutil.rmtree(args.runs / name)
    print(f"peer_parity: {name} ({args.steps:,} steps)", flush=True)
    res = (run_cleanrl(fam, env, seed, args.steps, args.runs / name) if who == "cleanrl"
           else run_mpippo(fam, env, seed, args.steps, args.runs / name, args.precision, who == "apex", args.ranks))
    # mpippo logs the mean of the last 100 episodes as it goes; CleanRL prints every episode
    column = "episode_return" if who == "cleanrl" else "return_mean_100"
    table = io.StringIO(newline="")
    csv.writer(table).writerows([("env_steps", column), *res.pop("curve")])
    write_bytes(args.out / f"{name}.csv", table.getvalue().encode(), "--out")
    summary[name] = {"who": who, "env": env, "seed": seed, "budget": args.steps, **res,
                     **({} if who == "cleanrl" else {"ranks": args.ranks})}  # (the analysis keeps layouts apart)
    write_bytes(summary_path, (json.dumps(summary, indent=1) + "\n").encode(), "--out")
    ret = "no episode ended" if res["final_return"] is None else f"return {res['final_return']:.1f}"
    rate = f"{res['steps_per_s']:.0f} steps/s" if res["steps_per_s"] else "no rate printed"
    print(f"peer_parity: {name}: {ret}, {rate}", flush=True)


def wait_passing_stop(proc: subprocess.Popen) -> int:
    """The script's exit code. A stop signal to this tool goes on to the script as SIGTERM: a script that
    checkpoints on it (RESUMABLE) ends its iteration and exits 4; one that does not, or takes more than
    5 minutes, ends the tool as any stop does (the script killed)."""
    try:
        return proc.wait()
    except Stopped:
        proc.terminate()
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            code = None
        if code != EXIT_STOPPED:
            proc.kill()
            proc.wait()
            raise
        return code


def run_tag(precision: str | None, ranks: int) -> str:
    """The suffix of an mpippo run's name off the comparison's defaults (fp32, 2 ranks): -bf16, -1rank."""
    return (f"-{precision}" if precision not in (None, "fp32") else "") + (f"-{ranks}rank" if ranks != 2 else "")


def main(argv: list[str] | None = None) -> int:
    return run("peer_parity", _main, argv)


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="peer_parity.py", description=about(__doc__))
    p.add_argument("--family", required=True, choices=sorted(FAMILIES))
    p.add_argument("--envs", nargs="+", help="Gymnasium ids (mujoco) or ALE games (atari); default: the family's")
    p.add_argument("--seeds", nargs="+", type=count(0, 2**31 - 1), default=[1, 2])
    p.add_argument("--steps", type=count(2048, 10**9), help="env steps per run (default: the family's)")
    p.add_argument("--who", nargs="+", choices=("mpippo", "cleanrl", "apex"), default=["mpippo", "cleanrl"],
                   help="apex: mpippo's Ape-X DQN (--family atari)")
    p.add_argument("--runs", type=Path, help="the runs' folder (default: runs/<family>-parity)")
    p.add_argument("--out", type=Path, help="the results' folder (default: analysis/data/<family>_parity)")
    p.add_argument("--precision", choices=("fp32", "bf16"), help="mpippo's training.precision (default: the "
                   "config's); runs of another one than fp32 are named -<precision>")
    p.add_argument("--ranks", type=count(1, 64), default=2, help="mpippo's ranks (default 2; runs on another "
                   "count are named -<n>rank, e.g. one rank of 8 envs, CleanRL's layout: --ranks 1)")
    p.add_argument("--fresh", action="store_true", help="run again what --runs already holds (a throughput row)")
    args = p.parse_args(argv)
    fam = FAMILIES[args.family]
    try:
        args.envs = [fam.env_arg(e) for e in args.envs or fam.envs]
    except argparse.ArgumentTypeError as e:
        p.error(f"argument --envs: {e}")
    if "apex" in args.who and not fam.apex:
        p.error(f"argument --who: apex: the {args.family} family has no Ape-X config; allowed: mpippo, cleanrl")
    if "apex" in args.who and args.ranks < 2:
        p.error(f"argument --ranks: Ape-X needs a learner and an actor, 2 ranks or more; got {args.ranks}")
    args.steps = args.steps or fam.steps
    args.runs = output_folder(args.runs or ROOT / "runs" / fam.data.replace("_", "-"), "--runs")
    args.out = output_folder(args.out or ROOT / "analysis" / "data" / fam.data, "--out", ("runs.json",))
    summary_path = args.out / "runs.json"  # what an earlier call recorded: runs it finished are not run again
    summary = read_json(summary_path, "--out's runs file") if summary_path.exists() else {}
    not_runs = [name for name, r in summary.items() if not isinstance(r, dict)]
    if not_runs:
        raise UsageError(f"--out's runs file '{shown(summary_path)}': entry '{not_runs[0]}' is not a run's record "
                         f"(a JSON object); it is not one peer_parity wrote")
    for env in args.envs:  # the trainer's own checks of every run mpippo will start (env, memory), before any starts
        for who in set(args.who) - {"cleanrl"}:
            check_trainer(mpippo_argv(fam, env, args.seeds[0], args.steps, args.precision, who == "apex"), args.ranks,
                          f"{'Ape-X DQN' if who == 'apex' else 'mpippo'} on {env}")
    names = [(env, seed, who, f"{who}-{env}-s{seed}{'' if who == 'cleanrl' else run_tag(args.precision, args.ranks)}")
             for env in args.envs for seed in args.seeds for who in args.who]
    done = [n for n in names if not args.fresh and summary.get(n[3], {}).get("budget") == args.steps]
    for *_, name in done:  # recorded at this budget: not run again, their folders not looked at
        print(f"peer_parity: {name}: done earlier (in {shown(summary_path)})", flush=True)
    names = [n for n in names if n not in done]
    for _, _, who, name in names:  # every run's folder and output, before hours of runs
        check_folder(args.runs / name, who)
        output_file(args.out / f"{name}.csv", "--out")
    ready = cleanrl_ready(sorted({n[2] for n in names}), lambda: (fam.script(), fam.peer_path()), "peer_parity")
    names = [n for n in names if n[2] in ready]
    for env, seed, who, name in names:
        run_one(fam, args, env, seed, who, name, summary)
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
