"""Files at names mpippo writes to or reads back, when something else stands there: a link is never
written through, a FIFO never waited on (a plain open of one blocks until the other side comes), and
each is named in one line. The logs we append to, the files we read back, the suite's submissions
record and evaluate's video."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mpippo import files
from mpippo.evaluate import Video
from mpippo.suite import spec, state, submit
from mpippo.usage import UsageError

from conftest import ROOT
from test_suite import TINY


@pytest.fixture
def theirs(tmp_path):
    """A file of the user's that a link planted at one of our names points to."""
    f = tmp_path / "theirs.txt"
    f.write_text("the user's data")
    return f


def test_a_log_is_appended_to_and_made_with_the_umask(tmp_path):
    log = tmp_path / "run.log"
    for line in ("one\n", "two\n"):
        with files.open_append(log, "the log") as f:
            f.write(line)
    assert log.read_text() == "one\ntwo\n" and log.stat().st_mode & 0o777 == files.file_mode()


@pytest.mark.parametrize("kind", ["link", "dangling", "fifo", "folder"])
def test_a_log_name_on_anything_but_a_file_is_refused_and_left_as_it_is(tmp_path, theirs, kind):
    log = tmp_path / "run.log"
    {"link": lambda: log.symlink_to(theirs), "dangling": lambda: log.symlink_to(tmp_path / "nowhere"),
     "fifo": lambda: os.mkfifo(log), "folder": log.mkdir}[kind]()
    said = {"link": "a symbolic link", "dangling": "a symbolic link", "fifo": "a FIFO", "folder": "a folder"}[kind]
    for check in (lambda: files.open_append(log, "the log"), lambda: files.check_appendable(log, "the log")):
        with pytest.raises(UsageError, match=f"the log '.*run.log': is {said}, not a file"):
            check()  # a FIFO without a reader: refused at once, no wait
    assert theirs.read_text() == "the user's data" and not (tmp_path / "nowhere").exists()


def test_files_read_back_name_a_fifo_or_folder_and_never_wait(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    for name, kind in (("fifo", "a FIFO"), ("folder", "a folder")):
        with pytest.raises(files.NotAFile, match=f"it is {kind}, not a file"):
            files.open_regular(tmp_path / name)
        with pytest.raises(UsageError, match=f"is {kind}, not a file"):
            files.read_bytes(tmp_path / name, "the file")
    with pytest.raises(UsageError, match="no such file"):
        files.read_bytes(tmp_path / "none", "the file")


def test_a_submission_is_recorded_whole_and_never_through_a_link(tmp_path, theirs):
    """The record is rewritten whole under the suite's lock (an append cut short by a full disk would
    leave a torn line that every later status refuses); a link there is replaced, its target kept."""
    suite = spec.load(TINY, tmp_path)
    suite.folder.mkdir(parents=True)
    first = {"job": 11, "manifest": "manifest-a.json", "members": [], "time": "t"}
    theirs.write_text(json.dumps(first) + "\n")
    (suite.folder / state.SUBMISSIONS).symlink_to(theirs)
    submit.record(suite, {"job": 12, "manifest": "manifest-b.json", "members": ["x"], "time": "u"})
    assert [r["job"] for r in state.submissions(suite)] == [11, 12]
    assert not (suite.folder / state.SUBMISSIONS).is_symlink() and theirs.read_text() == json.dumps(first) + "\n"
    assert not [p for p in suite.folder.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_record_names_the_queued_job(tmp_path, monkeypatch):
    suite = spec.load(TINY, tmp_path)
    suite.folder.mkdir(parents=True)

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files, "atomic_write_bytes", full)
    with pytest.raises(UsageError, match=r"sbatch queued job 12, but recording it .* \(No space left on device\)"
                                         r".*scancel 12"):
        submit.record(suite, {"job": 12, "manifest": "m.json", "members": [], "time": "t"})


def test_the_video_is_written_under_a_name_of_its_own_never_through_a_planted_link(tmp_path, theirs):
    """The temp file once had a fixed name beside the video (.play.tmp.mp4): a link planted there had
    ffmpeg write through it, and two evaluations of one --video shared it."""
    (tmp_path / ".play.tmp.mp4").symlink_to(theirs)
    frames = [np.full((8, 8, 3), i * 20, dtype=np.uint8) for i in range(6)]
    video = Video(tmp_path / "play.mp4", scale=2)
    for frame in frames:
        video.append(frame)
    assert video.finish() is None
    assert theirs.read_text() == "the user's data" and (tmp_path / ".play.tmp.mp4").is_symlink()
    assert (tmp_path / "play.mp4").stat().st_size > 0 and (tmp_path / "play.mp4").stat().st_mode & 0o777 == files.file_mode()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".play.tmp.mp4", "play.mp4", "theirs.txt"]


def test_a_video_is_encoded_as_it_comes_and_a_failure_leaves_nothing_but_its_reason(tmp_path):
    """Frames go to the encoder one by one (none are kept); a frame of another size ends the recording
    with its reason and removes the half-written file; one that kill -9 left is removed by the next."""
    from mpippo import leftovers
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / leftovers.owned_prefix("video").replace(f".{os.getpid()}-", f".{dead.pid}-")
    left = left.with_name(left.name + "abc.mp4")
    left.write_bytes(b"half a video")
    video = Video(tmp_path / "v.mp4", scale=1)
    for i in range(4):
        video.append(np.full((16, 16, 3), i * 40, dtype=np.uint8))
    assert video.frames == 4 and not hasattr(video, "_frames") and not left.exists()
    video.append(np.zeros((32, 32, 3), dtype=np.uint8))  # another size: the env's frame, refused before imageio
    assert video.error == "the env's frame 5 is of shape (32, 32, 3), the first was (16, 16, 3)" and video.bad_frame
    assert video.frames == 4 and video.finish() == video.error and list(tmp_path.iterdir()) == []
    for later, said in [(None, "is NoneType, not an array"), (np.zeros((16, 16, 3), np.float32),
                                                              "is float32 of shape (16, 16, 3), not (H, W, 3) uint8")]:
        video = Video(tmp_path / "v.mp4", scale=1)  # a renderer whose later frames break what its first kept
        video.append(np.zeros((16, 16, 3), dtype=np.uint8))
        video.append(later)
        assert video.finish() == f"the env's frame 2 {said}" and list(tmp_path.iterdir()) == []
    good = Video(tmp_path / "w.mp4")  # a small picture (an observation) is scaled up
    for i in range(3):
        good.append(np.full((16, 16, 3), i * 40, dtype=np.uint8))
    assert good.finish() is None and good.scale == 4 and [p.name for p in tmp_path.iterdir()] == ["w.mp4"]
    assert Video(tmp_path / "x.mp4").finish() == "no frame was recorded"


def test_a_file_swapped_for_a_fifo_after_its_check_is_still_refused_unread(tmp_path, monkeypatch):
    """read_bytes looks at the name, then opens it: what stands there by the open (a FIFO put in place
    of the file in between, as is_file answering for the old one stands for here) is checked again on the
    opened descriptor, never read blocking."""
    os.mkfifo(tmp_path / "swapped")
    monkeypatch.setattr(type(tmp_path), "is_file", lambda self: True)
    with pytest.raises(UsageError, match="the file '.*swapped': is a FIFO, not a file"):
        files.read_bytes(tmp_path / "swapped", "the file")


def test_a_fresh_log_is_a_new_file_and_a_hard_links_other_name_keeps_its_bytes(tmp_path, theirs):
    """A tool starting a run afresh removes its old log by name before making a new one: truncating in
    place would empty a user's file hard-linked there."""
    log = tmp_path / "stdout.txt"
    os.link(theirs, log)
    files.remove_file(log)
    with files.open_append(log, "the log") as f:
        f.write("fresh\n")
    assert log.read_text() == "fresh\n" and theirs.read_text() == "the user's data"
    os.mkfifo(tmp_path / "fifo")
    files.remove_file(tmp_path / "fifo")  # not a file: left for open_append to refuse by name
    files.remove_file(tmp_path / "none")
    assert (tmp_path / "fifo").exists()


def test_pruning_removes_only_the_periodic_checkpoints_it_wrote_oldest_by_number(tmp_path):
    """keep_last prunes the periodic checkpoints by their number, not their names' text (past 9,999,999
    iterations the name grows a digit), and never a file of the user's beside them (a copy named
    ckpt_0000050_best.pt matched the old glob and was deleted), a link, or the one just written."""
    from mpippo.checkpoint import periodic_checkpoints, save_checkpoint
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    mine = {"ckpt_0000050_best.pt": b"best", "ckpt_old.pt": b"notes", "ckpt_0000001.pt.bak": b"bak"}
    for name, data in mine.items():
        (ckpt / name).write_bytes(data)
    (tmp_path / "elsewhere.pt").write_bytes(b"theirs")
    (ckpt / "ckpt_0000002.pt").symlink_to(tmp_path / "elsewhere.pt")
    for it in (9_999_998, 9_999_999, 10_000_000, 10_000_001):
        save_checkpoint(ckpt, {"iteration": it}, it, keep_last=2)
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        [*mine, "ckpt_0000002.pt", "ckpt_10000000.pt", "ckpt_10000001.pt", "latest.pt"])
    assert all((ckpt / name).read_bytes() == data for name, data in mine.items())
    assert (tmp_path / "elsewhere.pt").read_bytes() == b"theirs"
    save_checkpoint(ckpt, {"iteration": 7}, 7, keep_last=1)  # a resume from an older one: what it writes stays
    assert (ckpt / "ckpt_0000007.pt").exists() and (ckpt / "latest.pt").samefile(ckpt / "ckpt_0000007.pt")
    for it in (8, 9):  # ... and it prunes its own line only: the newer ones it resumed before stay
        save_checkpoint(ckpt, {"iteration": it}, it, keep_last=2)
    periodic = [p.name for p in periodic_checkpoints(ckpt)]
    assert periodic == ["ckpt_0000008.pt", "ckpt_0000009.pt", "ckpt_10000000.pt", "ckpt_10000001.pt"], periodic


@pytest.mark.parametrize("where", ["metrics", "rename", "thread", "other"])
def test_a_full_disk_mid_run_is_one_line_wherever_the_write_fails(tmp_path, where):
    """A write that fails for want of room (ENOSPC; EDQUOT, EROFS, EIO alike), in whatever writer of a
    run (benchmark_metrics.json in the main thread, TensorBoard's writer thread), ends the rank through
    its abort hook with one line naming the file where the error names one, exit 1; the file written
    before is kept, no temporary file is left. Any other unhandled error keeps its traceback (a bug)."""
    target = tmp_path / "benchmark_metrics.json"
    target.write_text("{}")
    script = textwrap.dedent(f"""
        import errno, os, sys, threading
        sys.path.insert(0, {str(ROOT)!r})
        from mpippo.comm import World
        from mpippo import files
        World().install_abort_hook()
        def full(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if {where!r} == "metrics":
            os.fsync = full
            files.atomic_write_json({str(target)!r}, {{"fps": 1.0}})
        elif {where!r} == "rename":  # the rename names our hidden temporary file, not the one it makes
            def fail(src, dst):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src, dst)
            os.replace = fail
            files.atomic_write_json({str(target)!r}, {{"fps": 1.0}})
        elif {where!r} == "thread":  # as TensorBoard's event writer fails, in a thread of its own
            t = threading.Thread(target=full, args=(0,))
            t.start()
            t.join()
        else:
            open({str(tmp_path / "missing" / "x")!r})
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    if where == "other":
        assert res.returncode == 1 and "Traceback" in res.stderr and "FileNotFoundError" in res.stderr
        return
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    named = f"writing '{target}'" if where in ("metrics", "rename") else "writing a file (or the console)"
    assert res.stderr.startswith(f"mpippo: error: {named} failed (No space left on device); what was written "
                                 "before is kept"), res.stderr
    assert target.read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == [target.name]


@pytest.mark.parametrize("raised, said", [("SecondInterrupt", "a second Ctrl-C"),
                                          ("KeyboardInterrupt", "Ctrl-C (KeyboardInterrupt)")])
def test_a_ctrl_c_that_ends_a_rank_at_once_is_one_line_with_exit_130(raised, said):
    """A person's second Ctrl-C (preemption raises SecondInterrupt) is their "now": one line, exit 130
    (a shell's code for Ctrl-C), no traceback; a KeyboardInterrupt that is not ours (Python's default
    handler, put back by a library) is not called a second one."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from mpippo.comm import World
        from mpippo.errors import SecondInterrupt
        World().install_abort_hook()
        raise {raised}
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 130 and res.stderr == (f"mpippo: stopped at once by {said}, without a checkpoint of this "
                                                    "iteration (--resume continues from the last checkpoint, if one "
                                                    "was written)\n"), res.stderr
