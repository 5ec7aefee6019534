"""What the tools read and write when the input is hostile in ways a command line cannot show: JSON and
YAML numbers past Python's limits, names no encoding holds, a reader that goes away, files of one run
written over another's, a kept copy replaced halfway, a stop that must reach the runs a tool started.
Each test fails on the code before the fix it names (a traceback, a lost file, a run left training)."""
from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.append(str(ROOT / "analysis"))  # (after benchmarks/: both hold a parity.py and a peer_parity.py)

from mpippo import files, toolcli  # noqa: E402
from mpippo.config import UsageError, load_yaml, parse_override  # noqa: E402

def bench_parity():
    """benchmarks/parity.py under a name of its own: `import parity` may find analysis/parity.py, which
    another test of this process imported first."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_parity", ROOT / "benchmarks" / "parity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HUGE = "9" * 5000  # past the 4,300 digits Python parses into an int (its guard against quadratic time)


def test_a_json_number_past_pythons_limits_is_one_line(tmp_path):
    """A metrics file with an int of 5,000 digits (ValueError, not JSONDecodeError) or of 400 (parsed, then
    an OverflowError in the first float a reader makes) is refused naming the file and key."""
    (tmp_path / "run").mkdir()
    metrics = tmp_path / "run" / files.METRICS
    metrics.write_text('{"fps": ' + HUGE + "}")
    with pytest.raises(UsageError, match="not valid JSON \\(a number of more than 4,300 digits\\)"):
        files.read_metrics(tmp_path / "run")
    metrics.write_text(json.dumps({"fps": 10**400}))
    with pytest.raises(UsageError, match="fps: expected a number"):
        files.read_metrics(tmp_path / "run")
    metrics.write_text(json.dumps({"world_size": 2**63}))
    with pytest.raises(UsageError, match="world_size: expected a non-negative integer below 2\\*\\*63"):
        files.read_metrics(tmp_path / "run")
    assert files.is_number(float("nan")) and files.is_number(-(2**63 - 1)) and not files.is_number(True)
    assert files.is_count(2**63 - 1) and not files.is_count(-1) and not files.is_count(1.0)
    assert toolcli._mismatch(10**400, toolcli.NUMBER, "x") and toolcli._mismatch(2**64, toolcli.COUNT, "x")


@pytest.mark.parametrize("value, expect", [(HUGE, "a number of more than 4,300 digits"),
                                           ("2001-13-45", "a value it cannot read \\(month must be in 1..12\\)")])
def test_a_yaml_value_pyyaml_cannot_build_is_one_line(tmp_path, value, expect):
    """PyYAML raises ValueError (not YAMLError) for both; the trainer, evaluate and every tool read
    configs through these two."""
    path = tmp_path / "c.yaml"
    path.write_text(f"training:\n  seed: {value}\n")
    with pytest.raises(UsageError, match=f"malformed YAML in '{path}': {expect}"):
        load_yaml(path)
    with pytest.raises(UsageError, match=f"--set training.seed: {expect}"):
        parse_override(f"training.seed={value}")


def test_a_second_result_in_the_same_minute_gets_its_own_name(tmp_path, monkeypatch):
    """benchmarks/results/: the date's name, then the minute's, then the minute's with a count; a dangling
    link counts as taken (writing there would replace it). The old code wrote over the minute's result."""
    import types

    import results_file
    now = datetime.datetime(2026, 12, 3, 14, 5)
    monkeypatch.setattr(results_file, "datetime", types.SimpleNamespace(datetime=types.SimpleNamespace(now=lambda: now)))
    monkeypatch.setattr(results_file, "RESULTS", tmp_path)
    names = []
    for _ in range(3):
        names.append(results_file.result_path("-dqn").name)
        (tmp_path / names[-1]).write_text("{}")
    (tmp_path / "2026-12-03-1405-3-dqn.json").symlink_to(tmp_path / "missing")
    names.append(results_file.result_path("-dqn").name)
    assert names == ["2026-12-03-dqn.json", "2026-12-03-1405-dqn.json", "2026-12-03-1405-2-dqn.json",
                     "2026-12-03-1405-4-dqn.json"]
    assert results_file.result_path("-dqn", tmp_path / "given.json") == tmp_path / "given.json"


def test_a_kept_copy_is_never_lost_when_its_replacement_fails(tmp_path, monkeypatch):
    """benchmarks/parity.py's keep(): the new copy could not be put in place (the old code had removed the
    kept one first, and an undeletable file inside it made it lose both): the kept copy stays whole."""
    parity = bench_parity()
    monkeypatch.setattr(parity, "KEEP", tmp_path / "kept")
    run = tmp_path / "runs" / "coinrun-s1"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "curve.csv").write_text("new")
    for name in (files.METRICS, "config.yaml"):
        (run / name).write_text("new")
    kept = parity.keep(run)
    assert (kept / "logs" / "curve.csv").read_text() == "new"
    (run / "logs" / "curve.csv").write_text("newer")
    real = Path.rename

    def refuse(self, target):
        if Path(target) == kept and self.name.endswith(".new"):
            raise OSError(39, "Directory not empty")
        return real(self, target)
    monkeypatch.setattr(Path, "rename", refuse)
    with pytest.raises(toolcli.ToolFailure, match="failed \\(Directory not empty\\)"):
        parity.keep(run)
    assert (kept / "logs" / "curve.csv").read_text() == "new"  # the kept copy, back in its place
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept.name]  # neither the new nor the set-aside copy left
    monkeypatch.setattr(Path, "rename", real)
    assert (parity.keep(run) / "logs" / "curve.csv").read_text() == "newer"


# a launcher's stand-in: SIGTERM is its gentle stop (a checkpoint, exit 4), SIGINT after it its hard one
LAUNCHER = textwrap.dedent("""
    import signal, sys, time
    gentle = sys.argv[1] == "gentle"
    signal.signal(signal.SIGTERM, (lambda *_: sys.exit(4)) if gentle else signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    print("up", flush=True)
    time.sleep(60)
""")


def test_a_stopped_parity_tool_stops_its_runs(tmp_path):
    """benchmarks/parity.py stopped: each launcher it started gets its gentle stop and is waited for;
    one that does not end within the grace gets its hard one. The old code left them training."""
    parity = bench_parity()
    procs = [subprocess.Popen([sys.executable, "-c", LAUNCHER, kind], stdout=subprocess.PIPE, text=True)
             for kind in ("gentle", "deaf")]
    for p in procs:
        assert p.stdout.readline() == "up\n"
    t0 = time.monotonic()
    parity.stop_runs(procs, grace_s=2.0)
    assert [p.returncode for p in procs] == [4, -signal.SIGINT]  # the deaf one ended by SIGINT, its hard stop
    assert time.monotonic() - t0 < 20


def test_a_failed_component_measurement_says_why(tmp_path, monkeypatch):
    """benchmarks/ceiling.py: the measurement's own error line (the old code dropped its stderr and said
    only 'failed: <its command line>')."""
    import ceiling
    script = tmp_path / "components.py"
    script.write_text("import sys\nsys.exit('mpippo: error: components: --minibatch: 131072 is out of range')\n")
    monkeypatch.setattr(ceiling, "COMPONENTS", script)
    with pytest.raises(toolcli.ToolFailure, match="failed: mpippo: error: components: --minibatch: 131072 is out"):
        ceiling.components("fp32", "coinrun", 32, 131072, 1.0)


def test_a_tool_goes_on_when_its_reader_leaves_and_names_what_it_cannot_encode(tmp_path):
    """`tool 2>&1 | head -1`: the rest of the output, stdout's and stderr's, is dropped and the results
    are still written (a BrokenPipeError lost them); a name with a lone surrogate or an undecodable
    byte is printed and written as its escape (a UnicodeEncodeError after the work)."""
    out = tmp_path / "report.txt"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from mpippo import toolcli
        def main(argv):
            for i in range(20000):
                print("run\\udce9", i)
            for i in range(20000):
                print("note", i, file=sys.stderr)
            toolcli.write_text(__import__("pathlib").Path({str(out)!r}), "algo \\ud800\\n", "--out")
            return 0
        toolcli.exit_process(toolcli.run("t", main))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away
    note = proc.stderr.readline()
    proc.stderr.close()  # and stderr's (a traceback would be exit 1)
    assert proc.wait(timeout=60) == 0
    assert first == b"run\\udce9 0\n" and note == b"note 0\n" and out.read_bytes() == b"algo \\ud800\n"
    out.unlink()  # started with no stdout at all (`tool >&-`: sys.stdout is None), it runs as before
    closed = subprocess.run(["bash", "-c", f"{sys.executable} -c \"$0\" >&-", script], capture_output=True, text=True)
    assert closed.returncode == 0 and "Traceback" not in closed.stderr and out.exists(), closed.stderr
    refused = script.replace("return 0", "raise toolcli.UsageError('--out: bad')")  # and without stderr: still exit 2
    closed = subprocess.run(["bash", "-c", f"{sys.executable} -c \"$0\" 2>&-", refused], capture_output=True, text=True)
    assert closed.returncode == 2, closed.returncode


def test_a_closed_terminal_is_a_reader_gone_and_closed_descriptors_are_filled_first():
    """A hung-up terminal fails a write with EIO, not EPIPE: the stream is dropped alike (the trainer's
    next line after SIGHUP raised, read as a disk failure, exit 1). Descriptors 0-2 the process started
    without are /dev/null before any file is opened: the signal log's pipe took fd 2 and read the
    run's stderr as signals."""
    import errno as errno_

    from mpippo import errors

    class HungUp:
        def write(self, text):
            raise OSError(errno_.EIO, "Input/output error")

        def flush(self):
            raise OSError(errno_.EIO, "Input/output error")

        def fileno(self):
            return os.open(os.devnull, os.O_WRONLY)  # (a descriptor of its own, for _drop to replace)
    stream = errors.ReaderMayLeave(HungUp())
    assert stream.write("line\n") == 5
    stream.flush()
    script = ("import os, sys; from mpippo import errors, preemption; errors.let_readers_leave(); "
              "log = preemption.log_signals(); print('fds', log.r, signal_fd(), file=open(sys.argv[1], 'w'))")
    script = "import signal\ndef signal_fd():\n    fd = signal.set_wakeup_fd(-1)\n    signal.set_wakeup_fd(fd)\n" \
        "    return fd\n" + script.replace("; ", "\n")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"fds-{os.getpid()}.txt"
    try:
        res = subprocess.run(["bash", "-c", 'exec "$0" -c "$1" "$2" <&- >&- 2>&-', sys.executable, script, str(out)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        fds = [int(x) for x in out.read_text().split()[1:]]
    finally:
        out.unlink(missing_ok=True)
    assert res.returncode == 0 and min(fds) > 2, (res.returncode, fds)


def test_python_m_of_a_users_own_package_keeps_its_folder(tmp_path):
    """Only `python -m mpippo.<tool>` has the current folder replaced (a planted yaml.py): a user's
    `python -m theirs.train` whose package imports mpippo keeps its folder first, as Python gives it."""
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "__init__.py").write_text("import mpippo\n")
    (tmp_path / "theirs" / "train.py").write_text("import os, sys\nprint(sys.path[0] == os.getcwd())\n")
    res = subprocess.run([sys.executable, "-m", "theirs.train"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "True", res.stderr


@pytest.mark.parametrize("tool, args", [("appo_vs_ppo.py", ["--root", "runs", "--out", "out"]),
                                        ("cutoff_bench.py", ["--out", "cut.json"])])
def test_a_benchmark_started_in_another_folder_finds_its_default_configs(tmp_path, tool, args):
    """Their default configs are the repository's (the trainer runs in it), but they were looked for in the
    working folder first: started elsewhere, "config file not found: 'configs/...'". Here each gets to its
    check of the trainer's options with its default config, and refuses the env name given after it
    (gpu_check's dry run runs elsewhere too; peer_parity's configs are checked below)."""
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / tool), *args, "--env", "pong"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "unknown environment 'pong'" in res.stderr, res.stderr


def test_peer_paritys_trainer_options_name_configs_that_hold_from_any_folder():
    # benchmarks/peer_parity.py by its path: analysis/ holds a peer_parity.py too, which an earlier test in
    # this worker may have imported under that name
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_peer_parity", ROOT / "benchmarks" / "peer_parity.py")
    peer_parity = sys.modules["bench_peer_parity"] = importlib.util.module_from_spec(spec)  # (its dataclasses')
    spec.loader.exec_module(peer_parity)
    for fam in peer_parity.FAMILIES.values():
        for apex in (False, True) if fam.apex else (False,):
            argv = peer_parity.mpippo_argv(fam, "Pong", 1, 64, None, apex)
            config = Path(argv[argv.index("--config") + 1])
            assert config.is_absolute() and config.is_file(), config


def test_an_output_replaces_only_a_file_and_two_outputs_never_share_one(tmp_path):
    """An output is a new file renamed over its name: --json /dev/null (as root) had replaced the device
    with a file, and a link by that name (--json /dev/stdout) became a file; both are refused, naming
    what is there. Two outputs of one command naming one file: the later write had replaced the earlier."""
    with pytest.raises(UsageError, match="'/dev/null' is a character device, which the output would replace"):
        toolcli.output_file(Path("/dev/null"), "--json")
    (tmp_path / "d").mkdir()
    os.symlink(tmp_path / "d", tmp_path / "to-d")
    with pytest.raises(UsageError, match="to-d' is a symbolic link"):
        toolcli.output_file(tmp_path / "to-d", "--out")
    with pytest.raises(UsageError, match="d' is a folder, where --out writes the file d"):
        toolcli.output_folder(tmp_path, "--out", ("d",))
    (tmp_path / "r.json").write_text("{}")
    assert toolcli.output_file(tmp_path / "r.json", "--out") == tmp_path / "r.json"  # a file: replaced, as before
    toolcli.distinct_outputs((tmp_path / "a.json", "--out"), (None, "--video"), (tmp_path / "b.txt", "--table"))
    with pytest.raises(UsageError, match="--out and --table: both name"):
        toolcli.distinct_outputs((tmp_path / "a.json", "--out"), (tmp_path / "d" / ".." / "a.json", "--table"))


def test_a_figure_draws_text_no_font_encodes_and_refuses_values_past_its_range():
    """Every tool's figure goes through toolcli.render_figure: a run's name or algo holding a lone
    surrogate (read back from JSON) had failed in FreeType (TypeError); a value near float64's largest
    overflows matplotlib's axis limits (ValueError) or its transforms (a singular matrix): one line naming
    the output. (The metrics readers refuse such values first: NUMBER is at most float32's largest.)"""
    plt = toolcli.pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4], label="run\ud800 \udcff")
    ax.set_title("algo \ud800")
    ax.legend()
    assert toolcli.render_figure(fig, Path("f.png"), "--out").startswith(b"\x89PNG")
    fig, ax = plt.subplots()
    ax.plot([0.0, 1.7e308])
    with pytest.raises(UsageError, match="--out: 'f.png' cannot be drawn: a value the runs' files hold is past"):
        toolcli.render_figure(fig, Path("f.png"), "--out")
    assert files.is_number(3.4e38) and files.is_number(float("nan")) and not files.is_number(1.7e308)


def test_compare_draws_a_run_whose_folder_name_is_not_utf8(tmp_path, capsys):
    """compare's bar charts name their bars by the runs' folders: a category is drawn from its name when
    the figure is, not as a text set before, and an undecodable byte in it had failed in FreeType
    (a traceback after the table)."""
    import compare_results
    metrics = {"algo": "ppo", "env": "coinrun", "world_size": 1, "threads_per_rank": 1, "total_timesteps": 4096,
               "fps": 120.5, "duration_s": 34.0, "finished": True, "peak_rss_mb_total": 2500.0}
    run = tmp_path / "x\udcffname"  # (the byte 0xff, as Python names it)
    run.mkdir()
    (run / "benchmark_metrics.json").write_text(json.dumps(metrics))
    assert toolcli.run("compare_results", compare_results._main, [str(run), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "comparison.png").read_bytes().startswith(b"\x89PNG"), capsys.readouterr().err


def test_compare_warns_when_its_runs_train_different_envs_or_algorithms(tmp_path, capsys):
    """A speedup of an A2C run on toy-cue over a PPO run on a user's env divides different work: said."""
    import compare_results
    for name, algo, env in (("a", "ppo", "gym:qa/Corr-v0"), ("b", "a2c", "toy-cue"), ("c", "ppo", "gym:qa/Corr-v0")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "benchmark_metrics.json").write_text(json.dumps(
            {"algo": algo, "env": env, "world_size": 1, "threads_per_rank": 1, "total_timesteps": 4096, "fps": 120.5,
             "duration_s": 34.0, "finished": True, "peak_rss_mb_total": 2500.0}))
    out = tmp_path / "out"
    assert toolcli.run("compare_results", compare_results._main, [str(tmp_path / "a"), str(tmp_path / "b"), "--out",
                                                                  str(out)]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mpippo: warning:")]
    assert said == ["mpippo: warning: the runs train different envs (gym:qa/Corr-v0, toy-cue): speedup and efficiency "
                    "compare steps of different work", "mpippo: warning: the runs train different algorithms (a2c, ppo): "
                    "speedup and efficiency compare steps of different work"]
    assert said[0] in (out / "comparison_report.txt").read_text()
    assert toolcli.run("compare_results", compare_results._main, [str(tmp_path / "a"), str(tmp_path / "c"), "--out",
                                                                  str(out)]) == 0
    assert "warning:" not in capsys.readouterr().out


@pytest.fixture
def tool_signals():
    """toolcli.run installs the tools' stop handlers: this process's own, back after the test. Ctrl-C as
    a terminal gives it: a test process started in the background (`make test &`) has SIGINT ignored,
    which a tool keeps (nohup's rule), and the tests' tools would then not hear it."""
    old = {sig: signal.getsignal(sig) for sig in toolcli.STOP_SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for sig, handler in old.items():
        signal.signal(sig, handler)


def test_a_permission_refusal_anywhere_in_a_tool_is_one_line(capsys, tool_signals):
    """A folder this user may not search raises PermissionError from Path.exists() and friends, in any
    tool's code: one line naming the path, exit 2 (root never sees it; this is how a user does)."""
    def main(argv):
        raise PermissionError(13, "Permission denied", "/shared/runs/theirs")
    assert toolcli.run("t", main) == 2
    assert capsys.readouterr().err == ("mpippo: error: t: '/shared/runs/theirs': Permission denied "
                                       "(check its permissions and those of its folders)\n")

    def signal_someone(argv):  # (os.kill's refusal names no file)
        raise PermissionError(1, "Operation not permitted")
    assert toolcli.run("t", signal_someone) == 2
    assert capsys.readouterr().err == "mpippo: error: t: Operation not permitted (a permission this user lacks)\n"


def test_figures_show_names_as_written_and_refuse_more_rows_than_agg_renders(tmp_path):
    """A '$' in a run's name is a dollar, not mathtext ('$\\q$' failed the whole figure); more rows of panels
    than Agg renders (a data folder of hundreds of envs) is one line, not the renderer's failure after the work."""
    plt = toolcli.pyplot()
    fig, axes = toolcli.panels(plt, 5, 2, 2, "games")
    assert len(axes) == 5 and sum(ax.get_visible() for ax in fig.axes) == 5  # two rows of 4, three hidden
    axes[0].set_title("run$\\q$")
    toolcli.save_figure(fig, tmp_path / "f.png", "--out")
    assert (tmp_path / "f.png").stat().st_size > 0
    with pytest.raises(UsageError, match="21 games: the figure draws one panel each, at most 20"):
        toolcli.panels(plt, 21, 2, 100, "games", dpi=110)  # (6 rows of 100 inches at 110 dpi: 66,000 pixels)
    fig, axes = toolcli.panels(plt, 20, 2, 100, "games", dpi=110)
    assert len(axes) == 20


def test_a_sweep_with_null_counts_is_read_with_the_defaults(tmp_path):
    """sweep.json's Maybe fields (iterations, allreduce_bytes, allreduce_calls_per_iteration) as null:
    the defaults, as when absent (a TypeError before)."""
    import scaling_model
    sweep = json.loads((ROOT / "analysis" / "data" / "sample" / "sweep.json").read_text())
    for run in sweep["runs"]:
        run.update(iterations=None, allreduce_bytes=None, allreduce_calls_per_iteration=None)
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    s = scaling_model.load_sweep(tmp_path / "sweep.json")
    assert (s["iterations"] == 1).all() and s["allreduce_bytes"] > 0 and s["allreduce_calls"] == 24


def test_a_tool_takes_its_stop_handlers_back_after_a_users_code_set_its_own(tool_signals):
    """evaluate makes a user's envs, whose code may set its own handlers (SDL's start-up does):
    reclaim_stops puts the tool's back, so a stop is still one line and nothing half-written."""
    def main(argv):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the user's env, in the tool's process
        signal.signal(signal.SIGINT, signal.default_int_handler)
        toolcli.reclaim_stops()
        return 0 if all(signal.getsignal(s) is toolcli._raise_stopped for s in (signal.SIGTERM, signal.SIGINT)) else 1
    assert toolcli.run("t", main) == 0


def test_a_failure_a_limit_of_the_process_explains_names_it_and_no_other_does():
    """errors.limit_failure and os_reason (the abort hook's and every OS error's words): a thread that cannot
    start under `ulimit -u`, a file too large under `-f`, too many files under `-n`, memory under `-v`, each
    with the value and how to raise it (or that the hard limit is as low); the same errors without a
    limit set, and others, are left as they are (a traceback: maybe a bug)."""
    code = textwrap.dedent("""
        import errno, json, resource
        from mpippo.errors import limit_failure, os_reason
        INF = resource.RLIM_INFINITY
        said = {"no-limit-big": os_reason(OSError(errno.EFBIG, "File too large")),
                "no-limit-memory": limit_failure(MemoryError()), "other": limit_failure(RuntimeError("other"))}
        import os
        os.geteuid = lambda: 0  # (root: above ulimit -u, so it is not blamed)
        said["thread-no-limit"] = limit_failure(RuntimeError("can't start new thread"))
        resource.setrlimit(resource.RLIMIT_NPROC, (7, resource.getrlimit(resource.RLIMIT_NPROC)[1]))
        said["thread-root"] = limit_failure(RuntimeError("can't start new thread"))
        os.geteuid = lambda: 1000
        said["thread"] = limit_failure(RuntimeError("can't start new thread"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard := resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        said["files"], said["files-hard"] = limit_failure(OSError(errno.EMFILE, "Too many open files", "x.pt")), hard
        resource.setrlimit(resource.RLIMIT_FSIZE, (100 * 1024, 100 * 1024))
        said["big"] = os_reason(OSError(errno.EFBIG, "File too large"))
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, INF))
        said["memory"] = limit_failure(MemoryError())
        os.geteuid = lambda: 0
        said["thread-stacks"] = limit_failure(RuntimeError("can't start new thread"))
        said["mapped"] = limit_failure(ImportError("libtorch_cpu.so: failed to map segment from shared object"))
        print(json.dumps(said))
    """)
    said = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                     cwd=ROOT).stdout)
    assert said["no-limit-big"] == "File too large" and said["no-limit-memory"] is None and said["other"] is None
    assert said["thread"].startswith("cannot start a thread: this process's limit on this user's processes and "
                                     "threads (ulimit -u) is 7; raise it (ulimit -u "), said
    assert said["thread-no-limit"] == said["thread-root"] == ("cannot start a thread (the system is out of threads: "
                                                              "a cgroup pids.max?)"), said
    assert said["thread-stacks"].startswith("cannot start a thread: this process's virtual-memory limit (ulimit -v)"), said
    hard = "unlimited" if said["files-hard"] == -1 else said["files-hard"]
    assert said["files"] == ("'x.pt': Too many open files: this process's open-file limit (ulimit -n) is 64 files; "
                             f"raise it (ulimit -n {hard})"), said
    assert said["big"] == ("File too large: this process's file-size limit (ulimit -f) is 100 KiB, its hard limit "
                           "too: run it from a shell without that limit"), said
    assert said["memory"] == ("out of memory (MemoryError): this process's virtual-memory limit (ulimit -v) is "
                              "4194304 KiB; raise it (ulimit -v unlimited)"), said
    assert said["mapped"].startswith("out of memory (ImportError: libtorch_cpu.so: failed to map segment"), said


def test_an_output_is_refused_only_where_a_run_folder_holds_it(tmp_path):
    """toolcli.not_a_runs_own: a run folder (its config.yaml and one thing a trainer writes beside it) keeps
    its own files and subfolders; a project's own config.yaml, a folder of someone's checkpoints, a
    suite's folder with its lock, and a folder of the user's inside a run are no run's."""
    from mpippo import toolcli
    from mpippo.config import UsageError
    run, project = tmp_path / "runs" / "x", tmp_path / "project"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest.pt").write_text("a checkpoint")
    (run / "config.yaml").write_text("training:\n  seed: 1\n")
    (project / "checkpoints").mkdir(parents=True)
    (project / "config.yaml").write_text("hydra: {}\n")  # (no metrics, no lock, no latest.pt: no run's marks)
    (project / "checkpoints" / "model.pt").write_text("theirs")
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / ".mpippo.lock").write_text("[suite folder]")
    for refused in (run / "config.yaml", run / ".mpippo.lock", run / "logs" / "events.out.tfevents.1.vm",
                    run / "checkpoints" / "x.json", run / "agent_1" / "eval.json", run / "wandb" / "w.json"):
        with pytest.raises(UsageError, match="--json: .* (lies in|is the run's own)"):
            toolcli.not_a_runs_own(refused, "--json")
    (run / "config.yaml").unlink()  # (a folder with only checkpoints/ is no run's either)
    toolcli.not_a_runs_own(run / "checkpoints" / "x.json", "--json")
    (run / "config.yaml").write_text("training:\n  seed: 1\n")
    for allowed in (run / "eval.json", run / "videos" / "ep.mp4", project / "runs" / "y" / "eval.json",
                    project / "figs" / "curve.png", project / "checkpoints" / "out.json", tmp_path / "suite" / "m" / "r.png",
                    tmp_path / "runs" / "report.png"):
        toolcli.not_a_runs_own(allowed, "--json")


def test_a_missing_file_is_the_run_folders_going_only_where_that_folder_is_gone(tmp_path):
    """errors.folder_gone: a file of the run folder not found because the folder moved or was deleted gets
    the line that says so; any other missing file (a dataset an env reads, the folder still there) None."""
    from mpippo import errors
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    lost = FileNotFoundError(2, "No such file or directory", str(run / "logs" / "events.out.tfevents.1.vm"))
    try:
        assert errors.folder_gone(lost) is None  # (no run folder known: an API caller, a tool)
        errors.run_folder_is(run)
        assert errors.folder_gone(lost) is None  # (it is there)
        run.rename(tmp_path / "moved")
        said = errors.folder_gone(lost)
        assert said.startswith(f"the run folder '{run}' is gone: moved or deleted while the run used it"), said
        assert errors.folder_gone(FileNotFoundError(2, "No such file or directory", str(tmp_path / "data" / "x"))) is None
        assert errors.folder_gone(PermissionError(13, "Permission denied", str(run / "logs" / "x"))) is None
        run.mkdir()  # another folder at its path (a copy restored, a mkdir): not the run's, never written
        said = errors.folder_gone(lost)
        assert said.startswith(f"the run folder '{run}' was replaced: moved away, and another folder put at its path,")
        assert errors.run_folder_gone(run / "checkpoints" / "latest.pt")
        errors.run_folder_is(tmp_path / "elsewhere")  # a rank that cannot see it (node-local): no traceback
        assert errors.folder_gone(lost) is None  # (a file of another folder)
    finally:
        errors._RUN_FOLDER.clear()


def test_runs_of_one_name_in_two_folders_are_told_apart_by_their_folders():
    """A run and its copy, both 'run': compare_results and learning_curves had shown two rows and two legend
    entries alike. Each is named by as many parent folders as tell them apart; other names stay."""
    from mpippo.runs import Run, distinct_names
    runs = distinct_names([Run(Path("/s/a/x/run"), "run", {}), Run(Path("/s/b/x/run"), "run", {}),
                           Run(Path("/s/c"), "c", {}), Run(Path("/p/x/run/agent_0"), "run/agent_0", {}),
                           Run(Path("/q/x/run/agent_0"), "run/agent_0", {})])
    assert [r.name for r in runs] == ["a/x/run", "b/x/run", "c", "p/x/run/agent_0", "q/x/run/agent_0"]
