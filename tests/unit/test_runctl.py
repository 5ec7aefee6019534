"""Shared run control: stop reasons and their precedence, exit codes, the episode window, device
and thread policy; and that PPO and DQN report episode_return_mean the same way."""
import os
import sys
import re
from pathlib import Path
import numpy as np
import pytest
import torch

from mpippo import runctl
from mpippo.usage import UsageError


def test_stop_reason_precedence():
    assert runctl.stop_reason(False, False, False, False) is None
    assert runctl.stop_reason(True, True, True, True) == "done"  # nothing left to do wins
    assert runctl.stop_reason(False, True, True, True) == "requeue"
    assert runctl.stop_reason(False, False, True, True) == "stopped"
    assert runctl.stop_reason(False, False, False, True) == "duration"


def test_agents_combine_to_the_most_urgent_and_map_to_exit_codes():
    """The job ends for its most urgent agent's reason (cli takes the max urgency over agents)."""
    most = lambda reasons: runctl.URGENCY[max(map(runctl.urgency, reasons), default=0)]  # noqa: E731
    assert most(["done", "requeue", "duration"]) == "requeue"  # an agent still has work
    assert most(["done", "duration"]) == "duration"
    assert most(["requeue", "failed"]) == "failed"
    assert most([]) == "done"
    codes = {r: runctl.RunResult(r).exit_code for r in runctl.URGENCY}
    assert codes == {"done": 0, "duration": 0, "stopped": 4, "requeue": 3, "failed": 1}


def test_episode_window_keeps_the_last_100():
    w = runctl.EpisodeWindow()
    assert w.mean() is None
    w.add(range(250))
    assert len(w) == 100 and w.mean() == pytest.approx(np.mean(np.arange(150, 250)))


def test_deadline():
    assert not runctl.Deadline(None).reached()
    import time
    d = runctl.Deadline(1e-7)  # 0.36 ms
    time.sleep(0.01)
    assert d.reached()
    assert not runctl.Deadline(1.0).reached()


def test_device_policy(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    warnings = []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert runctl.pick_device("auto", 0, warnings.append).type == "cpu"
    assert len(warnings) == 1 and "CUDA_VISIBLE_DEVICES=0,1" in warnings[0]
    with pytest.raises(UsageError, match="'cuda' requested but CUDA is not usable"):
        runctl.pick_device("cuda", 0, warnings.append)
    assert runctl.pick_device("cpu", 0, warnings.append).type == "cpu" and len(warnings) == 1


def test_a_gpu_rank_makes_its_own_gpu_the_current_device(monkeypatch):
    """Local rank k of a node whose ranks all see 6 GPUs takes GPU k % 6, and makes it torch's current
    device: streams and CUDA graphs made without a device (torch's capture stream) land on it, not on
    GPU 0 of every rank."""
    import torch
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 6)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    for local_rank, gpu in ((0, 0), (4, 4), (7, 1)):
        assert runctl.pick_device("auto", local_rank) == torch.device("cuda", gpu) == current[-1]
    assert runctl.pick_device("cpu", 3).type == "cpu" and len(current) == 3


def test_threads_policy(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert runctl.threads_per_rank(3, 8) == 3  # configured wins
    assert runctl.threads_per_rank(0, 5) == 5  # auto: the rank's CPU share
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    assert runctl.threads_per_rank(0, 48) == 6
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert runctl.threads_per_rank(0, 48) == 2  # the user's OpenMP count first, as torch takes it
    assert runctl.threads_per_rank(4, 48) == 4  # and the config's over it
    for nested_or_not_a_count in ("4,2", "0", "two", "", "²", "٣", "9" * 5000, "2147483648"):
        monkeypatch.setenv("OMP_NUM_THREADS", nested_or_not_a_count)
        assert runctl.threads_per_rank(0, 48) == 6


def test_the_progress_bar_and_eta_count_to_where_the_run_ends():
    """A budget between two updates ends at the next (the start-up note says so): the bar and the ETA
    counted to the budget (a bar of 512 that the run took to 1,024). budget_end is that step, where it
    is known in advance, and the note's arithmetic (the bar itself: test_progress_and_local_suite)."""
    from mpippo import config as C

    def cfg(*over):
        return C.build({}, [("training", "total_timesteps", 512), *over], 1)
    assert runctl.budget_end(cfg(), 0, 1024, 1) == 1024 and runctl.budget_end(cfg(), 256, 128, 2) == 512
    assert runctl.budget_end(cfg(), 512, 1024, 1) is None  # reached: nothing left
    assert runctl.budget_end(cfg(("training", "rollout_cutoff", 0.5)), 0, 1024, 2) is None  # sizes vary
    assert runctl.budget_end(cfg(("training", "rollout_cutoff", 0.5)), 0, 1024, 1) == 1024  # (not on one rank)
    assert runctl.budget_end(cfg(("training", "duration_hours", 1.0)), 0, 1024, 1) is None  # a cap


def test_env_threads_policy():
    import torch
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert runctl.env_threads(3, gpu, 8) == 3  # configured wins
    assert runctl.env_threads(None, cpu, 8) == 0  # a CPU rank's cores train the network
    assert runctl.env_threads(None, gpu, 8) == 7  # one core drives the GPU
    assert runctl.env_threads(None, gpu, 1) == 0  # a one-core share steps in the rank's thread


def test_cpu_share_of_bound_and_unbound_ranks():
    from mpippo.comm.world import cpu_share
    node = list(range(16))
    assert cpu_share(node, [node]) == 16  # one rank, unbound
    assert cpu_share(node, [node] * 4) == 4  # four unbound ranks share the node
    bound = [list(range(4 * r, 4 * r + 4)) for r in range(4)]
    assert cpu_share(bound[1], bound) == 4  # bound: each its own mask
    assert cpu_share([0], [[0], [1]]) == 1
    assert cpu_share([0, 1], [[0, 1]] * 3) == 1  # more ranks than cores: at least one
    job = list(range(8))  # a cgroup of 8 cores for 2 unbound ranks on a 16-core node
    assert cpu_share(job, [job, job]) == 4


class _Chunks:
    """A stand-in LearnerChannel that hands the learner chunks of given episode returns."""

    def __init__(self, layout, batches):
        self.layout, self.actors, self.out = layout, [1], []
        for i, returns in enumerate(batches):
            views = layout.views(layout.new_buffer())
            h = views["header"]
            h["count"], h["seq"], h["episodes"], h["version"] = 0, i, len(returns), 0
            views["episode_returns"][:len(returns)] = returns
            self.out.append((i, 1, views, 0))

    def poll(self):
        out, self.out = self.out, []
        return out

    def release(self, slot):
        pass


def test_ppo_and_dqn_report_episode_return_mean_alike(tmp_path):
    """The same 137 finished episodes: PPO's reported value (its window, joined by the reporter's
    count-weighted mean) equals the DQN learner's."""
    from mpippo import config as C
    from mpippo.algos.apex import chunk_fields
    from mpippo.comm import World
    from mpippo.comm.p2p import ChunkLayout
    from mpippo.layout.learner import Learner
    from mpippo.metrics.reporter import IDX
    from mpippo.runners.sync import SyncTrainer

    returns = np.random.default_rng(0).normal(5, 3, 137)
    cfg = C.resolve(C.build({}, [("env", "name", "toy-cue"), ("env", "num_envs", 4), ("model", "channels", [4]),
                                 ("model", "hidden_size", 8), ("training", "n_steps", 8)], 1), 1)
    ppo = SyncTrainer(cfg, World(), tmp_path, None)
    ppo.win_returns.add(returns[:60])
    ppo.win_returns.add(returns[60:])
    ppo.interval_ep[:] = 0
    captured = {}
    ppo.world.gather = lambda v, name: captured.setdefault("M", v[None].copy())
    ppo.report(None, np.zeros(len(IDX)), {k: 0.0 for k in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac",
                                                             "updates", "skipped")}, 0.0, False, False)
    M = captured["M"]
    ppo_mean = M[:, IDX["win_ret_sum"]].sum() / M[:, IDX["win_count"]].sum()

    dqn_cfg = C.resolve(C.build({}, [("training", "algo", "dqn")], 2), 2)
    learner = Learner.__new__(Learner)
    Learner.__init__(learner, type("A", (), {"cfg": dqn_cfg, "section": dqn_cfg.dqn})(), None,
                     _Chunks(ChunkLayout(64, chunk_fields((8, 8, 3)), episode_capacity=80), [returns[:60], returns[60:]]), None)
    learner.ingest()
    assert learner.window.mean() == pytest.approx(ppo_mean, abs=1e-9)
    assert ppo_mean == pytest.approx(returns[-100:].mean(), abs=1e-9)


def test_bf16_native_reads_the_cpu_flags_and_the_gpu_capability():
    cpu = torch.device("cpu")
    assert runctl.bf16_native(cpu, {"avx2", "avx512_bf16"}, {}) == (True, "CPU flag avx512_bf16")
    assert runctl.bf16_native(cpu, {"amx_bf16", "avx512_bf16"}, {})[0]
    assert runctl.bf16_native(cpu, {"avx2", "avx512f"}, {}) == (False, "no avx512_bf16/amx_bf16 CPU flag")
    flags = runctl.cpu_flags()  # this machine's, read for real
    assert runctl.bf16_native(cpu)[0] == (bool(flags & {"avx512_bf16", "amx_bf16"}) and runctl.isa_cap() is None)


def test_a_onednn_ceiling_below_bf16_makes_the_cpu_count_as_without_it():
    """ONEDNN_MAX_CPU_ISA=AVX2 (with ATEN_CPU_CAPABILITY=avx2) makes torch's kernels those of an AVX2
    node: auto must then pick fp32 as it would there, whatever flags this CPU has."""
    cpu, flags = torch.device("cpu"), {"avx2", "avx512_bf16", "amx_bf16"}
    for cap in ("AVX2", "avx2", "AVX512_CORE", "AVX512_CORE_VNNI", "SSE41"):
        native, why = runctl.bf16_native(cpu, flags, {"ONEDNN_MAX_CPU_ISA": cap})
        assert not native and why == f"ONEDNN_MAX_CPU_ISA={cap.upper()} keeps oneDNN below AVX512_CORE_BF16"
    for cap in ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL", "DEFAULT", "", "nonsense"):
        assert runctl.bf16_native(cpu, flags, {"ONEDNN_MAX_CPU_ISA": cap}) == (True, "CPU flag avx512_bf16/amx_bf16")
    # no flag stays no flag, whatever the ceiling
    assert runctl.bf16_native(cpu, {"avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"})[1] == "no avx512_bf16/amx_bf16 CPU flag"


def test_precision_auto_follows_the_hardware_and_explicit_values_are_honoured():
    assert runctl.resolve_precision("auto", True, "CPU flag amx_bf16") == ("bf16", "auto: CPU flag amx_bf16", None)
    assert runctl.resolve_precision("auto", False, "no flag") == ("fp32", "auto: no flag", None)
    for native in (True, False):  # the MLPs of vector observations: fp32 whatever the hardware
        assert runctl.resolve_precision("auto", native, "x", mlp=True) == ("fp32", runctl.MLP_FP32_WHY, None)
    assert runctl.resolve_precision("bf16", True, "x", mlp=True)[0] == "bf16"  # an explicit value is honoured
    assert runctl.resolve_precision("fp32", True, "x") == ("fp32", "set in the config", None)
    prec, _, warning = runctl.resolve_precision("bf16", False, "no avx512_bf16/amx_bf16 CPU flag")
    assert prec == "bf16" and "slower than fp32" in warning and "no avx512_bf16" in warning
    assert runctl.resolve_precision("bf16", True, "x")[2] is None


def test_the_avx2_emulation_gives_avx2_kernels_and_fp32(tmp_path):
    """ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 reproduce an AVX2 node on a machine with
    more, and change nothing on one without: torch's own kernels and oneDNN's are AVX2 (oneDNN says
    so itself), and auto picks fp32. Without them, this machine's own line."""
    import subprocess
    import sys
    probe = ("import torch; from mpippo import machine; c = torch.nn.Conv2d(3, 4, 3)\n"
             "with torch.no_grad(): c(torch.randn(2, 3, 8, 8))\nprint(machine.describe())")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", ONEDNN_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120).stdout
    assert "onednn_verbose,v1,info,cpu,isa:Intel AVX2\n" in out, out[:2000]
    line = out.strip().splitlines()[-1]
    # the reason is the ISA ceiling on a machine with bf16, the missing flag on a real AVX2 node
    native, why = runctl.bf16_native(torch.device("cpu"), env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert not native and line.endswith(f"CPU kernels AVX2; precision auto -> fp32 ({why})"), line
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    out = subprocess.run([sys.executable, "-m", "mpippo.machine"], env=env, capture_output=True, text=True, timeout=120)
    native, evidence = runctl.bf16_native(torch.device("cpu"), env={})
    assert out.stdout.strip().endswith(f"precision auto -> {'bf16' if native else 'fp32'} ({evidence})"), out.stdout
    # a fresh process: the CPU seconds of its torch import, the VM's speed index (the probe above imported
    # torch before asking, so its line has none); the family and model numbers tell VMs of one name apart
    took = re.search(r"CPU kernels \w+, its import (\d+\.\d) s of CPU; ", out.stdout)
    assert took and float(took.group(1)) > 0 and ", its import" not in line, (out.stdout, line)
    with open("/proc/cpuinfo") as f:
        first = f.read().split("\n\n", 1)[0]
    family = re.search(r"^cpu family\s*:\s*(\d+)$", first, re.M)
    model = re.search(r"^model\s*:\s*(\d+)$", first, re.M)
    assert not (family and model) or f"(family {family.group(1)}, model {model.group(1)})," in out.stdout, out.stdout


@pytest.mark.parametrize("code, checkpoint, exit_code, says", [
    (4, True, 4, "mpippo: tool: mpippo on Pong in 'run' stopped on a signal (exit 4) with its checkpoint written; "
                 "the same command resumes it"),
    (3, True, 4, "stopped on a signal (exit 3) with its checkpoint written"),
    (4, False, 4, "mpippo: tool: mpippo on Pong in 'run' stopped on a signal (exit 4) before it trained anything; "
                  "the same command starts it again"),
    (1, True, 1, "mpippo: error: tool: mpippo on Pong in 'run': 2 rank(s) failed (exit 1): ValueError: bad"),
])
def test_a_tool_reports_a_run_stopped_by_a_signal_as_stopped_not_failed(monkeypatch, capsys, tmp_path, code,
                                                                        checkpoint, exit_code, says):
    """A trainer's exit after a signal (3 requeue, 4 stopped: checkpointed, resumable) is the tool's
    exit 4 with how to go on (a run stopped during its start-up has no checkpoint: it says so); any
    other exit stays a failure with the run's last error."""
    from mpippo import launch, toolcli

    def stopped(*args, **kwargs):
        raise launch.TrainerError(f"2 rank(s) failed (exit {code}):\nValueError: bad", code)
    monkeypatch.setattr(launch, "run_trainer", stopped)
    monkeypatch.chdir(tmp_path)
    if checkpoint:
        (tmp_path / "run" / "checkpoints").mkdir(parents=True)
        (tmp_path / "run" / "checkpoints" / "latest.pt").write_bytes(b"")
    main = lambda argv: toolcli.run_trainer(2, [], "run", "mpippo on Pong", resume="the same command resumes it")  # noqa: E731
    assert toolcli.run("tool", main, []) == exit_code
    assert says in capsys.readouterr().err


def test_the_collector_is_off_for_start_up_and_on_for_the_run(tmp_path):
    """run_mpi.py turns the cyclic collector off first thing and freezes what the imports made; once the
    trainer is built, what start-up made is frozen too and the collector is on again for the run (a run without it would keep every reference
    cycle it makes). In-process: a no-op where the collector was on."""
    import gc
    import subprocess
    import sys
    import weakref
    frozen = gc.get_freeze_count()
    runctl.freeze_imports()
    runctl.end_startup_gc_pause()
    assert gc.isenabled() and gc.get_freeze_count() == frozen

    class Node:  # a reference cycle start-up dropped (a loaded checkpoint's may be large): freed, not frozen
        pass
    gc.disable()
    try:
        runctl.freeze_imports()  # what the imports made: set aside, never scanned
        assert gc.get_freeze_count() > frozen
        node = Node()  # made after the imports (a checkpoint is read after them)
        node.me = node
        dropped = weakref.ref(node)
        del node
        runctl.end_startup_gc_pause()
        assert gc.isenabled() and dropped() is None and gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
        gc.enable()
    probe = ("import atexit, gc, runpy, sys\n"
             "atexit.register(lambda: print('collector', gc.isenabled(), gc.get_freeze_count() > 50_000))\n"
             "sys.argv = ['run_mpi.py', *sys.argv[1:]]\nrunpy.run_path('run_mpi.py', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", probe, "--config", "configs/toy_cue.yaml", "--total-timesteps", "64",
                          "--no-progress", "--output-dir", str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0 and out.stdout.strip().endswith("collector True True"), out.stdout[-2000:] + out.stderr


def test_a_stop_inside_stops_held_waits_for_the_blocks_end_even_when_it_raised():
    """What a held block makes (a file and the handle that removes it) is made whole: the stop signal
    that came inside it is raised at its end, also when the block itself raised, and only once."""
    import signal

    from mpippo import toolcli
    old = signal.signal(signal.SIGTERM, toolcli._raise_stopped)
    made = []
    try:
        with pytest.raises(toolcli.Stopped, match="SIGTERM"):
            with toolcli.stops_held():
                with toolcli.stops_held():  # nested: raised at the outer block's end
                    signal.raise_signal(signal.SIGTERM)
                    made.append("file")
                made.append("handle")
        assert made == ["file", "handle"]
        toolcli._stopping.clear()
        with pytest.raises(toolcli.Stopped):
            with toolcli.stops_held():
                signal.raise_signal(signal.SIGTERM)
                raise ValueError("the block failed")
        signal.raise_signal(signal.SIGTERM)  # a second stop does nothing: the first is unwinding
        with toolcli.stops_held():
            pass
    finally:
        toolcli._stopping.clear()
        toolcli._pending.clear()
        signal.signal(signal.SIGTERM, old)


class _Steps:
    """A stand-in for the trainer's Stopwatch: the phase running and since when (on the fake clock)."""
    def __init__(self, phase, since):
        self.phase, self.since = phase, since


def _watched(steps, clock, timeout_s=0.4, seconds=1.5):
    """Run watch_alone for `seconds` of real time over `steps`; the clock readings at which it ended
    the run (none if it did not), and what it said."""
    import io
    import threading
    import time
    from contextlib import redirect_stderr

    from mpippo import runctl
    ended, said, stop = [], io.StringIO(), threading.Event()

    def end(code):
        ended.append((code, clock.now))
        stop.set()
    with redirect_stderr(said), runctl.watch_alone(steps, timeout_s, end, clock=clock):
        stop.wait(seconds)
    time.sleep(0.05)
    return ended, said.getvalue()


class _Clock:
    """Each reading 0.1 s after the last (the watch reads it once a wake-up), and jumps on request."""
    def __init__(self, jumps=None):
        self.now, self.jumps, self.reads = 0.0, dict(jumps or {}), 0

    def __call__(self):
        self.reads += 1
        self.now += self.jumps.get(self.reads, 0.1)
        return self.now


def test_the_hang_watch_ends_a_run_whose_one_step_lasts_past_the_timeout():
    ended, said = _watched(_Steps("env_step", 0.0), _Clock())
    assert ended and ended[0][0] == 1 and 0.4 < ended[0][1] < 0.8, ended
    assert said.startswith("mpippo: error: one step of training has lasted 0 s (guards.collective_timeout_s = 0.4): "
                           "training hangs in its envs' step, at '"), said


def test_the_hang_watch_leaves_time_outside_the_steps_alone():
    """A checkpoint write, W&B's upload at the end, a report: no phase runs, nothing is a hang."""
    ended, said = _watched(_Steps(None, 0.0), _Clock())
    assert not ended and not said


def test_the_hang_watch_does_not_count_time_the_process_was_stopped():
    """SIGSTOP, then SIGCONT 100 s later (Ctrl-Z and fg, Slurm's suspend): the watch wakes late, and
    the step it finds running has lasted only what it ran since; past the timeout after that, it ends."""
    ended, _ = _watched(_Steps("env_step", 0.05), _Clock(jumps={2: 100.0}))
    assert ended and ended[0][1] > 100.4, ended  # not at the late wake-up (100.1), but 0.4 s of running after it


class _StepOn:
    """A phase on the fake clock whose step is a new one from `new_at` on (its start far ahead: the
    hang's own end never comes)."""
    def __init__(self, phase, clock, new_at=None):
        self.phase, self.clock, self.new_at = phase, clock, new_at

    @property
    def since(self) -> float:
        return 2e9 if self.new_at is not None and self.clock.now >= self.new_at else 1e9


def _stop_watched(phase, new_at=None) -> list:
    """watch_alone over one phase for 2.5 s of real time (25 wake-ups, 2.5 s on the fake clock), a
    stop due from 0.5 s on the fake clock; what stop_end and end got, and when."""
    import signal
    import threading

    from mpippo import runctl
    clock, ended, stopped = _Clock(), [], threading.Event()
    steps = _StepOn(phase, clock, new_at)

    def stop_end(sig):
        ended.append((sig, clock.now))
        stopped.set()
    with runctl.watch_alone(steps, 0.4, lambda code: ended.append(code), clock=clock, stop_end=stop_end,
                            stop_due=lambda: signal.SIGINT if clock.now >= 0.5 else None):
        stopped.wait(2.5)
        stopped.wait(0.3)  # (a watch that went on would end it again meanwhile)
    return ended


def test_the_hang_watch_ends_a_process_whose_env_step_outlasts_a_stop_by_a_second():
    """An env step that native code holds (retrying after the signal: Python's handler never runs; end
    to end in test_env_failures.py's hang-native, for the trainer and evaluate): once `stop_due` names
    a signal, the watch gives that step a second, then ends the process by `stop_end`, once."""
    import signal
    ended = _stop_watched("env_step")
    assert len(ended) == 1 and ended[0][0] == signal.SIGINT and 1.5 <= ended[0][1] < 1.8, ended


@pytest.mark.parametrize("jumps, ends_after", [({}, 1.0), ({8: 100.0}, 101.2)])
def test_the_start_up_watch_ends_a_start_up_held_past_its_grace_after_a_stop(jumps, ends_after):
    """A stop seen from 0.5 s on the fake clock: start-up has grace_s (0.5 s here) to reach its own next
    step, then the watch ends it, once, naming the stop (end to end: test_env_failures.py's hang-make
    and hang-native-make). Time the process spent stopped (SIGSTOP, a 100-s jump) does not count.
    Without a stop, or with start-up ended first, it ends nothing."""
    import signal
    import threading

    from mpippo import runctl

    def watched(stop_at: float, seconds: float, grace_s: float = 0.5, held_from: float = 0.0) -> list:
        clock, ended, stopped = _Clock(jumps), [], threading.Event()

        def end(sig):
            ended.append((sig, clock.now))
            stopped.set()
        with runctl.watch_startup(lambda: signal.SIGTERM if clock.now >= stop_at else None, end, grace_s=grace_s,
                                  clock=clock, every=0.01, held=lambda: 0.0 if clock.now >= held_from else None):
            stopped.wait(seconds)
        stopped.wait(0.1)  # (a watch that went on would end it again meanwhile)
        return ended
    ended = watched(0.5, 2.0)
    assert len(ended) == 1 and ended[0][0] == signal.SIGTERM and ends_after <= ended[0][1] < ends_after + 0.4, ended
    assert watched(1e9, 0.5) == []  # no stop
    assert watched(0.0, 0.05, grace_s=1e6) == []  # start-up ended before its grace
    # the main thread in mpippo's own code (a checkpoint read, W&B's start) is left to finish: only the user's is ended
    ended = watched(0.5, 3.0, held_from=ends_after + 1.2)  # in the user's code only from then on
    assert len(ended) == 1 and ends_after + 1.2 <= ended[0][1] < ends_after + 1.5, ended


@pytest.mark.parametrize("held_since, hang_s, ends", [(0.0, 1.0, True), (None, 1.0, False), (0.0, 0.0, False)])
def test_the_start_up_watch_ends_a_start_up_held_in_the_users_code_past_its_timeout(held_since, hang_s, ends):
    """No stop at all: a one-rank start-up held in the user's code (an env constructor that never returns)
    had no other rank whose collective would time out. Past hang_s in the user's code it ends, once,
    with how long it lasted; outside the user's code, or with the timeout off (0), it does not."""
    import threading

    from mpippo import runctl
    clock, ended, stopped = _Clock(), [], threading.Event()

    def end_hung(lasted):
        ended.append((lasted, clock.now))
        stopped.set()
    with runctl.watch_startup(lambda: None, lambda sig: ended.append(sig), clock=clock, every=0.01,
                              held=lambda: held_since, hang_s=lambda: hang_s, end_hung=end_hung):
        stopped.wait(1.0)
    stopped.wait(0.1)
    assert (len(ended) == 1 and 1.0 < ended[0][0] < 1.4) if ends else ended == [], ended


@pytest.mark.parametrize("phase, new_at", [(None, None), ("backward", None), ("env_step", 0.8)])
def test_the_hang_watch_leaves_a_stop_to_the_main_thread_outside_one_held_env_step(phase, new_at):
    """A checkpoint's fsync (no phase), a backward pass, or env steps that go on (the main thread runs
    Python between them, and a tool may hold a stop until a block is whole): the main thread acts on
    the signal itself; the watch ends nothing."""
    assert _stop_watched(phase, new_at) == []


@pytest.mark.parametrize("sigs, second", [("TERM INT", True), ("USR2 INT", True), ("INT INT", True), ("HUP INT", True),
                                          ("INT", False), ("USR1 INT", False), ("INT USR1 TERM", False), ("", False)])
def test_a_second_ctrl_c_is_a_sigint_after_any_stop(sigs, second):
    """preemption.SignalFlags._on_stop's rule (is_second_ctrl_c), over the signals as they came: SIGUSR1
    (a requeue) is no stop."""
    import signal

    from mpippo.preemption import second_ctrl_c_in
    assert second_ctrl_c_in([getattr(signal, f"SIG{name}") for name in sigs.split()]) == (signal.SIGINT if second else None)


def test_the_signal_log_holds_every_caught_signal_in_order_and_begins_only_in_the_main_thread(monkeypatch):
    """Python's C-level handler writes each caught signal to the wakeup fd (a signal with a Python
    handler: the log sees what the process handles, and keeps the stops); a thread other than the
    main one gets no log."""
    import os
    import signal
    import threading

    from mpippo import preemption
    sigs = (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
    old = {sig: signal.signal(sig, lambda *_: None) for sig in sigs}
    before = signal.set_wakeup_fd(-1)
    try:
        log = preemption.SignalLog()
        for sig in (signal.SIGUSR1, signal.SIGINT, signal.SIGUSR2, signal.SIGINT):
            os.kill(os.getpid(), sig)
        assert log.read() == [signal.SIGUSR1, signal.SIGINT, signal.SIGUSR2, signal.SIGINT]  # (the requeue: for
        assert preemption.second_ctrl_c_in(log.read()) == signal.SIGINT                 # a held start-up)
        child = os.fork()  # a forked worker's signals are its own, not the log's (its wakeup fd goes)
        if child == 0:
            os.kill(os.getpid(), signal.SIGINT)
            os._exit(0)
        assert os.waitpid(child, 0)[1] == 0
        assert log.read() == [signal.SIGUSR1, signal.SIGINT, signal.SIGUSR2, signal.SIGINT]
    finally:
        wakeup = signal.set_wakeup_fd(before)
        os.close(wakeup)
        os.close(log.r)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    monkeypatch.setattr(preemption, "_LOG", None)
    fds, got = len(os.listdir("/proc/self/fd")), []
    thread = threading.Thread(target=lambda: got.append(preemption.log_signals()))
    thread.start()
    thread.join()
    assert got == [None] and preemption._LOG is None and len(os.listdir("/proc/self/fd")) == fds


def test_a_last_line_is_said_once_and_a_tools_stop_line_each_time_until_then(monkeypatch, capsys):
    """The main thread and the hang watch may both reach a process's last line: said once. A tool's
    stop line (toolcli.run, which an in-process caller may start again) is said each time, unless the
    watch has said its last line."""
    import threading

    from mpippo import errors
    monkeypatch.setattr(errors, "_LAST_SAID", threading.Lock())
    errors.say_last("a tool's", final=False)
    errors.say_last("a tool's", final=False)
    errors.say_interrupted("")
    errors.say_interrupted("")
    errors.say_last("a tool's", final=False)
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == ["a tool's"] * 2 and len(err) == 3 and err[2].startswith("mpippo: stopped at once by a second Ctrl-C")


def test_the_progress_guard_restarts_its_peers_clocks_after_this_side_was_stopped(monkeypatch):
    """The actor-learner layout's guard (comm/p2p.py): a peer silent past the timeout ends the job,
    but a gap of more than half the timeout between two looks of this side (the whole job suspended,
    then continued) restarts the peers' clocks: what they sent meanwhile is unread, not missing."""
    from mpippo.comm import p2p
    now = [0.0]
    monkeypatch.setattr(p2p.time, "monotonic", lambda: now[0])

    asked = []

    class World:
        def job_rank(self, rank=None):
            return 1 if rank is None else rank

        def ask_where(self, rank):
            asked.append(rank)

        def abort(self, code):
            raise SystemExit(code)
    guard = p2p.ProgressGuard(World(), [2], timeout_s=10.0, role="actor")
    for t in (0.1, 0.2, 100.0, 100.1):  # stopped from 0.2 to 100: not 99.8 s of the actor's silence
        now[0] = t
        guard.check()
    assert guard.last[2][0] == 100.0
    with pytest.raises(SystemExit):  # looking on as usual, a silent actor is still seen
        while now[0] < 120:
            now[0] += 0.1
            guard.check()
    assert 110.0 < now[0] < 110.3, now[0]
    assert asked == [2]  # the silent peer was asked where it is before the job ended


def test_the_users_own_script_is_the_users_code_and_run_mpi_py_is_not(monkeypatch, tmp_path):
    """Where a failure or a hang is: the innermost frame of the user's code. mpippo's entry script
    (run_mpi.py) is mpippo's; a user's own train.py, the program's __main__ where it defines its env,
    is the user's (it was left out with __main__ for a while, and its env's lines named no place)."""
    import traceback
    import types

    from mpippo.errors import user_code_at
    ours = str(Path(runctl.__file__).parents[1] / "run_mpi.py")
    theirs = str(tmp_path / "train.py")
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__=theirs))
    frames = [traceback.FrameSummary(ours, 24, "<module>"), traceback.FrameSummary(theirs, 15, "step"),
              traceback.FrameSummary(runctl.__file__, 99, "watch")]
    assert user_code_at(frames) == f", at {theirs!r}:15 in step"
    assert user_code_at(frames[:1] + frames[2:]) == ""
    # `python -m mpippo.<tool>`: the frames below the tool's are runpy's, frozen into Python 3.11; `python -c`
    import runpy
    for below in (traceback.FrameSummary(runpy._run_code.__code__.co_filename, 88, "_run_code"),
                  traceback.FrameSummary("<string>", 3, "<module>")):
        assert user_code_at([below] + frames[2:]) == ""


END = """import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from mpippo.shutdown import end_process
sys.stdout = open(sys.stdout.fileno(), "w", buffering=1 << 16, closefd=False)  # (a block-buffered console)
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.5), print("thread done"))).start()
pool = ThreadPoolExecutor(1)
pool.submit(lambda: None)  # an idle worker left running: threading's exit hook stops it
print("buffered")
end_process({code})
print("never")
"""


@pytest.mark.parametrize("code, status, err", [("None", 0, ""), ("3", 3, ""), ("-1", 255, ""),
                                               ("'mpippo: error: x'", 1, "mpippo: error: x\n")])
def test_a_process_ended_without_the_teardown_still_does_what_the_teardown_owed(code, status, err):
    """run_mpi.py and the tools end with shutdown.end_process (no interpreter teardown: a tenth to a quarter
    of a short run's CPU): the streams are flushed, a thread that is no daemon finishes, atexit's functions
    run (W&B's finish, logging's flush), an executor left open (a user's env's) does not hang it, and the
    status is what SystemExit(code) gives."""
    import subprocess
    res = subprocess.run([sys.executable, "-c", END.format(code=code)], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == status, res.stderr
    assert res.stdout.splitlines() == ["buffered", "thread done", "atexit ran"], res.stdout
    assert res.stderr == err


POLITE = """import threading, time
from mpippo.shutdown import end_process
def poll():
    while threading.main_thread().is_alive():
        time.sleep(0.02)
    print("polite ended", flush=True)
threading.Thread(target=poll).start()
end_process(3)
"""


def test_a_thread_that_waits_for_the_main_threads_end_ends_with_it():
    """end_process joins the threads that are not daemons for 10 s at most (a user's lingering thread must not
    hold a finished run): a thread that ends once the main thread has is not one of those, as in Python's
    own exit (the main thread counted as alive made it wait the 10 s and warn)."""
    import subprocess
    res = subprocess.run([sys.executable, "-c", POLITE], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 3 and res.stdout == "polite ended\n" and res.stderr == "", res.stderr  # (no warning)


LINGERING = """import threading, time
from mpippo import errors, shutdown
threading.Thread(target=time.sleep, args=(3600,), name="shipper").start()
shutdown.LINGER_S = 0.2
errors.name_rank("rank 3: ")  # (what mpippo.comm's World says in a job of several ranks)
shutdown.end_process(5)
"""


def test_a_lingering_thread_is_named_with_the_rank_and_the_exit_code_stands():
    import subprocess
    res = subprocess.run([sys.executable, "-c", LINGERING], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 5 and res.stderr.startswith(
        "mpippo: warning: rank 3: 1 thread(s) that are not daemons still running 0.2 s after the end, not waited "
        "for: 'shipper', at "), res.stderr


def test_a_profiled_process_ends_with_the_teardown_so_the_profiler_writes_its_results(tmp_path):
    """`python -m cProfile -o FILE run_mpi.py ...` writes FILE after the program: an os._exit inside it lost
    the profile."""
    import subprocess
    script = tmp_path / "end.py"
    script.write_text("from mpippo.shutdown import end_process\nend_process(3)\n")
    res = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(tmp_path / "prof"), str(script)],
                         capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
    assert (tmp_path / "prof").exists() and (tmp_path / "prof").stat().st_size > 0, res.stderr  # (cProfile ends 0
    # after a SystemExit, whatever its code: its own way, as before end_process)


def test_a_processes_leftover_children_are_ended_but_services_that_end_with_it(monkeypatch):
    """shutdown._end_children at a process's end: a child its code left running is ended, even with
    no stderr left to warn on; a service that ends with this process (named anywhere in its command
    line, past the warning's 80 characters too: a long interpreter path) is left be."""
    import subprocess
    import psutil
    from mpippo import shutdown
    service = subprocess.Popen(["sh", "-c", "sleep 30 # " + "x" * 100 + " multiprocessing.forkserver"])
    stray = subprocess.Popen(["sleep", "31"])
    try:
        assert [p.pid for p in shutdown._stray(psutil)] == [stray.pid]
        monkeypatch.setattr(sys, "stderr", None)  # (`tool 2>&-`: the warning cannot be said)
        shutdown._end_children(0.2)
        assert not psutil.pid_exists(stray.pid) and service.poll() is None  # (ended and reaped there)
    finally:
        for p in (service, stray):
            p.kill()
            p.wait()


def test_a_sync_resume_names_a_folder_gone_since_and_an_actor_learner_run(tmp_path):
    """Phase D's checkpoint: a run folder moved away after phase B is named gone (it had been called an
    actor-learner run); a folder of agents' checkpoints is one; a copy without latest.pt keeps its own words."""
    from mpippo import cli  # (the command line: its phase D helper alone, no job)
    with pytest.raises(UsageError, match=f"the run folder '{tmp_path / 'moved'}' is gone: moved or deleted during"):
        cli._sync_checkpoint_size(tmp_path / "moved", "ppo")
    (tmp_path / "agents" / "agent_0" / "checkpoints").mkdir(parents=True)
    (tmp_path / "agents" / "agent_0" / "checkpoints" / "latest.pt").write_bytes(b"x")
    with pytest.raises(UsageError, match="holds actor-learner agent checkpoints"):
        cli._sync_checkpoint_size(tmp_path / "agents", "ppo")
    (tmp_path / "copy" / "checkpoints").mkdir(parents=True)
    (tmp_path / "copy" / "checkpoints" / "ckpt_0000003.pt").write_bytes(b"x")
    with pytest.raises(UsageError, match="but checkpoints/ holds ckpt_0000003.pt, its newest: link it as latest.pt"):
        cli._sync_checkpoint_size(tmp_path / "copy", "ppo")


def test_evaluate_names_what_to_give_where_a_run_folder_has_no_latest_pt(tmp_path):
    """evaluate --checkpoint on a multi-agent run's folder names its agents' folders (it had said to give a
    run folder: it was one); on a copy that lost latest.pt, the newest periodic checkpoint."""
    from mpippo import evaluate  # (evaluate's own words, no job)
    from mpippo.checkpoint import latest_path
    for k in (0, 1):
        (tmp_path / "two" / f"agent_{k}" / "checkpoints").mkdir(parents=True)
        latest_path(tmp_path / "two" / f"agent_{k}").write_bytes(b"x")
    said = evaluate._why_not_there(latest_path(tmp_path / "two"))
    assert said == "a multi-agent run: each agent has its own, give one of its folders (agent_0, agent_1)"
    (tmp_path / "copy" / "checkpoints").mkdir(parents=True)
    (tmp_path / "copy" / "checkpoints" / "ckpt_0000009.pt").write_bytes(b"x")
    said = evaluate._why_not_there(latest_path(tmp_path / "copy"))
    assert said.startswith("checkpoints/ holds ckpt_0000009.pt, its newest: link it as latest.pt (ln -sf") and \
        said.endswith("; or give that file"), said
