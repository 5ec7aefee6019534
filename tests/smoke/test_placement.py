"""Placement: a rank runs on its share of the node's cores, never on one core by accident.

Open MPI binds each of 1-2 ranks to one core by default: a 1-rank job on this machine saw one core
(one torch thread, procgen stepping serially while the other cores idled). The launcher binds each
rank to cores // ranks cores (--map-by slot:PE=n), or leaves ranks unbound when they do not fit.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, metrics, mpi_env, relaunched

CORES = len(os.sched_getaffinity(0))


def _launch(ranks: int, out, *extra: str) -> dict:
    """The launcher as a user runs it: without the tests' environment-wide "bind nothing" policy and
    one-thread count."""
    env = {k: v for k, v in mpi_env().items() if k not in ("PRTE_MCA_hwloc_default_binding_policy",
                                                             "OMPI_MCA_rmaps_base_oversubscribe", "OMP_NUM_THREADS")}
    cmd = [sys.executable, "-m", "mpippo.launch", "-n", str(ranks), *extra, "--config", "configs/toy_cue.yaml",
           "--no-progress", "--total-timesteps", "1024", "--output-dir", str(out)]
    # (started again where Open MPI failed to start the job, as every other way the tests launch one)
    res = relaunched(lambda: subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120))
    assert res.returncode == 0, res.stderr[-3000:]
    return metrics(out)


@pytest.mark.mpi
def test_one_rank_sees_every_core(tmp_path):
    m = _launch(1, tmp_path / "one")
    assert m["affinity_cores"] == CORES and m["cpu_share"] == CORES
    assert m["threads_per_rank"] == CORES  # torch threads: the whole share


@pytest.mark.mpi
@pytest.mark.skipif(CORES < 2, reason="needs two cores to give two ranks one each")
def test_two_ranks_get_half_each(tmp_path):
    """Also with --oversubscribe given (as suites and older Makefiles did): Open MPI unbinds every
    rank with it, so the launcher drops it where the ranks fit."""
    m = _launch(2, tmp_path / "two", "--mpirun-args=--oversubscribe")
    assert m["affinity_cores"] == CORES // 2 and m["threads_per_rank"] == CORES // 2


@pytest.mark.mpi
def test_more_ranks_than_cores_share_them_unbound(tmp_path):
    m = _launch(CORES + 1, tmp_path / "over")
    assert m["affinity_cores"] == CORES  # unbound: the rank may run on any core
    assert m["cpu_share"] == 1 and m["threads_per_rank"] == 1


def test_placement_options(monkeypatch):
    from mpippo.launch import BINDING_ENV, placement
    for var in BINDING_ENV:
        monkeypatch.delenv(var, raising=False)
    assert placement(1, threads=None)[0] == ["--map-by", f"slot:PE={CORES}"]
    assert placement(CORES + 1)[0][:1] == ["--oversubscribe"]
    assert placement(1, ["--bind-to", "none"]) == ([], {})  # the user's own binding is left alone
    assert placement(1, ["--map-by=ppr:1:node"]) == ([], {})
    monkeypatch.setenv(BINDING_ENV[0], "none")
    assert placement(1) == ([], {})  # and so is a policy set in the environment
    assert placement(CORES + 1) == (["--oversubscribe"], {})  # but more ranks than cores still may start


def test_a_launcher_confined_to_some_cores_leaves_its_ranks_unbound(monkeypatch):
    """Open MPI would bind from core 0 whatever the launcher's own mask (taskset, a cpuset): the ranks
    stay unbound inside the mask instead."""
    from mpippo.launch import BINDING_ENV, placement
    for var in BINDING_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: CORES + 4)  # the node has more cores than this mask
    where, env = placement(1)
    assert where == ["--bind-to", "none"] and env


@pytest.mark.mpi
def test_a_launched_job_keeps_its_shared_memory_files_in_a_folder_of_its_own(tmp_path):
    """Open MPI names them after a 16-bit hash of the job's id: jobs side by side met on the same
    files now and then (a rank killed by SIGSEGV inside the transport). The launcher gives each job
    a folder in /dev/shm, where each rank's file must land, and removes it at the end."""
    import time

    import psutil

    from mpippo.launch import SHM_VAR
    env = {k: v for k, v in mpi_env().items() if k != SHM_VAR}
    proc = subprocess.Popen([sys.executable, "-m", "mpippo.launch", "-n", "2", "--config", "configs/toy_cue.yaml",
                             "--no-progress", "--total-timesteps", "2048", "--output-dir", str(tmp_path / "run")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    folder, files, deadline = None, set(), time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True) if folder is None else []:
            try:
                folder = child.environ().get(SHM_VAR) or folder
            except psutil.Error:
                continue
        files |= {f.name for f in Path(folder).glob("sm_segment.*")} if folder else set()
        time.sleep(0.05)
    out = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
    assert proc.returncode == 0, out[-3000:]
    assert folder and folder.startswith("/dev/shm/mpippo-sm-"), folder
    assert len(files) == 2, files  # one per rank, in the job's folder
    assert not Path(folder).exists()


def test_own_shm_folder_keeps_a_chosen_folder_and_falls_back_where_none_can_be_made(monkeypatch, tmp_path):
    import tempfile

    from mpippo.launch import SHM_VAR, own_shm_folder
    with own_shm_folder({}) as env:
        made = Path(env[SHM_VAR])
        (made / "sm_segment.left.by.a.killed.rank").write_bytes(b"x")
    assert made.parent == Path("/dev/shm") and not made.exists()
    with own_shm_folder({SHM_VAR: str(tmp_path)}) as env:
        assert env[SHM_VAR] == str(tmp_path)
    vader = "OMPI_MCA_btl_vader_backing_directory"  # (Open MPI 4's name)
    with own_shm_folder({vader: str(tmp_path)}) as env:
        assert env == {vader: str(tmp_path)}
    with own_shm_folder({SHM_VAR: ""}) as env:  # empty names none (Open MPI wrote to '(null)/sm_segment...')
        assert Path(env[SHM_VAR]).parent == Path("/dev/shm")
    assert tmp_path.exists()  # the user's own folder stays
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: (_ for _ in ()).throw(OSError(28, "No space left")))
    with own_shm_folder({}) as env:
        assert SHM_VAR not in env  # Open MPI's default folder then


def test_folders_a_killed_process_left_are_removed_by_the_next_and_no_other(tmp_path):
    """A process names its shared-memory and temporary folders after itself (boot id, pid namespace and
    pid): kill -9 leaves one behind, and the next launcher, tool or test session that makes one removes
    those of this user whose maker is gone; anything else is left alone, another node's (another boot
    id: a temporary folder shared by several nodes) and another container's (pid namespace) included."""
    from mpippo import launch, leftovers
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ns = leftovers.owner()
    boot, pid_ns = ns.split(".")
    other_node = f"{'0' if boot[0] != '0' else '1'}{boot[1:]}.{pid_ns}"
    left = [tmp_path / f"mpippo-sm-{ns}.{dead.pid}-x1", tmp_path / f"mpippo-cutoff-{ns}.{dead.pid}-x2",
            tmp_path / f"mpippo-sm-{ns}.{dead.pid}-job17.x3"]  # as slurm/common.sh names a job's
    kept = [tmp_path / f"mpippo-sm-{ns}.{os.getpid()}-live",
            tmp_path / f"mpippo-sm-{boot}.{int(pid_ns) + 1}.{dead.pid}-other-ns",
            tmp_path / f"mpippo-cutoff-{other_node}.{dead.pid}-other-node",
            tmp_path / f"mpippo-sm-{pid_ns}.{dead.pid}-no-boot-id",
            tmp_path / "mpippo-sm-abcdef", tmp_path / f"elsewhere-{ns}.{dead.pid}-x"]
    for d in left + kept:
        d.mkdir()
        (d / "sm_segment.x").write_bytes(b"x")
    # a batch script's listening mark (a file), of a shell that is gone and of a live one
    marks = [tmp_path / f"mpippo-listening-{ns}.{dead.pid}-job17",
             tmp_path / f"mpippo-listening-{ns}.{os.getpid()}-job18"]
    for f in marks:
        f.touch()
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / f"mpippo-sm-{ns}.{dead.pid}-link").symlink_to(target)  # a link is never followed
    (tmp_path / f"mpippo-listening-{ns}.{dead.pid}-job19").symlink_to(target / "f")  # nor removed
    (target / "f").write_bytes(b"kept")
    for pid in ("99999999999999999999", "4294967296"):  # no pid at all: left alone (os.kill raised OverflowError)
        (tmp_path / f"mpippo-sm-{ns}.{pid}-huge").mkdir()
        kept.append(tmp_path / f"mpippo-sm-{ns}.{pid}-huge")
    assert sorted(leftovers.sweep_leftovers((str(tmp_path),))) == sorted(map(str, left + marks[:1]))
    assert all(d.is_dir() for d in kept) and not any(d.exists() for d in left) and (target).is_dir()
    assert not marks[0].exists() and marks[1].is_file() and (target / "f").read_bytes() == b"kept"
    assert (tmp_path / f"mpippo-listening-{ns}.{dead.pid}-job19").is_symlink()
    with launch.temp_folder("probe") as made:  # what a tool makes: named so, and gone at its end
        assert Path(made).name.startswith(f"mpippo-probe-{ns}.{os.getpid()}-")
    assert not Path(made).exists()


def test_without_a_boot_id_only_dev_shm_is_swept(tmp_path, monkeypatch):
    """A node whose boot id cannot be read names its folders 00000000.<ns>, as every such node does: a
    shared temporary folder's names of that kind may be another node's, so only /dev/shm is swept. A
    process whose pid namespace cannot be read sweeps nothing (containers sharing /dev/shm)."""
    from mpippo import leftovers
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.setattr(leftovers, "owner", lambda: f"{leftovers.UNKNOWN_BOOT}.{os.stat('/proc/self/ns/pid').st_ino}")
    name = f"{leftovers.owned_prefix('test')}".replace(f".{os.getpid()}-", f".{dead.pid}-") + "x"
    shm, tmp = Path("/dev/shm") / name, tmp_path / name
    for d in (shm, tmp):
        d.mkdir()
    try:
        assert leftovers.sweep_leftovers(("/dev/shm", str(tmp_path))) == [str(shm)]
        assert tmp.is_dir() and not shm.exists()
        # nor its pid namespace (every such process is <boot>.0): which container made a name cannot be told
        monkeypatch.setattr(leftovers, "owner", lambda: "abcdef01.0")
        name = leftovers.owned_prefix("test").replace(f".{os.getpid()}-", f".{dead.pid}-") + "y"
        (Path("/dev/shm") / name).mkdir()
        assert leftovers.sweep_leftovers(("/dev/shm",)) == [] and (Path("/dev/shm") / name).is_dir()
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(Path("/dev/shm") / name, ignore_errors=True)


@pytest.mark.mpi
def test_a_launcher_killed_with_9_leaves_a_folder_the_next_start_removes(tmp_path):
    """kill -9 gives the launcher no chance to remove its job's shared-memory folder: the job stops
    (the kernel's signal to mpirun) and the folder is removed by the next process that makes one."""
    import signal
    import time

    from mpippo import launch, leftovers
    env = {k: v for k, v in mpi_env().items() if k != leftovers.SHM_VAR}
    proc = subprocess.Popen([sys.executable, "-m", "mpippo.launch", "-n", "2", "--config", "configs/toy_cue.yaml",
                             "--no-progress", "--total-timesteps", "100000000", "--output-dir", str(tmp_path / "run")],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prefix = "/dev/shm/" + leftovers.owned_prefix("sm").replace(f".{os.getpid()}-", f".{proc.pid}-")
    deadline = time.monotonic() + 120
    while not (folder := next((str(p) for p in Path("/dev/shm").iterdir() if str(p).startswith(prefix)), None)):
        assert proc.poll() is None and time.monotonic() < deadline, "no shared-memory folder"
        time.sleep(0.05)
    while not (tmp_path / "run" / "benchmark_metrics.json").exists():  # training: its ranks use the folder
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert Path(folder).is_dir()
    while _ranks_of(tmp_path):  # its ranks checkpoint and stop on their own
        assert time.monotonic() < deadline + 60, "the job trained on after its launcher was killed"
        time.sleep(0.2)
    with launch.own_shm_folder({}):
        assert not Path(folder).exists()
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").is_file()


def test_a_rank_whose_mpirun_died_before_mpi_started_ends_instead_of_training_alone(tmp_path):
    """mpirun killed with -9 in its first moments: a rank it had started found no runtime, made a world of
    one and trained the whole budget alone (its output gone, the run folder locked). A rank whose world is
    not the size mpirun started it in (OMPI_COMM_WORLD_SIZE) ends in one line, its folders removed."""
    from conftest import run
    res = run([sys.executable, "run_mpi.py", "--config", "configs/toy_cue.yaml", "--no-progress", "--total-timesteps",
               "2048", "--output-dir", str(tmp_path / "run")], 60, env={"OMPI_COMM_WORLD_SIZE": "2"})
    assert res.returncode == 1 and res.stderr.splitlines() == [
        "mpippo: error: OMPI_COMM_WORLD_SIZE=2: mpirun started this rank as one of 2, but MPI made it a world of 1 "
        "(mpirun gone before MPI started? or a variable left from another job's environment: unset it); ending it"], \
        res.stderr[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.mpi
def test_the_ranks_of_a_bare_mpirun_keep_their_files_in_folders_the_next_start_removes(tmp_path):
    """Under a bare `mpirun` Open MPI put each rank's shared-memory file in /dev/shm itself, and a job
    killed with -9 (`kill -9 -- -<pgid>`, the OOM killer) left them there, named after a job id no later run could trace. Each rank now makes
    a folder named after itself before MPI starts: its file lands there, a job that ends removes its
    folders, and what a killed job left is removed by the next start (the next job's here; under the tests,
    another worker's launcher may come first). (Fresh ranks, not the tests' warm
    ones: the folders' names are the ranks' pids, which mpirun's children then are.)"""
    import contextlib
    import signal

    import psutil

    from conftest import MPIRUN, wait_until
    from mpippo import launch, leftovers
    env = {k: v for k, v in mpi_env().items() if k != leftovers.SHM_VAR}

    def job(run: str, steps: int) -> subprocess.Popen:
        return subprocess.Popen([MPIRUN, "--oversubscribe", "-n", "2", sys.executable, "run_mpi.py", "--config",
                                 "configs/toy_cue.yaml", "--no-progress", "--total-timesteps", str(steps),
                                 "--output-dir", str(tmp_path / run)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def folders(proc) -> tuple[list, set] | None:  # its two ranks and their folders, once MPI put a file in each
        ranks = launch.rank_processes(proc.pid)
        names = tuple(f"mpippo-sm-{leftovers.owner()}.{r.pid}-" for r in ranks)
        made = {p for p in Path("/dev/shm").iterdir() if p.name.startswith(names) and any(p.glob("sm_segment.*"))}
        return (ranks, made) if len(made) == 2 else None

    killed = ended = job("killed", 100_000_000)
    try:
        ranks, left = wait_until(lambda: folders(killed), "a file in each rank's folder", 120)
        os.killpg(killed.pid, signal.SIGKILL)  # mpirun and its ranks (a rank that sees mpirun die may still end well)
        killed.wait()
        assert not psutil.wait_procs(ranks, timeout=60)[1], "its ranks outlived the kill"
        ended = job("ended", 30_000)
        ranks, own = wait_until(lambda: folders(ended), "the next job's folders", 120)
        assert ended.wait(timeout=120) == 0, ended.stderr.read()[-2000:]
        assert not any(d.exists() for d in left | own)  # the killed job's, by the next start; its own, at its end
    finally:
        for proc in (killed, ended):  # (a failed test leaves no job training)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _ranks_of(run_dir: Path) -> list:
    import psutil
    out = []
    for p in psutil.process_iter():
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "run_mpi.py" in line and str(run_dir) in line:
            out.append(p)
    return out


def test_the_launcher_ends_an_mpirun_that_outlives_every_rank_it_started(capsys):
    """After a rank failed inside MPI_Init (OMPI_MCA_btl=nonsense), Open MPI's runtime waited forever
    (PMIX_ERR_UNREACH) with every rank gone, and the launcher with it, deaf to a stop. A stand-in mpirun
    here: one 'rank' (run_mpi.py in its command line, its rank in its environment) that lives a second,
    then the stand-in sleeps on. The launcher's watch ends its session and says so; a job whose ranks it
    never saw (on other nodes) is never judged."""
    from mpippo import launch
    rank = f'OMPI_COMM_WORLD_RANK=0 {sys.executable} -c "import time; time.sleep(3)" run_mpi.py & wait; sleep 600'
    hung = subprocess.Popen(["bash", "-c", rank], start_new_session=True)
    quiet = subprocess.Popen(["bash", "-c", "sleep 600"], start_new_session=True)
    try:
        watch, unseen = launch._Outlived(hung.pid), launch._Outlived(quiet.pid)
        watch.GRACE_S = unseen.GRACE_S = 1.0
        watch.LOOK_S = unseen.LOOK_S = 0.1  # (the rank is seen during its 3 s, however late bash starts it)
        deadline = time.monotonic() + 30
        while not watch.hung() and time.monotonic() < deadline:
            assert not unseen.hung()
            time.sleep(0.2)
        assert watch.seen and not unseen.seen and time.monotonic() < deadline
        assert watch.end(hung) == 1 and hung.returncode is not None
        assert "every rank of this job on this node has ended, but mpirun" in capsys.readouterr().err
        with pytest.raises(ProcessLookupError):
            os.killpg(hung.pid, 0)  # (the whole session: its sleep too)
    finally:
        for p in (hung, quiet):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_a_rank_whose_command_line_changes_is_still_a_rank_until_it_ends():
    """A rank is judged by its own end, not by what /proc shows of it later: a library that rewrites its
    title (setproctitle) had made a healthy job's ranks look gone, and its mpirun was ended 30 s later.
    A stand-in rank that replaces its command line after a second (exec) and lives 5 s more."""
    from mpippo import launch
    rank = "OMPI_COMM_WORLD_RANK=0 bash -c 'sleep 1; exec sleep 5' run_mpi.py & wait; sleep 600"
    job = subprocess.Popen(["bash", "-c", rank], start_new_session=True)
    try:
        watch = launch._Outlived(job.pid)
        watch.GRACE_S, watch.LOOK_S = 1.0, 0.1
        t0 = time.monotonic()
        while not watch.hung() and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        assert watch.seen and time.monotonic() - t0 > 5, "judged gone while the rank still ran"
        assert time.monotonic() - t0 < 30, "never judged after the rank ended"
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def test_a_tools_run_whose_mpirun_outlives_its_ranks_fails_in_one_line_not_after_its_timeout(tmp_path, monkeypatch):
    """The tools' run_trainer waited out its timeout (up to an hour) on the same hang; a watch beside it
    ends the job's session and the run's failure names why (the tools' line takes the last error line)."""
    from mpippo import launch
    rank = f'OMPI_COMM_WORLD_RANK=0 {sys.executable} -c "import time; time.sleep(3)" run_mpi.py & wait; sleep 600'
    monkeypatch.setattr(launch, "mpirun_command", lambda ranks, argv, threads=None: (["bash", "-c", rank], mpi_env()))
    monkeypatch.setattr(launch._Outlived, "GRACE_S", 1.0)
    monkeypatch.setattr(launch._Outlived, "LOOK_S", 0.1)
    t0 = time.monotonic()
    with pytest.raises(launch.TrainerError) as e:
        launch.run_trainer(1, [], tmp_path / "out", timeout=120)
    assert time.monotonic() - t0 < 60 and e.value.code != 0
    assert str(e.value).splitlines()[-1].startswith("mpippo: error: every rank of this job on this node has ended")
