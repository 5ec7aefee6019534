"""The command line of the analysis and benchmark tools: bad input is one line and exit 2.

Every tool (analysis/*.py, benchmarks/*.py; benchmarks import this module from analysis/) does the
same, before it starts any run or writes anything:
  - parses with `Parser`, whose option types (`count`, `number`, `seed`) name the bad value and the
    allowed range;
  - checks its outputs with `output_file` / `output_folder` (a probe written and removed where the
    output will go; folders made for it removed again), and the trainer options it will pass with
    `check_trainer` (the trainer's own checks, in this process);
  - reads the files mpippo wrote through mpippo/files.py, and checks the parts it uses with `conform`;
  - runs its main through `run`, which prints a UsageError as `mpippo: error: <tool>: <line>`, exit 2,
    and a `ToolFailure` (a run or a write that failed after the checks) the same way, exit 1; a
    SIGTERM, SIGHUP, SIGXCPU or Ctrl-C unwinds the tool (its runs killed, its temporary folders removed:
    launch.temp_folder), one line, exit 4.
Outputs are written atomically (`write_bytes`, `write_json`, `save_figure`).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

from mpippo.checkpoint import CHECKPOINTS, latest_path
from mpippo.files import (LOGS, METRICS, RUN_CONFIG, atomic_write_bytes, is_count, is_number, missing_folders, not_a_number,
                          path_text, remove_if_empty)
from mpippo.metrics.sinks import WANDB_DIR, WANDB_ID
from mpippo.runlock import LOCK_NAME
from mpippo import config as C
from mpippo import launch, preemption, runctl, shutdown
from mpippo.config import INT64_MAX, UsageError, show
from mpippo.usage import file_kind, reason, refusal
from mpippo.leftovers import temp_folder_problem
from mpippo.errors import (FILE_SYSTEM_FULL, RankFailure, console_lost, file_system_failure, in_users_code_since,
                           let_readers_leave, limit_failure, os_reason, say_last)
from mpippo.config.memory import ranks_fit  # noqa: F401 (the tools' check, with theirs)
from mpippo.preemption import EXIT_REQUEUE, unblock
from mpippo.usage import Parser as _Parser

ROOT = Path(__file__).resolve().parent.parent  # the repository: run_mpi.py, configs/

EXIT_FAILURE, EXIT_USAGE, EXIT_STOPPED = 1, 2, 4  # EXIT_STOPPED: as the trainer's (mpippo/preemption.py)
SEED_MAX = INT64_MAX  # seeds end up in int64 arrays and torch's 64-bit generator
MAX_RANKS = 4096


def Parser(**kwargs) -> _Parser:
    """The tools' parser: usage.Parser, its errors one line that `run` prints after the tool's name."""
    return _Parser(what="", **kwargs)


def about(doc: str) -> str:
    """A tool's --help description: its docstring's first paragraph, whole (a first line alone may stop
    mid-sentence)."""
    return " ".join(doc.split("\n\n")[0].split())


class ToolFailure(RuntimeError):
    """A run or a write that failed after every check passed: one line, exit 1."""


class RunStopped(ToolFailure):
    """A run the tool started stopped on a signal after writing its checkpoint (the trainer's exit 3
    or 4): the tool ends with the trainer's exit 4, stopped and resumable."""


class Stopped(BaseException):
    """A stop signal to a tool: raised where it runs, so that every `with` unwinds (runs killed,
    temporary folders removed) before the tool exits."""

    def __init__(self, signum: int):
        super().__init__(signal_words(signum))
        self.signum = signum


def signal_words(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def stopped_line(tool: str, signum: int) -> str:
    """A tool's last line after a stop signal (its `with` blocks unwound, or the hang watch's end). Said alike
    by the tools that start runs (the suite, the benchmarks) and those that start none (evaluate)."""
    return (f"mpippo: {tool}: stopped by {signal_words(signum)}; nothing it started is left running and its "
            f"temporary folders are removed")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGXCPU)  # (SIGXCPU: a soft CPU-time limit)


def first_stop(came: list[int]) -> int | None:
    """A tool's rule over the signals as they came (preemption.SignalLog): its first stop ends it."""
    return next((sig for sig in came if sig in STOP_SIGNALS), None)


def watch_startup(tool: str, who: str, hang_s: Callable[[], float], ended: Callable[[int, Callable[[str], str]], None]):
    """A tool's start-up that runs the user's code (an env's module, its envs made) under the trainer's
    start-up watch (runctl.watch_startup): held there STOP_GRACE_S after a stop signal, or past the
    watchdog hang_s() with no signal, `ended(code, line)` ends the process, line(where) its last line.
    who: "rank 3: " where a tool runs on several ranks."""
    return runctl.watch_startup(
        preemption.unheard(first_stop) or (lambda: None),
        lambda sig: ended(EXIT_STOPPED, lambda at: (
            f"mpippo: {tool}: {who}stopped by {signal_words(sig)} during start-up, which is held{at} and has not gone "
            f"on for {runctl.STOP_GRACE_S:g} s: ending it; nothing was written")),
        held=in_users_code_since, hang_s=hang_s,
        end_hung=lambda lasted: ended(EXIT_FAILURE, lambda at: (
            f"mpippo: error: {who}{runctl.held_words(lasted)}{at}: ending it; nothing was written")))


_stopping: list[int] = []
_holding: list[int] = []  # stops_held blocks open
_pending: list[int] = []  # a stop that came inside one: raised at its end
_installed: set[int] = set()  # the stop signals run() handles (reclaim_stops sets them again)


def _raise_stopped(signum, frame):
    """The first stop signal raises Stopped (at the end of a stops_held block, if inside one); later
    ones do nothing, so that they cannot interrupt the unwinding. (Not SIG_IGN: a signal already
    pending when its handler becomes SIG_IGN is raised by Python as OSError 'ignored due to race
    condition'.)"""
    if not _stopping:
        _stopping.append(signum)
        if _holding:
            _pending.append(signum)
            return
        raise Stopped(signum)


@contextlib.contextmanager
def stops_held():
    """A stop signal inside the block waits for its end: what the block makes (a file and the handle
    to remove it by, an encoder's subprocess and its pipe) is made whole or not at all, never half."""
    _holding.append(1)
    try:
        yield
    finally:  # (also when the block raised: the stop wins, as it would have without the block)
        _holding.pop()
        if _pending and not _holding:
            raise Stopped(_pending.pop())


def reclaim_stops() -> None:
    """The stop handlers again, after a user's code ran (an env's constructor may set its own: SDL's),
    and the stops unblocked (one that blocks them: preemption.unblock)."""
    for sig in _installed:
        signal.signal(sig, _raise_stopped)
    unblock(sorted(_installed))


BAD_NAMES = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST})


def run(tool: str, main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """main(argv), with its bad input as one `mpippo: error: <tool>: ...` line, exit 2."""
    def say(line: str) -> None:  # one line, whatever a value in it held
        sys.stderr.write(refusal([line], f"{tool}: "))
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # (nohup's ignored SIGHUP stays ignored)
            signal.signal(sig, _raise_stopped)
            _installed.add(sig)
    streams = let_readers_leave()
    try:
        code = main(argv)
        if code == 0 and (lost := console_lost()):  # (its files are written; what it printed is not)
            say(lost)
            return EXIT_FAILURE
        return code
    except SystemExit as e:  # --help, into a full file system: not a silent exit 0
        if e.code in (0, None) and (lost := console_lost("its help is lost")):
            say(lost)
            return EXIT_FAILURE
        raise
    except Stopped as e:
        say_last(stopped_line(tool, e.signum), final=False)
        return EXIT_STOPPED
    except UsageError as e:
        sys.stderr.write(refusal(e.errors, f"{tool}: "))
        return EXIT_USAGE
    except RunStopped as e:
        sys.stderr.write(f"mpippo: {tool}: {e}\n")
        return EXIT_STOPPED
    except ToolFailure as e:
        say(str(e))
        return EXIT_FAILURE
    except RankFailure as e:  # a user's env that broke mid-run in the tool's own process (benchmarks/components.py)
        say(str(e))
        return e.exit_code
    except PermissionError as e:  # a file or folder this user may not read or search, met anywhere
        say(f"'{shown(e.filename)}': {os_reason(e)} (check its permissions and those of its folders)" if e.filename
            else f"{os_reason(e)} (a permission this user lacks)")
        return EXIT_USAGE
    except OSError as e:  # any other the system raised where a tool met a path (a name too long, a full disk)
        if e.errno in FILE_SYSTEM_FULL:
            say(file_system_failure(e))
            return EXIT_FAILURE
        say(f"'{shown(e.filename)}': {os_reason(e)}" if e.filename else f"{os_reason(e)}")
        return EXIT_USAGE if e.errno in BAD_NAMES else EXIT_FAILURE  # (a name the user gave, or the machine's)
    except (MemoryError, ImportError, RuntimeError) as e:  # a limit of this process (ulimit -v, -u), not a bug
        if not (said := limit_failure(e)):
            raise
        say(said)
        return EXIT_FAILURE
    finally:
        sys.stdout, sys.stderr = streams


def exit_process(code: int):
    """A tool's `__main__` ends with this: its outcome is decided, so stop signals are ignored to the
    process's end (a second Ctrl-C at the end turned exit 4 into death by signal; preemption.settle
    does the same for the trainer), and it ends without the interpreter's teardown (shutdown.py).
    Not in `run`: tests call tools in-process, which must stay stoppable."""
    try:
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is _raise_stopped:
                signal.signal(sig, signal.SIG_IGN)
        _stopping.append(0)  # (a Python-level check point: a signal caught just before is raised here)
    except (OSError, Stopped):  # one already on its way: the outcome stands
        pass
    shutdown.end_process(code)


def shown(path) -> str:
    """A path for a message: short and on one line, whatever its name holds (its bytes as UTF-8: path_text)."""
    return show(path_text(path))[1:-1]


# ---- option types: each names the bad value and what is allowed ----
def count(lo: int = 1, hi: int = INT64_MAX, what: str = "a whole number") -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} from {lo:,} to {hi:,}, got {show(text)}") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{show(n)} is out of range; allowed: {lo:,} to {hi:,}")
        return n
    parse.__name__ = "count"
    return parse


def number(lo: float, hi: float, lo_open: bool = True, what: str = "a number") -> Callable[[str], float]:
    """A finite float in (lo, hi] (or [lo, hi] when not lo_open)."""
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            x = math.nan
        low = f"{'above' if lo_open else 'from'} {lo:g}"
        if not math.isfinite(x):
            raise argparse.ArgumentTypeError(f"expected {what} {low} up to {hi:g}, got {show(text)}")
        if x < lo or (lo_open and x == lo) or x > hi:
            raise argparse.ArgumentTypeError(f"{x:g} is out of range; allowed: {low} up to {hi:g}")
        return x
    parse.__name__ = "number"
    return parse


seed = count(0, SEED_MAX, "a seed (a whole number)")


def distinct(values: list, flag: str) -> list:
    seen = set()
    for v in values:
        if v in seen:
            raise UsageError(f"{flag}: {show(v)} is given twice; each value once")
        seen.add(v)
    return values


# ---- outputs: checked before any work, written atomically after it ----
def _probe(folder: Path, name: str, flag: str, target: Path) -> None:
    """Make `folder`, create and remove a file named as an atomic write of `name` would (same length),
    and remove the folders made for it: what cannot be written is found now, and nothing is left."""
    made = missing_folders(folder)
    try:
        above = next((f for f in (folder, *folder.parents) if f.exists() or f.is_symlink()), None)
        if above is not None and not above.is_dir():
            raise UsageError(f"{flag}: cannot write '{shown(target)}': '{shown(above)}' is a file, not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UsageError(f"{flag}: cannot write '{shown(target)}' ({os_reason(e)})") from None
    finally:
        remove_if_empty(made)


def _replaceable(path: Path, flag: str) -> None:
    """An output is written by renaming a new file over its name: what is there must be a file or
    nothing. A link would be replaced, not followed (--json /dev/stdout), and a device or FIFO by that
    name would become a file (--json /dev/null, as root): refused, naming what is there."""
    not_a_runs_own(path, flag)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:  # (a name too long, a path through a file: _probe names those)
        if e.errno in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP):
            return
        raise UsageError(f"{flag}: cannot write '{shown(path)}' ({os_reason(e)})") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"{flag}: '{shown(path)}' is a folder; give a file name")
    if not stat.S_ISREG(mode):
        raise UsageError(f"{flag}: '{shown(path)}' is {file_kind(mode)}, which the output would replace; "
                         f"give a new file's name or a file's")


RUNS_OWN = frozenset({RUN_CONFIG, METRICS, LOCK_NAME, WANDB_ID})  # a run folder's own files beside its subfolders
RUNS_FOLDERS = re.compile(rf"{LOGS}|{CHECKPOINTS}|{WANDB_DIR}|agent_[0-9]+")  # ... and its subfolders


def is_run_folder(folder: Path) -> bool:
    """mpippo's marks: its config.yaml and one thing a trainer writes beside it, its metrics, its lock or
    checkpoints/latest.pt (a project's own config.yaml and checkpoints/, a suite's folder with its lock: no run)."""
    return (folder / RUN_CONFIG).is_file() and ((folder / METRICS).is_file() or latest_path(folder).is_file()
                                                or os.path.lexists(folder / LOCK_NAME))


def not_a_runs_own(path: Path, flag: str) -> None:
    """An output never replaces what a run folder holds, live (its trainer writes there) or ended (a record):
    its own files, and anything in its own subfolders (logs/ with TensorBoard's event files, checkpoints/,
    an agent's folder). `--json runs/x/logs/events...` had replaced a run's whole TensorBoard history. A file
    of another name beside them, or in a folder of the user's there, is the user's (runs/x/eval.json)."""
    where = real(Path(path).parent) / Path(path).name  # (a link at that name is replaced, not followed)
    for folder in where.parents:  # (a folder is looked at only where the output would be one of a run's)
        inside = where.relative_to(folder).parts
        if len(inside) > 1 and RUNS_FOLDERS.fullmatch(inside[0]):
            what = f"lies in {inside[0]}/ of the run folder '{shown(folder)}', which an output never writes in"
        elif len(inside) == 1 and inside[0] in RUNS_OWN:
            what = f"is the run's own {inside[0]} (run folder '{shown(folder)}'), which an output never replaces"
        else:
            continue
        try:
            run = is_run_folder(folder)
        except OSError:  # (a folder this user may not search: no run of theirs to protect there)
            run = False
        if run:
            raise UsageError(f"{flag}: '{shown(path)}' {what}; give a new name beside the run's files, or a path "
                             f"outside it")


def real(path: Path) -> Path:
    """The file a name leads to, to compare two names by (a symlink loop, a name too long: as given)."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(path).absolute()


def distinct_outputs(*named: tuple[Path | None, str]) -> None:
    """(path, flag) pairs of one command's outputs: no two may lead to one file (the later write
    would replace the earlier, and the command would say it wrote both)."""
    seen: dict[Path, str] = {}
    for path, flag in named:
        if path is None:
            continue
        key = real(path)
        if key in seen:
            raise UsageError(f"{seen[key]} and {flag}: both name '{shown(path)}'; give two files")
        seen[key] = flag


def output_file(path: Path, flag: str, suffixes: tuple[str, ...] = ()) -> Path:
    """A file the tool will write: a file or nothing by that name, one of `suffixes` (when given), in a
    folder it can write."""
    path = Path(path)
    if suffixes and path.suffix.lower() not in suffixes:
        raise UsageError(f"{flag}: '{shown(path)}' must end in {' or '.join(suffixes)}")
    _replaceable(path, flag)
    _probe(path.parent, path.name, flag, path)
    return path


def output_folder(path: Path, flag: str, files: tuple[str, ...] = ()) -> Path:
    """A folder the tool will write `files` into: not a file, writable, none of `files` a folder there."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            raise UsageError(f"{flag}: '{shown(path)}' is a file; give a folder")
        for name in files:
            if (path / name).is_dir():
                raise UsageError(f"{flag}: '{shown(path / name)}' is a folder, where {flag} writes the file {name}")
            _replaceable(path / name, flag)
    except OSError as e:
        raise UsageError(f"{flag}: cannot write '{shown(path)}' ({os_reason(e)})") from None
    _probe(path, max(files, key=len, default="x"), flag, path)
    return path


def write_bytes(path: Path, data: bytes, flag: str) -> Path:
    """`data` into `path` atomically, readable as any file this user writes (the umask's mode)."""
    try:
        atomic_write_bytes(path, data)
    except OSError as e:
        raise ToolFailure(f"{flag}: writing '{shown(path)}' failed ({os_reason(e)})") from None
    return path


def write_text(path: Path, text: str, flag: str) -> Path:
    """A report's text (UTF-8): what it cannot encode (a run folder's undecodable name, a lone
    surrogate a JSON file held) written as its escape, not a failure after the work."""
    return write_bytes(path, text.encode(errors="backslashreplace"), flag)


def write_json(path: Path, obj, flag: str) -> Path:
    return write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode(), flag)


def pyplot():
    """matplotlib.pyplot for files, not a screen (Agg), with every text shown as written: labels come
    from run folders, env ids and metrics files, where '$x$' is a name, not mathtext to parse (a
    '$\\q$' in one failed the whole figure). No tool's figure has a log axis, whose tick labels are mathtext."""
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt
    # a name in a script its font lacks (a run folder named in CJK) is drawn as boxes: four warnings, each
    # with a line of our source, had followed a figure that was written
    warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
    return plt


MAX_PIXELS = 65_535  # on a side: Agg renders no larger image


def panels(plt, n: int, width: float, height: float, what: str, dpi: int = 110):
    """A figure of `n` panels, 4 to a row, each width x height inches at `dpi`: (figure, the n axes,
    in order). More rows than Agg can render (hundreds of games in one data folder) is one line
    before the drawing, not the renderer's failure after the work."""
    most = 4 * int(MAX_PIXELS // (height * dpi))
    if n > most:
        raise UsageError(f"{n} {what}: the figure draws one panel each, at most {most:,}")
    cols = min(4, max(n, 1))
    rows = -(-max(n, 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def drawable(text: str) -> str:
    """Text FreeType can draw: what UTF-8 cannot hold (a folder's undecodable byte, a lone surrogate a
    JSON file held) as its escape. For category names too (a bar chart's), which are drawn later."""
    return text.encode(errors="backslashreplace").decode()


def render_figure(fig, path: Path, flag: str, dpi: int = 110) -> bytes:
    """A matplotlib figure laid out (tight) and rendered in memory, in the format of `path`'s suffix, and
    closed. Its text is drawn as its escape where no font encodes it (a lone surrogate a metrics file
    held: FreeType's TypeError); a value too large to draw (1.7e308 in a damaged metrics file, whose
    axis limits overflow) is one line naming the output, not matplotlib's traceback."""
    import matplotlib.pyplot as plt
    from matplotlib.text import Text
    buf = io.BytesIO()
    try:
        for text in fig.findobj(Text):  # (a walk that lays the axes out: inside the try)
            text.set_text(drawable(text.get_text()))
        fig.tight_layout()
        fig.savefig(buf, format=Path(path).suffix[1:].lower() or "png", dpi=dpi)
    except (ValueError, OverflowError) as e:  # (numpy's LinAlgError is a ValueError: a singular transform)
        raise UsageError(f"{flag}: '{shown(path)}' cannot be drawn: a value the runs' files hold is past what a "
                         f"figure can show ({reason(e, 120)})") from None
    finally:
        plt.close(fig)
    return buf.getvalue()


def save_figure(fig, path: Path, flag: str, dpi: int = 110) -> Path:
    """A matplotlib figure (render_figure), written atomically."""
    return write_bytes(path, render_figure(fig, path, flag, dpi), flag)


# ---- the parts of mpippo's files a tool uses ----
class Maybe:
    """null, or the spec."""

    def __init__(self, spec):
        self.spec = spec


NUMBER = "a number"  # int or float, not bool, not infinite, at most float32's largest (NaN: 'not measured')
COUNT = "a non-negative integer"
TEXT = "a string"
FLAG = "true or false"
_CHECKS = {
    NUMBER: is_number,
    COUNT: is_count,
    TEXT: lambda v: isinstance(v, str),
    FLAG: lambda v: isinstance(v, bool),
}


def _mismatch(value: Any, spec, where: str) -> str | None:
    """Where `value` differs from `spec`, as 'key.path: expected ..., got ...', or None."""
    if isinstance(spec, Maybe):
        return None if value is None else _mismatch(value, spec.spec, where)
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where or 'top level'}: expected a JSON object, got {show(value)}"
        for key, sub in spec.items():
            if key not in value:
                if isinstance(sub, Maybe):
                    continue
                return f"{where + '.' if where else ''}{key}: missing"
            if (bad := _mismatch(value[key], sub, f"{where + '.' if where else ''}{key}")):
                return bad
        return None
    if isinstance(spec, list):
        if not isinstance(value, list) or not value:
            return f"{where}: expected a non-empty list, got {show(value)}"
        for i, item in enumerate(value):
            if (bad := _mismatch(item, spec[0], f"{where}[{i}]")):
                return bad
        return None
    if _CHECKS[spec](value):
        return None
    return f"{where}: {not_a_number(value)}" if spec is NUMBER else f"{where}: expected {spec}, got {show(value)}"


def conform(data: Any, spec, path: Path, what: str = "metrics file") -> Any:
    """`data` (read from `path`) has the keys and types of `spec`, or a UsageError naming the file."""
    if (bad := _mismatch(data, spec, "")):
        raise UsageError(f"{what} '{shown(path)}': {bad}")
    return data


# ---- the trainer's options, checked here before any run starts ----
def check_trainer(argv: list[str], ranks: int, what: str, under_mpirun: bool = True):
    """The trainer's own checks of `run_mpi.py argv` at `ranks` ranks on this node (command line,
    config file, values, memory, threads), run in this process without MPI or torch; returns
    (the parsed options, the resolved Config), or a UsageError whose lines start with `what`.
    under_mpirun: the run will be an mpirun job, so Open MPI's session folder is checked too (False:
    the tool builds the trainer's parts in its own process). (A tool is no MPI job: importing the
    trainer's cli starts no MPI here, comm/world.py.)"""
    from mpippo import cli, faults, hostmem  # the trainer's start-up and its MPI bindings: for tools that check a run
    try:
        if (bad := hostmem.error() or faults.ERROR or (under_mpirun and temp_folder_problem())):
            raise UsageError(bad)
        args = cli.make_parser().parse_args(argv)
        cfg = C.resolve(C.build(C.load_yaml(args.config or C.DEFAULT_CONFIG), cli._overrides(args), ranks), ranks)
        if (problems := C.host_problems(cfg, ranks, ranks)):
            raise UsageError(problems)
        return args, cfg
    except UsageError as e:
        raise UsageError([f"{what}: {line}" for line in e.errors]) from None


def run_trainer(ranks: int, argv: list[str], out_dir: Path, what: str, resume: str = "", **kw) -> dict:
    """mpippo.launch.run_trainer (the run's metrics); a failed or hung run is a ToolFailure whose
    line gives the run's own last error (its stderr tail goes to stderr first, indented); a run
    stopped on a signal after its checkpoint is a RunStopped, with `resume` (how to go on) if given.
    A run that resumes keeps its folder: a stop of the tool becomes the run's own checkpoint and stop
    (up to 5 minutes, far longer than an iteration takes; a second Ctrl-C ends it at once)."""
    try:
        return launch.run_trainer(ranks, argv, out_dir, **({"stop_grace_s": 300.0} if resume else {}) | kw)
    except RuntimeError as e:  # "<n> rank(s) failed (exit <code>):" and the trainer's stderr tail
        if isinstance(e, launch.TrainerError) and e.code in (EXIT_REQUEUE, EXIT_STOPPED):  # its exits after a signal
            kept = latest_path(out_dir).exists()  # (none: stopped during its start-up)
            raise RunStopped(f"{what} in '{shown(out_dir)}' stopped on a signal (exit {e.code}) "
                             + (f"with its checkpoint written{f'; {resume}' if resume else ''}" if kept
                                else "before it trained anything; the same command starts it again")) from None
        head, _, tail = str(e).partition("\n")
        lines = [ln.strip() for ln in tail.replace("\x00", "").splitlines() if ln.strip(" -\x00")]
        sys.stderr.write("".join(f"  {ln}\n" for ln in lines[-40:]))
        why = (next((ln for ln in reversed(lines) if "error:" in ln), None)
               or next((ln for ln in reversed(lines) if re.match(r"\w+(Error|Exception)\b", ln)), None)
               or (lines[0] if lines else ""))
        raise ToolFailure(f"{what} in '{shown(out_dir)}': {head.rstrip(':')}" + (f": {why[:300]}" if why else "")
                          + (f"; {resume}" if resume and latest_path(out_dir).exists() else "")) from None
    except subprocess.TimeoutExpired as e:
        raise ToolFailure(f"{what} in '{shown(out_dir)}' did not end within {e.timeout:g} s") from None
