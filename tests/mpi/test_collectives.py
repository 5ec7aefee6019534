import json

import numpy as np
import pytest

from conftest import mpirun, ok

pytestmark = pytest.mark.mpi
SCRIPTS = "tests/mpi/scripts"


def test_sharded_update_equals_single_rank_update(tmp_path):
    """One update with the batch split over 2 or 3 ranks == the same update on 1 rank."""
    results = {}
    for n in (1, 2, 3):
        out = tmp_path / f"params_{n}.npy"
        res = ok(mpirun(n, [f"{SCRIPTS}/equiv_update.py", str(out)], timeout=120))
        assert res.stdout.count(" ok") == n
        results[n] = np.load(out)
    init_moved = np.abs(results[1]).sum() > 0
    assert init_moved
    np.testing.assert_allclose(results[2], results[1], atol=1e-5, rtol=0)
    np.testing.assert_allclose(results[3], results[1], atol=1e-5, rtol=0)


def test_replica_checksum_names_the_diverged_rank():
    res = ok(mpirun(3, [f"{SCRIPTS}/replica_check.py"], timeout=60))
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 3
    for row in rows:  # every rank reaches the same verdict
        assert row["same"] == []
        assert row["diverged"] == [1]
