"""The per-channel rate ceiling in the engine: a transfer (one channel's flow) moves at most its
NCCL channel's rate. A ceiling is exactly a private link of that capacity per flow: the solvers
give the rates a run with such links appended gives, the Python and numpy solvers the same
floats, and every reshare scheme of the replay the same times.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collsim.channel_rates import P2P_NET_GBPS, SIMPLE_GBPS
from collsim.collectives.registry import build_schedule
from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import simulate
from collsim.engine.maxmin import CAPPED, max_min_rates, max_min_small
from collsim.engine.prepare import channel_ceiling, prepare
from collsim.model.system import System
from collsim.protocols import LL, SIMPLE
from collsim.topology.loader import load_topology

HOPPER = SIMPLE_GBPS["hopper"] * 1e9


@pytest.fixture(scope="module")
def dgx() -> System:
    return System(load_topology("dgx-h100", nodes=1))


def _flat(paths: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    links = np.array([link for path in paths for link in path], dtype=np.int64)
    return links, np.array([len(p) for p in paths], dtype=np.int64)


def test_a_ceiling_below_the_fair_share_frees_capacity_for_the_others() -> None:
    # Two flows on a 10 GB/s link, one held to 2: the other takes the remaining 8, not 5.
    links, nlinks = _flat([[0], [0]])
    got = max_min_rates(links, nlinks, np.array([10.0]), np.array([2.0, np.inf]))
    np.testing.assert_array_equal(got, [2.0, 8.0])
    rates, bottleneck = max_min_small([[0], [0]], [10.0], [2.0, np.inf])
    assert rates == [2.0, 8.0] and bottleneck == [CAPPED, 0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
             min_size=1, max_size=12),
    st.lists(st.floats(0.5, 20.0), min_size=6, max_size=6),
    st.lists(st.one_of(st.just(np.inf), st.floats(0.2, 15.0)), min_size=12, max_size=12),
)  # fmt: skip
def test_a_ceiling_is_a_private_link(paths, capacity, ceilings) -> None:
    """Rates with ceilings == rates with one more link per flow of that capacity, and the
    Python solver gives the numpy solver's floats."""
    ceil = np.array(ceilings[: len(paths)])
    links, nlinks = _flat(paths)
    cap = np.array(capacity)
    got = max_min_rates(links, nlinks, cap, ceil)
    private = [[*p, 6 + i] for i, p in enumerate(paths)]
    plinks, pn = _flat(private)
    want = max_min_rates(plinks, pn, np.r_[cap, ceil])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    small, _ = max_min_small(paths, capacity, list(ceil))
    np.testing.assert_array_equal(got, small)
    assert np.all(got <= ceil * (1 + 1e-12))


def _two_sends(channels: tuple[int, int], count: int = 1 << 26):
    """Rank 0 sends two blocks to rank 1 at once, on the given channels (4 B elements)."""
    b = ScheduleBuilder()
    for i, ch in enumerate(channels):
        b.transfer(0, 1, count, "input", i * count, "output", i * count, channel=ch)
    return b.build("sendrecv", "custom", 8, 2 * count, 4)


def test_each_transfer_moves_one_channels_rate(dgx) -> None:
    """One transfer to a peer moves 38.7 GB/s (NCCL's Hopper per-channel figure), far below the
    450 GB/s NVLink port; two at once move twice that."""
    size = (1 << 26) * 4
    b = ScheduleBuilder()
    b.transfer(0, 1, 1 << 26, "input", 0, "output", 0)
    one = simulate(b.build("sendrecv", "custom", 8, 1 << 26, 4), dgx.fabric)
    two = simulate(_two_sends((0, 1)), dgx.fabric)
    assert one.time_s == pytest.approx(size / HOPPER, rel=0.01)
    assert two.time_s == pytest.approx(one.time_s, rel=1e-9)


def test_the_ceiling_per_protocol_and_point_to_point(dgx) -> None:
    """The wire ceiling is the channel's payload rate over the protocol's payload fraction, times
    the channels a transfer stands for; a point-to-point channel over the network moves
    P2P_PER_CHANNEL_NET_BW (14 GB/s)."""
    fabric = dgx.fabric
    np.testing.assert_allclose(channel_ceiling(fabric, SIMPLE), [HOPPER] * 3)
    np.testing.assert_allclose(channel_ceiling(fabric, LL), [HOPPER] * 3)  # half payload, same wire
    p2p = channel_ceiling(fabric, SIMPLE, {"point_to_point": True, "channels_per_transfer": 2.0})
    np.testing.assert_allclose(p2p, [2 * HOPPER, 2 * HOPPER, 2 * P2P_NET_GBPS * 1e9])


def test_accelerators_without_nccl_channels_have_no_ceiling() -> None:
    w = System(load_topology("mi300x"))
    assert channel_ceiling(w.fabric, SIMPLE) is None
    sched = build_schedule("all_reduce", "ring", nranks=w.layout.nranks, count=1 << 20)
    assert prepare(sched, w.fabric, SIMPLE).route_ceiling is None


def test_fast_path_and_replay_agree_under_the_ceiling(dgx) -> None:
    """One channel's ring never shares a link, so the contention-free path times it, at the
    channel's rate; the replay gives the same times."""
    sched = build_schedule("all_reduce", "ring", nranks=8, count=1 << 26, layout=dgx.layout)
    fast = simulate(sched, dgx.fabric)
    slow = simulate(sched, dgx.fabric, fast_path=False)
    assert fast.meta["engine_path"] == "contention_free"
    assert fast.time_s == pytest.approx(slow.time_s, rel=1e-12)
    busbw = 2 * 7 / 8 * (1 << 28) / fast.time_s
    assert busbw == pytest.approx(HOPPER, rel=0.01)


@pytest.mark.parametrize("mode", ["components", "local", "all"])
def test_every_reshare_scheme_honours_the_ceiling(mode) -> None:
    """An all-to-all across two DGX H100 nodes (flows contend on NICs and NVLink ports, some at
    their connection's ceiling): every reshare scheme gives the reference's times."""
    w = System(load_topology("dgx-h100", nodes=2))
    layout = w.layout
    sched = build_schedule("alltoall", "direct", nranks=16, count=1 << 22, channels=4,
                           layout=layout)  # fmt: skip
    ref = simulate(sched, w.fabric, fast_path=False, reshare="all")
    got = simulate(sched, w.fabric, fast_path=False, reshare=mode)
    assert got.time_s == pytest.approx(ref.time_s, rel=1e-9)
    np.testing.assert_allclose(got.op_end_s, ref.op_end_s, rtol=1e-9)
