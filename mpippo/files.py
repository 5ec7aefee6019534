"""The files mpippo writes: written atomically, read back or refused in one line.

Writing (every output of a run, a suite, a tool): a temp file next to the target, fsync, os.replace,
fsync of the folder, so a reader sees the previous complete file or the new one, never a torn one,
whatever kills the writer; each file gets the mode the umask gives (file_mode), so a teammate reads
a run as any file of its owner; an early exit removes the folders it made (missing_folders,
remove_if_empty), never a file someone put there.

Reading: the files mpippo wrote earlier, or saying in one line why a file is not one.

Every reader of a run's or a suite's own files goes through here: benchmark_metrics.json, a run's
config.yaml, a suite's manifests and submissions.jsonl, a sweep's or a benchmark's results. Such a
file may have been damaged, truncated, replaced by hand or by another tool, or be something else
under the expected name: each problem is a UsageError whose one line names the file and what is
wrong with it (the entry points print it as `mpippo: error: ...`, exit 2). Nothing here runs code:
JSON and safe YAML build plain data only.
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from mpippo import config as C
from mpippo.config import UsageError, load_yaml, show
from mpippo.errors import os_reason, run_folder_gone
from mpippo.metrics import keys
from mpippo.usage import file_kind

MAX_JSON_BYTES = 64 << 20  # our JSON files are kilobytes (a long sweep: a few MB); more is not one of ours
LOG_LIMIT = 4 << 30  # a peer's console log read back whole: a line per episode over up to 10**9 steps
METRICS = "benchmark_metrics.json"
RUN_CONFIG = "config.yaml"  # the config a run ran with (cli writes it; a resume and the tools read it)
LOGS = "logs"  # its TensorBoard event files (metrics/sinks.py)


# ---- writing ----
def atomic_write_bytes(path: str | Path, data: bytes, _midway=None) -> None:
    """`_midway` (tests only) runs after half of the data is written, to kill or fail the write there."""
    def write(f):
        if _midway is not None:
            f.write(data[: len(data) // 2])
            f.flush()
            _midway()
            f.write(data[len(data) // 2:])
        else:
            f.write(data)
    atomic_write_with(path, write)


def file_mode() -> int:
    """The mode of a new file as this process's umask makes it (0644 under the common 022; 0664 for a
    group-shared project under 002): what an atomic write gives its file instead of mkstemp's 0600,
    so a teammate reads a run as they read any file of its owner. /proc's reading is thread-safe;
    the umask call pair is the fallback elsewhere."""
    try:
        with open("/proc/self/status") as f:
            mask = next(int(x.split()[1], 8) for x in f if x.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def atomic_write_with(path: str | Path, write) -> None:
    """Call write(binary file) on a temp file next to `path`, fsync, rename over `path`, fsync the folder.
    For outputs too large to build in memory first (the replay buffer)."""
    path = Path(path)
    if run_folder_gone(path):  # a run folder moved away (`mv runs/x runs/y`) had been made again, empty and
        # unlocked, by the next write, which went on there (a second --resume of the old path was let in)
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.filename in (None, tmp):  # a failed write names no file, the rename
            raise OSError(e.errno, e.strerror, str(path)) from e      # our hidden temporary one: the target's
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def open_append(path: str | Path, what: str):
    """A log of ours to append to (text), made if missing: never through a link, never blocking on a
    FIFO (a reader-less FIFO would hold the open forever); a name that is anything but a regular file
    is refused in one line naming it."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o666)  # the umask applies, as to any file of the user's
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a link, a reader-less FIFO, a folder
            check_appendable(path, what)
        raise _problem(path, what, f"cannot write it ({os_reason(e)})") from None
    try:
        _refuse_other_kind(path, what, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "a", encoding="utf-8", errors="replace")


def remove_file(path: str | Path) -> None:
    """Remove `path` if it is a regular file (only this name of it: a hard link's other names keep their
    bytes); anything else by that name is left for open_append to refuse by name."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def check_appendable(path: str | Path, what: str) -> None:
    """`path` is free or a regular file (not a link, FIFO, folder or device): what a shell's `>>` may
    open (slurm/suite_member.sh checks through here first)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise _problem(Path(path), what, f"cannot look at it ({os_reason(e)})") from None
    _refuse_other_kind(Path(path), what, mode)


def _refuse_other_kind(path: Path, what: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise _problem(path, what, f"is {file_kind(mode)}, not a file; mpippo writes its logs to files of its own "
                                   f"only: remove or rename it")


class NotAFile(OSError):
    """What open_regular found by the name instead of a file (`kind`: 'a FIFO', 'a folder', ...)."""

    def __init__(self, kind: str):
        super().__init__(f"it is {kind}, not a file")
        self.kind = kind


def open_regular(path: str | Path):
    """A file of ours to read back in binary (a link to one is followed), opened without blocking: a
    FIFO by that name would hold a plain open until someone writes to it. Anything but a regular file
    is NotAFile, naming its kind."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotAFile(file_kind(mode))
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def absolute(path: Path | None, flag: str) -> Path | None:
    """A path the user gave, fixed to the folder the command started in: a user's env may change the
    working folder (os.chdir in its constructor), and what was checked here would be written elsewhere.
    (A folder removed under the command: one line.)"""
    try:
        return None if path is None else Path(path).absolute()
    except OSError as e:
        raise UsageError(f"{flag}: '{show(str(path))[1:-1]}' is relative, and the current folder is gone "
                         f"({os_reason(e)}); give an absolute path") from None


def path_text(path: str | Path) -> str:
    """A path as text to show or to write into JSON: its bytes read as UTF-8, what is not written as its
    escape. Under a locale whose file names are not UTF-8 (LC_ALL=C without UTF-8 mode) Python holds a
    UTF-8 name's bytes as lone surrogates, which went into evaluate's JSON as such (no reader can open
    that path) and into messages as unreadable escapes; a name holding a surrogate of its own stays as it is."""
    try:
        return os.fsencode(str(path)).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return str(path)


def not_utf8(path: str | Path) -> str | None:
    """Why a path is no UTF-8 text, or None. TensorBoard's writer and reader encode a run's path as
    UTF-8: a folder whose name holds another encoding's byte failed there with a traceback."""
    try:
        raw = os.fsencode(str(path))
        raw.decode("utf-8")
    except UnicodeEncodeError:  # (a lone surrogate read back from JSON: no file's name holds one)
        return "its name holds a character no file name can (a lone surrogate)"
    except UnicodeDecodeError as e:
        return f"its name is not UTF-8 (byte 0x{raw[e.start]:02x})"
    if not str(path).isascii() and sys.getfilesystemencoding() != "utf-8":  # (its bytes read as escapes or latin-1)
        return (f"this process's file names are {sys.getfilesystemencoding()} (its locale's), not UTF-8, so this "
                f"path's non-ASCII part cannot be written as UTF-8 (a UTF-8 locale, e.g. LC_ALL=C.UTF-8, can)")
    return None


def missing_folders(folder: Path) -> list[Path]:
    """`folder` and its parents that do not exist yet, outermost first: what a mkdir(parents=True)
    of it will create, so that an early exit can remove exactly those (remove_if_empty)."""
    folder = Path(folder)
    return [p for p in reversed([folder, *folder.parents]) if not p.exists()]


def remove_if_empty(folders: list[Path]) -> None:
    """Remove `folders` innermost first while they are empty: a file someone put there is never lost."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            return


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


# ---- reading ----
def _problem(path: Path, what: str, why: str) -> UsageError:
    return UsageError(f"{what} '{show(str(path))[1:-1]}': {why}")


def read_bytes(path: str | Path, what: str, limit: int = MAX_JSON_BYTES) -> bytes:
    """The file's bytes: it must exist, be a file, and hold at most `limit` bytes."""
    path = Path(path)
    if "\0" in str(path):  # (os.open would raise ValueError: a name read back from a damaged file may hold one)
        raise _problem(path, what, "its name holds a NUL byte, which no file's name can")
    try:
        with open_regular(path) as f:  # its kind and size from the opened descriptor: no swap in between
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise _problem(path, what, f"{size:,} bytes, more than the {limit:,} such a file can hold; "
                                           f"it is not one mpippo wrote")
            return f.read()
    except NotAFile as e:
        raise _problem(path, what, f"is {e.kind}, not a file") from None
    except (FileNotFoundError, NotADirectoryError):  # (a dangling link, a path through a file)
        raise _problem(path, what, "no such file") from None
    except OSError as e:  # permissions, a name too long, an I/O error, a path through a file
        raise _problem(path, what, f"cannot read it ({os_reason(e)})") from None


def read_text(path: str | Path, what: str, limit: int = MAX_JSON_BYTES) -> str:
    raw = read_bytes(path, what, limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _problem(Path(path), what, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def _parse_json(text: str, path: Path, what: str, where: str = "") -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _problem(path, what, f"not valid JSON ({where}line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise _problem(path, what, "not valid JSON (nested too deeply)") from None
    except ValueError:  # Python's guard against quadratic int parsing: more than 4,300 digits
        raise _problem(path, what, "not valid JSON (a number of more than 4,300 digits)") from None


def read_json(path: str | Path, what: str, kind: type = dict) -> Any:
    """A JSON file whose top level is a `kind` (dict or list)."""
    path = Path(path)
    data = _parse_json(read_text(path, what), path, what)
    if not isinstance(data, kind):
        raise _problem(path, what, f"expected a JSON {'object' if kind is dict else 'array'} at the top level, "
                                   f"got {show(data)}")
    return data


def read_jsonl(path: str | Path, what: str) -> list[dict]:
    """A file of one JSON object per line (blank lines skipped); a bad line is named by its number."""
    path = Path(path)
    rows = []
    for n, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        row = _parse_json(line, path, what, where=f"line {n}: ")
        if not isinstance(row, dict):
            raise _problem(path, what, f"line {n}: expected a JSON object, got {show(row)}")
        rows.append(row)
    return rows


def read_yaml(path: str | Path, what: str) -> dict:
    """A YAML file mpippo wrote whose top level is a mapping (the config loader's checks: size, UTF-8, safe
    constructors only, no duplicate keys), its problems named with `what`."""
    try:
        return load_yaml(path, ours=True)
    except UsageError as e:
        raise UsageError(f"{what}: {e.errors[0]}") from None


def read_run_config(folder: str | Path):
    """A run folder's config.yaml as a Config (types checked; what the job derives from its size and machine as
    asked, config.layout.saved_form; the metrics say what those were)."""
    path = Path(folder) / RUN_CONFIG
    data = C.with_earlier_defaults(read_yaml(path, "run config"))
    errors: list[str] = []
    cfg = C.from_dict(data, errors)
    if errors:
        raise _problem(path, "run config", errors[0])
    return cfg


# benchmark_metrics.json's typed keys (metrics/keys.py), by type: a file that holds them with other types
# (hand-edited, damaged, another tool's) is refused instead of being read as numbers it does not hold
_TABLES = (keys.COMMON, keys.SYNC_PPO, keys.ACTOR_LEARNER)
_INTS = tuple(k for table in _TABLES for k, (kind, _) in table.items() if kind.rstrip("?") == "int")
_NUMBERS = tuple(k for table in _TABLES for k, (kind, _) in table.items() if kind.rstrip("?") == "number")


def is_count(v: Any) -> bool:
    """A JSON value a count may be: a non-negative int a 64-bit counter holds (JSON's ints are
    unbounded; one of 400 digits overflows the first float division a reader does)."""
    return type(v) is int and 0 <= v <= C.INT64_MAX


# float32's largest: the trainer computes its measurements in float32 or rounds them from float64 ones of
# its own, and a figure's axis limits overflow with a value near float64's largest (1.7e308)
MAX_MEASURE = 3.4028234663852886e38


def is_number(v: Any) -> bool:
    """A JSON value a measurement may be: int or float, not bool, of at most MAX_MEASURE in size, or
    NaN ('not measured')."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return abs(v) <= C.INT64_MAX if isinstance(v, int) else (math.isnan(v) or abs(v) <= MAX_MEASURE)


def not_a_number(v: Any) -> str:
    """The words for a value is_number refuses."""
    past = type(v) is float and math.isfinite(v) and abs(v) > MAX_MEASURE  # (an int is refused past 2**63)
    return f"expected a number, got {show(v)}" + (f" (past {MAX_MEASURE:.3g}, float32's largest)" if past else "")


def check_metrics(m: dict, path: Path) -> dict:
    """The typed keys of a metrics dict (present ones; readers treat absent ones as unknown)."""
    what = "metrics file"
    for key in _INTS:
        v = m.get(key)
        if v is not None and not is_count(v):
            bound = " below 2**63" if type(v) is int and v > 0 else ""
            raise _problem(path, what, f"{key}: expected a non-negative integer{bound}, got {show(v)}")
    if m.get("world_size") == 0:
        raise _problem(path, what, "world_size: expected at least 1 rank, got 0")
    for key in _NUMBERS:
        v = m.get(key)
        if v is not None and not is_number(v):
            raise _problem(path, what, f"{key}: {not_a_number(v)}")
    if "finished" in m and not isinstance(m["finished"], bool):
        raise _problem(path, what, f"finished: expected true or false, got {show(m['finished'])}")
    if m.get("stop_reason") is not None and m["stop_reason"] not in keys.STOP_REASONS:
        raise _problem(path, what, f"stop_reason: {show(m['stop_reason'])} is not one of {', '.join(keys.STOP_REASONS)}")
    return m


def write_metrics(run_dir: str | Path, values: dict, layout: dict) -> dict:
    """benchmark_metrics.json in `run_dir`, atomically: `values` must hold every key of keys.COMMON and
    of the layout's table (keys.SYNC_PPO, keys.ACTOR_LEARNER) with its type. A value that does not is a
    bug, said on stderr in one line; the file is still written (it holds the run's figures)."""
    bad = keys.problems(values) + keys.problems(values, layout)
    if bad:
        print(f"mpippo: warning: {METRICS}: {'; '.join(bad)[:300]}", file=sys.stderr, flush=True)
    atomic_write_json(Path(run_dir) / METRICS, values)
    return values


def read_metrics(folder: str | Path) -> dict:
    """A run folder's benchmark_metrics.json, its typed keys checked."""
    path = Path(folder) / METRICS
    return check_metrics(read_json(path, "metrics file"), path)
