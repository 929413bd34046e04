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


def _reference_ends(starts, paths, wire, capacity, ceiling):
    """A slow, plain fluid max-min simulation written for this test: flows (bytes ``wire``)
    start at ``starts`` on link lists ``paths``; between events every active flow runs at its
    progressive-filling rate (raise all unfrozen flows alike until a link saturates or a flow
    reaches ``ceiling``; freeze those; repeat), and the next event is the next start or finish."""
    n = len(starts)
    remaining = list(wire)
    ends = [None] * n
    order = sorted(range(n), key=lambda f: starts[f])
    nxt, active, t = 0, set(), 0.0
    while nxt < n or active:
        if not active:
            t = starts[order[nxt]]
        while nxt < n and starts[order[nxt]] <= t:
            active.add(order[nxt])
            nxt += 1
        rate = dict.fromkeys(active, 0.0)
        frozen: set[int] = set()
        residual = dict(enumerate(capacity))
        while len(frozen) < len(active):
            free = [f for f in active if f not in frozen]
            count: dict[int, int] = {}
            for f in free:
                for link in paths[f]:
                    count[link] = count.get(link, 0) + 1
            step = min(min(residual[k] / c for k, c in count.items()),
                       min(ceiling - rate[f] for f in free))  # fmt: skip
            for f in free:
                rate[f] += step
            for k, c in count.items():
                residual[k] -= step * c
            full = {k for k, c in count.items() if residual[k] <= 1e-9 * capacity[k]}
            for f in free:
                if ceiling - rate[f] <= 1e-12 * ceiling or any(k in full for k in paths[f]):
                    frozen.add(f)
        finish = min(t + remaining[f] / rate[f] for f in active)
        until = min(finish, starts[order[nxt]]) if nxt < n else finish
        for f in list(active):
            remaining[f] -= rate[f] * (until - t)
            if remaining[f] <= 1e-9 * wire[f]:
                ends[f] = until
                active.discard(f)
        t = until
    return ends


def test_alltoall_matches_a_slow_reference_max_min():
    """Every transfer of the 64-GPU all-to-all (4032 flows, all in flight at once, sharing the
    2:1 up-links) ends when a plain progressive-filling fluid simulation says, from the same
    flow start times, routes, link capacities and NCCL's per-channel ceiling."""
    from collsim.channel_rates import SIMPLE_GBPS

    n = 64
    w = WhatIf(topology_from_dict(fat_tree(n, None)))
    sched = build_schedule("alltoall", "direct", nranks=n, count=n * PAIR_BYTES // 4,
                           layout=w.layout, channels=n - 1)  # fmt: skip
    res = simulate(sched, w.fabric, protocol="Simple")
    tr = res.transfers
    net = [i for i in range(len(tr)) if tr.src[i] != tr.dst[i]]
    assert len(net) == n * (n - 1)
    paths = [tuple(int(k) for k in tr.path(i)) for i in net]
    capacity = [float(c) for c in res.links.capacity_bytes_per_s]
    ends = _reference_ends([float(tr.flow_start_s[i]) for i in net], paths,
                           [float(tr.wire_bytes[i]) for i in net], capacity,
                           SIMPLE_GBPS["hopper"] * 1e9)  # fmt: skip
    got = [float(tr.end_s[i]) for i in net]
    assert max(abs(a - b) / b for a, b in zip(got, ends, strict=True)) < 1e-9


def test_two_jobs_on_disjoint_links_run_as_if_alone_and_share_where_they_meet():
    """Two 64-GPU ring all-reduces side by side on a 128-GPU fat tree: with each job on its own
    8 leaves their routes share no link, so each ends exactly when it does alone; scattered
    over the leaves they meet on up-links and the pair ends later than either alone."""
    from collsim.collectives.jobs import side_by_side
    from collsim.collectives.layout import RankLayout

    for seed, shared in ((None, False), (1, True)):
        w = WhatIf(topology_from_dict(fat_tree(128, seed)))
        half = RankLayout(64, 1)
        job = build_schedule("all_reduce", "ring", nranks=64, count=(64 << 20) // 4,
                             layout=half, channels=1)  # fmt: skip
        both = side_by_side([job, job])
        assert both.nranks == 128 and len(both) == 2 * len(job)
        assert both.meta["jobs"] == [(0, 64, 0, len(job)), (64, 64, len(job), len(job))]
        res = simulate(both, w.fabric, protocol="Simple")
        fabric_a = type(w.fabric)(w.network, gpus=[f"gpu{r}" for r in range(64)])
        fabric_b = type(w.fabric)(w.network, gpus=[f"gpu{r}" for r in range(64, 128)])
        alone = [simulate(job, f, protocol="Simple") for f in (fabric_a, fabric_b)]
        finish = res.rank_finish_s
        if not shared:
            assert finish[:64] == pytest.approx(alone[0].rank_finish_s, rel=1e-12)
            assert finish[64:] == pytest.approx(alone[1].rank_finish_s, rel=1e-12)
        else:
            assert res.time_s > 1.05 * max(a.time_s for a in alone)


def test_jobs_of_different_collectives_or_sizes_are_refused():
    from collsim.collectives.jobs import side_by_side
    from collsim.collectives.layout import RankLayout
    from collsim.errors import ScheduleError

    a = build_schedule("all_reduce", "ring", nranks=8, count=1024, layout=RankLayout(8, 1))
    b = build_schedule("all_reduce", "ring", nranks=8, count=2048, layout=RankLayout(8, 1))
    with pytest.raises(ScheduleError, match="one collective of one size"):
        side_by_side([a, b])
    with pytest.raises(ScheduleError, match="no schedules"):
        side_by_side([])
