"""SimpleFabric and its builders: routes, latencies, local rates, the Fabric protocol."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.engine import Fabric, Link, SimpleFabric, full_mesh_fabric, ring_fabric, star_fabric
from collsim.errors import ScheduleError
from collsim.protocols import HW_NET


def test_builders_satisfy_the_fabric_protocol() -> None:
    for fabric in (ring_fabric(4, 1e9, 1e-6), star_fabric(4, 1e9, 1e-6), full_mesh_fabric(3, 1, 0)):
        assert isinstance(fabric, Fabric)
        assert len(fabric.link_names) == fabric.capacity_bytes_per_s.shape[0]
        assert fabric.link_kind.shape == fabric.capacity_bytes_per_s.shape


def test_ring_routes_go_the_short_way() -> None:
    fabric = ring_fabric(6, 1e9, 1e-6)
    ptr, links, lat = fabric.routes(np.array([0, 0, 0, 2]), np.array([1, 5, 3, 2]))
    names = [[fabric.link_names[i] for i in links[ptr[k] : ptr[k + 1]]] for k in range(4)]
    assert names == [["0->1"], ["0->5"], ["0->1", "1->2", "2->3"], []]
    np.testing.assert_allclose(lat, [1e-6, 1e-6, 3e-6, 0.0])


def test_unidirectional_ring_always_goes_forward() -> None:
    fabric = ring_fabric(4, 1e9, 1e-6, bidirectional=False)
    _, links, _ = fabric.routes(np.array([1]), np.array([0]))
    assert [fabric.link_names[i] for i in links] == ["1->2", "2->3", "3->0"]


def test_star_latency_includes_switch_and_local_rates() -> None:
    fabric = star_fabric(3, 2e9, 1e-6, switch_latency=0.5e-6, memory_bytes_per_s=6e12)
    _, links, lat = fabric.routes(np.array([0]), np.array([2]))
    assert lat[0] == pytest.approx(2.5e-6)
    assert [fabric.link_names[i] for i in links] == ["0->sw", "sw->2"]
    np.testing.assert_allclose(fabric.reduce_bytes_per_s, 2e12)
    np.testing.assert_allclose(fabric.copy_bytes_per_s, 3e12)
    with pytest.raises(ScheduleError):
        fabric.in_network(np.array([0, 1]), np.array([2]))


def test_reducing_star_in_network_routes() -> None:
    fabric = star_fabric(3, 1e9, 1e-6, switch_latency=0.25e-6, reducing=True)
    up_ptr, up, down_ptr, down, lat = fabric.in_network(np.array([0, 1, 2]), np.array([1]))
    assert [fabric.link_names[i] for i in up] == ["0->sw", "1->sw", "2->sw"]
    assert [fabric.link_names[i] for i in down] == ["sw->1"]
    assert list(up_ptr) == [0, 1, 2, 3] and list(down_ptr) == [0, 1]
    assert lat == pytest.approx(2.25e-6)


def test_explicit_paths_and_fewest_hops_fallback() -> None:
    links = [
        Link(0, "a", 1e9, 1e-6, HW_NET),
        Link("a", 1, 1e9, 1e-6),
        Link(0, "b", 1e9, 2e-6),
        Link("b", 1, 1e9, 2e-6),
    ]
    fabric = SimpleFabric(2, links, node_latency_s={"b": 1e-6}, paths={(0, 1): [0, "b", 1]})
    ptr, ids, lat = fabric.routes(np.array([0, 0]), np.array([1, 1]))
    assert list(ids) == [2, 3, 2, 3] and list(ptr) == [0, 2, 4]
    np.testing.assert_allclose(lat, [5e-6, 5e-6])
    auto = SimpleFabric(2, links)
    _, ids, _ = auto.routes(np.array([0]), np.array([1]))
    assert len(ids) == 2
    with pytest.raises(ScheduleError):
        auto.routes(np.array([1]), np.array([0]))  # no link back


def test_bad_input_raises_schedule_error() -> None:
    fabric = ring_fabric(3, 1e9, 1e-6)
    with pytest.raises(ScheduleError):
        fabric.routes(np.array([0]), np.array([3]))
    with pytest.raises(ScheduleError):
        SimpleFabric(2, [Link(0, 1, 1e9, 0), Link(0, 1, 1e9, 0)])
    with pytest.raises(ScheduleError):
        SimpleFabric(2, [Link(0, 1, 0.0, 0)])
    with pytest.raises(ScheduleError):
        ring_fabric(0, 1e9, 1e-6)
    with pytest.raises(ScheduleError):
        SimpleFabric(2, [Link(0, 1, 1, 0)], paths={(0, 1): [0, 2, 1]}).routes(
            np.array([0]), np.array([1])
        )
