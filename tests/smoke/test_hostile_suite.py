"""Hostile inputs to `python -m mpippo.suite`, one table (the harness of tests/smoke/hostile.py):
damaged member metrics, submissions and manifests, a member folder holding another run, Slurm's
commands failing or answering garbage, absurd options, a suite or member folder another process
writes. Every refusal is one line, exit 2, no traceback, nothing that existed changed and nothing
new left (not even the suite folder or lock file the refused command made), no process left.
A few cases are not refusals (exit 0): a member another process writes is shown running and left
to it. Then signals: a local suite SIGTERMed any number of times, or killed outright, still stops
its member with a checkpoint and leaves nothing running.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

import hostile
from conftest import ROOT, mpi_env
from hostile import Case
from mpippo import config as C
from mpippo import runlock
from mpippo.launch import die_with_parent
from mpippo.suite import spec

TINY = ROOT / "configs" / "suites" / "tiny.yaml"
LOCKERS: list[subprocess.Popen] = []


def suite_file(tmp: Path, **changes) -> Path:
    """A one-member suite (starpilot, seed 1, default) in the case folder, with `changes`."""
    data = yaml.safe_load(TINY.read_text())
    data.update({"games": ["starpilot"], "seeds": [1], "variants": {"default": []}, "budget": 512, **changes})
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def loaded(tmp: Path, root: str = "r") -> tuple[spec.Suite, spec.Member]:
    s = spec.load(suite_file(tmp), tmp / root)
    return s, s.members()[0]


def member_run(tmp: Path, steps: int = 256, finished: bool = False, config: dict | None = None,
               metrics: bytes | None = None, checkpoint: bool = True) -> tuple[spec.Suite, spec.Member]:
    """The member's folder as a trainer leaves it: config.yaml (with `config` changes), metrics, a checkpoint."""
    s, m = loaded(tmp)
    sets = [("env", "name", m.game), ("env", "distribution_mode", s.distribution_mode), ("training", "seed", m.seed),
            ("training", "total_timesteps", s.budget), *[(*k.split("."), v) for k, v in (config or {}).items()]]
    cfg = C.build(C.load_yaml(ROOT / s.base_config), sets, 1)
    m.folder.mkdir(parents=True)
    (m.folder / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    (m.folder / "benchmark_metrics.json").write_bytes(metrics if metrics is not None else json.dumps(
        {"algo": "ppo", "env": m.game, "finished": finished, "stop_reason": "done" if finished else "stopped",
         "total_timesteps": steps, "target_timesteps": s.budget, "episode_return_mean": 1.5}).encode())
    if checkpoint:
        (m.folder / "checkpoints").mkdir()
        (m.folder / "checkpoints" / "latest.pt").write_bytes(b"a checkpoint")
    m.log.write_text(f"mpippo: suite member {m.key}: mpippo.launch ...\niter 1\n")
    (s.folder / runlock.LOCK_NAME).write_text("process 1 on an-earlier-host (an earlier run)\n")  # its holder has ended
    return s, m


def submitted(tmp: Path, manifest: bytes | None = None, line: str | None = None) -> spec.Suite:
    """A suite that submitted one array (job 41): its manifest (or `manifest`) and submissions.jsonl (or `line`)."""
    s, m = loaded(tmp)
    s.folder.mkdir(parents=True)
    path = s.folder / "manifest-1.json"
    if manifest is None:
        spec.write_manifest(path, [m])
    elif manifest != b"-":  # "-": listed, but not there
        path.write_bytes(manifest)
    (s.folder / "submissions.jsonl").write_text(
        (line if line is not None else json.dumps({"job": 41, "manifest": str(path), "members": [m.key]})) + "\n")
    return s


def fake_bin(tmp: Path, **scripts: str) -> dict:
    """Shell scripts named after Slurm's commands, first on PATH (the case's environment)."""
    (tmp / "bin").mkdir(exist_ok=True)
    for name, body in scripts.items():
        (tmp / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp / "bin" / name).chmod(0o755)
    return {"PATH": f"{tmp / 'bin'}:{os.environ['PATH']}"}


CALLED = 'touch "$0.called"; '  # a fake command that ran leaves a file: the table sees it as something new


def hold(folder: Path, what: str = "run folder") -> subprocess.Popen:
    """Another process holding `folder`'s lock (a trainer's rank 0, another suite) until the module ends."""
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; from mpippo import runlock; "
                             "runlock.acquire(sys.argv[1], sys.argv[2]); print('held', flush=True); time.sleep(600)",
                             str(folder), what], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent(signal.SIGKILL))
    LOCKERS.append(proc)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture(scope="module", autouse=True)
def _lockers():
    yield
    for proc in LOCKERS:
        proc.kill()
        proc.wait()


def suite(*argv: str, root: str = "r", env=None, prepare=None):
    """A case: `python -m mpippo.suite argv... TMP/s.yaml --root TMP/<root>` after prepare(tmp); TMP/ in
    an argument stands for the case folder."""
    def setup(tmp, shared):
        made = prepare(tmp) if prepare else None
        if not (tmp / "s.yaml").exists():
            suite_file(tmp)
        extra = env(tmp) if env else {}
        if isinstance(made, dict):
            extra |= made
        cmd, *rest = (a.replace("TMP/", f"{tmp}/") for a in argv)
        return None, ["-m", "mpippo.suite", cmd, str(tmp / "s.yaml"), "--root", str(tmp / root), *rest], extra
    return setup


def lookup(index: int = 0, prepare=None):
    """The array element's lookup, as slurm/suite_member.sh runs it."""
    def setup(tmp, shared):
        s = prepare(tmp)
        return None, ["-m", "mpippo.suite", "member", str(s.folder / "manifest-1.json"), str(index)]
    return setup


def job_script(prepare):
    """slurm/suite_member.sh as array element 0 of the suite's manifest (its lookup refuses before training)."""
    def setup(tmp, shared):
        s = prepare(tmp)
        run = "import os, sys; os.execvp('bash', ['bash', 'slurm/suite_member.sh', sys.argv[1]])"
        return None, ["-c", run, str(s.folder / "manifest-1.json")], {
            "SLURM_ARRAY_TASK_ID": "0", "MPIPPO_ROOT": str(ROOT), "MPIPPO_PYTHON": sys.executable}
    return setup


def metrics_case(content: bytes):
    return lambda tmp: member_run(tmp, metrics=content)


def locked_member(tmp):
    """A member another process writes (no checkpoint yet: a lookup would otherwise set it aside)."""
    s, m = member_run(tmp, checkpoint=False)
    spec.write_manifest(s.folder / "manifest-1.json", [m])
    hold(m.folder)
    return s


def odd_lock(tmp, where: str, make, manifest=False, slurm=False):
    """A stopped member whose folder's (or the suite folder's) lock file is made by make(path): a
    FIFO, a folder, a link to a file of the user's or to nothing."""
    s, m = member_run(tmp)
    (tmp / "mine.txt").write_text("the user's file\n")
    lock = (m.folder if where == "member" else s.folder) / runlock.LOCK_NAME
    lock.unlink(missing_ok=True)
    make(lock)
    if manifest:
        spec.write_manifest(s.folder / "manifest-1.json", [m])
        return s
    return fake_bin(tmp, sbatch=CALLED + "echo 7") if slurm else None


def odd_log(tmp, make, manifest=False):
    """A stopped member whose log (<member>.log, appended to by `run --local` and by the array
    element's script) is made by make(path): a FIFO, a link to a file of the user's."""
    s, m = member_run(tmp)
    (tmp / "mine.txt").write_text("the user's file\n")
    m.log.unlink()
    make(m.log)
    if manifest:
        spec.write_manifest(s.folder / "manifest-1.json", [m])
        return s
    return None


def locked_suite(tmp):
    s, m = member_run(tmp)
    hold(s.folder, "suite folder")
    return fake_bin(tmp, sbatch=CALLED + "echo 7")


def sbatch(body: str):
    return lambda tmp: fake_bin(tmp, sbatch=body)


SQUEUE_DOWN = "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1"

CASES = [
    # ---- a member's metrics damaged: named, never read as numbers ----
    Case("metrics-a-list", suite("run", "--local", prepare=metrics_case(b"[1, 2, 3]")),
         "benchmark_metrics.json': expected a JSON object at the top level, got [1, 2, 3]"),
    Case("metrics-null", suite("report", prepare=metrics_case(b"null")), "at the top level, got None"),
    Case("metrics-text-for-steps", suite("run", "--local", prepare=metrics_case(
        b'{"finished": true, "total_timesteps": "a million"}')),
        "total_timesteps: expected a non-negative integer, got 'a million'"),
    Case("metrics-text-for-return", suite("report", prepare=metrics_case(
        b'{"finished": true, "total_timesteps": 512, "episode_return_mean": "high"}')),
        "episode_return_mean: expected a number, got 'high'"),
    Case("metrics-not-utf8", suite("report", prepare=metrics_case(b'{"finished": \xff\xfe}')),
         "not UTF-8 text (byte 0xff at offset 13)"),
    Case("metrics-shown-damaged", suite("status", prepare=metrics_case(b"{\"finished\": tru")),
         "damaged", code=0),
    # ---- the suite's own records damaged ----
    Case("submissions-corrupt-line", suite("status", prepare=lambda t: submitted(t, line='{"job": 41, "manif')),
         "submissions.jsonl': not valid JSON (line 1"),
    Case("submissions-not-an-object", suite("run", "--local", prepare=lambda t: submitted(t, line="[41]")),
         "submissions.jsonl': line 1: expected a JSON object, got [41]"),
    Case("submissions-job-not-a-number", suite("run", "--local", prepare=lambda t: submitted(
        t, line='{"job": "41; rm -rf /", "manifest": "m.json"}')), "entry 1: expected a job id (an integer)"),
    Case("manifest-damaged", suite("status", prepare=lambda t: submitted(t, manifest=b'{"0": {"key": 5}}')),
         "manifest-1.json': entry '0': expected"),
    Case("manifest-missing", suite("run", "--local", prepare=lambda t: submitted(t, manifest=b"-")),
         "manifest-1.json': no such file (job 41 of"),
    Case("lookup-damaged-manifest", lookup(0, lambda t: submitted(t, manifest=b'[{"key": "x"}]')),
         "expected a JSON object at the top level"),
    Case("lookup-index-not-in-manifest", lookup(5, submitted), "no member with array index 5 (it lists ['0'])"),
    # suite_member.sh reads the lookup's answer one a line: a line break made one option two
    Case("lookup-manifest-option-line-break", lookup(0, lambda t: submitted(t, manifest=json.dumps({"0": {
        "key": "default/starpilot/seed_1", "folder": "/tmp/m", "args": ["--seed", "1\n--output-dir\n/tmp/x"]}}).encode())),
         "entry '0': its folder or an option holds a line break or a NUL"),
    # a NUL in a name read back from the suite's own files (os.open raises ValueError on it), an index of "²"
    Case("submissions-manifest-name-nul", suite("status", prepare=lambda t: submitted(
        t, line=json.dumps({"job": 41, "manifest": "m\u0000.json", "members": []}))),
         "its name holds a NUL byte"),
    Case("lookup-manifest-folder-nul", lookup(0, lambda t: submitted(t, manifest=json.dumps({"0": {
        "key": "default/starpilot/seed_1", "folder": "/tmp/m\u0000x", "args": []}}).encode())),
         "entry '0': its folder or an option holds a line break or a NUL"),
    Case("lookup-manifest-index-superscript", lookup(0, lambda t: submitted(t, manifest=json.dumps({"\u00b2": {
        "key": "default/starpilot/seed_1", "folder": "/tmp/m", "args": []}}).encode())),
         "entry '²': expected an array index (0-"),
    Case("manifest-damaged-job-script", job_script(lambda t: submitted(t, manifest=b'{"0": {"key": "x", "folder": 3}}')),
         "entry '0': expected"),
    # ---- a member's folder holding another run: refused before it is scored, reported done or resumed ----
    Case("mismatch-game", suite("run", "--local", prepare=lambda t: member_run(t, config={"env.name": "bigfish"})),
         "holds a bigfish run, not starpilot (config.yaml); move it away"),
    Case("mismatch-seed", suite("report", prepare=lambda t: member_run(t, finished=True, steps=512,
                                                                         config={"training.seed": 7})),
         "holds a run of seed 7, not 1 (config.yaml)"),
    Case("mismatch-budget", suite("run", "--local", prepare=lambda t: member_run(
        t, config={"training.total_timesteps": 4096})), "holds a run to 4,096 steps, not the suite's budget of 512"),
    Case("mismatch-algo-no-submission", suite("run", prepare=lambda t: (member_run(t, metrics=json.dumps(
        {"algo": "dqn", "env": "starpilot", "stop_reason": "stopped"}).encode()), fake_bin(t, sbatch=CALLED + "echo 7"))[1]),
         "holds a dqn run, not ppo (what variant default resolves to; benchmark_metrics.json)"),
    Case("mismatch-member-folder-is-a-file", suite("run", "--local", prepare=lambda t: (
        loaded(t)[1].folder.parent.mkdir(parents=True), loaded(t)[1].folder.write_text("x"))),
        "is a file, not a run folder"),
    Case("mismatch-config-damaged", suite("report", prepare=lambda t: (member_run(t), (
        loaded(t)[1].folder / "config.yaml").write_text("- 1\n"))), "run config: "),
    Case("mismatch-shown", suite("status", prepare=lambda t: member_run(t, config={"env.name": "bigfish"})),
         "mismatch", code=0),
    # ---- Slurm's commands failing: one line naming the command and what it said, nothing left ----
    Case("sbatch-missing", suite("run", root="out", env=lambda t: {"PATH": str(t / "nobin")}),
         "sbatch is not on PATH"),
    Case("sbatch-refuses", suite("run", root="out", prepare=sbatch(
        "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2; exit 1")),
        "sbatch refused the array (exit 1): 'sbatch: error: Batch job submission failed: Invalid partition"),
    Case("sbatch-prints-garbage", suite("run", prepare=lambda t: (member_run(t), sbatch(
        "echo 'Submitted to the moon'")(t))[1]), "sbatch printed 'Submitted to the moon' instead of a job id"),
    Case("sbatch-prints-nothing", suite("run", root="out", prepare=sbatch("exit 0")),
         "sbatch printed nothing instead of a job id"),
    Case("squeue-fails-run", suite("run", "--local", prepare=lambda t: (submitted(t), fake_bin(t, squeue=SQUEUE_DOWN))[1]),
         "squeue failed (exit 1: 'slurm_load_jobs error: Unable to contact slurm controller"),
    Case("squeue-fails-status", suite("status", prepare=lambda t: (submitted(t), fake_bin(t, squeue=SQUEUE_DOWN))[1]),
         "so what is queued is unknown"),
    # ---- options out of range ----
    Case("reps-huge", suite("report", "--reps", "10000000000"), "--reps: bootstrap resamples must be in 1..100,000"),
    Case("reps-zero", suite("report", "--reps", "0"), "must be in 1..100,000 (rliable's default: 2,000), got 0"),
    Case("reps-negative", suite("report", "--reps", "-5"), "got -5"),
    Case("max-parallel-huge", suite("run", "--max-parallel", "99999", root="out"), "--max-parallel: must be in 1..1000"),
    Case("sbatch-args-unbalanced", suite("run", "--sbatch-args=--partition='gpu", root="out"),
         "--sbatch-args: \"--partition='gpu\" is not a list of options"),
    Case("root-is-a-file", suite("status", root="f", prepare=lambda t: (t / "f").write_text("x")), "is not a folder"),
    Case("suite-folder-is-a-file", suite("run", "--local", prepare=lambda t: (
        (t / "r" / "suites").mkdir(parents=True), (t / "r" / "suites" / "tiny").write_text("x"))),
        "suites/tiny' is not a folder (the suite's members go under it)"),
    Case("member-under-a-file", suite("run", "--local", prepare=lambda t: (
        (t / "r" / "suites" / "tiny").mkdir(parents=True), (t / "r" / "suites" / "tiny" / "default").write_text("x"))),
        "tiny/default', which is a file, not a folder"),
    Case("local-tmpdir-a-file", suite("run", "--local", env=lambda t: (t / "tmpfile").write_text("x") and {"TMPDIR": str(t / "tmpfile")}),
         "suite run --local: TMPDIR="),  # (every member's launcher refused it in turn, after the suite's folder was made)
    Case("local-tmp-under-a-device", suite("run", "--local", env=lambda t: {"TMPDIR": None, "TEMP": None, "TMP": "/dev/null/x"}),
         "TMP='/dev/null/x' lies under '/dev/null', which is a character device, not a folder"),
    Case("report-out-is-a-file", suite("report", "--out", "TMP/f", prepare=lambda t: (t / "f").write_text("x")),
         "f' is not a folder (the report's files go into it)"),
    # ---- one writer per folder ----
    Case("suite-folder-locked-local", suite("run", "--local", prepare=locked_suite), "' is in use: process"),
    Case("suite-folder-locked-slurm", suite("run", prepare=locked_suite), "holds its lock (.mpippo.lock)"),
    Case("member-folder-locked-lookup", lookup(0, locked_member), "is in use: process"),
    Case("member-folder-locked-job-script", job_script(locked_member), "this element leaves it alone"),
    Case("member-folder-locked-run", suite("run", "--local", prepare=locked_member),
         "is running elsewhere (process", code=0),
    Case("member-folder-locked-status", suite("status", prepare=locked_member), " running ", code=0),
    # ---- a local run of members that ask for GPUs, on a machine without one: said, and run on the CPU ----
    Case("gpu-suite-local-without-gpus", suite("run", "--local", "--dry-run", env=lambda t: {"CUDA_VISIBLE_DEVICES": ""},
                                               prepare=lambda t: suite_file(t, gpus_per_rank=1) and None),
         "note: its members ask for 1 GPU(s) per rank (gpus_per_rank) and this machine has 0 usable", code=0),
    Case("gpu-suite-local-two-per-rank", suite("run", "--local", "--dry-run", env=lambda t: {"CUDA_VISIBLE_DEVICES": ""},
                                               prepare=lambda t: suite_file(t, gpus_per_rank=2) and None),
         "they run on the CPU here (training.device auto)", code=0),
    # ---- every game's name checked before anything is submitted, not only each family's first ----
    Case("games-second-atari-misspelled", suite("run", "--local", prepare=lambda t: suite_file(
        t, base_config="configs/ppo_atari.yaml", games=["atari:Pong", "atari:Pongg"]) and None),
         "variants.default: env.name: 'Pongg' is not an ALE game (did you mean 'atari:Pong'?)"),
    Case("games-second-gym-misspelled", suite("status", prepare=lambda t: suite_file(
        t, base_config="configs/ppo_cartpole.yaml", games=["gym:CartPole-v1", "gym:CartPol-v1"]) and None),
         "env.name: 'CartPol-v1' is not a registered Gymnasium id (did you mean 'gym:CartPole-v1'?)"),
    # ---- a lock file that is something else: refused by name, never opened (a FIFO would block) ----
    Case("member-lock-fifo-status", suite("status", prepare=lambda t: odd_lock(t, "member", os.mkfifo)),
         "seed_1/.mpippo.lock' is a FIFO, not mpippo's lock"),
    Case("member-lock-fifo-run", suite("run", "--local", prepare=lambda t: odd_lock(t, "member", os.mkfifo)),
         "seed_1/.mpippo.lock' is a FIFO, not mpippo's lock"),
    Case("member-lock-folder-lookup", lookup(0, lambda t: odd_lock(t, "member", os.mkdir, manifest=True)),
         "seed_1/.mpippo.lock' is a folder, not mpippo's lock"),
    Case("suite-lock-symlink-run", suite("run", "--local", prepare=lambda t: odd_lock(
        t, "suite", lambda lock: lock.symlink_to(t / "mine.txt"))), "tiny/.mpippo.lock' is a symbolic link"),
    Case("suite-lock-dangling-symlink-slurm", suite("run", prepare=lambda t: odd_lock(
        t, "suite", lambda lock: lock.symlink_to(t / "made-by-nobody"), slurm=True)), "tiny/.mpippo.lock' is a symbolic link"),
    # ---- a member's log that is something else: refused before anything starts (a link would be written
    # through, a FIFO would hold `run --local` or the element's `exec >>` until its time limit) ----
    Case("member-log-fifo-run", suite("run", "--local", prepare=lambda t: odd_log(t, os.mkfifo)),
         "seed_1.log': is a FIFO, not a file"),
    Case("member-log-symlink-run", suite("run", "--local", prepare=lambda t: odd_log(
        t, lambda log: log.symlink_to(t / "mine.txt"))), "seed_1.log': is a symbolic link, not a file"),
    Case("member-log-fifo-job-script", job_script(lambda t: odd_log(t, os.mkfifo, manifest=True)),
         "seed_1.log': is a FIFO, not a file"),
    Case("member-log-symlink-lookup", lookup(0, lambda t: odd_log(t, lambda log: log.symlink_to(t / "mine.txt"),
                                                                 manifest=True)), "seed_1.log': is a symbolic link"),
]


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict:
    return hostile.outcomes(request, tmp_path_factory, CASES, "test_hostile_suite_input", lambda: {})


@pytest.mark.parametrize("case", hostile.params(CASES))
def test_hostile_suite_input(case: Case, outcomes):
    o = outcomes[case.id].result()
    if case.code == 0:  # not a refusal: said on stdout, and nothing else
        res = o.res
        assert res.returncode == 0, (res.stdout[-1500:], res.stderr[-2500:])
        assert case.expect in res.stdout, res.stdout[-2500:]
        assert "mpippo: error:" not in res.stdout + res.stderr and "Traceback" not in res.stderr, res.stderr[-2500:]
        new = {p for p in set(o.after) - set(o.before) if p.name != runlock.LOCK_NAME}  # a run's lock file stays
        assert {p: h for p, h in o.after.items() if p in o.before} == o.before and not new, new
        assert not o.left_running, o.left_running
        return
    hostile.check(case, o)
    assert sorted(map(str, o.after)) == sorted(map(str, o.before)), set(o.after) ^ set(o.before)  # nothing new


def test_every_class_has_two_cases():
    for word in ("metrics-", "submissions-", "manifest", "mismatch-", "sbatch-", "squeue-", "reps-", "suite-folder-locked",
                 "member-folder-locked", "member-lock-", "suite-lock-", "gpu-suite-"):
        assert sum(c.id.startswith(word) or word in c.id for c in CASES) >= 2, word


# ---- signals to a local suite ----
def _local_suite(tmp: Path, tag: str) -> tuple[subprocess.Popen, Path]:
    """`suite run --local` of one small member with a large budget, its processes marked with `tag`;
    returns it once the member has checkpointed its first iteration, and the member's folder."""
    path = suite_file(tmp, budget=1_000_000, variants={"default": [
        "model.channels=[8]", "model.hidden_size=32", "training.n_steps=16", "parallel.threads_per_rank=1"]})
    member = tmp / "suites" / "tiny" / "default" / "starpilot" / "seed_1"
    proc = subprocess.Popen([sys.executable, "-m", "mpippo.suite", "run", str(path), "--root", str(tmp), "--local"],
                            cwd=ROOT, env=mpi_env() | {hostile.MARK: tag}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (member / "checkpoints" / "latest.pt").is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            _end(tag)
            pytest.fail(f"the member did not checkpoint its first iteration (exit {proc.poll()}):\n"
                        f"{proc.communicate()[0][-3000:]}")
        time.sleep(0.05)
    return proc, member


def _end(tag: str) -> None:
    for p in hostile.marked_processes(tag):
        try:
            p.kill()
        except psutil.Error:
            pass


def _released(folder: Path, timeout: float = 10) -> str | None:
    """The folder's holder once `timeout` seconds have passed without it letting go (None: free).
    The kernel drops a flock when the holder's last descriptor closes, which an exiting process
    does after it has stopped showing its environment (so its marker) to a process listing."""
    deadline = time.monotonic() + timeout
    while (held := runlock.holder(folder)) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return held


def _stopped_with_a_checkpoint(member: Path) -> dict:
    m = json.loads((member / "benchmark_metrics.json").read_text())
    assert m["stop_reason"] == "stopped" and 0 < m["total_timesteps"] < 1_000_000, m
    assert (member / "checkpoints" / "latest.pt").is_file()
    assert _released(member) is None  # its trainer has ended
    return m


def test_sigterm_to_a_local_suite_any_number_of_times_stops_its_member_with_a_checkpoint(tmp_path):
    """The suite relays the first SIGTERM to the member's launcher (in its own session): checkpoint,
    stop at the iteration's end, exit 4; the repeats change nothing; the suite waits for it."""
    tag = f"suite-sigterm-{os.getpid()}-{time.monotonic_ns()}"
    proc, member = _local_suite(tmp_path, tag)
    suite = [sys.executable, "-m", "mpippo.suite"]
    where = [str(tmp_path / "s.yaml"), "--root", str(tmp_path)]
    second = subprocess.run([*suite, "run", *where, "--local"], cwd=ROOT, env=mpi_env(), capture_output=True,
                            text=True, timeout=60)
    assert second.returncode == 2 and f"is in use: process {proc.pid} on" in second.stderr, second.stderr
    status = subprocess.run([*suite, "status", *where], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "summary: 1 running" in status.stdout, status.stdout + status.stderr  # its trainer holds the folder
    for _ in range(5):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        _end(tag)
        pytest.fail("the suite did not end after SIGTERM (a hang)")
    assert proc.returncode == 4, out[-3000:]
    assert "Traceback" not in out and "resumes it" in out.splitlines()[-1], out[-3000:]
    assert out.count("mpippo.launch: SIGTERM received") == 1, out[-3000:]  # relayed once
    assert not hostile.survivors(tag, timeout=10)
    _stopped_with_a_checkpoint(member)
    assert "stopped with a checkpoint (exit 4)" in member.with_name("seed_1.log").read_text()
    status = subprocess.run([*suite, "status", *where], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "summary: 1 stopped" in status.stdout, status.stdout + status.stderr


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # (it ended between the listing and the look)
        return []


def test_a_local_suite_killed_outright_still_stops_its_member_with_a_checkpoint(tmp_path):
    """kill -9 of the suite: its launcher gets SIGTERM from the kernel (die_with_parent), checkpoints
    and stops; until then it keeps the suite folder locked, so no second run starts beside it."""
    tag = f"suite-sigkill-{os.getpid()}-{time.monotonic_ns()}"
    proc, member = _local_suite(tmp_path, tag)
    proc.kill()
    proc.communicate(timeout=30)
    suite_folder = member.parents[2]
    held = runlock.holder(suite_folder)
    launcher_alive = any("mpippo.launch" in " ".join(_cmdline(p)) for p in hostile.marked_processes(tag)
                         if hostile._running(p))
    assert held or not launcher_alive  # the launcher, alive after the check, held the suite's lock during it
    assert not hostile.survivors(tag, timeout=60)
    _stopped_with_a_checkpoint(member)
    assert _released(suite_folder) is None
