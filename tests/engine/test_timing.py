"""Engine timings against closed forms (1e-9 relative)."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import ring_fabric, simulate, star_fabric
from collsim.engine.testing import ring_all_reduce
from collsim.errors import ScheduleError
from collsim.protocols import get_protocol
from tests.engine.conftest import IDEAL, REL, switch_fabric

B = 25e9  # link bandwidth, bytes/s
LAT = 1.5e-6  # link latency, s


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 12, 16])
@pytest.mark.parametrize("proto", ["Simple", "LL", "LL128"])
def test_ring_all_reduce_closed_form(n: int, proto: str) -> None:
    p = get_protocol(proto)
    count = n * 3000  # elements per rank, divisible by n
    size = count * 4
    schedule = ring_all_reduce(n, count)
    result = simulate(schedule, ring_fabric(n, B, LAT), protocol=proto)
    a = max(LAT, p.hop_latency_s[0])  # hwLat covers the route's latency: the larger counts
    expected = 2 * (n - 1) * (a + size / (n * B * p.bandwidth_fraction))
    assert result.time_s == pytest.approx(expected, rel=REL)
    np.testing.assert_allclose(result.rank_finish_s, expected, rtol=REL)
    # Every forward ring link carries 2(n-1) chunks; the backward links stay idle.
    wire_chunk = size / n / p.bandwidth_fraction
    carried = result.links.bytes[: n if n > 2 else 2]
    np.testing.assert_allclose(carried, 2 * (n - 1) * wire_chunk, rtol=REL)
    assert len(result.links) == (2 if n == 2 else 2 * n)
    assert result.algbw_gbps == pytest.approx(size / expected / 1e9, rel=REL)
    assert result.busbw_gbps == pytest.approx(result.algbw_gbps * 2 * (n - 1) / n, rel=REL)


def test_ring_all_reduce_from_registry_matches_closed_form() -> None:
    registry = pytest.importorskip("collsim.collectives.registry")
    for n in (3, 4, 6):
        count = n * 4096
        schedule = registry.build_schedule("all_reduce", "ring", nranks=n, count=count)
        result = simulate(schedule, ring_fabric(n, B, LAT), protocol=IDEAL)
        expected = 2 * (n - 1) * (LAT + count * 4 / (n * B))
        assert result.time_s == pytest.approx(expected, rel=REL)


def test_two_flows_on_one_link_share_it() -> None:
    size = 1 << 20
    fabric = switch_fabric([B, B, B], [B, B, B], lat=LAT)
    b = ScheduleBuilder()
    b.transfer(0, 2, size // 4, "input", 0, "output", 0)
    b.transfer(1, 2, size // 4, "input", 0, "output", 0)
    result = simulate(b.build("custom", "test", 3, 0, 4), fabric, protocol=IDEAL)
    np.testing.assert_allclose(result.transfers.end_s, 2 * LAT + 2 * size / B, rtol=REL)
    np.testing.assert_allclose(result.transfers.flow_start_s, 2 * LAT, rtol=REL)
    # The shared downlink into rank 2 (link id 5) was busy for the whole transfer.
    assert result.links.busy_s[5] == pytest.approx(2 * size / B, rel=REL)
    assert result.links.bytes[5] == 2 * size


@pytest.mark.parametrize("k", [2, 5, 9])
def test_incast_of_k_flows(k: int) -> None:
    size = 3 << 18
    fabric = star_fabric(k + 1, B, LAT, switch_latency=0.7e-6)
    b = ScheduleBuilder()
    b.transfers(
        np.arange(1, k + 1), np.zeros(k, dtype=np.int64), size // 4, "input", 0, "output", 0
    )
    result = simulate(b.build("custom", "test", k + 1, 0, 4), fabric, protocol=IDEAL)
    expected = 2 * LAT + 0.7e-6 + k * size / B
    np.testing.assert_allclose(result.transfers.end_s, expected, rtol=REL)


def test_max_min_gives_more_to_flow_whose_peer_is_limited_elsewhere() -> None:
    # Rank 0's uplink runs at B/4, so flow 0->2 is capped there; 1->2 gets 3B/4 of the
    # shared downlink into rank 2, not B/2. After 1->2 ends, 0->2 stays capped at B/4.
    size = 1 << 22
    fabric = switch_fabric([B / 4, B, B], [B, B, B])
    b = ScheduleBuilder()
    b.transfer(0, 2, size // 4, "input", 0, "output", 0)
    b.transfer(1, 2, size // 4, "input", 0, "output", 0)
    result = simulate(b.build("custom", "test", 3, 0, 4), fabric, protocol=IDEAL)
    end = result.transfers.end_s
    assert end[1] == pytest.approx(size / (0.75 * B), rel=REL)
    assert end[0] == pytest.approx(size / (0.25 * B), rel=REL)


def test_rates_are_reshared_when_a_flow_ends() -> None:
    # Two flows on one link, one half the size: the small one ends at 2*(S/2)/B = S/B, then
    # the big one runs alone for its remaining S/2: ends at S/B + (S/2)/B = 1.5 S/B.
    size = 1 << 20
    fabric = switch_fabric([B, B, B], [B, B, B])
    b = ScheduleBuilder()
    b.transfer(0, 2, size // 4, "input", 0, "output", 0)
    b.transfer(1, 2, size // 8, "input", 0, "output", 0)
    result = simulate(b.build("custom", "test", 3, 0, 4), fabric, protocol=IDEAL)
    assert result.transfers.end_s[1] == pytest.approx(size / B, rel=REL)
    assert result.transfers.end_s[0] == pytest.approx(1.5 * size / B, rel=REL)


def test_reductions_on_one_gpu_serialise() -> None:
    mem = 3e12  # memory bandwidth: reductions at mem / 3
    size = 1 << 24
    fabric = ring_fabric(2, B, LAT, memory_bytes_per_s=mem)
    b = ScheduleBuilder()
    for _ in range(3):
        b.reduction(0, size // 4, "input", 0, "output", 0)
    other = b.reduction(1, size // 4, "input", 0, "output", 0)
    result = simulate(b.build("custom", "test", 2, 0, 4), fabric, protocol=IDEAL)
    step = size / (mem / 3)
    np.testing.assert_allclose(result.op_end_s[:3], [step, 2 * step, 3 * step], rtol=REL)
    np.testing.assert_allclose(result.op_start_s[:3], [0, step, 2 * step], rtol=REL, atol=0)
    assert result.op_end_s[other] == pytest.approx(step, rel=REL)
    assert result.time_s == pytest.approx(3 * step, rel=REL)


@pytest.mark.parametrize("mem", [3 * B / 4, 3 * B * 4])
def test_fused_reduce_is_bounded_by_the_slower_of_network_and_gpu(mem: float) -> None:
    size = 1 << 22
    fabric = ring_fabric(2, B, LAT, memory_bytes_per_s=mem)
    b = ScheduleBuilder()
    b.transfer(0, 1, size // 4, "input", 0, "output", 0, reduce=True)
    b.transfer(1, 0, size // 4, "input", 0, "output", 0)  # plain: network-bound only
    result = simulate(b.build("custom", "test", 2, 0, 4), fabric, protocol=IDEAL)
    reduce_rate = mem / 3
    assert result.transfers.end_s[0] == pytest.approx(LAT + size / min(B, reduce_rate), rel=REL)
    assert result.transfers.end_s[1] == pytest.approx(LAT + size / B, rel=REL)


def test_local_copy_uses_copy_bandwidth_and_no_link() -> None:
    mem = 2e12
    size = 1 << 26
    fabric = ring_fabric(3, B, LAT, memory_bytes_per_s=mem)
    b = ScheduleBuilder()
    b.transfer(1, 1, size // 4, "input", 0, "output", 0)
    result = simulate(b.build("custom", "test", 3, 0, 4), fabric)  # Simple: no hop on a copy
    assert result.time_s == pytest.approx(size / (mem / 2), rel=REL)
    assert result.links.bytes.sum() == 0
    assert len(result.transfers.path(0)) == 0


def test_in_network_reduction_on_a_reducing_star() -> None:
    n, size, sw = 6, 1 << 22, 0.4e-6
    fabric = star_fabric(n, B, LAT, switch_latency=sw, reducing=True)
    b = ScheduleBuilder()
    ranks = list(range(n))
    b.network_reduce(ranks, ranks, size // 4, "input", 0, "output", 0)
    result = simulate(b.build("all_reduce", "nvls", n, size // 4, 4), fabric, protocol=IDEAL)
    # Up and down flows stream together, each on its own link at B.
    assert result.time_s == pytest.approx(2 * LAT + sw + size / B, rel=REL)
    np.testing.assert_allclose(result.links.bytes, size, rtol=REL)
    np.testing.assert_allclose(result.rank_finish_s, result.time_s, rtol=REL)
    with pytest.raises(ScheduleError):
        simulate(b.build("all_reduce", "nvls", n, size // 4, 4), star_fabric(n, B, LAT))


def test_dependencies_are_respected() -> None:
    n, count = 5, 5 * 1000
    schedule = ring_all_reduce(n, count)
    result = simulate(schedule, ring_fabric(n, B, LAT))
    owner = np.repeat(np.arange(len(schedule)), np.diff(schedule.dep_ptr))
    starts = result.op_start_s[owner]
    ends_of_deps = result.op_end_s[schedule.dep_idx]
    assert np.all(starts >= ends_of_deps)
    # A chain: each op starts exactly when the previous one ends.
    b = ScheduleBuilder()
    prev = None
    for i in range(4):
        prev = b.transfer(i % 2, 1 - i % 2, 256, "input", 0, "output", 0, deps=[prev])
    chain = simulate(b.build("custom", "chain", 2, 0, 4), ring_fabric(2, B, LAT), protocol=IDEAL)
    np.testing.assert_array_equal(chain.op_start_s[1:], chain.op_end_s[:-1])
    assert chain.time_s == pytest.approx(4 * (LAT + 1024 / B), rel=REL)


def test_zero_byte_transfer_costs_latency_only() -> None:
    b = ScheduleBuilder()
    b.transfer(0, 1, 0, "input", 0, "output", 0)
    result = simulate(b.build("custom", "t", 2, 0, 4), ring_fabric(2, B, LAT))
    assert result.time_s == pytest.approx(max(LAT, 3.4e-6), rel=REL)  # Simple hwLat > route


def test_single_rank_and_empty_schedules_take_no_time() -> None:
    result = simulate(ring_all_reduce(1, 1024), ring_fabric(1, B, LAT))
    assert result.time_s == 0.0
    assert result.busbw_gbps == 0.0
    empty = ScheduleBuilder().build("all_reduce", "ring", 1, 0, 4)
    result = simulate(empty, ring_fabric(1, B, LAT))
    assert result.time_s == 0.0
    assert len(result.transfers) == 0
    assert result.algbw_gbps == 0.0


def test_schedule_larger_than_fabric_is_rejected() -> None:
    with pytest.raises(ScheduleError) as info:
        simulate(ring_all_reduce(4, 16), ring_fabric(3, B, LAT))
    assert info.value.field == "nranks"
    with pytest.raises(ScheduleError):
        simulate(ring_all_reduce(3, 12), ring_fabric(3, B, LAT), protocol="bogus")


def test_unrelated_flow_does_not_perturb_an_uncontended_finish_time() -> None:
    # 0->1 runs alone on its link; 2->3 starts midway on another link (after a reduction).
    # Re-sharing at that moment must leave 0->1's finish bit-exact: LAT + S / B.
    size = 1 << 24
    fabric = ring_fabric(4, B, LAT, memory_bytes_per_s=3e12)
    b = ScheduleBuilder()
    b.transfer(0, 1, size // 4, "input", 0, "output", 0)
    red = b.reduction(2, 1 << 16, "input", 0, "output", 0)
    b.transfer(2, 3, size // 4, "input", 0, "output", 0, deps=[red])
    result = simulate(b.build("custom", "t", 4, 0, 4), fabric, protocol=IDEAL)
    assert result.transfers.end_s[0] == LAT + size / B


def test_reference_ring_schedule_computes_an_all_reduce() -> None:
    verify = pytest.importorskip("collsim.collectives.verify")
    for n in (1, 2, 3, 5):
        verify.verify(ring_all_reduce(n, n * 7 + 3))


class _TwoRankWire:
    """The smallest Fabric: two ranks, one directed link each way, routes by array lookup."""

    nranks = 2
    link_names = ("0->1", "1->0")
    capacity_bytes_per_s = np.array([B, B / 2])
    link_kind = np.array([0, 0])
    reduce_bytes_per_s = np.array([np.inf, np.inf])
    copy_bytes_per_s = np.array([np.inf, np.inf])

    def routes(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, ...]:
        ptr = np.arange(src.shape[0] + 1)
        return ptr, np.where(src == 0, 0, 1), np.full(src.shape[0], LAT)

    def in_network(self, srcs: np.ndarray, dsts: np.ndarray) -> tuple:
        raise ScheduleError("no reducing switch", field="fabric")


def test_engine_needs_only_the_fabric_protocol() -> None:
    b = ScheduleBuilder()
    b.transfer(0, 1, 1024, "input", 0, "output", 0)
    b.transfer(1, 0, 1024, "input", 0, "output", 0)
    result = simulate(b.build("custom", "t", 2, 0, 4), _TwoRankWire(), protocol=IDEAL)
    np.testing.assert_allclose(result.transfers.end_s, [LAT + 4096 / B, LAT + 8192 / B])
