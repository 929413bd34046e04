"""NCCL protocols as data: payload fractions, hop latencies, lookup errors."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import ring_fabric, simulate
from collsim.errors import ScheduleError
from collsim.protocols import HW_NET, HW_NVLINK, HW_PCI, Protocol, get_protocol, step_latency_s


def test_bandwidth_fractions_match_nccl_line_formats() -> None:
    assert get_protocol("LL").bandwidth_fraction == 0.5
    assert get_protocol("LL128").bandwidth_fraction == 120 / 128
    assert get_protocol("Simple").bandwidth_fraction == 1.0


def test_hop_latencies_are_ncclring_hwlat_rows() -> None:
    simple = get_protocol("simple")
    assert simple.hop_latency(HW_NVLINK) == pytest.approx(3.4e-6)
    assert simple.hop_latency(HW_PCI) == pytest.approx(5.7e-6)
    assert simple.hop_latency(HW_NET) == pytest.approx(14.0e-6)
    ll = get_protocol("ll")
    np.testing.assert_allclose(ll.hop_latency(np.array([0, 1, 2])), [0.6e-6, 1.0e-6, 2.7e-6])
    # LL is the low-latency protocol on every kind of link.
    ll128 = get_protocol("LL128")
    for kind in (HW_NVLINK, HW_PCI, HW_NET):
        assert ll.hop_latency(kind) < ll128.hop_latency(kind) < simple.hop_latency(kind)


def test_wire_bytes() -> None:
    assert float(get_protocol("LL").wire_bytes(1000)) == 2000.0
    assert float(get_protocol("LL128").wire_bytes(120)) == 128.0


def test_unknown_protocol_raises_schedule_error() -> None:
    with pytest.raises(ScheduleError) as info:
        get_protocol("LL256")
    assert info.value.field == "protocol"


def test_custom_protocol_passes_through_and_validates() -> None:
    ideal = Protocol("ideal", 1.0, 0.0)
    assert get_protocol(ideal) is ideal
    assert ideal.hop_latency_s == (0.0, 0.0, 0.0)
    with pytest.raises(ScheduleError):
        Protocol("bad", 1.5, 0.0)
    with pytest.raises(ScheduleError):
        Protocol("bad", 1.0, -1e-6)


def test_step_latency_is_the_larger_of_route_and_hwlat() -> None:
    """NCCL's hwLat already covers a typical route's wire time, so a step costs the larger of the
    two, never their sum: an NVLink LL step over a 1.5 us route is 1.5 us (not 2.1), a Simple
    step over it NCCL's 3.4 us (not 4.9)."""
    ll, simple = get_protocol("LL"), get_protocol("Simple")
    route = np.array([1.5e-6, 0.2e-6, 20e-6])
    np.testing.assert_allclose(
        step_latency_s(route, ll.hop_latency(HW_NVLINK)), [1.5e-6, 0.6e-6, 20e-6]
    )
    np.testing.assert_allclose(
        step_latency_s(route, simple.hop_latency(HW_NVLINK)), [3.4e-6, 3.4e-6, 20e-6]
    )
    assert float(step_latency_s(1.0e-6, simple.hop_latency(HW_NET))) == pytest.approx(14e-6)


def test_engine_charges_the_step_latency_not_the_sum() -> None:
    """One 2-rank transfer over a 1.5 us link: LL (0.6 us hwLat) starts its bytes after 1.5 us,
    Simple (3.4 us) after 3.4 us."""

    def one(proto: str) -> float:
        b = ScheduleBuilder()
        b.transfer(0, 1, 0, "input", 0, "output", 0)
        result = simulate(b.build("custom", "t", 2, 0, 4), ring_fabric(2, 1e9, 1.5e-6),
                          protocol=proto)  # fmt: skip
        return result.time_s

    assert one("LL") == pytest.approx(1.5e-6, rel=1e-12)
    assert one("Simple") == pytest.approx(3.4e-6, rel=1e-12)
