"""Where a run's scalars go, behind one call for every algorithm and layout: `add_scalar(tag, value,
step)` to TensorBoard (`logging.tensorboard`) and to Weights & Biases (`logging.wandb`: off by
default; offline writes the run under <run>/wandb/ for a later `wandb sync`, online streams it; the
`wandb` package is optional and imported only when asked for). The tags are the same in every
algorithm: charts/ (returns, steps_per_s), losses/, learner/, time/, selfplay/.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import sys
from pathlib import Path

from mpippo.files import LOGS, atomic_write_bytes
from mpippo.rules import show
from mpippo.usage import UsageError

WANDB_ID = "wandb-id"  # a run folder's W&B run id: a resumed run continues the same W&B run
WANDB_DIR = "wandb"    # ... and W&B's own files (offline runs, logs)
RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # what this file may hold (W&B refuses :;,#?/' and more)


class Sinks:
    def __init__(self, cfg, run_dir: Path, purge_step: int | None, wandb_run=None):
        """`wandb_run`: the run WandbStart began at start-up (before anything was written); with
        logging.wandb on and none given, it begins here (benchmarks, tests)."""
        self.tb = self.wb = None
        if cfg.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            # purge_step drops points past the resume step, so a resumed run has no duplicates
            self.tb = SummaryWriter(str(Path(run_dir) / LOGS), purge_step=purge_step)
        if cfg.logging.wandb != "off":
            self.wb = wandb_run or WandbStart(cfg, Path(run_dir)).run

    def __bool__(self) -> bool:
        return self.tb is not None or self.wb is not None

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if self.tb is not None:
            self.tb.add_scalar(tag, value, step)
        if self.wb is not None:
            try:
                self.wb.log({tag: value}, step=int(step))
            except Exception as e:  # a logger's failure never ends the training it reports on
                self._drop_wandb("logging to it", e)

    def add_histogram_raw(self, tag: str, **kwargs) -> None:
        """A histogram (TensorBoard's raw form; W&B gets its summary scalars from the caller)."""
        if self.tb is not None:
            self.tb.add_histogram_raw(tag, **kwargs)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wb is not None:
            try:
                self.wb.finish()
            except Exception as e:
                self._drop_wandb("closing its run", e)
            self.wb = None

    def _drop_wandb(self, doing: str, e: Exception) -> None:
        sys.stderr.write(f"mpippo: warning: logging.wandb: W&B failed {doing} ({_first_line(e)}); TensorBoard and "
                         f"benchmark_metrics.json go on without it\n")
        sys.stderr.flush()
        self.wb = None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


class WandbStart:
    """The run folder's W&B run (its id kept in <run>/wandb-id, so a resume continues it), begun in
    the mode the config asks for. Whatever W&B raises (no login, a name it refuses, a broken install,
    no network) is one UsageError naming logging.wandb and what to do; what it wrote by then is
    removed, so a refused run leaves its folder as it found it. `undo()` does the same for a run
    begun here when another rank refuses the job."""

    def __init__(self, cfg, run_dir: Path):
        self.run_dir, self.mode = Path(run_dir), cfg.logging.wandb
        run_id, self.new_id = _run_id(self.run_dir)
        self.before = _entries(self.run_dir / WANDB_DIR)
        self.made_dir = not os.path.lexists(self.run_dir / WANDB_DIR)
        try:
            import wandb
        except Exception as e:  # found by find_spec (config checked it) yet broken
            raise UsageError(f"logging.wandb: the wandb package is installed but does not import ({_first_line(e)}); "
                             f"reinstall it (pip install wandb) or set logging.wandb=off") from None
        try:
            self.run = wandb.init(project=cfg.logging.wandb_project, dir=str(self.run_dir), mode=self.mode, id=run_id,
                                  resume="allow", name=self.run_dir.name, config=cfg.to_dict(),
                                  settings=wandb.Settings(silent=True))
        except Exception as e:
            self._remove_new()
            raise UsageError(f"logging.wandb: W&B refused to start the run in {self.mode} mode ({_first_line(e)}); "
                             + _what_to_do(self.mode)) from None
        if self.new_id:
            atomic_write_bytes(self.run_dir / WANDB_ID, run_id.encode())

    def undo(self) -> None:
        try:
            self.run.finish(exit_code=1)
        except Exception:
            pass  # it is being thrown away: what it says no longer matters
        self._remove_new()
        if self.new_id:
            (self.run_dir / WANDB_ID).unlink(missing_ok=True)

    def _remove_new(self) -> None:
        """What W&B wrote under <run>/wandb/ since this began (all of it, if the folder is new)."""
        folder = self.run_dir / WANDB_DIR
        gone = [folder] if self.made_dir else [folder / n for n in _entries(folder) - self.before]
        for p in gone:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _what_to_do(mode: str) -> str:
    if mode == "online":
        todo = ("log in first (wandb login, or WANDB_API_KEY), check logging.wandb_project and the network, or use "
                "logging.wandb=offline (then wandb sync) or off")
    else:
        todo = "check logging.wandb_project and the run folder's wandb/ and wandb-id, or set logging.wandb=off"
    return todo + _wandb_environment()


# read over what wandb.init is given, so named first; WANDB_SERVICE and WANDB__* are W&B's own (it sets them)
WANDB_SETTINGS = ("WANDB_MODE", "WANDB_DISABLED", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME",
                  "WANDB_BASE_URL", "WANDB_DIR")


def _wandb_environment() -> str:
    """The WANDB_ variables set, which W&B reads over what it is given (WANDB_MODE=garbage refused a run
    whose config and folder were fine, and the line blamed those); secrets by name only."""
    names = sorted((k for k in os.environ if k.startswith("WANDB_") and k != "WANDB_SERVICE"
                    and not k.startswith("WANDB__")), key=lambda k: (WANDB_SETTINGS.index(k) if k in WANDB_SETTINGS else len(WANDB_SETTINGS), k))
    if not names:
        return ""
    shown = [k if any(w in k for w in ("KEY", "TOKEN", "SECRET", "PASSWORD")) else f"{k}={show(os.environ[k])}"
             for k in names[:6]]
    return f"; W&B also reads {', '.join(shown)}{', ...' if len(names) > 6 else ''} from the environment"


def _entries(folder: Path) -> set[str]:
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def _run_id(run_dir: Path) -> tuple[str, bool]:
    """(the W&B run id this folder continues, or a new one; whether it is new). Its files checked
    first: wandb-id a small regular file holding an id, wandb/ a folder."""
    id_file, folder = run_dir / WANDB_ID, run_dir / WANDB_DIR
    if os.path.lexists(folder) and not folder.is_dir():
        raise UsageError(f"logging.wandb: '{folder}' is not a folder (W&B keeps its files there); move it away, or "
                         f"set logging.wandb=off")
    try:
        st = os.lstat(id_file)
    except FileNotFoundError:
        return secrets.token_hex(6), True
    fix = ("it names the W&B run this folder continues: put that id back, or remove the file to start a new W&B "
           "run, or set logging.wandb=off")
    if not stat.S_ISREG(st.st_mode) or st.st_size > 1024:
        raise UsageError(f"logging.wandb: '{id_file}' is not a small regular file; {fix}")
    text = id_file.read_bytes().decode(errors="replace").strip()
    if not RUN_ID.fullmatch(text):
        raise UsageError(f"logging.wandb: '{id_file}' holds {show(text)}, not a W&B run id (1 to 64 letters, digits, "
                         f"'_', '-', '.'); {fix}")
    return text, False
