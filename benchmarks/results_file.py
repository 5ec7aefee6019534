"""Where `make bench` stores a result: benchmarks/results/<date><suffix>.json, atomically.

A second run on the same day gets the time in its name (and a count after it within one minute),
so no earlier result is replaced. `check_out`
tells before the benchmark starts whether the result can be written there."""
from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(RESULTS.parent.parent))  # mpippo, without an install
from mpippo.config import UsageError  # noqa: E402
from mpippo.toolcli import output_file, output_folder, write_json  # noqa: E402


def check_out(out: Path | None) -> Path | None:
    """--out (a file), or the results folder when it is not given: writable, or one UsageError line."""
    if out is None:
        output_folder(RESULTS, "--out (default benchmarks/results/)")
        return None
    return output_file(out, "--out")


def result_path(suffix: str = "", out: Path | None = None) -> Path:
    """Where the result goes: `out`, or the first free name of benchmarks/results/<date><suffix>.json,
    <date>-<HHMM><suffix>.json, <date>-<HHMM>-2<suffix>.json, ... Chosen once by a tool that writes
    its result more than once (as it goes)."""
    if out is not None:
        return out
    now = datetime.datetime.now()
    names = [f"{now:%Y-%m-%d}", f"{now:%Y-%m-%d-%H%M}"]
    names += (f"{now:%Y-%m-%d-%H%M}-{n}" for n in range(2, 10_000))
    for name in names:
        path = RESULTS / f"{name}{suffix}.json"
        if not os.path.lexists(path):  # a dangling link counts as taken: writing would replace it
            return path
    raise UsageError(f"benchmarks/results/ holds 10,000 results of {now:%Y-%m-%d %H:%M}; give --out")


def write_result(result: dict, suffix: str = "", out: Path | None = None) -> Path:
    return write_json(result_path(suffix, out), result, "--out")
