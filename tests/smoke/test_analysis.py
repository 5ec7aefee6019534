"""Evaluate, compare and scaling tools on tiny real runs; the notebooks execute and write their figures."""
import json
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, error_lines, metrics, mpirun, ok, run, trainer

pytestmark = pytest.mark.slow

TINY = ["--config", "configs/smoke.yaml", "--set", "env.name=starpilot", "--no-progress"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A sequential and a parallel run of the same tiny job."""
    base = tmp_path_factory.mktemp("runs")
    seq, par = base / "seq", base / "par"
    ok(trainer(None, TINY + ["--total-timesteps", "1024", "--output-dir", str(seq), "--set", "env.num_levels=10"]))
    ok(trainer(2, TINY + ["--total-timesteps", "1024", "--output-dir", str(par), "--set", "env.num_levels=10"]))
    return seq, par


def evaluate(args, n=None, timeout=180):
    cmd = ["-m", "mpippo.evaluate"] + args
    return mpirun(n, cmd, timeout) if n else run([sys.executable] + cmd, timeout)


def test_evaluate_counts_episodes_writes_json_and_a_decodable_video(two_runs, tmp_path):
    seq, _ = two_runs
    out, video = tmp_path / "eval.json", tmp_path / "play.mp4"
    res = ok(evaluate(["--checkpoint", str(seq), "--num-episodes", "6", "--num-envs", "3", "--json", str(out),
                       "--video", str(video), "--video-episodes", "1"]))
    r = json.loads(out.read_text())
    for key in ("return_mean", "return_std", "return_median", "length_mean", "episodes", "levels", "video_frames"):
        assert key in r, key
    assert r["episodes"] == 6 and r["levels"] == "train" and r["num_levels"] == 10
    assert r["return_min"] <= r["return_median"] <= r["return_max"]
    assert "return" in res.stdout and "episodes" in res.stdout

    import imageio.v2 as imageio
    reader = imageio.get_reader(video)
    frames = [f for f in reader]
    reader.close()
    assert len(frames) == r["video_frames"] > 10
    assert frames[0].shape == (256, 256, 3)  # 64x64 procgen frames scaled x4
    assert np.asarray(frames).std() > 1.0  # real pictures, not a blank clip


def test_evaluate_splits_episodes_over_ranks_and_plays_unseen_levels(two_runs, tmp_path):
    _, par = two_runs
    out = tmp_path / "eval.json"
    ok(evaluate(["--checkpoint", str(par / "checkpoints" / "latest.pt"), "--num-episodes", "5", "--levels", "test",
                 "--deterministic", "--json", str(out)], n=2))
    r = json.loads(out.read_text())
    assert r["episodes"] == 5 and r["ranks"] == 2
    assert (r["levels"], r["num_levels"], r["start_level"]) == ("test", 0, 10) and r["deterministic"]


def test_a_two_rank_evaluate_plays_the_checkpoint_rank_0_read(two_runs, tmp_path):
    """Each rank had read the checkpoint itself: under a live run that replaces latest.pt, or on nodes that
    see different files at one path, the ranks played different checkpoints in one result. Here the same
    relative --checkpoint names a good run for rank 0 (its working folder a) and a damaged file for rank 1
    (b): rank 1 had refused it (exit 2); now rank 0 reads it for both."""
    from conftest import MPIRUN
    _, par = two_runs
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run").symlink_to(par)
    (tmp_path / "b" / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "b" / "run" / "checkpoints" / "latest.pt").write_bytes(b"not a checkpoint")
    out = tmp_path / "eval.json"
    args = ["-m", "mpippo.evaluate", "--checkpoint", "run", "--num-episodes", "4", "--json", str(out)]
    ok(run([MPIRUN, "--oversubscribe", "-n", "1", "--wdir", str(tmp_path / "a"), sys.executable, *args, ":",
            "-n", "1", "--wdir", str(tmp_path / "b"), sys.executable, *args], 180))
    r = json.loads(out.read_text())
    assert r["episodes"] == 4 and r["ranks"] == 2 and r["trained_timesteps"] == metrics(par)["total_timesteps"]
    # a rank that refuses its options (here its own MPIPPO_FAULT, a test hook each node may set) is agreed on
    # before rank 0 sends the checkpoint: the ranks had met in different collectives, held till the watchdog
    here = ["--wdir", str(tmp_path / "a")]
    res = run([MPIRUN, "--oversubscribe", "-n", "1", *here, sys.executable, *args, ":", "-n", "1", *here, "env",
               "MPIPPO_FAULT=rank=1,kind=nonsense", sys.executable, *args], 120)
    said = error_lines(res.stderr)
    assert res.returncode == 2 and len(said) == 1 and "MPIPPO_FAULT" in said[0], res.stderr[-2000:]


def test_evaluate_whose_console_is_on_a_full_disk_still_writes_its_json(two_runs, tmp_path):
    """`evaluate ... --json r.json > log` on a full disk: the table's first line had ended it, exit 1, and the
    JSON (on another disk) was never written; now it is, and the last line says the console was lost."""
    import subprocess
    seq, _ = two_runs
    out = tmp_path / "eval.json"
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(seq), "--num-episodes",
                              "2", "--json", str(out)], cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True,
                             timeout=180)
    assert res.returncode == 1 and "its console (stdout) could not be written" in res.stderr, res.stderr[-2000:]
    assert json.loads(out.read_text())["episodes"] == 2


def test_evaluate_under_a_c_locale_writes_a_non_ascii_paths_own_text(two_runs, tmp_path):
    """LC_ALL=C without UTF-8 mode: Python holds a UTF-8 name's bytes as lone surrogates, which went into the
    JSON as such ("\\udcc3\\udcbc": no reader could open that path). Its bytes read as UTF-8 now."""
    seq, _ = two_runs
    (tmp_path / "r\u00fcn").symlink_to(seq)
    out = tmp_path / "eval.json"
    c_locale = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    ok(run([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(tmp_path / "r\u00fcn"), "--num-episodes",
            "2", "--json", str(out)], 180, env=c_locale))
    written = json.loads(out.read_text(encoding="utf-8"))["checkpoint"]
    assert written.startswith(str(tmp_path / "r\u00fcn")), written


def test_evaluate_whose_episodes_outlast_max_steps_says_so_and_writes_nothing(two_runs, tmp_path):
    seq, _ = two_runs  # starpilot's episodes last far more than 3 steps
    out = tmp_path / "eval.json"
    res = evaluate(["--checkpoint", str(seq), "--num-episodes", "4", "--num-envs", "2", "--max-steps", "3",
                    "--json", str(out), "--video", str(tmp_path / "v.mp4")])
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("mpippo: error:")]
    assert res.returncode == 1 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "of 4 episodes ended within --max-steps 3" in lines[0] and "episodes per env (2)" in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # no JSON, no video, no half-encoded file


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_evaluate_stopped_mid_video_says_so_in_one_line_and_leaves_no_file(two_runs, tmp_path, sig):
    """A stop signal (twice: a person's second Ctrl-C) while the video is being encoded: one line, exit 4,
    no traceback, and neither the video nor its temporary file (Ctrl-C was a traceback, exit 1)."""
    import signal
    import subprocess
    import time
    seq, _ = two_runs
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "mpippo.evaluate", "--checkpoint", str(seq), "--num-episodes",
                             "100000", "--num-envs", "1", "--video", str(out / "v.mp4"), "--video-episodes", "100"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (not ignored)
    deadline = time.monotonic() + 120
    while not (out.is_dir() and any(out.iterdir())):  # the video's temporary file: frames are being encoded
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    for _ in range(2):
        proc.send_signal(getattr(signal, sig))
        time.sleep(0.2)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 4 and "Traceback" not in stderr, (proc.returncode, stderr[-2000:])
    assert [ln for ln in stderr.splitlines() if ln.startswith("mpippo:")] == [
        f"mpippo: evaluate: stopped by {'Ctrl-C' if sig == 'SIGINT' else sig}; nothing it started is left running "
        f"and its temporary folders are removed"], stderr
    assert list(out.iterdir()) == []


def test_evaluate_bad_checkpoint_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"garbage")
    for path in (bad, tmp_path / "missing.pt"):
        res = evaluate(["--checkpoint", str(path)])
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith("mpippo: error:")]
        assert res.returncode == 2 and len(lines) == 1 and str(path) in lines[0], res.stderr


def test_compare_results_table_equals_the_runs_metrics(two_runs, tmp_path):
    seq, par = two_runs
    sys.path.insert(0, str(ROOT / "analysis"))
    import compare_results
    from mpippo.runs import load_runs
    runs = load_runs(seq) + load_runs(par)
    _, rows = compare_results.table(runs)
    ms, mp = metrics(seq), metrics(par)
    assert rows[0]["steps_per_s"] == ms["fps_steady"] and rows[1]["steps_per_s"] == mp["fps_steady"]
    assert rows[1]["speedup"] == pytest.approx(mp["fps_steady"] / ms["fps_steady"])
    assert [x["cores"] for x in rows] == [m["world_size"] * m["threads_per_rank"] for m in (ms, mp)]
    assert rows[1]["efficiency"] == pytest.approx(rows[1]["speedup"] / (rows[1]["cores"] / rows[0]["cores"]))
    assert rows[0]["timesteps"] == ms["total_timesteps"] and rows[1]["peak_memory_mb"] == mp["peak_rss_mb_total"]
    assert rows[1]["final_return"] is not None

    out = tmp_path / "cmp"
    res = ok(run([sys.executable, "analysis/compare_results.py", "--sequential", str(seq), "--parallel", str(par),
                  "--out", str(out)], 120))
    assert (out / "comparison.png").stat().st_size > 10_000
    report = (out / "comparison_report.txt").read_text()
    assert f"{mp['fps_steady']:.1f}" in report and "speedup" in res.stdout
    assert f"slowest/mean busy time p50 {mp['straggler_spread']['p50']:.3f}" in report  # the 2-rank run's stragglers

    res = run([sys.executable, "analysis/compare_results.py", str(seq), str(tmp_path), "--out", str(out)], 60)
    assert res.returncode == 2 and "is not an mpippo run folder" in res.stderr


def execute_notebook(name: str, env: dict):
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(ROOT / "analysis" / name, as_version=4)
    old = dict(os.environ)
    os.environ.update(env, MPIPPO_ANALYSIS=str(ROOT / "analysis"))
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "analysis")}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return nb


def test_scaling_sweep_then_the_scaling_notebook_runs_and_writes_figures(tmp_path):
    sweep_dir, figures = tmp_path / "sweep", tmp_path / "figures"
    res = ok(run([sys.executable, "analysis/scaling_sweep.py", "--ranks", "1", "2", "--mode", "weak",
                  "--envs-per-rank", "4", "--n-steps", "32", "--total-timesteps", "256", "--out", str(sweep_dir),
                  "--", "--set", "env.name=toy-cue", "--set", "training.num_minibatches=2"], 300))
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert [m["world_size"] for m in sweep["runs"]] == [1, 2]
    assert all(m["total_timesteps"] == 256 * m["world_size"] for m in sweep["runs"])  # weak: budget per rank
    assert (sweep_dir / "sweep.csv").read_text().count("\n") == 3 and "[2/2]" in res.stdout
    nb = execute_notebook("scaling.ipynb", {"MPIPPO_SWEEP": str(sweep_dir / "sweep.json"), "MPIPPO_FIGURES": str(figures)})
    for png in ("scaling_speedup.png", "scaling_phases.png", "scaling_stragglers.png", "scaling_projection.png",
                "scaling_stragglers_projection.png"):
        assert (figures / png).stat().st_size > 5_000, png
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "Karp-Flatt" in text and "480" in text
    assert "this sweep's 2-rank run" in text and "one node 30% slower + stragglers" in text  # its own stragglers


def test_shipped_sample_data_runs_both_notebooks(two_runs, tmp_path):
    seq, par = two_runs
    execute_notebook("scaling.ipynb", {"MPIPPO_FIGURES": str(tmp_path)})  # analysis/data/sample/sweep.json
    assert (tmp_path / "scaling_projection.png").exists()
    execute_notebook("learning_curves.ipynb", {"MPIPPO_RUNS": f"{seq}:{par}", "MPIPPO_FIGURES": str(tmp_path)})
    assert (tmp_path / "learning_curves.png").stat().st_size > 10_000


def test_peer_parity_tabulates_both_sides_and_says_when_one_is_missing(tmp_path):
    """analysis/peer_parity.py on runs as benchmarks/peer_parity.py writes them: mpippo logs the mean of
    the last 100 episodes, CleanRL every episode (averaged here); the verdict is mpippo's mean seed
    inside or above CleanRL's range; an env with one side only says so, with no made-up rate; mpippo's
    Ape-X runs and its runs on another rank count get tables of their own."""
    def side(who, env, seed, ret, rate):
        return {"who": who, "env": env, "seed": seed, "budget": 3000, "wall_s": 1.0, "steps_per_s": rate,
                "final_return": ret, "episodes": 3}
    runs = {"mpippo-Pong-s1": side("mpippo", "Pong", 1, -5.0, 300.0), "mpippo-Pong-s2": side("mpippo", "Pong", 2, 1.0, 320.0),
            "cleanrl-Pong-s1": side("cleanrl", "Pong", 1, -10.0, 200.0), "cleanrl-Pong-s2": side("cleanrl", "Pong", 2, 0.0, 220.0),
            "mpippo-Breakout-s1": side("mpippo", "Breakout", 1, 12.0, 310.0), "apex-Pong-s1": side("apex", "Pong", 1, 5.5, 150.0),
            "mpippo-Pong-s1-1rank": dict(side("mpippo", "Pong", 1, 3.0, 250.0), ranks=1)}
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    for name, r in runs.items():
        column = "episode_return" if r["who"] == "cleanrl" else "return_mean_100"
        (tmp_path / f"{name}.csv").write_text(f"env_steps,{column}\n1000,-21\n3000,{r['final_return']}\n")
    ok(run([sys.executable, "analysis/peer_parity.py", "--data", str(tmp_path)], timeout=120))
    rows = {r["env"]: r for r in json.loads((tmp_path / f"{tmp_path.name}.json").read_text())}
    assert rows["Pong"]["inside_or_above"] is True and rows["Pong"]["ratio"] == pytest.approx(310 / 210)
    assert rows["Breakout"]["cleanrl"] == [] and rows["Breakout"]["ratio"] is None
    md = (tmp_path / f"{tmp_path.name}.md").read_text()
    assert "| Breakout | 12.0 | 12.0 | - | - | (a side has no runs) | 310 / - |" in md
    assert rows["Pong"]["apex"] == [5.5] and "apex" not in rows["Breakout"]
    assert "| Ape-X DQN (seeds) | mean | steps/s |" in md and "| Pong | 5.5 | 5.5 | 150 |" in md
    # a run on one rank (--ranks 1) is a layout beside the comparison: its own table, not a third mpippo seed
    assert rows["Pong"]["mpippo"] == [-5.0, 1.0] and rows["Pong"]["mpippo@1"] == [3.0]
    assert "| env | mpippo, 1 rank (seeds) | mean | steps/s |" in md and "| Pong | 3.0 | 3.0 | 250 |" in md
    # each run at a quarter, half, three quarters and all of its budget (CleanRL's: the mean of its episodes so far)
    assert "| mpippo-Pong-s1 | - | -21.0 | -21.0 | -5.0 |" in md and "| cleanrl-Pong-s1 | - | -21.0 | -21.0 | -15.5 |" in md
    assert (tmp_path / f"{tmp_path.name}.png").stat().st_size > 10_000
