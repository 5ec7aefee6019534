"""Where `make bench` stores a result: benchmarks/results/<date><suffix>.json, atomically.

A second run on the same day gets the time in its name, so the first result stays."""
from __future__ import annotations

import datetime
from pathlib import Path

from mpippo.checkpoint import atomic_write_json

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(result: dict, suffix: str = "", out: Path | None = None) -> Path:
    now = datetime.datetime.now()
    path = out or RESULTS / f"{now:%Y-%m-%d}{suffix}.json"
    if out is None and path.exists():
        path = RESULTS / f"{now:%Y-%m-%d-%H%M}{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result)
    return path
