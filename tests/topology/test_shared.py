"""Capacities several link directions share: the uplink of a PCIe switch whose GPUs have no
peer-to-peer and so reach each other through host memory. Routing, the discrete-event engine and
the analytic model see it alike; traffic one way keeps the uplink's rate, both ways halve it."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from collsim.collectives.registry import build_schedule
from collsim.engine import simulate
from collsim.errors import TopologyError
from collsim.model.analytic import AnalyticModel
from collsim.topology.describe import describe, describe_text, to_explicit_yaml
from collsim.topology.graph import Network
from collsim.topology.loader import CATALOG_DIR, load_topology, topology_from_dict
from collsim.whatif import WhatIf

MIB = 2**20


def box(gpus: int = 2, switches: int = 1, p2p: bool = False):
    """GPUs on PCIe Gen3 x16 (15.75 GB/s a direction) under ``switches`` switches."""
    doc = yaml.safe_load((CATALOG_DIR / "rtx2080ti-2gpu-nop2p.yaml").read_text())
    doc["node"]["gpus"] = gpus
    doc["node"]["intra"]["pcie_switches"] = switches
    doc["node"]["intra"]["p2p"] = p2p
    return topology_from_dict(doc)


def busbw_gbps(topo, collective, algorithm, engine, channels=8):
    """On 8 channels by default: a channel copying both ways through host memory moves 2 GB/s
    (collsim.channel_rates, host-staged copies), so 8 leave the uplink the limit."""
    size = 256 * MIB
    if engine == "analytic":
        model = AnalyticModel(topo)
        t = model.predict(collective, algorithm, np.array([size]), channels=channels)[0]
    else:
        w = WhatIf(topo)
        sched = build_schedule(collective, algorithm, nranks=topo.n_gpus, count=size // 4,
                               layout=w.layout, channels=channels)  # fmt: skip
        t = simulate(sched, w.fabric).time_s
    n = topo.n_gpus
    factor = {"all_reduce": 2 * (n - 1) / n}.get(collective, 1.0)
    return size / t / 1e9 * factor


def test_gpus_below_one_switch_share_its_uplink_both_ways():
    topo = box()
    assert [sh.name for sh in topo.shared] == [
        "n0.pcie0 uplink (to host)",
        "n0.pcie0 uplink (from host)",
    ]
    net = Network(topo)
    cables = net.n_directed_links
    assert net.capacity_bytes_per_s[cables:].tolist() == [15.75e9, 15.75e9]
    there, back = net.gpu_route(0, 1), net.gpu_route(1, 0)
    assert there.devices == ("n0.gpu0", "n0.cpu0", "n0.gpu1")  # through host memory
    assert there.links[-2:] == back.links[-2:] == (cables, cables + 1)  # up, then down
    assert there.hops == 2


def test_one_gpu_per_switch_or_peer_to_peer_shares_nothing():
    assert box(gpus=2, switches=2).shared == ()
    assert box(p2p=True).shared == ()  # the switch is a device; its uplink is a cable
    assert [len(sh.directions) for sh in box(gpus=4, switches=2).shared] == [2, 2, 2, 2]


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_both_ways_halve_the_uplink_and_one_way_keeps_it(engine):
    """Staged through host memory, a broadcast sends up the uplink once and down once (15.75
    GB/s); a ring all_reduce has both GPUs sending at once, so each gets half of each direction."""
    topo = box()
    assert busbw_gbps(topo, "broadcast", "chain", engine) == pytest.approx(15.75, rel=0.01)
    assert busbw_gbps(topo, "all_reduce", "ring", engine) == pytest.approx(7.875, rel=0.01)
    apart = box(switches=2)  # one GPU per switch: each has its own uplink
    assert busbw_gbps(apart, "all_reduce", "ring", engine) == pytest.approx(15.75, rel=0.01)


def test_model_and_engine_agree_on_four_gpus_under_two_switches():
    topo = box(gpus=4, switches=2)
    w = WhatIf(topo)
    for collective, algorithm in [("all_reduce", "ring"), ("all_gather", "ring"),
                                  ("alltoall", "direct")]:  # fmt: skip
        sched = build_schedule(collective, algorithm, nranks=4, count=(64 * MIB) // 4,
                               layout=w.layout)  # fmt: skip
        des = simulate(sched, w.fabric).time_s
        ana = AnalyticModel(w).predict(collective, algorithm, np.array([64 * MIB]))[0]
        assert ana == pytest.approx(des, rel=0.01)


def test_explicit_export_keeps_the_shared_capacities(tmp_path):
    topo = box(gpus=4, switches=2)
    path = tmp_path / "explicit.yaml"
    path.write_text(to_explicit_yaml(topo))
    again = load_topology(path)
    assert again.shared == topo.shared
    assert again.links == topo.links


def test_topo_show_states_the_shared_uplink():
    info = describe(box())
    assert info["shared"][0] == {
        "name": "n0.pcie0 uplink (to host)",
        "bandwidth_gbps": 15.75,
        "links": 2,
    }
    assert "shared:      n0.pcie0 uplink (to host): 15.75 GB/s for 2 links" in describe_text(info)
    assert "shared" not in describe(box(p2p=True))


def test_a_shared_direction_must_follow_a_link(tmp_path):
    doc = yaml.safe_load(to_explicit_yaml(box()))
    doc["shared"][0]["directions"][1] = ["n0.gpu1", "n0.gpu0"]
    with pytest.raises(TopologyError, match=r"shared\.0\.directions\.1"):
        topology_from_dict(doc)


@pytest.mark.parametrize(
    ("fault", "ring_gbps"),
    [
        # another job's 7.75 GB/s up the uplink leaves 8 GB/s to share: 4 each
        ("background:n0.gpu1>n0.cpu0:rate=7.75GB/s", 4.0),
        # GPU 1's cable at a tenth: its direction of the ring is the bottleneck
        ("link:n0.gpu1-n0.cpu0:bw=0.1", 1.575),
    ],
)
def test_faults_on_a_shared_uplink(fault, ring_gbps):
    from collsim.topology.faults import apply_faults, parse_cli_faults

    topo = apply_faults(box(), parse_cli_faults([fault]))
    assert busbw_gbps(topo, "all_reduce", "ring", "des") == pytest.approx(ring_gbps, rel=0.01)


def test_shared_capacities_follow_the_links_that_remain():
    import dataclasses

    from collsim.topology.faults import _keep_shared

    topo = box(gpus=4, switches=1)
    links = tuple(lk for lk in topo.links if "n0.gpu3" not in (lk.a, lk.b))
    kept = _keep_shared(dataclasses.replace(topo, links=links))
    assert [len(sh.directions) for sh in kept.shared] == [3, 3]
    alone = tuple(lk for lk in topo.links if lk.a == "n0.gpu0" or lk.b == "n0.gpu0")
    assert _keep_shared(dataclasses.replace(topo, links=alone)).shared[0].directions == (
        ("n0.gpu0", "n0.cpu0"),
    )
    assert _keep_shared(dataclasses.replace(topo, links=())).shared == ()


def test_sizing_keeps_gpus_per_switch_and_a_switch_on_one_socket():
    """--gpus-per-node keeps at most the template's GPUs per switch (ceil), and a switch's GPUs
    hang off that switch's socket (rtx3090: 8 GPUs, 4 switches, 2 sockets)."""

    def groups(gpus):
        topo = load_topology("rtx3090-8gpu-pcie", gpus_per_node=gpus)
        return [sh.directions for sh in topo.shared if "to host" in sh.name]

    assert groups(2) == [(("n0.gpu0", "n0.cpu0"), ("n0.gpu1", "n0.cpu0"))]
    five = groups(5)  # 3 switches: 2 + 2 + 1 GPUs
    assert [len(d) for d in five] == [2, 2]
    assert [len(d) for d in groups(9)] == [2, 2, 2, 2]  # 5 switches, the last holds one
    for dirs in groups(6):
        assert len({cpu for _, cpu in dirs}) == 1  # never across sockets
    assert Network(load_topology("rtx3090-8gpu-pcie", gpus_per_node=2)).gpu_route(0, 1).devices == (
        "n0.gpu0",
        "n0.cpu0",
        "n0.gpu1",
    )


def test_a_gpu_alone_below_a_slower_uplink_still_crosses_it():
    doc = yaml.safe_load((CATALOG_DIR / "rtx2080ti-2gpu-nop2p.yaml").read_text())
    doc["node"]["intra"]["pcie_switches"] = 2
    doc["node"]["intra"]["link"]["bandwidth"] = "31.5GB/s"
    doc["node"]["pcie"] = {"kind": "pcie", "bandwidth": "15.75GB/s", "latency": "0.5us"}
    topo = topology_from_dict(doc)
    assert [len(sh.directions) for sh in topo.shared] == [1, 1, 1, 1]
    for engine in ("analytic", "des"):
        assert busbw_gbps(topo, "broadcast", "chain", engine) == pytest.approx(15.75, rel=0.01)


def test_bisection_counts_a_shared_uplink():
    assert describe(box())["bisection_bandwidth_gbps"] == pytest.approx(15.75)
    # GPUs 0, 1 below one switch, 2, 3 below the other: one uplink each way is the cut
    assert describe(box(gpus=4, switches=2))["bisection_bandwidth_gbps"] == pytest.approx(15.75)
    assert describe(box(gpus=4, switches=4))["bisection_bandwidth_gbps"] == pytest.approx(31.5)


def test_explicit_shared_names_and_devices_are_checked():
    doc = yaml.safe_load(to_explicit_yaml(box()))
    twice = yaml.safe_load(to_explicit_yaml(box()))
    twice["shared"][1]["name"] = twice["shared"][0]["name"]
    with pytest.raises(TopologyError, match=r"shared\.1\.name.*second shared capacity"):
        topology_from_dict(twice)
    doc["shared"][0]["directions"][0] = ["n0.gpu9", "n0.cpu0"]
    with pytest.raises(TopologyError, match=r"not a listed device; did you mean 'n0\.gpu"):
        topology_from_dict(doc)
    again = yaml.safe_load(to_explicit_yaml(box()))
    again["shared"][0]["directions"].append(["n0.gpu0", "n0.cpu0"])
    with pytest.raises(TopologyError, match=r"shared\.0\.directions\.2.*once"):
        topology_from_dict(again)


def test_a_route_crossing_two_members_loads_the_capacity_twice():
    """Explicit: one capacity over both directions of GPU 0's cable (its uplink, both ways)."""
    doc = yaml.safe_load(to_explicit_yaml(box()))
    doc["shared"] = [
        {"name": "both", "kind": "pcie", "bandwidth": "15.75GB/s",
         "directions": [["n0.gpu0", "n0.cpu0"], ["n0.cpu0", "n0.gpu1"]]}
    ]  # fmt: skip
    topo = topology_from_dict(doc)
    net = Network(topo)
    assert net.gpu_route(0, 1).links[-2:] == (net.n_directed_links,) * 2
    for engine in ("analytic", "des"):
        assert busbw_gbps(topo, "broadcast", "chain", engine) == pytest.approx(7.875, rel=0.01)
