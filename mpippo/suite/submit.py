"""Running a suite's unfinished members: one Slurm job array, or one after another on this machine.

Both skip the members that are done and resume the ones with a checkpoint (the job script and the
launcher pass --resume when the member's folder holds one), so `run` is safe to repeat: after a
preemption, a failure or an edit that adds seeds, it submits exactly what is missing.

One writer per folder: `run` holds the suite folder's lock (mpippo/runlock.py) while it decides and
submits or runs, so two `run`s of one suite never overlap; a member whose folder's lock a trainer
holds is running (wherever it was started) and is left to it. `run --local` relays SIGTERM, SIGINT
and SIGUSR1 to the member's launcher, which runs in its own session and gets SIGTERM should this
process die without a word (kill -9): the member always stops with a checkpoint, never on its own.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from mpippo import files, runlock
from mpippo.checkpoint import latest_path
from mpippo.errors import os_reason
from mpippo.launch import die_with_parent
from mpippo.files import missing_folders, remove_if_empty
from mpippo.usage import UsageError
from mpippo.suite import state
from mpippo.suite.spec import Member, Suite, SuiteError, write_manifest

ROOT = Path(__file__).resolve().parent.parent.parent
MEMBER_SCRIPT = ROOT / "slurm" / "suite_member.sh"


def set_aside(folder: Path) -> Path | None:
    """A member folder that an attempt left without a checkpoint (ended in its first iteration) holds
    nothing to resume, and the trainer refuses a non-empty folder without --resume: it is renamed
    aside (kept, never deleted) so the member can start afresh. Returns the new name, if moved.
    A folder whose lock a trainer holds is never moved (SuiteError): it is being written."""
    if latest_path(folder).is_file():
        return None
    try:
        return runlock.set_aside(folder, "suite member folder")
    except runlock.FolderBusy as e:
        raise SuiteError(e.errors[0]) from None


def todo(suite: Suite, elsewhere: list | None = None) -> list[Member]:
    """Members neither done, nor in Slurm's queue, nor being written by a trainer now (those are
    appended to `elsewhere` as (member, holder)). Every member's folder is checked first: a
    mismatched or damaged one refuses the whole run (SuiteError), before anything starts."""
    jobs = state.manifests(suite)
    q = state.queued(suite, jobs)
    out = []
    for m in suite.members():
        met = state.check(suite, m)
        if state.finished(m, suite.budget, met) or m.key in q:
            continue
        who = state.running(m)
        if who:
            if elsewhere is not None:
                elsewhere.append((m, who))
            continue
        files.check_appendable(m.log, f"suite member {m.key}: its log")  # a link or FIFO there: refused now
        out.append(m)
    return out


class SuiteLock:
    """`run`'s hold on the suite folder, taken before it decides anything and kept to its end (a
    second `run` of the suite is refused in one line naming this one). A refused `run` removes what
    taking the lock created: the folder, if it made it; runlock.release puts the lock file back as
    it was (gone if this run made it, else the line that named its last holder)."""

    def __init__(self, suite: Suite):
        self.folder = suite.folder
        self.made: list[Path] = []

    def __enter__(self) -> "SuiteLock":
        self.made = missing_folders(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            runlock.acquire(self.folder, "suite folder", tag=runlock.SUITE_TAG, passed_on=True)
        except BaseException:
            remove_if_empty(self.made)
            raise
        return self

    def fds(self) -> tuple[int, ...]:
        """The lock's descriptors, for the member's launcher to hold too (none without locks)."""
        return runlock.held_fds(self.folder)

    def __exit__(self, kind, exc, tb) -> bool:
        refused = kind is not None and issubclass(kind, (UsageError, OSError, subprocess.SubprocessError,
                                                         KeyboardInterrupt))
        if refused:  # else held to the end of this process (the kernel lets go of it)
            self.undo()
        return False

    def undo(self) -> None:
        """Let go, leaving the folder as it was: a refused run, or one that found nothing to do."""
        runlock.release(self.folder)
        remove_if_empty(self.made)


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


JOB_ID = re.compile(r"(\d+)(;\S+)?")  # sbatch --parsable: "<job id>" or "<job id>;<cluster>"


def submit_slurm(suite: Suite, members: list[Member], max_parallel: int | None, extra: list[str]) -> int:
    """One sbatch of a job array over `members`; records it in submissions.jsonl. Returns the job id.
    A submission that fails leaves nothing of itself behind (its manifest, a slurm/ folder it made)."""
    if not shutil.which("sbatch"):
        raise SuiteError("suite run: sbatch is not on PATH (no Slurm here); use --local to run the members here")
    made = missing_folders(suite.folder / "slurm")
    (suite.folder / "slurm").mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    manifest = suite.folder / f"manifest-{stamp}.json"
    cancel = f"if it queued an array, cancel it: scancel --name suite-{suite.name}"

    def refuse(why: str) -> SuiteError:
        manifest.unlink(missing_ok=True)
        remove_if_empty(made)
        return SuiteError(f"suite run: sbatch {why}; nothing was recorded")

    try:
        write_manifest(manifest, members)
        env = dict(os.environ, MPIPPO_ROOT=str(ROOT), MPIPPO_PYTHON=os.environ.get("MPIPPO_PYTHON", sys.executable))
        res = subprocess.run(sbatch_command(suite, members, manifest, max_parallel, extra), capture_output=True,
                             timeout=120, env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise refuse(f"did not answer within 120 s ({cancel})") from None
    except KeyboardInterrupt:
        raise refuse(f"was interrupted ({cancel})") from None
    except OSError as e:
        raise refuse(f"could not be run ({os_reason(e)})") from None
    out, err = (res.stdout.decode(errors="replace").strip(), res.stderr.decode(errors="replace").strip())
    if res.returncode != 0:
        raise refuse(f"refused the array (exit {res.returncode}): {state.quote(err or out, 300)}")
    last = out.splitlines()[-1].strip() if out else ""
    found = JOB_ID.fullmatch(last)
    if not found:
        raise refuse(f"printed {state.quote(out, 120) if out else 'nothing'} instead of a job id "
                     f"(sbatch --parsable prints one; {cancel})")
    job = int(found.group(1))
    record(suite, {"job": job, "manifest": str(manifest), "members": [m.key for m in members], "time": stamp})
    return job


def record(suite: Suite, row: dict) -> None:
    """Add a submission to submissions.jsonl, rewritten whole (the suite's lock is held): an append cut
    short (a full disk) would leave a torn last line, and every later status, run and report would
    refuse the file; a link there is replaced, never written through. The job is queued by now, so a
    failure names it (its manifest stays: the array reads it)."""
    path = suite.folder / state.SUBMISSIONS
    try:
        rows = [*state.submissions(suite), row]
        files.atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in rows).encode())
    except (OSError, UsageError) as e:  # a full disk; the record changed or unreadable since the lock's check
        why = e.errors[0] if isinstance(e, UsageError) else os_reason(e)
        raise SuiteError(f"suite run: sbatch queued job {row['job']}, but recording it in '{path}' failed "
                         f"({why}): `suite status` will not see it; cancel it (scancel {row['job']}), "
                         f"free the folder and run again") from None


class Relay:
    """`run --local`'s handlers for SIGTERM, SIGINT and SIGUSR1: each signal is noted (nothing else
    happens in a handler) and passed on by the copy loop to the member's launcher, as the launcher
    would have it: the first SIGTERM or SIGINT (checkpoint, stop: exit 4), a second SIGINT (stop at
    once), the first SIGUSR1 (checkpoint, exit 3). Repeats of a decided stop are not passed on, so
    any number of them keep its outcome. Once a signal came, no further member starts."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self):
        self.received: list[int] = []
        self.proc: subprocess.Popen | None = None
        self.seen = self.stops_sent = self.ints = 0
        self.usr1_sent = self.told = False
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        self.old_wakeup = signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self.old = {sig: signal.signal(sig, self.note) for sig in self.SIGNALS}

    def note(self, signum, frame) -> None:
        self.received.append(signum)

    def code(self) -> int:
        """The exit code a stop by the signals received asks for: 3 (SIGUSR1: requeue) or 4."""
        return 3 if signal.SIGUSR1 in self.received else 4

    def attach(self, proc: subprocess.Popen | None) -> None:
        self.proc = proc
        self.dispatch()

    def dispatch(self) -> None:
        """Pass on what came since the last call (only while a launcher runs: a signal noted between
        the last check and its start is passed on once it exists)."""
        try:
            while os.read(self.wake_r, 512):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self.proc is not None and self.seen < len(self.received):
            sig = self.received[self.seen]
            self.seen += 1
            self.relay(sig)

    def relay(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if sig == signal.SIGUSR1:
            send = not self.usr1_sent
            self.usr1_sent = True
        else:
            self.ints += sig == signal.SIGINT
            send = self.stops_sent == 0 or (sig == signal.SIGINT and self.ints >= 2 and self.stops_sent == 1)
            self.stops_sent += send
        if send:
            self.proc.send_signal(sig)
        elif not self.told:
            self.told = True
            _say(f"mpippo.suite: {name} again: the member is already stopping with a checkpoint"
                 f"{' (a second Ctrl-C stops it at once)' if sig != signal.SIGINT else ''}")

    def close(self, settle: bool = False) -> None:
        """The old handlers back; with `settle` (the suite's own process) and after a stop, ignored
        instead to the process's end: a repeat that lands after the member ended (a wrapper sending
        SIGTERM every 100 ms) would kill the suite and lose its exit code, which any number of repeats
        must keep. (An in-process caller, a test, stays stoppable.)"""
        for sig, old in self.old.items():
            signal.signal(sig, signal.SIG_IGN if settle and self.received else old)
        signal.set_wakeup_fd(self.old_wakeup)
        os.close(self.wake_r)
        os.close(self.wake_w)


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # no terminal left to tell: the log still says it
        pass


def run_local(suite: Suite, members: list[Member], mpirun_args: str = "",
              lock_fds: tuple[int, ...] = (), settle: bool = False) -> int:
    """The members one after another through the launcher (a live progress bar on a terminal).
    A SIGTERM or Ctrl-C (SIGINT), or SIGUSR1: the running member checkpoints and stops, no further
    member starts, and the exit code is the member's (4; 3 for SIGUSR1). `lock_fds`: the suite
    folder's locks, held by each launcher too, so the suite stays locked until its member has stopped.
    `settle`: this is the suite's own process (Relay.close)."""
    relay = Relay()
    try:
        return _run_members(suite, members, mpirun_args, lock_fds, relay)
    finally:
        relay.close(settle)


def _run_members(suite: Suite, members: list[Member], mpirun_args: str, lock_fds: tuple[int, ...], relay: Relay) -> int:
    t0 = time.monotonic()
    again = f"`python -m mpippo.suite run {suite.path} --local`"
    for k, m in enumerate(members, 1):
        if relay.received:
            print(f"suite {suite.name}: stopped by {signal.Signals(relay.received[0]).name} before member {k}/"
                  f"{len(members)} ({m.key}) started; {again} continues with it", flush=True)
            return relay.code()
        who = state.running(m)
        if who:  # taken since the members were chosen
            print(f"suite {suite.name}: member {k}/{len(members)}: {m.key} is running elsewhere ({who}); "
                  f"left to it", flush=True)
            continue
        resume = state.has_checkpoint(m)
        print(f"suite {suite.name}: member {k}/{len(members)}: {m.key} "
              f"({'resuming' if resume else 'starting'}; {time.monotonic() - t0:.0f} s into this run)", flush=True)
        m.folder.parent.mkdir(parents=True, exist_ok=True)
        aside = set_aside(m.folder)
        if aside:
            print(f"suite {suite.name}: {m.key}: its last attempt left no checkpoint; kept as {aside.name}", flush=True)
        cmd = [sys.executable, "-m", "mpippo.launch", "-n", str(suite.ranks), f"--mpirun-args={mpirun_args}",
               "--output-dir", str(m.folder), *(["--resume"] if resume else m.args)]
        rc = _tee(cmd, m, relay, lock_fds)
        if rc in (3, 4):
            print(f"suite {suite.name}: {m.key} stopped with a checkpoint (exit {rc}; log: {m.log}); "
                  f"{again} resumes it", flush=True)
            return rc
        if rc != 0:
            print(f"suite {suite.name}: {m.key} ended with exit {rc} (log: {m.log}); {again} runs it again", flush=True)
            return rc
        if relay.received and k < len(members):
            print(f"suite {suite.name}: stopped by {signal.Signals(relay.received[0]).name} after {m.key} finished; "
                  f"{again} continues with the next member", flush=True)
            return relay.code()
    return 0


def _tee(cmd: list[str], m: Member, relay: Relay, lock_fds: tuple[int, ...] = ()) -> int:
    """Run the launcher with its output on this terminal as it comes (the progress bar redraws with
    '\r', so bytes, not lines) and its finished lines in the member's log (what `status` reads).
    A terminal here means a bar there: MPIPPO_TTY tells the launcher, whose stderr is our pipe.

    The launcher runs in its own session (a Ctrl-C at the terminal reaches this process only, which
    passes it on once) and gets SIGTERM if this process dies (die_with_parent): it then checkpoints
    and stops. It holds the read end of its own output pipe too, so that its last lines never meet
    a closed pipe once we are gone (they wait in the pipe's buffer, enlarged to 1 MB)."""
    env = dict(os.environ)
    if sys.stderr.isatty():
        env.update(MPIPPO_TTY="1", COLUMNS=str(shutil.get_terminal_size().columns))
    with files.open_append(m.log, f"suite member {m.key}: its log") as log:
        log.write(f"mpippo: suite member {m.key}: {' '.join(cmd[2:])}\n")
        log.flush()
        read_end, write_end = os.pipe()
        try:
            try:
                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
            except OSError:
                pass
            keep = (read_end, *lock_fds)
            try:
                proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end,
                                        env=env, pass_fds=keep, start_new_session=True,
                                        preexec_fn=die_with_parent(signal.SIGTERM))
            finally:
                os.close(write_end)
            relay.attach(proc)
            try:
                _copy_out(read_end, log, relay)
                rc = _wait(proc, relay)
            finally:
                relay.attach(None)
        finally:
            os.close(read_end)
        log.write(f"mpippo: member {m.key} {closing(rc)}\n")
    return rc


def _wait(proc: subprocess.Popen, relay: Relay) -> int:
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            relay.dispatch()


def closing(rc: int) -> str:
    """The log's last word on a local attempt: 3 and 4 are the trainer's stops with a checkpoint
    (a signal, Ctrl-C), which `status` shows as stopped, not failed."""
    if rc == 0:
        return "finished"
    if rc in (3, 4):
        return f"stopped with a checkpoint (exit {rc}); the next run resumes it"
    return f"exited with status {rc}"


def _copy_out(fd: int, log, relay: Relay) -> None:
    """Bytes to the terminal as they come, finished lines to the log (a redrawn line as it last
    looked), until the launcher and everything under it closed its output; signals that came
    meanwhile are passed on as they come (the relay's wake-up pipe ends the wait)."""
    pending, echo = b"", True
    while True:
        ready, _, _ = select.select([fd, relay.wake_r], [], [], 1.0)
        relay.dispatch()
        if fd not in ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if echo:
            try:
                sys.stderr.buffer.write(chunk)
                sys.stderr.flush()
            except (OSError, ValueError):  # the terminal went away: the log goes on
                echo = False
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            log.write(line.rsplit(b"\r", 1)[-1].decode(errors="replace") + "\n")
    if pending.strip():
        log.write(pending.rsplit(b"\r", 1)[-1].decode(errors="replace") + "\n")
