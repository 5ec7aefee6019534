"""benchmarks/peer_parity.py's side of a CleanRL run that spans sittings: a stop signal to the tool goes on
to the script, which checkpoints and exits 4 (the tool then says how to go on, exit 4 as mpippo's runs);
the next call resumes it, its output appended; a script that does not checkpoint is killed, and the stop
ends the tool as any stop does. The script here stands in for CleanRL's (RESUMABLE's edits, which need
the real script and EnvPool, run in the parity runs themselves)."""
import dataclasses
import json
import signal
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import peer_parity  # noqa: E402
from mpippo import toolcli  # noqa: E402

# prints episodes as CleanRL does, one per "iteration"; SIGTERM -> checkpoint.pt (its step), exit 4
STAND_IN = '''
import os, signal, sys, time
stop = []
if "{checkpoints}" == "yes":
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
step = int(open("checkpoint.pt").read()) if os.path.exists("checkpoint.pt") else 0
total = int(sys.argv[sys.argv.index("--total-timesteps") + 1])
print("started", flush=True)
while step < total:
    step += 100
    print(f"global_step={{step}}, episodic_return={{step / 100 - 21}}")
    print("SPS: 250", flush=True)
    time.sleep(0.05)
    if stop:
        open("checkpoint.pt", "w").write(str(step))
        sys.exit(4)
'''


def family(tmp_path: Path, checkpoints: bool) -> peer_parity.Family:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN.format(checkpoints="yes" if checkpoints else "no"))
    return peer_parity.Family("unused.yaml", str, "atari:{}", "{}-v5", lambda: script, lambda: "", ("Pong",), 2000,
                              "x")


def stop_once_started(folder: Path):
    """SIGTERM to this process once the stand-in printed its first line, as a user's kill of the tool."""
    def fire():
        log = folder / "stdout.txt"
        for _ in range(400):
            if log.exists() and "started" in log.read_text():
                break
            threading.Event().wait(0.05)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # (to the thread waiting on the script)
    t = threading.Thread(target=fire)
    t.start()
    return t


@pytest.fixture
def tool_handlers():
    """The tool's stop handlers (toolcli.run installs them), restored after."""
    old = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, toolcli._raise_stopped)
    yield
    toolcli._stopping.clear()
    signal.signal(signal.SIGTERM, old)


def test_a_stop_is_passed_on_and_the_next_call_resumes_with_the_output_appended(tmp_path, tool_handlers):
    fam, folder = family(tmp_path, checkpoints=True), tmp_path / "cleanrl-Pong-s1"
    t = stop_once_started(folder)
    with pytest.raises(toolcli.RunStopped, match="stopped on a signal with its checkpoint written; the same "
                                                 "command resumes it"):
        peer_parity.run_cleanrl(fam, "Pong", 1, 200_000, folder)
    t.join()
    stopped_at = int((folder / "checkpoint.pt").read_text())
    assert 0 < stopped_at < 200_000 and not (folder / "finished").exists()
    toolcli._stopping.clear()
    res = peer_parity.run_cleanrl(fam, "Pong", 1, stopped_at + 300, folder)
    steps = [s for s, _ in res["curve"]]
    assert res["resumed"] and (folder / "finished").exists()
    assert steps == list(range(100, stopped_at + 400, 100))  # the first part's episodes kept, then the resumed ones
    assert res["steps_per_s"] == 250


def test_a_script_that_does_not_checkpoint_is_killed_and_the_stop_ends_the_tool(tmp_path, tool_handlers):
    fam, folder = family(tmp_path, checkpoints=False), tmp_path / "cleanrl-Pong-s1"
    t = stop_once_started(folder)
    with pytest.raises(toolcli.Stopped):
        peer_parity.run_cleanrl(fam, "Pong", 1, 200_000, folder)
    t.join()
    assert not (folder / "checkpoint.pt").exists() and not (folder / "finished").exists()


def test_the_resumable_edits_touch_no_learning_line():
    """RESUMABLE adds lines around the script's own: each edit keeps the text it replaces, except the env's
    seed, the first step and iteration, and the rate (which count from the resumed point)."""
    changed = [old for old, new in peer_parity.RESUMABLE if old not in new]
    assert all(any(word in old for word in ("seed=", "global_step = 0", "range(1,", "SPS")) for old in changed), changed


def test_the_adapted_copy_follows_its_edits(tmp_path, monkeypatch):
    """The copy of a CleanRL script names the edits it holds: the same edits reuse it, other edits make a
    new one from the pristine text kept on first read (offline: no copy of the script needed again);
    a line to adapt that the script lacks is refused."""
    import peers
    monkeypatch.setattr(peers, "PEERS", tmp_path / "peers")
    original = tmp_path / "cleanrl.py"
    original.write_text("lr = 1\nsteps = 2\n")
    monkeypatch.setenv("MPIPPO_TEST_SCRIPT", str(original))
    first = peers.adapted_script("x.py", "MPIPPO_TEST_SCRIPT", [("lr = 1", "lr = 3")], "copy.py")
    assert first.read_text().splitlines()[1:] == ["lr = 3", "steps = 2"]
    monkeypatch.delenv("MPIPPO_TEST_SCRIPT")
    original.unlink()  # from here on only the kept pristine text can serve
    stamp = first.stat().st_mtime_ns
    assert peers.adapted_script("x.py", "MPIPPO_TEST_SCRIPT", [("lr = 1", "lr = 3")], "copy.py") == first
    assert first.stat().st_mtime_ns == stamp  # reused as it was
    peers.adapted_script("x.py", "MPIPPO_TEST_SCRIPT", [("lr = 1", "lr = 3"), ("steps = 2", "steps = 5")], "copy.py")
    assert first.read_text().splitlines()[1:] == ["lr = 3", "steps = 5"]  # not the old edits'
    with pytest.raises(ValueError, match="lacks a line to adapt: epochs"):
        peers.adapted_script("x.py", "MPIPPO_TEST_SCRIPT", [("epochs = 4", "epochs = 1")], "copy.py")
    assert first.read_text().splitlines()[1:] == ["lr = 3", "steps = 5"]  # a refused call changes nothing


def test_a_local_cleanrl_copy_that_is_not_there_is_bad_input_not_a_failure(tmp_path, monkeypatch):
    """MPIPPO_CLEANRL_ATARI / _CONTINUOUS naming no file is the user's input: a UsageError (one line,
    exit 2), not the ToolFailure (exit 1) of a pinned script that lacks a line to adapt."""
    import atari_throughput
    import peers
    from mpippo.usage import UsageError
    monkeypatch.setattr(peers, "PEERS", tmp_path / "peers")
    for var, made in (("MPIPPO_CLEANRL_ATARI", atari_throughput.cleanrl_script),
                      ("MPIPPO_CLEANRL_ATARI", peer_parity.atari_script),
                      ("MPIPPO_CLEANRL_CONTINUOUS", peer_parity.continuous_script)):
        monkeypatch.setenv(var, str(tmp_path / "nowhere.py"))
        with pytest.raises(UsageError, match=f"{var}.*no such file"):
            made()
        monkeypatch.delenv(var)


def test_a_run_on_another_rank_count_is_named_for_it_and_trained_on_it(tmp_path, monkeypatch):
    """--ranks 1 (CleanRL's layout, one process of 8 envs): mpippo's run gets its own name and folder, so it
    never resumes or replaces the 2-rank run of the same seed; CleanRL's keeps its name (one process always)."""
    calls = []

    def fake(fam, env, seed, steps, folder, precision=None, apex=False, ranks=2):
        calls.append((folder.name, ranks))
        return {"wall_s": 1.0, "steps_per_s": 1.0, "curve": [(steps, 1.0)], "final_return": 1.0, "episodes": 1}
    monkeypatch.setattr(peer_parity, "run_mpippo", fake)
    monkeypatch.setattr(peer_parity, "run_cleanrl", lambda fam, env, seed, steps, folder: fake(fam, env, seed, steps,
                                                                                               folder, ranks=None))
    monkeypatch.setitem(peer_parity.FAMILIES, "atari", dataclasses.replace(
        peer_parity.FAMILIES["atari"], script=lambda: tmp_path / "script.py", peer_path=lambda: ""))
    argv = ["--family", "atari", "--envs", "Pong", "--seeds", "1", "--runs", str(tmp_path / "r"), "--out",
            str(tmp_path / "o"), "--steps", "4096"]
    assert peer_parity._main(argv + ["--ranks", "1"]) == 0
    assert peer_parity._main(argv) == 0  # the 2-rank run is not the 1-rank one's: it runs too
    assert calls == [("mpippo-Pong-s1-1rank", 1), ("cleanrl-Pong-s1", None), ("mpippo-Pong-s1", 2)]
    runs = json.loads((tmp_path / "o" / "runs.json").read_text())
    assert set(runs) == {"mpippo-Pong-s1-1rank", "cleanrl-Pong-s1", "mpippo-Pong-s1"}
    # the field the analysis keeps layouts apart by (the names are only for people)
    assert runs["mpippo-Pong-s1-1rank"]["ranks"] == 1 and runs["mpippo-Pong-s1"]["ranks"] == 2
    assert "ranks" not in runs["cleanrl-Pong-s1"]


def test_a_run_folder_without_a_checkpoint_is_set_aside_never_removed(tmp_path, monkeypatch):
    """A run killed before its first checkpoint, or whose latest checkpoint was removed, holds nothing to
    resume: its folder is renamed aside whole (the old code removed it, other checkpoints and logs included)
    and the run starts afresh; a folder with its latest checkpoint resumes in place."""
    started = []

    def trainer(ranks, argv, folder, what, **kw):
        started.append((folder.exists(), "--resume" in argv))
        return {"fps_steady": 1.0, "episode_return_mean": 0.0, "episodes": 1, "precision": "fp32"}
    monkeypatch.setattr(peer_parity, "run_trainer", trainer)
    monkeypatch.setattr("mpippo.runs.read_curve", lambda logs: ([], [], []))
    fam, folder = peer_parity.FAMILIES["mujoco"], tmp_path / "runs" / "mpippo-Hopper-v5-s1"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "ckpt_0000004.pt").write_bytes(b"weights")
    peer_parity.run_mpippo(fam, "Hopper-v5", 1, 4096, folder)
    aside = [p for p in folder.parent.iterdir() if p.name.startswith("mpippo-Hopper-v5-s1.attempt-")]
    assert started == [(False, False)] and len(aside) == 1
    assert (aside[0] / "checkpoints" / "ckpt_0000004.pt").read_bytes() == b"weights"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "latest.pt").write_bytes(b"weights")
    peer_parity.run_mpippo(fam, "Hopper-v5", 1, 4096, folder)
    assert started[-1] == (True, True)


def test_cleanrl_rates_that_round_to_one_instant_give_the_overall_rate():
    """CleanRL prints whole steps/s: two iterations whose end times round to one instant (or cross) had
    divided by zero, or given a negative rate."""
    import peers  # (benchmarks/: on the path above)
    assert peers.steady_sps("SPS: 500\nSPS: 1000\n", 100) == (1000, 1000.0)
    assert peers.steady_sps("SPS: 500\nSPS: 1200\n", 100) == (1200, 1200.0)
    steady, overall = peers.steady_sps("SPS: 100\nSPS: 150\nSPS: 180\n", 100)
    assert steady == pytest.approx(2 * 100 / (300 / 180 - 1)) and overall == 180.0
