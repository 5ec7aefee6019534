"""The real command line, tiny budgets: outputs, bad input, resume, fail-stop."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from conftest import ROOT, SMOKE_TOY, metrics, mpi_env, ok, trainer
from mpippo import runctl

SMOKE = ["--config", "configs/smoke.yaml", "--no-progress"]
TOY_SMOKE = SMOKE_TOY + ["--no-progress"]
BENCH_KEYS = {"algo", "env", "world_size", "num_envs_per_rank", "total_timesteps", "duration_s", "fps",
              "phase_seconds", "phase_seconds_per_rank", "peak_rss_mb_per_rank", "peak_rss_mb_total",
              "cpu_percent", "episode_return_mean", "episodes", "hostnames", "git_commit"}
PHASES = {"env_step", "inference", "gae", "backward", "allreduce", "optimizer", "other"}
EPISODE_TAGS = {"charts/episodic_return", "charts/episodic_length", "charts/episode_return_mean"}  # CleanRL's names
TB_TAGS = {"losses/policy_loss", "losses/value_loss",
           "losses/entropy", "losses/approx_kl", "losses/clipfrac", "losses/explained_variance",
           "charts/learning_rate", "charts/steps_per_s", "time/allreduce_s"}


def check_outputs(run_dir, world_size, envs_per_rank, timesteps, env="coinrun"):
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    # config.yaml keeps what the job derives from its size and machine as asked (a resume elsewhere derives
    # them again); the metrics say what they were
    assert cfg["env"]["num_envs_per_rank"] is None and cfg["parallel"]["threads_per_rank"] == 0
    assert cfg["env"]["num_envs"] == envs_per_rank * world_size

    # readable as the umask allows (a teammate on the cluster reads the run), not mkstemp's 0600
    from mpippo.files import file_mode
    for name in ("config.yaml", "benchmark_metrics.json", "checkpoints/latest.pt", ".mpippo.lock"):
        assert (run_dir / name).stat().st_mode & 0o777 == file_mode(), name
    m = metrics(run_dir)
    assert BENCH_KEYS <= set(m), BENCH_KEYS - set(m)
    assert m["num_envs_per_rank"] == envs_per_rank and m["threads_per_rank"] >= 1
    assert m["world_size"] == world_size and m["total_timesteps"] == timesteps
    assert set(m["phase_seconds"]) == PHASES
    assert all(len(v) == world_size for v in m["phase_seconds_per_rank"].values())
    assert len(m["peak_rss_mb_per_rank"]) == world_size and m["peak_rss_mb_total"] > 100
    assert m["fps"] > 0 and m["duration_s"] > 0 and m["finished"] is True
    assert len(m["hostnames"]) == world_size
    check_stragglers(m, world_size)
    assert m["host_allocator"] == "retain"  # run_mpi.py set glibc up to keep freed memory (mpippo/hostmem.py)
    # precision auto became what this machine computes natively, with the evidence, in the metrics
    native, evidence = runctl.bf16_native(torch.device("cpu"))
    assert cfg["training"]["precision"] == "auto" and m["precision"] == ("bf16" if native else "fp32")
    assert m["precision_why"] == f"auto: {evidence}"

    ckpt = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    for key in ("model", "optimizer", "timesteps", "iteration", "config", "world_size"):
        assert key in ckpt
    assert ckpt["timesteps"] == timesteps and ckpt["world_size"] == world_size
    from mpippo import resume  # the rank states' keys: the writer and their one list agree
    assert [set(r) for r in ckpt["ranks"]] == [set(resume.RANK_STATE)] * world_size
    assert set(resume.RANK_RNG) <= set(ckpt["ranks"][0]["rng"]) <= set(resume.RANK_RNG) | {"sampler"}
    assert ckpt["config"]["env"]["name"] == env

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert TB_TAGS <= tags, TB_TAGS - tags
    if m["episodes"]:  # tiny coinrun budgets may end no episode; the learning test covers them
        assert EPISODE_TAGS <= tags
    steps = [e.step for e in acc.Scalars("losses/policy_loss")]
    assert steps == sorted(set(steps)) and steps[-1] == timesteps


def check_stragglers(m, world_size):
    """The straggler statistics (mpippo/metrics/timers.py) agree with the run's own phase totals."""
    assert m["straggler_iterations"] == m["iterations"] > 0 and m["straggler_lost"] == 0
    for key in ("straggler_rollout_s", "straggler_update_s", "straggler_wait_s", "straggler_transfer_s"):
        q = m[key]
        assert 0.0 <= q["p50"] <= q["p90"] <= q["p99"] <= q["max"], (key, q)
    per_rank = m["phase_seconds_per_rank"]
    rollout = [a + b for a, b in zip(per_rank["env_step"], per_rank["inference"])]
    update = [a + b for a, b in zip(per_rank["backward"], per_rank["optimizer"])]
    assert 0 < m["straggler_rollout_s"]["max"] <= max(rollout) + 1e-9  # one iteration, at most all of them
    assert 0 < m["straggler_update_s"]["max"] <= max(update) + 1e-9
    assert 0 < m["straggler_rollout_s"]["p50"] * m["iterations"] <= 1.5 * max(rollout)
    spread = m["straggler_spread"]
    assert 1.0 <= spread["p50"] <= spread["max"] <= world_size  # max/mean over the ranks
    rel = m["straggler_busy_rel"]
    assert rel == sorted(rel) and rel[0] <= 1.0 <= rel[-1] and rel[-1] == pytest.approx(spread["max"])
    assert sum(m["straggler_slowest_counts"]) == m["iterations"] and len(m["straggler_slowest_counts"]) == world_size
    assert 0 <= m["straggler_slowest_rank"] < world_size and len(m["straggler_busy_p50_s_per_rank"]) == world_size
    if world_size == 1:
        assert spread["max"] == 1.0 and m["straggler_wait_s"]["max"] == 0.0


def test_two_ranks_write_every_output(tmp_path, monkeypatch):
    run_dir, listening = tmp_path / "run", tmp_path / "listening"
    monkeypatch.setenv("MPIPPO_LISTENING", str(listening))  # as slurm/common.sh sets it
    res = ok(trainer(2, SMOKE + ["--output-dir", str(run_dir)]))
    assert listening.read_text() == "exit 0\n"  # rank 0 said every rank catches signals, then its own status
    assert "run finished" in res.stdout and "steps/s" in res.stdout
    native, evidence = runctl.bf16_native(torch.device("cpu"))  # (an ISA ceiling included)
    assert f"{'bf16' if native else 'fp32'} (auto: {evidence})" in res.stdout, res.stdout
    check_outputs(run_dir, world_size=2, envs_per_rank=4, timesteps=512)


def test_plain_python_is_the_sequential_mode_and_goes_on_when_its_reader_leaves(tmp_path):
    """`python run_mpi.py ... | head -2`: the reader of its stdout is gone before the first line, and the
    run still trains to its budget and writes every output (a BrokenPipeError had ended it with a
    traceback, exit 1, no checkpoint)."""
    run_dir = tmp_path / "run"
    read, write = os.pipe()
    os.close(read)  # (every write to it is EPIPE from now on: no race with what the run prints)
    try:
        proc = subprocess.run([sys.executable, "run_mpi.py"] + TOY_SMOKE + [
            "--output-dir", str(run_dir), "--set", "logging.print_interval=1"], cwd=ROOT, env=mpi_env(),
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=180)
    finally:
        os.close(write)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    check_outputs(run_dir, world_size=1, envs_per_rank=8, timesteps=512, env="toy-cue")


def test_a_stop_reaches_its_checkpoint_while_nobody_takes_the_console(tmp_path):
    """`run_mpi.py | less`, not scrolled (or a terminal paused with Ctrl-S): the trainer waits in a console
    write, as any program does, but a SIGTERM then had waited there too, as long as the reader did. Now the
    held write is given up, the console dropped, and the stop checkpoints: exit 4."""
    import fcntl
    import termios
    read, write = os.pipe()
    fcntl.fcntl(write, 1031, 4096)  # (F_SETPIPE_SZ: the smallest pipe, full after a few dozen lines)
    proc = subprocess.Popen([sys.executable, "run_mpi.py", *TOY_SMOKE, "--total-timesteps", "100000000", "--set",
                             "training.n_steps=8", "--set", "logging.print_interval=1", "--output-dir",
                             str(tmp_path / "run")], cwd=ROOT, env=mpi_env(), stdout=write, stderr=subprocess.PIPE,
                            text=True)
    os.close(write)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # until the pipe is full, and held there
            if int.from_bytes(fcntl.ioctl(read, termios.FIONREAD, b"\0" * 4), sys.byteorder) >= 4096 - 256:
                break
            time.sleep(0.1)
        time.sleep(4)  # (past errors.CONSOLE_HELD_S)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
        os.close(read)
    assert proc.returncode == 4 and "Traceback" not in err, (proc.returncode, err[-2000:])
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").is_file()


def test_partial_files_a_killed_writer_left_are_removed_by_the_next_job_that_holds_the_folder(tmp_path):
    """kill -9 in a checkpoint write leaves its hidden temporary file (a whole checkpoint's size) and, between
    link and rename, a hard link: nothing removed them, and they piled up over preemptions toward the quota.
    The next job that holds the folder's lock removes them, says so, and leaves every other file as it was."""
    run_dir = tmp_path / "run"
    ok(trainer(None, [*TOY_SMOKE, "--output-dir", str(run_dir)]))
    ckpts = run_dir / "checkpoints"
    left = [ckpts / ".latest.pt.k3j9x2ab.tmp", ckpts / ".ckpt_0000002.pt.q1w2e3r4.tmp", run_dir / ".config.yaml.a1b2.tmp"]
    for path in left:
        path.write_bytes(b"x" * 2**20)
    os.link(ckpts / "latest.pt", ckpts / ".latest.pt.4242.link")
    kept = [ckpts / ".notes.tmp", run_dir / "my.latest.pt.x.tmp", ckpts / ".latest.pt.zz.tmp.bak"]
    for path in kept:
        path.write_text("the user's")
    (ckpts / ".latest.pt.lnk0.tmp").symlink_to(tmp_path / "elsewhere")  # (a link by that name: not ours to remove)
    res = ok(trainer(None, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", "1024", "--no-progress"]))
    assert "mpippo: note: removed 4 partial file(s) a killed writer had left in" in res.stdout, res.stdout
    assert "(3.0 MiB)" in res.stdout and not any(p.exists() for p in left) and all(p.exists() for p in kept)
    assert (ckpts / ".latest.pt.lnk0.tmp").is_symlink() and not (ckpts / ".latest.pt.4242.link").exists()


def test_a_trainer_started_without_stdout_or_stderr_ends_as_usual(tmp_path):
    """`run_mpi.py ... >&-` (a cron line, a daemon): Python has no sys.stdout then, and the summary's
    flush after the whole run raised (a traceback on stderr, exit 1); with `2>&-`, a refusal exited 1,
    not 2."""
    run_dir = tmp_path / "run"
    res = subprocess.run(["bash", "-c", 'exec "$0" run_mpi.py "$@" >&-', sys.executable, *TOY_SMOKE, "--output-dir",
                          str(run_dir)], cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and res.stderr == "", res.stderr[-3000:]
    assert metrics(run_dir)["finished"] is True
    res = subprocess.run(["bash", "-c", 'exec "$0" run_mpi.py "$@" 2>&-', sys.executable, *TOY_SMOKE,
                          "--total-timesteps", "-5", "--output-dir", str(tmp_path / "refused")], cwd=ROOT,
                         env=mpi_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and not (tmp_path / "refused").exists()
    # a console on a full file system (`> log`, the disk full): the run had ended at its first line, before
    # any checkpoint, its folder made; its progress is dropped now, said once, and it trains
    res = subprocess.run(["bash", "-c", 'exec "$0" run_mpi.py "$@" >/dev/full', sys.executable, *TOY_SMOKE,
                          "--output-dir", str(tmp_path / "full")], cwd=ROOT, env=mpi_env(), capture_output=True,
                         text=True, timeout=180)
    assert res.returncode == 0 and metrics(tmp_path / "full")["finished"] is True, res.stderr[-2000:]
    assert res.stderr.count("the console's output cannot be written (No space left on device)") == 1, res.stderr
    res = subprocess.run(["bash", "-c", 'exec "$0" run_mpi.py --help >/dev/full', sys.executable], cwd=ROOT,
                         env=mpi_env(), capture_output=True, text=True, timeout=60)  # (it had exited 0, nothing shown)
    assert res.returncode == 1 and res.stderr.strip().splitlines()[-1] == (
        "mpippo: error: its console (stdout) could not be written (No space left on device): its help is lost"), res.stderr
    # the launcher alike: with `2>&-` it ended at its first look at sys.stderr (None), exit 1, nothing started;
    # and with no HOME (a cron line's environment) mpirun's opal_init failed in 14 lines of its own, exit 1
    launched = subprocess.run(["bash", "-c", 'unset HOME; exec "$0" -m mpippo.launch -n 1 "$@" 2>&-', sys.executable, *TOY_SMOKE,
                               "--output-dir", str(tmp_path / "launched")], cwd=ROOT, env=mpi_env(),
                              capture_output=True, text=True, timeout=180)
    assert launched.returncode == 0 and metrics(tmp_path / "launched")["finished"] is True, launched.stdout[-2000:]
    res = subprocess.run(["bash", "-c", 'exec "$0" -m mpippo.launch -n 0 2>&-', sys.executable], cwd=ROOT,
                         env=mpi_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stdout


def test_a_console_descriptor_open_only_for_reading_is_a_console_nobody_reads(tmp_path):
    """`1</dev/null`, `2</dev/null` (a descriptor open, but not for writing): the trainer's first line had
    ended it with a traceback, exit 1, its folder left with no checkpoint (neither resumable nor reusable);
    a refusal exited 1, not 2, at every entry point. Both are a console nobody reads now, as `>&-` is."""
    run_dir = tmp_path / "run"
    res = subprocess.run(["bash", "-c", 'exec "$0" run_mpi.py "$@" 1</dev/null', sys.executable, *TOY_SMOKE,
                          "--output-dir", str(run_dir)], cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0 and res.stderr == "", res.stderr[-3000:]
    assert metrics(run_dir)["finished"] is True
    for entry in (["run_mpi.py", "--total-timesteps", "-5", "--output-dir", str(tmp_path / "refused")],
                  ["-m", "mpippo.launch", "-n", "0"], ["-m", "mpippo.evaluate", "--checkpoint", str(tmp_path / "no")],
                  ["analysis/learning_curves.py", str(tmp_path / "no")]):
        res = subprocess.run(["bash", "-c", 'exec "$0" "$@" 2</dev/null', sys.executable, *entry], cwd=ROOT,
                             env=mpi_env(), capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, (entry, res.stdout[-2000:])
    assert not (tmp_path / "refused").exists()


def test_a_run_folder_named_with_a_line_break_keeps_each_line_whole(tmp_path):
    """A folder name holding a newline (a script's stray $'\\n') split the start-up line and the summary's
    outputs line in two; error lines already escaped it. Each line is whole now, the break written as \\n."""
    run_dir = tmp_path / "a\nb"
    res = subprocess.run([sys.executable, "run_mpi.py", *TOY_SMOKE, "--output-dir", str(run_dir)], cwd=ROOT,
                         env=mpi_env(), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and metrics(run_dir)["finished"] is True, res.stderr[-2000:]
    named = [line for line in res.stdout.splitlines() if "a\\nb" in line]
    assert len(named) == 2 and not any(line.startswith("b") for line in res.stdout.splitlines()), res.stdout


def test_a_console_that_cannot_encode_the_run_folders_name_writes_its_escape(tmp_path):
    """PYTHONIOENCODING=ascii (or a C locale's console) and a run folder named 'résumé': the start-up
    line raised UnicodeEncodeError, a traceback and exit 1 with the folder made. Now its escape, and
    the run trains. Under a C locale without UTF-8 file names, that name is refused before anything is
    made: TensorBoard writes the path as UTF-8 and the process holds its bytes as escapes."""
    run_dir = tmp_path / "r\u00e9sum\u00e9"
    res = subprocess.run([sys.executable, "run_mpi.py", *TOY_SMOKE, "--output-dir", str(run_dir)], cwd=ROOT,
                         env=mpi_env() | {"PYTHONIOENCODING": "ascii"}, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and "r\\xe9sum\\xe9" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    assert metrics(run_dir)["finished"] is True
    c_locale = {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    res = subprocess.run([sys.executable, "run_mpi.py", *TOY_SMOKE, "--output-dir", str(tmp_path / "caf\u00e9")],
                         cwd=ROOT, env=mpi_env() | c_locale, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "this process's file names are ascii" in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "caf\u00e9").exists() and len(res.stderr.splitlines()) == 1


def test_the_progress_bar_fits_the_terminal_the_launcher_names(tmp_path):
    """Under the launcher a rank's stderr is a pipe to mpirun, which tqdm cannot measure: the bar was drawn
    about 140 columns wide on a 5-column terminal. It takes the COLUMNS the launcher passes with MPIPPO_TTY."""
    res = subprocess.run([sys.executable, "run_mpi.py", *SMOKE_TOY, "--output-dir", str(tmp_path / "r")], cwd=ROOT,
                         capture_output=True, text=True, env=mpi_env() | {"MPIPPO_TTY": "1", "COLUMNS": "40"},
                         timeout=180)
    bars = [b for b in res.stderr.replace("\r", "\n").splitlines() if "step" in b and "|" in b]
    assert res.returncode == 0 and bars and max(map(len, bars)) <= 40, res.stderr[-2000:]


def test_progress_lines_show_rate_and_eta(tmp_path):
    # Without a terminal (mpirun, batch logs) the bar stays off and these lines carry progress.
    res = ok(trainer(2, SMOKE_TOY + ["--output-dir", str(tmp_path / "r"), "--set", "logging.print_interval=1"]))
    lines = [line for line in res.stdout.splitlines() if line.startswith("iter ")]
    assert len(lines) == 2 and all("steps/s" in line and "ETA" in line for line in lines)
    assert "512 steps" in lines[-1]


def test_resume_continues_counters(tmp_path):
    run_dir = tmp_path / "run"
    ok(trainer(2, TOY_SMOKE + ["--output-dir", str(run_dir)]))
    res = ok(trainer(2, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", "1024", "--no-progress"]))
    assert "resuming at 512 steps" in res.stdout
    m = metrics(run_dir)
    assert m["total_timesteps"] == 1024 and m["iterations"] == 4
    ckpt = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    assert ckpt["iteration"] == 4


def test_a_resume_of_a_finished_run_keeps_its_metrics(tmp_path):
    """No iteration runs (the budget is reached): benchmark_metrics.json keeps the run's figures
    instead of being rewritten without its episodes, and config.yaml the settings that ran."""
    run_dir = tmp_path / "run"
    ok(trainer(None, ["--config", "configs/toy_cue.yaml", "--total-timesteps", "2048", "--no-progress",
                      "--output-dir", str(run_dir)]))
    before = (run_dir / "benchmark_metrics.json").read_bytes()
    assert metrics(run_dir)["episode_return_mean"] is not None
    config = (run_dir / "config.yaml").read_bytes()
    res = ok(trainer(None, ["--resume", "--output-dir", str(run_dir), "--no-progress", "--set", "training.n_steps=16",
                            "--set", "training.learning_rate=0.1"]))
    assert "resuming at 2,048 steps" in res.stdout
    assert (run_dir / "benchmark_metrics.json").read_bytes() == before
    assert (run_dir / "config.yaml").read_bytes() == config  # what ran: no step ran with the new settings
    # edited by hand (figures emptied, one removed): the summary shows '-' there, the file stays as it is
    edited = {**json.loads(before), "fps": None, "peak_rss_mb_per_rank": [], "stop_reason": None}
    del edited["phase_seconds"]
    (run_dir / "benchmark_metrics.json").write_text(json.dumps(edited))
    res = ok(trainer(None, ["--resume", "--output-dir", str(run_dir), "--no-progress"]))
    assert "throughput             - steps/s over 1 rank(s)" in res.stdout and "MB max per rank" in res.stdout
    assert json.loads((run_dir / "benchmark_metrics.json").read_text()) == edited and "Traceback" not in res.stderr


def test_envs_that_do_not_divide_round_up_and_say_so(tmp_path):
    """The default job on any core count: 63 envs over 2 ranks run as 2 x 32 (bad input is in
    test_hostile.py)."""
    run_dir = tmp_path / "run"
    res = ok(trainer(2, ["--config", "configs/toy_cue.yaml", "--num-envs", "63", "--total-timesteps", "2048",
                         "--no-progress", "--output-dir", str(run_dir)]))
    assert "note: env.num_envs 63 does not divide over 2 env-stepping rank(s): 32 per rank, 64 in all" in res.stdout
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (cfg["env"]["num_envs"], cfg["env"]["num_envs_per_rank"]) == (63, None)  # as asked: a resume rounds again
    assert (metrics(run_dir)["num_envs"], metrics(run_dir)["num_envs_per_rank"]) == (64, 32)


def test_a_budget_between_two_updates_ends_at_the_next_and_says_so_at_start(tmp_path):
    """The sync layout trains whole updates: 1,500 steps of toy-cue's 1,024-step update end at 2,048,
    said at start (not only in the summary, '2,048 of 1,500'); a whole budget says nothing, and a
    resume counts from where it is."""
    run_dir = tmp_path / "run"
    res = ok(trainer(None, ["--config", "configs/toy_cue.yaml", "--total-timesteps", "1500", "--no-progress",
                            "--output-dir", str(run_dir)]))
    assert ("note: training.total_timesteps 1,500 is not a whole number of updates of 1,024 env steps (envs x "
            "n_steps) from 0: the run ends at 2,048, after 2 update(s)") in res.stdout
    assert metrics(run_dir)["total_timesteps"] == 2048
    res = ok(trainer(None, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", "4096", "--no-progress"]))
    assert "whole number of updates" not in res.stdout and metrics(run_dir)["total_timesteps"] == 4096


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_resume_whose_budget_is_spent_already_says_it_trains_nothing(tmp_path, algo):
    """`--resume --total-timesteps 2048` of a run at 4,096 steps ended at once as finished, in silence, as
    if it had trained: now a note at start says the budget is reached and nothing is trained (each layout).
    (A DQN budget too small for any update at all is still refused by its config check, resume or not.)"""
    run_dir = tmp_path / "run"
    n, config = (None, "configs/toy_cue.yaml") if algo == "ppo" else (3, "configs/dqn_toy.yaml")
    ok(trainer(n, ["--config", config, "--total-timesteps", "4096", "--no-progress", "--output-dir", str(run_dir)]))
    done = metrics(run_dir)["total_timesteps"]
    res = ok(trainer(n, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", "2048", "--no-progress"]))
    assert (f"note: training.total_timesteps 2,048 is reached already ({done:,} env steps done): nothing is "
            f"trained") in res.stdout, res.stdout
    assert metrics(run_dir)["total_timesteps"] == done
    if algo == "dqn":  # its actors step in whole rounds (2 actors x 8 envs here): 4 steps more are none
        res = ok(trainer(n, ["--resume", "--output-dir", str(run_dir), "--total-timesteps", str(done + 4),
                             "--no-progress"]))
        assert (f"note: training.total_timesteps {done + 4:,} leaves less than one round of its actors' steps "
                f"({done:,} env steps done): nothing is trained") in res.stdout, res.stdout


def test_existing_run_is_never_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "precious.txt").write_text("keep me")
    res = trainer(2, SMOKE + ["--output-dir", str(run_dir)], timeout=60)
    assert res.returncode == 2
    assert "exists and is not empty; it holds no run of mpippo's: choose a new folder" in res.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == ["precious.txt"]
    assert (run_dir / "precious.txt").read_text() == "keep me"


@pytest.mark.slow
def test_done_when_command(tmp_path):
    """The first issue's acceptance command, scaled: one iteration of the default config (network, 256
    steps, 8 minibatches, 3 epochs) on coinrun, 2 ranks x 4 envs (it ran 2 iterations of 16 envs: 4 min
    on an AVX2 CPU in fp32, for nothing this one does not prove)."""
    run_dir = tmp_path / "x"
    ok(trainer(2, ["--total-timesteps", "2048", "--num-envs-per-rank", "4", "--output-dir", str(run_dir)],
               timeout=600))
    m = metrics(run_dir)
    assert m["total_timesteps"] == 2048 and m["world_size"] == 2 and m["num_envs_per_rank"] == 4
    assert m["allreduce_calls_per_iteration"] == 3 * 8  # one gradient Allreduce per minibatch
    # The Allreduce's share of the time is a speed goal, so the bench reports it (pure transfer, <= 2%); here,
    # beside other jobs on a loaded CI machine, it only has to be measured: every phase, all within the run.
    ph = m["phase_seconds"]
    assert set(ph) == set(PHASES) and ph["allreduce"] > 0 and min(ph.values()) >= 0
    assert sum(ph.values()) <= m["duration_s"] * 1.01, (ph, m["duration_s"])


def test_the_cut_off_on_one_rank_says_it_has_no_effect(tmp_path):
    res = ok(trainer(None, ["--config", "configs/toy_cue.yaml", "--no-progress", "--total-timesteps", "512",
                            "--set", "training.rollout_cutoff=0.5", "--output-dir", str(tmp_path / "run")]))
    said = [x for x in res.stdout.splitlines() if "rollout_cutoff" in x]
    assert said == ["mpippo: warning: training.rollout_cutoff=0.5 has no effect on 1 rank (no other rank to wait "
                    "for): every rollout collects training.n_steps"], res.stdout
    assert metrics(tmp_path / "run")["rollout_cutoff"] is None


@pytest.mark.parametrize("where", ["logs", "checkpoints"])
def test_a_restored_run_with_a_read_only_folder_is_refused_before_anything_is_written(tmp_path, where):
    """A copy restored read-only: a resume writes in logs/ and checkpoints/. Before, logs/ ended it in
    TensorBoard's thread (two tracebacks, exit 1) and checkpoints/ an iteration in. As root the permission
    bits bind only without CAP_DAC_OVERRIDE: setpriv drops it for the trainer."""
    run_dir = tmp_path / "run"
    ok(trainer(None, TOY_SMOKE + ["--output-dir", str(run_dir)]))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    (run_dir / where).chmod(0o555)
    drop = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    try:
        res = subprocess.run([*drop, sys.executable, "run_mpi.py", "--resume", "--no-progress", "--total-timesteps",
                              "1024", "--output-dir", str(run_dir)], cwd=ROOT, env=mpi_env(), capture_output=True,
                             text=True, timeout=120)
    finally:
        (run_dir / where).chmod(0o755)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.strip() == (f"mpippo: error: --resume: '{run_dir / where}' cannot be written (Permission denied), "
                                  f"and the run writes its checkpoints and logs there: make it writable (chmod -R u+w), "
                                  f"or copy the run to a folder you can write")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
