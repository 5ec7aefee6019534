"""The scaling model's straggler term (analysis/scaling_model.py): the expected slowest of N ranks,
the slow-node scenario, and how they enter the projection."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "analysis"))
import scaling_model as sm  # noqa: E402

SAMPLE = Path(sm.__file__).parent / "data" / "sample"


def skewed(points=2000):
    """Equally likely relative busy times with a long right tail (mean 1)."""
    u = (np.arange(points) + 0.5) / points
    x = 0.9 + 0.1 * u ** 8 * 20
    return x / x.mean()


def test_a_constant_distribution_gives_the_single_rank_time_at_any_size():
    for n in (1, 2, 48, 480):
        assert sm.expected_max(np.full(50, 2.5), [(n, 1.0)]) == pytest.approx(2.5)
        assert sm.straggler_factor(np.full(50, 2.5), n) == pytest.approx(1.0)


def test_the_slowest_of_n_grows_with_n_up_to_the_largest_value():
    x = skewed()
    f = [sm.straggler_factor(x, n) for n in (1, 2, 4, 48, 480, 4800)]
    assert f[0] == pytest.approx(1.0) and all(b > a for a, b in zip(f, f[1:]))
    assert f[-1] <= x.max() / x.mean() + 1e-12


def test_the_exact_expectation_equals_resampling():
    rng = np.random.default_rng(0)
    x = rng.lognormal(0.0, 0.1, 300)
    for groups in ([(7, 1.0)], [(3, 1.3), (5, 1.0)]):
        draws = np.concatenate([c * rng.choice(x, (20000, n)) for n, c in groups], axis=1).max(1)
        assert sm.expected_max(x, groups) == pytest.approx(draws.mean(), rel=2e-3)


def test_one_slow_node_costs_at_most_its_slowdown():
    for n in (1, 2, 48, 96, 480):  # even ranks: exactly 1.3, whatever the size
        assert sm.straggler_factor(np.ones(1), n, slow=1.3) == pytest.approx(1.3)
    x = skewed()
    for n in (2, 48, 96, 480):
        even, slow = sm.straggler_factor(x, n), sm.straggler_factor(x, n, slow=1.3)
        assert even < slow <= 1.3 * even + 1e-12


def test_normal_fit_of_two_draws_is_the_textbook_value():
    x = 1.0 + 0.05 * np.random.default_rng(1).standard_normal(5000)
    fit = sm.normal_samples(x, points=4000)
    assert fit.mean() == pytest.approx(x.mean(), abs=1e-6) and fit.std() == pytest.approx(x.std(), rel=5e-3)
    sigma = x.std() / x.mean()
    assert sm.straggler_factor(fit, 2) == pytest.approx(1 + sigma / np.sqrt(np.pi), rel=1e-3)  # E[max of 2 normals]


def test_measured_quantiles_are_widened_for_the_mean_they_were_divided_by():
    q = np.interp(sm.REL_PROBS, [0, 1], [0.9, 1.1])  # 2 ranks: symmetric around 1, uniform
    x = sm.rel_samples(q, world_size=2)
    assert x.mean() == pytest.approx(1.0) and x.max() - 1 == pytest.approx(0.1 * np.sqrt(2), rel=1e-3)
    assert sm.rel_samples(q, world_size=1).max() == pytest.approx(1.1, rel=1e-3)
    with pytest.raises(ValueError, match="nondecreasing"):
        sm.rel_samples(q[::-1], world_size=2)


def test_the_projection_stretches_only_the_busy_part():
    s = sm.load_sweep(SAMPLE / "sweep.json")
    base = sm.project(s, (48, 480))
    same = sm.project(s, (48, 480), straggle=lambda p: 1.0)
    slower = sm.project(s, (48, 480), straggle=lambda p: 1.3)
    net = "10 GbE"
    assert same[net] == pytest.approx(base[net])
    steps = s["steps_per_rank_iteration"][0]
    t_base, t_slow = base["ranks"] * steps / base[net], slower["ranks"] * steps / slower[net]
    assert t_slow - t_base == pytest.approx(0.3 * base["busy_s_per_iteration"] * np.ones(2))
    assert 0 < base["busy_s_per_iteration"] < base["compute_s_per_iteration"]
    scen = sm.straggler_scenarios(s, skewed(), (48, 480))
    fps = {k: v[net] for k, v in scen.items()}
    even = fps["even ranks (no stragglers)"]
    assert all(np.all(v <= even + 1e-9) for v in fps.values())
    factor = {k: v["straggler_factor"] for k, v in scen.items()}
    assert np.all(factor["one node 30% slower + stragglers"] <= 1.3 * factor["stragglers, resampled"] + 1e-12)
