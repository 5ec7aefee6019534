"""Benchmark suites without Slurm or MPI: the suite file and its refusals, the members, their state
from metrics and logs, and the report's numbers against values computed here from the metrics files."""
import json
import re
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import yaml

from mpippo.usage import UsageError
from mpippo.envs import procgen
from mpippo.suite import report, spec, state, submit

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "suites" / "tiny.yaml"


def write_suite(tmp_path, **changes) -> Path:
    data = yaml.safe_load(TINY.read_text())
    data.update(changes)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_suites_load_and_the_paper_suite_is_16_games_by_3_seeds():
    big = spec.load(ROOT / "configs/suites/procgen_easy_16.yaml")
    assert sorted(big.games) == sorted(procgen.GAMES) and big.seeds == (1, 2, 3) and big.budget == 25_000_000
    assert len(big.members()) == 48
    tiny = spec.load("tiny", ROOT / "runs")  # a name under configs/suites/
    assert len(tiny.members()) == 2 * 2 * 2 and len(spec.load(ROOT / "configs/suites/mini.yaml").members()) == 3 * 2 * 2


def test_the_gpu_suite_is_the_paper_suite_one_gpu_and_8_cores_per_member(tmp_path):
    """procgen_easy_16_gpu: the same games, seeds and budget, each member one rank on its GPU with 8
    CPUs (six fill a 48-core node with 6 GPUs), asked of Slurm on the array's line."""
    cpu, gpu = spec.load("procgen_easy_16", tmp_path), spec.load("procgen_easy_16_gpu", tmp_path)
    assert (gpu.games, gpu.seeds, gpu.budget) == (cpu.games, cpu.seeds, cpu.budget)
    assert (gpu.ranks, gpu.cpus_per_rank, gpu.gpus_per_rank) == (1, 8, 1)
    assert all("training.device=auto" in m.args for m in gpu.members()) and len(gpu.members()) == 48
    cmd = submit.sbatch_command(gpu, gpu.members(), tmp_path / "m.json", 6, [])
    assert {"--ntasks=1", "--cpus-per-task=8", "--gpus-per-task=1", "--nodes=1"} <= set(cmd)
    assert cmd[2] == "--array=" + ",".join(str(i) for i in range(48)) + "%6"


def test_members_have_stable_indices_folders_and_options(tmp_path):
    s = spec.load(TINY, tmp_path)
    ms = s.members()
    assert [m.index for m in ms] == list(range(8))
    m = ms[-1]
    assert m.key == "lr_high/bigfish/seed_2"
    assert m.folder == tmp_path.resolve() / "suites" / "tiny" / "lr_high" / "bigfish" / "seed_2"
    assert m.log.name == "seed_2.log" and m.log.parent == m.folder.parent
    args = list(m.args)
    assert args[args.index("--seed") + 1] == "2" and "training.learning_rate=0.002" in args
    assert args[args.index("--total-timesteps") + 1] == str(s.budget)


@pytest.mark.parametrize("change, needle", [
    ({"games": ["starpilot", "pong"]}, "'pong' is not an env name (allowed: bigfish, bossfight"),
    ({"games": ["starpilot", "procgen-starpilot-v0"]}, "give each game once"),
    ({"games": ["starpilot", "starpilot"]}, "give each game once"),
    ({"seeds": [1, 1]}, "seeds: distinct integers"),
    ({"seeds": [1, "two"]}, "seeds: distinct integers"),
    ({"seeds": [0, 2**31 - 1]}, "seeds: distinct integers in [0, 2^31 - 1)"),  # (2^31 - 1 had run as seed 0)
    ({"budget": 0}, "budget: must be >= 1"),
    ({"seeds": list(range(300))}, "1200 members (games x seeds x variants) is more than 1000"),
    ({"budget": "1M"}, "budget: expected int"),
    ({"ranks": True}, "ranks: expected int"),
    ({"time": "forever"}, "is not a Slurm time limit"),
    ({"time": "99:99:99"}, "is not a Slurm time limit"),
    ({"time": "1-25"}, "is not a Slurm time limit"),
    ({"ranks": 10**9}, "ranks: at most 100,000"),
    ({"cpus_per_rank": 10**30}, "cpus_per_rank: at most 4,096"),
    ({"variants": {"x": ["training.algo=appo", "appo.num_agents=2"]}, "ranks": 8, "budget": 10**6},
     "a suite member is one agent"),
    ({"distribution_mode": "medium"}, "is not one of easy, hard"),
    ({"name": "../escape"}, "a folder name"),
    ({"variants": {}}, "variants: at least one"),
    ({"variants": {"x": ["training.learning_rate=-1"]}}, "variants.x: training.learning_rate"),
    ({"variants": {"x": ["training.no_such_key=1"]}}, "variants.x:"),
    ({"variants": {"x": "training.learning_rate=0.1"}}, "a list of 'section.key=value' strings"),
    ({"base_config": "configs/missing.yaml"}, "base_config: 'configs/missing.yaml' is not a file"),
    ({"colour": "blue"}, "unknown key 'colour'"),
    ({"variants": {"hard": ["env.distribution_mode=hard"]}}, "env.distribution_mode is the suite's to set"),
    ({"variants": {"x": ["env.name=coinrun"]}}, "env.name is the suite's to set"),
    ({"seeds": [[1]]}, "seeds: distinct integers"),
    ({"games": [["starpilot"]]}, "is not an env name"),
    ({"name": "tiny\n"}, "a folder name"),
    # the batch script reads a member's options one a line: a line break in one made it two (or a folder)
    ({"variants": {"x": ["logging.wandb_project=a\n--output-dir\n/tmp/elsewhere"]}}, "holds a line break"),
    ({"variants": {"x": ["training.learning_rate=0.1\r"]}}, "holds a line break"),
])
def test_bad_suite_is_one_line_and_exit_2_before_anything_runs(tmp_path, change, needle):
    path = write_suite(tmp_path, **change)
    res = subprocess.run([sys.executable, "-m", "mpippo.suite", "run", str(path), "--root", str(tmp_path), "--local"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("mpippo: error:") and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "suites").exists()


def test_missing_suite_and_bad_options_are_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    root = ["--root", str(tmp_path)]
    for argv, needle in ((["status", "no_such_suite", *root], "no such file"),
                         (["run", str(TINY), "--local", "--root", str(tmp_path / "file")], "is not a folder"),
                         (["run", str(TINY), "--max-parallel", "0", "--local", *root], "--max-parallel: must be in 1..1000, got 0"),
                         (["report", str(TINY), "--reps", "0", *root], "--reps: bootstrap resamples must be in 1..100,000"),
                         (["frobnicate"], "invalid choice")):
        res = subprocess.run([sys.executable, "-m", "mpippo.suite", *argv], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_suite_started_from_another_folder_reads_the_repository_and_imports_nothing_there(tmp_path, monkeypatch):
    """The members run from the repository root: a suite's name and its base_config are found there, from
    whichever folder `python -m mpippo.suite` starts (they were looked up from the current folder, and a
    base_config only that folder held passed the check, to fail in every member). And `python -m` puts the
    current folder first on sys.path: a yaml.py there (a shared or run folder) ran in place of PyYAML."""
    (tmp_path / "yaml.py").write_text("raise SystemExit('planted yaml.py ran')\n")
    res = subprocess.run([sys.executable, "-m", "mpippo.suite", "status", "tiny", "--root", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "planted" not in res.stderr and "suite tiny:" in res.stdout, res.stderr
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text((ROOT / "configs/smoke.yaml").read_text())
    assert spec.load("tiny", tmp_path).config_file == ROOT / yaml.safe_load(TINY.read_text())["base_config"]
    with pytest.raises(UsageError, match="base_config: 'mine.yaml' is not a file \\(a relative path is from the "
                                         "repository root"):
        spec.load(write_suite(tmp_path, base_config="mine.yaml"), tmp_path)


def fake_member(m, steps, ret, finished=True, log=None):
    m.folder.mkdir(parents=True, exist_ok=True)
    (m.folder / "benchmark_metrics.json").write_text(json.dumps(
        {"finished": finished, "total_timesteps": steps, "episode_return_mean": ret}))
    if log is not None:
        m.log.write_text(log)


def test_state_reads_metrics_checkpoints_and_the_last_attempts_error(tmp_path):
    s = spec.load(TINY, tmp_path)
    ms = s.members()
    fake_member(ms[0], s.budget, 3.0)
    fake_member(ms[1], 256, 1.0, finished=False, log="mpippo: job 7 restart 0\nmpippo: error: training.x bad\n"
                "mpippo: trainer exited with status 1\n")
    fake_member(ms[2], 256, 1.0, finished=False, log="mpippo: job 7 restart 0\nmpippo: error: old problem\n"
                "mpippo: job 9 restart 1\niter 2\n")  # the error belongs to an earlier attempt
    (ms[2].folder / "checkpoints").mkdir()
    (ms[2].folder / "checkpoints" / "latest.pt").write_bytes(b"x")
    rows = {r["member"]: r for r in state.table(s)}
    assert rows[ms[0].key]["state"] == "done"
    assert rows[ms[1].key]["state"] == "failed" and rows[ms[1].key]["error"] == "mpippo: trainer exited with status 1"
    assert rows[ms[2].key]["state"] == "stopped" and rows[ms[3].key]["state"] == "not started"
    # a local attempt's closing line is not the start of another: its error still counts
    ms[3].log.write_text("mpippo: suite member default/bigfish/seed_2: -m mpippo.launch ...\n"
                         "mpippo: error: env.num_envs: bad\nmpippo: member default/bigfish/seed_2 exited with status 2\n")
    assert state.last_error(ms[3]) == "mpippo: member default/bigfish/seed_2 exited with status 2"
    ms[3].log.unlink()
    slurm_out = tmp_path / "3.out"
    slurm_out.write_text("slurmstepd: error: *** JOB 12 ON node CANCELLED AT 2026-11-26T10:00:00 ***\n")
    assert "CANCELLED" in state.last_error(ms[3], [slurm_out])


def test_report_scores_match_the_metrics_files(tmp_path):
    s = spec.load(TINY, tmp_path)
    rng = np.random.default_rng(0)
    returns = {m.key: float(rng.uniform(0, 30)) for m in s.members()}
    for m in s.members()[:-1]:
        fake_member(m, s.budget, returns[m.key])
    last = s.members()[-1]
    fake_member(last, s.budget // 2, 5.0, finished=False)  # a partial suite
    assert report.main(s, None, reps=200) == 0
    r = json.loads((s.folder / "report" / "report.json").read_text())
    bounds = {"starpilot": (2.5, 64), "bigfish": (1, 40)}  # the Procgen paper's easy-mode constants
    want = {k: (v - bounds[k.split("/")[1]][0]) / (bounds[k.split("/")[1]][1] - bounds[k.split("/")[1]][0])
            for k, v in returns.items() if k != last.key}
    got = {f"{x['variant']}/{x['game']}/seed_{x['seed']}": x["normalized"] for x in r["members"]}
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-12 for k in want)
    assert r["missing"] == [f"{last.key} (not done)"]
    # lr_high lacks a bigfish seed: the aggregate rectangle keeps 1 seed of it per game, default 2
    default = np.array([[want[f"default/{g}/seed_{i}"] for g in sorted(bounds)] for i in (1, 2)])
    from scipy.stats import trim_mean
    agg = r["aggregate"]["variants"]["default"]
    assert agg["mean"] == pytest.approx(default.mean()) and agg["iqm"] == pytest.approx(trim_mean(default.ravel(), 0.25))
    assert agg["iqm_ci"][0] <= agg["iqm"] <= agg["iqm_ci"][1]
    assert set(r["aggregate"]["probability_of_improvement"]) == {"default,lr_high"}
    assert r["reference_drawn"] == {"starpilot": 1, "bigfish": 1}  # the paper's first point, at 524,288 steps
    md = (s.folder / "report" / "report.md").read_text()
    assert "IQM" in md and "not done" in md and (s.folder / "report" / "curves.png").stat().st_size > 10_000


def test_per_game_lists_every_seed_its_mean_ci_and_the_tolerance_verdict():
    ref = {"fruitbot": (np.array([1e6, 2e6]), np.array([10.0, 20.0]), np.array([1.0, 1.0])),
           "bigfish": (np.array([1e6, 2e6]), np.array([2.0, 4.0]), np.array([0.1, 0.1]))}
    rows = [{"variant": "a", "game": "fruitbot", "seed": s, "steps": 1_000_000, "return": r, "normalized": 0.0}
            for s, r in ((2, 12.5), (1, 11.0))]
    rows += [{"variant": "a", "game": "bigfish", "seed": 1, "steps": 1_000_000, "return": 1.4, "normalized": 0.0}]
    games = {g["game"]: g for g in report.per_game(rows, ref, reps=500)}
    fb = games["fruitbot"]
    assert fb["per_seed"] == {"1": 11.0, "2": 12.5} and fb["mean"] == pytest.approx(11.75)
    assert 11.0 <= fb["ci"][0] <= fb["mean"] <= fb["ci"][1] <= 12.5
    assert fb["tolerance"] == 2.0 and fb["inside"]  # |11.75 - 10| <= 2 x 1.0
    big = games["bigfish"]
    assert big["tolerance"] == 0.5 and not big["inside"]  # at least 0.5: |1.4 - 2| > 0.5
    v = report.verdicts(list(games.values()))["a"]
    assert not v["every_game_inside"] and v["outside"] == ["bigfish 1.40 (paper 2.00 +- 0.50)"]


def test_members_trained_off_todays_default_are_marked(tmp_path):
    """A member whose learning settings differ from today's base config is named with the key; where,
    how long and how fast it ran (seed, budget, threads, logging) do not count."""
    s = spec.load(TINY, tmp_path)
    from mpippo import config as C
    base = C.build(C.load_yaml(s.base_config), [("training", "total_timesteps", s.budget)], s.ranks).to_dict()
    same = {**base, "training": {**base["training"], "seed": 7, "precision": "bf16"},
            "parallel": {**base["parallel"], "threads_per_rank": 3}}
    assert report.differs_from_default(s, same) == []
    other = {**base, "model": {**base["model"], "init": "other"}}
    assert report.differs_from_default(s, other) == [f"model.init: 'other' (today: {base['model']['init']!r})"]


def test_paper_value_interpolates_and_is_absent_before_its_first_sample():
    ref = report.reference("easy")
    steps, mean, _ = ref["starpilot"]
    assert report.paper_at(ref, "starpilot", int(steps[1]))[0] == pytest.approx(mean[1])
    mid = report.paper_at(ref, "starpilot", int((steps[1] + steps[2]) / 2))[0]
    assert mid == pytest.approx((mean[1] + mean[2]) / 2)
    assert report.paper_at(ref, "starpilot", 1000) == (None, None)


def test_a_variants_mean_curve_is_over_its_finished_seeds():
    """A seed stopped early must not cut the variant's mean curve short at its last step."""
    from mpippo.suite.figures import _seed_mean
    done = (np.array([0.0, 100.0, 200.0]), np.array([0.0, 1.0, 2.0]), True)
    stopped = (np.array([0.0, 50.0]), np.array([5.0, 5.0]), False)
    grid, avg, n = _seed_mean([done, stopped])
    assert n == 1 and grid[-1] == 200 and avg[-1] == 2.0
    grid, avg, n = _seed_mean([stopped, done[:2] + (False,)])  # none done yet: all, over their common range
    assert n == 2 and grid[-1] == 50 and avg[-1] == pytest.approx((5.0 + 0.5) / 2)


def test_the_report_names_the_scored_members_its_curves_cannot_draw(tmp_path):
    """A member scored from its metrics whose logs/ hold no return (event files lost) is named under the
    figure; one with a curve, and one not done (already listed as missing), are not."""
    from torch.utils.tensorboard import SummaryWriter
    from mpippo.metrics import tags
    s = spec.load(TINY, tmp_path)
    drawn, lost, young = s.members()[:3]
    for m in s.members():
        fake_member(m, s.budget if m.key != young.key else 256, 3.0, finished=m.key != young.key)
    with SummaryWriter(str(drawn.folder / "logs")) as w:
        for step in (256, 512):
            w.add_scalar(tags.chart("episode_return_mean"), 1.0, step)
    assert report.main(s, None, reps=50) == 0
    r = json.loads((s.folder / "report" / "report.json").read_text())
    want = [m.key for m in s.members() if m.key not in (drawn.key, young.key)]
    assert r["undrawn"] == want and lost.key in want
    md = (s.folder / "report" / "report.md").read_text()
    assert f"Not drawn: {len(want)} scored members whose logs/ hold no readable return points" in md
    assert drawn.key not in md.split("Not drawn:")[1].split("\n")[0]


def test_the_notebook_runs_the_report(tmp_path):
    import os

    import nbformat
    from nbclient import NotebookClient
    s = spec.load(TINY, tmp_path)
    for k, m in enumerate(s.members()):
        fake_member(m, s.budget, 3.0 + k)
    nb = nbformat.read(ROOT / "analysis" / "suite_report.ipynb", as_version=4)
    old = dict(os.environ)
    os.environ.update(MPIPPO_SUITE=str(TINY), MPIPPO_SUITE_ROOT=str(tmp_path), MPIPPO_REPS="100",
                      MPIPPO_ANALYSIS=str(ROOT / "analysis"))
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "analysis")}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "missing: none" in text and "image/png" in text
    assert (s.folder / "report" / "report.md").is_file()


def test_a_member_folder_without_a_checkpoint_is_set_aside_never_deleted(tmp_path):
    from mpippo.suite.submit import set_aside
    m = spec.load(TINY, tmp_path).members()[0]
    assert set_aside(m.folder) is None  # nothing there
    fake_member(m, 256, None, finished=False)
    aside = set_aside(m.folder)
    assert aside is not None and not m.folder.exists() and (aside / "benchmark_metrics.json").is_file()
    fake_member(m, 256, None, finished=False)
    (m.folder / "checkpoints").mkdir()
    (m.folder / "checkpoints" / "latest.pt").write_bytes(b"x")
    assert set_aside(m.folder) is None and m.folder.is_dir()  # a checkpoint: resumed, not moved


def test_slurm_time_limits_in_every_sbatch_format_and_the_array_line(tmp_path):
    cases = {"30": 1800, "30:15": 1815, "2:00:00": 7200, "1-12": 129600, "1-00:30": 88200, "2-01:02:03": 176523}
    assert {k: submit.slurm_seconds(k) for k in cases} == cases
    s = spec.load(TINY, tmp_path)
    cmd = submit.sbatch_command(s, s.members()[2:4], tmp_path / "m.json", 3, ["--partition=x"])
    assert "--array=2,3%3" in cmd and f"--ntasks={s.ranks}" in cmd and "--time=00:20:00" in cmd
    assert "--signal=B:USR1@120" in cmd and cmd[-3] == "--partition=x" and cmd[-1] == str(tmp_path / "m.json")


@contextmanager
def holding(folder: Path, what: str = "run folder"):
    """Another process that holds `folder`'s lock (runlock) until the block ends, as a trainer's rank 0 does."""
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; from mpippo import runlock; "
                             "runlock.acquire(sys.argv[1], sys.argv[2]); print('held', flush=True); time.sleep(300)",
                             str(folder), what], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_member_whose_folder_lock_is_held_is_running_and_not_run_again(tmp_path):
    """Running is the kernel's word (the folder's lock), not a pid file: a lock file whose holder
    has ended is nobody's, however it ended."""
    from mpippo.suite import submit
    s = spec.load(TINY, tmp_path)
    m = s.members()[0]
    fake_member(m, 256, 1.0, finished=False)
    with holding(m.folder) as holder:
        rows = {r["member"]: r["state"] for r in state.table(s)}
        assert rows[m.key] == "running" and f"process {holder.pid}" in state.running(m)
        elsewhere = []
        assert m.key not in {x.key for x in submit.todo(s, elsewhere)}  # a second writer is never started
        assert [(x.key, f"process {holder.pid}" in who) for x, who in elsewhere] == [(m.key, True)]
        with pytest.raises(spec.SuiteError, match="is in use"):
            submit.set_aside(m.folder)  # no checkpoint, but a live writer: never moved
        assert m.folder.is_dir()
    assert (m.folder / ".mpippo.lock").is_file() and state.running(m) is None  # killed: released by the kernel
    assert {r["member"]: r["state"] for r in state.table(s)}[m.key] == "interrupted"
    assert m.key in {x.key for x in submit.todo(s)}


def fake_config(s, m, **sets):
    """The config.yaml a trainer writes for member m, with `section.key=value` changes."""
    from mpippo import config as C
    changes = [("env", "name", m.game), ("env", "distribution_mode", s.distribution_mode), ("training", "seed", m.seed),
               ("training", "total_timesteps", s.budget)]
    changes += [tuple(k.split(".")) + (v,) for k, v in sets.items()]
    cfg = C.build(C.load_yaml(ROOT / s.base_config), changes, 1)
    m.folder.mkdir(parents=True, exist_ok=True)
    (m.folder / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def test_every_algorithms_finished_run_counts_as_done():
    """The actor-learner layout (APPO, DQN) writes stop_reason, not `finished`, and may end a few
    segments short of its target (measured: 2,816 of 3,000 steps, stop_reason done)."""
    m = spec.Member(0, "default", "starpilot", 1, Path("/nonexistent"), ())
    appo = {"algo": "appo", "stop_reason": "done", "total_timesteps": 2816, "target_timesteps": 3000}
    assert state.finished(m, 3000, appo)
    assert not state.finished(m, 3000, appo | {"stop_reason": "stopped"})
    assert not state.finished(m, 3000, appo | {"stop_reason": "failed"})
    assert not state.finished(m, 4000, appo)  # aimed at another budget
    ppo = {"finished": True, "stop_reason": "done", "total_timesteps": 3072, "target_timesteps": 3000}
    assert state.finished(m, 3000, ppo) and not state.finished(m, 3000, ppo | {"finished": False})
    assert state.finished(m, 3000, {"finished": True, "total_timesteps": 3072})  # before target_timesteps existed
    assert not state.finished(m, 3000, {"finished": True, "total_timesteps": 2048})
    assert not state.finished(m, 3000, {})


def test_a_folder_holding_another_run_is_a_mismatch_shown_by_status_and_refused_by_run_and_report(tmp_path):
    s = spec.load(TINY, tmp_path)
    ms = s.members()
    for m in ms[:6]:
        fake_config(s, m)
        fake_member(m, s.budget, 2.0)
    fake_config(s, ms[0], **{"env.name": "bigfish"})
    fake_config(s, ms[1], **{"training.seed": 7})
    fake_config(s, ms[2], **{"training.total_timesteps": 4096})
    fake_config(s, ms[3], **{"env.distribution_mode": "hard"})
    (ms[4].folder / "benchmark_metrics.json").write_text(json.dumps(
        {"finished": True, "total_timesteps": s.budget, "episode_return_mean": 2.0, "env": "starpilot", "algo": "dqn"}))
    want = {ms[0]: "holds a bigfish run, not starpilot (config.yaml)",
            ms[1]: "holds a run of seed 7, not 2 (config.yaml)",
            ms[2]: "holds a run to 4,096 steps, not the suite's budget of 2,048 (config.yaml)",
            ms[3]: "holds a hard-mode run, not easy (config.yaml)",
            ms[4]: "holds a dqn run, not ppo (what variant lr_high resolves to; benchmark_metrics.json)"}
    rows = {r["member"]: r for r in state.table(s)}
    for m, why in want.items():
        assert rows[m.key]["state"] == "mismatch" and why in rows[m.key]["error"], rows[m.key]
    assert rows[ms[5].key]["state"] == "done"
    with pytest.raises(spec.SuiteError) as e:
        state.check(s, ms[0])
    assert f"folder '{ms[0].folder}' holds a bigfish run, not starpilot" in str(e.value) and "move it away" in str(e.value)
    from mpippo.suite import submit
    with pytest.raises(spec.SuiteError, match="holds a bigfish run"):
        submit.todo(s)
    with pytest.raises(spec.SuiteError, match="holds a bigfish run"):
        report.collect(s)
    shutil.rmtree(ms[0].folder)
    ms[6].folder.parent.mkdir(parents=True, exist_ok=True)
    ms[6].folder.write_text("not a folder")
    assert {r["member"]: r for r in state.table(s)}[ms[6].key]["error"] == "folder is a file, not a run folder; move it away"


@pytest.mark.parametrize("content, needle", [
    (b"[1, 2]", "expected a JSON object at the top level, got [1, 2]"),
    (b"null", "expected a JSON object at the top level, got None"),
    (b'{"finished": true, "total_timesteps": "many"}', "total_timesteps: expected a non-negative integer, got 'many'"),
    (b'{"finished": "yes", "total_timesteps": 2048}', "finished: expected true or false, got 'yes'"),
    (b'{"episode_return_mean": "high"}', "episode_return_mean: expected a number, got 'high'"),
    (b'{"finished": \xff}', "not UTF-8 text (byte 0xff"),
    (b'{"finished": tru', "not valid JSON"),
])
def test_damaged_member_metrics_are_named_never_read_as_numbers(tmp_path, content, needle):
    s = spec.load(TINY, tmp_path)
    m = s.members()[0]
    m.folder.mkdir(parents=True)
    (m.folder / "benchmark_metrics.json").write_bytes(content)
    row = {r["member"]: r for r in state.table(s)}[m.key]
    assert row["state"] == "damaged" and needle in row["error"] and "benchmark_metrics.json" in row["error"], row
    with pytest.raises(spec.SuiteError, match="repair or move it away") as e:
        report.collect(s)
    assert needle in str(e.value)


@pytest.mark.parametrize("line, needle", [
    ("{not json", "not valid JSON (line 1"),
    ("[1, 2]", "line 1: expected a JSON object"),
    ('{"job": "12", "manifest": "m.json"}', "entry 1: expected a job id"),
    ('{"job": 12}', "entry 1: expected a job id"),
])
def test_damaged_submissions_and_manifests_are_one_line_naming_the_file(tmp_path, line, needle):
    s = spec.load(TINY, tmp_path)
    s.folder.mkdir(parents=True)
    (s.folder / "submissions.jsonl").write_text(line + "\n")
    with pytest.raises(spec.SuiteError if "entry" in needle else UsageError, match=re.escape(needle)):
        state.table(s)


def test_a_damaged_or_missing_manifest_is_named_with_its_job(tmp_path):
    s = spec.load(TINY, tmp_path)
    s.folder.mkdir(parents=True)
    manifest = s.folder / "manifest-1.json"
    (s.folder / "submissions.jsonl").write_text(json.dumps({"job": 12, "manifest": str(manifest), "members": []}) + "\n")
    for text, needle in ((None, "no such file"), ("[]", "expected a JSON object"),
                         ('{"0": {"key": "k"}}', "entry '0': expected"), ('{"x": {}}', "entry 'x': expected an array index")):
        if text is not None:
            manifest.write_text(text)
        with pytest.raises(spec.SuiteError) as e:
            state.table(s)
        assert needle in str(e.value) and "manifest-1.json" in str(e.value) and "job 12" in str(e.value), str(e.value)
    spec.write_manifest(manifest, s.members()[:2])
    assert spec.manifest_entry(manifest, 1)["key"] == s.members()[1].key
    with pytest.raises(spec.SuiteError, match="no member with array index 5"):
        spec.manifest_entry(manifest, 5)


class FakeLauncher:
    def __init__(self):
        self.sent = []
        self.returncode = None

    def send_signal(self, sig):
        self.sent.append(sig)


@pytest.mark.parametrize("signals, relayed", [
    ("TERM TERM TERM TERM", "TERM"),  # repeats keep the checkpoint-and-stop
    ("INT", "INT"),
    ("INT INT INT", "INT INT"),  # a second Ctrl-C: stop at once (and no more)
    ("TERM INT", "TERM"),
    ("TERM INT INT", "TERM INT"),
    ("USR1 USR1 TERM TERM", "USR1 TERM"),
])
def test_the_local_suite_relays_signals_as_the_launcher_reads_them(signals, relayed):
    """... and once it closes after a stop, repeats are ignored to the process's end (one after the
    member ended killed the suite, exit -15 instead of 4, in CI)."""
    from mpippo.suite.submit import Relay
    before = {sig: signal.getsignal(sig) for sig in Relay.SIGNALS}
    relay = Relay()
    try:
        launcher = FakeLauncher()
        relay.received.append(getattr(signal, f"SIG{signals.split()[0]}"))  # noted before the launcher existed
        relay.attach(launcher)
        for name in signals.split()[1:]:
            relay.received.append(getattr(signal, f"SIG{name}"))
            relay.dispatch()
        assert [signal.Signals(x).name[3:] for x in launcher.sent] == relayed.split()
        assert relay.code() == (3 if "USR1" in signals else 4)
    finally:
        relay.close(settle=True)
        after = {sig: signal.getsignal(sig) for sig in Relay.SIGNALS}
        for sig, old in before.items():  # (this test process's own, back)
            signal.signal(sig, old)
    assert set(after.values()) == {signal.SIG_IGN}


def test_a_local_suite_that_ends_without_a_signal_or_in_process_gives_its_handlers_back():
    from mpippo.suite.submit import Relay
    before = {sig: signal.getsignal(sig) for sig in Relay.SIGNALS}
    Relay().close(settle=True)  # no signal came
    assert {sig: signal.getsignal(sig) for sig in Relay.SIGNALS} == before
    relay = Relay()
    relay.received.append(signal.SIGTERM)
    relay.close()  # a stop, in a caller's process (not the suite's own): it stays stoppable
    assert {sig: signal.getsignal(sig) for sig in Relay.SIGNALS} == before


@pytest.mark.parametrize("err, code", [(28, 1), (13, 2)])  # ENOSPC: the disk's; EACCES: the user's to mend
def test_a_file_system_error_in_the_suite_is_one_line_exit_1_when_the_disk_is_full(monkeypatch, capsys, err, code):
    import os

    from mpippo.suite import __main__ as suite_main
    def fail(*a, **k):
        raise OSError(err, os.strerror(err), "/runs/suites/tiny/manifest.json")
    monkeypatch.setattr(suite_main.spec, "load", fail)
    assert suite_main.main(["status", "tiny"]) == code
    assert capsys.readouterr().err == f"mpippo: error: suite: '/runs/suites/tiny/manifest.json': {os.strerror(err)}\n"


def test_a_member_of_a_family_without_modes_matches_a_hard_suite(tmp_path):
    """A Gymnasium member of a hard-mode suite runs without env.distribution_mode (its family reads
    none; its config.yaml holds the default, easy): its folder is its run, not 'an easy-mode run'; a
    Procgen member's mode is still compared."""
    path = tmp_path / "mixed.yaml"
    path.write_text("name: mixed\nbase_config: configs/smoke.yaml\ngames: [gym:CartPole-v1, starpilot]\nseeds: [1]\n"
                    "budget: 2048\nranks: 1\ndistribution_mode: hard\nvariants:\n  default: []\n")
    s = spec.load(path, tmp_path)
    gym_member, procgen_member = sorted(s.members(), key=lambda m: m.game.startswith("gym:"), reverse=True)
    from mpippo import config as C
    for m, mode in ((gym_member, "easy"), (procgen_member, "easy")):
        cfg = C.build(C.load_yaml(ROOT / s.base_config), [("env", "name", m.game), ("training", "seed", m.seed),
                                                          ("training", "total_timesteps", s.budget)], 1)
        m.folder.mkdir(parents=True, exist_ok=True)
        (m.folder / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    assert state.mismatch(s, gym_member) is None
    assert state.mismatch(s, procgen_member) == "holds an easy-mode run, not hard (config.yaml)"
