"""`python -m mpippo.launch -n K [trainer options]`: mpirun with graceful SIGTERM and Ctrl-C.

pip Open MPI's mpirun (prterun) forwards SIGTERM/SIGINT to the ranks and SIGKILLs them a
fraction of a second later, before any rank can write a checkpoint. This launcher runs
mpirun in its own session and turns the first SIGTERM/SIGINT it receives into SIGUSR2,
which mpirun forwards and the ranks treat as "checkpoint and stop" at the next iteration
boundary. A second SIGTERM/SIGINT is passed on as SIGTERM (hard stop). SIGUSR1 is passed
through (checkpoint, exit 3 = requeue). The exit code is mpirun's.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpippo.launch", description=__doc__.splitlines()[0])
    p.add_argument("-n", "--np", type=int, default=os.cpu_count() or 1, help="ranks (default: all cores)")
    p.add_argument("--mpirun-args", default="", help="extra mpirun options, one string")
    args, trainer_args = p.parse_known_args(argv)
    cmd = [mpirun_path(), *args.mpirun_args.split(), "-n", str(args.np), sys.executable,
           str(ROOT / "run_mpi.py"), *trainer_args]
    env = mpi_env()
    # own session: a Ctrl-C at the terminal reaches only this launcher, which relays it gently
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    stops = 0

    def relay_stop(signum, frame):
        nonlocal stops
        stops += 1
        proc.send_signal(signal.SIGUSR2 if stops == 1 else signal.SIGTERM)
        if stops == 1:
            sys.stderr.write(f"mpippo.launch: {signal.Signals(signum).name} received: ranks checkpoint and stop "
                             f"at the end of this iteration (repeat to stop at once)\n")

    signal.signal(signal.SIGTERM, relay_stop)
    signal.signal(signal.SIGINT, relay_stop)
    signal.signal(signal.SIGUSR1, lambda s, f: proc.send_signal(signal.SIGUSR1))
    while True:
        try:
            return proc.wait()
        except InterruptedError:
            continue


if __name__ == "__main__":
    raise SystemExit(main())
