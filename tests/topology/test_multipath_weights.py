"""A transfer split over several paths claims one flow's share of a link, in the engine and the
analytic model alike (weighted max-min: each sub-flow weighs its share of the bytes)."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import simulate
from collsim.topology.fabric import TopologyFabric
from collsim.topology.graph import Network
from collsim.topology.loader import topology_from_dict
from tests.topology.test_multipath import _GPU, MB, _flows, _gpu, _rates


def _dragonfly_incast(routing: str) -> dict:
    """One dragonfly group of four routers, all-to-all at 25 GB/s. g0 on r0; g1 and g2 on r1,
    every GPU on a 100 GB/s port. g0 -> g1 crosses the routers (adaptive: the direct r0-r1 link
    in two lanes and a detour via r2 and one via r3, a quarter of the bytes each); g2 -> g1
    stays on r1 (one path). Both end on r1 -> g1."""
    devices = [_gpu("g0", 0), _gpu("g1", 1), _gpu("g2", 2)]
    devices += [{"name": f"r{i}", "kind": "switch"} for i in range(4)]
    port = {"kind": "slingshot", "bandwidth": "100GB/s"}
    links = [{"a": "g0", "b": "r0", **port}, {"a": "g1", "b": "r1", **port},
             {"a": "g2", "b": "r1", **port}]  # fmt: skip
    links += [{"a": f"r{i}", "b": f"r{j}", "kind": "slingshot", "bandwidth": "25GB/s"}
              for i in range(4) for j in range(i + 1, 4)]  # fmt: skip
    return {"name": "dfi", "gpu": _GPU, "devices": devices, "links": links, "routing": routing}


def test_split_flow_and_unsplit_flow_share_the_receiving_port_evenly():
    """r1 -> g1 (100 GB/s) carries g0's four sub-flows (weight 1/4 each) and g2's flow (weight
    1): 2 units, 50 GB/s per unit. The sub-flows get 12.5 GB/s each (the direct lanes then fill
    the 25 GB/s r0-r1 link exactly), so g0 -> g1 moves 4 x 12.5 = 50 GB/s and g2 -> g1 50 GB/s
    (engine and model). Counting each sub-flow as a whole flow, g2 got 25 GB/s while the
    detours ran (the model's static share; the engine's time average came back to 50 only
    because g2 sped up to 75 once the detours' quarters were done)."""
    engine, model, path = _rates(_dragonfly_incast("adaptive"), [(0, 1), (2, 1)])
    assert path == "replay"
    assert engine == pytest.approx([50e9, 50e9], rel=1e-12)
    assert model == pytest.approx([50e9, 50e9], rel=1e-12)


def test_unsplit_flow_keeps_half_the_port_while_the_split_one_runs():
    """The engine, with g2 -> g1 a quarter of g0 -> g1's 64 MiB: g2's 16 MiB run at 50 GB/s
    from start to end (g0's sub-flows all at 12.5 GB/s meanwhile), ending at 16 MiB / 50 GB/s.
    Unweighted it ran at 25 GB/s and ended twice as late."""
    fabric = TopologyFabric(Network(topology_from_dict(_dragonfly_incast("adaptive"))))
    builder = ScheduleBuilder()
    builder.transfer(0, 1, 64 * MB // 4, "input", 0, "output", 0)
    builder.transfer(2, 1, 16 * MB // 4, "input", 0, "output", 0)
    result = simulate(builder.build("sendrecv", "direct", 3, 16 * MB, 4), fabric)
    tr = result.transfers
    assert tr.end_s[1] - tr.flow_start_s[1] == pytest.approx(16 * MB / 50e9, rel=1e-12)


def test_a_split_flow_takes_no_more_than_an_unsplit_one():
    """The same incast under ecmp (g0 -> g1 one path, the direct link's 25 GB/s its limit) and
    adaptive routing: spreading g0's bytes over detours lifts g0 to the port's fair half, never
    past the unsplit g2, and g2 never gets less than g0 (engine and model)."""
    for routing, expect in (("ecmp", [25e9, 75e9]), ("adaptive", [50e9, 50e9])):
        engine, model, _ = _rates(_dragonfly_incast(routing), [(0, 1), (2, 1)])
        for got in (engine, model):
            assert got == pytest.approx(expect, rel=1e-12), routing
            assert got[0] <= got[1] * (1 + 1e-12)


def test_link_records_still_carry_each_path_share():
    """Weights change the rates, not the bytes: each of the four paths puts a quarter of g0's
    bytes on its inter-router links, and the receiving port carries both transfers whole."""
    fabric = TopologyFabric(Network(topology_from_dict(_dragonfly_incast("adaptive"))))
    result = simulate(_flows([(0, 1), (2, 1)], 64 * MB, fabric.nranks), fabric)
    by_name = dict(zip(result.links.name, result.links.bytes, strict=True))
    assert by_name["r0->r1"] == pytest.approx(32 * MB)
    assert by_name["r0->r2"] == pytest.approx(16 * MB)
    assert by_name["r1->g1"] == pytest.approx(128 * MB)
    np.testing.assert_allclose(result.transfers.end_s[0], result.transfers.end_s[1], rtol=1e-12)
