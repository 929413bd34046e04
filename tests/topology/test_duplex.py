"""Links short of full duplex: a coupling capacity both directions share, seen alike by routing,
the discrete-event engine and the analytic model; one-way traffic keeps the full rate."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from collsim.collectives.registry import build_schedule
from collsim.engine import simulate
from collsim.errors import CalibrationError, CollsimError
from collsim.model.analytic import AnalyticModel
from collsim.model.params import DEFAULT_PARAMS, ModelParams
from collsim.topology.graph import Network
from collsim.topology.loader import CATALOG_DIR, topology_from_dict
from collsim.topology.spec import with_duplex
from collsim.whatif import WhatIf

GIB = 2**30
CHANNELS = 2
"""NCCL's two channels on these hosts (``2 coll channels`` in their bundled logs): one A100
channel moves 24 GB/s, under the HCA's 25 (:mod:`collsim.channel_rates`)."""


def gdr(duplex: str | None = None):
    """Two hosts, one A100 PCIe and one HDR HCA each (25 GB/s per direction on the wire), the
    GPU and HCA joined directly: the catalog's path through the CPU and its shared forwarding
    capacity (tests/topology/test_host_p2p.py) are left out, so only the cable couples."""
    doc = yaml.safe_load((CATALOG_DIR / "a100-pcie-ib-2node.yaml").read_text())
    doc["node"]["intra"].pop("host_p2p_bandwidth")
    doc["node"]["nics"].pop("gpu_path")
    if duplex:
        doc["node"]["nics"]["link"]["duplex_bandwidth"] = duplex
    return topology_from_dict(doc)


def busbw_gbps(topo, collective, algorithm, params=DEFAULT_PARAMS):
    t = AnalyticModel(topo, params).predict(collective, algorithm, np.array([GIB]),
                                            channels=CHANNELS)[0]  # fmt: skip
    factor = {"all_reduce": 2 * (topo.n_gpus - 1) / topo.n_gpus}.get(collective, 1.0)
    return GIB / t / 1e9 * factor


def test_coupling_links_follow_the_cables_and_join_routes():
    net = Network(gdr("30GB/s"))
    cables = net.n_directed_links
    assert len(net.capacity_bytes_per_s) == cables + 2  # the two HCA cables
    assert net.capacity_bytes_per_s[cables:].tolist() == [30e9, 30e9]
    assert all("(both directions)" in n for n in net.link_names[cables:])
    there, back = net.gpu_route(0, 1), net.gpu_route(1, 0)
    shared = set(there.links) & set(back.links)
    assert shared == {cables, cables + 1}  # both ways cross both couplings, no cable twice
    assert there.hops == back.hops == len(there.links) - 2
    assert Network(gdr()).gpu_route(0, 1).latency_s == there.latency_s


def test_full_duplex_is_unchanged_and_figures_ignore_couplings():
    plain, coupled = Network(gdr()), Network(gdr("30GB/s"))
    assert plain.bisection_bandwidth_bytes_per_s() == coupled.bisection_bandwidth_bytes_per_s()
    assert plain.injection_bandwidth_bytes_per_s() == coupled.injection_bandwidth_bytes_per_s()
    assert len(plain.capacity_bytes_per_s) == plain.n_directed_links


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_two_way_traffic_shares_and_one_way_keeps_the_rate(engine):
    """HDR: 25 GB/s each way. With 30 GB/s for both together, a ring all_reduce (both ways
    busy) gets 15 GB/s a direction; a broadcast (one way) still 25 GB/s."""

    def rate(topo, collective, algorithm):
        if engine == "analytic":
            return busbw_gbps(topo, collective, algorithm)
        w = WhatIf(topo)
        sched = build_schedule(collective, algorithm, nranks=2, count=GIB // 4, layout=w.layout,
                               channels=CHANNELS)  # fmt: skip
        return simulate(sched, w.fabric).busbw_gbps

    full, coupled = gdr(), gdr("30GB/s")
    assert rate(full, "all_reduce", "ring") == pytest.approx(25.0, rel=0.01)
    assert rate(coupled, "all_reduce", "ring") == pytest.approx(15.0, rel=0.01)
    assert rate(coupled, "broadcast", "chain") == pytest.approx(25.0, rel=0.01)


def test_model_and_engine_agree_on_a_coupled_system():
    topo = gdr("29.4GB/s")
    w = WhatIf(topo)
    for collective, algorithm in [("all_reduce", "ring"), ("sendrecv", "p2p")]:
        sched = build_schedule(collective, algorithm, nranks=2, count=(64 << 20) // 4,
                               layout=w.layout)  # fmt: skip
        des = simulate(sched, w.fabric).time_s
        ana = AnalyticModel(w).predict(collective, algorithm, np.array([64 << 20]))[0]
        assert ana == pytest.approx(des, rel=0.01)


def test_duplex_efficiency_of_the_parameters_couples_links_by_class():
    topo = gdr()
    half = dataclasses.replace(DEFAULT_PARAMS, duplex_efficiency=(1.0, 1.0, 0.6))
    assert busbw_gbps(topo, "all_reduce", "ring", half) == pytest.approx(15.0, rel=0.01)
    assert busbw_gbps(topo, "broadcast", "chain", half) == pytest.approx(25.0, rel=0.01)
    assert ModelParams.from_dict(half.to_dict()) == half
    with pytest.raises(CalibrationError, match="duplex_efficiency"):
        ModelParams(duplex_efficiency=(1.0, 1.0, 0.4))  # below half duplex
    coupled = with_duplex(topo, {"infiniband": 0.5})
    assert {lk.duplex_bandwidth_bytes_per_s for lk in coupled.links if lk.kind == "infiniband"} == {
        25e9
    }
    assert with_duplex(topo, {}) == topo


def test_duplex_bandwidth_must_be_a_positive_rate():
    doc = yaml.safe_load((CATALOG_DIR / "a100-pcie-ib-2node.yaml").read_text())
    doc["node"]["nics"]["link"]["duplex_bandwidth"] = "-3GB/s"
    with pytest.raises(CollsimError, match="duplex_bandwidth"):
        topology_from_dict(doc)


@pytest.mark.parametrize(
    ("fault", "one_way", "two_way"),
    [
        # one direction degraded: the other direction keeps its full rate
        ("link:n0.nic0>sw0:bw=0.1", 25.0, 2.5),
        # another job's 20 GB/s one way leaves 10 GB/s of the 30 shared
        ("background:n0.nic0>sw0:rate=20GB/s", 10.0, 5.0),
        # 10 GB/s each way leaves 10 GB/s shared: 5 each way
        ("background:n0.nic0-sw0:rate=10GB/s", 10.0, 5.0),
    ],
)
def test_faults_on_a_coupled_link(fault, one_way, two_way):
    """30 GB/s shared on a 25 GB/s-each-way HCA cable, under what-if faults (des engine)."""
    from collsim.topology.faults import apply_faults, parse_cli_faults

    topo = apply_faults(gdr("30GB/s"), parse_cli_faults([fault]))
    w = WhatIf(topo)
    count = (64 << 20) // 4
    bcast = build_schedule("broadcast", "chain", nranks=2, count=count, layout=w.layout, root=1,
                           channels=CHANNELS)  # fmt: skip
    ring = build_schedule("all_reduce", "ring", nranks=2, count=count, layout=w.layout,
                          channels=CHANNELS)  # fmt: skip
    assert simulate(bcast, w.fabric).busbw_gbps == pytest.approx(one_way, rel=0.01)
    assert simulate(ring, w.fabric).busbw_gbps == pytest.approx(two_way, rel=0.01)


def test_fast_path_runs_where_a_coupling_cannot_fill():
    """One-way traffic (broadcast) cannot fill a shared capacity: the contention-free fast path
    times it, as the replay does. Both ways at full rate (ring all_reduce) can: the replay runs."""
    w = WhatIf(gdr("30GB/s"))
    count = (64 << 20) // 4
    bcast = build_schedule("broadcast", "chain", nranks=2, count=count, layout=w.layout, root=1)
    fast, slow = simulate(bcast, w.fabric), simulate(bcast, w.fabric, fast_path=False)
    assert fast.meta["engine_path"] == "contention_free"
    assert fast.time_s == pytest.approx(slow.time_s, rel=1e-12)
    np.testing.assert_allclose(fast.links.busy_s, slow.links.busy_s, rtol=1e-12, atol=1e-15)
    ring = build_schedule("all_reduce", "ring", nranks=2, count=count, layout=w.layout)
    assert simulate(ring, w.fabric).meta["engine_path"] == "replay"


def test_topo_show_states_the_shared_capacity():
    from collsim.topology.describe import describe, describe_text

    info = describe(gdr("29.4GB/s"))
    assert info["links"]["infiniband"]["duplex_gbps"] == [29.4]
    assert "infiniband 2 (25 GB/s; both ways 29.4 GB/s)" in describe_text(info)
    assert "duplex_gbps" not in describe(gdr())["links"]["infiniband"]
