"""The contention-free fast path: same results as the replay where it applies, the replay (and
its closed forms) wherever two flows share a link or two reductions share a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.collectives.schedule import Schedule, ScheduleBuilder
from collsim.engine import SimResult, ring_fabric, simulate, star_fabric
from collsim.engine import uncontended as fast
from collsim.engine.fabric import Fabric
from collsim.engine.testing import ring_all_reduce
from collsim.protocols import get_protocol
from tests.engine.conftest import IDEAL, REL, switch_fabric

B = 25e9
LAT = 1.5e-6
EXACT = 1e-12


def _close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a, b, rtol=EXACT, atol=0, equal_nan=True)


def assert_same(a: SimResult, b: SimResult) -> None:
    """Every record of two results agrees (times to 1e-12 relative, the rest exactly)."""
    assert a.time_s == pytest.approx(b.time_s, rel=EXACT, abs=0)
    assert (a.collective, a.algorithm, a.nranks, a.size_bytes, a.protocol) == (
        b.collective,
        b.algorithm,
        b.nranks,
        b.size_bytes,
        b.protocol,
    )
    for name in ("op_start_s", "op_end_s", "rank_finish_s"):
        _close(getattr(a, name), getattr(b, name))
    ta, tb = a.transfers, b.transfers
    for name in ("op_id", "src", "dst", "bytes", "wire_bytes", "route", "route_ptr", "route_links"):
        np.testing.assert_array_equal(getattr(ta, name), getattr(tb, name))
    for name in ("start_s", "flow_start_s", "end_s"):
        _close(getattr(ta, name), getattr(tb, name))
    assert a.links.name == b.links.name
    np.testing.assert_array_equal(a.links.capacity_bytes_per_s, b.links.capacity_bytes_per_s)
    for name in ("bytes", "busy_s", "utilization", "busy_fraction"):
        _close(getattr(a.links, name), getattr(b.links, name))
    how = ("engine_path", "replay_kernel", "replay_counts")  # which path ran, not what it found
    meta_a = {k: v for k, v in a.meta.items() if k not in how}
    assert meta_a == {k: v for k, v in b.meta.items() if k not in how}


def both(schedule: Schedule, fabric: Fabric, protocol=IDEAL) -> tuple[SimResult, SimResult]:
    """(default result, forced replay), after checking that they agree."""
    quick = simulate(schedule, fabric, protocol=protocol)
    replay = simulate(schedule, fabric, protocol=protocol, fast_path=False)
    assert replay.meta["engine_path"] == "replay"
    assert_same(quick, replay)
    return quick, replay


# -- where the fast path applies -----------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5, 8, 13])
@pytest.mark.parametrize("proto", ["Simple", "LL", "LL128"])
def test_ring_matches_the_replay_and_the_closed_form(n: int, proto: str) -> None:
    count = n * 3000
    quick, _ = both(ring_all_reduce(n, count), ring_fabric(n, B, LAT), get_protocol(proto))
    assert quick.meta["engine_path"] == "contention_free"
    p = get_protocol(proto)
    a = max(LAT, p.hop_latency_s[0])  # hwLat covers the route latency: the larger counts
    expected = 2 * (n - 1) * (a + count * 4 / (n * B * p.bandwidth_fraction))
    assert quick.time_s == pytest.approx(expected, rel=REL)


def test_uneven_ring_with_slow_memory_and_fused_reduce() -> None:
    # Uneven chunks, one slow link class and a reduction rate below the link rate, so fused
    # receive-reduces end on the GPU, not the wire.
    n = 6
    fabric = ring_fabric(n, B, LAT, memory_bytes_per_s=np.linspace(0.5, 3.0, n) * B)
    quick, _ = both(ring_all_reduce(n, n * 1001 + 5), fabric, get_protocol("LL128"))
    assert quick.meta["engine_path"] == "contention_free"


def test_mixed_local_ops_chain_and_zero_bytes() -> None:
    fabric = ring_fabric(4, B, LAT, memory_bytes_per_s=3e12)
    b = ScheduleBuilder()
    copy = b.transfer(1, 1, 1 << 20, "input", 0, "output", 0)
    red = b.reduction(1, 1 << 18, "input", 0, "output", 0, deps=[copy])
    other = b.reduction(2, 1 << 18, "input", 0, "output", 0)  # another GPU: no sharing
    zero = b.transfer(1, 2, 0, "input", 0, "output", 0, deps=[red])
    fused = b.transfer(2, 3, 1 << 16, "input", 0, "output", 0, reduce=True, deps=[zero, other])
    local_reduce = b.transfer(3, 3, 1 << 10, "input", 0, "output", 0, reduce=True, deps=[fused])
    b.transfer(3, 0, 1 << 12, "output", 0, "output", 0, deps=[local_reduce])
    quick, _ = both(b.build("custom", "t", 4, 0, 4), fabric, get_protocol("Simple"))
    assert quick.meta["engine_path"] == "contention_free"


def test_back_to_back_flows_on_one_link_are_not_contention() -> None:
    # No latency: each transfer starts on the link at the very instant the previous one ends.
    size = 1 << 20
    fabric = ring_fabric(2, B, 0.0)
    b = ScheduleBuilder()
    prev = None
    for _ in range(5):
        prev = b.transfer(0, 1, size // 4, "input", 0, "output", 0, deps=[prev])
    quick, _ = both(b.build("custom", "chain", 2, 0, 4), fabric)
    assert quick.meta["engine_path"] == "contention_free"
    assert quick.time_s == pytest.approx(5 * size / B, rel=REL)
    assert quick.links.busy_s[0] == pytest.approx(5 * size / B, rel=REL)


def test_link_shared_by_routes_at_different_times(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 0's uplink carries 0->1, then 0->2, then 0->3 (different routes, one at a time).
    # A tiny pair chunk makes the shared-link check run one link at a time.
    monkeypatch.setattr(fast, "_PAIR_CHUNK", 1)
    fabric = star_fabric(4, B, LAT, switch_latency=0.3e-6)
    b = ScheduleBuilder()
    prev = None
    for dst in (1, 2, 3, 1):
        prev = b.transfer(0, dst, 1 << 18, "input", 0, "output", 0, deps=[prev])
    b.transfer(2, 3, 1 << 18, "input", 0, "output", 0)  # concurrent, on other links
    quick, _ = both(b.build("custom", "t", 4, 0, 4), fabric)
    assert quick.meta["engine_path"] == "contention_free"
    assert quick.links.busy_s[0] == pytest.approx(4 * (1 << 20) / B, rel=REL)


def test_in_network_reduction_without_sharing() -> None:
    n, size, sw = 6, 1 << 22, 0.4e-6
    fabric = star_fabric(n, B, LAT, switch_latency=sw, reducing=True)
    b = ScheduleBuilder()
    first = b.network_reduce(range(n), range(n), size // 4, "input", 0, "output", 0)
    b.network_reduce([0, 1], [2, 3], size // 8, "output", 0, "output", 0, deps=[first])
    b.transfer(4, 5, 1 << 10, "input", 0, "output", 0, deps=[first])
    quick, _ = both(b.build("all_reduce", "nvls", n, size // 4, 4), fabric)
    assert quick.meta["engine_path"] == "contention_free"
    assert quick.op_end_s[0] == pytest.approx(2 * LAT + sw + size / B, rel=REL)


def test_random_dags_agree_with_the_replay() -> None:
    # Whatever the fast path decides, the answer is the replay's; some cases must be fast.
    rng = np.random.default_rng(7)
    paths = set()
    for case in range(40):
        n = int(rng.integers(2, 7))
        fabric = (star_fabric if case % 2 else ring_fabric)(n, B, LAT, memory_bytes_per_s=2e12)
        b = ScheduleBuilder()
        for i in range(int(rng.integers(1, 12))):
            deps = [int(d) for d in rng.choice(i, size=min(i, 2), replace=False)] if i else []
            src, dst = (int(x) for x in rng.integers(0, n, 2))
            count = int(rng.integers(0, 1 << 16))
            if rng.random() < 0.2:
                b.reduction(src, count, "input", 0, "output", 0, deps=deps)
            else:
                reduce = bool(rng.random() < 0.3)
                b.transfer(src, dst, count, "input", 0, "output", 0, reduce=reduce, deps=deps)
        quick, _ = both(b.build("custom", "random", n, 0, 4), fabric, get_protocol("Simple"))
        paths.add(quick.meta["engine_path"])
    assert paths == {"contention_free", "replay"}


def test_real_topology_equivalence() -> None:
    whatif_mod = pytest.importorskip("collsim.whatif")
    loader = pytest.importorskip("collsim.topology.loader")
    registry = pytest.importorskip("collsim.collectives.registry")
    w = whatif_mod.WhatIf(loader.load_topology("dgx-h100", nodes=2))
    n, count = w.fabric.nranks, 1 << 18
    # A ring whose sends wait for the previous send: no two flows ever share a link.
    quick, _ = both(ring_all_reduce(n, count), w.fabric, get_protocol("Simple"))
    assert quick.meta["engine_path"] == "contention_free"
    paths = set()
    for algorithm in ("ring", "tree", "hierarchical"):
        schedule = registry.build_schedule(
            "all_reduce", algorithm, nranks=n, count=count, layout=w.layout
        )
        paths.add(both(schedule, w.fabric, get_protocol("Simple"))[0].meta["engine_path"])
    assert "contention_free" in paths  # 1 MiB: chunks clear the InfiniBand hop in time


# -- where it does not: the replay runs and the closed forms hold ----------------------------------
def _path(schedule: Schedule, fabric: Fabric) -> SimResult:
    result = simulate(schedule, fabric, protocol=IDEAL)
    assert result.meta["engine_path"] == "replay"
    return result


def test_two_flows_on_one_link_take_the_replay() -> None:
    size = 1 << 20
    b = ScheduleBuilder()
    b.transfer(0, 2, size // 4, "input", 0, "output", 0)
    b.transfer(1, 2, size // 4, "input", 0, "output", 0)
    result = _path(b.build("custom", "t", 3, 0, 4), switch_fabric([B] * 3, [B] * 3, lat=LAT))
    np.testing.assert_allclose(result.transfers.end_s, 2 * LAT + 2 * size / B, rtol=REL)


@pytest.mark.parametrize("k", [2, 6])
def test_incast_takes_the_replay(k: int) -> None:
    size = 3 << 18
    b = ScheduleBuilder()
    b.transfers(np.arange(1, k + 1), np.zeros(k, np.int64), size // 4, "input", 0, "output", 0)
    result = _path(b.build("custom", "t", k + 1, 0, 4), star_fabric(k + 1, B, LAT))
    np.testing.assert_allclose(result.transfers.end_s, 2 * LAT + k * size / B, rtol=REL)


def test_overlapping_sends_on_one_route_take_the_replay() -> None:
    # Two sends 0->1 without an order between them: they share the link (S/B each -> 2S/B).
    size = 1 << 20
    b = ScheduleBuilder()
    b.transfer(0, 1, size // 4, "input", 0, "output", 0)
    b.transfer(0, 1, size // 4, "input", 0, "output", 0)
    result = _path(b.build("custom", "t", 2, 0, 4), ring_fabric(2, B, LAT))
    np.testing.assert_allclose(result.transfers.end_s, LAT + 2 * size / B, rtol=REL)


def test_overlapping_reductions_take_the_replay() -> None:
    mem, size = 3e12, 1 << 24
    b = ScheduleBuilder()
    for _ in range(3):
        b.reduction(0, size // 4, "input", 0, "output", 0)
    result = _path(b.build("custom", "t", 2, 0, 4), ring_fabric(2, B, LAT, memory_bytes_per_s=mem))
    step = size / (mem / 3)
    np.testing.assert_allclose(result.op_end_s, [step, 2 * step, 3 * step], rtol=REL)


def test_zero_time_reduction_behind_a_busy_gpu_takes_the_replay() -> None:
    # An empty reduction issued while its GPU is busy waits for it in the replay.
    mem, size = 3e12, 1 << 24
    b = ScheduleBuilder()
    b.reduction(0, size // 4, "input", 0, "output", 0)
    b.reduction(0, 0, "input", 0, "output", 0)
    result = _path(b.build("custom", "t", 2, 0, 4), ring_fabric(2, B, LAT, memory_bytes_per_s=mem))
    np.testing.assert_allclose(result.op_end_s, size / (mem / 3), rtol=REL)


def test_shared_link_overlap_across_routes_takes_the_replay() -> None:
    # 0->1 and 0->2 leave rank 0 on the same uplink at the same time.
    size = 1 << 20
    b = ScheduleBuilder()
    b.transfer(0, 1, size // 4, "input", 0, "output", 0)
    b.transfer(0, 2, size // 4, "input", 0, "output", 0)
    result = _path(b.build("custom", "t", 3, 0, 4), star_fabric(3, B, LAT))
    np.testing.assert_allclose(result.transfers.end_s, 2 * LAT + 2 * size / B, rtol=REL)
