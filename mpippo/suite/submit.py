"""Running a suite's unfinished members: one Slurm job array, or one after another on this machine.

Both skip the members that are done and resume the ones with a checkpoint (the job script and the
launcher pass --resume when the member's folder holds one), so `run` is safe to repeat: after a
preemption, a failure or an edit that adds seeds, it submits exactly what is missing.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mpippo.suite import state
from mpippo.suite.spec import Member, Suite, SuiteError, write_manifest

ROOT = Path(__file__).resolve().parent.parent.parent
MEMBER_SCRIPT = ROOT / "slurm" / "suite_member.sh"


def set_aside(folder: Path) -> Path | None:
    """A member folder that an attempt left without a checkpoint (ended in its first iteration) holds
    nothing to resume, and the trainer refuses a non-empty folder without --resume: it is renamed
    aside (kept, never deleted) so the member can start afresh. Returns the new name, if moved."""
    if not folder.is_dir() or (folder / "checkpoints" / "latest.pt").is_file() or not any(folder.iterdir()):
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = folder.with_name(f"{folder.name}.attempt-{stamp}")
    folder.rename(aside)
    return aside


def todo(suite: Suite) -> list[Member]:
    """Members neither done, nor in Slurm's queue, nor being run by a `run --local` now."""
    q = state.queued(suite)
    return [m for m in suite.members() if not state.finished(m, suite.budget) and m.key not in q
            and not state.LocalRun(m).alive()]


def slurm_seconds(limit: str) -> int:
    """A Slurm time limit in seconds: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes or days-hours:minutes:seconds (sbatch's formats)."""
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # after a day count the first field is hours
        h, m, s = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + m * 60 + s
    h, m, s = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
    return h * 3600 + m * 60 + s


def sbatch_command(suite: Suite, members: list[Member], manifest: Path, max_parallel: int | None,
                   extra: list[str]) -> list[str]:
    indices = ",".join(str(m.index) for m in members) + (f"%{max_parallel}" if max_parallel else "")
    # USR1 before the time limit: the member checkpoints and requeues itself (5 minutes, or a tenth
    # of a short limit)
    warn = max(10, min(300, slurm_seconds(suite.time) // 10))
    cmd = ["sbatch", "--parsable", f"--array={indices}", f"--job-name=suite-{suite.name}", "--nodes=1",
           f"--ntasks={suite.ranks}", f"--cpus-per-task={suite.cpus_per_rank}", f"--time={suite.time}",
           "--requeue", "--open-mode=append", f"--signal=B:USR1@{warn}",
           f"--output={suite.folder / 'slurm' / '%A_%a.out'}"]
    if suite.gpus_per_rank:
        cmd.append(f"--gpus-per-task={suite.gpus_per_rank}")
    return cmd + extra + [str(MEMBER_SCRIPT), str(manifest)]


def submit_slurm(suite: Suite, members: list[Member], max_parallel: int | None, extra: list[str]) -> int:
    """One sbatch of a job array over `members`; records it in submissions.jsonl. Returns the job id."""
    if not shutil.which("sbatch"):
        raise SuiteError("suite run: sbatch is not on PATH (no Slurm here); use --local to run the members here")
    (suite.folder / "slurm").mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    manifest = suite.folder / f"manifest-{stamp}.json"
    write_manifest(manifest, members)
    env = dict(os.environ, MPIPPO_ROOT=str(ROOT), MPIPPO_PYTHON=os.environ.get("MPIPPO_PYTHON", sys.executable))
    res = subprocess.run(sbatch_command(suite, members, manifest, max_parallel, extra), capture_output=True,
                         text=True, timeout=120, env=env, cwd=ROOT)
    if res.returncode != 0:
        manifest.unlink(missing_ok=True)
        raise SuiteError(f"suite run: sbatch refused the array: {(res.stderr.strip() or res.stdout.strip())[:300]}")
    job = int(res.stdout.strip().split(";")[0])
    with open(suite.folder / state.SUBMISSIONS, "a") as f:
        f.write(json.dumps({"job": job, "manifest": str(manifest), "members": [m.key for m in members],
                            "time": stamp}) + "\n")
    return job


def run_local(suite: Suite, members: list[Member], mpirun_args: str = "--oversubscribe") -> int:
    """The members one after another through the launcher (a live progress bar on a terminal).
    Ctrl-C: the running member checkpoints and stops, and no further member starts (exit 4)."""
    t0 = time.monotonic()
    for k, m in enumerate(members, 1):
        resume = state.has_checkpoint(m)
        print(f"suite {suite.name}: member {k}/{len(members)}: {m.key} "
              f"({'resuming' if resume else 'starting'}; {time.monotonic() - t0:.0f} s into this run)", flush=True)
        m.folder.parent.mkdir(parents=True, exist_ok=True)
        aside = set_aside(m.folder)
        if aside:
            print(f"suite {suite.name}: {m.key}: its last attempt left no checkpoint; kept as {aside.name}", flush=True)
        cmd = [sys.executable, "-m", "mpippo.launch", "-n", str(suite.ranks), f"--mpirun-args={mpirun_args}",
               "--output-dir", str(m.folder), *(["--resume"] if resume else m.args)]
        rc = _tee(cmd, m)
        if rc != 0:
            print(f"suite {suite.name}: {m.key} ended with exit {rc} (log: {m.log}); "
                  f"`python -m mpippo.suite run {suite.path} --local` again resumes it", flush=True)
            return rc
    return 0


def _tee(cmd: list[str], m: Member) -> int:
    """Run the launcher with its output on this terminal as it comes (the progress bar redraws with
    '\r', so bytes, not lines) and its finished lines in the member's log (what `status` reads).
    A terminal here means a bar there: MPIPPO_TTY tells the launcher, whose stderr is our pipe."""
    env = dict(os.environ)
    if sys.stderr.isatty():
        env.update(MPIPPO_TTY="1", COLUMNS=str(shutil.get_terminal_size().columns))
    state.LocalRun(m).mark()
    try:
        with open(m.log, "a") as log:
            log.write(f"mpippo: suite member {m.key}: {' '.join(cmd[2:])}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
            _copy_out(proc, log)
            rc = proc.wait()
            log.write(f"mpippo: member {m.key} {closing(rc)}\n")
    finally:
        state.LocalRun(m).clear()
    return rc


def closing(rc: int) -> str:
    """The log's last word on a local attempt: 3 and 4 are the trainer's stops with a checkpoint
    (a signal, Ctrl-C), which `status` shows as stopped, not failed."""
    if rc == 0:
        return "finished"
    if rc in (3, 4):
        return f"stopped with a checkpoint (exit {rc}); the next run resumes it"
    return f"exited with status {rc}"


def _copy_out(proc: subprocess.Popen, log) -> None:
    """Bytes to the terminal as they come, finished lines to the log (a redrawn line as it last
    looked), until the launcher closes its output. A Ctrl-C reached the launcher too, which stops
    gently (a second one: at once); either way its last lines still come through here."""
    pending = b""
    while True:
        try:
            chunk = os.read(proc.stdout.fileno(), 65536)
        except KeyboardInterrupt:
            continue
        if not chunk:
            return
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            log.write(line.rsplit(b"\r", 1)[-1].decode(errors="replace") + "\n")
