"""The contended benchmark's scenario (benchmarks/contended_scaling.py) at 64 GPUs: the
all-to-all on the 2:1 fat tree ends at its closed-form up-link floor plus latencies, and a ring
whose edges share up-links is slower than the same ring with GPUs in leaf order."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from collsim.collectives.registry import build_schedule
from collsim.engine import simulate
from collsim.topology.loader import topology_from_dict
from collsim.whatif import WhatIf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from contended_scaling import PAIR_BYTES, alltoall_uplink_bound_s, fat_tree


def test_alltoall_ends_at_the_uplink_floor():
    n = 64
    w = WhatIf(topology_from_dict(fat_tree(n, None)))
    sched = build_schedule("alltoall", "direct", nranks=n, count=n * PAIR_BYTES // 4,
                           layout=w.layout, channels=n - 1)  # fmt: skip
    t = simulate(sched, w.fabric, protocol="Simple").time_s
    floor = alltoall_uplink_bound_s(n)  # 8 x 56 x 16 MiB / (4 x 50 GB/s) = 37.58 ms
    assert floor == pytest.approx(8 * 56 * (16 << 20) / 200e9)
    assert floor <= t <= floor * 1.001  # latencies are microseconds against 37.6 ms


def test_a_scattered_ring_contends_on_the_uplinks():
    n = 64
    times = []
    for seed in (None, 1):
        w = WhatIf(topology_from_dict(fat_tree(n, seed)))
        sched = build_schedule("all_reduce", "ring", nranks=n, count=(1 << 30) // 4,
                               layout=w.layout, channels=1)  # fmt: skip
        times.append(simulate(sched, w.fabric, protocol="Simple").time_s)
    in_order, scattered = times
    # no ring can beat one link's rate: 2 x 63 steps of 16 MiB at 50 GB/s
    assert in_order >= 2 * 63 * (16 << 20) / 50e9
    assert scattered > 1.2 * in_order
