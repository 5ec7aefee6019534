"""Benchmark suites without Slurm or MPI: the suite file and its refusals, the members, their state
from metrics and logs, and the report's numbers against values computed here from the metrics files."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from mpippo.suite import report, spec, state

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
    assert sorted(big.games) == sorted(spec.PROCGEN_GAMES) and big.seeds == (1, 2, 3) and big.budget == 25_000_000
    assert len(big.members()) == 48
    tiny = spec.load("tiny", ROOT / "runs")  # a name under configs/suites/
    assert len(tiny.members()) == 2 * 2 * 2 and len(spec.load(ROOT / "configs/suites/mini.yaml").members()) == 3 * 2


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
    ({"games": ["starpilot", "pong"]}, "'pong' is not a Procgen game"),
    ({"games": ["starpilot", "starpilot"]}, "give each game once"),
    ({"seeds": [1, 1]}, "seeds: distinct integers"),
    ({"seeds": [1, "two"]}, "seeds: distinct integers"),
    ({"budget": 0}, "budget: must be >= 1"),
    ({"seeds": list(range(300))}, "1200 members (games x seeds x variants) is more than 1000"),
    ({"budget": "1M"}, "budget: expected int"),
    ({"ranks": True}, "ranks: expected int"),
    ({"time": "forever"}, "is not a Slurm time limit"),
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
    ({"games": [["starpilot"]]}, "is not a Procgen game"),
    ({"name": "tiny\n"}, "a folder name"),
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
                         (["run", str(TINY), "--max-parallel", "0", "--local", *root], "--max-parallel: must be >= 1"),
                         (["report", str(TINY), "--reps", "0", *root], "--reps: bootstrap resamples must be >= 1"),
                         (["frobnicate"], "invalid choice")):
        res = subprocess.run([sys.executable, "-m", "mpippo.suite", *argv], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


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
    from mpippo.suite import submit
    cases = {"30": 1800, "30:15": 1815, "2:00:00": 7200, "1-12": 129600, "1-00:30": 88200, "2-01:02:03": 176523}
    assert {k: submit.slurm_seconds(k) for k in cases} == cases
    s = spec.load(TINY, tmp_path)
    cmd = submit.sbatch_command(s, s.members()[2:4], tmp_path / "m.json", 3, ["--partition=x"])
    assert "--array=2,3%3" in cmd and f"--ntasks={s.ranks}" in cmd and "--time=00:20:00" in cmd
    assert "--signal=B:USR1@120" in cmd and cmd[-3] == "--partition=x" and cmd[-1] == str(tmp_path / "m.json")


def test_a_member_run_locally_now_is_running_and_a_stale_mark_is_ignored(tmp_path):
    s = spec.load(TINY, tmp_path)
    m, other = s.members()[0], s.members()[1]
    fake_member(m, 256, 1.0, finished=False)
    mark = state.LocalRun(m)
    mark.mark()  # this test's own process: alive
    fake_member(other, 256, 1.0, finished=False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    state.LocalRun(other).path.write_text(dead.stdout.strip())  # a process that has ended
    rows = {r["member"]: r["state"] for r in state.table(s)}
    assert rows[m.key] == "running" and rows[other.key] == "interrupted"  # trained, no checkpoint, not running
    from mpippo.suite import submit
    assert m.key not in {x.key for x in submit.todo(s)}  # a second run --local leaves it to the first
    mark.clear()
    assert {r["member"]: r["state"] for r in state.table(s)}[m.key] == "interrupted"
    assert m.key in {x.key for x in submit.todo(s)}
