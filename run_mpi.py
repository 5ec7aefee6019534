#!/usr/bin/env python
"""Entry point: `mpirun -n K python run_mpi.py [options]` (or plain `python run_mpi.py`)."""
import os

# Transparent huge pages for torch's CPU allocator: must be set before torch allocates.
# Page faults were 30-40% of the update time without it (see README, Performance).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from mpippo.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
