"""`python -m mpippo.launch -n K [trainer options]`: mpirun with graceful SIGTERM and Ctrl-C.

pip Open MPI's mpirun (prterun) forwards SIGTERM/SIGINT to the ranks and SIGKILLs them a
fraction of a second later, before any rank can write a checkpoint. This launcher runs
mpirun in its own session and turns the first SIGTERM/SIGINT it receives into SIGUSR2,
which mpirun forwards and the ranks treat as "checkpoint and stop" at the next iteration
boundary. A second SIGTERM/SIGINT is passed on as SIGTERM (hard stop). SIGUSR1 is passed
through (checkpoint, exit 3 = requeue). Signals in the first two seconds are held, then
passed on (see _Relay). The exit code is mpirun's; a bad -n is one line and exit 2.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mpirun_path() -> str:
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else (shutil.which("mpirun") or "mpirun")


def mpi_env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")  # pip Open MPI refuses root without these
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def mpirun_command(ranks: int, argv: list[str], threads: int = 1) -> tuple[list[str], dict]:
    """(command, environment) for `mpirun -n ranks python argv...`; when ranks x threads exceed the
    cores, ranks may share cores (oversubscribed) and are not bound (binding would stack them)."""
    cmd, env = [mpirun_path(), "-n", str(ranks)], mpi_env()
    if ranks * threads > len(os.sched_getaffinity(0)):
        cmd.append("--oversubscribe")
        env["PRTE_MCA_hwloc_default_binding_policy"] = "none"
    return cmd + [sys.executable, *argv], env


def run_trainer(ranks: int, trainer_args: list[str], out_dir: Path, threads: int = 1, timeout: float = 3600,
                extra_env: dict | None = None) -> dict:
    """Run run_mpi.py to the end with --output-dir out_dir (benchmarks, sweeps): its
    benchmark_metrics.json plus `wall_s_with_startup`. RuntimeError with the stderr tail on failure.
    extra_env: variables for the ranks (one node: mpirun passes its environment on)."""
    import json
    import time
    cmd, env = mpirun_command(ranks, [str(ROOT / "run_mpi.py"), "--output-dir", str(out_dir), *trainer_args], threads)
    env.update(extra_env or {})
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{ranks} rank(s) failed (exit {res.returncode}):\n{res.stderr.strip()[-3000:]}")
    m = json.loads((Path(out_dir) / "benchmark_metrics.json").read_text())
    m["wall_s_with_startup"] = time.perf_counter() - t0
    return m


class _Relay:
    """The launcher's signal handlers, installed before anything else: signals that arrive before
    mpirun exists, or in its first seconds while the ranks' interpreters start (a rank that has
    not yet run its first line would die of SIGUSR1), are held and passed on once it is safe."""

    HOLD_S = 2.0  # python starts and run_mpi.py's first line installs the ranks' handlers well within it

    def __init__(self):
        self.proc, self.started, self.held, self.stops = None, 0.0, [], 0
        signal.signal(signal.SIGTERM, self.on_stop)
        signal.signal(signal.SIGINT, self.on_stop)
        signal.signal(signal.SIGUSR1, lambda s, f: self.send(signal.SIGUSR1))

    def on_stop(self, signum, frame):
        self.stops += 1
        self.send(signal.SIGUSR2 if self.stops == 1 else signal.SIGTERM)
        if self.stops == 1:
            sys.stderr.write(f"mpippo.launch: {signal.Signals(signum).name} received: ranks checkpoint and stop "
                             f"at the end of this iteration (repeat to stop at once)\n")

    def send(self, sig) -> None:
        if self.proc is None or time.monotonic() - self.started < self.HOLD_S:
            self.held.append(sig)
        else:
            self.proc.send_signal(sig)

    def wait(self, proc) -> int:
        self.proc, self.started = proc, time.monotonic()
        while True:
            try:
                return proc.wait(timeout=0.1 if self.held else None)
            except subprocess.TimeoutExpired:
                if time.monotonic() - self.started >= self.HOLD_S:
                    for sig in self.held:
                        proc.send_signal(sig)
                    self.held = []
            except InterruptedError:
                continue


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as the trainer's
        sys.stderr.write(f"mpippo: error: command line: {message} (see python -m mpippo.launch --help)\n")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    relay = _Relay()
    p = _Parser(prog="python -m mpippo.launch", description=__doc__.splitlines()[0])
    p.add_argument("-n", "--np", type=int, default=os.cpu_count() or 1, help="ranks (default: all cores)")
    p.add_argument("--mpirun-args", default="", help="extra mpirun options, one string")
    args, trainer_args = p.parse_known_args(argv)
    if args.np < 1:
        sys.stderr.write(f"mpippo: error: -n: the number of ranks must be >= 1, got {args.np}\n")
        return 2
    cmd = [mpirun_path(), *args.mpirun_args.split(), "-n", str(args.np), sys.executable,
           str(ROOT / "run_mpi.py"), *trainer_args]
    # own session: a Ctrl-C at the terminal reaches only this launcher, which relays it gently
    try:
        proc = subprocess.Popen(cmd, env=mpi_env(), start_new_session=True)
    except OSError as e:
        sys.stderr.write(f"mpippo: error: cannot start '{cmd[0]}' ({e.strerror or e})\n")
        return 2
    return relay.wait(proc)


if __name__ == "__main__":
    raise SystemExit(main())
