"""A user's Gymnasium env that breaks mid-run (tests/user_env's Faulty-v0: it raises, calls
sys.exit(3), returns NaN), through the real CLI in each layout and in evaluate: one line naming the
env, the rank and where in the env's code, exit 2 (never 3, the requeue code a sys.exit(3) in the env
would otherwise pass on), no traceback, no hang, and the run's last checkpoint kept."""
import os
import platform
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import MPIRUN, ROOT, error_lines, finish, rank_processes, run, start, wait_for_line, wait_until

USER_ENVS = str(ROOT / "tests" / "user_env")
FAULTY = ["--no-progress", "--set", "env.import=mpippo_user_envs", "--set", "env.name=gym:mpippo-test/Faulty-v0",
          "--set", "logging.tensorboard=false"]


def job(ranks: int | None, args: list[str], fault: str = "", timeout: float = 120):
    cmd = [sys.executable, *args] if ranks is None else [MPIRUN, "--oversubscribe", "-n", str(ranks), sys.executable, *args]
    return run(cmd, timeout, env={"PYTHONPATH": USER_ENVS, "MPIPPO_TEST_ENV_FAULT": fault})


def the_line(res, *words: str) -> str:
    """The job's one error line, holding every word, and no traceback anywhere."""
    lines = error_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr[-3000:])
    assert all(w in lines[0] for w in words) and "Traceback" not in res.stderr + res.stdout, lines[0]
    return lines[0]


def test_an_env_raising_mid_run_ends_the_run_in_one_line_keeping_its_checkpoint_and_evaluate_says_so_too(tmp_path):
    """One rank, PPO: 4 envs x 128 steps an update, a checkpoint each; the env raises in the third
    update (its 1,064th env step, vector step 266). Then evaluate of the run, the env broken again, in its steps and in
    its renderer: one line each, no video or JSON left."""
    run_dir = tmp_path / "run"
    res = job(None, ["run_mpi.py", "--config", "configs/ppo_cartpole.yaml", *FAULTY, "--total-timesteps", "4096",
                     "--set", "env.kwargs={fault: raise, at: 1063}", "--set", "checkpoint.interval_iterations=1",
                     "--output-dir", str(run_dir)])
    the_line(res, "mpippo: error: env.name: 'gym:mpippo-test/Faulty-v0' raised RuntimeError: the user's env broke "
                  "in its step() (step 266 of this rank), at '", "mpippo_user_envs.py':")
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    assert state["iteration"] == 2 and not list(run_dir.rglob("*.tmp"))
    video, out = tmp_path / "play.mp4", tmp_path / "eval.json"
    evaluate = ["-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--import", "mpippo_user_envs",
                "--num-episodes", "4", "--json", str(out)]
    the_line(job(None, evaluate, fault="raise@3"), "raised RuntimeError: the user's env broke in its step()")
    the_line(job(None, [*evaluate, "--video", str(video)], fault="render@-1"),
             "mpippo: error: --video: env.name: 'gym:mpippo-test/Faulty-v0' raised RuntimeError: no display in its "
             "render()")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    res = job(None, [*evaluate[:-2], "--video", str(video)], fault="render-float@3")  # later frames: checked as the first
    assert res.returncode == 2 and error_lines(res.stderr) == [
        "mpippo: error: --video: the env's frame 2 is float32 of shape (16, 16, 3), not (H, W, 3) uint8; allowed: "
        "(H, W, 3) uint8 pictures of one size; no video written"], res.stderr[-2000:]
    assert "episodes" in res.stdout and "Lossy conversion" not in res.stderr  # (the results stand; imageio never saw it)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_processes_an_env_leaves_running_are_ended_with_the_run_and_named(tmp_path):
    """A user's env that starts a process its close() does not end (a simulator's server): it outlived
    the ranks and held mpirun's output pipes, so mpirun never returned (a batch job stayed until its time
    limit). Each rank waits a moment for them, names them in a warning and ends them; the job ends as it
    would have."""
    import psutil
    res = job(2, ["run_mpi.py", "--config", "configs/ppo_cartpole.yaml", *FAULTY, "--total-timesteps", "2048",
                  "--set", "env.kwargs={fault: leave-process}", "--output-dir", str(tmp_path / "run")], timeout=60)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    warned = [line for line in res.stderr.splitlines() if "process(es) this process started still running" in line]
    assert len(warned) == 2 and all("(sleep 3007)" in line and line.endswith("ending them") for line in warned), warned
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "3007"]]


def test_an_env_hanging_in_its_step_on_a_one_rank_job_ends_it_in_one_line_keeping_its_checkpoint(tmp_path):
    """One rank has no other rank to notice it hang, and a signal only sets a flag that the hung
    loop never reads: the env waits forever in native code in the third update, a SIGTERM then
    changes nothing, and the run ends guards.collective_timeout_s after its last step, naming the
    phase and the env's line; exit 1 (a failure, as a many-rank job's watchdog), the checkpoint kept.
    Then evaluate of the run, its env hanging again: ended alike, no JSON written."""
    run_dir = tmp_path / "run"
    proc = start([sys.executable, "run_mpi.py", "--config", "configs/ppo_cartpole.yaml", *FAULTY, "--total-timesteps",
                  "4096", "--set", "env.kwargs={fault: hang, at: 1063}", "--set", "checkpoint.interval_iterations=1",
                  "--set", "guards.collective_timeout_s=4", "--set", "logging.print_interval=1",
                  "--output-dir", str(run_dir)], env={"PYTHONPATH": USER_ENVS, "MPIPPO_TEST_ENV_MARK": str(tmp_path / "hung")})
    wait_for_line(proc, "iter     2")  # (the hang comes in the third update)
    wait_until((tmp_path / "hung").exists, "the env's hang (its mark)", 60)  # (the env makes it as it hangs)
    (tmp_path / "hung").unlink()  # (the test checks what the run folder's parent holds)
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, timeout=60)
    lines = error_lines(err)
    assert code == 1 and len(lines) == 1 and "Traceback" not in out + err, (code, err[-3000:])
    assert lines[0].startswith("mpippo: error: one step of training has lasted ") and \
        "(guards.collective_timeout_s = 4): training hangs in its envs' step, at '" in lines[0] and \
        "mpippo_user_envs.py':" in lines[0] and \
        lines[0].endswith("in step; ending it (its last checkpoint, if one was written, stays)"), lines[0]
    assert torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["iteration"] == 2
    # evaluate of that run, its env hanging in the episodes: the same watch (the run's timeout), one line
    res = job(None, ["-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--import", "mpippo_user_envs",
                     "--num-episodes", "4", "--json", str(tmp_path / "eval.json"), "--video", str(tmp_path / "v.mp4")],
              fault="hang@3", timeout=60)
    lines = error_lines(res.stderr)
    assert res.returncode == 1 and len(lines) == 1 and "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert lines[0].startswith("mpippo: error: one step of the evaluation has lasted ") and \
        "(guards.collective_timeout_s = 4): the evaluation hangs in its envs' step, at '" in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no JSON, no video, no temporary file
    # evaluate again, its env held in its constructor and no signal: its start-up watch ends it past start-up's
    # watchdog (the run's 4 s, the 300 s floor lowered to 2 s in the process), one line naming where
    res = job(None, [*FLOOR_2S, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--import", "mpippo_user_envs",
                     "--num-episodes", "4", "--json", str(tmp_path / "eval.json")], fault="hang-native-make@0", timeout=60)
    _held_past_the_watchdog(res, "mpippo: error: start-up has been held in the env's code for ",
                            "ending it; nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# A process whose start-up watchdog's floor (runctl.STARTUP_TIMEOUT_S, 300 s) is 2 s, then the command after it
# (a script, or -m and a module), as `python` would run it: the no-signal end of a held start-up, in seconds
FLOOR_2S = ["-c", "import runpy, sys; from mpippo import runctl; runctl.STARTUP_TIMEOUT_S = 2.0; "
                  "module = sys.argv[1] == '-m'; sys.argv = sys.argv[1 + module:]; "
                  "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True) if module else "
                  "runpy.run_path(sys.argv[0], run_name='__main__')"]


def test_a_thread_the_envs_module_leaves_running_does_not_hold_a_finished_run(tmp_path):
    """env.import's module starts a thread that is not a daemon and never ends (a simulator's client):
    Python joins such threads at exit, so the finished run (its results written) waited forever, its stop
    signals already ignored and its folder locked. It waits shutdown.LINGER_S (10 s; 1 s here, set in
    the process), names the thread and where it runs, and exits 0."""
    (tmp_path / "lingering.py").write_text("import threading, time\nimport mpippo_user_envs\n\n"
                                           "threading.Thread(target=time.sleep, args=(3600,), name='shipper').start()\n")
    wait_1s = ["-c", "import runpy, sys; from mpippo import shutdown; shutdown.LINGER_S = 1.0; "
                     "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"]
    t0 = time.monotonic()
    res = run([sys.executable, *wait_1s, "run_mpi.py", "--config", "configs/ppo_cartpole.yaml", "--no-progress", "--set",
               "env.import=lingering", "--set", "env.name=gym:mpippo-test/Steady-v0", "--set", "logging.tensorboard=false",
               "--total-timesteps", "512", "--output-dir", str(tmp_path / "run")], 60,
              env={"PYTHONPATH": f"{tmp_path}:{USER_ENVS}"})
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "mpippo: warning: 1 thread(s) that are not daemons still running 1 s after the end, not waited for: " \
           "'shipper', at '" in res.stderr, res.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").is_file() and time.monotonic() - t0 < 50
    res = run([sys.executable, *wait_1s[:1], wait_1s[1].replace("runpy.run_path(sys.argv[0]", "runpy.run_module('mpippo.evaluate'"),
               "evaluate", "--checkpoint", str(tmp_path / "run"), "--import", "lingering", "--num-episodes", "2"], 60,
              env={"PYTHONPATH": f"{tmp_path}:{USER_ENVS}"})  # (evaluate, its table printed: the same end)
    assert res.returncode == 0 and "'shipper', at '" in res.stderr and "return" in res.stdout, res.stderr[-3000:]


def _held_past_the_watchdog(res, first: str, last: str) -> None:
    """The job's one line after its start-up watch ended a start-up held in native code: exit 1."""
    lines = error_lines(res.stderr)
    assert res.returncode == 1 and len(lines) == 1 and "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert lines[0].startswith(first) and ", at '" in lines[0] and "mpippo_user_envs.py':" in lines[0] and \
        lines[0].endswith(last), lines[0]


def test_a_one_rank_start_up_held_in_the_envs_code_ends_past_its_watchdog_without_a_signal(tmp_path):
    """Nobody sends a signal (a batch job, nobody watching): a one-rank start-up held in native code in
    the env's constructor (its second env: the first one, made to check the config, returned) ends
    itself past start-up's watchdog, guards.collective_timeout_s but at least runctl.STARTUP_TIMEOUT_S
    (lowered to 2 s here, in the process): exit 1, one line naming where, the new run folder gone."""
    res = job(None, [*FLOOR_2S, "run_mpi.py", "--config", "configs/ppo_cartpole.yaml", *FAULTY, "--set",
                     "guards.collective_timeout_s=1", "--output-dir", str(tmp_path / "run")],
              fault="hang-native-make@1", timeout=60)
    _held_past_the_watchdog(res, "mpippo: error: start-up has been held in the env's code for ",
                            "ending it; nothing was trained yet and nothing is saved")
    assert "(start-up's watchdog: guards.collective_timeout_s, at least 2 s; 0 turns it off)" in res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("hang", ["hang", "hang-native"])
def test_a_second_ctrl_c_ends_a_run_hung_in_its_env_at_once_in_one_line(tmp_path, hang):
    """A person's second Ctrl-C is their "now", also while the env waits in native code: one line,
    exit 130 (a shell's code for Ctrl-C), no traceback, the last checkpoint kept; also where that code
    retries after a signal, so that Python's handler never runs (hang-native: the hang watch reads
    the signals, not the 600 s timeout; and evaluate's stop alike). Without PYTHONUNBUFFERED (a Slurm log's case: the console is
    a file, here a pipe) the progress lines still come out as printed, while the run hangs: they are
    not held in Python's buffer."""
    run_dir = tmp_path / "run"
    proc = start([sys.executable, "run_mpi.py", "--config", "configs/ppo_cartpole.yaml", *FAULTY, "--total-timesteps",
                  "4096", "--set", f"env.kwargs={{fault: {hang}, at: 1063}}", "--set", "checkpoint.interval_iterations=1",
                  "--set", "logging.print_interval=1", "--output-dir", str(run_dir)],
                 env={"PYTHONPATH": USER_ENVS, "PYTHONUNBUFFERED": "",  # (empty: unset, for Python)
                      "MPIPPO_TEST_ENV_MARK": str(tmp_path / "hung")})
    wait_for_line(proc, "iter     2", timeout=60)
    wait_until((tmp_path / "hung").exists, "the env's hang (its mark)", 60)
    if hang == "hang-native":
        wait_until(lambda: _held_in_native_code(proc.pid), "the main thread's wait in native code", 60)
    for _ in range(2):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
    code, out, err = finish(proc, timeout=60)  # (the hang watch's own end would come after 600 s)
    assert code == 130 and "Traceback" not in out + err, (code, err[-3000:])
    assert err.strip().splitlines()[-1] == ("mpippo: stopped at once by a second Ctrl-C, without a checkpoint of this "
                                            "iteration (--resume continues from the last checkpoint, if one was written)")
    assert torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["iteration"] == 2
    if hang == "hang-native":
        _evaluate_stopped_while_its_env_hangs_in_native_code(tmp_path, run_dir)


def _held_in_native_code(pid: int) -> bool:
    """The process's main thread waits in a futex (the env's mutex, after its mark), five readings of
    /proc 0.1 s apart: a signal sent then meets the native wait, not the Python just before it (whose
    handler would act, and the watch would not be tested). (A wait for the interpreter's lock is a
    futex too, but brief.)"""
    futex = {"x86_64": "202", "aarch64": "98"}[platform.machine()]
    for _ in range(5):
        try:
            if Path(f"/proc/{pid}/syscall").read_text().split()[0] != futex:
                return False
        except (OSError, IndexError):
            return False
        time.sleep(0.1)
    return True


def _evaluate_stopped_while_its_env_hangs_in_native_code(tmp_path, run_dir) -> None:
    """evaluate of that run, its env hung alike in its third step: one stop signal ends a tool (one
    line, exit 4, no JSON or video left), here through the hang watch, a second after the signal,
    not after the run's 600 s timeout. Then its env hung in its constructor, where the hang watch has
    not begun: evaluate's start-up watch (runctl.watch_startup) ends it some seconds after the signal,
    naming where (it had waited forever). (SIGTERM: the test's worker ignores SIGINT, and a tool keeps
    an ignored one ignored.)"""
    (tmp_path / "hung").unlink()
    for fault, last in [("hang-native@3", "mpippo: evaluate: stopped by SIGTERM; nothing it started is left "
                                          "running and its temporary folders are removed"),
                        ("hang-native-make@0", "mpippo: evaluate: stopped by SIGTERM during start-up, which is "
                                               "held, at '")]:
        err = _evaluate_held_then_stopped(tmp_path, run_dir, fault)
        assert err.strip().splitlines()[-1].startswith(last), err[-3000:]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no JSON, no video, no temporary file
    assert "mpippo_user_envs.py':" in err and "and has not gone on for 5 s: ending it; nothing was written" in err, err


@pytest.mark.parametrize("fault, last", [
    ("hang-native@5", "mpippo: components: stopped by SIGTERM while its env was held in native code; nothing was "
                      "written"),
    ("hang-native-make@1", "mpippo: components: stopped by SIGTERM during start-up, which is held, at '")])
def test_the_ceiling_bench_is_stopped_while_a_users_env_waits_in_native_code(tmp_path, fault, last):
    """benchmarks/components.py steps the config's env in its own process: a user's env held in native
    code, in a step or in its making, where Python's handler never runs, still ends on one stop
    signal (exit 4, no traceback), by the trainer's watches (its hang of guards.collective_timeout_s:
    a hostile case of test_hostile_tools)."""
    config, mark = tmp_path / "c.yaml", tmp_path / "hung"
    config.write_text("env:\n  name: gym:mpippo-test/Faulty-v0\n  import: mpippo_user_envs\n")
    proc = start([sys.executable, "benchmarks/components.py", "--config", str(config), "--envs-per-rank", "2",
                  "--seconds", "0.2"], env={"PYTHONPATH": USER_ENVS, "MPIPPO_TEST_ENV_FAULT": fault,
                                            "MPIPPO_TEST_ENV_MARK": str(mark)})
    wait_until(mark.exists, "the env's hang (its mark)", 60)
    wait_until(lambda: _held_in_native_code(proc.pid), "the main thread's wait in native code", 60)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, timeout=60)
    assert code == 4 and len(error_lines(err)) == 0 and "Traceback" not in out + err, (code, err[-3000:])
    assert err.strip().splitlines()[-1].startswith(last) and time.monotonic() - t0 < 30, err[-2000:]


def _evaluate_held_then_stopped(tmp_path, run_dir, fault: str) -> str:
    """evaluate, its env held in native code as `fault` says, then SIGTERM: exit 4 within 30 s, no error
    line, no traceback; its stderr."""
    mark = tmp_path / "hung"
    proc = start([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(run_dir), "--import", "mpippo_user_envs",
                  "--num-episodes", "4", "--json", str(tmp_path / "eval.json"), "--video", str(tmp_path / "v.mp4")],
                 env={"PYTHONPATH": USER_ENVS, "MPIPPO_TEST_ENV_FAULT": fault, "MPIPPO_TEST_ENV_MARK": str(mark)})
    wait_until(mark.exists, "the env's hang (its mark)", 60)
    wait_until(lambda: _held_in_native_code(proc.pid), "the main thread's wait in native code", 60)
    mark.unlink()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, timeout=60)
    assert code == 4 and len(error_lines(err)) == 0 and "Traceback" not in out + err, (code, err[-3000:])
    assert time.monotonic() - t0 < 30, time.monotonic() - t0
    return err


def _handler_reset_then_back(proc, rank: int, mark) -> None:
    """Wait (not a guessed sleep) until that rank's env has reset its SIGUSR1 handler (it creates
    `mark` then) and mpippo has put its handler back."""
    from mpippo.launch import catches_usr1
    wait_until(mark.exists, "the env's reset of its handlers", 60)
    ranks = rank_processes(proc)
    assert len(ranks) > rank, ranks
    wait_until(lambda: catches_usr1(ranks[rank].pid), "the actor's SIGUSR1 handler coming back", 60)


def test_an_actors_env_that_sets_its_own_signal_handlers_late_does_not_take_the_requeue_away(tmp_path):
    """As above for the actor-learner layout: the actor's env sets SIGUSR1 to its default in its 11th
    step; the actor puts mpippo's handler back every 256 steps, so SIGUSR1 (to mpirun, forwarded to
    every rank) still checkpoints and exits 3 instead of killing the actor."""
    run_dir, mark = tmp_path / "run", tmp_path / "reset"
    proc = start([MPIRUN, "--oversubscribe", "-n", "2", sys.executable, "run_mpi.py", "--config", "configs/dqn_cartpole.yaml",
                  *FAULTY, "--total-timesteps", "10000000", "--set", "env.kwargs={fault: late-signals, at: 10, rank: 1}",
                  "--output-dir", str(run_dir)], env={"PYTHONPATH": USER_ENVS, "MPIPPO_TEST_ENV_MARK": str(mark)})
    wait_for_line(proc, "mpippo: agent 0: starting")
    _handler_reset_then_back(proc, rank=1, mark=mark)
    proc.send_signal(signal.SIGUSR1)
    code, out, err = finish(proc)
    assert code == 3 and "stopped by SIGUSR1 after a checkpoint" in out, (code, out[-2000:], err[-2000:])


def test_an_env_calling_sys_exit_3_on_one_rank_ends_the_job_naming_the_rank_with_exit_2(tmp_path):
    """Two ranks, PPO: rank 1's env calls sys.exit(3) while rank 0 waits for it in the gradient
    Allreduce: rank 1 says so and aborts the job; the exit is 2, not the requeue's 3."""
    res = job(2, ["run_mpi.py", "--config", "configs/ppo_cartpole.yaml", *FAULTY, "--total-timesteps", "4096",
                  "--set", "env.kwargs={fault: exit, at: 300, rank: 1}", "--output-dir", str(tmp_path / "run")])
    the_line(res, "mpippo: error: rank 1: env.name: 'gym:mpippo-test/Faulty-v0' called sys.exit(3) in its step()")



def test_an_env_ending_its_process_with_os_exit_3_leaves_rank_0_s_mark_saying_it_still_trained(tmp_path):
    """os._exit(3) in the env's step: no handler runs, and the status is the requeue's. Rank 0's listening
    mark still says "running" (a run that ends its own way writes "exit <status>"), so a batch script does
    not requeue the job forever (tests/unit/test_batch_requeue.py checks the script's reading)."""
    mark = tmp_path / "listening"
    res = run([sys.executable, "run_mpi.py", "--config", "configs/ppo_cartpole.yaml", *FAULTY, "--total-timesteps",
               "100000", "--set", "env.kwargs={fault: os-exit, at: 300}", "--output-dir", str(tmp_path / "run")],
              timeout=120, env={"PYTHONPATH": USER_ENVS, "MPIPPO_LISTENING": str(mark)})
    assert res.returncode == 3 and mark.read_text() == "running\n", (res.returncode, res.stderr[-2000:])


@pytest.mark.parametrize("fault, said", [("nan-reward", "a reward holding nan"),
                                         ("none-terminated", "terminated of None (NoneType)")])
def test_an_actors_env_returning_nan_ends_the_actor_learner_job_naming_the_rank(tmp_path, fault, said):
    """Ape-X DQN on three ranks (a learner, two actors): actor rank 2's env returns a NaN reward,
    which would otherwise reach the replay and the learner's loss, its cause lost; or an episode end of
    None, which Gymnasium's vector env would read as False."""
    res = job(3, ["run_mpi.py", "--config", "configs/dqn_cartpole.yaml", *FAULTY, "--total-timesteps", "20000",
                  "--set", f"env.kwargs={{fault: {fault}, at: 200, rank: 2}}", "--output-dir", str(tmp_path / "run")])
    the_line(res, f"mpippo: error: rank 2: env.name: 'gym:mpippo-test/Faulty-v0' returned {said}")


def test_an_actors_env_that_cannot_be_made_again_on_resume_ends_the_job_in_one_line(tmp_path):
    """A resumed actor makes its envs anew (fresh episodes and exploration): the user's constructor
    failing there (its 6th env: the first 5 are start-up's) is start-up's bad input, one line on
    every rank, exit 2, the run's files untouched; it was a traceback from the actor's loop."""
    run_dir = tmp_path / "run"
    dqn = ["run_mpi.py", "--config", "configs/dqn_cartpole.yaml", *FAULTY, "--set", "dqn.learning_starts=200"]
    first = job(2, [*dqn, "--total-timesteps", "1500", "--output-dir", str(run_dir)])
    assert first.returncode == 0, first.stderr[-3000:]
    before = (run_dir / "checkpoints" / "latest.pt").read_bytes()
    res = job(2, ["run_mpi.py", "--resume", "--output-dir", str(run_dir), "--total-timesteps", "3000", "--no-progress",
                  "--set", "env.import=mpippo_user_envs"], fault="make@5")
    the_line(res, "mpippo: error: env.name: making 'mpippo-test/Faulty-v0' with env.kwargs {} failed (RuntimeError: "
                  "the user's env could not start its simulator")
    assert (run_dir / "checkpoints" / "latest.pt").read_bytes() == before


@pytest.mark.parametrize("fault, sig, code", [("hang-make", signal.SIGTERM, 4), ("hang-native-make", signal.SIGUSR1, 3)])
def test_a_one_rank_start_up_held_in_the_envs_constructor_ends_on_a_stop(tmp_path, fault, sig, code):
    """The env's constructor never returns (waiting in Python, or in native code no signal brings back
    to Python): a SIGTERM or Slurm's SIGUSR1 had only set a flag start-up never read, and the run
    waited forever. Now it ends some seconds later with one line naming where start-up is held, exit 4
    (3 for the requeue), the new run folder gone."""
    run_dir, mark = tmp_path / "run", tmp_path / "hung"
    proc = start([sys.executable, "run_mpi.py", "--config", "configs/ppo_cartpole.yaml", *FAULTY,
                  "--set", f"env.kwargs={{fault: {fault}}}", "--output-dir", str(run_dir)],
                 env={"PYTHONPATH": USER_ENVS, "MPIPPO_TEST_ENV_MARK": str(mark)})
    wait_until(mark.exists, "the env's constructor (its mark)", 60)
    if fault == "hang-native-make":  # (its mark comes just before the wait itself)
        wait_until(lambda: _held_in_native_code(proc.pid), "the main thread waiting in native code", 30)
    mark.unlink()
    t0 = time.monotonic()
    proc.send_signal(sig)
    rc, out, err = finish(proc, timeout=60)
    lines = [line for line in err.splitlines() if line.startswith("mpippo:")]
    assert rc == code and len(lines) == 1 and "Traceback" not in out + err, (rc, err[-3000:])
    assert lines[0].startswith(f"mpippo: {sig.name} arrived during start-up, which is held, at '") and \
        "mpippo_user_envs.py':" in lines[0] and f"nothing was trained yet and nothing is saved; exit {code}" in lines[0], \
        lines[0]
    assert time.monotonic() - t0 < 30 and not run_dir.exists() and list(tmp_path.iterdir()) == []


UNDONE = {"signals": "set its own handler for SIGUSR1, SIGTERM, SIGINT; mpippo's is back",
          "process-state": "blocked SIGUSR1, SIGTERM, SIGINT and set torch's default dtype to torch.float64; "
                           "mpippo's is back"}


@pytest.mark.parametrize("when", ["signals", "late-signals", "process-state"])
def test_an_env_that_sets_its_own_signal_handlers_does_not_take_the_requeue_away(tmp_path, when):
    """The env's constructor (or, late, its 10th step: a library started lazily) sets SIGINT, SIGTERM
    and SIGUSR1 to their default action (as SDL's start-up sets its own): mpippo puts its handlers
    back once the envs are made and says so, and again at each iteration, so Slurm's SIGUSR1 still
    checkpoints and exits 3 instead of killing the run. process-state: the constructor blocks those
    signals (they never arrived: the run trained on), makes torch's default dtype float64 (the update
    failed on a dtype mismatch) and changes the working folder (the run, named by a relative path, was
    written in a folder of that name there, unlocked, over what it held)."""
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    relative = os.path.relpath(run_dir, ROOT)  # (the test runs from the repository: from the env's folder, another)
    proc = start([sys.executable, "run_mpi.py", "--config", "configs/ppo_cartpole.yaml", *FAULTY,
                  "--total-timesteps", "1000000", "--set", f"env.kwargs={{fault: {when}, at: 10}}",
                  "--set", "logging.print_interval=1", "--output-dir", relative],
                 env={"PYTHONPATH": USER_ENVS, "MPIPPO_TEST_ENV_CHDIR": str(elsewhere),
                      "MPIPPO_LISTENING": str(tmp_path / "listening")})
    if when in UNDONE:
        warning = wait_for_line(proc, "mpippo: warning:")  # (before training starts)
        assert warning.startswith(f"mpippo: warning: the env's code {UNDONE[when]}"), warning
    wait_for_line(proc, "iter     2")
    proc.send_signal(signal.SIGUSR1)
    code, out, err = finish(proc)
    assert code == 3 and "stopped by SIGUSR1 after a checkpoint" in out, (code, out[-2000:], err[-2000:])
    assert (tmp_path / "listening").read_text() == "exit 3\n"  # (the batch script's proof: the requeue is the trainer's)
    assert torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["iteration"] >= 1
    assert not os.path.exists(os.path.normpath(elsewhere / relative))  # where the env's folder would have put it
