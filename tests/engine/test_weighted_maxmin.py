"""Weighted max-min (a split flow's sub-flows claim their path shares): hand-computed rates,
both solvers bit for bit, the max-min condition per unit of weight, weights of 1 unchanged, and
the incremental reshare schemes (``collsim/engine/maxmin.py``, ``incremental.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collsim.engine.maxmin import CAPPED, max_min_rates, max_min_small
from collsim.engine.network import FlowNetwork


def _rates(paths, capacity, weight=None, ceiling=None) -> np.ndarray:
    links = np.array([link for path in paths for link in path], dtype=np.int64)
    nlinks = np.array([len(path) for path in paths], dtype=np.int64)
    return max_min_rates(
        links,
        nlinks,
        np.array(capacity, dtype=np.float64),
        None if ceiling is None else np.array(ceiling, dtype=np.float64),
        None if weight is None else np.array(weight, dtype=np.float64),
    )


def test_half_split_flow_and_an_unsplit_flow_on_one_link():
    """A splits half/half over links 0 and 1 (3 B/s each), B crosses link 0 alone. Link 0 weighs
    0.5 + 1 = 1.5, so its share is 3 / 1.5 = 2 per unit: B gets 2 (2/3 of the link), A's half
    there 0.5 x 2 = 1; link 1 then gives A's other half all 3. Unweighted, B got 1.5."""
    paths = [[0], [1], [0]]  # A's halves, then B
    got = _rates(paths, [3.0, 3.0], weight=[0.5, 0.5, 1.0])
    np.testing.assert_array_equal(got, [1.0, 3.0, 2.0])
    np.testing.assert_array_equal(_rates(paths, [3.0, 3.0]), [1.5, 3.0, 1.5])
    small, bottleneck = max_min_small(paths, [3.0, 3.0], weight=[0.5, 0.5, 1.0])
    assert small == [1.0, 3.0, 2.0] and bottleneck == [0, 1, 0]


def test_split_flow_through_its_own_nic():
    """Both halves of A also cross A's NIC (link 2); all links 3 B/s. Round 1: link 0's share
    2 per unit is the smallest, settling A's half there at 1 and B at 2. Round 2: the NIC has
    3 - 1 = 2 left for A's other half (weight 0.5): 4 per unit, so 2. A moves 1 + 2 = 3 in all
    (its NIC full), B 2: the split flow takes no more of link 0 than its share."""
    paths = [[2, 0], [2, 1], [0]]
    got = _rates(paths, [3.0, 3.0, 3.0], weight=[0.5, 0.5, 1.0])
    np.testing.assert_array_equal(got, [1.0, 2.0, 2.0])
    assert max_min_small(paths, [3.0, 3.0, 3.0], weight=[0.5, 0.5, 1.0])[0] == [1.0, 2.0, 2.0]


def test_a_split_flow_takes_no_more_than_an_unsplit_one_at_a_shared_bottleneck():
    """A flow split k ways (weights 1/k) and an unsplit flow meet at one link (12 B/s), every
    path elsewhere wide: each gets 6. Unweighted, the split flow took k/(k+1) of the link."""
    for k in (2, 3, 4, 6):
        paths = [[0, 1 + i] for i in range(k)] + [[0]]
        capacity = [12.0] + [100.0] * k
        got = _rates(paths, capacity, weight=[1.0 / k] * k + [1.0])
        assert got[:k].sum() == pytest.approx(6.0, rel=1e-15)
        assert got[k] == pytest.approx(6.0, rel=1e-15)
        old = _rates(paths, capacity)
        assert old[:k].sum() == pytest.approx(12.0 * k / (k + 1), rel=1e-15)


def test_ceiling_counts_per_unit_of_weight():
    """A's two halves (weight 0.5) each capped at 1 B/s (its channel's 2 split by the shares)
    on a 10 B/s link with B: A settles at its ceiling (1 + 1), B takes the 8 left."""
    got = _rates([[0], [0], [0]], [10.0], weight=[0.5, 0.5, 1.0], ceiling=[1.0, 1.0, np.inf])
    np.testing.assert_allclose(got, [1.0, 1.0, 8.0], rtol=1e-15)
    small, bottleneck = max_min_small([[0], [0], [0]], [10.0], [1.0, 1.0, np.inf], [0.5, 0.5, 1.0])
    np.testing.assert_array_equal(small, got)
    assert bottleneck == [CAPPED, CAPPED, 0]


_PATHS = st.lists(
    st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True), min_size=1, max_size=12
)
_WEIGHTS = st.lists(st.sampled_from([0.125, 0.25, 1 / 3, 0.5, 1.0, 2.0]), min_size=12, max_size=12)
_CAPS = st.lists(st.floats(0.5, 100.0), min_size=6, max_size=6)


@settings(max_examples=80, deadline=None)
@given(_PATHS, _CAPS, _WEIGHTS, st.lists(st.floats(0.1, 200.0), min_size=12, max_size=12))
def test_both_solvers_give_the_same_floats_and_weighted_max_min_holds(
    paths, capacity, weights, ceilings
):
    """The numpy and the Python solver agree bit for bit (with and without ceilings), and the
    rates are the weighted max-min allocation: no link over capacity, and every flow either at
    its ceiling or on a saturated link where no flow has a larger rate per unit of weight."""
    w = weights[: len(paths)]
    for ceil in (None, ceilings[: len(paths)]):
        got = _rates(paths, capacity, weight=w, ceiling=ceil)
        small, _ = max_min_small(paths, capacity, ceil, w)
        np.testing.assert_array_equal(np.array(small), got)
        load = np.zeros(6)
        for path, rate in zip(paths, got, strict=True):
            load[path] += rate
        cap = np.array(capacity)
        assert np.all(got > 0)
        assert np.all(load <= cap * (1 + 1e-9))
        unit = got / np.array(w)
        for f, path in enumerate(paths):
            if ceil is not None and got[f] >= ceil[f] * (1 - 1e-9):
                continue
            ok = False
            for link in path:
                saturated = load[link] >= cap[link] * (1 - 1e-9)
                fastest = max(unit[g] for g, p in enumerate(paths) if link in p)
                ok |= saturated and unit[f] >= fastest * (1 - 1e-9)
            assert ok, (f, path)


@settings(max_examples=40, deadline=None)
@given(_PATHS, _CAPS)
def test_weights_of_one_change_nothing(paths, capacity):
    """Every weight 1 (or none given): the unweighted solvers' very floats."""
    ones = [1.0] * len(paths)
    np.testing.assert_array_equal(_rates(paths, capacity, weight=ones), _rates(paths, capacity))
    assert max_min_small(paths, capacity, weight=ones) == max_min_small(paths, capacity)


def _finish_times(mode: str, seed: int) -> np.ndarray:
    """Transfers split over 1-4 random paths of eight links (each sub-flow weighted 1/k), one
    arriving every 0.5 s, in one reshare scheme: when each transfer's last flow ends. Arrivals
    do not depend on finishes, so rounding differences stay rounding differences."""
    net = FlowNetwork(np.array([4.0, 3.0, 5.0, 2.0, 6.0, 3.0, 4.0, 2.5]), mode=mode)
    rng = np.random.default_rng(seed)
    end = np.zeros(12)

    def until(limit: float) -> None:
        while len(net) and net.next_end_s() <= limit:
            t = net.next_end_s()
            end[net.pop_finished(t, t)] = t
            net.reshare(t)

    for op in range(12):
        t = 0.5 * op
        until(t)
        k = int(rng.integers(1, 5))
        paths = [rng.choice(8, size=int(rng.integers(1, 4)), replace=False) for _ in range(k)]
        nbytes = float(rng.integers(1, 20))
        net.add(t, np.full(k, op), np.full(k, nbytes / k), np.array([p.size for p in paths]),
                np.concatenate(paths).astype(np.int64), weight=np.full(k, 1.0 / k))  # fmt: skip
        net.reshare(t)
    until(np.inf)
    return end


@pytest.mark.parametrize("seed", range(4))
def test_reshare_schemes_agree_with_weights(seed):
    """With weighted flows, recomputing only connected components gives every finish time of a
    full recomputation bit for bit, and local settling (which compares rates per unit of
    weight when it checks a flow's bottleneck) within rounding."""
    ref = _finish_times("all", seed)
    np.testing.assert_array_equal(_finish_times("components", seed), ref)
    for mode in ("local", "auto"):
        np.testing.assert_allclose(_finish_times(mode, seed), ref, rtol=1e-12, atol=0)
