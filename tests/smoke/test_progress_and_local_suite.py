"""What a person at a terminal sees: the launcher's live progress bar (steps, rate, ETA) although the
ranks' stderr is mpirun's pipe, none when nobody watches, and `suite run --local` running a small
suite member by member with the bar, then finding nothing left to run."""
import json
import os
import pty
import subprocess
import time
import sys

import yaml

from conftest import ROOT, mpi_env, relaunched

# coinrun: its iterations are slow enough for the bar (redrawn once a second) to be seen moving; the suites
# below run toy-cue, a member being no game's (a procgen process spends ~4 s of CPU on its assets first)
SMOKE = ["--config", "configs/smoke.yaml", "--total-timesteps", "768"]


def on_terminal(cmd: list[str], timeout: float = 300, env: dict | None = None) -> tuple[int, str]:
    """Run `cmd` with a pseudo-terminal as its stdin/stdout/stderr; everything it printed. Started again
    where Open MPI failed to start the job, as every other way the tests launch one (conftest.relaunched)."""
    res = relaunched(lambda: _on_terminal_once(cmd, timeout, env))
    return res.returncode, res.stdout


def _on_terminal_once(cmd: list[str], timeout: float, env: dict | None) -> subprocess.CompletedProcess:
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is ours
        os.chdir(ROOT)
        os.execvpe(cmd[0], cmd, dict(mpi_env(), COLUMNS="120", **(env or {})))
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal: it ended
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")  # (one stream: the terminal carries stdout and stderr alike)
    return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status), text, text)


def test_launcher_shows_a_live_bar_on_a_terminal_and_none_on_a_pipe(tmp_path):
    # rank 0 sleeps 1.2 s in iteration 2 of 3: the bar (redrawn at most once a second) moves mid-run on any machine;
    # a budget of 700 ends at the third update's 768, and the bar counts to that (it had counted to 700)
    rc, out = on_terminal([sys.executable, "-m", "mpippo.launch", "-n", "2", "--mpirun-args=--oversubscribe", *SMOKE,
                           "--total-timesteps", "700", "--output-dir", str(tmp_path / "tty")],
                          env={"MPIPPO_FAULT": "rank=0,iteration=2,kind=slow,seconds=1.2"})
    assert rc == 0, out[-2000:]
    bars = [seg for seg in out.split("\r") if "step/s" in seg and "|" in seg]
    # redrawn as it goes, not printed once at the start and the end
    assert any(f"{n}/768 [" in bar for bar in bars for n in (256, 512)), out[-2000:]
    assert "/768 [" in bars[-1] and "<" in bars[-1]  # steps of the total, elapsed<remaining (ETA)
    res = subprocess.run([sys.executable, "-m", "mpippo.launch", "-n", "2", "--mpirun-args=--oversubscribe", *SMOKE,
                          "--output-dir", str(tmp_path / "pipe")], cwd=ROOT, env=mpi_env(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and "step/s]" not in res.stderr + res.stdout  # nobody watches: no bar


def test_local_suite_runs_its_members_with_the_bar_and_a_second_run_finds_nothing_to_do(tmp_path):
    data = yaml.safe_load((ROOT / "configs" / "suites" / "tiny.yaml").read_text())
    data.update(games=["toy-cue"], seeds=[1, 2], variants={"default": []}, budget=512)
    suite = tmp_path / "small.yaml"
    suite.write_text(yaml.safe_dump(data))
    cmd = [sys.executable, "-m", "mpippo.suite", "run", str(suite), "--root", str(tmp_path), "--local"]
    rc, out = on_terminal(cmd)
    assert rc == 0, out[-3000:]
    assert "member 1/2: default/toy-cue/seed_1" in out and "member 2/2: default/toy-cue/seed_2" in out
    assert any("step/s" in seg and "|" in seg for seg in out.split("\r"))  # the bar came through
    log = (tmp_path / "suites" / "tiny" / "default" / "toy-cue" / "seed_2.log").read_text()
    assert "run finished" in log and "mpippo: member default/toy-cue/seed_2 finished" in log
    assert "step/s]" not in log  # the bar's redraws stay out of the log
    again = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "2 of 2 members done or queued; 0 to run here" in again.stdout
    status = subprocess.run([sys.executable, "-m", "mpippo.suite", "status", str(suite), "--root", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "summary: 2 done" in status.stdout, status.stdout


def test_ctrl_c_in_a_local_suite_checkpoints_the_member_and_the_same_command_resumes_it(tmp_path):
    data = yaml.safe_load((ROOT / "configs" / "suites" / "tiny.yaml").read_text())
    # a small network on one thread: torch's two threads per rank crawl (20x) when other jobs share the cores
    data.update(games=["starpilot"], seeds=[1], budget=4096, variants={"default": [
        "model.channels=[8]", "model.hidden_size=32", "training.n_steps=16", "parallel.threads_per_rank=1"]})
    suite = tmp_path / "one.yaml"
    suite.write_text(yaml.safe_dump(data))
    member = tmp_path / "suites" / "tiny" / "default" / "starpilot" / "seed_1"
    cmd = [sys.executable, "-m", "mpippo.suite", "run", str(suite), "--root", str(tmp_path), "--local"]
    pid, fd = pty.fork()
    if pid == 0:  # (rank 0 sleeps 2 s in iteration 2 of 32: the Ctrl-C at the first checkpoint lands mid-run)
        os.chdir(ROOT)
        os.execvpe(cmd[0], cmd, dict(mpi_env(), COLUMNS="120", MPIPPO_FAULT="rank=0,iteration=2,kind=slow,seconds=2"))
    out, pressed, deadline = b"", False, time.monotonic() + 300
    os.set_blocking(fd, False)
    while time.monotonic() < deadline:
        try:
            out += os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.1)
        except OSError:
            break
        if not pressed and (member / "checkpoints" / "latest.pt").is_file():
            os.write(fd, b"\x03")  # Ctrl-C at the terminal: the whole foreground group gets SIGINT
            pressed = True
    _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert pressed and os.waitstatus_to_exitcode(status) == 4, text[-3000:]
    assert "Traceback" not in text and "`python -m mpippo.suite run" in text
    status = subprocess.run([sys.executable, "-m", "mpippo.suite", "status", str(suite), "--root", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "summary: 1 stopped" in status.stdout, status.stdout  # a Ctrl-C is a stop, not a failure
    steps = yaml.safe_load((member / "benchmark_metrics.json").read_text())["total_timesteps"]
    assert 0 < steps < 4096  # stopped part-way, with a checkpoint
    again = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "(resuming;" in again.stdout, again.stdout + again.stderr
    assert f"resuming at {steps:,} steps" in again.stderr + again.stdout
    assert yaml.safe_load((member / "benchmark_metrics.json").read_text())["total_timesteps"] == 4096


def test_a_finished_appo_member_is_done_though_it_ends_a_few_segments_short(tmp_path):
    """The actor-learner layout's actors stop at whole segments: 2 actors x 4 envs x 16 steps = 128 a round,
    23 rounds = 2,944 of 3,000 steps. Done all the same (also in a metrics file without `finished`, as earlier
    versions wrote it): status says so, a second run finds nothing to do, the report scores it."""
    data = yaml.safe_load((ROOT / "configs" / "suites" / "tiny.yaml").read_text())
    data.update(base_config="configs/appo_procgen.yaml", games=["toy-cue"], seeds=[1], budget=3000, ranks=3,
                variants={"default": ["model.channels=[8]", "model.hidden_size=32", "env.num_envs=8",
                                      "appo.rollout_length=16", "appo.batch_segments=8", "parallel.threads_per_rank=1"]})
    suite = tmp_path / "appo.yaml"
    suite.write_text(yaml.safe_dump(data))
    where = [str(suite), "--root", str(tmp_path)]
    cmd = [sys.executable, "-m", "mpippo.suite"]
    first = subprocess.run([*cmd, "run", *where, "--local"], cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    member = tmp_path / "suites" / "tiny" / "default" / "toy-cue" / "seed_1"
    m = yaml.safe_load((member / "benchmark_metrics.json").read_text())
    assert m["algo"] == "appo" and m["stop_reason"] == "done" and m["finished"] is True and m["total_timesteps"] < 3000
    status = subprocess.run([*cmd, "status", *where], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "summary: 1 done" in status.stdout, status.stdout + status.stderr
    del m["finished"]  # as an earlier version's learner wrote it: stop_reason "done" alone still means done
    (member / "benchmark_metrics.json").write_text(json.dumps(m))
    status = subprocess.run([*cmd, "status", *where], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "summary: 1 done" in status.stdout, status.stdout + status.stderr
    again = subprocess.run([*cmd, "run", *where, "--local"], cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and "1 of 1 members done or queued; 0 to run here" in again.stdout, again.stdout
    rep = subprocess.run([*cmd, "report", *where, "--reps", "50"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0 and "1 of 1 members done" in rep.stdout, rep.stdout[-2000:] + rep.stderr[-2000:]
