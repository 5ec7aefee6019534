"""Hostile inputs, one table: every bad input is one line, exit 2, no traceback, no hang, nothing
already written changed; checkpoints never run code; signals from the first instant.

Each case builds its inputs in a fresh folder, runs the real command (the trainer, `mpippo.evaluate`
or the launcher; plain python, or 2-3 ranks under mpirun), and checks what hostile.check promises
(exit code, one error line, no traceback, nothing changed or left behind, no process left running).
The cases run two at a time; each has its own test.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

import hostile
from conftest import (MPIRUN, ROOT, STARTS, error_lines, fake_wandb, finish, launch_failed, mpi_env, ok, rank_processes,
                      start, trainer, wait_for_line, wait_until, wandb_home)
from mpippo import runlock
from mpippo.checkpoint import latest_path
from hostile import Case, hashes
from mpippo.launch import catches_usr1

TOY = ["--config", "configs/toy_cue.yaml", "--no-progress", "--total-timesteps", "1024"]
EVIL_MARKER = "planted_code_ran"


class Evil:
    """What a planted checkpoint holds: unpickling it would run a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# ---- the runs the checkpoint cases start from (one each, shared by the module) ----
# The actor-learner runs and their cases take 2 ranks, 1 learner + 1 actor: both roles meet the input, and
# a second actor only added a rank's start (torch's import: about 2 s of CPU) to each case.
@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    ok(trainer(None, TOY + ["--output-dir", str(root / "ppo")]))
    ok(trainer(None, ["--config", "configs/smoke.yaml", "--no-progress", "--total-timesteps", "256",
                      "--output-dir", str(root / "coinrun")]))
    ok(trainer(2, ["--config", "configs/dqn_toy.yaml", "--no-progress", "--total-timesteps", "3000",
                   "--set", "dqn.learning_starts=500", "--output-dir", str(root / "dqn")]))
    ok(trainer(2, ["--config", "configs/appo_toy.yaml", "--no-progress", "--total-timesteps", "2048",
                   "--output-dir", str(root / "appo")]))
    return {"ppo": root / "ppo", "coinrun": root / "coinrun", "dqn": root / "dqn", "appo": root / "appo"}


def edited_checkpoint(path: Path, edit: Callable[[dict], object]) -> bytes:
    """The checkpoint at `path` after edit(state) (test side: a trusted load); edit may return a new state."""
    state = torch.load(path, weights_only=False)
    out = edit(state)
    buf = io.BytesIO()
    torch.save(state if out is None else out, buf)
    return buf.getvalue()


def edited(bases, tmp: Path, base: str, edit: Callable[[dict], object]) -> Path:
    """A copy of a base run whose latest.pt went through edit(state)."""
    run_dir = tmp / "run"
    shutil.copytree(bases[base], run_dir)
    if edit is not None:
        path = latest_path(run_dir)
        path.write_bytes(edited_checkpoint(path, edit))
    return run_dir


def planted(tmp: Path):
    def edit(state):
        state["ret_window" if "ret_window" in state else "ret_rms"] = Evil(tmp / EVIL_MARKER)
    return edit


def resume(base: str, edit, ranks=None, extra=()):
    """A trainer case: --resume on an edited copy of a base run (edit None: an exact copy)."""
    def setup(tmp, bases):
        return ranks, ["run_mpi.py", "--resume", "--no-progress", "--output-dir", str(edited(bases, tmp, base, edit)),
                       *extra]
    return setup


def evaluate(base: str, edit=None, extra=()):
    def setup(tmp, bases):
        run_dir = edited(bases, tmp, base, edit) if edit else bases[base]
        return None, ["-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "2", *extra]
    return setup


def _with_env(setup, **env):
    """A case run with these environment variables set."""
    def with_env(tmp, bases):
        return (*setup(tmp, bases)[:2], env)
    return with_env


def train(*args, ranks=None, files: dict | None = None):
    """A trainer case; `files` are written into the case folder first ({name: bytes or text}),
    and TMP/ in an argument stands for that folder."""
    def setup(tmp, bases):
        for name, data in (files or {}).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data if isinstance(data, bytes) else data.encode())
        argv = [a.replace("TMP/", f"{tmp}/") for a in args]
        if "--output-dir" not in argv and "--resume" not in argv:
            argv += ["--output-dir", f"{tmp}/out"]
        return ranks, ["run_mpi.py", *argv]
    return setup


def launch(*args):
    def setup(tmp, bases):
        return None, ["-m", "mpippo.launch", *args, "--config", "configs/toy_cue.yaml", "--output-dir", f"{tmp}/out"]
    return setup


def set_key(path: str, value):
    def edit(state):
        *parents, last = path.split(".")
        node = state
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[last] = value
    return edit


def drop(key: str):
    def edit(state):
        del state[key]
    return edit


LOCK_IS = ".mpippo.lock' is {}, not mpippo's lock; mpippo keeps a folder's writer lock there"  # (after its path)


def _fifo_config():
    """A trainer given a FIFO for its config file (nothing ever writes into it)."""
    def setup(tmp, bases):
        os.mkfifo(tmp / "c.yaml")
        return train("--config", "TMP/c.yaml")(tmp, bases)
    return setup


def _odd_lock(kind: str, base: str | None = None, ranks=None, extra=()):
    """A run folder whose lock file is `kind` (a link to a file of the user's, to the run's own
    checkpoint or to nothing; a FIFO; a folder; a hard link to the user's file): a fresh run into
    it, or a resume of a copy of `base`."""
    def setup(tmp, bases):
        run_dir = edited(bases, tmp, base, None) if base else tmp / "run"
        run_dir.mkdir(exist_ok=True)
        lock, mine = run_dir / ".mpippo.lock", tmp / "mine.txt"
        mine.write_text("the user's file\n")
        lock.unlink(missing_ok=True)  # (the earlier run's)
        {"symlink": lambda: lock.symlink_to(mine), "symlink-checkpoint": lambda: lock.symlink_to("checkpoints/latest.pt"),
         "dangling": lambda: lock.symlink_to(tmp / "made-by-nobody"), "fifo": lambda: os.mkfifo(lock),
         "folder": lambda: (lock / "x").mkdir(parents=True), "hardlink": lambda: os.link(mine, lock)}[kind]()
        return ranks, ["run_mpi.py", *(["--resume"] if base else TOY), "--no-progress", "--output-dir", str(run_dir),
                       *extra]
    return setup


WANDB_BROKEN = "raise ImportError('libwandb_core.so: cannot open shared object file')\n"
WANDB_NO_NETWORK = ("class Settings:\n    def __init__(self, **kw): pass\n"
                    "def init(**kw):\n    raise ConnectionError('Network is unreachable: api.wandb.ai')\n")


def with_wandb(setup, mode: str = "offline", fake: str | None = None, prepare=None, **more_env):
    """A trainer case with logging.wandb=`mode`, against the real wandb in a home of its own (no
    login) or a stand-in package (`fake`: its module text); prepare(run folder) edits a resumed copy."""
    def wrapped(tmp, bases):
        ranks, argv = setup(tmp, bases)[:2]
        if prepare is not None:
            prepare(Path(argv[argv.index("--output-dir") + 1]))
        (tmp / "home").mkdir()
        env = wandb_home(tmp / "home") | (fake_wandb(tmp, fake) if fake else {}) | more_env
        return ranks, [*argv, "--set", f"logging.wandb={mode}"], env
    return wrapped


# a billion laughs: nine levels of nine references, 9**9 leaves if anything expands it
BOMB = "model:\n  channels: [&a [x, x, x, x, x, x, x, x, x], " + ", ".join(
    f"&{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")) + "]\n"

CASES = [
    # ---- checkpoints: never run code; a schema, the same verdict everywhere ----
    Case("ppo-planted-code", lambda t, b: resume("ppo", planted(t))(t, b), "refused: it holds Python objects",
         check=lambda t: not (t / EVIL_MARKER).exists()),
    Case("ppo-planted-code-2-ranks", lambda t, b: resume("ppo", planted(t), ranks=2)(t, b), "it needs posix.system",
         check=lambda t: not (t / EVIL_MARKER).exists()),
    Case("dqn-planted-code", lambda t, b: resume("dqn", planted(t), ranks=2)(t, b), "refused: it holds Python objects",
         check=lambda t: not (t / EVIL_MARKER).exists()),
    Case("appo-planted-code", lambda t, b: resume("appo", planted(t), ranks=2)(t, b), "refused: it holds Python objects",
         check=lambda t: not (t / EVIL_MARKER).exists()),
    Case("evaluate-planted-code", lambda t, b: evaluate("ppo", planted(t))(t, b), "refused: it holds Python objects",
         check=lambda t: not (t / EVIL_MARKER).exists()),
    # another network on resume: the model setting is named (torch's first line named the class only)
    Case("resume-ppo-other-hidden-size", resume("ppo", None, extra=["--set", "model.hidden_size=32"]),
         "model.hidden_size 32 (the checkpoint's 64); a resume keeps the run's network"),
    Case("resume-dqn-other-hidden-size", resume("dqn", None, ranks=2, extra=["--set", "model.hidden_size=32"]),
         "model.hidden_size 32 (the checkpoint's 64); a resume keeps the run's network"),
    Case("resume-appo-other-channels", resume("appo", None, ranks=2, extra=["--set", "model.channels=[4, 8]"]),
         "model.channels [4, 8] (the checkpoint's [8, 16])"),
    Case("ckpt-missing-key", resume("ppo", drop("ret_rms")), "missing key(s) ret_rms"),
    Case("evaluate-missing-key", evaluate("ppo", drop("ret_rms")), "missing key(s) ret_rms"),
    Case("ckpt-procgen-state", resume("coinrun", lambda s: s["ranks"][0].update(env=[b"garbage"] * 8)),
         "ranks[0].env[0]: not a saved coinrun game state"),
    Case("dqn-replay-file-path", resume("dqn", set_key("replay_file", "../../../etc/passwd"), ranks=2),
         "replay_file: expected null, 'replay.npz' or replay_<update>.npz"),
    Case("ckpt-appo-version", resume("appo", set_key("version", 10**6), ranks=2),
         "version: 1000000 is not the counters'"),
    Case("ckpt-truncated", lambda t, b: _truncated(t, b), "unreadable checkpoint"),
    # a copy's latest.pt cut short (an interrupted copy), its periodic checkpoint whole: named, to resume from
    Case("ckpt-truncated-copy", lambda t, b: _truncated(t, b, copy=True),
         "); checkpoints/ also holds ckpt_"),
    # a copy of a run without its config.yaml: the defaults in its place had changed every setting, exit 0
    # a copy that dropped latest.pt (a link): both commands had sent the user to the other, "no checkpoint"
    Case("resume-latest-lost-in-a-copy", lambda t, b: _without(t, b, "ppo", "checkpoints/latest.pt"),
         "its newest: link it as latest.pt (ln -sf ckpt_"),
    Case("fresh-in-a-copy-that-lost-latest", lambda t, b: _without(t, b, "ppo", "checkpoints/latest.pt", resume=False),
         "it holds a run without its latest.pt, but checkpoints/ holds ckpt_"),
    Case("resume-without-config-yaml", lambda t, b: _without(t, b, "ppo", "config.yaml"),
         "config.yaml' is missing, and a resume continues with the run's own settings"),
    Case("resume-dqn-without-config-yaml", lambda t, b: _without(t, b, "dqn", "config.yaml", ranks=2),
         "config.yaml' is missing, and a resume continues with the run's own settings"),
    # ---- config files ----
    Case("config-not-utf8", train("--config", "TMP/c.yaml", files={"c.yaml": b"training:\n  seed: \xe9\n"}),
         "is not UTF-8 text (byte 0xe9"),
    Case("config-top-list", train("--config", "TMP/c.yaml", files={"c.yaml": "- 1\n- 2\n"}),
         "the top level must be a mapping of sections"),
    Case("config-top-scalar", train("--config", "TMP/c.yaml", files={"c.yaml": "42\n"}),
         "the top level must be a mapping of sections"),
    Case("config-section-list-with-flag",
         train("--config", "TMP/c.yaml", "--num-envs", "8", files={"c.yaml": "env: [1, 2]\n"}),
         "section 'env' must be a mapping of keys"),
    Case("config-duplicate-key",
         train("--config", "TMP/c.yaml", files={"c.yaml": "training:\n  seed: 1\n  n_steps: 8\n  seed: 2\n"}),
         "duplicate key 'seed' (first given at line 2)"),
    Case("config-yaml-bomb", train("--config", "TMP/c.yaml", files={"c.yaml": BOMB}),
         "its anchors and aliases (&, *) expand to more than 100,000 values"),
    # PyYAML's constructors raise ValueError, not YAMLError, for these (a traceback on every rank before)
    Case("config-yaml-int-past-4300-digits", train("--config", "TMP/c.yaml", files={"c.yaml": f"training:\n  seed: {'7' * 5000}\n"}),
         "a number of more than 4,300 digits"),
    Case("config-yaml-date-that-does-not-exist", train("--set", "training.seed=2026-02-30"),
         "--set training.seed: a value it cannot read (day is out of range for month)"),
    Case("config-is-a-folder", train("--config", "TMP/dir", files={"dir/x": "x"}), "is a folder; give a YAML file"),
    # a value of a section the run does not read (self-play's, under PPO) is still a value: a typo refused
    Case("config-selfplay-choice-under-ppo", train("--config", "configs/toy_cue.yaml", "--set", "selfplay.drop=newest"),
         "selfplay.drop: 'newest' is not one of oldest, lowest_rated"),
    Case("config-selfplay-range-under-ppo", train("--config", "configs/toy_cue.yaml", "--set", "selfplay.elo_k=-1"),
         "selfplay.elo_k: must be in [0, 400], got -1"),
    Case("config-too-large", train("--config", "TMP/c.yaml", files={"c.yaml": "#" * (2 << 20)}),
         "a config is a small YAML file"),
    Case("config-missing", train("--config", "configs/does_not_exist.yaml"), "config file not found"),
    # a FIFO would block the read until a writer comes, a device never end it
    Case("config-is-a-fifo", _fifo_config(), "is a FIFO, not a regular file"),
    Case("config-is-a-device", train("--config", "/dev/zero"), "'/dev/zero' is a character device, not a regular file"),
    Case("config-malformed", train("--config", "TMP/c.yaml", files={"c.yaml": "training:\n  n_steps: [1, 2\n"}),
         "malformed YAML"),
    Case("config-non-string-key", train("--config", "TMP/c.yaml", files={"c.yaml": "training: {1: 2}\n"}),
         "unknown key 'training.1'"),
    # ---- values ----
    Case("nan-timeout", train(*TOY, "--set", "guards.collective_timeout_s=.nan", ranks=2),
         "guards.collective_timeout_s: must be a finite number, got nan"),
    Case("inf-learning-rate", train(*TOY, "--set", "training.learning_rate=.inf"), "must be a finite number"),
    Case("int-beyond-int64", train(*TOY, "--seed", "99999999999999999999"), "training.seed: 99999999999999999999 is out"),
    Case("huge-hidden-size", train(*TOY, "--set", "model.hidden_size=4000000000", ranks=2), "memory: this config needs"),
    # procgen's modes exist for some games only, its levels are 32-bit: a C++ fatal() or an assert otherwise
    Case("procgen-memory-mode-on-a-game-without-it", train("--set", "env.distribution_mode=memory", "--no-progress"),
         "procgen has no 'memory' mode for coinrun; allowed there: easy, hard (and 'memory' for caveflyer, dodgeball"),
    Case("procgen-extreme-mode-on-a-game-without-it", train("--set", "env.name=maze", "--set",
                                                           "env.distribution_mode=extreme", "--no-progress", ranks=2),
         "procgen has no 'extreme' mode for maze"),
    Case("procgen-exploration-with-levels", train("--set", "env.distribution_mode=exploration", "--set",
                                                 "env.num_levels=200", "--no-progress"),
         "the exploration mode plays procgen's one fixed level of the game; leave both at 0"),
    Case("procgen-start-level-past-32-bits", train("--set", "env.start_level=2147483648", "--no-progress"),
         "env.start_level: must be 0 to 2,147,483,647 (procgen's 32-bit level seeds), got 2147483648"),
    Case("procgen-levels-sum-past-32-bits", train("--set", "env.start_level=2147483000", "--set", "env.num_levels=1000",
                                                 "--no-progress", ranks=2),
         "env.start_level + env.num_levels: 2,147,484,000 is past procgen's last level seed"),
    Case("huge-envs-per-rank", train("--num-envs-per-rank", "100000000", "--no-progress"), "memory: this config needs"),
    Case("huge-n-steps", train("--n-steps", "1000000000", "--no-progress"), "memory: this config needs"),
    Case("huge-threads", train(*TOY, "--set", "parallel.threads_per_rank=100000"), "threads per rank on a node"),
    Case("unknown-key", train(*TOY, "--set", "training.lr=1", ranks=2), "unknown key 'training.lr'"),
    Case("wrong-type", train(*TOY, "--set", "training.n_steps=abc"), "training.n_steps: expected int, got 'abc'"),
    Case("unknown-env", train(*TOY, "--set", "env.name=pong"), "unknown environment 'pong'"),
    Case("minibatches", train(*TOY, "--set", "training.num_minibatches=7"), "not divisible by num_minibatches=7"),
    Case("zero-steps", train(*TOY, "--n-steps", "0"), "training.n_steps: must be > 0, got 0"),
    Case("negative-budget", train(*TOY, "--total-timesteps", "-5"), "must be > 0, got -5"),
    Case("bogus-flag", train("--bogus-flag"), "unrecognized arguments: --bogus-flag"),
    Case("guard-world-size-zero", train(*TOY, "--set", "parallel.expected_world_size=0", ranks=2),
         "parallel.expected_world_size: must be a number of ranks >= 1 (the tasks the job was given), or null for any"),
    Case("guard-world-size-negative", train(*TOY, "--set", "parallel.expected_world_size=-4"), "or null for any; got -4"),
    Case("ppo-cuda-without-cuda", train(*TOY, "--device", "cuda", ranks=2), "'cuda' requested but CUDA is not usable"),
    Case("dqn-cuda-without-cuda", train("--config", "configs/dqn_toy.yaml", "--device", "cuda", ranks=2),
         "'cuda' requested but CUDA is not usable"),
    Case("dqn-agents", train("--config", "configs/dqn_toy.yaml", "--set", "dqn.num_agents=2", ranks=2),
         "2 rank(s) cannot form 2 agent(s)"),
    Case("appo-one-rank", train("--config", "configs/appo_toy.yaml"), "appo.num_agents: 1 rank(s) cannot form 1 agent(s)"),
    Case("appo-loss", train("--config", "configs/appo_toy.yaml", "--set", "appo.loss=a2c", ranks=2),
         "appo.loss: 'a2c' is not one of ppo_clip, vtrace_pg"),
    Case("appo-lag-below-sync", train("--config", "configs/appo_toy.yaml", "--set", "appo.weight_sync_period=9", ranks=2),
         "appo.max_policy_lag: 8 is below appo.weight_sync_period=9"),
    Case("appo-minibatches", train("--config", "configs/appo_toy.yaml", "--set", "appo.num_minibatches=7", ranks=2),
         "is not divisible by num_minibatches=7"),
    # ---- the run folder ----
    Case("output-name-too-long", train(*TOY, "--output-dir", "TMP/" + "x" * 300), "File name too long"),
    Case("output-under-a-file", train(*TOY, "--output-dir", "TMP/f/run", files={"f": "x"}), "Not a directory"),
    Case("output-is-a-file", train(*TOY, "--output-dir", "TMP/f", files={"f": "x"}), "f' is a file, not a folder"),
    Case("output-is-a-device", train(*TOY, "--output-dir", "/dev/null"), "'/dev/null' is a character device, not a folder"),
    Case("output-empty", train(*TOY, "--output-dir", ""), "--output-dir: '' is empty; give a folder"),
    # TensorBoard's writer encodes the path as UTF-8: it raised after config.yaml and the folders were made
    Case("output-name-not-utf8", train(*TOY, "--output-dir", "TMP/new/bad\udcffname"),
         "bad\\udcffname' cannot be used: its name is not UTF-8 (byte 0xff)", check=lambda t: not (t / "new").exists()),
    Case("output-name-not-utf8-resume", train("--resume", "--output-dir", "TMP/r\udce9", files={
        "r\udce9/checkpoints/latest.pt": b"not read"}), "its name is not UTF-8 (byte 0xe9)"),
    Case("output-not-empty", train(*TOY, "--output-dir", "TMP/r", files={"r/keep.txt": "keep me"}),
         "exists and is not empty; it holds no run of mpippo's"),
    # a run that failed before its first checkpoint: sent to --resume, which sent it back (no checkpoint)
    Case("output-run-without-checkpoint", train(*TOY, "--output-dir", "TMP/r", files={
        "r/config.yaml": "training:\n  seed: 1\n", "r/logs/metrics.jsonl": ""}), "it holds a run that wrote no "
         "checkpoint, so there is nothing to resume: choose a new folder"),
    Case("output-run-with-checkpoint", train(*TOY, "--output-dir", "TMP/r", files={
        "r/config.yaml": "training:\n  seed: 1\n", "r/checkpoints/latest.pt": b"not read"}),
         "pass --resume to continue that run"),
    Case("bad-input-removes-new-folders", train(*TOY, "--output-dir", "TMP/new/run", "--set", "training.lr=1", ranks=2),
         "unknown key", check=lambda t: not (t / "new").exists()),
    Case("resume-without-checkpoint", train("--resume", "--output-dir", "TMP/empty", files={"empty/x": ""}),
         "--resume: no checkpoint at"),
    Case("resume-checkpoint-is-folder", train("--resume", "--output-dir", "TMP/r", files={"r/checkpoints/latest.pt/x": ""}),
         "--resume: no checkpoint at"),
    # ---- evaluate ----
    Case("evaluate-max-steps-0", evaluate("ppo", extra=["--max-steps", "0"]), "--max-steps: must be >= 1, got 0"),
    Case("evaluate-test-levels-of-exploration-mode", evaluate("coinrun", set_key("config.env.distribution_mode",
                                                                              "exploration"), extra=["--levels", "test"]),
         "--levels: the run trained 'coinrun' in procgen's exploration mode, whose games have one fixed level"),
    Case("evaluate-episodes-0", evaluate("ppo", extra=["--num-episodes", "0"]), "--num-episodes: must be >= 1"),
    Case("evaluate-video-not-mp4", evaluate("ppo", extra=["--video", "x.gif"]), "must end in .mp4"),
    Case("evaluate-video-unwritable", lambda t, b: _with_file(t, evaluate("ppo", extra=["--video", f"{t}/f/v.mp4"])(t, b)),
         "--video: cannot write", check=lambda t: sorted(p.name for p in t.iterdir()) == ["f"]),
    Case("evaluate-json-under-a-file", lambda t, b: _with_file(t, evaluate("ppo", extra=["--json", f"{t}/f/r.json"])(t, b)),
         "/f' is a file, not a folder", check=lambda t: sorted(p.name for p in t.iterdir()) == ["f"]),
    Case("evaluate-json-is-folder", lambda t, b: evaluate("ppo", extra=["--json", str(t)])(t, b), "is a folder"),
    Case("evaluate-huge-envs", evaluate("ppo", extra=["--num-envs", "1000000000"]), "--num-envs: 1,000,000,000 envs"),
    Case("evaluate-no-checkpoint", evaluate("ppo", extra=["--checkpoint", "/nonexistent"]), "no checkpoint at"),
    Case("evaluate-opponent-one-player", evaluate("ppo", extra=["--opponent", "random"]), "needs a two-player game"),
    # ---- several problems, or a value holding a line break: still one line ----
    Case("config-two-problems-2-ranks", train(*TOY, "--set", "training.gamma=2", "--set", "training.n_steps=0", ranks=2),
         "; training."),  # (both named, '; ' between them, on the one line)
    Case("config-file-name-two-lines", train("--config", "TMP/x\ny.yaml", "--no-progress"),
         "/x\\ny.yaml'"),  # (escaped: before, the name's line break split the line, the rest unlabelled)
    # ---- environment variables, garbled: one line, not a traceback (a test hook's at import) ----
    Case("env-fault-hook-garbled-2-ranks", _with_env(train(*TOY, ranks=2), MPIPPO_FAULT="rank=one,kind=slow"),
         "MPIPPO_FAULT: 'rank=one,kind=slow' is not rank=R[+R...],iteration=N,kind=K"),
    Case("env-cuda-devices-two-lines", _with_env(train(*TOY, "--set", "training.device=cuda"),
                                                 CUDA_VISIBLE_DEVICES="0\nGPU-1"),
         "CUDA is not usable here (CUDA_VISIBLE_DEVICES=0\\nGPU-1)"),
    # the thread count auto takes, past the node's cores: torch's first op died of SIGSEGV (100000), or hung (5000)
    Case("env-omp-threads-past-the-cores", _with_env(train(*TOY), OMP_NUM_THREADS="100000"),
         "OMP_NUM_THREADS=100000: threads per rank (parallel.threads_per_rank 0, auto, takes it) on a node of"),
    Case("env-slurm-cpus-past-the-cores-2-ranks", _with_env(train(*TOY, ranks=2), OMP_NUM_THREADS="", SLURM_CPUS_PER_TASK="4096"),
         "SLURM_CPUS_PER_TASK=4096: threads per rank"),
    Case("evaluate-env-fault-hook-unknown-kind", _with_env(evaluate("ppo"), MPIPPO_FAULT="kind=melt"),
         "MPIPPO_FAULT: kind 'melt' is not one of raise, kill, hang"),
    # ---- the launcher ----
    Case("launch-n-0", launch("-n", "0"), "-n: the number of ranks must be >= 1, got 0"),
    Case("launch-n-negative", launch("-n", "-3"), "got -3"),
    Case("launch-n-not-int", launch("-n", "two"), "invalid int value: 'two'"),
    Case("launch-n-beyond-memory", launch("-n", "100000"), "-n: 100,000 rank(s) need at least"),  # was started
    Case("launch-slurm-node-count-not-a-count", _with_env(launch("-n", "100000"), SLURM_JOB_NUM_NODES="²"),
         "-n: 100,000 rank(s) need at least"),  # ("²".isdigit(), but int() refuses it: a traceback before)
    # a node count with no Slurm job beside it is not an allocation's: mpirun starts every rank here
    Case("launch-slurm-node-count-outside-a-job", _with_env(launch("-n", "100000"), SLURM_JOB_ID="", SLURM_JOB_NUM_NODES="100000"),
         "-n: 100,000 rank(s) need at least"),
    Case("launch-slurm-node-count-job-not-a-number", _with_env(launch("-n", "100000"), SLURM_JOB_ID="abc",
                                                               SLURM_JOB_NUM_NODES="100000"), "-n: 100,000 rank(s) need at least"),
    Case("launch-mpirun-args-quote", launch("-n", "1", "--mpirun-args", '--map-by "core'),
         "--mpirun-args: '--map-by \"core' cannot be split as a shell would (No closing quotation)"),
    # Open MPI's session folder: mpirun's own box of text and its status 213 before
    Case("launch-tmpdir-a-device", _with_env(launch("-n", "1"), TMPDIR="/dev/null"),
         "TMPDIR='/dev/null' is a character device, not a folder: set TMPDIR to a folder you can write in"),
    Case("launch-temp-under-a-file", _with_env(launch("-n", "1"), TMPDIR=None, TEMP="/proc/version/x"),
         "TEMP='/proc/version/x' lies under '/proc/version', which is a file, not a folder"),
    # ---- one writer per run folder (another process holds the folder's lock) ----
    Case("lock-fresh-run-into-a-locked-folder", lambda t, b: _locked(t, None, TOY), "is in use: process",
         check=lambda t: _unlock(t)),
    Case("lock-fresh-run-2-ranks", lambda t, b: _locked(t, None, TOY, ranks=2), "is in use: process", check=lambda t: _unlock(t)),
    # srun without PMIx: N one-rank jobs race for one folder; the launch mistake is named first, not the lock
    Case("lock-separate-jobs-of-one-launch", lambda t, b: _locked(t, None, [*TOY, "--set", "parallel.expected_world_size=2"]),
         "parallel.expected_world_size: 2 tasks were allocated but this job has 1 rank(s)", check=lambda t: _unlock(t)),
    Case("lock-separate-jobs-of-one-launch-config-file", lambda t, b: _locked(t, None, _expecting(t, 3)),
         "parallel.expected_world_size: 3 tasks were allocated but this job has 1 rank(s)", check=lambda t: _unlock(t)),
    Case("lock-resume-while-another-trains", lambda t, b: _locked(t, b["ppo"], []), "holds its lock", check=lambda t: _unlock(t)),
    Case("lock-resume-dqn-3-ranks", lambda t, b: _locked(t, b["dqn"], [], ranks=3), "holds its lock", check=lambda t: _unlock(t)),
    Case("lock-file-deleted-while-held", lambda t, b: _locked(t, None, TOY, delete=True),
         "is in use: another process holds its lock", check=lambda t: _unlock(t)),
    Case("lock-fresh-run-inside-a-locked-folder", lambda t, b: _locked(t, None, TOY, inside="mine/seed_1"),
         "seed_1' is inside '", check=lambda t: _unlock(t) and not (t / "run" / "mine" / "seed_1" / ".mpippo.lock").exists()),
    Case("lock-resume-inside-a-locked-folder-2-ranks", lambda t, b: _locked(t, b["ppo"], [], ranks=2, inside="old"),
         "old' is inside '", check=lambda t: _unlock(t)),
    Case("lock-agent-folder-of-a-running-job", lambda t, b: _agents_training(t),
         "agent_0' is in use: process", check=lambda t: _unlock(t)),
    # ---- the lock file is something else: refused by name, never followed, opened or written ----
    Case("lock-symlink-to-a-user-file", _odd_lock("symlink"), LOCK_IS.format("a symbolic link")),
    Case("lock-dangling-symlink", _odd_lock("dangling"), LOCK_IS.format("a symbolic link"),
         check=lambda t: not os.path.lexists(t / "made-by-nobody")),
    Case("lock-fifo", _odd_lock("fifo"), LOCK_IS.format("a FIFO")),
    Case("lock-is-a-folder", _odd_lock("folder", ranks=2), LOCK_IS.format("a folder")),
    Case("lock-resume-symlink-to-own-checkpoint", _odd_lock("symlink-checkpoint", base="ppo"),
         LOCK_IS.format("a symbolic link")),
    Case("lock-resume-fifo-dqn", _odd_lock("fifo", base="dqn", ranks=2), LOCK_IS.format("a FIFO")),
    Case("lock-resume-hardlink-refused-later", _odd_lock("hardlink", base="ppo", extra=["--set", "env.num_levels=5"]),
         "env.num_levels: 5 is read by procgen envs only", check=lambda t: (t / "mine.txt").read_text() == "the user's file\n"),
    # ---- W&B: each of its failures one line, decided before anything is written ----
    Case("wandb-online-without-login", with_wandb(train(*TOY), "online"),
         "logging.wandb: W&B refused to start the run in online mode (UsageError: No API key configured",
         check=lambda t: not (t / "out").exists()),
    Case("wandb-online-without-login-dqn", with_wandb(train("--config", "configs/dqn_toy.yaml", ranks=2), "online"),
         "log in first (wandb login, or WANDB_API_KEY)", check=lambda t: not (t / "out").exists()),
    Case("wandb-broken-install", with_wandb(train(*TOY, ranks=2), fake=WANDB_BROKEN),
         "the wandb package is installed but does not import (ImportError: libwandb_core.so"),
    Case("wandb-no-network", with_wandb(train(*TOY), "online", fake=WANDB_NO_NETWORK),
         "(ConnectionError: Network is unreachable: api.wandb.ai); log in first"),
    # W&B reads its WANDB_ variables over what it is given: the line blamed the config and the run folder
    Case("wandb-mode-garbled-in-the-environment", with_wandb(train(*TOY), WANDB_MODE="garbage"),
         "W&B also reads WANDB_MODE='garbage', WANDB_BASE_URL=", check=lambda t: not (t / "out").exists()),
    Case("wandb-mode-garbled-in-the-environment-2-ranks", with_wandb(train(*TOY, ranks=2), WANDB_MODE="sometimes"),
         "', WANDB_API_KEY, WANDB_", check=lambda t: not (t / "out").exists()),  # (a key by name only, after those W&B reads over the config)
    Case("wandb-project-refused", train(*TOY, "--set", "logging.wandb=offline", "--set", "logging.wandb_project=lab#1"),
         "logging.wandb_project: 'lab#1' is not a W&B project name: 1 to 128 characters, none of / \\ # ? % : (it has #)"),
    Case("wandb-yaml-on", train(*TOY, "--config", "TMP/c.yaml", files={"c.yaml": "logging:\n  wandb: on\n"}),
         "logging.wandb: YAML reads a bare on/yes/true as true, not a word; write one of off, offline, online"),
    Case("wandb-resume-id-damaged", with_wandb(resume("ppo", None), prepare=lambda r: (r / "wandb-id").write_text(
        "bad id/x\n")), "wandb-id' holds 'bad id/x', not a W&B run id"),
    Case("wandb-resume-id-is-a-folder", with_wandb(resume("ppo", None), prepare=lambda r: (r / "wandb-id").mkdir()),
         "wandb-id' is not a small regular file; it names the W&B run this folder continues"),
    Case("wandb-resume-dir-is-a-file", with_wandb(resume("ppo", None), prepare=lambda r: (r / "wandb").write_text("x")),
         "wandb' is not a folder (W&B keeps its files there)"),
    Case("wandb-resume-refused-keeps-config", with_wandb(resume("dqn", None, ranks=2), "online", fake=WANDB_NO_NETWORK),
         "W&B refused to start the run in online mode"),
    # ---- resumes that would change the job ----
    Case("resume-other-game", resume("coinrun", None, extra=["--set", "env.name=bigfish"]),
         "the checkpoint's environment is 'coinrun', this config asks for 'bigfish'"),
    Case("resume-other-mode", resume("coinrun", None, ranks=2, extra=["--set", "env.distribution_mode=hard"]),
         "the checkpoint's distribution mode is 'easy'"),
    # Procgen's levels on a resume of a toy-cue run: keys its family does not read (a Procgen run's other
    # levels are refused by the resume's check: tests/unit/test_reshard.py)
    Case("resume-other-levels", resume("ppo", None, extra=["--set", "env.num_levels=5"]),
         "env.num_levels: 5 is read by procgen envs only; env.name 'toy-cue' is of the toy-cue family: remove it"),
    Case("resume-dqn-other-levels", resume("dqn", None, ranks=2, extra=["--set", "env.start_level=7"]),
         "env.start_level: 7 is read by procgen envs only"),
    Case("resume-appo-other-algo", resume("appo", None, ranks=2, extra=["--set", "training.algo=dqn", "--set",
                                                                     "dqn.learning_starts=10"]),
         "it is from algorithm 'appo'"),
    # ---- checkpoints larger than memory: refused by their size, never read ----
    Case("ckpt-sparse-terabyte", lambda t, b: _sparse(t, b, "ppo"), "reading it needs twice that"),
    Case("ckpt-sparse-terabyte-dqn", lambda t, b: _sparse(t, b, "dqn", ranks=2), "reading it needs twice that"),
    Case("evaluate-sparse-terabyte", lambda t, b: _sparse(t, b, "ppo", evaluate=True), "reading it needs twice that"),
    # fits one copy, not one per rank of this node (rank 0 reads it for them all): refused before any is read
    Case("ckpt-sparse-one-copy-per-rank", lambda t, b: _sparse(t, b, "ppo", ranks=2, size=_one_copy_fits()),
         "reading it needs twice that on each of this node's 2 ranks"),
    Case("evaluate-sparse-one-copy-per-rank", lambda t, b: _sparse(t, b, "ppo", ranks=2, evaluate=True,
                                                                   size=_one_copy_fits()),
         "reading it needs twice that on each of this node's 2 ranks"),
]

# ---- checkpoints the schema refuses, checked in-process against checkpoint.load_checkpoint, what the
# trainer and evaluate call on every rank; the process table above keeps an end-to-end case of each
# path (sync, actor-learner, evaluate: a planted object, a missing key) that shows the refusal
# becomes one line and exit 2 there. A whole trainer start per schema case cost about 1.4 s of CPU. ----
SCHEMA = [  # (id, base run, edit of its latest.pt's state, what the message says)
    ("wrong-type", "ppo", set_key("timesteps", "many"), "timesteps: expected an int"),
    ("top-level-list", "ppo", lambda s: [1, 2, 3], "checkpoint: expected a mapping"),
    ("weight-shape", "ppo", lambda s: s["model"].update({"fc.weight": torch.zeros(3, 3)}),
     "model.fc.weight: expected a torch.float32 tensor of shape"),
    ("adam-moment-shape", "ppo", set_key("optimizer.state.0.exp_avg", torch.zeros(7)), "optimizer.state[0].exp_avg"),
    ("adam-step", "ppo", set_key("optimizer.state.0.step", "twelve"),
     "optimizer.state[0].step: expected a torch.float32 tensor of shape ()"),
    ("obs-dtype", "ppo", lambda s: s["ranks"][0].update(obs=s["ranks"][0]["obs"].astype("float32")),
     "ranks[0].obs: expected a u1 array"),
    ("rng-state", "ppo", lambda s: s["ranks"][0]["rng"].update(numpy=("MT19937", [1, 2], 0, 0, 0.0)),
     "ranks[0].rng.numpy: not a valid numpy RandomState state"),
    ("env-state", "ppo", lambda s: s["ranks"][0]["env"].update(cue=[1, 2]), "ranks[0].env.cue"),
    ("world-size", "ppo", set_key("world_size", 0), "world_size: expected an int in [1"),
    ("config-inside", "ppo", set_key("config.model.hidden_size", "wide"), "config: model.hidden_size: expected int"),
    ("other-algo", "ppo", set_key("algo", "dqn"), "it is from algorithm 'dqn', this run is ppo"),
    ("appo-lag-histogram", "appo", set_key("lag_hist", np.zeros(3, dtype=np.int64)),
     "lag_hist: expected a i array of shape (17,)"),
    ("dqn-replay-outside", "dqn", set_key("replay_file", "/etc/passwd"),
     "replay_file: expected null, 'replay.npz' or replay_<update>.npz"),
    ("dqn-resumes", "dqn", set_key("resumes", -1), "resumes: expected an int in [0"),
    ("appo-resumes", "appo", set_key("resumes", "twice"), "resumes: expected an int in [0"),
]


@pytest.mark.slow
@pytest.mark.parametrize("base,edit,expect", [pytest.param(*c[1:], id=f"ckpt-{c[0]}") for c in SCHEMA])
def test_the_checkpoint_schema_refuses_in_one_line(bases, base, edit, expect):
    from mpippo.checkpoint import load_checkpoint
    from mpippo.usage import UsageError
    with pytest.raises(UsageError) as e:  # the base's algorithm is the run's, as the trainer passes it
        load_checkpoint(edited_checkpoint(latest_path(bases[base]), edit), "checkpoint", base)
    assert len(e.value.errors) == 1 and "\n" not in e.value.errors[0] and expect in e.value.errors[0], e.value.errors


_HOLDERS: dict[Path, subprocess.Popen] = {}


def _expecting(tmp: Path, ranks: int) -> list[str]:
    """TOY's arguments with a config file of its own that expects `ranks` ranks (not a --set)."""
    config = tmp / "expects.yaml"
    config.write_text((ROOT / "configs" / "toy_cue.yaml").read_text() + f"parallel:\n  expected_world_size: {ranks}\n")
    return ["--config", str(config), *TOY[2:]]


def _locked(tmp: Path, base: Path | None, args: list[str], ranks=None, delete=False, inside=""):
    """A run folder (a copy of `base`, or an empty one) whose lock another process holds (and then
    deleted, with `delete`); the case trains into it (--resume when it is a copy), or into the folder
    `inside` below it (the copy then goes there). The holder goes in the case's check (_unlock)."""
    held = tmp / "run"
    run_dir = held / inside
    shutil.copytree(base, run_dir) if base else run_dir.mkdir(parents=True)
    then = f"import os; os.unlink({str(held / '.mpippo.lock')!r}); " if delete else ""
    code = (f"from mpippo import runlock; import time; runlock.acquire({str(held)!r}); {then}"
            f"print('held', flush=True); time.sleep(90)")
    # (an environment of its own: started from the table's threads, a child that reads the process's own while
    # another thread changes it can fail its exec, "Bad address", as once in CI)
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ))
    assert holder.stdout.readline().strip() == "held"
    _HOLDERS[tmp] = holder
    return ranks, ["run_mpi.py", *args, "--no-progress", "--output-dir", str(run_dir), *(["--resume"] if base else [])]


def _agents_training(tmp: Path):
    """A real two-agent DQN job training into TMP/run; the case resumes one agent's folder."""
    run_dir = tmp / "run"
    job = subprocess.Popen([MPIRUN, "--oversubscribe", "-n", "4", sys.executable, "run_mpi.py", "--config",
                            "configs/dqn_toy.yaml", "--no-progress", "--set", "dqn.num_agents=2", "--total-timesteps",
                            "100000000", "--output-dir", str(run_dir)], cwd=ROOT, env=mpi_env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _HOLDERS[tmp] = job
    deadline = time.monotonic() + 120
    while not (run_dir / "agent_1").is_dir() or runlock.holder(run_dir / "agent_1") is None:
        assert job.poll() is None and time.monotonic() < deadline, "the two-agent job did not start"
        time.sleep(0.2)
    return None, ["run_mpi.py", "--config", "configs/dqn_toy.yaml", "--resume", "--no-progress", "--output-dir",
                  str(run_dir / "agent_0")]


def _unlock(tmp: Path) -> bool:
    proc = _HOLDERS.pop(tmp)
    os.killpg(proc.pid, signal.SIGKILL) if proc.args[0] == MPIRUN else proc.kill()
    proc.wait()
    return True


def _sparse(tmp: Path, bases, base: str, ranks=None, evaluate=False, size=2**40):
    """A copy of a base run whose latest.pt is a sparse file of `size` bytes (no disk used)."""
    run_dir = tmp / "run"
    shutil.copytree(bases[base], run_dir)
    latest = next(run_dir.rglob("latest.pt"))
    latest.unlink()
    with open(latest, "wb") as f:
        f.truncate(size)
    if evaluate:
        return ranks, ["-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--num-episodes", "2"]
    return ranks, ["run_mpi.py", "--resume", "--no-progress", "--output-dir", str(run_dir)]


def _one_copy_fits() -> int:
    """A size whose bytes and tensors (twice it) fit this node's free memory once, with room to spare
    for what other tests take meanwhile, but not twice."""
    import psutil
    return int(psutil.virtual_memory().available * 0.35)


def _without(tmp: Path, bases, base: str, name: str, ranks=None, resume=True):
    """A copy of a base run without one of its files."""
    run_dir = tmp / "run"
    shutil.copytree(bases[base], run_dir)
    (run_dir / name).unlink()
    return ranks, ["run_mpi.py", *(["--resume"] if resume else []), "--no-progress", "--output-dir", str(run_dir)]


def _truncated(tmp, bases, copy=False):
    run_dir = tmp / "run"
    shutil.copytree(bases["ppo"], run_dir)
    latest = latest_path(run_dir)
    data = latest.read_bytes()
    if copy:  # (a file of its own, as cp -r makes of the hard link)
        latest.unlink()
    latest.write_bytes(data[:1000])
    return None, ["run_mpi.py", "--resume", "--no-progress", "--output-dir", str(run_dir)]


def _with_file(tmp, setup_result):
    (tmp / "f").write_text("a file where a folder should be")
    return setup_result


def _needs_bases(case: Case) -> bool:
    return case.id.startswith(("ckpt-", "evaluate-", "dqn-replay", "resume-", "lock-resume", "lock-agent", "wandb-resume")) \
        or "planted" in case.id


for _c in CASES:  # cases that start from a trained checkpoint (and the evaluate ones) are slow
    _c.slow = _needs_bases(_c)
    if _c.slow:
        _c.kept = lambda tmp, bases: [bases["ppo"]]


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict:
    # a job some case started and whose check did not run (a failed case, or the case's test given to
    # another xdist worker) must not train on after the module
    request.addfinalizer(lambda: [_unlock(t) for t in list(_HOLDERS)])
    return hostile.outcomes(request, tmp_path_factory, CASES, "test_hostile_input",
                            lambda: request.getfixturevalue("bases"))


@pytest.mark.parametrize("case", hostile.params(CASES))
def test_hostile_input(case: Case, outcomes):
    hostile.check(case, outcomes[case.id].result())


def test_every_case_class_is_covered():
    """The issue's classes, at least 40 cases in all."""
    assert len(CASES) >= 40
    for word in ("planted", "ckpt-", "config-", "huge-", "output-", "evaluate-", "launch-", "wandb-", "lock-"):
        assert any(word in c.id for c in CASES), word


# ---- signals from the first instant ----
def _listening_ranks(proc, n=2):
    """The n ranks under `proc`, once every one of them catches SIGUSR1 (run_mpi.py's first line). A job
    Open MPI failed to start is started again (Started.again, as wait_for_line does); one that ended
    otherwise fails the test at once, with its output (it waited out the whole timeout, saying nothing)."""
    def ready():
        if proc.poll() is not None:
            err = proc.stderr.read()
            if not proc.again(err):
                pytest.fail(f"the job ended (exit {proc.returncode}) before its ranks listened: {err[-2000:]}")
            return None
        ranks = rank_processes(proc)
        return ranks if len(ranks) == n and all(catches_usr1(p.pid) for p in ranks) else None
    return wait_until(ready, "the ranks' handlers")


def _signal_during_startup(cmd, run_dir: Path, sig, delays, pick):
    """Send `sig` to pick(proc) `delay` seconds after it is ready (see pick), for each delay in turn
    until one lands before the first iteration; returns that run's (exit code, output). Waiting for
    the handlers (not a fixed time) keeps it independent of the machine's load."""
    for delay in delays:
        for _ in range(STARTS):  # (again where Open MPI failed to start the job: conftest.relaunched)
            shutil.rmtree(run_dir, ignore_errors=True)
            proc = start([*cmd, "--output-dir", str(run_dir)])
            targets = pick(proc)
            time.sleep(delay)
            for p in targets:
                p.send_signal(sig)
            rc, out, err = finish(proc)
            if not launch_failed(rc, err + out, cmd):
                break
        out += err
        if "iter " not in out and "starting:" not in out:
            return rc, out
    pytest.fail(f"no delay in {delays} landed before the first iteration")


TRAIN_2 = [MPIRUN, "--oversubscribe", "-n", "2", sys.executable, "run_mpi.py", "--config", "configs/smoke.yaml",
           "--no-progress", "--set", "logging.print_interval=1"]


@pytest.mark.slow
def test_sigusr1_to_mpirun_during_startup_exits_3_with_nothing_written(tmp_path):
    """mpirun forwards it to ranks that are still importing torch: they already listen."""
    run_dir = tmp_path / "run"
    rc, out = _signal_during_startup(TRAIN_2, run_dir, signal.SIGUSR1, (0.0, 0.2),
                                     lambda proc: (_listening_ranks(proc), [proc])[1])
    assert rc == 3, out[-2000:]
    assert "SIGUSR1 arrived during start-up: nothing was trained yet" in out
    assert "Traceback" not in out and not run_dir.exists()  # the empty folder it made is gone


@pytest.mark.slow
def test_sigterm_to_one_rank_during_startup_exits_4(tmp_path):
    rc, out = _signal_during_startup(TRAIN_2, tmp_path / "run", signal.SIGTERM, (0.0, 0.2),
                                     lambda proc: _listening_ranks(proc)[-1:])
    assert rc == 4, out[-2000:]
    assert "a stop signal arrived during start-up" in out and "Traceback" not in out


@pytest.mark.slow
def test_sigusr1_to_the_launcher_before_mpirun_runs_is_held_and_passed_on(tmp_path):
    """Sent as soon as the launcher itself listens, before its ranks do: held, then passed on."""
    cmd = [sys.executable, "-m", "mpippo.launch", "-n", "2", "--mpirun-args=--oversubscribe", "--config",
           "configs/smoke.yaml", "--no-progress"]

    def launcher(proc):
        wait_until(lambda: catches_usr1(proc.pid), "the launcher's handlers")
        return [proc]
    rc, out = _signal_during_startup(cmd, tmp_path / "run", signal.SIGUSR1, (0.0,), launcher)
    assert rc == 3, out[-2000:]
    assert "SIGUSR1 arrived during start-up" in out


# ---- signals repeated during a stop, in every layout: the first stop's outcome holds ----
LONG = ["--no-progress", "--total-timesteps", "100000000", "--set", "logging.print_interval=1"]
REPEATED = {  # id: (command before --output-dir, a line that says training runs, whom to signal, signal, exit)
    "appo-sigusr1-to-mpirun": ([MPIRUN, "--oversubscribe", "-n", "3", sys.executable, "run_mpi.py", "--config",
                                "configs/appo_toy.yaml", *LONG], "agent 0 |", "mpirun", signal.SIGUSR1, 3),
    "dqn-sigterm-to-ranks": ([MPIRUN, "--oversubscribe", "-n", "3", sys.executable, "run_mpi.py", "--config",
                              "configs/dqn_toy.yaml", *LONG], "agent 0 |", "ranks", signal.SIGTERM, 4),
    "ppo-sigterm-to-launcher": ([sys.executable, "-m", "mpippo.launch", "-n", "2", "--mpirun-args=--oversubscribe",
                                 "--config", "configs/toy_cue.yaml", *LONG], "iter ", "mpirun", signal.SIGTERM, 4),
    # a hangup (the terminal closed): it killed the launcher alone, and MPI_Init's handler swallowed it in a rank
    "ppo-sighup-to-launcher": ([sys.executable, "-m", "mpippo.launch", "-n", "2", "--mpirun-args=--oversubscribe",
                                "--config", "configs/toy_cue.yaml", *LONG], "iter ", "mpirun", signal.SIGHUP, 4),
    "ppo-sighup-to-one-rank": ([sys.executable, "run_mpi.py", "--config", "configs/toy_cue.yaml", *LONG], "iter ",
                               "mpirun", signal.SIGHUP, 4),
    # a soft CPU-time limit's warning, sent again each CPU second until the hard limit: it killed the rank (152)
    "ppo-sigxcpu-to-ranks": ([MPIRUN, "--oversubscribe", "-n", "2", sys.executable, "run_mpi.py", "--config",
                              "configs/toy_cue.yaml", *LONG], "iter ", "ranks", signal.SIGXCPU, 4),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REPEATED))
def test_signals_repeated_during_a_stop_keep_its_exit_code(name, tmp_path):
    """Slurm may send SIGUSR1 more than once, a wrapper SIGTERM more than once: every 20 ms until the
    job ends, through the checkpoint and MPI's shutdown. Before, a rank died of the second SIGUSR1 in
    MPI_Finalize (Python's shutdown restores the default action first): exit 138."""
    cmd, line, whom, sig, code = REPEATED[name]
    run_dir = tmp_path / "run"
    tag = f"repeat-{name}-{os.getpid()}"
    proc = start([*cmd, "--output-dir", str(run_dir)], env={hostile.MARK: tag})
    wait_for_line(proc, line)
    sent, deadline = 0, time.monotonic() + 90
    while proc.poll() is None and time.monotonic() < deadline:
        for p in ([proc] if whom == "mpirun" else rank_processes(proc)):
            try:
                p.send_signal(sig)
                sent += 1
            except (OSError, ProcessLookupError, Exception):
                pass
        time.sleep(0.02)
    rc, out, err = finish(proc)
    assert rc == code, (rc, sent, out[-1500:], err[-2500:])
    assert sent > 3 and "Traceback" not in out + err
    assert list(run_dir.rglob("latest.pt")), "no checkpoint"
    assert not hostile.survivors(tag, timeout=10)  # none trains on, orphaned


def _soft_cpu_limit(seconds: int) -> Callable[[], None]:
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 100))


@pytest.mark.slow
def test_a_soft_cpu_time_limit_stops_the_job_with_a_checkpoint(tmp_path):
    """`ulimit -S -t` (a login node's, or a batch system's soft CPU limit, as Grid Engine's s_cpu): the
    kernel sends a rank SIGXCPU once its CPU time reaches it, then each CPU second until the hard limit
    kills. The rank had died of the first: status 152, no line from mpippo, nothing since the last
    checkpoint. Now it is a stop (the ranks agree on it): a checkpoint, one line, exit 4, resumable."""
    run_dir = tmp_path / "run"
    proc = start([MPIRUN, "--oversubscribe", "-n", "2", sys.executable, "run_mpi.py", "--config", "configs/toy_cue.yaml",
                  *LONG, "--output-dir", str(run_dir)], preexec_fn=_soft_cpu_limit(8))
    rc, out, err = finish(proc, timeout=150)
    assert rc == 4 and "stopped by a signal after a checkpoint" in out + err, (rc, out[-1500:], err[-1500:])
    assert "s of CPU, its soft CPU-time limit (ulimit -S -t): it checkpoints and stops" in err, err[-1500:]
    assert "Traceback" not in out + err and (run_dir / "checkpoints" / "latest.pt").exists()


def _file_size_limit(kib: int) -> Callable[[], None]:
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, resource.RLIM_INFINITY))


@pytest.mark.slow
def test_a_checkpoint_past_the_file_size_limit_names_the_limit_and_what_is_kept(tmp_path):
    """`ulimit -f` below a checkpoint's size: the write fails "File too large" (Python ignores SIGXFSZ),
    which had blamed nothing and said "the previous checkpoint is intact" of a run that had none. The
    line names the limit and how to raise it, and what is kept; a resume without the limit goes on."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "run_mpi.py", "--config", "configs/toy_cue.yaml", "--no-progress", "--output-dir",
           str(run_dir), "--set", "checkpoint.interval_iterations=1"]
    rc, out, err = finish(start(cmd, preexec_fn=_file_size_limit(100)), timeout=120)
    assert rc == 1 and "Traceback" not in out + err, (rc, err[-1500:])
    assert "File too large: this process's file-size limit (ulimit -f) is 100 KiB; raise it (ulimit -f unlimited)" in err
    assert "no checkpoint had been written yet" in err and not (run_dir / "checkpoints" / "latest.pt").exists(), err
    rc, out, err = finish(start([*cmd, "--total-timesteps", "4096"]), timeout=120)  # (again: its folder is a run's)
    assert rc == 2 and "it holds a run that wrote no checkpoint, so there is nothing to resume" in err, err[-1500:]
    rc, out, err = finish(start([*cmd[:-2], "--total-timesteps", "8192", "--set", "checkpoint.interval_iterations=1",
                                 "--output-dir", str(tmp_path / "run2")]), timeout=120)
    assert rc == 0, err[-1500:]
    size = (tmp_path / "run2" / "checkpoints" / "latest.pt").stat().st_size
    rc, out, err = finish(start([*cmd[:-4], "--output-dir", str(tmp_path / "run2"), "--resume", "--total-timesteps",
                                 "16384", "--set", "checkpoint.interval_iterations=1"],
                                preexec_fn=_file_size_limit(size // 2048)), timeout=120)
    assert rc == 1 and "; the previous checkpoint is intact" in err and "(ulimit -f)" in err, err[-1500:]
    assert (tmp_path / "run2" / "checkpoints" / "latest.pt").stat().st_size == size


def _memory_limit(kib: int) -> Callable[[], None]:
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (kib * 1024, resource.RLIM_INFINITY))


@pytest.mark.parametrize("entry", ["trainer", "launcher", "evaluate"])
def test_a_virtual_memory_limit_too_small_for_torch_is_one_line_naming_it(tmp_path, entry, bases):
    """`ulimit -v` (a login node's): torch's libraries cannot be mapped. It had been an ImportError
    traceback on every rank; now one line per rank names the limit and how to raise it, exit 1."""
    cmd = {"trainer": [sys.executable, "run_mpi.py", "--config", "configs/toy_cue.yaml"],
           "launcher": [sys.executable, "-m", "mpippo.launch", "-n", "2", "--config", "configs/toy_cue.yaml"],
           "evaluate": [sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(bases["ppo"])]}[entry]
    if entry != "evaluate":
        cmd += ["--no-progress", "--output-dir", str(tmp_path / "run")]
    rc, out, err = finish(start(cmd, preexec_fn=_memory_limit(300_000)), timeout=120)
    said = error_lines(err)  # (after mpirun's abort banner, whose last byte is a NUL)
    assert rc == 1 and "Traceback" not in err and said, (rc, err[-2000:])
    assert all("out of memory (ImportError: " in line and "(ulimit -v) is 300000 KiB; raise it (ulimit -v unlimited)"
               in line for line in said), said
    assert len(said) == 1 or (entry == "launcher" and len(said) == 2), said  # (the first rank's abort may end the other first)


def test_a_launch_open_mpi_fails_under_a_small_open_file_limit_names_the_limit(tmp_path):
    """`ulimit -n 20`: Open MPI's runtime fails on its pipes (its own box, status 186 or 213, or a hang the
    watch ends) with no word of mpippo's; the launcher's last line names the limit and how to raise it."""
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cmd = [sys.executable, "-m", "mpippo.launch", "-n", "2", "--config", "configs/toy_cue.yaml", "--no-progress",
           "--output-dir", str(tmp_path / "run")]
    rc, out, err = finish(start(cmd, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (20, hard))),
                          timeout=150)
    assert rc not in (0, 2) and "Traceback" not in err, (rc, err[-2000:])
    assert "Open MPI's runtime may have failed on a limit: this process's open-file limit (ulimit -n) is 20 files" \
        in err.strip().splitlines()[-1], err[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("tensorboard, then", [("true", None), ("false", None), ("true", "made"), ("false", "restored")])
def test_a_run_folder_moved_away_while_it_trains_ends_the_run_in_one_line_and_resumes_there(tmp_path, tensorboard,
                                                                                             then):
    """`mv runs/x runs/y` while x trains (a tidy-up, a clash of names): TensorBoard's writer thread met its
    vanished file and the job ended with a traceback per rank; without TensorBoard the next checkpoint made
    the old folder again, empty and unlocked, and trained on there. Now one line names the folder gone,
    nothing is made at the old path, and the moved folder resumes. A folder put at the old path meanwhile
    (`mkdir`, or a copy restored there, which a second trainer may resume) is never written by the first:
    it had ended in a traceback (made), or both wrote one checkpoints/ (restored)."""
    run_dir, moved = tmp_path / "run", tmp_path / "moved"
    proc = start([MPIRUN, "--oversubscribe", "-n", "2", sys.executable, "run_mpi.py", "--config", "configs/toy_cue.yaml",
                  *LONG, "--set", "checkpoint.interval_iterations=5", "--set", f"logging.tensorboard={tensorboard}",
                  "--output-dir", str(run_dir)])
    wait_for_line(proc, "iter ")
    deadline = time.monotonic() + 60
    while not (run_dir / "checkpoints" / "latest.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    run_dir.rename(moved)
    if then == "made":
        run_dir.mkdir()
    elif then == "restored":
        shutil.copytree(moved, run_dir, ignore=shutil.ignore_patterns(".*"))  # (a copy as it was a moment ago)
    before = hashes(run_dir) if then else None
    rc, out, err = finish(proc, timeout=120)
    said = error_lines(err)  # (after mpirun's abort banner, whose last byte is a NUL)
    assert rc == 1 and "Traceback" not in err and said, (rc, err[-2000:])
    # (met first by the event file's writer or by a checkpoint's: the same line)
    how = "is gone: moved or deleted" if then is None else "was replaced: moved away, and another folder put at its path,"
    assert f"the run folder '{run_dir}' {how} while the run used it" in said[0], said
    assert not run_dir.exists() if then is None else hashes(run_dir) == before
    ok(trainer(None, ["--resume", "--output-dir", str(moved), "--total-timesteps", "4096", "--no-progress"]))


@pytest.mark.slow
def test_a_launcher_whose_console_stopped_reading_ends_with_the_runs_own_status(tmp_path):
    """The launcher's stdout a pipe its reader stopped reading (`launch ... | less`, not scrolled): mpirun is held
    writing the ranks' lines after they finished, and the launcher ended it 30 s later with exit 1 and a line
    blaming a failed start. It ends it still, but the job's status is rank 0's own (its mark), said so."""
    import fcntl
    read, write = os.pipe()
    fcntl.fcntl(write, 1031, 4096)  # (F_SETPIPE_SZ: the smallest pipe, full after a few dozen lines)
    proc = subprocess.Popen([sys.executable, "-m", "mpippo.launch", "-n", "2", "--config", "configs/toy_cue.yaml",
                             "--total-timesteps", "30720", "--no-progress", "--set", "training.n_steps=8", "--set",
                             "logging.print_interval=1", "--output-dir", str(tmp_path / "run")], cwd=ROOT,
                            env=mpi_env(), stdout=write, stderr=subprocess.PIPE, text=True, start_new_session=True)
    os.close(write)
    try:
        err = proc.communicate(timeout=150)[1]
    finally:
        os.close(read)
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err[-2000:])
    assert ("mpippo: note: every rank of this job on this node has ended, rank 0 with exit 0, but mpirun" in err
            and "the job's status is rank 0's" in err), err[-2000:]
    assert json.loads((tmp_path / "run" / "benchmark_metrics.json").read_text())["finished"] is True


@pytest.mark.slow
def test_a_killed_launcher_stops_its_job_with_a_checkpoint(tmp_path):
    """kill -9 of the launcher: the kernel sends mpirun SIGUSR2 (PR_SET_PDEATHSIG), the ranks
    checkpoint and stop; nothing of the job trains on, detached."""
    run_dir = tmp_path / "run"
    tag = f"killed-launcher-{os.getpid()}"
    cmd, line = REPEATED["ppo-sigterm-to-launcher"][:2]
    proc = start([*cmd, "--output-dir", str(run_dir)], env={hostile.MARK: tag})
    wait_for_line(proc, line)
    proc.kill()
    proc.wait()
    assert not hostile.survivors(tag, timeout=60), "the job trains on, detached"
    assert list(run_dir.rglob("latest.pt")), "no checkpoint"


@pytest.mark.slow
def test_a_resume_with_another_env_count_and_precision_goes_on_and_says_so(bases, tmp_path):
    """What may change in a resume is said in one line each and the run goes on: another per-rank
    env count (the checkpoint's env states no longer fit: they start fresh; before, an assertion
    traceback) and another precision (no longer bit-identical to an uninterrupted run)."""
    import yaml
    run_dir = tmp_path / "run"
    shutil.copytree(bases["ppo"], run_dir)
    was = json.loads((run_dir / "benchmark_metrics.json").read_text())["precision"]  # as auto resolved here
    now = {"bf16": "fp32", "fp32": "bf16"}[was]
    res = ok(trainer(None, ["--resume", "--no-progress", "--output-dir", str(run_dir), "--num-envs-per-rank", "8",
                            "--total-timesteps", "2048", "--set", f"training.precision={now}"]))
    out = res.stdout + res.stderr
    assert "warning: env.num_envs_per_rank is 8, the checkpoint's run had 32" in out, out[-2000:]
    assert f"warning: training.precision is {now}, the checkpoint's run used {was}" in out, out[-2000:]
    assert "Traceback" not in out and "resuming at 1,024 steps" in out


@pytest.mark.slow
def test_a_copy_of_a_run_whose_checkpoints_link_elsewhere_is_refused_while_the_original_trains(bases, tmp_path):
    """checkpoints/ linked to a larger file system; `cp -r` of the run keeps the link, so the copy's resume
    wrote the original's checkpoints while it trained (two writers; the copy's latest.pt was the
    original's). The linked folder is locked with the run folder: the copy is refused in one line."""
    run_dir, copy, store = tmp_path / "run", tmp_path / "copy", tmp_path / "store"
    shutil.copytree(bases["ppo"], run_dir, ignore=shutil.ignore_patterns(".*"))
    (run_dir / "checkpoints").rename(store)
    (run_dir / "checkpoints").symlink_to(store)
    shutil.copytree(run_dir, copy, symlinks=True)
    proc = start([sys.executable, "run_mpi.py", "--resume", *LONG, "--output-dir", str(run_dir)])
    try:
        wait_for_line(proc, "iter ")
        before = hashes(copy / "logs"), (copy / "config.yaml").read_bytes(), (copy / "benchmark_metrics.json").read_bytes()
        writing = store / ".latest.pt.k3j9x2.tmp"  # as the original's next checkpoint is while it is written
        writing.write_bytes(b"half a checkpoint")
        res = trainer(None, ["--resume", "--no-progress", "--total-timesteps", "4096", "--output-dir", str(copy)])
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert res.stderr.strip().startswith(f"mpippo: error: --output-dir: checkpoints/ links to '{store}' (a copy of "
                                             f"a run shares what its links point to), and '{copy / 'checkpoints'}' is "
                                             f"in use: process {proc.pid} on "), res.stderr
        assert (hashes(copy / "logs"), (copy / "config.yaml").read_bytes(),
                (copy / "benchmark_metrics.json").read_bytes()) == before
        assert writing.exists()  # the copy's sweep of what killed writers left never met a live writer's file
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc, timeout=120)
