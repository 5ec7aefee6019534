"""Run control shared by every algorithm and layout: one vocabulary, one policy each.

- device: `auto` takes the GPU when CUDA works and otherwise runs on the CPU with one warning
  (naming CUDA_VISIBLE_DEVICES when GPUs were allocated); an explicit `cuda` without CUDA is bad
  input (exit 2) for every algorithm.
- threads: `parallel.threads_per_rank: 0` means auto everywhere: OMP_NUM_THREADS, else
  SLURM_CPUS_PER_TASK, else the rank's CPU share (its affinity mask, divided among the ranks on the
  node that share it); procgen steps in the rank's thread on a CPU rank and with its CPU share less
  one thread on a GPU rank (the main thread drives the GPU).
- stop reasons, one precedence: a budget that is reached ends the run as `done` whatever else
  happened at that moment; otherwise SIGUSR1 (`requeue`) > SIGTERM (`stopped`) > the time budget
  (`duration`). Across agents that end separately, the most urgent wins (requeue > stopped >
  duration > done), so a job is requeued while any agent still has work.
- episode statistics: `episode_return_mean` is the mean return of the last 100 finished episodes,
  in every algorithm (EpisodeWindow).
- a checkpoint that cannot be written ends the run with one line and exit 1, the previous one intact.
- RunResult: what a run ended with; the CLI maps it to an exit code without knowing the algorithm.
- a one-rank job that hangs (a user's env stuck in its step) ends after guards.collective_timeout_s
  with one line naming the phase and the place in the user's code (`watch_alone`), as a many-rank
  job's collective watchdog ends one whose rank hangs.
- start-up without the cyclic collector: run_mpi.py and evaluate turn it off first thing,
  `freeze_imports()` sets aside what the imports made and `end_startup_gc_pause()` turns it on
  once the trainer or evaluator is built (see there).
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from mpippo.metrics import keys
from mpippo.errors import code_at, main_thread_at, say, say_last
from mpippo.rules import show
from mpippo.usage import UsageError
from mpippo.preemption import EXIT_FAILURE, EXIT_OK, EXIT_REQUEUE, EXIT_STOPPED, PauseClock

URGENCY = keys.STOP_REASONS  # a job takes its parts' most urgent; a failed part fails the job
STOP_REASONS = URGENCY[:-1]  # the reasons a run itself stops for
EXIT_CODES = {"done": EXIT_OK, "duration": EXIT_OK, "stopped": EXIT_STOPPED, "requeue": EXIT_REQUEUE,
              "failed": EXIT_FAILURE}
STOP_WHY = {"done": "run finished", "duration": "run finished (time budget reached)",
            "requeue": f"stopped by SIGUSR1 after a checkpoint; exit {EXIT_REQUEUE} asks the batch script to requeue",
            "stopped": f"stopped by a signal after a checkpoint (exit {EXIT_STOPPED}); continue with --resume",
            "failed": "run failed"}


def freeze_imports() -> None:
    """Once torch and the algorithms are imported, before anything of the run is made: what the
    imports made (about 180,000 objects the cyclic collector tracks, nearly all living as long as
    the process) is frozen, never scanned again. One collection pass over it cost 0.13-0.15 s of
    CPU and freed 7,000 objects of import-time cycles (0.7 MB, kept now): a cost every rank of
    every job paid at start-up (AMD EPYC Zen 4; the test suite starts about 470 such processes).
    A no-op where the collector is on (the Python API in a user's own process)."""
    if not gc.isenabled():
        gc.freeze()


def end_startup_gc_pause() -> None:
    """Start-up (torch's import above all) makes many long-lived objects and few cycles, and the
    collector's passes over them find next to nothing: a one-rank toy-cue run took 2.8 s of CPU
    with it on, 2.3 s with it off until here (AMD EPYC, AVX2, median of 10 each, beside a training
    run). Here one pass frees what was made since `freeze_imports` in cycles (a loaded checkpoint's
    among them: freezing those would keep them for good), the rest is frozen and the collector
    turned back on for the run. A no-op where nothing turned it off."""
    if not gc.isenabled():
        gc.collect()
        gc.freeze()
        gc.enable()


PHASE_WORDS = {"env_step": "in its envs' step", "inference": "in the policy's forward pass",
               "gae": "computing advantages", "backward": "in a backward pass", "allreduce": "in the gradient sync",
               "optimizer": "in the optimizer's step"}


@contextmanager
def watch_alone(timer, timeout_s: float, end, what: str = "training", who: str = "",
                kept: str = " (its last checkpoint, if one was written, stays)", clock=time.perf_counter,
                stop_due: Callable[[], int | None] | None = None, stop_end: Callable[[int], None] | None = None):
    """A one-rank job has no other rank to notice that it hangs (a user's env stuck in native code,
    a deadlocked library), and a stop signal only sets a flag that a hung loop never reads: a thread
    ends it with `end(1)` when one phase of `timer` (an env step, a forward or backward pass) has
    lasted timeout_s, naming it and where the training thread is. Per phase, not per rollout: a
    whole rollout, a checkpoint write or W&B's upload at the end may legitimately take longer. Time
    the process spent stopped does not count. (evaluate: on every rank, as its ranks play apart.)
    A signal that should end the process at once (`stop_due()`: the trainer's second Ctrl-C, a tool's
    stop; read from preemption.SignalLog), first seen while an env step runs, with that same step
    still running a second later (an env's native code that retries after a signal keeps Python's
    handler from running), ends it by `stop_end(signal)`, as the main thread would have. Anywhere
    else (a checkpoint's fsync, a block that holds stops until it is whole, steps that go on) the
    main thread acts on the signal itself."""
    if timeout_s <= 0:
        yield
        return
    done, trainer, every = threading.Event(), threading.get_ident(), min(1.0, timeout_s / 4)

    def watch() -> None:
        pause, held = PauseClock(every, clock), None  # held: (the stop, the env step it came in, when seen)
        while not done.wait(every):
            now, phase, since = pause.tick(), timer.phase, timer.since
            if held is None and stop_due is not None and (due := stop_due()) is not None:
                held = (due, since if phase == "env_step" else None, now)
            elif held is not None and held[1] is not None and (phase, since) == ("env_step", held[1]) \
                    and now - held[2] >= 1.0:  # (the main thread's own way had its chance)
                return stop_end(held[0])
            if phase is not None and (lasted := now - max(since, pause.resumed)) > timeout_s:
                frame = sys._current_frames().get(trainer)
                say(f"mpippo: error: {who}one step of {what} has lasted {lasted:.0f} s (guards.collective_timeout_s = "
                    f"{timeout_s:g}): {what} hangs {PHASE_WORDS.get(phase, phase)}{code_at(frame)}; ending it{kept}")
                return end(EXIT_FAILURE)
    threading.Thread(target=watch, name="mpippo-hang-watch", daemon=True).start()
    try:
        yield
    finally:
        done.set()


STOP_GRACE_S = 5.0  # a start-up held after a stop: how long it may take to reach its own next step


# Start-up's collectives wait at least this long, whatever guards.collective_timeout_s says: ranks
# import torch, read the checkpoint and make their envs at their own pace (on a loaded node, or a
# parallel file system at scale, seconds to minutes apart), and a short timeout meant for training's
# steps would end a healthy job there. A rank hung in start-up still ends the job, later.
STARTUP_TIMEOUT_S = 300.0


def on_root(world, fn: Callable):
    """fn() on rank 0 only (file system decisions, a file read once for every rank); every rank gets its
    result, or raises the same UsageError, so the next agreement sees one verdict."""
    outcome = None
    if world.is_root:
        try:
            outcome = ("ok", fn())
        except UsageError as e:
            outcome = ("error", e.errors)
    outcome = world.bcast_obj(outcome)
    if outcome[0] == "error":
        raise UsageError(outcome[1])
    return outcome[1]


def startup_timeout(configured: float) -> float:
    """The watchdog's timeout through start-up (0, off, stays off)."""
    return max(configured, STARTUP_TIMEOUT_S) if configured > 0 else 0.0


def held_words(lasted: float) -> str:
    """A start-up ended by its watch past the watchdog, no stop asked (the trainer's and evaluate's line)."""
    return (f"start-up has been held in the env's code for {lasted:.0f} s (start-up's watchdog: "
            f"guards.collective_timeout_s, at least {STARTUP_TIMEOUT_S:g} s; 0 turns it off)")


def end_held(world, code: int, line: Callable[[str], str]) -> None:
    """From a watch's thread, the main thread held in the user's code: line(where it is) said last, then
    the job ends with `code` (one rank's abort ends every rank)."""
    say_last(line(main_thread_at()))
    world.abort(code)


@contextmanager
def watch_startup(stop_seen: Callable[[], int | None], end: Callable[[int], None], grace_s: float = STOP_GRACE_S,
                  clock=time.monotonic, every: float = 0.25, held: Callable[[], float | None] = lambda: 0.0,
                  hang_s: Callable[[], float] = lambda: 0.0, end_hung: Callable[[float], None] | None = None):
    """A one-rank job's start-up runs the user's code (env.import's module; its envs made, reset and
    closed), which may hang: a stop signal then only sets a flag that start-up reads at its next step,
    which never comes (SIGTERM from `timeout` or Slurm changed nothing). Once a stop is seen
    (`stop_seen()`: the signal, from the flags or preemption.SignalLog, whose C-level record native
    code cannot hold up), a thread gives start-up grace_s more to end by itself (it says the stop's
    line and exits at its next step), then calls end(signal) while `held()` (when the main thread
    entered the user's code, on `clock`: errors.users_code; None outside it). Without a stop, a
    start-up held in the user's code for hang_s() (0: off) ends by end_hung(seconds): a one-rank job
    has no other rank whose start-up collective would time out. Time the process spent stopped does
    not count."""
    done = threading.Event()

    def watch() -> None:
        pause, seen = PauseClock(every, clock), None  # seen: (the signal, when)
        while not done.wait(every):
            now, since = pause.tick(), held()
            if seen is None and (sig := stop_seen()) is not None:
                seen = (sig, now)
            elif seen is not None and now - max(seen[1], pause.resumed) >= grace_s and since is not None:
                return end(seen[0])
            lasted, limit = (now - max(since, pause.resumed) if since is not None else 0.0), hang_s()
            if end_hung is not None and limit > 0 and lasted > limit:
                return end_hung(lasted)
    threading.Thread(target=watch, name="mpippo-startup-watch", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def stop_reason(budget_reached: bool, requeue: bool, stop: bool, time_up: bool) -> str | None:
    """Why a run stops now, or None to go on (the precedence of the module docstring)."""
    if budget_reached:
        return "done"
    if requeue:
        return "requeue"
    if stop:
        return "stopped"
    return "duration" if time_up else None


def urgency(reason: str) -> int:
    return URGENCY.index(reason)


@dataclass
class RunResult:
    stop_reason: str                 # one of STOP_REASONS, or "failed"
    summary: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.stop_reason]


class Deadline:
    """training.duration_hours as a wall-clock deadline (None: no time budget)."""

    def __init__(self, hours: float | None):
        self.at = time.monotonic() + hours * 3600 if hours else None

    def reached(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at


class EpisodeWindow:
    """Returns of the last `size` finished episodes: `episode_return_mean` everywhere."""

    def __init__(self, size: int = 100, returns=()):
        self.returns: deque = deque(returns, maxlen=size)

    def add(self, returns) -> None:
        self.returns.extend(float(r) for r in returns)

    def mean(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None

    def __len__(self) -> int:
        return len(self.returns)


def pick_device(want: str, index: int = 0, warn=print):
    """torch.device for `training.device` (cpu | cuda | auto); `index` picks among the visible GPUs."""
    import torch
    if want == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", index % torch.cuda.device_count())
        # the rank's current device too: what torch puts on "the current GPU" (new streams, a CUDA
        # graph's capture stream, cuBLAS handles) must be this GPU, not GPU 0 of every rank
        torch.cuda.set_device(device)
        return device
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if visible is None else show(visible)[1:-1]  # (escaped: the line stays one line)
    if want == "cuda":
        raise UsageError(f"training.device: 'cuda' requested but CUDA is not usable here (CUDA_VISIBLE_DEVICES="
                          f"{shown}); use auto (falls back to the CPU) or cpu")
    if visible:
        warn(f"mpippo: warning: training.device is auto and GPUs were allocated (CUDA_VISIBLE_DEVICES={shown}), "
             f"but CUDA is not usable here; running on the CPU")
    return torch.device("cpu")


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # the x86 flags of native bf16 dot products
# oneDNN's instruction-set ceilings (ONEDNN_MAX_CPU_ISA), lowest first; bf16 dot products need
# AVX512_CORE_BF16 or above. A ceiling below it makes torch's CPU kernels behave as on a CPU without
# the flags (e.g. an AVX2 cluster node emulated on a newer machine), so auto must choose fp32 there too.
ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
               "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2")
ISA_VAR = "ONEDNN_MAX_CPU_ISA"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def isa_cap(env=None) -> str | None:
    """The oneDNN ceiling that rules bf16 out (e.g. 'AVX2'), or None when there is none (unset,
    DEFAULT/ALL, or at least AVX512_CORE_BF16; an unknown name is oneDNN's to refuse, not ours)."""
    value = (os.environ if env is None else env).get(ISA_VAR, "").strip().upper()
    if value not in ONEDNN_ISAS:
        return None
    return value if ONEDNN_ISAS.index(value) < ONEDNN_ISAS.index("AVX512_CORE_BF16") else None


def bf16_native(device, flags: set[str] | None = None, env=None) -> tuple[bool, str]:
    """Whether `device` computes bf16 matrix products in hardware, and the evidence in words:
    GPUs of compute capability 8.0 or more; CPUs with AVX-512 BF16 or AMX that oneDNN may use."""
    if device.type == "cuda":
        import torch
        major, minor = torch.cuda.get_device_capability(device)
        return major >= 8, f"GPU compute capability {major}.{minor}"
    have = [f for f in BF16_CPU_FLAGS if f in (cpu_flags() if flags is None else flags)]
    if not have:
        return False, f"no {'/'.join(BF16_CPU_FLAGS)} CPU flag"
    if cap := isa_cap(env):
        return False, f"{ISA_VAR}={cap} keeps oneDNN below AVX512_CORE_BF16"
    return True, f"CPU flag {'/'.join(have)}"


MLP_FP32_WHY = "auto: vector observations (an MLP this small only pays bf16's casts)"


def resolve_precision(want: str, native: bool, evidence: str, mlp: bool = False) -> tuple[str, str, str | None]:
    """(precision, why, warning) for `training.precision`: auto is bf16 where the hardware has it
    natively (the parity runs learned as well in bf16 as in fp32, 1.5-1.9x faster on the CNN), else
    fp32, and fp32 for the MLPs of vector observations (`mlp`: on HalfCheetah bf16 ran at 0.56-0.80x
    of fp32's steps/s: the casts cost more than the small matmuls save); an explicit value is
    honoured, bf16 without hardware support with one warning (emulated: slow)."""
    if want == "auto":
        if mlp:
            return "fp32", MLP_FP32_WHY, None
        return ("bf16" if native else "fp32"), f"auto: {evidence}", None
    warning = None
    if want == "bf16" and not native:
        warning = (f"mpippo: warning: training.precision is bf16 but this hardware computes it in software "
                   f"({evidence}): correct, but slower than fp32")
    return want, "set in the config", warning


def cuda_determinism(device, on: bool) -> None:
    """Deterministic GPU kernels (see training.deterministic): cuDNN's fixed algorithms, and cuBLAS's
    fixed workspace, which must be chosen before its first handle, i.e. before the first matmul.
    Off: cuDNN benchmarks its algorithms for each shape once and keeps the fastest (the shapes of a
    run never change: the env batch and the minibatch)."""
    import torch
    if device.type != "cuda":
        return
    if not on:
        torch.backends.cudnn.benchmark = True
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # warn_only: an op with no deterministic kernel warns instead of stopping the run
    torch.use_deterministic_algorithms(True, warn_only=True)


def env_threads(configured: int | None, device, cpu_share: int) -> int:
    """Procgen's stepping threads for one rank: `configured`, or (None = auto) 0 on a CPU rank (its
    cores train the network) and on a GPU rank its CPU share less the core whose thread drives the
    GPU (0 when the share is one core: stepping in the rank's thread)."""
    if configured is not None:
        return configured
    return cpu_share - 1 if device.type == "cuda" and cpu_share > 1 else 0


def threads_per_rank(configured: int, cpu_share: int) -> int:
    """torch threads for one rank: `configured`, or (0 = auto) OMP_NUM_THREADS, else SLURM_CPUS_PER_TASK,
    else the rank's CPU share (World.cpu_share: its affinity mask over the ranks on the node that share
    it). OMP_NUM_THREADS first because torch itself takes it: someone who set it (the Slurm scripts do,
    to the task's CPUs; a machine shared with other jobs, as `make test`'s workers share theirs) meant it.
    Only a plain positive count in ASCII digits counts (OpenMP also takes nested lists such as "4,2";
    "²" passes isdigit() and fails int()), below a million (torch refuses 2**31)."""
    if configured > 0:
        return configured
    return taken[1] if (taken := threads_from_env()) else max(1, cpu_share)


RUN_ENDS = "nothing is trained and the run ends as it is; a larger --total-timesteps trains on"


def spent_note(what: str, budget: int, done: int, left: int, ending: str = RUN_ENDS) -> str | None:
    """A resume with nothing left to train ends at once as finished: said at start (`--resume
    --total-timesteps 4096` of a run at 8,192 steps had ended in silence, as if it trained). `what`
    names the budget with its value; `left`: the env steps it will still take (an actor-learner run's
    actors step in whole rounds: none where less than one round is left)."""
    if done == 0 or left > 0:
        return None
    state = "is reached already" if done >= budget else "leaves less than one round of its actors' steps"
    return f"{what} {state} ({done:,} env steps done): {ending}"


def budget_end(cfg, done: int, batch: int, ranks: int) -> int | None:
    """The step a sync run from `done` ends at: its budget rounded up to whole updates of `batch`; None
    where that is not known in advance (the balanced cut-off on more than one rank varies the update's
    size; timed training's budget is a cap) or nothing is left."""
    t = cfg.training
    left = t.total_timesteps - done
    if left <= 0 or (t.rollout_cutoff is not None and ranks > 1) or t.duration_hours is not None:
        return None
    return done + -(-left // batch) * batch


def threads_from_env() -> tuple[str, int] | None:
    """(variable, count) of the environment's thread count that auto takes (threads_per_rank), or None.
    The config's checks hold it to the node's cores as they hold parallel.threads_per_rank
    (config.memory.host_problems): OMP_NUM_THREADS=100000 crashed torch's first op (SIGSEGV), 5000 hung."""
    for name in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
        value = os.environ.get(name, "").strip()
        if value.isascii() and value.isdigit() and len(value) <= 6 and int(value) > 0:
            return name, int(value)
    return None
