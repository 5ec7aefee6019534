"""Hostile inputs to the tools a user types (analysis/*.py, benchmarks/*.py, `make gpu-check`,
`mpippo.evaluate --seed`): every one is one `mpippo: error: <tool>: ...` line naming the value or
file, exit 2, no traceback, no hang, nothing that existed changed and nothing new left behind.

Each case is one short process that must fail before any training: damaged runs are fake run
folders written here (a benchmark_metrics.json and a config.yaml), never trained. Case ids read
<tool>-<class>-<what>; test_every_tool_meets_every_class checks the table's coverage.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

import hostile
from hostile import Case

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "analysis"))

# a plausible finished PPO run's metrics and config (what the tools read of them)
GOOD = {"algo": "ppo", "env": "coinrun", "world_size": 2, "threads_per_rank": 1, "total_timesteps": 4096,
        "target_timesteps": 4096, "fps": 120.5, "fps_steady": 125.0, "duration_s": 34.0, "finished": True,
        "stop_reason": "done", "peak_rss_mb_total": 2500.0, "episode_return_mean": 5.5}
CONFIG = "env:\n  name: coinrun\ntraining:\n  seed: 1\n  precision: fp32\n"
_SP_GAMES = {"wins": 3, "draws": 0, "losses": 1, "win_rate": 0.75}
SELFPLAY = dict(GOOD, algo="dqn", env="connect4", updates=40, selfplay={
    "learner_elo": 10.0, "sampling": "latest", "pool_size": 2, "snapshots_taken": 1,
    "heuristics": {"lookahead": {"elo": 5.0}}, "pool": [{"id": 0, "update": 0, "elo": 0.0, "score": None}],
    "ratings": [{"transitions": 0, "update": 0, "elo": 0.0, "random": _SP_GAMES, "lookahead": _SP_GAMES}]})
LONG = "x" * 300


def run_files(metrics=GOOD, config=CONFIG, name="run") -> dict:
    """A fake run folder: metrics (a dict, or raw text/bytes) and config.yaml (None: none)."""
    files = {f"{name}/benchmark_metrics.json": json.dumps(metrics) if isinstance(metrics, (dict, list)) else metrics}
    if config is not None:
        files[f"{name}/config.yaml"] = config
    return files


def with_metrics(**changes) -> dict:
    return run_files(dict(GOOD, **changes))


def tool(script: str, *args: str, files: dict | None = None, env: dict | None = None, prepare=None):
    """A case's setup: `files` written into the case folder ({name: text, bytes or a dict as JSON; a
    name ending in / is a folder}) and prepare(folder) run (what files cannot hold: a FIFO, a link),
    then `python script args`, where TMP/ stands for that folder."""
    def setup(tmp: Path, shared):
        if prepare is not None:
            prepare(tmp)
        for name, data in (files or {}).items():
            path = tmp / name
            if name.endswith("/"):
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data if isinstance(data, bytes) else
                             (json.dumps(data) if isinstance(data, dict) else data).encode())
        argv = [a.replace("TMP/", f"{tmp}/") for a in args]
        return (None, [script, *argv]) if env is None else (None, [script, *argv], env)
    return setup


CMP, SWEEP, CURVES, SELF, PAR = ("analysis/compare_results.py", "analysis/scaling_sweep.py",
                                 "analysis/learning_curves.py", "analysis/selfplay_curve.py", "analysis/parity.py")
BENCH, DQN, GPU, BPAR, AVP = ("benchmarks/bench.py", "benchmarks/bench_dqn.py", "benchmarks/gpu_check.py",
                              "benchmarks/parity.py", "benchmarks/appo_vs_ppo.py")
CUT = "benchmarks/cutoff_bench.py"
USER_ENV_BREAKS = ("env:\n  name: gym:mpippo-test/Faulty-v0\n  import: mpippo_user_envs\n"
                   "  kwargs: {fault: raise, at: 5}\n")  # (tests/user_env: raises in its 6th step)
USER_ENV_HANGS = USER_ENV_BREAKS.replace("raise", "hang-native") + "guards:\n  collective_timeout_s: 2\n"  # (in native code)
CUT_OUT = ("--out", "TMP/out.json")  # never the default (benchmarks/results/)
SWEEP_OUT = ("--out", "TMP/out")  # never the default (analysis/data/)
BPAR_OUT = ("--out", "TMP/out")  # never the default (runs/parity)
AVP_DIRS = ("--root", "TMP/root", "--out", "TMP/out")  # never the defaults (runs/, analysis/data/)


def event_fifo(tmp: Path) -> None:
    (tmp / "run" / "logs").mkdir(parents=True)
    os.mkfifo(tmp / "run" / "logs" / "events.out.tfevents.1.host")


def planted(name: str, link_to: str | None = None):
    """prepare: a FIFO named `name` in the case folder, or (link_to) a symbolic link to that name there."""
    def prepare(tmp: Path) -> None:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        if link_to is None:
            os.mkfifo(tmp / name)
        else:
            os.symlink(tmp / link_to, tmp / name)
    return prepare


def still(name: str, kind):
    """check: `name` in the case folder is still what the case planted (an output replaces by renaming)."""
    return lambda tmp: kind(os.lstat(tmp / name).st_mode)


def event_file(record: bytes | None):
    """An event file whose one record is `record` under a valid checksum (protobuf cannot parse it), or,
    for None, a header that claims a record of a terabyte."""
    def prepare(tmp: Path) -> None:
        import struct

        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        from tensorboard.summary.writer.record_writer import RecordWriter
        (tmp / "run" / "logs").mkdir(parents=True)
        with open(tmp / "run" / "logs" / "events.out.tfevents.1.host", "wb") as f:
            if record is None:
                header = struct.pack("Q", 2**40)
                f.write(header + struct.pack("I", masked_crc32c(header)))
            else:
                RecordWriter(f).write(record)
    return prepare


PPAR = "benchmarks/peer_parity.py"
PPAR_ONE = ("--family", "mujoco", "--envs", "Hopper-v5", "--seeds", "1", "--who", "mpippo", "--runs", "TMP/r",
            "--out", "TMP/o")


_HOLDERS: list = []  # processes holding a case's run folder lock, ended with the module (hostile.table's fixture)


def _held(name: str):
    """A run folder under the case folder whose lock a live process holds (a run training there)."""
    def prepare(tmp: Path) -> None:
        import subprocess
        (tmp / name).mkdir(parents=True)

        from conftest import ROOT
        from mpippo.launch import die_with_parent
        holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from mpippo import runlock; "
                                   "runlock.acquire(sys.argv[1]); print('held', flush=True); time.sleep(300)",
                                   str(tmp / name)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                  preexec_fn=die_with_parent(9))
        _HOLDERS.append(holder)
        assert holder.stdout.readline().strip() == "held"
    return prepare


def _cleanrl_fifo(tmp: Path) -> None:  # CleanRL's script opens checkpoint.pt blind: a FIFO hung it
    (tmp / "r" / "cleanrl-Pong-s1").mkdir(parents=True)
    os.mkfifo(tmp / "r" / "cleanrl-Pong-s1" / "checkpoint.pt")


def evaluate(*args, files=None):
    return tool("-m", "mpippo.evaluate", "--checkpoint", "TMP/run", *args, files=files)


CKPT = {"run/checkpoints/latest.pt": b"not read: the options are refused first", **run_files()}

CASES = [
    # ---- analysis/compare_results.py (make compare) ----
    Case("compare-metrics-list", tool(CMP, "TMP/run", "--out", "TMP/out", files=run_files([1, 2])),
         "compare_results: metrics file"),
    Case("compare-metrics-null", tool(CMP, "TMP/run", "--out", "TMP/out", files=run_files("null")),
         "benchmark_metrics.json': expected a JSON object at the top level, got None"),
    Case("compare-metrics-text-number", tool(CMP, "TMP/run", "--out", "TMP/out", files=with_metrics(fps="fast")),
         "fps: expected a number, got 'fast'"),
    Case("compare-metrics-not-utf8", tool(CMP, "TMP/run", "--out", "TMP/out", files=run_files(b'{"fps": \xff}')),
         "not UTF-8 text (byte 0xff"),
    Case("compare-metrics-truncated", tool(CMP, "TMP/run", "--out", "TMP/out", files=run_files(json.dumps(GOOD)[:40])),
         "not valid JSON"),
    Case("compare-metrics-algo-list", tool(CMP, "TMP/run", "--out", "TMP/out", files=with_metrics(algo=["ppo"])),
         "algo: expected a string"),
    Case("compare-metrics-int-past-4300-digits", tool(CMP, "TMP/run", "--out", "TMP/out",
                                                      files=run_files('{"fps": ' + "9" * 5000 + "}")),
         "not valid JSON (a number of more than 4,300 digits)"),
    Case("compare-metrics-int-past-floats", tool(CMP, "TMP/run", "--out", "TMP/out", files=with_metrics(fps=10**400)),
         "fps: expected a number, got 1000"),
    Case("compare-world-past-64-bits", tool(CMP, "TMP/run", "--out", "TMP/out", files=with_metrics(world_size=2**64)),
         "world_size: expected a non-negative integer below 2**63"),
    Case("compare-config-int-past-4300-digits", tool(CMP, "TMP/run", "--out", "TMP/out",
                                                     files=run_files(config=f"training:\n  seed: {'9' * 5000}\n")),
         "a number of more than 4,300 digits"),
    Case("compare-world-zero", tool(CMP, "TMP/run", "--out", "TMP/out", files=with_metrics(world_size=0)),
         "world_size: expected at least 1 rank, got 0"),
    Case("compare-world-zero-agent", tool(CMP, "TMP/run", "--out", "TMP/out",
                                          files=run_files(dict(GOOD, world_size=0), name="run/agent_0")),
         "world_size: expected at least 1 rank, got 0"),
    Case("compare-config-malformed", tool(CMP, "TMP/run", "--out", "TMP/out",
                                          files=run_files(config="training: [1, 2\n")), "malformed YAML"),
    Case("compare-config-wrong-type", tool(CMP, "TMP/run", "--out", "TMP/out",
                                           files=run_files(config="training:\n  duration_hours: soon\n")),
         "training.duration_hours: expected float"),
    Case("compare-config-is-folder", tool(CMP, "TMP/run", "--out", "TMP/out",
                                          files={**run_files(config=None), "run/config.yaml/": None}),
         "is a folder"),
    Case("compare-out-is-file", tool(CMP, "TMP/run", "--out", "TMP/f", files={**run_files(), "f": "a file"}),
         "is a file; give a folder"),
    Case("compare-out-under-file", tool(CMP, "TMP/run", "--out", "TMP/f/out", files={**run_files(), "f": "a file"}),
         "is a file, not a folder"),
    Case("compare-out-png-is-folder", tool(CMP, "TMP/run", "--out", "TMP/o", files={**run_files(), "o/comparison.png/": None}),
         "comparison.png' is a folder, where --out writes"),
    # an output is a new file renamed over the name: a FIFO or a link there would be replaced by a file
    Case("compare-out-png-is-fifo", tool(CMP, "TMP/run", "--out", "TMP/o", files=run_files(),
                                         prepare=planted("o/comparison.png")),
         "comparison.png' is a FIFO, which the output would replace", check=still("o/comparison.png", stat.S_ISFIFO)),
    # past float32's largest: the figure's axis limits overflowed (a traceback after the table)
    Case("compare-metrics-number-huge", tool(CMP, "TMP/run", "--out", "TMP/out", files=with_metrics(fps_steady=1.7e308)),
         "fps_steady: expected a number, got 1.7e+308 (past 3.4e+38, float32's largest)"),
    Case("compare-run-missing", tool(CMP, "TMP/nothing", "--out", "TMP/out"), "nothing': no such folder"),
    # a run given twice had been two rows and two curves, a speedup of 1.00x over itself (runs.load_each)
    Case("compare-run-given-twice", tool(CMP, "TMP/run", "TMP/./run/", "--out", "TMP/out", files=run_files()),
         "run' is given twice: give each run once"),
    Case("compare-agent-given-twice", tool(CMP, "TMP/run", "--parallel", "TMP/run/agent_0", "--out", "TMP/out",
                                           files=run_files(name="run/agent_0")),
         "agent_0' is given twice (also in '"),
    Case("curves-run-given-twice-by-link", tool(CURVES, "TMP/run", "TMP/link", "--out", "TMP/c.png", files=run_files(),
                                                prepare=planted("link", link_to="run")),
         "link' is given twice (also as '"),
    Case("compare-no-run", tool(CMP, "--out", "TMP/out"), "give at least one run folder"),
    # ---- analysis/scaling_sweep.py (make scaling) ----
    Case("sweep-world-zero", tool(SWEEP, "--ranks", "0", *SWEEP_OUT), "--ranks: 0 is out of range; allowed: 1 to"),
    Case("sweep-world-negative", tool(SWEEP, "--ranks", "1", "-2", *SWEEP_OUT), "-2 is out of range"),
    Case("sweep-world-twice", tool(SWEEP, "--ranks", "2", "2", *SWEEP_OUT), "--ranks: 2 is given twice"),
    Case("sweep-world-huge", tool(SWEEP, "--ranks", "4096", *SWEEP_OUT), "rank(s) need at least"),
    Case("sweep-count-envs-zero", tool(SWEEP, "--envs-per-rank", "0", *SWEEP_OUT), "--envs-per-rank: 0 is out of range"),
    Case("sweep-count-steps-fraction", tool(SWEEP, "--n-steps", "1.5", *SWEEP_OUT), "expected a whole number"),
    Case("sweep-count-envs-huge", tool(SWEEP, "--envs-per-rank", "100000000", *SWEEP_OUT), "memory: this config needs"),
    Case("sweep-count-duration-nan", tool(SWEEP, "--duration", "nan", *SWEEP_OUT), "got 'nan'"),
    Case("sweep-count-timeout-negative", tool(SWEEP, "--timeout", "-1", *SWEEP_OUT), "--timeout: -1 is out of range"),
    Case("sweep-count-strong-uneven", tool(SWEEP, "--mode", "strong", "--num-envs", "3", *SWEEP_OUT),
         "must divide evenly"),
    Case("sweep-seed-beyond-64-bits", tool(SWEEP, "--ranks", "1", *SWEEP_OUT, "--", "--seed", str(2**64)),
         "training.seed: 18446744073709551616 is out of range"),
    Case("sweep-config-host-allocator", tool(SWEEP, "--ranks", "1", *SWEEP_OUT, env={"MPIPPO_HOST_ALLOCATOR": "bogus"}),
         "MPIPPO_HOST_ALLOCATOR='bogus' is not allowed: retain | system"),  # (its trainers would refuse it, exit 1)
    Case("selfplay-out-name-too-long", tool(SELF, "TMP/" + "a" * 300, "--out", "TMP/s.png"),
         "File name too long"),  # (an OSError that is no PermissionError: a traceback before)
    Case("sweep-seed-not-int", tool(SWEEP, "--ranks", "1", *SWEEP_OUT, "--", "--seed", "one"),
         "argument --seed: invalid int value: 'one'"),
    Case("sweep-config-not-utf8", tool(SWEEP, "--config", "TMP/c.yaml", *SWEEP_OUT, files={"c.yaml": b"env: \xe9\n"}),
         "is not UTF-8 text"),
    Case("sweep-config-unknown-key", tool(SWEEP, *SWEEP_OUT, "--", "--set", "training.lr=1"), "unknown key 'training.lr'"),
    Case("sweep-config-other-algo", tool(SWEEP, "--ranks", "3", *SWEEP_OUT, "--", "--config", "configs/dqn_toy.yaml"),
         "training.algo: the sweep measures the sync layout (phase times of every rank: a2c, ppo); 'dqn' is not"),
    Case("sweep-tmpdir-a-device", tool(SWEEP, "--ranks", "1", *SWEEP_OUT, env={"TMPDIR": "/dev/null"}),
         "at 1 rank(s): TMPDIR='/dev/null' is a character device, not a folder"),  # (mpirun's status 213 before)
    Case("sweep-tmpdir-under-a-file", tool(SWEEP, "--ranks", "1", *SWEEP_OUT, env={"TMPDIR": None, "TEMP": None, "TMP": "/proc/version/x"}),
         "TMP='/proc/version/x' lies under '/proc/version', which is a file"),
    Case("sweep-out-is-file", tool(SWEEP, "--out", "TMP/f", files={"f": "a file"}), "is a file; give a folder"),
    Case("sweep-out-under-file", tool(SWEEP, "--out", "TMP/f/sweep", files={"f": "a file"}), "is a file, not a folder"),
    Case("sweep-out-holds-sweep", tool(SWEEP, "--out", "TMP/s", files={"s/sweep.json": "{}"}),
         "already holds a sweep ('sweep.json')"),
    Case("sweep-out-in-trainer-args", tool(SWEEP, *SWEEP_OUT, "--", "--output-dir", "TMP/x"),
         "leave out --output-dir"),
    # ---- analysis/learning_curves.py ----
    Case("curves-out-not-png", tool(CURVES, "TMP/run", "--out", "TMP/c.gif", files=run_files()), "must end in .png"),
    Case("curves-out-is-folder", tool(CURVES, "TMP/run", "--out", "TMP/d.png", files={**run_files(), "d.png/": None}),
         "is a folder; give a file name"),
    Case("curves-out-is-link", tool(CURVES, "TMP/run", "--out", "TMP/c.png", files={**run_files(), "mine.png": "x"},
                                    prepare=planted("c.png", link_to="mine.png")),
         "c.png' is a symbolic link, which the output would replace", check=still("c.png", stat.S_ISLNK)),
    Case("curves-out-is-dangling-link", tool(CURVES, "TMP/run", "--out", "TMP/c.png", files=run_files(),
                                             prepare=planted("c.png", link_to="elsewhere.png")),
         "c.png' is a symbolic link", check=still("c.png", stat.S_ISLNK)),
    # TensorBoard opens a run's event files plainly: a FIFO by such a name would hold the tool forever
    Case("curves-metrics-event-file-fifo", tool(CURVES, "TMP/run", "--out", "TMP/out/c.png", files=run_files(),
                                                prepare=event_fifo), "'events.out.tfevents.1.host' is not a file"),
    Case("compare-metrics-event-file-fifo", tool(CMP, "TMP/run", "--out", "TMP/out", files=run_files(),
                                                 prepare=event_fifo), "'events.out.tfevents.1.host' is not a file"),
    # a damaged (or crafted) record that passes its checksum: protobuf's DecodeError, or a MemoryError
    Case("compare-event-record-corrupt", tool(CMP, "TMP/run", "--out", "TMP/out", files=run_files(),
                                              prepare=event_file(b"\xff\xff\x01garbage")),
         "an event file there is damaged (DecodeError"),
    Case("curves-event-record-a-terabyte", tool(CURVES, "TMP/run", "--out", "TMP/out/c.png", files=run_files(),
                                                prepare=event_file(None)), "an event file there is damaged"),
    Case("curves-metrics-truncated", tool(CURVES, "TMP/run", "--out", "TMP/out/c.png", files=run_files('{"env": "co')),
         "not valid JSON"),
    Case("curves-metrics-env-list", tool(CURVES, "TMP/run", "--out", "TMP/out/c.png", files=with_metrics(env=["x"])),
         "env: expected a string"),
    Case("curves-world-zero", tool(CURVES, "TMP/run", "--out", "TMP/out/c.png", files=with_metrics(world_size=0)),
         "world_size: expected at least 1 rank"),
    Case("curves-world-negative", tool(CURVES, "TMP/run", "--out", "TMP/out/c.png", files=with_metrics(world_size=-1)),
         "world_size: expected a non-negative integer, got -1"),
    Case("curves-config-duplicate-key", tool(CURVES, "TMP/run", "--out", "TMP/out/c.png",
                                             files=run_files(config="training:\n  seed: 1\n  seed: 2\n")),
         "duplicate key 'seed'"),
    Case("curves-config-top-list", tool(CURVES, "TMP/run", "--out", "TMP/out/c.png", files=run_files(config="- 1\n")),
         "the top level must be a mapping"),
    # ---- analysis/selfplay_curve.py (make selfplay) ----
    Case("selfplay-metrics-no-block", tool(SELF, "TMP/run", "--out", "TMP/out/s.png", files=run_files()),
         "is not a self-play run"),
    Case("selfplay-metrics-no-ratings", tool(SELF, "TMP/run", "--out", "TMP/out/s.png",
                                             files=run_files(dict(SELFPLAY, selfplay=dict(SELFPLAY["selfplay"],
                                                                                          ratings=[])))),
         "selfplay.ratings: expected a non-empty list"),
    Case("selfplay-metrics-text-win-rate", tool(SELF, "TMP/run", "--out", "TMP/out/s.png", files=run_files(
        json.dumps(SELFPLAY).replace('"win_rate": 0.75', '"win_rate": "most"', 1))),
         "selfplay.ratings[0].random.win_rate: expected a number, got 'most'"),
    Case("selfplay-metrics-elo-huge", tool(SELF, "TMP/run", "--out", "TMP/out/s.png", files=run_files(
        json.dumps(SELFPLAY).replace('"elo": 5.0', '"elo": 1.7e308', 1))),
         "selfplay.heuristics.lookahead.elo: expected a number, got 1.7e+308 (past"),  # (a singular transform)
    Case("selfplay-metrics-not-utf8", tool(SELF, "TMP/run", "--out", "TMP/out/s.png", files=run_files(b"\xfe\xff{}")),
         "not UTF-8 text"),
    Case("selfplay-out-not-png", tool(SELF, "TMP/run", "--out", "TMP/s.svgz", files=run_files(SELFPLAY)),
         "must end in .png"),
    Case("selfplay-out-under-file", tool(SELF, "TMP/run", "--out", "TMP/f/s.png", files={**run_files(SELFPLAY), "f": "x"}),
         "is a file, not a folder"),
    # ---- analysis/parity.py ----
    Case("parity-metrics-list", tool(PAR, "TMP/run", "--out", "TMP/out", files=run_files([])),
         "expected a JSON object at the top level, got []"),
    Case("parity-world-zero", tool(PAR, "TMP/run", "--out", "TMP/out", files=with_metrics(world_size=0)),
         "world_size: expected at least 1 rank"),
    Case("parity-world-text", tool(PAR, "TMP/run", "--out", "TMP/out", files=with_metrics(world_size="2")),
         "world_size: expected a non-negative integer, got '2'"),
    Case("parity-metrics-env-number", tool(PAR, "TMP/run", "--out", "TMP/out", files=with_metrics(env=5)),
         "env: expected a string, got 5"),
    Case("parity-config-missing", tool(PAR, "TMP/run", "--out", "TMP/out", files=run_files(config=None)),
         "has no config.yaml"),
    Case("parity-config-precision-number", tool(PAR, "TMP/run", "--out", "TMP/out",
                                                files=run_files(config="training:\n  precision: 16\n")),
         "training.precision: expected str"),
    Case("parity-config-reference-columns", tool(PAR, "TMP/run", "--out", "TMP/out", "--reference", "TMP/ref.csv",
                                                 files={**run_files(), "ref.csv": "mode,levels\neasy,all\n"}),
         "no column(s) split, game, timesteps"),
    Case("parity-config-reference-value", tool(PAR, "TMP/run", "--out", "TMP/out", "--reference", "TMP/ref.csv", files={
        **run_files(), "ref.csv": "mode,levels,split,game,timesteps,return_mean,return_std\neasy,all,train,coinrun,many,1,1\n"}),
         "line 2: expected timesteps >= 0"),
    Case("parity-out-is-file", tool(PAR, "TMP/run", "--out", "TMP/f", files={**run_files(), "f": "x"}),
         "is a file; give a folder"),
    Case("parity-out-json-is-folder", tool(PAR, "TMP/run", "--out", "TMP/o", files={**run_files(), "o/parity.json/": None}),
         "parity.json' is a folder"),
    # ---- benchmarks/cutoff_bench.py ----
    Case("cutoff-one-rank", tool(CUT, "--ranks", "1", *CUT_OUT), "--ranks: 1 is out of range"),
    Case("cutoff-fraction-zero", tool(CUT, "--cutoff", "0", *CUT_OUT), "--cutoff: 0 is out of range"),
    Case("cutoff-slow-nan", tool(CUT, "--slow", "nan", *CUT_OUT), "--slow: expected a slowdown factor"),
    Case("cutoff-slow-twice", tool(CUT, "--slow", "0.3", "0.3", *CUT_OUT), "--slow: 0.3 is given twice"),
    Case("cutoff-env-unknown", tool(CUT, "--env", "pong", *CUT_OUT), "env.name"),
    Case("cutoff-out-is-folder", tool(CUT, "--out", "TMP/o/", files={"o/": None}), "--out"),
    # ---- benchmarks/parity.py ----
    Case("bparity-seed-negative", tool(BPAR, "--seeds", "-1", *BPAR_OUT), "--seeds: -1 is out of range; allowed: 0 to"),
    Case("bparity-seed-beyond-64-bits", tool(BPAR, "--seeds", str(2**64 + 1), *BPAR_OUT), "is out of range"),
    Case("bparity-seed-twice", tool(BPAR, "--seeds", "3", "3", *BPAR_OUT), "--seeds: 3 is given twice"),
    Case("bparity-world-zero", tool(BPAR, "--ranks", "0", *BPAR_OUT), "--ranks: 0 is out of range"),
    Case("bparity-world-huge", tool(BPAR, "--ranks", "4096", *BPAR_OUT), "rank(s) need at least"),
    Case("bparity-count-parallel-zero", tool(BPAR, "--parallel", "0", *BPAR_OUT), "--parallel: 0 is out of range"),
    Case("bparity-count-stop-after-nan", tool(BPAR, "--stop-after", "nan", *BPAR_OUT), "got 'nan'"),
    Case("bparity-out-is-file", tool(BPAR, "--out", "TMP/f", files={"f": "x"}), "is a file; give a folder"),
    Case("bparity-out-tag-path", tool(BPAR, "--tag", "../../escape", *BPAR_OUT), "is not a folder tag"),
    Case("bparity-out-tag-newline", tool(BPAR, "--tag", "two\nlines", *BPAR_OUT), "'two\\nlines' is not a folder tag"),
    Case("bparity-metrics-null", tool(BPAR, "--games", "coinrun", "--seeds", "1", "--out", "TMP/runs",
                                      files=run_files("null", name="runs/coinrun-fp32-s1")),
         "s1/benchmark_metrics.json': expected a JSON object at the top level, got None"),
    Case("bparity-metrics-finished-text", tool(BPAR, "--games", "coinrun", "--seeds", "1", "--out", "TMP/runs",
                                               files=run_files(dict(GOOD, finished="yes"), name="runs/coinrun-fp32-s1")),
         "finished: expected true or false"),
    Case("bparity-config-resume-damaged", tool(BPAR, "--games", "coinrun", "--seeds", "1", "--out", "TMP/runs", files={
        **run_files(dict(GOOD, finished=False, stop_reason="stopped"), config="training: {seed: [\n",
                    name="runs/coinrun-fp32-s1"), "runs/coinrun-fp32-s1/checkpoints/latest.pt": b"ckpt"}),
         "run config: malformed YAML"),
    Case("bparity-config-unknown-key", tool(BPAR, "--set", "training.lr=1", *BPAR_OUT), "unknown key 'training.lr'"),
    # ---- benchmarks/bench.py (make bench ARGS=...) ----
    Case("bench-world-zero", tool(BENCH, "--ranks", "0"), "--ranks: 0 is out of range"),
    Case("bench-world-twice", tool(BENCH, "--ranks", "1", "1"), "--ranks: 1 is given twice"),
    Case("bench-count-iterations-zero", tool(BENCH, "--iterations", "0"), "--iterations: 0 is out of range"),
    Case("bench-count-memory-iterations", tool(BENCH, "--memory-iterations", "2"), "allowed: 0 (skip) or 3"),
    Case("bench-count-component-seconds-inf", tool(BENCH, "--component-seconds", "inf"), "got 'inf'"),
    Case("bench-count-minibatches", tool(BENCH, "--minibatches", "7"), "not divisible by num_minibatches=7"),
    Case("bench-count-huge-steps", tool(BENCH, "--n-steps", "1000000000"), "memory: this config needs"),
    Case("bench-count-env", tool(BENCH, "--env", "pong"), "argument --env: invalid choice: 'pong'"),
    # past what the ceiling's measurement takes (the trainer's memory check comes first: 1 rank, short rollouts)
    Case("bench-count-envs-past-the-ceilings", tool(BENCH, "--ranks", "1", "--envs-per-rank", "5000", "--n-steps",
                                                    "16", "--minibatches", "16"),
         "--envs-per-rank: 5000 is more than the ceiling's measurement takes (4,096)"),
    Case("bench-count-envs-just-past-the-ceilings", tool(BENCH, "--ranks", "1", "--envs-per-rank", "4097",
                                                         "--n-steps", "8", "--minibatches", "8"),
         "--envs-per-rank: 4097 is more than"),
    Case("bench-tmpdir-under-a-device", tool(BENCH, "--out", "TMP/b.json", env={"TMPDIR": "/dev/null/x"}),
         "TMPDIR='/dev/null/x' lies under '/dev/null', which is a character device"),
    Case("bench-tmpdir-a-device", tool(BENCH, "--out", "TMP/b.json", env={"TMPDIR": "/dev/zero"}),
         "the 1-rank run: TMPDIR='/dev/zero' is a character device, not a folder"),
    Case("bench-out-is-folder", tool(BENCH, "--out", "TMP/d", files={"d/": None}), "is a folder; give a file name"),
    Case("bench-out-is-fifo", tool(BENCH, "--out", "TMP/r.json", prepare=planted("r.json")),
         "r.json' is a FIFO, which the output would replace", check=still("r.json", stat.S_ISFIFO)),
    Case("learner_bench-out-profile-is-out", tool("benchmarks/learner_bench.py", "--dry-run", "--out", "TMP/lb.json",
                                                  "--profile-out", "TMP/lb.json"),
         "--out and --profile-out: both name"),
    Case("bench-out-under-file", tool(BENCH, "--out", "TMP/f/r.json", files={"f": "x"}), "is a file, not a folder"),
    Case("bench_dqn-world-zero", tool(DQN, "--actors", "0"), "--actors: 0 is out of range"),
    Case("bench_dqn-env", tool(DQN, "--env", "mujoco"), "argument --env: invalid choice: 'mujoco' (choose from 'atari', 'procgen')"),
    Case("bench_dqn-world-twice", tool(DQN, "--actors", "2", "2"), "--actors: 2 is given twice"),
    Case("bench_dqn-count-steps-huge", tool(DQN, "--steps-per-actor", str(10**12)), "is out of range"),
    Case("bench_dqn-count-envs-negative", tool(DQN, "--envs-per-actor", "-8"), "-8 is out of range"),
    Case("bench_dqn-out-is-folder", tool(DQN, "--out", "TMP/d", files={"d/": None}), "is a folder"),
    Case("bench_dqn-out-name-too-long", tool(DQN, "--out", f"TMP/{LONG}.json"), "File name too long"),
    # ---- benchmarks/gpu_check.py (make gpu-check ARGS=...) ----
    Case("gpu-count-iterations-zero", tool(GPU, "--ppo-iterations", "0"), "gpu-check: argument --ppo-iterations: 0"),
    Case("gpu-count-iterations-huge", tool(GPU, "--ppo-iterations", str(10**9)), "allowed: 1 to 200"),
    Case("gpu-count-dry-run-iterations", tool(GPU, "--dry-run", "--ppo-iterations", "-1"), "-1 is out of range"),
    Case("gpu-out-dry-run-is-folder", tool(GPU, "--dry-run", "--out", "TMP/d", files={"d/": None}),
         "is a folder; give a file name"),
    Case("gpu-out-dry-run-under-file", tool(GPU, "--dry-run", "--out", "TMP/f/g.json", files={"f": "x"}),
         "is a file, not a folder"),
    Case("gpu-out-dry-run-name-too-long", tool(GPU, "--dry-run", "--out", f"TMP/{LONG}.json"), "File name too long"),
    Case("gpu-out-dry-run-profile-is-folder", tool(GPU, "--dry-run", "--out", "TMP/g.json", files={"g-profile.txt/": None}),
         "g-profile.txt' is a folder; give a file name"),
    Case("gpu-flag-dry-run-unknown", tool(GPU, "--dry-run", "--dry-run-fast"), "unrecognized arguments"),
    # ---- benchmarks/appo_vs_ppo.py ----
    Case("appo_vs_ppo-count-minutes-zero", tool(AVP, "--minutes", "0", *AVP_DIRS), "--minutes: 0 is out of range"),
    Case("appo_vs_ppo-count-minutes-inf", tool(AVP, "--minutes", "inf", *AVP_DIRS), "got 'inf'"),
    Case("appo_vs_ppo-world-zero", tool(AVP, "--ranks", "0", *AVP_DIRS), "--ranks: 0 is out of range"),
    Case("appo_vs_ppo-world-zero-kept", tool(AVP, *AVP_DIRS, files=run_files(dict(GOOD, world_size=0),
                                                                            name="root/sync_ppo")),
         "world_size: expected at least 1 rank"),
    Case("appo_vs_ppo-metrics-kept-incomplete", tool(AVP, *AVP_DIRS, files=run_files({"stop_reason": "done"},
                                                                                    name="root/sync_ppo")),
         "ppo/benchmark_metrics.json': world_size: missing"),
    Case("appo_vs_ppo-metrics-no-acting-time", tool(AVP, *AVP_DIRS, files=run_files(dict(
        GOOD, stop_reason="done", phase_seconds={k: 0.0 for k in ("env_step", "inference", "backward", "optimizer")}),
        name="root/sync_ppo")), "phase_seconds: env_step + inference is 0.0, expected a positive time spent acting"),
    Case("appo_vs_ppo-metrics-truncated", tool(AVP, *AVP_DIRS, files=run_files('{"stop', name="root/appo")),
         "appo/benchmark_metrics.json': not valid JSON"),
    Case("appo_vs_ppo-config-resume-damaged", tool(AVP, *AVP_DIRS, files={
        **run_files(dict(GOOD, stop_reason="stopped"), config=b"\xff", name="root/sync_ppo"),
        "root/sync_ppo/checkpoints/latest.pt": b"ckpt"}), "run config"),
    Case("appo_vs_ppo-config-env", tool(AVP, "--env", "pong", *AVP_DIRS), "unknown environment 'pong'"),
    Case("appo_vs_ppo-out-is-file", tool(AVP, "--root", "TMP/root", "--out", "TMP/f", files={"f": "x"}),
         "is a file; give a folder"),
    Case("appo_vs_ppo-out-root-is-file", tool(AVP, "--root", "TMP/f", "--out", "TMP/out", files={"f": "x"}),
         "f' is a file; give a folder"),
    # ---- python -m mpippo.evaluate ----
    Case("evaluate-seed-negative", evaluate("--seed", "-1"), "--seed: must be >= 0, got -1"),
    Case("evaluate-seed-beyond-64-bits", evaluate("--seed", str(2**64)), "--seed: must be <="),
    Case("evaluate-seed-not-int", evaluate("--seed", "1e3"), "argument --seed: invalid int value: '1e3'"),
    Case("evaluate-count-episodes-huge", evaluate("--num-episodes", str(10**12)), "--num-episodes: must be <="),
    Case("evaluate-count-video-episodes", evaluate("--video-episodes", "100000"), "--video-episodes: must be <= 100"),
    Case("evaluate-out-json-is-checkpoint", evaluate("--json", "TMP/run/checkpoints/latest.pt", files=CKPT),
         "is one of the run's own files (the checkpoint)"),
    Case("evaluate-out-json-is-config", evaluate("--json", "TMP/run/config.yaml", files=CKPT),
         "is the run's own config.yaml (run folder"),
    Case("evaluate-out-json-is-video", evaluate("--json", "TMP/v.mp4", "--video", "TMP/v.mp4"), "both name"),
    # any run folder's own files and subfolders, live or ended: --json over an event file had replaced a run's
    # whole TensorBoard history (exit 0), over another run's config.yaml left that run unreadable
    Case("evaluate-out-json-over-event-file", evaluate("--json", "TMP/run/logs/events.out.tfevents.1.vm", files={
        **CKPT, "run/logs/events.out.tfevents.1.vm": b"history"}), "lies in logs/ of the run folder"),
    Case("evaluate-out-json-over-other-runs-config", evaluate("--json", "TMP/other/config.yaml", files={
        **CKPT, **run_files(name="other")}), "is the run's own config.yaml (run folder"),
    Case("evaluate-out-json-over-a-lock", evaluate("--json", "TMP/other/.mpippo.lock", files={
        **CKPT, "other/.mpippo.lock": "pid 1", "other/config.yaml": "training:\n  seed: 1\n"}),
         "is the run's own .mpippo.lock (run folder"),
    # a periodic checkpoint the run pruned since (checkpoint.keep_last): said, with what it keeps
    Case("evaluate-checkpoint-pruned", tool("-m", "mpippo.evaluate", "--checkpoint", "TMP/run/checkpoints/ckpt_0000001.pt",
                                            files={**CKPT, "run/checkpoints/ckpt_0000005.pt": b"x",
                                                   "run/checkpoints/ckpt_0000006.pt": b"x"}),
         "(pruned: the run keeps only its newest periodic checkpoints (checkpoint.keep_last), ckpt_0000005.pt to "
         "ckpt_0000006.pt; or give the run folder for its latest)"),
    Case("evaluate-checkpoint-not-yet", tool("-m", "mpippo.evaluate", "--checkpoint", "TMP/run/checkpoints/ckpt_0000009.pt",
                                             files={**CKPT, "run/checkpoints/ckpt_0000005.pt": b"x"}),
         "(its periodic checkpoints are ckpt_0000005.pt; or give the run folder for its latest)"),
    Case("compare-out-in-checkpoints", tool(CMP, "TMP/run", "--out", "TMP/run/checkpoints", files=run_files()),
         "lies in checkpoints/ of the run folder"),
    # ---- benchmarks/atari_throughput.py (beside CleanRL's ppo_atari_envpool.py) ----
    Case("atari-throughput-steps", tool("benchmarks/atari_throughput.py", "--steps", "100", "--runs", "TMP/r",
                                        "--out", "TMP/o"), "--steps: 100 is out of range; allowed: 1,024 to"),
    Case("atari-throughput-game", tool("benchmarks/atari_throughput.py", "--game", "../etc", "--runs", "TMP/r"),
         "--game: '../etc' is not an ALE game in CamelCase such as Pong"),
    Case("atari-throughput-who", tool("benchmarks/atari_throughput.py", "--who", "rllib", "--runs", "TMP/r"),
         "argument --who: invalid choice: 'rllib'"),
    Case("atari-throughput-out-is-file", tool("benchmarks/atari_throughput.py", "--out", "TMP/f", "--runs", "TMP/r",
                                              files={"f": "x"}), "f' is a file; give a folder"),
    Case("atari-throughput-component-seconds", tool("benchmarks/atari_throughput.py", "--component-seconds", "0",
                                                    "--runs", "TMP/r", "--out", "TMP/o"),
         "--component-seconds: 0 is out of range"),
    # ---- python -m mpippo.config (every key, as YAML or docs/config.md's table) ----
    Case("config-listing-flag-misspelled", tool("-m", "mpippo.config", "--markdwn"),
         "config: unrecognized arguments: --markdwn (see python -m mpippo.config --help)"),
    Case("config-listing-extra-word", tool("-m", "mpippo.config", "markdown"),
         "config: unrecognized arguments: markdown"),
    # ---- benchmarks/components.py (the ceiling's costs, for any env a config names) ----
    Case("components-env", tool("benchmarks/components.py", "--config", "configs/ppo_atari.yaml", "--env", "atari:Nope"),
         "env.name: 'Nope' is not an ALE game"),
    Case("components-config-missing", tool("benchmarks/components.py", "--config", "TMP/none.yaml"),
         "none.yaml: config file not found"),
    Case("components-user-env-breaks", tool("benchmarks/components.py", "--config", "TMP/c.yaml", "--envs-per-rank", "2",
                                            "--seconds", "0.2", files={"c.yaml": USER_ENV_BREAKS},
                                            env={"PYTHONPATH": str(Path(__file__).parents[1] / "user_env")}),
         "components: env.name: 'gym:mpippo-test/Faulty-v0' raised RuntimeError: the user's env broke in its step()"),
    Case("components-user-env-hangs", tool("benchmarks/components.py", "--config", "TMP/c.yaml", "--envs-per-rank", "2",
                                           "--seconds", "0.2", files={"c.yaml": USER_ENV_HANGS},
                                           env={"PYTHONPATH": str(Path(__file__).parents[1] / "user_env")}),
         "components: one step of the benchmark has lasted 2 s (guards.collective_timeout_s = 2): the benchmark hangs "
         "in its envs' step, at '", code=1),
    # ---- benchmarks/peer_parity.py and analysis/peer_parity.py (the side-by-side with CleanRL) ----
    Case("parity-no-family", tool("benchmarks/peer_parity.py", "--runs", "TMP/r"),
         "the following arguments are required: --family"),
    Case("parity-family", tool("benchmarks/peer_parity.py", "--family", "procgen", "--runs", "TMP/r"),
         "argument --family: invalid choice: 'procgen' (choose from 'atari', 'mujoco')"),
    Case("mujoco-parity-steps", tool("benchmarks/peer_parity.py", "--family", "mujoco", "--steps", "5", "--runs", "TMP/r",
                                     "--out", "TMP/o"),
         "--steps: 5 is out of range; allowed: 2,048 to"),
    Case("mujoco-parity-env-not-an-id", tool("benchmarks/peer_parity.py", "--family", "mujoco", "--envs", "os;rm",
                                             "--runs", "TMP/r"),
         "--envs: 'os;rm' is not a Gymnasium id such as HalfCheetah-v5"),
    Case("mujoco-parity-seed", tool("benchmarks/peer_parity.py", "--family", "mujoco", "--seeds", "-1", "--runs", "TMP/r"),
         "--seeds: -1 is out of range"),
    Case("mujoco-parity-precision", tool("benchmarks/peer_parity.py", "--family", "mujoco", "--precision", "fp16",
                                         "--runs", "TMP/r"),
         "argument --precision: invalid choice: 'fp16' (choose from 'fp32', 'bf16')"),
    Case("atari-parity-gym-id", tool("benchmarks/peer_parity.py", "--family", "atari", "--envs", "Pong", "Hopper-v5",
                                     "--runs", "TMP/r"),
         "--envs: 'Hopper-v5' is not an ALE game in CamelCase such as Pong"),
    # names that pass the form but no side can play: refused before any run starts (not a failed run, exit 1)
    Case("atari-parity-unknown-game", tool("benchmarks/peer_parity.py", "--family", "atari", "--envs", "Pongg",
                                           "--runs", "TMP/r"), "--envs: 'Pongg' is not an ALE game (did you mean 'Pong'?)"),
    Case("mujoco-parity-env-cannot-be-made", tool("benchmarks/peer_parity.py", "--family", "mujoco", "--envs",
                                                  "HalfCheetah-v3", "--runs", "TMP/r"),
         "mpippo on HalfCheetah-v3: env.name: making 'HalfCheetah-v3' with env.kwargs {} failed (ImportError"),
    Case("atari-throughput-unknown-game", tool("benchmarks/atari_throughput.py", "--game", "Pongg", "--runs", "TMP/r"),
         "argument --game: 'Pongg' is not an ALE game (did you mean 'Pong'?)"),
    # ---- python -m mpippo.machine (CI's first line): it takes no options, and says so ----
    Case("machine-option", tool("-m", "mpippo.machine", "--fast"), "unrecognized arguments: --fast"),
    Case("machine-argument", tool("-m", "mpippo.machine", "node01"), "unrecognized arguments: node01"),
    Case("atari-throughput-runs-unwritable", tool("benchmarks/atari_throughput.py", "--runs", "/proc/runs",
                                                  "--out", "TMP/o"), "--runs: cannot write '/proc/runs'"),
    Case("atari-throughput-runs-is-a-file", tool("benchmarks/atari_throughput.py", "--runs", "TMP/f", "--out", "TMP/o",
                                                 files={"f": "a file"}), "is a file; give a folder"),
    Case("atari-parity-ranks", tool("benchmarks/peer_parity.py", "--family", "atari", "--ranks", "0", "--runs", "TMP/r"),
         "argument --ranks: 0 is out of range; allowed: 1 to 64"),
    Case("atari-parity-ranks-apex", tool("benchmarks/peer_parity.py", "--family", "atari", "--who", "apex", "--ranks",
                                         "1", "--runs", "TMP/r"),
         "argument --ranks: Ape-X needs a learner and an actor, 2 ranks or more; got 1"),
    # its outputs: checked before any run starts (a results folder it cannot write was a traceback after the checks)
    Case("atari-parity-out-unwritable", tool("benchmarks/peer_parity.py", "--family", "atari", "--runs", "TMP/r",
                                             "--out", "/proc/parity"), "--out: cannot write '/proc/parity'"),
    Case("atari-parity-runs-file-damaged", tool("benchmarks/peer_parity.py", "--family", "atari", "--runs", "TMP/r",
                                                "--out", "TMP/o", files={"o/runs.json": "{not json"}),
         "o/runs.json': not valid JSON (line 1, column 2"),
    Case("mujoco-parity-runs-file-entry", tool("benchmarks/peer_parity.py", "--family", "mujoco", "--runs", "TMP/r",
                                               "--out", "TMP/o", files={"o/runs.json": {"mpippo-Hopper-v5-s1": 5}}),
         "entry 'mpippo-Hopper-v5-s1' is not a run's record (a JSON object)"),
    Case("mujoco-analysis-no-data", tool("analysis/peer_parity.py", "--data", "TMP/none"),
         "runs.json'; run benchmarks/peer_parity.py first"),
    Case("mujoco-analysis-runs-file-fifo", tool("analysis/peer_parity.py", "--data", "TMP/d",
                                                prepare=lambda t: (t.joinpath("d").mkdir(), os.mkfifo(t / "d/runs.json"))),
         "runs.json': is a FIFO, not a file"),
    Case("mujoco-analysis-curve-fifo", tool("analysis/peer_parity.py", "--data", "TMP/d", files={"d/runs.json": {
        "mpippo-Hopper-v5-s1": {"who": "mpippo", "env": "Hopper-v5", "seed": 1, "budget": 2048, "wall_s": 1.0,
                                "steps_per_s": 2.0, "final_return": 3.0, "episodes": 4}}},
        prepare=lambda t: (t.joinpath("d").mkdir(), os.mkfifo(t / "d/mpippo-Hopper-v5-s1.csv"))),
         "mpippo-Hopper-v5-s1.csv' (it is a FIFO, not a file)"),
    Case("mujoco-analysis-not-runs", tool("analysis/peer_parity.py", "--data", "TMP/d", files={"d/runs.json": "[1, 2]"}),
         "holds no runs (expected a mapping of run names)"),
    Case("mujoco-analysis-bad-run", tool("analysis/peer_parity.py", "--data", "TMP/d",
                                         files={"d/runs.json": {"x": {"who": "mpippo", "env": "E-v5", "seed": 1}}}),
         "run 'x': budget is None; expected a non-negative integer below 2**63"),
    Case("mujoco-analysis-bad-ranks", tool("analysis/peer_parity.py", "--data", "TMP/d", files={"d/runs.json": {"x": {
        "who": "mpippo", "env": "E-v5", "seed": 1, "budget": 9, "final_return": 1.0, "steps_per_s": 2, "ranks": 0}}}),
         "run 'x': ranks is 0; expected an int from 1 to 64"),
    Case("atari-analysis-ranks-text", tool("analysis/peer_parity.py", "--data", "TMP/d", files={"d/runs.json": {"x": {
        "who": "mpippo", "env": "Pong", "seed": 1, "budget": 9, "final_return": 1.0, "steps_per_s": 2, "ranks": "1"}}}),
         "run 'x': ranks is '1'; expected an int from 1 to 64"),
    Case("mujoco-analysis-bad-side", tool("analysis/peer_parity.py", "--data", "TMP/d",
                                          files={"d/runs.json": {"x": {"who": "me"}}}),
         "run 'x': who is 'me'; allowed: mpippo, cleanrl, apex"),
    Case("mujoco-parity-apex", tool("benchmarks/peer_parity.py", "--family", "mujoco", "--who", "apex", "--runs", "TMP/r"),
         "argument --who: apex: the mujoco family has no Ape-X config; allowed: mpippo, cleanrl"),
    Case("mujoco-analysis-bad-curve", tool("analysis/peer_parity.py", "--data", "TMP/d", files={
        "d/runs.json": {"x": {"who": "mpippo", "env": "E-v5", "seed": 1, "budget": 9, "final_return": 1.0,
                              "steps_per_s": 2}}, "d/x.csv": "env_steps,return_mean_100\nten,1\n"}),
         "cannot read the curve"),
    # numbers past Python's limits, nesting, a CSV field past csv's limit, its outputs: one line, before the work
    Case("mujoco-analysis-budget-past-64-bits", tool("analysis/peer_parity.py", "--data", "TMP/d", files={"d/runs.json": {
        "x": {"who": "mpippo", "env": "E-v5", "seed": 1, "budget": 10**400, "final_return": 1.0, "steps_per_s": 2}}}),
         "run 'x': budget is 1000"),
    Case("mujoco-analysis-runs-file-huge-int", tool("analysis/peer_parity.py", "--data", "TMP/d",
                                                    files={"d/runs.json": '{"x": ' + "9" * 5000 + "}"}),
         "not valid JSON (a number of more than 4,300 digits)"),
    Case("mujoco-analysis-runs-file-nested", tool("analysis/peer_parity.py", "--data", "TMP/d",
                                                  files={"d/runs.json": "[" * 100_000 + "]" * 100_000}),
         "not valid JSON (nested too deeply)"),
    Case("mujoco-analysis-curve-field-too-long", tool("analysis/peer_parity.py", "--data", "TMP/d", files={
        "d/runs.json": {"x": {"who": "mpippo", "env": "E-v5", "seed": 1, "budget": 9, "final_return": 1.0,
                              "steps_per_s": 2}}, "d/x.csv": "env_steps,return_mean_100\n1," + "\0" * 200_000 + "\n"}),
         "cannot read the curve '"),
    Case("mujoco-analysis-out-is-folder", tool("analysis/peer_parity.py", "--data", "TMP/d", files={
        "d/runs.json": {"x": {"who": "mpippo", "env": "E-v5", "seed": 1, "budget": 9, "final_return": 1.0,
                              "steps_per_s": 2}}, "d/x.csv": "env_steps,return_mean_100\n1,2\n", "d/d.md/": None}),
         "d/d.md' is a folder"),
    # its run folders, before any run: one a live run writes (the old code removed it, whole), one that is a file
    Case("mujoco-parity-runs-in-use", tool(PPAR, *PPAR_ONE, prepare=_held("r/mpippo-Hopper-v5-s1")),
         "mpippo-Hopper-v5-s1' is in use: process"),
    Case("atari-parity-runs-in-use-apex", tool(PPAR, "--family", "atari", "--envs", "Pong", "--seeds", "1", "--who",
                                               "apex", "--runs", "TMP/r", "--out", "TMP/o",
                                               prepare=_held("r/apex-Pong-s1")),
         "apex-Pong-s1' is in use: process"),
    Case("mujoco-parity-runs-is-a-file", tool(PPAR, *PPAR_ONE, files={"r/mpippo-Hopper-v5-s1": "x"}),
         "mpippo-Hopper-v5-s1' is a file, not a run's folder; move it away"),
    Case("atari-parity-cleanrl-checkpoint-fifo", tool(PPAR, "--family", "atari", "--envs", "Pong", "--seeds", "1",
                                                      "--who", "cleanrl", "--runs", "TMP/r", "--out", "TMP/o",
                                                      prepare=_cleanrl_fifo), "is a FIFO, not CleanRL's checkpoint"),
    Case("mujoco-parity-out-csv-is-folder", tool(PPAR, *PPAR_ONE, files={"o/mpippo-Hopper-v5-s1.csv/": None}),
         "mpippo-Hopper-v5-s1.csv' is a folder; give a file name"),
    Case("parity-analysis-empty-curve", tool("analysis/peer_parity.py", "--data", "TMP/d", files={
        "d/runs.json": {"x": {"who": "cleanrl", "env": "Pong", "seed": 1, "budget": 9, "final_return": 1.0,
                              "steps_per_s": 2}}, "d/x.csv": ""}),
         "cannot read the curve '"),
]


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


# the batch scripts outside a Slurm job (bash's own 'unbound variable', exit 1, before)
NO_SLURM = {"SLURM_JOB_ID": "", "SLURM_NTASKS": "", "SLURM_ARRAY_TASK_ID": ""}
CASES += [Case(f"slurm-job-{script[:-3]}", tool("-c", f"import os; os.execvp('bash', ['bash', 'slurm/{script}'{extra}])",
                                                env=NO_SLURM),
               expect) for script, extra, expect in (
    ("ppo_48core.sh", "", "ppo_48core.sh is a batch script: submit it with sbatch (no Slurm job here)"),
    ("dqn_6agents.sh", "", "dqn_6agents.sh is a batch script: submit it with sbatch"),
    ("suite_member.sh", "", "suite_member.sh MANIFEST runs as an element of the job array"),
    ("suite_member.sh", ", 'm.json'", "do not run or sbatch it by hand"))]
CASES[-1].id += "-manifest"
IN_A_JOB = {"SLURM_JOB_ID": "5", "SLURM_NTASKS": "2"}
CASES += [
    Case("slurm-job-root-missing", tool("-c", "import os; os.execvp('bash', ['bash', 'slurm/ppo_48core.sh'])",
                                        env=IN_A_JOB | {"MPIPPO_ROOT": "/nonexistent"}),
         "no /nonexistent/slurm/common.sh: submit from the repository's root, or set MPIPPO_ROOT"),
    Case("slurm-job-python-missing", tool("-c", "import os; os.execvp('bash', ['bash', 'slurm/ppo_48core.sh'])",
                                          env=IN_A_JOB | {"MPIPPO_PYTHON": "/no/python"}),
         "MPIPPO_PYTHON='/no/python' is not a program this node can run"),
]
CASES.append(Case("slurm-job-ppo_48core-no-task-count", tool("-c", "import os; os.execvp('bash', ['bash', 'slurm/ppo_48core.sh'])",
                                                             env={"SLURM_JOB_ID": "5", "SLURM_NTASKS": ""}),
                  "job 5 has no task count (SLURM_NTASKS): submit it with --ntasks or --ntasks-per-node"))


if not _cuda():  # with a GPU this is the real check: minutes, not a refusal
    CASES.append(Case("gpu-device-none", tool(GPU, "--out", "TMP/out/g.json"), "gpu-check: no CUDA device here"))
    CASES.append(Case("gpu-device-none-iterations", tool(GPU, "--ppo-iterations", "4", "--out", "TMP/out/g.json"),
                      "no CUDA device here"))

# the classes of hostile input each tool takes (the issue's list, where the tool has such an input)
CLASSES = {
    "compare": ("metrics", "world", "config", "out"),
    "sweep": ("world", "count", "seed", "config", "out", "tmpdir"),
    "curves": ("metrics", "world", "config", "out"),
    "selfplay": ("metrics", "out"),
    "parity": ("metrics", "world", "config", "out"),
    "bparity": ("seed", "world", "count", "metrics", "config", "out"),
    "bench": ("world", "count", "out", "tmpdir"),
    "bench_dqn": ("world", "count", "out"),
    "gpu": ("count", "out"),
    "appo_vs_ppo": ("count", "world", "metrics", "config", "out"),
    "evaluate": ("seed", "count", "out"),
}


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict:
    request.addfinalizer(lambda: [h.kill() for h in _HOLDERS])
    return hostile.outcomes(request, tmp_path_factory, CASES, "test_hostile_tool", dict)


@pytest.mark.parametrize("case", hostile.params(CASES))
def test_hostile_tool(case: Case, outcomes):
    hostile.check(case, outcomes[case.id].result())  # (nothing new left: refused before any run)


def test_every_tool_meets_every_class():
    """At least two cases per tool and per class of input it takes."""
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    for name, classes in CLASSES.items():
        for cls in classes:
            n = sum(i.startswith(f"{name}-{cls}-") for i in ids)
            assert n >= 2, (name, cls, n)


def test_a_damaged_sweep_is_one_line_naming_the_file(tmp_path):
    """scaling.ipynb's reader (scaling_model.load_sweep): a sweep.json with a run whose world size is
    zero, a phase missing, text for a number or no runs is a UsageError naming the file and key."""
    import scaling_model

    from mpippo.config import UsageError
    good = json.loads((Path(scaling_model.__file__).parent / "data" / "sample" / "sweep.json").read_text())
    path = tmp_path / "sweep.json"
    for edit, expect in ((lambda s: s["runs"][1].update(world_size=0), "runs[1].world_size: expected at least 1"),
                         (lambda s: s["runs"][0]["phase_seconds"].pop("gae"), "runs[0].phase_seconds.gae: missing"),
                         (lambda s: s["runs"][0].update(fps="fast"), "runs[0].fps: expected a number"),
                         (lambda s: s.update(runs=[]), "runs: expected a non-empty list"),
                         (lambda s: s["runs"][0].update(fps=0.0, fps_steady=None), "expected a measured throughput"),
                         (lambda s: s["runs"][1].update(straggler_busy_rel=[1.0, 0.9]),
                          "runs[1].straggler_busy_rel: expected 103 quantiles, got 2"),
                         (lambda s: s["runs"][1].update(straggler_busy_rel=[1.0] * 102 + [-1.0]),
                          "runs[1].straggler_busy_rel: expected positive, finite, nondecreasing quantiles"),
                         (lambda s: s["runs"][1]["phase_seconds_per_rank"].update(allreduce=[0.1]),
                          "runs[1].phase_seconds_per_rank.allreduce: expected one time per rank (2), got 1")):
        sweep = json.loads(json.dumps(good))
        edit(sweep)
        path.write_text(json.dumps(sweep))
        with pytest.raises(UsageError) as e:
            scaling_model.load_sweep(path)
        assert len(e.value.errors) == 1 and expect in e.value.errors[0] and "sweep.json" in e.value.errors[0]
    path.write_bytes(b"\x00" * 10)
    with pytest.raises(UsageError, match="sweep file"):
        scaling_model.load_sweep(path)
    # the notebook's fallback for the straggler model: a metrics file, named when damaged
    metrics_file = tmp_path / "benchmark_metrics.json"
    metrics_file.write_text(json.dumps({"world_size": 2, "straggler_busy_rel": [1.0, float("nan")] * 51 + [2.0]}))
    s = scaling_model.load_sweep(Path(scaling_model.__file__).parent / "data" / "sample" / "sweep.json")
    with pytest.raises(UsageError, match="benchmark_metrics.json': straggler_busy_rel: expected positive, finite"):
        scaling_model.straggler_source(dict(s, straggler_runs=[]), metrics_file)


@pytest.mark.mpi
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGXCPU", "SIGHUP+SIGTERM+SIGINT"])
def test_a_tool_stopped_by_a_signal_leaves_no_run_or_folder_behind(tmp_path, sig):
    """benchmarks/cutoff_bench.py stopped while its first run trains: that run is killed, its
    temporary run folders and its job's shared-memory folder removed; one line, exit 4 (more
    signals while it unwinds change nothing)."""
    import os
    import signal
    import subprocess
    import time

    from conftest import ROOT, mpi_env
    from mpippo import leftovers
    env = {k: v for k, v in mpi_env().items() if k != leftovers.SHM_VAR}
    proc = subprocess.Popen([sys.executable, "benchmarks/cutoff_bench.py", "--slow", "0", "--iterations", "10000",
                             "--envs-per-rank", "2", "--n-steps", "8", "--no-learning", "--env", "toy-cue",
                             "--out", str(tmp_path / "r.json")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    mine = leftovers.owned_prefix("x").replace(f".{os.getpid()}-", f".{proc.pid}-").split("-x-")[1]
    places = [Path("/dev/shm"), Path(__import__("tempfile").gettempdir())]
    made = lambda: [p for d in places for p in d.iterdir() if mine in p.name]  # noqa: E731
    deadline = time.monotonic() + 120
    while not any((p / "0-None" / "benchmark_metrics.json").exists() for p in made()):  # its first run trains
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    assert len(made()) == 2  # a temporary folder, and the job's shared-memory folder
    job = _job_under(proc)
    for name in sig.split("+"):
        os.kill(proc.pid, getattr(signal, name))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err[-2000:]
    said = {f"mpippo: benchmarks/cutoff_bench.py: stopped by {'Ctrl-C' if name == 'SIGINT' else name}; nothing it "
            f"started is left running and its temporary folders are removed" for name in sig.split("+")}  # (pending ones: Python's order)
    assert err.strip().splitlines()[-1] in said and err.count("mpippo:") == 1, err[-2000:]
    assert "Traceback" not in err and made() == [] and not (tmp_path / "r.json").exists()
    assert not _still_running(job)


def _job_under(proc) -> list:
    """The training job a tool started: mpirun and its ranks, in a session of their own (so the tool's
    session never holds them); taken while it trains, to check afterwards that none is left."""
    import psutil
    job = psutil.Process(proc.pid).children(recursive=True)
    assert any("run_mpi.py" in " ".join(p.cmdline()) for p in job)
    return job


def _still_running(job: list) -> list:
    import psutil
    return [p for p in job if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _as_from_a_terminal():
    """Ctrl-C's default action, as a shell gives it: pytest-xdist's workers ignore SIGINT, and an
    ignored signal stays ignored in a child (Python then installs no KeyboardInterrupt handler)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# a tool (as benchmarks/peer_parity.py) training a run that resumes: the folder is kept
_RESUMABLE_TOOL = """
import sys
from pathlib import Path
from mpippo import toolcli
argv = ["--config", "configs/toy_cue.yaml", "--total-timesteps", "10000000", "--no-progress"]
main = lambda _: toolcli.run_trainer(1, argv, Path(sys.argv[1]), "toy", resume="the same command resumes it")
toolcli.exit_process(toolcli.run("tool", main, []))  # (as the tools end: a late Ctrl-C is ignored, not fatal)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("signals", ["SIGTERM+SIGTERM", "SIGINT+SIGINT"])
def test_a_tool_stopped_during_a_run_that_resumes_passes_the_stop_on(tmp_path, signals):
    """A tool stopped while a run it keeps trains (a multi-hour parity run): the run checkpoints where
    it is and stops, exit 4 with how to go on, instead of being killed and losing what it trained
    since its last periodic checkpoint (the toy config writes none before its end); a second SIGTERM
    changes nothing. A second Ctrl-C is a person's "now" (as mpippo.launch's): the job ends at once,
    inside an iteration that sleeps 60 s here, with nothing written and nothing left running. (The
    signals come once the first iteration is done: a stop during start-up ends a run with nothing to keep.)"""
    import os
    import signal
    import subprocess
    import time

    from conftest import ROOT, mpi_env
    from mpippo import leftovers, toolcli
    from mpippo.checkpoint import load_checkpoint
    hard = signals == "SIGINT+SIGINT"
    env = {k: v for k, v in mpi_env().items() if k != leftovers.SHM_VAR}
    # from the second iteration on, each sleeps (60 s; 8 s for SIGTERM): both signals land inside the second,
    # the second one while the tool waits for the checkpoint
    env["MPIPPO_FAULT"] = f"rank=0,iteration=2,kind=slow,count=1000,seconds={60 if hard else 8}"
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", _RESUMABLE_TOOL, str(run)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_as_from_a_terminal)
    deadline = time.monotonic() + 120
    while not (run / "benchmark_metrics.json").exists():  # its first iteration done: start-up is over
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    job = _job_under(proc)
    for name in signals.split("+"):
        os.kill(proc.pid, getattr(signal, name))
        time.sleep(2)  # (the second comes once the tool waits for the checkpoint, as a person's would)
    t0 = time.monotonic()
    for _ in range(5 if hard else 0):  # two Ctrl-Cs that land before the tool runs its handler are one
        if proc.poll() is not None:   # (a loaded machine need not schedule it within 2 s): a person presses
            break                     # again, as the test does
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err[-2000:]
    last = err.strip().splitlines()[-1]
    if hard:
        assert last == ("mpippo: tool: stopped by Ctrl-C; nothing it started is left running and its temporary "
                        "folders are removed"), err[-2000:]
        assert time.monotonic() - t0 < 30 and not (run / "checkpoints" / "latest.pt").exists()
    else:
        assert last == (f"mpippo: tool: toy in '{toolcli.shown(run)}' stopped on a signal (exit 4) with its "
                        f"checkpoint written; the same command resumes it"), err[-2000:]
        ckpt = load_checkpoint((run / "checkpoints" / "latest.pt").read_bytes())
        assert ckpt["iteration"] == 2  # where it was: the end of the iteration the signals came in
    assert "Traceback" not in err
    assert not _still_running(job)


def test_a_run_named_in_a_script_the_font_lacks_is_drawn_without_warnings(tmp_path):
    """A run folder named in CJK: its figure was written (the name as boxes) but four matplotlib warnings,
    each with a line of our source, followed it on a successful run."""
    import subprocess

    from conftest import ROOT
    for name, data in run_files(name="\u8bad\u7ec3").items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(data)
    res = subprocess.run([sys.executable, CURVES, str(tmp_path / "\u8bad\u7ec3"), "--out", str(tmp_path / "c.png")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and (tmp_path / "c.png").is_file() and "Warning" not in res.stderr, res.stderr[-1500:]


@pytest.mark.parametrize("script", [CURVES, CMP])
def test_a_tool_drawing_a_run_with_no_return_to_draw_says_so(tmp_path, script):
    """A run too young for a return point, or whose event files a tool or a copy replaced: the chart had
    empty axes (compare_results: an empty panel), exit 0, no word. It is still drawn (other runs beside it
    may have curves), with a note."""
    import subprocess

    from conftest import ROOT
    for name, data in run_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(data)
    out = tmp_path / ("c.png" if script == CURVES else "out")
    res = subprocess.run([sys.executable, script, str(tmp_path / "run"), "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and out.exists(), res.stderr[-1500:]
    assert "note: run: no return to draw: its logs/ hold no readable return points" in res.stdout, res.stdout


@pytest.mark.parametrize("args, lost", [(("TMP/run", "--out", "TMP/out"), "what it printed from there on is lost; "
                                         "the files it was asked to write are written"),
                                        (("--help",), "its help is lost")])
def test_a_tool_whose_console_is_on_a_full_disk_writes_its_files_and_ends_in_one_line(tmp_path, args, lost):
    """`compare_results ... > report.txt` on a full disk: the table's first line had ended the tool, exit 1,
    and the figure and report it was asked for were never written (evaluate's JSON alike: test_analysis).
    Its console is dropped now, its files are written, and its last line says what was lost, exit 1; its
    --help into a full disk had exited 0 with nothing shown."""
    import subprocess

    from conftest import ROOT
    for name, data in run_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(data)
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, CMP, *[a.replace("TMP/", f"{tmp_path}/") for a in args]], cwd=ROOT,
                             stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    said = [line for line in res.stderr.splitlines() if line.startswith("mpippo:")]
    assert res.returncode == 1 and said == [f"mpippo: error: compare_results: its console (stdout) could not be "
                                            f"written (No space left on device): {lost}"], res.stderr[-2000:]
    if args[0] != "--help":
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["comparison.png", "comparison_report.txt"]
