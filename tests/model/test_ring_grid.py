"""The ring model's longest path (:func:`collsim.model.grid.longest_path`): exact intercepts, and
its one-pass form finds the step loop's paths."""

import numpy as np
import pytest

from collsim.model import grid
from collsim.model.analytic import AnalyticModel
from collsim.model.envelope import S_MAX_BYTES, Aff
from collsim.model.grid import longest_path as _grid
from collsim.topology.loader import load_topology


def test_the_intercept_is_the_same_at_64_tib_as_at_one_byte():
    """A uniform 16-rank ring all-reduce takes the same path at every size, so its latency must
    not depend on the size it is evaluated at. It was recovered as ``value - slope x size``,
    which at the envelope's 64 TiB query (the value ~ 5e3 s) is off by ulps of the value:
    2.7e-12 s more latency than the engine on two DGX A100 nodes."""
    m = 16
    step = Aff(np.full((1, m), 4.8133e-6), np.full((1, m), 7.8125e-11 / 30))
    small, large = _grid([step] * (2 * (m - 1)), 1.0), _grid([step] * (2 * (m - 1)), S_MAX_BYTES)
    assert np.array_equal(small.a, large.a) and np.array_equal(small.b, large.b)
    assert float(small.a.max()) == sum([4.8133e-6] * (2 * (m - 1)))


def _plan(rng, m, k, classes, split):
    """Ring steps of random latencies and ``classes`` distinct bytes' times, two phases."""
    lat = rng.choice([1e-6, 2e-6, 5e-6], size=(k, m)) * rng.uniform(0.9, 1.1, (k, m))
    slope = rng.choice(np.geomspace(1e-12, 1e-10, classes), size=(k, m))
    r, g = Aff(lat, slope), Aff(lat, slope * 0.7)
    return [r] * split[0] + [g] * split[1]


@pytest.mark.parametrize("seed", range(12))
def test_one_pass_matches_the_step_loop(seed, monkeypatch):
    """The one-pass phase (range maxima over unrolled positions) finds the step loop's longest
    path on random rings: every position's time at three sizes, with and without start times,
    for all-reduce, reduce-scatter (a one-step last phase) and runs longer than the ring."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 80))
    start = Aff(rng.uniform(0, 1e-4, (2, m)), rng.uniform(0, 1e-11, (2, m)))
    for split in ((m - 1, m - 1), (max(m - 2, 0), 1), (3 * m, 0)):
        plan = _plan(rng, m, 2, 1 + seed % 5, split)
        for s in (1.0, 1e6, S_MAX_BYTES):
            for begin in (None, start):
                monkeypatch.setattr(grid, "FAST_MIN_CELLS", 1 << 62)
                ref = grid.longest_path(plan, s, begin)
                monkeypatch.setattr(grid, "FAST_MIN_CELLS", 0)
                got = grid.longest_path(plan, s, begin)
                np.testing.assert_allclose(got.at(s), ref.at(s), rtol=1e-13, atol=0)
                # the line found attains that value: intercept and slope are the path's
                np.testing.assert_allclose(got.a + got.b * s, ref.at(s), rtol=1e-12, atol=0)


def test_one_pass_model_agrees_on_a_real_ring(monkeypatch):
    """The ring all-reduce of 64 DGX H100 nodes (512 ranks: intra-node NVLink edges, NIC edges at
    different fabric distances) has the same envelope either way, to 1e-12."""
    topo = load_topology("dgx-h100", nodes=64)
    sizes = np.geomspace(8, 2**34, 30)
    monkeypatch.setattr(grid, "FAST_MIN_CELLS", 1 << 62)
    ref = AnalyticModel(topo).predict("all_reduce", "ring", sizes, channels=2)
    monkeypatch.setattr(grid, "FAST_MIN_CELLS", 0)
    got = AnalyticModel(topo).predict("all_reduce", "ring", sizes, channels=2)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=0)
