"""A transfer that follows another on its connection (``after``): its flow starts when the
other's has ended, its latency overlapping the other's bytes -- in the replay and the fast path."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import simulate
from collsim.engine.fabrics import ring_fabric
from collsim.protocols import Protocol

BW, LAT = 10e9, 5e-6
PROTO = Protocol("plain", 1.0, 0.0)
BYTES = 100_000  # 10 us on the wire


def _two_sends(link: str):
    b = ScheduleBuilder()
    first = b.transfer(0, 1, BYTES // 4, "input", 0, "output", 0)
    if link == "after":
        b.transfers(np.array([0]), np.array([1]), BYTES // 4, "input", 0, "output", 0,
                    after=np.array([first]))  # fmt: skip
    elif link == "dep":
        b.transfer(0, 1, BYTES // 4, "input", 0, "output", 0, deps=[first])
    else:
        b.transfer(0, 1, BYTES // 4, "input", 0, "output", 0)
    return b.build("sendrecv", "test", 2, BYTES // 4, 4)


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize(
    "link, expected_s",
    [
        ("after", LAT + 2 * BYTES / BW),  # bytes back to back, one latency
        ("dep", 2 * (LAT + BYTES / BW)),  # the second waits for the first to arrive
        ("none", LAT + 2 * BYTES / BW),  # both at once, sharing the link
    ],
)
def test_following_overlaps_latency(link, expected_s, fast_path):
    sim = simulate(_two_sends(link), ring_fabric(2, BW, LAT), protocol=PROTO, fast_path=fast_path)
    assert sim.time_s == pytest.approx(expected_s, rel=1e-12)
    if link == "after":  # never two flows on the link at once
        assert sim.meta["engine_path"] == ("contention_free" if fast_path else "replay")


def test_follower_waits_for_a_busy_connection_in_the_replay():
    """The follower's latency has elapsed before its predecessor ends: it waits (pending)."""
    b = ScheduleBuilder()
    slow = b.transfer(0, 1, 10 * BYTES // 4, "input", 0, "output", 0)  # 100 us
    b.transfers(np.array([0]), np.array([1]), BYTES // 4, "input", 0, "scratch", 0,
                after=np.array([slow]))  # fmt: skip
    sched = b.build("sendrecv", "test", 2, 10 * BYTES // 4, 4)
    fab = ring_fabric(2, BW, LAT)
    fast = simulate(sched, fab, protocol=PROTO)
    replay = simulate(sched, fab, protocol=PROTO, fast_path=False)
    assert fast.time_s == replay.time_s == pytest.approx(LAT + 11 * BYTES / BW, rel=1e-12)


def test_a_slow_hop_costs_its_latency_per_block_not_per_step():
    """Ring all-gather on 8 ranks where one hop has 20x the latency: each block crosses that
    hop at most once, so the time is far below 7 steps x the slow latency."""
    from collsim.collectives.registry import build_schedule
    from collsim.engine.fabric import SimpleFabric
    from collsim.engine.fabrics import Link

    n, slow = 8, 20 * LAT
    links = [Link(i, (i + 1) % n, BW, slow if i == 3 else LAT, 0) for i in range(n)]
    fab = SimpleFabric(
        n, links, router=lambda s, d: [(int(s) + k) % n for k in range((int(d) - int(s)) % n + 1)]
    )
    sched = build_schedule("all_gather", "ring", nranks=n, count=8)
    for fast_path in (True, False):
        t = simulate(sched, fab, protocol=PROTO, fast_path=fast_path).time_s
        assert t < slow + 7 * LAT + 1e-6  # one slow crossing plus six ordinary hops
        assert t > slow
