"""Checkpoints: written atomically (files.atomic_write_bytes), keep-last-N, latest.pt; safe loads.

A reader therefore sees either the previous complete file or the new complete file,
never a torn one, whatever kills the writer and whenever.

Loading never runs code: `torch.load(weights_only=True)` rebuilds only tensors, plain
containers, numbers, strings and bytes, plus the few numpy types mpippo's RNG and episode
states use (SAFE_GLOBALS). A file that needs anything else (a pickled function or class: a
planted `latest.pt` on a shared file system) is refused before any rank acts on it, and
`ckpt_schema.validate` then checks keys, types and shapes. torch is imported on first use,
so bad command lines and configs are refused before it loads.
"""
from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path

from mpippo import faults
from mpippo.config import UsageError, show
from mpippo.errors import folder_gone, os_reason
from mpippo.files import METRICS, RUN_CONFIG, atomic_write_bytes
from mpippo.metrics.sinks import WANDB_ID

CHECKPOINTS, LATEST = "checkpoints", "latest.pt"  # a run folder's checkpoints/latest.pt: this module owns the place


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Where a run folder keeps its checkpoints (a multi-agent run: each agent's folder has its own)."""
    return Path(run_dir) / CHECKPOINTS


def latest_path(run_dir: str | Path) -> Path:
    """The checkpoint --resume, evaluate and the suite read from a run folder."""
    return checkpoint_dir(run_dir) / LATEST


def write_failed(what: str, folder: Path, e: OSError) -> str:
    """The line for a checkpoint write that failed (disk full, quota, a file-size limit): what is kept."""
    if (gone := folder_gone(e)):  # (the run folder moved away: nothing of it is here to keep)
        return f"checkpoint: writing {what} failed: {gone}"
    try:
        kept = "the previous checkpoint is intact" if (folder / LATEST).exists() else "no checkpoint had been written yet"
    except OSError:  # (a folder this user may no longer search: the line must still be one line)
        kept = "whether an earlier checkpoint is intact cannot be read"
    return f"checkpoint: writing {what} to '{folder}' failed ({os_reason(e)}); {kept}"


def save_checkpoint(ckpt_dir: str | Path, state: dict, iteration: int, keep_last: int) -> Path:
    """Write ckpt_<iteration>.pt and latest.pt atomically; prune old periodic files."""
    import torch
    ckpt_dir = Path(ckpt_dir)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    path = ckpt_dir / f"ckpt_{iteration:07d}.pt"
    atomic_write_bytes(path, data, _midway=faults.save_fault(iteration))
    _atomic_link_or_copy(path, ckpt_dir / LATEST, data)
    # this run's line: newer ones (left by a run this one resumed before its end) are not its to prune
    for old in periodic_checkpoints(ckpt_dir, up_to=iteration)[:-keep_last] if keep_last > 0 else []:
        old.unlink(missing_ok=True)
    return path


PERIODIC = re.compile(r"ckpt_(\d{7,})\.pt")  # what save_checkpoint names, and nothing a user put beside it


def periodic_checkpoints(ckpt_dir: Path, up_to: int | None = None) -> list[Path]:
    """The periodic checkpoints save_checkpoint wrote (numbered up to `up_to`), oldest first by number
    (past 9,999,999 the names grow a digit: text order would put the newest first); a user's own file
    there (ckpt_0000050_best.pt, a copy) is never one of them, so never pruned."""
    found = [(int(m[1]), p) for p in ckpt_dir.iterdir()
             if (m := PERIODIC.fullmatch(p.name)) and p.is_file() and not p.is_symlink()
             and (up_to is None or int(m[1]) <= up_to)]
    return [p for _, p in sorted(found)]


def periodic_instead(ckpt_dir: Path, latest: os.stat_result | None = None) -> Path | None:
    """The newest periodic checkpoint to resume from where latest.pt cannot be: missing (a copy that dropped
    links, a dangling one; `latest` None) or damaged (`latest`: its stat, so that it is another file)."""
    try:
        if (latest is None and (ckpt_dir / LATEST).is_file()) or not ckpt_dir.is_dir():
            return None
        found = [p for p in periodic_checkpoints(ckpt_dir)
                 if latest is None or not os.path.samestat(os.stat(p), latest)]
    except OSError:
        return None
    return found[-1] if found else None


def link_as_latest(ckpt: Path) -> str:
    """The words that make `ckpt` the one --resume reads."""
    return f"link it as {LATEST} (ln -sf {ckpt.name} '{ckpt.parent / LATEST}')"


def latest_missing(ckpt_dir: Path) -> str | None:
    """Where latest.pt is missing but periodic checkpoints are there: the words for resuming the newest."""
    newest = periodic_instead(ckpt_dir)
    return f"{ckpt_dir.name}/ holds {newest.name}, its newest: {link_as_latest(newest)}" if newest else None


def _older(where: str) -> str:
    """For a damaged latest.pt: the newest periodic checkpoint that is another file, to resume from."""
    path = Path(where)
    try:
        other = periodic_instead(path.parent, os.stat(path)) if path.name == LATEST else None
    except OSError:
        return ""
    return (f"; {path.parent.name}/ also holds {other.name}, the newest periodic checkpoint: "
            f"{link_as_latest(other)} to resume from it") if other else ""


def _link_words(path: Path) -> str:
    return f" (a link to '{os.readlink(path)}', which is not there)" if path.is_symlink() else ""


# the hidden names a writer of ours uses while it writes: files.atomic_write_with's temporary file beside its
# target (.latest.pt.k3j9x2.tmp), _atomic_link_or_copy's hard link (.latest.pt.4242.link); the targets by their
# owners' names (a periodic checkpoint, a saved replay: replay_<update>.npz, algos/apex.py)
_PARTIAL = re.compile(rf"\.({'|'.join(map(re.escape, (LATEST, RUN_CONFIG, METRICS, WANDB_ID)))}|{PERIODIC.pattern}|"
                      r"replay[\w.-]*\.npz)\.\w+\.(tmp|link)|\.write_test\.\w+")  # (the last: cli's write probes)


def sweep_partial(run_dir: Path) -> str | None:
    """What a writer killed mid-write (kill -9, a lost node, a preemption past its grace) left in a run folder
    and its checkpoints/: hidden temporary files, a whole checkpoint's size each, and hard links that kept
    pruned checkpoints on disk; they had piled up over preemptions, toward the quota. Removed by the next job
    that holds the folder's lock (so that none is being written by another); a note saying so, or None."""
    gone, size = 0, 0
    for folder in (run_dir, checkpoint_dir(run_dir)):
        try:
            entries = [e for e in os.scandir(folder) if _PARTIAL.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
        except OSError:  # (no checkpoints/ yet)
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
                size += st.st_size if st.st_nlink == 1 else 0  # (a link to a checkpoint that stays frees nothing)
                os.unlink(e.path)
                gone += 1
            except OSError:
                pass
    return (f"removed {gone} partial file(s) a killed writer had left in '{show(str(run_dir))[1:-1]}' "
            f"({size / 2**20:.1f} MiB)") if gone else None


def _atomic_link_or_copy(src: Path, dst: Path, data: bytes) -> None:
    """Point dst at src's bytes atomically: a hard link (no second write), else a copy."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.link")
    try:
        tmp.unlink(missing_ok=True)
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:  # file systems without hard links
        tmp.unlink(missing_ok=True)
        atomic_write_bytes(dst, data)


def safe_globals() -> list:
    """What weights_only may rebuild beyond torch's own list: numpy arrays, dtypes and scalars of
    plain numeric kinds (RNG states, episode statistics). Constructors of data, none runs code."""
    import numpy as np
    from numpy.core.multiarray import _reconstruct, scalar
    kinds = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
             np.float16, np.float32, np.float64)
    return [_reconstruct, scalar, np.ndarray, np.dtype, *(type(np.dtype(k)) for k in kinds)]


def require_checkpoint(path: str | Path) -> Path:
    path = Path(path)
    try:
        if not path.is_file():
            if (newest := latest_missing(path.parent)):
                raise UsageError(f"--resume: no checkpoint at '{path}'{_link_words(path)}, but {newest}, then pass "
                                 f"--resume")
            raise UsageError(f"--resume: no checkpoint at '{path}'{_link_words(path)} (start without --resume, or "
                              f"pick the run folder that has one)")
    except OSError as e:
        raise UsageError(f"--resume: cannot read '{show(str(path))}' ({os_reason(e)})") from None
    return path


def read_checkpoint_bytes(path: str | Path, copies: int = 1) -> bytes:
    """The checkpoint's bytes, once its size is known to fit: a file (or a sparse one, or a device)
    larger than the memory that would hold it and its tensors is refused before it is read. `copies`:
    the ranks of this node that will each hold it (rank 0 reads it for them)."""
    path = Path(path)
    try:
        if (problem := reading_problem(path, checkpoint_size(path), copies)):
            raise UsageError(problem)
        return path.read_bytes()
    except OSError as e:
        raise UsageError(f"checkpoint '{path}': cannot read it ({os_reason(e)})") from None


def checkpoint_size(path: Path) -> int:
    """Its size in bytes (UsageError where it cannot be read)."""
    try:
        return require_checkpoint(path).stat().st_size
    except OSError as e:
        raise UsageError(f"checkpoint '{path}': cannot read it ({os_reason(e)})") from None


def reading_problem(path: Path, size: int, copies: int = 1) -> str | None:
    """The checkpoint's bytes and the tensors built from them, held by each of `copies` ranks of this
    node, against its available memory (every node asks its own: rank 0's node says nothing of others)."""
    if 2 * size * copies <= (have := _memory_available()):
        return None
    each = f" on each of this node's {copies} ranks" if copies > 1 else ""
    return (f"checkpoint '{path}': {size / 2**30:,.1f} GiB, and reading it needs twice that{each}; "
            f"{have / 2**30:,.1f} GiB of memory are available (mpippo's checkpoints of the largest networks are "
            f"a few hundred MB; is it one?)")


def _memory_available() -> int:
    import psutil
    return psutil.virtual_memory().available


def _refusal(e: Exception) -> str | None:
    """What weights_only refused to rebuild (its message is a page long), or None when the file
    is simply not a pickle it can read (garbage, truncated)."""
    text = str(e)
    m = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"got <class '([\w.]+)'>", text)
    return f"it needs {m.group(1)}" if m else None


def load_checkpoint(data: bytes, where: str = "checkpoint", algo: str | None = None) -> dict:
    """Checkpoint bytes -> its state, loaded without running code and checked against the schema
    (and to be of `algo`, when given); UsageError (one line) for anything else."""
    import torch

    from mpippo.algos.implementations import CLASSES  # torch, and every algorithm: loaded to read a checkpoint
    from mpippo.ckpt_schema import validate  # torch, as above
    try:
        with torch.serialization.safe_globals(safe_globals()):
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if (needs := _refusal(e)) is not None:
            raise UsageError(f"{where}: refused: it holds Python objects that mpippo never writes ({needs}); "
                              f"checkpoints load without running code") from None
        raise UsageError(f"{where}: unreadable checkpoint (not a file torch can read){_older(where)}") from None
    except Exception as e:  # truncated, corrupted, not a torch file
        said = str(e).splitlines()[0] if str(e) else "cut short"
        said = said if len(said) <= 120 else said[:120].rsplit(" ", 1)[0] + " ..."  # (whole words)
        raise UsageError(f"{where}: unreadable checkpoint, damaged or cut short ({type(e).__name__}: {said})"
                         f"{_older(where)}") from None
    return validate(state, where, CLASSES, algo)
