"""`python -m mpippo.launch -n K [trainer options]`: mpirun with graceful SIGTERM and Ctrl-C.

pip Open MPI's mpirun (prterun) forwards SIGTERM/SIGINT to the ranks and SIGKILLs them a
fraction of a second later, before any rank can write a checkpoint. This launcher runs
mpirun in its own session and turns the first SIGTERM/SIGINT it receives into SIGUSR2,
which mpirun forwards and the ranks treat as "checkpoint and stop" at the next iteration
boundary. Further SIGTERMs keep that stop (Slurm and wrappers may send more than one); a second
Ctrl-C (SIGINT) is a person's "now" and is passed on as SIGTERM (hard stop). SIGUSR1 is passed
through (checkpoint, exit 3 = requeue). A signal that comes before every rank listens is held
and passed on once they do (see _Relay). If the launcher itself dies (kill -9), mpirun gets
SIGUSR2 from the kernel, so its ranks still checkpoint and stop instead of training on, detached.
The exit code is mpirun's; a bad -n is one line, exit 2.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mpippo.config.memory import ranks_fit
from mpippo.errors import let_readers_leave, limit_words, os_reason, say, say_interrupted
from mpippo.leftovers import SHM_VAR, owned_prefix, shm_chosen, sweep_leftovers, temp_folder_problem
from mpippo.preemption import (EXIT_INTERRUPTED, EXIT_OK, EXIT_REQUEUE, EXIT_STOPPED, LISTENING_ENV, quiet_stops,
                               rank0_status, settle)
from mpippo.usage import EXIT_USAGE, Parser, UsageError, refusal

ROOT = Path(__file__).resolve().parent.parent


def mpirun_path() -> str:
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else (shutil.which("mpirun") or "mpirun")


def mpi_env() -> dict:
    """This process's environment for an mpirun job; a UsageError where Open MPI could not start there."""
    env = dict(os.environ)
    if (bad := temp_folder_problem(env)):
        raise UsageError(bad)
    if "HOME" not in env:  # (without one, opal_init fails: 14 lines of its own, exit 1)
        home = os.path.expanduser("~")
        env["HOME"] = home if home != "~" else "/"  # (no passwd entry for this uid: a container's)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")  # pip Open MPI refuses root without these
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def temp_folder(what: str) -> tempfile.TemporaryDirectory:
    """A temporary folder for a tool's runs, removed at its end (a signal included: toolcli.run),
    or by the next tool's start if this process is killed."""
    sweep_leftovers()
    return tempfile.TemporaryDirectory(prefix=owned_prefix(what), ignore_cleanup_errors=True)


@contextlib.contextmanager
def own_shm_folder(env: dict):
    """Give one mpirun job a shared-memory folder of its own (in `env`), removed when it ends.

    Open MPI's shared-memory transport names each rank's file in /dev/shm after the job's id:
    sm_segment.<node>.<uid>.<jobid>.<rank>, opened without O_EXCL. Under mpirun that id is a 16-bit
    hash of mpirun's name for the job (its pid) plus the job's number, so two jobs on one node meet
    on the same files about once in 65,536 pairs: each then reads the other's messages (the likely cause
    of a rank killed by SIGSEGV inside the transport while tests ran jobs side by side). A folder per job
    rules that out. A folder the user chose is kept; where none can be made, Open MPI's default."""
    if shm_chosen(env) or not os.path.isdir("/dev/shm"):
        yield env
        return
    sweep_leftovers()
    try:
        folder = tempfile.mkdtemp(prefix=owned_prefix("sm"), dir="/dev/shm")
    except OSError:  # full or read-only: the default folder still works
        yield env
        return
    env[SHM_VAR] = folder
    try:
        yield env
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # files of ranks killed by a signal included


@contextlib.contextmanager
def own_mark(env: dict):
    """Rank 0's listening mark for the job (preemption.announce_listening) in `env`, in a folder of this
    launcher's: it says rank 0's status once the job has ended, which _Outlived.end takes. Its path, or
    None where no folder can be made (a full TMPDIR: then none); one already set (a batch script's) is kept."""
    if env.get(LISTENING_ENV):
        yield env[LISTENING_ENV]
        return
    try:
        folder = temp_folder("mark")
    except OSError:
        yield None
        return
    with folder as path:
        env[LISTENING_ENV] = os.path.join(path, "listening")
        yield env[LISTENING_ENV]


def terminal_env(env: dict) -> dict:
    """Tell the ranks that a person watches: their stderr is mpirun's pipe, so tqdm would stay
    silent, though mpirun forwards everything to this terminal (MPIPPO_TTY, and its width)."""
    if sys.stderr.isatty() or env.get("MPIPPO_TTY") == "1":
        env["MPIPPO_TTY"] = "1"
        env.setdefault("COLUMNS", str(shutil.get_terminal_size().columns))
    return env


def die_with_parent(sig: int):
    """A Popen preexec_fn: the child gets `sig` when this process dies, however it dies (kill -9
    included), so a wrapper that is killed never leaves its job running on its own. Linux only
    (prctl PR_SET_PDEATHSIG); elsewhere nothing is set."""
    parent = os.getpid()

    def preexec():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os.kill(os.getpid(), sig)
    return preexec


BINDING_OPTIONS = ("--map-by", "--bind-to", "--cpus-per-rank", "--cpu-set", "--rankfile")
BINDING_ENV = ("PRTE_MCA_hwloc_default_binding_policy", "OMPI_MCA_hwloc_base_binding_policy")


def placement(ranks: int, user_args: list[str] = (), threads: int | None = None) -> tuple[list[str], dict]:
    """(mpirun options, environment) that give each of `ranks` ranks on this node its share of the
    cores: Open MPI binds each of 1-2 ranks to ONE core by default, so a 1-rank job on 16 cores
    would see one core (one torch thread, procgen stepping serially). Each rank gets `threads`
    cores (default: the launcher's cores // ranks) bound with --map-by slot:PE=n; when they do not
    fit, ranks share the cores unbound (binding would stack them). The user's own binding options
    in `user_args` (or a binding policy in the environment) are left as they are."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    share = threads or max(1, cores // ranks)
    fits = ranks * share <= cores
    if any(a.split("=")[0] in BINDING_OPTIONS for a in user_args) or any(v in os.environ for v in BINDING_ENV):
        return ([] if fits else ["--oversubscribe"]), {}
    # Open MPI binds from the node's first core whatever the launcher's own mask (taskset, a job step's
    # cpuset): within such a mask the ranks run unbound and share it (World.cpu_share divides it)
    restricted = cores < (os.cpu_count() or cores)
    if not fits or restricted:
        return ([] if fits else ["--oversubscribe"]) + ["--bind-to", "none"], {"PRTE_MCA_hwloc_default_binding_policy": "none"}
    return ["--map-by", f"slot:PE={share}"], {}


def mpirun_command(ranks: int, argv: list[str], threads: int | None = None) -> tuple[list[str], dict]:
    """(command, environment) for `mpirun -n ranks python argv...`, each rank bound to `threads`
    cores (default: its share of the node), or unbound where they do not fit (placement)."""
    where, extra = placement(ranks, threads=threads)
    env = mpi_env() | extra
    return [mpirun_path(), *where, "-n", str(ranks), sys.executable, *argv], env


class TrainerError(RuntimeError):
    """A run_trainer run that ended with a nonzero status: `code` (the trainer's exit codes,
    mpippo/preemption.py: 3 and 4 mean it stopped on a signal after writing its checkpoint)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def run_trainer(ranks: int, trainer_args: list[str], out_dir: Path, threads: int | None = None, timeout: float = 3600,
                extra_env: dict | None = None, stop_grace_s: float = 0.0, capture: bool = True) -> dict:
    """Run run_mpi.py to the end with --output-dir out_dir (benchmarks, sweeps): its
    benchmark_metrics.json (checked: mpippo.files) plus `wall_s_with_startup`. A TrainerError (its
    exit code, the stderr tail) on failure; subprocess.TimeoutExpired after `timeout` s, with the whole
    job killed (mpirun and its ranks: a killed mpirun alone would leave its ranks running).
    extra_env: variables for the ranks (one node: mpirun passes its environment on).
    stop_grace_s: for a run whose folder is kept (one that resumes), a stop of the caller is passed on
    as "checkpoint and stop" and the job gets this long to do it (a TrainerError with its exit code:
    4 stopped, 3 requeued, another if it failed meanwhile); 0 (runs in temporary folders): the job is
    killed at once.
    capture: False lets the job's output through to this process's (its progress on a console), and
    a TrainerError then holds no stderr tail."""
    from mpippo.files import read_metrics  # the config behind it: the launcher itself never loads it
    cmd, env = mpirun_command(ranks, [str(ROOT / "run_mpi.py"), "--output-dir", str(out_dir), *trainer_args], threads)
    env.update(extra_env or {})
    t0 = time.perf_counter()
    with own_shm_folder(env):
        pipe = subprocess.PIPE if capture else None
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=pipe, stderr=pipe, text=True,
                                start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))
        (outlived := _Outlived(proc.pid)).watch(proc)  # (an mpirun its ranks outlived: its timeout is an hour)
        try:
            err = proc.communicate(timeout=timeout)[1] or ""
        except subprocess.TimeoutExpired:
            end_job(proc)
            raise
        except BaseException:  # the caller stopped (toolcli.Stopped; a KeyboardInterrupt without a tool's handlers)
            err = checkpoint_and_stop(proc, ranks, stop_grace_s) if stop_grace_s else None
            if err is None or proc.returncode == 0:  # not ended in time (or finished: the stop stands)
                end_job(proc)  # the whole job goes
                raise
            raise TrainerError(f"{ranks} rank(s) ended on the stop (exit {proc.returncode}):\n"
                               f"{err.strip()[-3000:]}", proc.returncode) from None
    if proc.returncode != 0:
        err += f"\n{outlived.line()}" if outlived.ended else ""
        raise TrainerError(f"{ranks} rank(s) failed (exit {proc.returncode}):\n{err.strip()[-3000:]}", proc.returncode)
    m = read_metrics(out_dir)
    m["wall_s_with_startup"] = time.perf_counter() - t0
    return m


def checkpoint_and_stop(proc: subprocess.Popen, ranks: int, grace_s: float) -> str | None:
    """SIGUSR2 to mpirun (forwarded: every rank checkpoints at its next iteration boundary and exits 4);
    the job's stderr once it has ended within `grace_s` (its exit code says how), else None (the caller
    ends the job). Ranks that do not listen yet have nothing to keep, and SIGUSR2 would kill them
    uncleanly: None at once. A Ctrl-C while it waits is a person's "now", as mpippo.launch's second
    one: None at once (its handler comes first, so that none is lost; an ignored SIGINT stays so)."""
    now: list[int] = []
    hears = (threading.current_thread() is threading.main_thread()  # (only it may set a handler)
             and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)
    old = signal.signal(signal.SIGINT, lambda *_: now.append(1)) if hears else None
    try:
        if proc.poll() is None:  # (one that has ended already: its stderr below)
            if not ranks_listening(proc.pid, ranks):
                return None
            proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + grace_s
        while not now and time.monotonic() < deadline:
            try:
                return proc.communicate(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)))[1] or ""
            except subprocess.TimeoutExpired:
                continue
        return None
    finally:
        if hears:
            signal.signal(signal.SIGINT, signal.SIG_DFL if old is None else old)


def end_job(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End mpirun and every rank under it before its folders are removed. mpirun's own SIGTERM
    handling kills its ranks, which need not share its process group (each may lead its own); what
    is left after `grace_s` gets SIGKILL, and this returns once all of them are gone."""
    import psutil
    try:
        job = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        job = []
    proc.terminate()
    _, alive = psutil.wait_procs(job, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    with contextlib.suppress(BaseException):
        proc.communicate(timeout=grace_s)


def catches_usr1(pid: int) -> bool:
    """The process has a handler for SIGUSR1 (the SigCgt mask of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line for line in f if line.startswith("SigCgt:"))
        return bool((int(mask.split()[1], 16) >> (signal.SIGUSR1 - 1)) & 1)
    except (OSError, StopIteration, ValueError):
        return False


RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def _tree(pid: int) -> list:
    """Every process under `pid` (psutil processes); none where it has ended."""
    import psutil  # (here: the launcher's start imports nothing it may not need)
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def rank_processes(mpirun_pid: int, children: list | None = None) -> list:
    """The trainer ranks under mpirun on this node (psutil processes), in rank order, among `children`
    (its tree, read once by a caller that needs it too). A process mpirun has forked but not yet made a
    rank is left out: it still has mpirun's command line (run_mpi.py in it), mpirun's environment (no
    rank in it) and mpirun's handlers (which catch SIGUSR1, to forward it). So is one that ends between
    the listing and the look."""
    import psutil  # (here: the launcher's start imports nothing it may not need)
    ranks = []
    for p in _tree(mpirun_pid) if children is None else children:
        try:
            if "run_mpi.py" in " ".join(p.cmdline()):
                env = p.environ()
                rank = next((env[v] for v in RANK_VARS if env.get(v, "").isdecimal()), None)
                if rank is not None:
                    ranks.append((int(rank), p))
        except psutil.Error:
            continue
    return [p for _, p in sorted(ranks, key=lambda r: r[0])]


def ranks_listening(mpirun_pid: int, ranks: int) -> bool:
    """True once `ranks` rank processes under mpirun catch SIGUSR1: run_mpi.py's first line
    installed the handlers. Before that, a forwarded signal would kill a rank whose interpreter is
    still starting."""
    return sum(catches_usr1(p.pid) for p in rank_processes(mpirun_pid)) >= ranks


class _Relay:
    """The launcher's signal handlers, installed before anything else. Signals that arrive before
    mpirun exists or before every rank listens are held, then passed on: mpirun forwards at once,
    and a rank whose interpreter has not yet run its first line would die of SIGUSR1."""

    HOLD_MAX_S = 30.0  # ranks on other nodes cannot be seen from here: pass held signals on anyway

    def __init__(self):
        self.proc, self.ranks, self.started, self.held, self.stops, self.hard = None, 0, 0.0, [], 0, False
        self.killed = False  # the hard stop reached mpirun (which SIGKILLs the ranks on it)
        signal.signal(signal.SIGTERM, self.on_stop)
        signal.signal(signal.SIGINT, self.on_stop)
        signal.signal(signal.SIGUSR1, lambda s, f: self.send(signal.SIGUSR1))
        for sig in quiet_stops():  # (nohup's SIGHUP stays ignored)
            signal.signal(sig, self.on_stop)  # the terminal closed, a CPU-time limit: they had killed the launcher alone

    def on_stop(self, signum, frame):
        """The first stop is gentle; a second Ctrl-C is hard; more SIGTERMs change nothing."""
        self.stops += 1
        if self.stops == 1:
            self.send(signal.SIGUSR2)
            say(f"mpippo.launch: {signal.Signals(signum).name} received: ranks checkpoint and stop at the end of "
                f"this iteration (Ctrl-C again to stop at once)")  # (cannot fail: a closed terminal's stderr)
        elif signum == signal.SIGINT and not self.hard:
            self.hard = True
            self.send(signal.SIGTERM)

    def ready(self) -> bool:
        return self.proc is not None and (time.monotonic() - self.started > self.HOLD_MAX_S
                                          or ranks_listening(self.proc.pid, self.ranks))

    def send(self, sig) -> None:
        if self.held or not self.ready():
            self.held.append(sig)
        else:
            self.deliver(sig)

    def deliver(self, sig) -> None:
        self.proc.send_signal(sig)
        self.killed = self.killed or sig == signal.SIGTERM

    def wait(self, proc, ranks: int, mark: str | None = None) -> int:
        self.proc, self.ranks, self.started = proc, ranks, time.monotonic()
        outlived = _Outlived(proc.pid)
        while True:  # poll: a signal held while we wait must be passed on without waiting for the exit
            try:
                return proc.wait(timeout=0.05 if self.held else 0.5)
            except subprocess.TimeoutExpired:
                if self.held and self.ready():
                    held, self.held = self.held, []
                    for sig in held:
                        self.deliver(sig)
                if outlived.hung():
                    return outlived.end(proc, mark)
            except InterruptedError:
                continue


class _Outlived:
    """mpirun outliving every rank it started here: after a rank that fails inside MPI_Init (a bad
    OMPI_MCA_btl, say) Open MPI's runtime can wait forever (PMIX_ERR_UNREACH), and the launcher with
    it, deaf to a stop (the stop goes to ranks that are gone). Ranks on other nodes are not seen: a
    job whose ranks were never seen here is never judged."""

    # A job's normal end takes mpirun well under a second after its last rank here, and the ranks of other
    # nodes end within moments of these: MPI_Finalize waits for every rank (a fence) before any returns.
    GRACE_S = 30.0
    LOOK_S = 2.0  # (each look reads every child's environment)

    def __init__(self, mpirun_pid: int, own_session: bool = True):
        self.pid, self.seen, self.gone_since, self.next_look = mpirun_pid, False, None, 0.0
        self.ranks = {}  # the ranks seen here, by pid: judged by their own end, not by what /proc shows of them later
        self.own_session = own_session  # (mpirun started with start_new_session)

    def hung(self) -> bool:
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + self.LOOK_S
        # a rank seen stays one while it is under mpirun, whatever its title becomes (setproctitle); one that left
        # mpirun's tree (an env's worker orphaned by its rank) is no rank of this job's
        children = _tree(self.pid)
        under = {p.pid for p in children}
        self.ranks = {pid: p for pid, p in self.ranks.items() if pid in under}
        self.ranks.update((p.pid, p) for p in rank_processes(self.pid, children))
        if any(map(_running, self.ranks.values())):
            self.seen, self.gone_since = True, None
        elif self.seen and self.gone_since is None:
            self.gone_since = now
        return self.gone_since is not None and now - self.gone_since > self.GRACE_S

    def end(self, proc, mark: str | None = None) -> int:
        """The launcher's end of it (its own loop saw it hung): the session ended, the line said; rank 0's
        status where its mark says one (a run that finished, or checkpointed on a stop, whose mpirun was held
        writing to a console nobody read: it had been exit 1, blamed on a failed start), else 1."""
        self._end_session(proc)
        proc.wait()
        status = rank0_status(mark)
        say(self.line(status))
        return 1 if status is None else status

    def _end_session(self, proc) -> None:
        """SIGTERM to mpirun (Open MPI removes its session folder), SIGKILL to what is left 5 s later: the
        session it leads (the launcher's, the tools'), or, where it leads none (a batch script's, in the
        batch shell's group), it and what it had started. (Not end_job: beside run_trainer's communicate,
        which reaps mpirun, nothing else may.)"""
        import psutil  # (here: the launcher's start imports nothing it may not need)
        left = [] if self.own_session else _tree(proc.pid)  # (srun's remote daemons among them: a SIGTERM lets
                                                             # srun end its step)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, sig) if self.own_session else os.kill(proc.pid, sig)
            for p in left:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(sig)
            for _ in range(50 if sig == signal.SIGTERM else 0):
                if proc.poll() is not None and not any(map(_running, left)):  # (None while another thread waits
                    break                                                      # on it: the 5 s then run out)
                time.sleep(0.1)

    def line(self, status: int | None = None) -> str:
        """Its words: rank 0's `status` where it said one (the job's outcome is that), else a failure's."""
        if status is not None:
            return (f"mpippo: note: every rank of this job on this node has ended, rank 0 with exit {status}, but "
                    f"mpirun (pid {self.pid}) had not {self.GRACE_S:.0f} s later (held writing its output to a console "
                    f"that stopped reading, or Open MPI's runtime hung): ended it; the job's status is rank 0's")
        limits = f"; {why}" if (why := mpirun_limits()) else ""
        return (f"mpippo: error: every rank of this job on this node has ended, but mpirun (pid {self.pid}) had not "
                f"{self.GRACE_S:.0f} s later (Open MPI's runtime can hang after a rank fails at its start; its messages "
                f"are above): ended it{limits}")

    def watch(self, proc) -> threading.Thread:
        """The same watch beside a caller blocked in proc.communicate (run_trainer): it ends the job's
        session (SIGTERM, 5 s, SIGKILL), and communicate returns; `ended` says why."""
        def look():
            while proc.returncode is None and not self.hung():
                time.sleep(self.LOOK_S / 4)
            if proc.returncode is None:
                self.ended = True
                self._end_session(proc)
        self.ended = False
        thread = threading.Thread(target=look, name="mpirun-outlived", daemon=True)
        thread.start()
        return thread


def _running(process) -> bool:
    """A psutil process that has not ended (a zombie has: only its parent's wait is left)."""
    import psutil  # (here: the launcher's start imports nothing it may not need)
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE  # (is_running: not a reused pid)
    except psutil.Error:
        return False


class _Theirs:
    """A process this one did not start (the batch shell's mpirun), with Popen's pid and poll()."""

    def __init__(self, pid: int):
        import psutil  # (here: the launcher's start imports nothing it may not need)
        self.pid, self.process = pid, psutil.Process(pid)

    def poll(self) -> int | None:
        return None if _running(self.process) else 0


WATCH_ENDED = 9  # watch_batch_mpirun's status where it ended mpirun (1 is any Python failure's)


def watch_batch_mpirun(pid: int) -> int:
    """slurm/common.sh's watch beside its mpirun, which the batch shell can only wait on: the launcher's
    end of an mpirun that outlived its ranks here (else the job waited for Slurm's time limit).
    WATCH_ENDED where it ended it, 0 once mpirun ends by itself."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGXCPU):
        signal.signal(sig, signal.SIG_IGN)  # (the batch shell's to pass on: Slurm's TERM and scancel --signal reach
                                            # every process, and the watch is needed most while the ranks stop)
    try:
        mpirun = _Theirs(pid)
    except Exception:  # (psutil.NoSuchProcess: it ended before this started)
        return 0
    outlived = _Outlived(pid, own_session=False)
    while mpirun.poll() is None:
        if outlived.hung():
            outlived._end_session(mpirun)
            say(outlived.line(rank0_status(os.environ.get(LISTENING_ENV))))  # (the script then takes that status)
            return WATCH_ENDED
        time.sleep(outlived.LOOK_S / 4)
    return 0


HOST_OPTIONS = {"--host", "-H", "--hostfile", "--machinefile", "--default-hostfile"}  # ranks beyond this node


def mpirun_options(text: str) -> list[str]:
    """--mpirun-args split as a shell would ('--map-by "ppr:2:node"'), or one line naming what is wrong."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--mpirun-args: '{text}' cannot be split as a shell would ({e}); e.g. "
                         f"--mpirun-args='--map-by core --bind-to core'") from None


def main(argv: list[str] | None = None) -> int:
    relay = _Relay()
    p = Parser(prog="python -m mpippo.launch", description=__doc__.splitlines()[0])
    p.add_argument("-n", "--np", type=int, default=os.cpu_count() or 1, help="ranks (default: all cores)")
    p.add_argument("--mpirun-args", default="", help="extra mpirun options, one string: --mpirun-args='--map-by core'")
    try:
        args, trainer_args = p.parse_known_args(argv)
        if args.np < 1:
            raise UsageError(f"-n: the number of ranks must be >= 1, got {args.np}")
        user = mpirun_options(args.mpirun_args)
        if not HOST_OPTIONS.intersection(o.split("=")[0] for o in user):  # all on this node (or Slurm's nodes)
            ranks_fit(args.np, "-n")  # now: 100,000 ranks would be started before any could refuse
        base = mpi_env()
    except UsageError as e:
        sys.stderr.write(refusal(e.errors))
        return EXIT_USAGE
    where, extra = placement(args.np, user)
    if "--oversubscribe" in user and where[:1] != ["--oversubscribe"] and not extra:
        # a permission the job does not need (its ranks fit), and Open MPI unbinds every rank with it
        user.remove("--oversubscribe")
    elif "--oversubscribe" in user and where[:1] == ["--oversubscribe"]:
        where = where[1:]
    cmd = [mpirun_path(), *user, *where, "-n", str(args.np), sys.executable,
           str(ROOT / "run_mpi.py"), *trainer_args]
    # own session: a Ctrl-C at the terminal reaches only this launcher, which relays it gently
    with own_shm_folder(terminal_env(base | extra)) as env, own_mark(env) as mark:
        try:
            proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent(signal.SIGUSR2))
        except OSError as e:
            sys.stderr.write(f"mpippo: error: cannot start '{cmd[0]}' ({os_reason(e)})\n")
            return 2
        code = relay.wait(proc, args.np, mark)
    settle()  # the job's outcome is known: a late signal cannot turn it into death by signal
    if relay.killed and code not in (EXIT_OK, EXIT_USAGE, EXIT_REQUEUE, EXIT_STOPPED, EXIT_INTERRUPTED):
        # mpirun SIGKILLed the ranks before any could say a word (its exit 1): the line and code are ours
        say_interrupted("the job ")
        return EXIT_INTERRUPTED
    if (note := limits_note(code)):  # (a hang's line, _Outlived's, names them itself)
        say(note)
    return code


OPEN_MPI_FAILED = (186, 213, 250)  # mpirun's own statuses where its runtime failed under ulimit -n or -f (measured)
FEW_FILES = 256  # open files below which Open MPI's runtime may fail (2 ranks needed about 30; 1024 is the usual)


def limits_note(code: int) -> str:
    """The line after mpirun's status `code` where Open MPI's runtime failed in its own words under a limit
    of this process ('' otherwise): the launcher's, and a batch script's (slurm/common.sh)."""
    return f"mpippo: note: {why}" if code in OPEN_MPI_FAILED and (why := mpirun_limits()) else ""


def mpirun_limits() -> str:
    """The limits of this process that Open MPI's runtime meets first (its shared-memory files under
    `ulimit -f`, its pipes and sockets under a low `ulimit -n`), in words; '' where neither is set."""
    few = resource.getrlimit(resource.RLIMIT_NOFILE)[0] < FEW_FILES
    said = [words[2:] for words in (limit_words("f"), limit_words("n") if few else "") if words]
    return f"Open MPI's runtime may have failed on a limit: {'; and '.join(said)}" if said else ""


if __name__ == "__main__":
    let_readers_leave()  # (`2>&-`: sys.stderr None, and the launcher ended at its first look at it, exit 1, no word)
    raise SystemExit(main())
