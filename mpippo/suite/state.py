"""Where each member of a suite stands: done, running, pending, stopped (resumable), failed, not started.

Done is what the member's benchmark_metrics.json says (finished, with the suite's budget reached);
running and pending are what Slurm's queue says of the array elements this suite submitted
(submissions.jsonl), and running also a member whose folder's lock (mpippo/runlock.py) a trainer
holds now, wherever it was started; failed is a member that is neither, whose log ends in an error;
stopped is one with a checkpoint and no error (a preempted or interrupted member: the next `run`
resumes it); interrupted, one that trained but left no checkpoint (the next `run` starts it afresh).

Before a member is scored, reported done or resumed, its folder is checked against its place in the
suite (game, mode, algorithm, seed, budget): a run of another game moved into a member's folder is
a mismatch, which `status` shows and `run` and `report` refuse, and a damaged file of the member's
is named as such, never read as numbers it does not hold.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from mpippo import files, runlock
from mpippo.checkpoint import latest_path
from mpippo.config import UsageError, canonical_env_name, show
from mpippo.errors import os_reason
from mpippo.suite.spec import Member, Suite, SuiteError, read_manifest, reads_mode

SUBMISSIONS = "submissions.jsonl"
ACTIVE = {"RUNNING": "running", "COMPLETING": "running", "CONFIGURING": "running", "PENDING": "pending",
          "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending", "SUSPENDED": "pending",
          "RESIZING": "running", "STOPPED": "pending", "SIGNALING": "running"}


def metrics(member: Member) -> dict:
    """The member's benchmark_metrics.json, its typed keys checked; {} while it has none (not started,
    or before its first iteration). A damaged file is a UsageError naming it."""
    path = member.folder / files.METRICS
    if not path.exists() and not path.is_symlink():
        return {}
    return files.read_metrics(member.folder)


def finished(member: Member, budget: int, m: dict | None = None) -> bool:
    """Done: the metrics (read here unless given) say the run finished, aimed at the suite's budget.
    The synchronous trainer writes `finished`; the actor-learner layout (APPO, DQN) writes only
    `stop_reason` ("done" once its budget is spent), and its last count of env steps may fall a
    few segments short of the target, so the target it ran to is what is compared."""
    m = metrics(member) if m is None else m
    done = m.get("finished") is True or ("finished" not in m and m.get("stop_reason") == "done")
    target = m.get("target_timesteps")
    return done and ((target if isinstance(target, int) else m.get("total_timesteps") or 0) >= budget)


def has_checkpoint(member: Member) -> bool:
    return latest_path(member.folder).is_file()


def running(member: Member) -> str | None:
    """Who writes the member's folder now (its trainer's rank 0 holds the folder's lock), or None."""
    return runlock.holder(member.folder)


def _article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def mismatch(suite: Suite, member: Member, m: dict | None = None) -> str | None:
    """What makes the member's folder not this member's run (another game, mode, algorithm, seed or
    budget in its config.yaml or benchmark_metrics.json), or None. A damaged config.yaml or metrics
    file is a UsageError naming it."""
    folder = member.folder
    for parent in folder.relative_to(suite.folder).parents:
        if (suite.folder / parent).exists() and not (suite.folder / parent).is_dir():
            return f"is under '{suite.folder / parent}', which is a file, not a folder"
    if folder.is_symlink() and not folder.exists():
        return "is a broken link, not a run folder"
    if folder.exists() and not folder.is_dir():
        return "is a file, not a run folder"
    m = metrics(member) if m is None else m
    found = []
    if (folder / files.RUN_CONFIG).exists() or (folder / files.RUN_CONFIG).is_symlink():
        cfg = files.read_run_config(folder)
        mode = cfg.env.distribution_mode if reads_mode(cfg.env.name) else None  # (Procgen's; other families: none)
        found.append((files.RUN_CONFIG, canonical_env_name(cfg.env.name), mode,
                      cfg.training.algo, cfg.training.seed, cfg.training.total_timesteps))
    if "env" in m or "algo" in m:
        found.append((files.METRICS, m.get("env", member.game), None, m.get("algo", suite.algos.get(member.variant)),
                      None, None))
    algo = suite.algos.get(member.variant)
    for where, game, mode, run_algo, seed, budget in found:
        if game != member.game:
            return f"holds {_article(str(game)) if isinstance(game, str) else show(game)} run, not {member.game} ({where})"
        if mode is not None and mode != suite.distribution_mode:
            return f"holds {_article(f'{mode}-mode')} run, not {suite.distribution_mode} ({where})"
        if algo not in (None, run_algo):
            return (f"holds {_article(str(run_algo)) if isinstance(run_algo, str) else show(run_algo)} run, "
                    f"not {algo} (what variant {member.variant} resolves to; {where})")
        if seed is not None and seed != member.seed:
            return f"holds a run of seed {seed}, not {member.seed} ({where})"
        if budget is not None and budget != suite.budget:
            return f"holds a run to {budget:,} steps, not the suite's budget of {suite.budget:,} ({where})"
    return None


def check(suite: Suite, member: Member) -> dict:
    """The member's metrics once its folder is known to be its own; SuiteError, one line naming the
    folder or file and what is wrong, when it is not (`run` and `report` refuse on it)."""
    try:
        m = metrics(member)
        why = mismatch(suite, member, m)
    except UsageError as e:
        raise SuiteError(f"suite {suite.name}: member {member.key}: {e.errors[0]}; repair or move it away "
                         f"(the next run then starts the member afresh)") from None
    if why:
        raise SuiteError(f"suite {suite.name}: member {member.key}: folder '{member.folder}' {why}; "
                         f"move it away (the next run then starts the member afresh) or correct the suite file")
    return m


def quote(text: str, limit: int) -> str:
    """What a command said, as one quoted line of at most `limit` characters."""
    line = " ".join(text.split()) or "nothing"
    return f"'{line[:limit]}{'...' if len(line) > limit else ''}'"


START_MARK = "mpippo: job "  # common.sh's first line of each attempt under Slurm
LOCAL_START = re.compile(r"^mpippo: suite member \S+: ")  # run --local's first line of each attempt
END_MARKS = ("error", "Error", "exited with status", "bad input", "Killed", "CANCELLED", "DUE TO TIME LIMIT")


def last_error(member: Member, slurm_outputs: list[Path] = ()) -> str:
    """The line that says why the member's last attempt ended badly (an error line or the job
    script's verdict in its log), else Slurm's own CANCELLED / TIME LIMIT line at the end of the
    element's output (a job killed before its script could say anything), or ''."""
    lines = _tail(member.log, LOG_TAIL).splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith(START_MARK) or LOCAL_START.match(line)),
                default=-1)
    for line in reversed(lines[start + 1:]):
        if any(m in line for m in END_MARKS):
            return line.strip()[:200]
    for path in slurm_outputs:
        tail = _tail(path, 4096).splitlines()[-3:]
        for line in reversed(tail):
            if "CANCELLED" in line or "TIME LIMIT" in line:
                return line.strip()[:200]
    return ""


LOG_TAIL = 4 << 20  # a member's log grows by a few lines an iteration: its last attempt is in the last MBs


def _tail(path: Path, limit: int) -> str:
    """The last `limit` bytes of a text file as text ('' when it cannot be read: a log is optional)."""
    try:
        with files.open_regular(path) as f:  # a FIFO in its place must not hang us
            f.seek(max(0, f.seek(0, 2) - limit))
            return f.read().decode(errors="replace")
    except OSError:  # NotAFile included
        return ""


def submissions(suite: Suite) -> list[dict]:
    """The suite's submissions.jsonl (one line per sbatch: job id, manifest, members), checked."""
    path = suite.folder / SUBMISSIONS
    if not path.exists() and not path.is_symlink():
        return []
    rows = files.read_jsonl(path, "suite submissions file")
    for n, row in enumerate(rows, 1):
        if type(row.get("job")) is not int or row["job"] < 0 or not isinstance(row.get("manifest"), str) \
                or not row["manifest"]:
            raise SuiteError(f"suite submissions file '{path}': entry {n}: expected a job id "
                             f"(an integer) and a manifest (a file name), got {show(row)}; it is not a line "
                             f"`suite run` wrote")
    return rows


def manifests(suite: Suite) -> dict[str, dict]:
    """{job id: its manifest} of every submission (a missing or damaged manifest: SuiteError)."""
    out = {}
    for sub in submissions(suite):
        try:
            out[str(sub["job"])] = read_manifest(sub["manifest"])
        except UsageError as e:
            raise SuiteError(f"{e.errors[0]} (job {sub['job']} of {suite.folder / SUBMISSIONS}); without it "
                             f"what that array runs is unknown") from None
    return out


def slurm_outputs(suite: Suite, jobs: dict[str, dict] | None = None) -> dict[str, list[Path]]:
    """{member key: [the Slurm output file of its latest array element]} (earlier attempts' lines
    would speak of errors a resubmission has since put right)."""
    out: dict[str, list[Path]] = {}
    for job, rows in (manifests(suite) if jobs is None else jobs).items():
        for index, row in rows.items():
            out[row["key"]] = [suite.folder / "slurm" / f"{job}_{index}.out"]
    return out


def queued(suite: Suite, jobs: dict[str, dict] | None = None) -> dict[str, str]:
    """{member key: running | pending} for the array elements of this suite still in Slurm's queue."""
    keys = manifests(suite) if jobs is None else jobs
    if not keys or not shutil.which("squeue"):
        return {}
    # by the arrays' name, not their ids: ids Slurm has already purged would make squeue fail
    cmd = ["squeue", "-h", "-r", "--name", f"suite-{suite.name}", "-o", "%i %T"]
    try:
        res = subprocess.run(cmd, capture_output=True, timeout=120)
    except OSError as e:
        raise SuiteError(f"suite {suite.name}: cannot run squeue ({os_reason(e)}), so what is queued is "
                         f"unknown; try again when Slurm's commands work") from None
    if res.returncode != 0:
        said = quote((res.stderr or res.stdout).decode(errors="replace"), 200)
        # an unanswered squeue is not an empty queue: resubmitting on it would run members twice
        raise SuiteError(f"suite {suite.name}: squeue failed (exit {res.returncode}: {said}), so what is "
                         f"queued is unknown; try again when the Slurm controller answers")
    out = {}
    for line in res.stdout.decode(errors="replace").split("\n"):
        parts = line.split()
        if len(parts) != 2 or "_" not in parts[0]:
            continue
        job, index = parts[0].split("_", 1)
        entry = keys.get(job, {}).get(index)
        if entry and parts[1] in ACTIVE:
            out[entry["key"]] = ACTIVE[parts[1]]
    return out


def table(suite: Suite) -> list[dict]:
    """One row per member: its state, steps done, last return, and the last error line if it failed
    (for a mismatched or damaged member folder: what is wrong with it)."""
    jobs = manifests(suite)
    q, outs = queued(suite, jobs), slurm_outputs(suite, jobs)
    rows = []
    for m in suite.members():
        note = ""
        try:
            met = metrics(m)
            why = mismatch(suite, m, met)
        except UsageError as e:
            met, why, state, note = {}, None, "damaged", e.errors[0]
        else:
            error = last_error(m, outs.get(m.key, []))
            if why:
                state, note = "mismatch", f"folder {why}; move it away"
            elif finished(m, suite.budget, met):
                state = "done"
            elif m.key in q:
                state = q[m.key]
            elif running(m):
                state = "running"
            elif error:
                state, note = "failed", error
            elif has_checkpoint(m):
                state = "stopped"
            elif met:  # it trained, but left no checkpoint to resume from: the next run starts it afresh
                state = "interrupted"
            else:
                state = "not started"
        ret = met.get("episode_return_mean")
        rows.append({"member": m.key, "index": m.index, "state": state, "steps": met.get("total_timesteps") or 0,
                     "return": ret if isinstance(ret, (int, float)) and ret == ret else None, "error": note})
    return rows


def print_table(suite: Suite, rows: list[dict]) -> None:
    width = max(len(r["member"]) for r in rows)
    print(f"suite {suite.name}: {len(rows)} members, budget {suite.budget:,} steps each ({suite.folder})")
    print(f"{'#':>3}  {'member':<{width}}  {'state':<11} {'steps':>13}  {'return':>7}  note")
    for r in rows:
        ret = "-" if r["return"] is None else f"{r['return']:.2f}"
        print(f"{r['index']:>3}  {r['member']:<{width}}  {r['state']:<11} {r['steps']:>13,}  {ret:>7}  {r['error']}")
    counts = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    print("summary: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
