"""The per-iteration straggler bookkeeping (mpippo/metrics/timers.py), without MPI: each rank's ring
and its fixed-length summary, rank 0's statistics over the gathered summaries."""
import numpy as np
import pytest

from mpippo.metrics.reporter import FIELDS, IDX
from mpippo.metrics.timers import PARTS, PHASES, REL_PROBS, RING, SUMMARY_LEN, PhaseTimer, StragglerStats, quantiles


def iterate(timer: PhaseTimer, **seconds) -> None:
    """One iteration that spent `seconds` per phase (added to the cumulative counters)."""
    for p, s in seconds.items():
        timer.seconds[p] += s
    timer.end_iteration()


def test_end_iteration_stores_the_deltas_split_into_parts():
    t = PhaseTimer()
    iterate(t, env_step=1.0, inference=2.0, gae=0.5, backward=4.0, allreduce=0.25, optimizer=0.5, other=0.1)
    iterate(t, env_step=1.0, backward=2.0, allreduce=1.0)
    assert t.iterations == 2
    assert t.ring[0] == pytest.approx([3.0, 4.5, 0.75, 8.35])  # rollout, update, collective, wall
    assert t.ring[1] == pytest.approx([1.0, 2.0, 1.0, 4.0])
    assert list(PARTS) == ["rollout", "update", "collective", "wall"] and set(PARTS["wall"]) == set(PHASES)


def test_summary_is_fixed_length_oldest_first_and_wraps():
    t = PhaseTimer(ring=4)
    assert t.summary().tolist() == [0.0] + [0.0] * 16
    for i in range(1, 7):  # six iterations through a ring of four: the last four remain
        iterate(t, env_step=float(i))
    s = t.summary()
    assert len(s) == 1 + 4 * len(PARTS) and s[0] == 6
    assert s[1:].reshape(4, -1)[:, 0].tolist() == [3.0, 4.0, 5.0, 6.0]
    t2 = PhaseTimer(ring=4)
    iterate(t2, env_step=7.0)
    rows = t2.summary()[1:].reshape(4, -1)
    assert rows[0, 0] == 7.0 and not rows[1:].any()  # padding after the one row
    assert len(PhaseTimer().summary()) == SUMMARY_LEN


def test_the_summary_rides_at_the_end_of_the_gathered_vector():
    assert FIELDS[IDX["t_other"] + 1] == "iter_0" and len(FIELDS) - IDX["iter_0"] == SUMMARY_LEN


def rank_timers(busy_per_iteration: list[list[float]], collective: list[list[float]], report_every: int, ring=RING):
    """Ranks' timers that ran these iterations (rollout = busy / 4, update the rest), and the statistics
    rank 0 makes from a report every `report_every` iterations."""
    ranks = len(busy_per_iteration[0])
    timers = [PhaseTimer(ring=ring) for _ in range(ranks)]
    stats = StragglerStats(ranks)
    for i, (busy, coll) in enumerate(zip(busy_per_iteration, collective), 1):
        for t, b, c in zip(timers, busy, coll):
            iterate(t, env_step=b / 4, backward=3 * b / 4, allreduce=c)
        if i % report_every == 0 or i == len(busy_per_iteration):
            stats.add(np.stack([t.summary() for t in timers]))
    return stats


def test_statistics_of_two_ranks_one_of_them_slower():
    busy = [[1.0, 1.0 + 0.1 * i] for i in range(10)]    # rank 1 ever slower
    coll = [[0.2 + 0.1 * i, 0.2] for i in range(10)]    # rank 0 waits for it; 0.2 s is transfer
    for every in (1, 3):  # reports every iteration, or every third: the same iterations arrive
        m = rank_timers(busy, coll, every).metrics()
        assert m["straggler_iterations"] == 10 and m["straggler_lost"] == 0
        assert m["straggler_slowest_counts"] == [1, 9] and m["straggler_slowest_rank"] == 1  # a tie: the first
        assert m["straggler_transfer_s"] == pytest.approx(dict(p50=0.2, p90=0.2, p99=0.2, max=0.2))
        waits = [0.1 * i for i in range(10)] + [0.0] * 10
        assert m["straggler_wait_s"]["max"] == pytest.approx(0.9)
        assert m["straggler_wait_s"]["p50"] == pytest.approx(np.quantile(waits, 0.5))
        rollouts = [b / 4 for row in busy for b in row]
        assert m["straggler_rollout_s"] == pytest.approx(quantiles(rollouts))
        assert m["straggler_update_s"]["max"] == pytest.approx(0.75 * 1.9)
        spread = [max(r) / np.mean(r) for r in busy]
        assert m["straggler_spread"]["max"] == pytest.approx(1.9 / 1.45) and m["straggler_spread"]["p50"] == pytest.approx(
            np.quantile(spread, 0.5))
        rel = m["straggler_busy_rel"]
        assert len(rel) == len(REL_PROBS) and rel == sorted(rel) and rel[-1] == pytest.approx(1.9 / 1.45)
        assert m["straggler_busy_p50_s_per_rank"] == pytest.approx([1.0, 1.45])


def test_even_ranks_give_a_spread_of_one_and_no_wait():
    m = rank_timers([[2.0, 2.0, 2.0]] * 5, [[0.3] * 3] * 5, 1).metrics()
    assert m["straggler_spread"] == pytest.approx(dict(p50=1.0, p90=1.0, p99=1.0, max=1.0))
    assert m["straggler_wait_s"]["max"] == 0.0 and set(m["straggler_busy_rel"]) == {1.0}


def test_iterations_beyond_the_ring_between_reports_are_counted_as_lost():
    stats = rank_timers([[1.0, 1.0]] * 10, [[0.1, 0.1]] * 10, report_every=10, ring=4)
    m = stats.metrics()
    assert m["straggler_iterations"] == 4 and m["straggler_lost"] == 6


def test_a_long_run_is_kept_as_an_even_sample_within_the_budget():
    stats = StragglerStats(ranks=2, max_samples=2 * 64)  # room for 64 iterations
    t = [PhaseTimer(), PhaseTimer()]
    for i in range(1000):
        for timer in t:
            iterate(timer, env_step=float(i))
        stats.add(np.stack([x.summary() for x in t]))
    kept = stats.rows[: stats.stored, 0, 0]
    assert 32 <= stats.stored <= 64 and stats.seen == 1000
    assert np.all(np.diff(kept) == stats.stride) and kept[0] == 0  # iterations 0, s, 2s, ... of the whole run
    assert kept[-1] >= 1000 - stats.stride


def test_nothing_measured_yet_is_null():
    m = StragglerStats(ranks=3).metrics()
    assert m["straggler_spread"] is None and m["straggler_iterations"] == 0
    assert quantiles([]) is None
