"""Where each member of a suite stands: done, running, pending, stopped (resumable), failed, not started.

Done is what the member's benchmark_metrics.json says (finished, with the suite's budget reached);
running and pending are what Slurm's queue says of the array elements this suite submitted
(submissions.jsonl); failed is a member that is neither, whose log ends in an error; stopped is
one with a checkpoint and no error (a preempted or interrupted member: the next `run` resumes it);
interrupted, one that trained but left no checkpoint (the next `run` starts it afresh). A member
that `run --local` is running now says so through its mark (LocalRun).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from mpippo.suite.spec import Member, Suite

SUBMISSIONS = "submissions.jsonl"
ACTIVE = {"RUNNING": "running", "COMPLETING": "running", "CONFIGURING": "running", "PENDING": "pending",
          "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending", "SUSPENDED": "pending",
          "RESIZING": "running", "STOPPED": "pending", "SIGNALING": "running"}


def metrics(member: Member) -> dict:
    try:
        return json.loads((member.folder / "benchmark_metrics.json").read_text())
    except (OSError, ValueError):
        return {}


def finished(member: Member, budget: int, m: dict | None = None) -> bool:
    """Done: the metrics (read here unless given) say finished, at the suite's budget."""
    m = metrics(member) if m is None else m
    return bool(m.get("finished")) and int(m.get("total_timesteps", 0)) >= budget


def has_checkpoint(member: Member) -> bool:
    return (member.folder / "checkpoints" / "latest.pt").is_file()


START_MARK = "mpippo: job "  # common.sh's first line of each attempt under Slurm
LOCAL_START = re.compile(r"^mpippo: suite member \S+: ")  # run --local's first line of each attempt
END_MARKS = ("error", "Error", "exited with status", "bad input", "Killed", "CANCELLED", "DUE TO TIME LIMIT")


def last_error(member: Member, slurm_outputs: list[Path] = ()) -> str:
    """The line that says why the member's last attempt ended badly (an error line or the job
    script's verdict in its log), else Slurm's own CANCELLED / TIME LIMIT line at the end of the
    element's output (a job killed before its script could say anything), or ''."""
    try:
        lines = member.log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    start = max((i for i, line in enumerate(lines) if line.startswith(START_MARK) or LOCAL_START.match(line)),
                default=-1)
    for line in reversed(lines[start + 1:]):
        if any(m in line for m in END_MARKS):
            return line.strip()[:200]
    for path in slurm_outputs:
        try:
            tail = path.read_text(errors="replace").splitlines()[-3:]
        except OSError:
            continue
        for line in reversed(tail):
            if "CANCELLED" in line or "TIME LIMIT" in line:
                return line.strip()[:200]
    return ""


def submissions(suite: Suite) -> list[dict]:
    path = suite.folder / SUBMISSIONS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def slurm_outputs(suite: Suite) -> dict[str, list[Path]]:
    """{member key: [the Slurm output file of its latest array element]} (earlier attempts' lines
    would speak of errors a resubmission has since put right)."""
    out: dict[str, list[Path]] = {}
    for sub in submissions(suite):
        try:
            rows = json.loads(Path(sub["manifest"]).read_text())
        except (OSError, ValueError):
            continue
        for index, row in rows.items():
            out[row["key"]] = [suite.folder / "slurm" / f"{sub['job']}_{index}.out"]
    return out


def queued(suite: Suite) -> dict[str, str]:
    """{member key: running | pending} for the array elements of this suite still in Slurm's queue."""
    subs = submissions(suite)
    if not subs or not shutil.which("squeue"):
        return {}
    # by the arrays' name, not their ids: ids Slurm has already purged would make squeue fail
    res = subprocess.run(["squeue", "-h", "-r", "--name", f"suite-{suite.name}", "-o", "%i %T"],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        # an unanswered squeue is not an empty queue: resubmitting on it would run members twice
        from mpippo.suite.spec import SuiteError
        raise SuiteError(f"suite: squeue failed, so what is queued is unknown ({res.stderr.strip()[:200]}); "
                         f"try again when the Slurm controller answers")
    keys = {}
    for sub in subs:
        try:
            keys[str(sub["job"])] = json.loads(Path(sub["manifest"]).read_text())
        except (OSError, ValueError):
            continue
    out = {}
    for line in res.stdout.split("\n"):
        parts = line.split()
        if len(parts) != 2 or "_" not in parts[0]:
            continue
        job, index = parts[0].split("_", 1)
        entry = keys.get(job, {}).get(index)
        if entry and parts[1] in ACTIVE:
            out[entry["key"]] = ACTIVE[parts[1]]
    return out


class LocalRun:
    """`suite run --local` marks the member it runs (<folder>.pid, its process id) so that `status`
    can say running without Slurm; a mark whose process is gone is stale and ignored."""

    def __init__(self, member: Member):
        self.path = member.folder.with_name(member.folder.name + ".pid")

    def mark(self) -> None:
        self.path.write_text(str(os.getpid()))

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def alive(self) -> bool:
        try:
            os.kill(int(self.path.read_text()), 0)
            return True
        except (OSError, ValueError):
            return False


def table(suite: Suite) -> list[dict]:
    """One row per member: its state, steps done, last return, and the last error line if it failed."""
    q, outs = queued(suite), slurm_outputs(suite)
    rows = []
    for m in suite.members():
        met, error = metrics(m), last_error(m, outs.get(m.key, []))
        if finished(m, suite.budget, met):
            state = "done"
        elif m.key in q:
            state = q[m.key]
        elif LocalRun(m).alive():
            state = "running"
        elif error:
            state = "failed"
        elif has_checkpoint(m):
            state = "stopped"
        elif met:  # it trained, but left no checkpoint to resume from: the next run starts it afresh
            state = "interrupted"
        else:
            state = "not started"
        rows.append({"member": m.key, "index": m.index, "state": state, "steps": int(met.get("total_timesteps", 0)),
                     "return": met.get("episode_return_mean"), "error": error if state == "failed" else ""})
    return rows


def print_table(suite: Suite, rows: list[dict]) -> None:
    width = max(len(r["member"]) for r in rows)
    print(f"suite {suite.name}: {len(rows)} members, budget {suite.budget:,} steps each ({suite.folder})")
    print(f"{'#':>3}  {'member':<{width}}  {'state':<11} {'steps':>13}  {'return':>7}  last error")
    for r in rows:
        ret = "-" if r["return"] is None else f"{r['return']:.2f}"
        print(f"{r['index']:>3}  {r['member']:<{width}}  {r['state']:<11} {r['steps']:>13,}  {ret:>7}  {r['error']}")
    counts = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    print("summary: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
