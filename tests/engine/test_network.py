"""Max-min fair sharing (progressive filling) of directed links by flows."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from collsim.engine.network import max_min_rates


def rates(paths: list[list[int]], capacity: list[float]) -> np.ndarray:
    links = np.array([link for path in paths for link in path], dtype=np.int64)
    nlinks = np.array([len(path) for path in paths], dtype=np.int64)
    return max_min_rates(links, nlinks, np.array(capacity, dtype=np.float64))


def test_single_flow_gets_its_bottleneck() -> None:
    np.testing.assert_array_equal(rates([[0, 1]], [10.0, 4.0]), [4.0])


def test_two_flows_on_one_link_get_half_each() -> None:
    np.testing.assert_array_equal(rates([[0], [0]], [10.0]), [5.0, 5.0])


def test_incast_splits_equally() -> None:
    k = 7
    paths = [[i, k] for i in range(k)]
    np.testing.assert_array_equal(rates(paths, [1.0] * k + [3.0]), [3.0 / k] * k)


def test_flow_limited_elsewhere_leaves_more_for_others() -> None:
    # Flow 0 is capped at 1 by link 0; flow 1 takes the rest of link 1 (3), not an equal 2.
    np.testing.assert_allclose(rates([[0, 1], [1]], [1.0, 4.0]), [1.0, 3.0], rtol=1e-15)


def test_classic_three_level_example() -> None:
    # Links A (cap 1) and B (cap 2). f0 crosses A and B, f1 only A, f2 and f3 only B.
    # A is the first bottleneck (1/2 each for f0, f1); B then gives (2 - 1/2) / 2 to f2, f3.
    got = rates([[0, 1], [0], [1], [1]], [1.0, 2.0])
    np.testing.assert_allclose(got, [0.5, 0.5, 0.75, 0.75], rtol=1e-15)


def test_no_flows() -> None:
    assert rates([], [1.0]).shape == (0,)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True), min_size=1, max_size=12
    ),
    st.lists(st.floats(0.5, 100.0), min_size=6, max_size=6),
)
def test_max_min_properties(paths: list[list[int]], capacity: list[float]) -> None:
    got = rates(paths, capacity)
    load = np.zeros(6)
    for path, rate in zip(paths, got, strict=True):
        load[path] += rate
    cap = np.array(capacity)
    assert np.all(got > 0)
    assert np.all(load <= cap * (1 + 1e-9))
    # Max-min: each flow crosses a saturated link on which no flow is faster than it.
    for f, path in enumerate(paths):
        ok = False
        for link in path:
            saturated = load[link] >= cap[link] * (1 - 1e-9)
            fastest = max(got[g] for g, p in enumerate(paths) if link in p)
            ok |= saturated and got[f] >= fastest * (1 - 1e-9)
        assert ok, (f, path)


def test_large_fabric_with_few_active_links_gives_the_same_rates() -> None:
    capacity = [1.0, 2.0] + [5.0] * 100  # only links 0 and 1 carry flows
    got = rates([[0, 1], [0], [1], [1]], capacity)
    np.testing.assert_allclose(got, [0.5, 0.5, 0.75, 0.75], rtol=1e-15)
