"""Checkpoints: atomic writes (temp file + fsync + os.replace), keep-last-N, latest.pt.

A reader therefore sees either the previous complete file or the new complete file,
never a torn one, whatever kills the writer and whenever.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import torch

from mpippo import faults
from mpippo.config import ConfigError

LATEST = "latest.pt"


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


def atomic_write_with(path: str | Path, write) -> None:
    """Call write(binary file) on a temp file next to `path`, fsync, rename over `path`, fsync the folder.
    For outputs too large to build in memory first (the replay buffer)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def save_checkpoint(ckpt_dir: str | Path, state: dict, iteration: int, keep_last: int) -> Path:
    """Write ckpt_<iteration>.pt and latest.pt atomically; prune old periodic files."""
    ckpt_dir = Path(ckpt_dir)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    path = ckpt_dir / f"ckpt_{iteration:07d}.pt"
    atomic_write_bytes(path, data, _midway=faults.save_fault(iteration))
    _atomic_link_or_copy(path, ckpt_dir / LATEST, data)
    periodic = sorted(ckpt_dir.glob("ckpt_*.pt"))
    for old in periodic[:-keep_last] if keep_last > 0 else []:
        old.unlink(missing_ok=True)
    return path


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


REQUIRED_KEYS = ("algo", "model", "optimizer", "timesteps", "iteration", "config", "world_size")


def require_checkpoint(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--resume: no checkpoint at '{path}' (start without --resume, or pick the run folder that has one)")
    return path


def read_checkpoint_bytes(path: str | Path) -> bytes:
    return require_checkpoint(path).read_bytes()


def load_checkpoint(data: bytes, where: str = "checkpoint") -> dict:
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as e:  # truncated, corrupted, not a torch file
        raise ConfigError(f"{where}: unreadable checkpoint ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
        raise ConfigError(f"{where}: not an mpippo checkpoint (missing {', '.join(missing)})")
    return state
