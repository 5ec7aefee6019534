"""The batch scripts in slurm/, submitted with sbatch to a real local Slurm (tests/slurm/local_cluster.sh)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import MPIRUN, PYTHONPATH, ROOT, SMOKE_TOY, WARM_BASE, learner_line_by, metrics, ok, trainer, warm_python
from mpippo import leftovers

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
CLUSTER = ROOT / "tests" / "slurm" / "local_cluster.sh"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def _can_run_slurm() -> str | None:
    if os.geteuid() != 0:
        return "the local Slurm needs root (apt-get, daemons)"
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        return "no apt-get to install Slurm and slurmctld is not installed"
    return None


@pytest.fixture(scope="module")
def cluster():
    reason = _can_run_slurm()
    if reason:
        pytest.skip(reason)
    res = subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"local Slurm did not start:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    yield
    subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, text=True, timeout=120)


def job_env(run_dir: Path, **extra) -> dict:
    env = dict(os.environ)
    env.update(MPIPPO_ROOT=str(ROOT), MPIPPO_PYTHON=sys.executable, MPIPPO_RUN_DIR=str(run_dir),
               PYTHONPATH=PYTHONPATH, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               # the node claims 48 CPUs on a small machine: binding ranks to cores would stack them
               PRTE_MCA_hwloc_default_binding_policy="none")
    if (python := warm_python()) is not None:  # the jobs' ranks and tools warm (tests/warmstart.py)
        env.update(MPIPPO_PYTHON=python, MPIPPO_MPIRUN=MPIRUN, PYTHONUNBUFFERED=WARM_BASE["PYTHONUNBUFFERED"])
    env.update(extra)
    return env


def sbatch(script: str, sbatch_args: list[str], trainer_args: list[str], env: dict, out: Path) -> int:
    res = subprocess.run(["sbatch", "--parsable", f"--output={out}", *sbatch_args, f"slurm/{script}", *trainer_args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def poll(cmd: list[str]) -> subprocess.CompletedProcess | None:
    """One status query (scontrol, squeue) for a wait loop; None when it did not answer in 30 s: the loop
    asks again until its own deadline. (A 48-rank job starting on 2 cores once kept slurmctld's reply
    from a query 30 s: the test failed on the query, not on the job.)"""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None


def job_info(job: int) -> dict:
    res = poll(["scontrol", "show", "job", "-o", str(job)])
    return dict(re.findall(r"(\w+)=(\S*)", res.stdout)) if res is not None else {}


def wait_state(job: int, states: set[str], timeout: float, out: Path | None = None) -> dict:
    """Poll scontrol every second (sbatch --wait polls far more slowly)."""
    deadline = time.monotonic() + timeout
    info = {}
    while time.monotonic() < deadline:
        info = job_info(job) or info  # (a query that did not answer keeps the state last known)
        if info.get("JobState") in states:
            return info
        time.sleep(1)
    poll(["scancel", str(job)])
    log = out.read_text()[-3000:] if out is not None and out.exists() else ""
    pytest.fail(f"job {job} not in {states} after {timeout} s: {info.get('JobState')} {info.get('Reason')}\n{log}")


def wait_for_text(path: Path, text: str, timeout: float, after: str = "") -> None:
    """Wait until `text` is in the file at `path` (after the first `after`, when given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = path.read_text() if path.exists() else ""
        if after in log and text in log[log.index(after) + len(after):]:
            return
        time.sleep(0.5)
    pytest.fail(f"'{text}' never appeared{f' after {after!r}' if after else ''} in {path}:\n"
                f"{path.read_text()[-3000:] if path.exists() else ''}")


def latest(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)


def assert_same_params(a: dict, b: dict) -> None:
    assert a["timesteps"] == b["timesteps"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for p in a["optimizer"]["state"]:
        for k in a["optimizer"]["state"][p]:
            assert torch.equal(a["optimizer"]["state"][p][k], b["optimizer"]["state"][p][k]), k


def test_ppo_48core_script_completes_with_srun(cluster, tmp_path):
    """srun as the launcher (PMIx); mpirun, the default, is the 48-rank test's."""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    job = sbatch("ppo_48core.sh", ["--ntasks=2"], SMOKE_TOY, job_env(run_dir, MPIPPO_LAUNCHER="srun"), out)
    info = wait_state(job, FINAL, 300, out)
    assert info["JobState"] == "COMPLETED", out.read_text()[-3000:]
    m = metrics(run_dir)
    assert m["world_size"] == 2 and m["total_timesteps"] == 512 and m["finished"]
    assert "launcher srun" in out.read_text()
    assert_own_shm_folder_removed(out, job)


def assert_own_shm_folder_removed(out: Path, job: int) -> None:
    """A one-node job's shared-memory files are in a folder of its own (jobs on one node never meet on
    them), removed at the end."""
    shm = re.search(r"shared memory in (\S+)", out.read_text())
    assert shm and re.fullmatch(rf"/dev/shm/mpippo-sm-{re.escape(leftovers.owner())}\.\d+-job{job}\.\w+", shm[1]), out.read_text()[-2000:]
    assert not Path(shm[1]).exists()


def _left_by_a_killed_job() -> Path:
    """A one-node job's shared-memory folder as a job killed with -9 leaves it (its batch shell gone):
    named as slurm/common.sh names one, so the next job on the node removes it."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    folder = Path(f"/dev/shm/mpippo-sm-{leftovers.owner()}.{gone.pid}-job1.abcdef")
    folder.mkdir()
    (folder / "sm_segment.node.0.1.0").write_bytes(b"x")
    return folder


def test_ppo_48core_at_48_ranks(cluster, tmp_path):
    """The real layout, 48 ranks on this machine's 2 cores, with a tiny budget, launched by mpirun (the
    default). The env is toy-cue: procgen takes about 350 MB of memory per process on its own, so 48
    coinrun ranks need about 30 GB and were OOM-killed on the 24 GB test machine; 48 toy-cue ranks need
    about 15 GB. (A second mpirun job of 2 ranks proved nothing more: this one checks what it did.)"""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    left = _left_by_a_killed_job()
    # the default config's 64 envs, which 48 ranks do not divide: the script runs them as 2 per rank
    args = ["--config", "configs/toy_cue.yaml", "--set", "env.num_envs=64", "--n-steps", "16",
            "--total-timesteps", str(96 * 16), "--set", "training.num_minibatches=1",
            "--set", "training.n_epochs=1", "--set", "guards.collective_timeout_s=600"]
    t0 = time.monotonic()
    job = sbatch("ppo_48core.sh", [], args, job_env(run_dir), out)
    info = wait_state(job, FINAL, 900, out)
    assert info["JobState"] == "COMPLETED", out.read_text()[-3000:]
    assert not left.exists(), "the folder a killed job left is still there"
    m = metrics(run_dir)
    assert m["world_size"] == 48 and m["total_timesteps"] == 1536 and m["num_envs_per_rank"] == 2 and m["finished"]
    assert "launcher mpirun" in out.read_text()
    assert_own_shm_folder_removed(out, job)
    assert "env.num_envs 64 does not divide over 48 env-stepping rank(s): 2 per rank, 96 in all" in out.read_text()
    print(f"\n48 ranks: {time.monotonic() - t0:.0f} s from submit to completion, "
          f"peak memory {m['peak_rss_mb_total'] / 1024:.1f} GiB total, {max(m['peak_rss_mb_per_rank']):.0f} MB max per rank")


# toy-cue: the point is the node-range script's requeue onto fewer nodes and the re-sharded resume, which
# every env family takes alike (procgen's own re-sharding is test_reshard.py's); procgen's first env cost
# each of the job's 6 rank starts about 2 s of CPU
def test_node_range_job_runs_on_both_nodes_and_requeued_onto_one_continues_to_its_budget(cluster, tmp_path):
    """ppo_multinode.sh with a node range (--nodes=1-2, 2 tasks per node): it starts on both nodes
    (4 ranks over TCP); then one node is drained and the job requeued by USR1: it resumes on the
    one node it gets (2 ranks), its 8 games re-sharded, and ends on its exact budget."""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    budget = 6 * 256  # 6 iterations of 8 envs x 32 steps
    # rank 0 sleeps 2 s in each iteration from the 3rd: the USR1 sent after iteration 2 lands mid-run
    # even when slurmctld is slow to take the drain and the signal (it has answered in 30 s here)
    env = job_env(run_dir, OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,tcp",
                  MPIPPO_FAULT="rank=0,iteration=3,kind=slow,count=4,seconds=2")
    args = SMOKE_TOY + ["--total-timesteps", str(budget), "--set", "logging.print_interval=1"]
    job = sbatch("ppo_multinode.sh", ["--partition=multi", "--nodes=1-2", "--ntasks-per-node=2"], args, env, out)
    wait_for_text(out, "iter     2", 300)
    m = metrics(run_dir)
    assert m["world_size"] == 4 and sorted(set(m["nodes"])) == ["n1", "n2"], m["nodes"]
    subprocess.run(["scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=mpippo-test"], check=True, timeout=30)
    try:
        subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], check=True, timeout=30)
        info = wait_state(job, FINAL, 600, out)
    finally:
        subprocess.run(["scontrol", "update", "NodeName=n2", "State=RESUME"], timeout=30)
    log = out.read_text()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 1, log[-3000:]
    assert "restart 0 on n[1-2]: 4 tasks" in log and "restart 1 on n1: 2 tasks" in log, log[-3000:]
    assert "mpippo: note: resumed on 2 rank(s) from 4: " in log, log[-3000:]
    assert "8 env states (episodes in progress) carried over" in log
    m = metrics(run_dir)
    assert m["world_size"] == 2 and m["total_timesteps"] == budget and m["finished"], m
    assert latest(run_dir)["timesteps"] == budget


def test_requeued_by_usr1_then_preempted_resumes_to_the_exact_uninterrupted_result(cluster, tmp_path):
    """One job interrupted both ways a cluster does it, one after the other: USR1 to the batch script
    after iteration 2 (the script's own requeue), then, once it has resumed and trained on, preempted
    by a job in a higher-priority partition that needs the whole node (SIGTERM, then requeue). It ends
    on its budget with the parameters of the same run left alone. (One job for both ways: each requeue
    costs a job's start, and two jobs proved nothing one does not.) On toy-cue: what is under test is the
    script's requeue and the resume it makes, which every env family takes alike (procgen's exact resume
    is test_resilience.py's); starpilot's processes cost 60 s of CPU here, each loading every game's assets."""
    steps, ref_dir = 16 * 256, tmp_path / "uninterrupted"
    ok(trainer(2, SMOKE_TOY + ["--total-timesteps", str(steps), "--output-dir", str(ref_dir), "--no-progress",
                           "--set", "parallel.threads_per_rank=1"]))
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    args = SMOKE_TOY + ["--total-timesteps", str(steps), "--set", "logging.print_interval=1",
                    "--set", "checkpoint.interval_iterations=0"]
    # rank 0 sleeps 1 s in each of iterations 3-16 (counted over both restarts; no number changes): the
    # USR1 after iteration 2 and the preemption after the resume land mid-run on any machine (16
    # iterations take about 3 s on a Zen 5 core)
    job = sbatch("ppo_48core.sh", ["--ntasks=2"], args,
                 job_env(run_dir, MPIPPO_FAULT="rank=0,iteration=3,kind=slow,count=14,seconds=1"), out)
    wait_for_text(out, "iter     2", 240)
    subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], check=True, timeout=30)
    wait_for_text(out, "iter ", 300, after="resuming at")  # resumed, and trained an iteration more
    subprocess.run(["sbatch", "--parsable", "--partition=urgent", "--ntasks=48", "--output=/dev/null",
                    "--wrap", "sleep 2"], check=True, capture_output=True, timeout=60)
    info = wait_state(job, FINAL, 600, out)
    log = out.read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert int(info["Restarts"]) >= 2 and "restart 1" in log and "restart 2" in log, (info, log[-3000:])
    assert log.count("resuming at") >= 2, log[-3000:]
    state = latest(run_dir)
    assert state["timesteps"] == steps
    assert_same_params(latest(ref_dir), state)


# Atari in the GPU layouts: the Nature CNN on 84x84x4 frames of ale-py's Pong, shrunk to seconds
ATARI = ["--set", "env.name=atari:Pong", "--set", "logging.tensorboard=false", "--set", "training.precision=fp32"]


def test_ppo_6gpu_script_trains_atari_falling_back_to_cpu_on_fake_gpus(cluster, tmp_path):
    """One rank per GPU, PPO on Atari (configs/ppo_atari.yaml); the local node's GPUs are device
    files without CUDA: the ranks run on the CPU after one warning, and the job completes like the
    CPU scripts."""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    args = ["--config", "configs/ppo_atari.yaml", *ATARI, "--set", "env.num_envs=4", "--n-steps", "32",
            "--total-timesteps", "256"]
    job = sbatch("ppo_6gpu.sh", ["--ntasks-per-node=2", "--cpus-per-task=1"], args, job_env(run_dir), out)
    info = wait_state(job, FINAL, 300, out)
    log = out.read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert log.count("CUDA is not usable here") == 1 and "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5" in log, log[-3000:]
    m = metrics(run_dir)
    assert m["world_size"] == 2 and m["device_used"] == "cpu" and m["env_threads"] == 0 and m["finished"]
    assert m["env"] == "atari:Pong" and m["total_timesteps"] == 256


def test_dqn_6gpu_script_runs_ape_x_on_atari_learner_falling_back_to_cpu(cluster, tmp_path):
    """The Ape-X layout on Atari (configs/dqn_atari.yaml: one learner on the job's GPU, the rest actors)."""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    args = ["--config", "configs/dqn_atari.yaml", *ATARI, "--set", "env.num_envs=4", "--total-timesteps", "1200",
            "--set", "dqn.learning_starts=600", "--set", "dqn.batch_size=32", "--set", "dqn.buffer_size=2000"]
    job = sbatch("dqn_6gpu.sh", ["--ntasks=3"], args, job_env(run_dir), out)
    info = wait_state(job, FINAL, 300, out)
    log = out.read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert log.count("CUDA is not usable here") == 1 and "learner on cpu" in log
    m = metrics(run_dir)
    assert m["world_size"] == 3 and m["num_actors"] == 2 and m["env"] == "atari:Pong"
    assert m["transitions_sent"] == m["transitions_received"] >= 1024  # (n-step: each env's last 2 stay)


DQN_TINY = ["--config", "configs/dqn_toy.yaml", "--total-timesteps", "6000", "--set", "logging.tensorboard=false"]


def requeued_once(script: str, sbatch_args: list[str], args: list[str], run_dir: Path, out: Path, started: str,
                  env: dict) -> str:
    """Submit, send USR1 to the batch script once `started` is in the output, and wait for the
    job to finish after its requeue; its whole output. env: what the job adds (the pause that
    makes `started` come mid-run)."""
    job = sbatch(script, sbatch_args, args, job_env(run_dir, **env), out)
    wait_for_text(out, started, 300)
    subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], check=True, timeout=30)
    info = wait_state(job, FINAL, 600, out)
    log = out.read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert int(info["Restarts"]) >= 1 and "restart 1" in log, info
    return log


def test_dqn_6agents_script_requeues_and_each_agent_resumes_its_own_folder(cluster, tmp_path):
    """slurm/dqn_6agents.sh scaled to this machine: 2 agents x (1 learner + 1 actor) (6 agents, and
    then 3, took 3x and 1.5x the CPU for nothing more: the agents are alike, and two show that each
    keeps to its own folder), requeued by USR1 mid-run; every agent resumes in its own folder, its
    replay buffer included, and ends on its budget."""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    per_agent, agents = 8000, 2  # (about 220 updates: the pause at 100 is mid-run, the resumed part short)
    args = DQN_TINY + ["--total-timesteps", str(agents * per_agent), "--set", "dqn.save_replay=true",
                       "--set", f"dqn.num_agents={agents}"]
    # the learners (job ranks 0 and 2) pause at update 100 of about 220: a console line, then the USR1, mid-run
    log = requeued_once("dqn_6agents.sh", [f"--ntasks={2 * agents}"], args, run_dir, out, "agent 0 |",
                        learner_line_by(100, learners="0+2"))
    for k in range(agents):
        m = metrics(run_dir / f"agent_{k}")
        assert m["agent"] == k and m["num_actors"] == 1 and m["world_size"] == 2 * agents, m
        assert m["resumes"] >= 1 and m["total_timesteps"] == per_agent and m["stop_reason"] == "done", m
        assert f"agent {k}: resuming at" in log and m["transitions_sent"] == m["transitions_received"]


def test_appo_script_as_two_agents_requeues_and_each_resumes_to_its_exact_budget(cluster, tmp_path):
    """slurm/appo_6gpu.sh in its six-agent form, scaled to this machine: 2 agents x (1 learner +
    1 actor), a GPU each (fake here: the learners fall back to the CPU with one warning each),
    requeued by USR1 mid-run; every agent resumes in its own folder and ends on its budget. (Two
    actors per agent cost a third more rank starts and proved nothing more.)"""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    per_agent = 24576  # a small network: the layout and the requeue are the point, not learning
    args = ["--config", "configs/appo_toy.yaml", "--total-timesteps", str(2 * per_agent), "--set", "appo.num_agents=2",
            "--set", "training.device=auto", "--set", "logging.tensorboard=false", "--set", "model.channels=[4]",
            "--set", "model.hidden_size=16"]
    log = requeued_once("appo_6gpu.sh", ["--ntasks=4", "--gpus-per-node=2"], args, run_dir, out, "agent 1 |",
                        learner_line_by(20, learners="0+2"))  # (of 48 updates an agent)
    assert "learner on cpu" in log and "CUDA is not usable here" in log
    for k in range(2):
        m = metrics(run_dir / f"agent_{k}")
        assert m["algo"] == "appo" and m["agent"] == k and m["num_actors"] == 1 and m["world_size"] == 4, m
        assert m["resumes"] >= 1 and m["stop_reason"] == "done" and m["total_timesteps"] == per_agent, m
        assert f"agent {k}: resuming at" in log and m["transitions_sent"] == m["transitions_received"]


def test_impossible_request_fails_at_submit(cluster, tmp_path):
    res = subprocess.run(["sbatch", "--ntasks=49", "slurm/ppo_48core.sh"], cwd=ROOT, capture_output=True, text=True,
                         env=job_env(tmp_path / "run"), timeout=60)
    assert res.returncode != 0
    assert "Batch job submission failed: More processors requested than permitted" in res.stderr, res.stderr


def test_launcher_mistake_fails_loudly(cluster, tmp_path):
    """srun without PMIx starts N separate one-rank jobs: the trainer must refuse, not train N copies."""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    env = job_env(run_dir, MPIPPO_LAUNCHER="srun", MPIPPO_SRUN_MPI="none")
    job = sbatch("ppo_48core.sh", ["--ntasks=2"], SMOKE_TOY, env, out)
    info = wait_state(job, FINAL, 300, out)
    assert info["JobState"] == "FAILED"
    log = out.read_text()  # (both tasks refuse before either touches the folder: no race for its lock)
    assert "parallel.expected_world_size: 2 tasks were allocated but this job has 1 rank(s)" in log, log
    assert "is in use" not in log, log
    assert not (run_dir / "checkpoints" / "latest.pt").exists()


def suite_cmd(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpippo.suite", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def wait_array_gone(job: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = poll(["squeue", "-h", "-r", "-j", str(job)])
        if res is not None and res.returncode == 0 and not res.stdout.strip():
            return
        time.sleep(1)
    poll(["scancel", str(job)])
    pytest.fail(f"job array {job} still queued after {timeout} s")


def test_suite_job_array_requeues_a_preempted_member_and_resubmits_only_a_killed_one(cluster, tmp_path):
    """The tiny suite at one seed (2 games x 2 variants, a Procgen game and an Atari one) as one job
    array; one element preempted (USR1: checkpoint, requeue, resume) and one killed outright; a second
    `run` submits only the killed one; the report's normalized scores are the metrics files' returns
    on each family's scale (the Procgen paper's constants, Atari's human-normalized)."""
    import yaml

    from mpippo.suite import spec
    # every member's rank 0 sleeps 2 s in its iterations 2-4, so the signals sent at its first checkpoint
    # (iteration 1 of 8) land before it ends on any machine (scancel retries on a loaded one)
    env = job_env(tmp_path / "unused", MPIPPO_FAULT="rank=0,iteration=2,kind=slow,count=3,seconds=2")
    env.pop("MPIPPO_RUN_DIR")
    data = yaml.safe_load((ROOT / "configs" / "suites" / "tiny.yaml").read_text())
    tiny = tmp_path / "tiny.yaml"  # (a second seed: four more members that prove nothing more)
    tiny.write_text(yaml.safe_dump({**data, "seeds": [1], "games": ["starpilot", "atari:Pong"]}))
    suite = spec.load(tiny, tmp_path)
    first = suite_cmd("run", str(tiny), "--root", str(tmp_path), "--max-parallel", "2", env=env)
    assert first.returncode == 0 and "4 to submit" in first.stdout, first.stdout + first.stderr
    job = int(re.search(r"submitted job array (\d+)", first.stdout).group(1))
    preempted, killed = suite.members()[0], suite.members()[1]  # the first two elements to start
    # each signalled once it has trained an iteration (smoke: a checkpoint each); scancel runs in the
    # background: on a loaded machine it can take long and retry, and the other member must not wait
    how = {preempted.key: ["--signal=USR1", "--batch"], killed.key: ["--signal=KILL", "--full"]}
    sent, deadline = {}, time.monotonic() + 240
    while len(sent) < 2 and time.monotonic() < deadline:
        for m in (preempted, killed):
            if m.key not in sent and (m.folder / "checkpoints" / "latest.pt").is_file():
                sent[m.key] = subprocess.Popen(["scancel", *how[m.key], f"{job}_{m.index}"])
        time.sleep(0.1)
    assert len(sent) == 2, f"members did not start within 240 s: {sorted(sent)}"
    for proc in sent.values():
        proc.wait(timeout=180)
    wait_array_gone(job, 600)
    status = suite_cmd("status", str(tiny), "--root", str(tmp_path), env=env)
    rows = {line.split()[1]: line for line in status.stdout.splitlines() if line[:3].strip().isdigit()}
    assert "done" in rows[preempted.key] and "done" not in rows[killed.key], status.stdout
    assert "summary: 3 done" in status.stdout, status.stdout
    log = preempted.log.read_text()
    assert "requeueing" in log and "restart 1" in log and "resuming at" in log, log[-2000:]
    second = suite_cmd("run", str(tiny), "--root", str(tmp_path), env=env)
    assert "3 of 4 members done or queued; 1 to submit" in second.stdout, second.stdout + second.stderr
    sub = [json.loads(x) for x in (suite.folder / "submissions.jsonl").read_text().splitlines()][-1]
    assert sub["members"] == [killed.key]
    wait_array_gone(sub["job"], 300)
    rep = suite_cmd("report", str(tiny), "--root", str(tmp_path), "--reps", "200", env=env, timeout=300)
    assert rep.returncode == 0, rep.stderr
    r = json.loads((suite.folder / "report" / "report.json").read_text())
    bounds = {"starpilot": (2.5, 64), "atari:Pong": (-20.7, 14.6)}  # the paper's easy mode; random and human
    for row in r["members"]:
        m = json.loads((Path(row["folder"]) / "benchmark_metrics.json").read_text())
        lo, hi = bounds[row["game"]]
        assert m["finished"] and row["normalized"] == pytest.approx((m["episode_return_mean"] - lo) / (hi - lo))
    assert len(r["members"]) + len(r["missing"]) == 4 and not any("not done" in x for x in r["missing"])
    assert r["reference_drawn"] == {"starpilot": 1}  # the Procgen paper's curves: none for Atari
