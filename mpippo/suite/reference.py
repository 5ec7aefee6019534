"""The Procgen paper's PPO learning curves (analysis/data/reference/procgen_ppo_curves.csv: mean and
std of its seeds per game, mode, levels and split, against env steps), read for the suite's report
and analysis/parity.py."""
from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from mpippo.usage import UsageError
from mpippo.files import read_text
from mpippo.toolcli import shown

REFERENCE = Path(__file__).resolve().parents[2] / "analysis" / "data" / "reference" / "procgen_ppo_curves.csv"
COLUMNS = ("mode", "levels", "split", "game", "timesteps", "return_mean", "return_std")


def reference_curves(path: Path, mode: str = "easy", levels: str = "all", split: str = "train") -> dict:
    """{game: (steps, mean, std)} of the paper's PPO runs; a damaged file is a UsageError naming it."""
    what = f"reference curves '{shown(path)}'"
    rows = defaultdict(list)
    try:
        reader = csv.DictReader(io.StringIO(read_text(path, "reference curves")))
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise UsageError(f"{what}: no column(s) {', '.join(missing)} in its header line; it needs {', '.join(COLUMNS)}")
        for n, r in enumerate(reader, 2):
            if (r["mode"], r["levels"], r["split"]) == (mode, levels, split):
                try:
                    point = (int(r["timesteps"]), float(r["return_mean"]), float(r["return_std"]))
                except (TypeError, ValueError):
                    point = None
                if point is None or point[0] < 0 or not all(map(math.isfinite, point[1:])) or point[2] < 0:
                    raise UsageError(f"{what}: line {n}: expected timesteps >= 0 and finite return_mean, return_std "
                                      f">= 0, got {', '.join(str(r[c])[:20] for c in COLUMNS[4:])}")
                rows[r["game"]].append(point)
    except csv.Error as e:
        raise UsageError(f"{what}: not a CSV file ({e})") from None
    return {g: tuple(np.array(c) for c in zip(*sorted(v))) for g, v in rows.items()}
