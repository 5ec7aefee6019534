#!/usr/bin/env python
"""Peers on the same machine: CleanRL's stock ppo_procgen.py (the strongest single-file peer).

Nothing of the peer is stored in this repository: on first use the script is downloaded, at a
pinned commit, into .venv-peers/ (git-ignored; offline, point MPIPPO_CLEANRL_SCRIPT at a copy), next to a virtual environment with the versions
it needs (gym 0.23, tyro; torch and procgen as ours). Runs it on the CPU as shipped (one process,
torch's default threads, no THP) with the default Procgen hyperparameters, and reports its
steady steps/s over the iterations after the first, computed from its own "SPS:" lines the same
way bench.py computes mpippo's. Prints one JSON line; exits 3 when the peer cannot be set up
(no network), so bench.py can say so and go on.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # mpippo, without an install
from mpippo.envs.procgen import GAMES as PROCGEN_GAMES  # noqa: E402
from mpippo.files import atomic_write_bytes, read_bytes, read_text  # noqa: E402
from mpippo.toolcli import Parser, about, ToolFailure, count, run  # noqa: E402
from mpippo.usage import UsageError, reason  # noqa: E402

PEERS = ROOT / ".venv-peers"
CLEANRL_COMMIT = "fe8d8a03"  # vwxyzjn/cleanrl, 2025
CLEANRL_URL = f"https://raw.githubusercontent.com/vwxyzjn/cleanrl/{CLEANRL_COMMIT}/cleanrl/ppo_procgen.py"
PACKAGES = ["torch==2.13.0", "procgen-mirror==0.10.7", "gym==0.23.1", "tyro==1.0.17", "tensorboard", "numpy<2"]


def setup() -> Path:
    script = PEERS / "cleanrl_ppo_procgen.py"
    python = PEERS / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True)
    if os.path.lexists(script) and not script.is_file():  # python would wait on a FIFO there for ever
        raise UsageError(f"'{script}' is not CleanRL's script (a file); move it away")
    if not script.exists():
        local = os.environ.get("MPIPPO_CLEANRL_SCRIPT")  # a copy at that commit, for machines without the web
        if local:
            atomic_write_bytes(script, read_bytes(local, "MPIPPO_CLEANRL_SCRIPT", limit=1 << 20))
        else:
            with urllib.request.urlopen(CLEANRL_URL, timeout=60) as r:
                atomic_write_bytes(script, r.read())  # whole or not at all: an existing script is used as is
    return script


class ScriptMismatch(ToolFailure, ValueError):
    """The CleanRL script read lacks a line the benchmark adapts: the tool's failure (exit 1), not bad input."""


def adapted_script(file: str, local_var: str, adapt: list[tuple[str, str]], saved_as: str) -> Path:
    """CleanRL's cleanrl/<file> at CLEANRL_COMMIT in .venv-peers/<saved_as>, with each (old, new) of
    `adapt` applied and nothing else; read from $<local_var> (a copy at that commit), the pristine copy
    kept from an earlier call, or downloaded. The copy's first line names the edits it holds (a digest),
    so a change to `adapt` makes a new copy rather than running the old one. A line to adapt that is
    not there raises ScriptMismatch (the commit is not the one pinned); a $<local_var> naming no file
    is the user's UsageError."""
    script = PEERS / saved_as
    digest = hashlib.sha256(json.dumps(adapt).encode()).hexdigest()[:16]
    stamp = f"# CleanRL's {file} at {CLEANRL_COMMIT}, adapted by mpippo's benchmarks (edits {digest})\n"
    if os.path.lexists(script) and read_text(script, "the adapted CleanRL script").startswith(stamp):
        return script  # (a FIFO, folder or damaged copy by that name is one line naming it, not a wait)
    text = _pristine(file, local_var)
    for old, new in adapt:
        if old not in text:
            raise ScriptMismatch(f"CleanRL's {file} at {CLEANRL_COMMIT} lacks a line to adapt: {old.strip()[:60]}")
        text = text.replace(old, new)
    atomic_write_bytes(script, (stamp + text).encode())
    return script


def _pristine(file: str, local_var: str) -> str:
    """cleanrl/<file> at CLEANRL_COMMIT as published, kept in .venv-peers/cleanrl-<commit>/ once read."""
    kept = PEERS / f"cleanrl-{CLEANRL_COMMIT}" / file
    local = os.environ.get(local_var)
    if local:
        text = read_text(local, local_var, limit=1 << 20)  # (a FIFO named there is refused, not waited on)
    elif os.path.lexists(kept):
        return read_text(kept, "the kept CleanRL script")
    else:
        url = f"https://raw.githubusercontent.com/vwxyzjn/cleanrl/{CLEANRL_COMMIT}/cleanrl/{file}"
        with urllib.request.urlopen(url, timeout=60) as r:
            text = r.read().decode()
    kept.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(kept, text.encode())
    return text


def target_install(folder: str, probe: str, packages: list[str]) -> str:
    """`packages` installed with pip --target into .venv-peers/<folder> (once: `probe` is a module
    folder they make), never into the project's environment; returns the folder, for PYTHONPATH."""
    path = PEERS / folder
    if not (path / probe).exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(path), *packages], check=True)
    return str(path)


def sps_lines(text: str) -> list[int]:
    """CleanRL's cumulative 'SPS: n' prints, one per iteration, whole and positive only: a run killed
    mid-line, or one whose first iteration rounded to 0, leaves lines that are not a rate."""
    return [int(x) for x in re.findall(r"^SPS: (\d+)$", text, re.M) if int(x) > 0]


def steady_sps(text: str, batch: int) -> tuple[float, float] | None:
    """(steady, overall) steps/s from CleanRL's output (sps_lines), or None when it printed no rate."""
    sps = sps_lines(text)
    if not sps:
        return None
    times = [(i + 1) * batch / s for i, s in enumerate(sps)]  # elapsed seconds at the end of each iteration
    # (whole-number rates: the first and last times may round to one instant, or cross: the overall then)
    span = times[-1] - times[0]
    steady = (len(times) - 1) * batch / span if len(times) > 1 and span > 0 else sps[-1]
    return steady, float(sps[-1])


def cleanrl_ready(who: list[str], setup: Callable[[], object], tool: str) -> list[str]:
    """`who`, once CleanRL's script and packages are set up (`setup`); without them (no network and
    no copy, a read-only .venv-peers/) the others only, with a line saying so, or one ToolFailure
    line when CleanRL was all that was asked."""
    if "cleanrl" not in who:
        return who
    try:
        setup()
        return who
    except (OSError, subprocess.CalledProcessError) as e:  # (urllib's URLError is an OSError)
        if set(who) == {"cleanrl"}:
            raise ToolFailure(f"cannot set up CleanRL ({reason(e)})") from None
        print(f"{tool}: cannot set up CleanRL ({reason(e)}); its runs are skipped", file=sys.stderr)
        return [w for w in who if w != "cleanrl"]


def main(argv: list[str] | None = None) -> int:
    return run("peers", _main, argv)


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="peers.py", description=about(__doc__))
    p.add_argument("--iterations", type=count(1, 100), default=2, help="of 64 envs x 256 steps; the first is warm-up")
    p.add_argument("--env", default="coinrun", choices=PROCGEN_GAMES, metavar="GAME", help="a Procgen game")
    p.add_argument("--thp", action="store_true", help="also give the peer THP_MEM_ALLOC_ENABLE=1 (not stock)")
    args = p.parse_args(argv)
    try:
        script = setup()
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"peers: cannot set up CleanRL ({e}); skipped", file=sys.stderr)
        return 3
    batch = 64 * 256
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if args.thp:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    cmd = [str(PEERS / "bin" / "python"), str(script), "--env-id", args.env, "--no-cuda", "--exp-name", "peer-bench",
           "--total-timesteps", str(args.iterations * batch)]
    try:
        res = subprocess.run(cmd, cwd=PEERS, env=env, capture_output=True, text=True, timeout=7200)
    except subprocess.TimeoutExpired:
        print("peers: CleanRL gave no result within 2 hours", file=sys.stderr)
        return 1
    rates = steady_sps(res.stdout, batch)
    if res.returncode != 0 or rates is None:
        print(f"peers: CleanRL failed (exit {res.returncode}): {res.stderr[-1500:]}", file=sys.stderr)
        return 1
    steady, overall = rates
    print(json.dumps({"peer": "cleanrl ppo_procgen.py" + (" + THP" if args.thp else " (stock)"),
                      "commit": CLEANRL_COMMIT, "fps_steady": steady, "fps": overall,
                      "threads": "torch default", "thp": args.thp}))
    return 0


if __name__ == "__main__":
    from mpippo.toolcli import exit_process  # (stop signals ignored once the outcome is decided)
    exit_process(main())
