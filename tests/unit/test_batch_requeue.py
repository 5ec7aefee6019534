"""slurm/common.sh's self-requeue without a Slurm: stand-ins for mpirun (a trainer that checkpointed after
USR1, exit 3) and scontrol. Slurm answers `scontrol requeue` by sending TERM to every process of the
allocation, and on a loaded machine scontrol is often still running when it lands: the stand-in sends
that TERM to itself and to the batch shell before it answers. The requeue must still count, and a job
of a node range must still reset its task count, or the requeued job waits for every node it had (the
local-Slurm test of ppo_multinode.sh once waited 10 minutes for a drained node that way). Also the
listening mark's life: made new by rank 0, removed at the job's end, and removed by the next job when a
killed one left it."""
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpippo import leftovers, preemption

ROOT = Path(__file__).resolve().parents[2]

SCONTROL = """#!/bin/bash
echo "$*" >> "$CALLS"
if [ "$1" = requeue ]; then
    kill -TERM "$PPID" $$  # the requeue's TERM, to the batch shell and to this process alike
    sleep 0.3
fi
exit 0
"""
TRAINER = "#!/bin/bash\necho trainer \"$@\" >> \"$CALLS\"\nexit 3\n"


def run_batch_script(tmp_path: Path, per_node: str, nodes: str, tasks: str, args: tuple = (), trainer: str = TRAINER,
                     script: tuple = ("slurm/ppo_multinode.sh",), **more_env) -> tuple[str, list[str], int]:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in (("scontrol", SCONTROL), ("mpirun", trainer), ("srun", trainer)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", CALLS=str(calls), MPIPPO_ROOT=str(ROOT),
               MPIPPO_MPIRUN=str(stubs / "mpirun"), MPIPPO_RUN_DIR=str(tmp_path / "run"), TMPDIR=str(tmp_path),
               SLURM_JOB_ID="77", SLURM_NTASKS=tasks, SLURM_NTASKS_PER_NODE=per_node,
               SLURM_JOB_NUM_NODES=nodes, SLURM_JOB_NODELIST="n[1-2]", SLURM_TASKS_PER_NODE=per_node) | more_env
    env = {k: v for k, v in env.items() if v is not None}  # (None: unset)
    res = subprocess.run(["bash", *script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    return res.stdout + res.stderr, calls.read_text().splitlines() if calls.exists() else [], res.returncode


def test_a_requeue_whose_term_lands_during_scontrol_still_counts_and_reopens_the_node_range(tmp_path):
    out, calls, rc = run_batch_script(tmp_path, per_node="2", nodes="2", tasks="4")
    assert "requeueing job 77" in out and "requeue failed" not in out, out
    assert calls[1:] == ["requeue 77", "update JobId=77 NumTasks=2"], calls
    assert rc == 0, out  # the job's end is the requeue, not a failure


def test_a_job_of_fixed_size_requeues_without_touching_its_task_count(tmp_path):
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2")
    assert calls[1:] == ["requeue 77"], calls
    assert rc == 0, out


def test_marks_a_killed_batch_shell_left_are_removed_by_the_next_job_and_its_own_at_its_end(tmp_path):
    """The mark is named after its shell (boot id, pid namespace and pid, as mpippo/launch.py names its own):
    one whose shell is gone is removed by the next job; a live shell's mark, another node's (its boot id:
    a TMPDIR several nodes share), another name, a link of that name (and what it points to) stay."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ns = leftovers.owner()
    gone = tmp_path / f"mpippo-listening-{ns}.{dead.pid}-job5"
    live = tmp_path / f"mpippo-listening-{ns}.{os.getpid()}-job6"
    other, link = tmp_path / "mpippo-listening.5.123", tmp_path / f"mpippo-listening-{ns}.{dead.pid}-job7"
    node = tmp_path / f"mpippo-listening-{'f' if ns[0] != 'f' else 'e'}{ns[1:]}.{dead.pid}-job8"
    for f in (gone, live, other, node):
        f.touch()
    (tmp_path / "target").write_text("kept")
    link.symlink_to(tmp_path / "target")
    out, _, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2")
    assert rc == 0, out
    assert not gone.exists() and live.exists() and other.exists() and node.exists() and link.is_symlink()
    assert (tmp_path / "target").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.glob("mpippo-listening*")) == sorted(
        [live.name, other.name, link.name, node.name])


def test_rank_0_makes_the_mark_new_and_never_opens_what_stands_at_its_path(tmp_path, monkeypatch):
    """It says "running" until rank 0's exit status is decided, then that status (the script's proof that a
    status 3 is the trainer's checkpoint after USR1, below)."""
    mark = tmp_path / "mark"
    monkeypatch.setenv(preemption.LISTENING_ENV, str(mark))
    monkeypatch.setattr(preemption, "_MARK", None)
    preemption.announce_listening()
    assert mark.read_bytes() == b"running\n"
    preemption.announce_listening()  # already there: left as it is
    assert mark.is_file() and mark.read_bytes() == b"running\n"
    preemption.announce_exit(3)
    assert mark.read_bytes() == b"exit 3\n"
    preemption.announce_exit(137)
    assert mark.read_bytes() == b"exit 137\n"
    (tmp_path / "theirs").write_text("data")
    for name, make in (("link", lambda p: p.symlink_to(tmp_path / "theirs")),
                       ("dangling", lambda p: p.symlink_to(tmp_path / "nowhere")), ("fifo", os.mkfifo)):
        make(tmp_path / name)
        monkeypatch.setenv(preemption.LISTENING_ENV, str(tmp_path / name))
        preemption.announce_listening()  # a FIFO opened for writing would block here
    preemption.announce_exit(0)  # (into the mark it made, never what stood at another path)
    assert (tmp_path / "theirs").read_text() == "data" and not (tmp_path / "nowhere").exists()
    assert mark.read_bytes() == b"exit 0\n"
    child = os.fork()  # a forked child's status (a user's env's worker) is not rank 0's
    if child == 0:
        preemption.announce_exit(9)
        os._exit(0)
    os.waitpid(child, 0)
    assert mark.read_bytes() == b"exit 0\n"
    fd = preemption._MARK[0]  # its number taken by another file (closed by someone): that file is left alone
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)
    os.dup2(other, fd)
    os.close(other)
    preemption.announce_exit(1)
    assert (tmp_path / "other").read_bytes() == b"" and mark.read_bytes() == b"exit 0\n"
    os.close(fd)



@pytest.mark.parametrize("mark, requeued", [("running", False), ("exit 0", False), ("exit 3", True), ("", True),
                                            (None, True), ("fifo", True)])
def test_a_status_3_requeues_only_when_rank_0_ended_with_it(tmp_path, mark, requeued):
    """Status 3 asks for a requeue; a user's env that ends a rank with os._exit(3) gives it too, nothing in the
    process can catch that, and each requeued job ended so again. Rank 0's mark says "running" until its own
    status is decided, then "exit <status>": the job is requeued only when that is 3, or where the mark says
    nothing (none made: rank 0 on another node; empty: a full TMPDIR; not a file), as before."""
    make = {None: "", "fifo": 'mkfifo "$MPIPPO_LISTENING"', "": 'touch "$MPIPPO_LISTENING"'}.get(
        mark, f'echo "{mark}" > "$MPIPPO_LISTENING"')
    trainer = f"#!/bin/bash\necho trainer >> \"$CALLS\"\n{make}\nexit 3\n"
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", trainer=trainer)
    assert ("requeue 77" in calls) == requeued and ("requeueing job 77" in out) == requeued, (calls, out)
    if requeued:
        assert rc == 0, out
    else:
        said = "rank 0 was still training" if mark == "running" else "rank 0 ended with status 0"
        lines = [line for line in out.splitlines() if "not after a checkpoint of its own" in line]
        assert len(lines) == 1 and f"({said})" in lines[0] and "os._exit(3)" in lines[0] and rc == 3, out



def test_a_folder_standing_at_the_marks_path_is_not_taken_for_the_mark(tmp_path):
    """The mark's path is named after the batch shell; a folder there (left by an earlier shell of that pid,
    or put there) survived `rm -f` and read as a mark made at once: held signals went on before the ranks
    listened, and rank 0's word could not be read (a status 3 of an env's os._exit(3) was requeued). The
    script takes another name."""
    trainer = '#!/bin/bash\necho trainer >> "$CALLS"\necho running > "$MPIPPO_LISTENING"\nexit 3\n'
    owner = "$(head -c 8 /proc/sys/kernel/random/boot_id).$(stat -L -c %i /proc/self/ns/pid)"
    plant = f'mkdir -p "$TMPDIR/mpippo-listening-{owner}.$$-job77/x"; source slurm/ppo_multinode.sh'
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", trainer=trainer,
                                      script=("-c", plant))
    assert len(list(tmp_path.glob("mpippo-listening-*/x"))) == 1, out  # (planted, and left as it was)
    assert "requeue 77" not in calls and "not after a checkpoint of its own (rank 0 was still training)" in out, out


# A launcher whose n-th start does what MODE says for it (the n-th comma-separated field):
# "213": Open MPI's own failure before any rank ran (the PMIx listener that failed to start);
# "mark": rank 0's listening mark first, as a trainer whose every rank runs mpippo makes it;
# "wrote": a write in the run folder (a trainer that ran, its mark lost);
# "sig": a USR1 to the batch shell during that start (Slurm's warning);
# "hear": listens for USR1 and exits 3 on it (a checkpoint after USR1);
# "count": notes each USR1; once it heard one, a USR1 to the batch shell (Slurm's again), exit 3 a second later.
LAUNCHES = """#!/bin/bash
n=$(( $(cat "$CALLS.n" 2>/dev/null || echo 0) + 1 )); echo $n > "$CALLS.n"
echo "trainer $n" >> "$CALLS"
what=$(echo "$MODE" | cut -d, -f$n)
case $what in *mark*) touch "$MPIPPO_LISTENING" ;; esac
case $what in *wrote*) mkdir -p "$MPIPPO_RUN_DIR/logs"; echo "iter 1" > "$MPIPPO_RUN_DIR/logs/metrics" ;; esac
case $what in *sig*) kill -USR1 "$PPID"; sleep 0.5 ;; esac
case $what in *count*) heard=""; trap 'echo "heard USR1" >> "$CALLS"; heard=1' USR1; touch "$MPIPPO_LISTENING"
                       for _ in $(seq 100); do [ -n "$heard" ] && break; sleep 0.1; done; kill -USR1 "$PPID"
                       for _ in $(seq 10); do sleep 0.1; done; exit 3 ;; esac
case $what in *hear*) trap 'echo "heard USR1" >> "$CALLS"; exit 3' USR1; touch "$MPIPPO_LISTENING"
                      for _ in $(seq 100); do sleep 0.1; done; exit 0 ;; esac
exit "${what//[!0-9]/}"
"""


@pytest.mark.parametrize("mode, launches, rc", [("213,0", 2, 0), ("213,213,0", 2, 213), ("mark1,0", 1, 1),
                                                ("2,0", 1, 2), ("4,0", 1, 4), ("137,mark1", 2, 1),
                                                ("wrote137,0", 1, 137)])
def test_a_launch_that_failed_before_any_rank_ran_mpippo_is_started_once_more(tmp_path, mode, launches, rc):
    """Open MPI's mpirun fails to start now and then on a loaded node ("The PMIx server's listener thread
    failed to start", status 213, about one launch in 900): nothing was trained, and the job ended
    "trainer exited with status 213" (a Slurm test of ours failed so). Started once more; not when a rank
    had run mpippo (its mark, or, the mark being best effort, a change in the run folder: a failure after
    hours of training), nor on the trainer's own statuses (bad input, a checkpoint and stop)."""
    out, calls, got = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", trainer=LAUNCHES, MODE=mode)
    assert [c for c in calls if c.startswith("trainer")] == [f"trainer {n + 1}" for n in range(launches)], (calls, out)
    assert ("starting it once more" in out) == (launches == 2), out
    assert got == rc, out


def test_a_signal_that_came_while_a_launch_failed_is_passed_to_the_second_one(tmp_path):
    """No rank heard Slurm's USR1 (none listened): held for the second launch, whose checkpoint after it
    requeues the job as the first would have."""
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", trainer=LAUNCHES, MODE="sig 213,hear")
    assert calls[:3] == ["trainer 1", "trainer 2", "heard USR1"] and "requeue 77" in calls, (calls, out)
    assert "starting it once more" in out and "requeueing job 77" in out and rc == 0, out


def test_signals_held_from_before_the_traps_are_passed_on_once_per_kind(tmp_path):
    """suite_member.sh keeps the signals that come before common.sh's traps (MPIPPO_EARLY_SIGNALS): Slurm's
    USR1 there and Slurm's USR1 again later reached the trainer twice, where common.sh passes each kind on once (a repeat landing
    while the ranks exit kills one whose interpreter dropped its handlers, losing the requeue)."""
    early = "MPIPPO_EARLY_SIGNALS=(USR1); source slurm/common.sh"
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", trainer=LAUNCHES, MODE="count",
                                      script=("-c", early, "suite_member.sh"))
    assert calls.count("heard USR1") == 1 and "requeue 77" in calls, (calls, out)
    assert "USR1 again: already passed on, ignored" in out and "requeueing job 77" in out and rc == 0, out


def test_a_job_requeued_before_its_first_checkpoint_sets_what_it_wrote_aside_and_starts_afresh(tmp_path):
    """Requeued by a node failure or a preemption before its first checkpoint (or a USR1 during its start-up
    after config.yaml): the folder holds a run with nothing to resume, which the trainer refuses to start
    in; it is renamed aside, kept whole, and the job starts afresh (it ended 'bad input; not requeued')."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text("training:\n  seed: 1\n")
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", SLURM_RESTART_COUNT="1")
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.attempt-")]
    assert len(aside) == 1 and (aside[0] / "config.yaml").read_text() == "training:\n  seed: 1\n", out
    assert f"set aside as {aside[0].name}; starting afresh" in out
    assert calls[0].startswith("trainer ") and "--resume" not in calls[0].split(), calls
    assert rc == 0, out


def test_an_output_dir_among_the_scripts_options_is_refused_in_one_line(tmp_path):
    """The batch scripts choose the run folder (MPIPPO_RUN_DIR or runs/slurm-<job>): one given in the
    options (any abbreviation the trainer's parser takes) trained elsewhere, and its requeue found no
    checkpoint and ended 'bad input; not requeued'."""
    for k, args in enumerate((("--output-dir", "runs/exp1"), ("--out=runs/exp1",), ("--seed", "3", "--o", "x"))):
        (tmp_path / str(k)).mkdir()
        out, calls, rc = run_batch_script(tmp_path / str(k), per_node="", nodes="1", tasks="2", args=args)
        assert rc == 2 and calls == [], out
        errors = [line for line in out.splitlines() if line.startswith("mpippo: error:")]
        assert len(errors) == 1 and "the batch scripts choose the run folder" in errors[0] and "MPIPPO_RUN_DIR" in errors[0]


def test_mpirun_args_are_split_not_globbed_and_a_users_binding_is_left_alone(tmp_path):
    """MPIPPO_MPIRUN_ARGS is split at spaces and passed as written (a `*` in it matched files of the
    repository: `e*` became a file's name); a binding it chooses by any of the options mpippo/launch.py
    knows, or the environment's policy, gets no binding of the script's beside it."""
    (tmp_path / "eth_notes").write_text("a file the pattern matches")
    pattern = f"{tmp_path}/e*"
    for args, env, bound in ((f"--mca btl_tcp_if_include {pattern}", {}, True), ("--cpu-set 0,1", {}, False),
                             ("-bind-to core", {}, False), ("", {"OMPI_MCA_hwloc_base_binding_policy": "core"}, False)):
        case = tmp_path / str(len(list(tmp_path.iterdir())))
        case.mkdir()
        out, calls, rc = run_batch_script(case, per_node="", nodes="1", tasks="2", MPIPPO_MPIRUN_ARGS=args, **env)
        assert rc == 0, out
        trainer = calls[0].split()
        assert trainer[1:1 + len(args.split())] == args.split(), trainer  # (the stand-in mpirun logs its argv)
        assert ("slot:PE=1" in trainer or "none" in trainer) == bound, (args, env, trainer)


@pytest.mark.parametrize("args", ['--map-by "ppr:2:node"', "--mca btl_tcp_if_include 'eth0'", r"--host a\ b",
                                  "--map-by 'a\nb'"])
def test_mpirun_args_with_quotes_are_refused_in_one_line(tmp_path, args):
    """Split at spaces only, a quote or backslash reached mpirun as part of an option ('"ppr:2:node"'),
    where launch.py's --mpirun-args reads them as a shell would: refused, naming the value, before any rank."""
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", MPIPPO_MPIRUN_ARGS=args)
    errors = [line for line in out.splitlines() if line.startswith("mpippo: error:")]
    assert rc == 2 and not calls, out
    shown = args.replace("\n", "\\n")  # a line break written \n: the error stays one line
    assert len(errors) == 1 and f"MPIPPO_MPIRUN_ARGS='{shown}'" in errors[0] and "quote or backslash" in errors[0], out


@pytest.mark.parametrize("plugin", ["pmix --overlap", "", "pmi2;true", "pmix\n--x"])
def test_an_srun_mpi_plugin_that_is_no_name_is_refused_in_one_line(tmp_path, plugin):
    """MPIPPO_SRUN_MPI went whole into srun's --mpi= (srun's own error, or an option riding in it):
    a value that is no plugin's name is refused naming it, before any rank; a name goes through."""
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", MPIPPO_LAUNCHER="srun",
                                      MPIPPO_SRUN_MPI=plugin)
    errors = [line for line in out.splitlines() if line.startswith("mpippo: error:")]
    assert rc == 2 and not calls, out
    assert len(errors) == 1 and "MPIPPO_SRUN_MPI=" in errors[0] and "not an MPI plugin's name" in errors[0], out
    good = tmp_path / "good"
    good.mkdir()
    out, calls, rc = run_batch_script(good, per_node="", nodes="1", tasks="2", MPIPPO_LAUNCHER="srun",
                                      MPIPPO_SRUN_MPI="pmix_v4")
    assert calls and calls[0].startswith("trainer --mpi=pmix_v4 "), (calls, out)


@pytest.mark.parametrize("where", ["file", "under-file", "fifo", "temp-file", "sysfs"])
def test_a_tmpdir_open_mpi_cannot_use_is_refused_in_one_line(tmp_path, where):
    """Open MPI makes its session folder under TMPDIR (else TEMP, TMP): a file or FIFO there, a path
    under a file, or a folder where no folder can be made (sysfs: even root's mkdir fails there) ended
    mpirun in a box of its text and status 213, which the script then tried once more. Now one line
    naming the variable, exit 2, before any launch; a folder not made yet goes through."""
    bad = tmp_path / "thing"
    if where == "fifo":
        os.mkfifo(bad)
    else:
        bad.write_text("a file\n")
    var, value = ("TEMP", str(bad)) if where == "temp-file" else ("TMPDIR", str(bad / "sub" if where == "under-file" else bad))
    if where == "sysfs":
        value = "/sys/mpippo-test"
    env = {"TMPDIR": None, "TEMP": None, var: value}  # (an empty TMPDIR is Open MPI's: then it uses /)
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", **env)
    errors = [line for line in out.splitlines() if line.startswith("mpippo: error:")]
    assert rc == 2 and not calls, out
    why = "no folder can be made in '/sys'" if where == "sysfs" else "not a folder"
    assert len(errors) == 1 and f"{var}='" in errors[0] and why in errors[0], out
    assert value[-10:] in errors[0], out  # (a long path is shortened in its middle)
    fine = tmp_path / "fine"
    fine.mkdir()
    out, calls, rc = run_batch_script(fine, per_node="", nodes="1", tasks="2", TMPDIR=str(fine / "not-yet"))
    assert calls and "mpippo: error:" not in out, out


def test_an_empty_tmpdir_is_open_mpis_choice_and_read_as_it_reads_it():
    """Open MPI takes the first of TMPDIR, TEMP, TMP that is set, even empty (its folder then goes in /):
    an empty TMPDIR is never passed over for a TEMP or TMP it does not read; a folder not made yet is fine."""
    said = leftovers.temp_folder_problem({"TMPDIR": "", "TMP": "/dev/null"})
    assert said is None or said.startswith("TMPDIR='' (empty: Open MPI then makes its folder in /): no folder"), said
    assert leftovers.temp_folder_problem({"TEMP": "/dev/null/x", "TMP": "/tmp"}).startswith("TEMP='/dev/null/x' lies under")
    assert leftovers.temp_folder_problem({"TMP": "/tmp/not-made-yet/x"}) is None and leftovers.temp_folder_problem({}) is None


def test_an_mpirun_that_outlives_every_rank_it_started_is_ended_not_left_to_the_time_limit(tmp_path):
    """After a rank failed inside MPI_Init (OMPI_MCA_btl=nonsense), Open MPI's runtime waited forever
    with every rank gone, and the batch job with it until Slurm's time limit (the launcher already ended
    it). A stand-in mpirun: one 'rank' that lives 3 s, then a sleep it started. The watch beside it ends
    it (its grace shortened by a sitecustomize, a test's knob only), says so, and leaves nothing running;
    nothing was trained, so the launch is tried once more, as any launch that failed before its ranks."""
    hang = ('#!/bin/bash\necho trainer >> "$CALLS"\n'
            f'OMPI_COMM_WORLD_RANK=0 {sys.executable} -c "import time; time.sleep(3)" run_mpi.py & wait\n'
            'sleep 600 & echo $! >> "$CALLS.pids"; wait\n')
    knob = tmp_path / "knob"
    knob.mkdir()
    (knob / "sitecustomize.py").write_text("from mpippo import launch\n"
                                           "launch._Outlived.GRACE_S, launch._Outlived.LOOK_S = 1.0, 0.1\n")
    t0 = time.monotonic()
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", trainer=hang,
                                      PYTHONPATH=str(knob))
    assert calls == ["trainer", "trainer"] and time.monotonic() - t0 < 50, (calls, out)
    assert out.count("every rank of this job on this node has ended, but mpirun") == 2, out
    assert "starting it once more" in out and "trainer exited with status 1" in out and rc == 1, out
    import psutil
    for pid in (tmp_path / "calls.pids").read_text().split():
        with contextlib.suppress(psutil.NoSuchProcess):  # (killed, it may wait a moment for its reaper)
            assert psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE, f"the stand-in's sleep {pid} was left running"


def test_a_batch_shell_that_cannot_read_its_pid_namespace_sweeps_nothing(tmp_path):
    """Containers sharing /dev/shm without a readable /proc/self/ns/pid all name their folders '<boot>.0': a pid
    there is not this shell's to judge (leftovers.sweep_leftovers already refused), but the batch script's
    sweep removed such a folder whose pid it could not see, another container's live job's."""
    boot = leftovers.owner().split(".")[0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    theirs = Path("/dev/shm") / f"mpippo-sm-{boot}.0.{dead.pid}-job9.test{os.getpid()}"
    theirs.mkdir()
    try:
        stubs = tmp_path / "stat-bin"
        stubs.mkdir()
        (stubs / "stat").write_text('#!/bin/bash\n[ "${!#}" = /proc/self/ns/pid ] && exit 1\nexec /usr/bin/stat "$@"\n')
        (stubs / "stat").chmod(0o755)
        out, _, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2",
                                      script=("-c", f'PATH={stubs}:$PATH exec bash "$0" "$@"', "slurm/ppo_multinode.sh"))
        assert theirs.is_dir(), out
    finally:
        theirs.rmdir()


def test_an_mpirun_held_after_rank_0_said_its_status_ends_with_that_status(tmp_path):
    """The same hold after the run finished (mpirun writing to a console that stopped reading): rank 0's mark
    says `exit 0`, so the watch's line is a note naming it and the job ends with it (the line had blamed a
    failed start, and the job took 1)."""
    hang = ('#!/bin/bash\necho trainer >> "$CALLS"\n'
            f'OMPI_COMM_WORLD_RANK=0 {sys.executable} -c "import time; time.sleep(3)" run_mpi.py & wait\n'
            'printf "exit 0\\n" > "$MPIPPO_LISTENING"\n'
            'sleep 600 & echo $! >> "$CALLS.pids"; wait\n')
    knob = tmp_path / "knob"
    knob.mkdir()
    (knob / "sitecustomize.py").write_text("from mpippo import launch\n"
                                           "launch._Outlived.GRACE_S, launch._Outlived.LOOK_S = 1.0, 0.1\n")
    out, calls, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", trainer=hang,
                                      PYTHONPATH=str(knob))
    assert calls == ["trainer"] and rc == 0, (calls, out)
    assert "mpippo: note: every rank of this job on this node has ended, rank 0 with exit 0, but mpirun" in out, out


@pytest.mark.parametrize("status", [213, 1])
def test_open_mpis_own_failure_under_a_small_open_file_limit_names_the_limit(tmp_path, status):
    """`ulimit -n 100` in the batch shell: Open MPI's runtime fails in a box of its own words (status 213 here
    from a stand-in), which names no limit; the job's last line does, as the launcher's does. Any other
    status says nothing of limits."""
    stand_in = f"#!/bin/bash\necho trainer \"$@\" >> \"$CALLS\"\nexit {status}\n"
    out, _, rc = run_batch_script(tmp_path, per_node="", nodes="1", tasks="2", trainer=stand_in,
                                  script=("-c", 'ulimit -S -n 100 && exec bash "$0" "$@"', "slurm/ppo_multinode.sh"))
    notes = [line for line in out.splitlines() if line.startswith("mpippo: note: Open MPI's runtime may have failed")]
    assert len(notes) == (status == 213) and "Traceback" not in out, out
    assert all("this process's open-file limit (ulimit -n) is 100 files" in line for line in notes), notes
