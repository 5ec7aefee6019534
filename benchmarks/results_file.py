"""Where `make bench` stores a result: benchmarks/results/<date><suffix>.json, atomically.

A second run on the same day gets the time in its name, so the first result stays. `check_out`
tells before the benchmark starts whether the result can be written there."""
from __future__ import annotations

import datetime
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(RESULTS.parent.parent))  # mpippo, without an install
from mpippo.toolcli import output_file, output_folder, write_json  # noqa: E402


def check_out(out: Path | None) -> Path | None:
    """--out (a file), or the results folder when it is not given: writable, or one UsageError line."""
    if out is None:
        output_folder(RESULTS, "--out (default benchmarks/results/)")
        return None
    return output_file(out, "--out")


def result_path(suffix: str = "", out: Path | None = None) -> Path:
    """Where the result goes: `out`, or benchmarks/results/<date><suffix>.json (with the time when
    that exists). Chosen once by a tool that writes its result more than once (as it goes)."""
    now = datetime.datetime.now()
    path = out or RESULTS / f"{now:%Y-%m-%d}{suffix}.json"
    if out is None and path.exists():
        path = RESULTS / f"{now:%Y-%m-%d-%H%M}{suffix}.json"
    return path


def write_result(result: dict, suffix: str = "", out: Path | None = None) -> Path:
    return write_json(result_path(suffix, out), result, "--out")
