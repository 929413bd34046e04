"""GPUDirect RDMA through the CPU: a GPU and a NIC on different root ports of one CPU (NCCL's
PATH_PHB, ``node.nics.gpu_path: phb``) reach each other through its root complex, which forwards
both directions through one capacity (``node.intra.host_p2p_bandwidth``). Routing, the
discrete-event engine and the analytic model see it alike: one way keeps the link's rate, both
ways at once share the capacity."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from collsim.calibration.predict import Predictor, uncalibrated_params
from collsim.cli import cli
from collsim.collectives.registry import build_schedule
from collsim.engine import simulate
from collsim.model.analytic import AnalyticModel
from collsim.topology.describe import to_explicit_yaml
from collsim.topology.graph import Network
from collsim.topology.loader import CATALOG_DIR, load_topology, topology_from_dict
from collsim.whatif import WhatIf

GIB = 2**30
CHANNELS = 2
"""NCCL's two channels on the GDR pair (``2 coll channels`` in its logs): 2 x 24 GB/s, above the
HDR HCA's 25 GB/s, so the channels do not bind."""


def pair(host_p2p: str | None = "30GB/s", gpu_path: str | None = "phb"):
    """The catalog's two A100 PCIe hosts with one HDR HCA each (25 GB/s a direction on the wire,
    31.5 GB/s PCIe Gen4 root ports), the CPU forwarding ``host_p2p`` both ways together."""
    doc = yaml.safe_load((CATALOG_DIR / "a100-pcie-ib-2node.yaml").read_text())
    doc["node"]["intra"].pop("host_p2p_bandwidth")
    doc["node"]["nics"].pop("gpu_path")
    if host_p2p:
        doc["node"]["intra"]["host_p2p_bandwidth"] = host_p2p
    if gpu_path:
        doc["node"]["nics"]["gpu_path"] = gpu_path
    return topology_from_dict(doc)


def busbw_gbps(topo, collective, algorithm, engine):
    if engine == "analytic":
        t = AnalyticModel(topo).predict(collective, algorithm, np.array([GIB]), channels=CHANNELS)
        return GIB / float(t[0]) / 1e9  # two ranks: busbw = algbw for all of these
    w = WhatIf(topo)
    sched = build_schedule(collective, algorithm, nranks=2, count=GIB // 4, layout=w.layout,
                           channels=CHANNELS)  # fmt: skip
    return simulate(sched, w.fabric).busbw_gbps


def test_phb_puts_the_cpu_between_gpu_and_nic_and_shares_what_enters_it():
    topo = pair()
    assert [(sh.name, sh.bandwidth_bytes_per_s, sh.directions) for sh in topo.shared] == [
        ("n0.cpu0 peer-to-peer forwarding", 30e9, (("n0.gpu0", "n0.cpu0"), ("n0.nic0", "n0.cpu0"))),
        ("n1.cpu0 peer-to-peer forwarding", 30e9, (("n1.gpu0", "n1.cpu0"), ("n1.nic0", "n1.cpu0"))),
    ]
    net = Network(topo)
    cables = net.n_directed_links
    there, back = net.gpu_route(0, 1), net.gpu_route(1, 0)
    hosts = ("n0.gpu0", "n0.cpu0", "n0.nic0", "sw0", "n1.nic0", "n1.cpu0", "n1.gpu0")
    assert there.devices == hosts
    # Each way enters one CPU from its GPU and the other from its NIC: both CPUs' capacities,
    # once each, and the same two for the way back.
    assert sorted(set(there.links) - set(range(cables))) == [cables, cables + 1]
    assert sorted(set(back.links) - set(range(cables))) == [cables, cables + 1]
    assert there.hops == back.hops == 6


def test_pix_and_no_capacity_leave_the_direct_path():
    direct = pair(host_p2p=None, gpu_path=None)
    assert direct.shared == () and not any(d.kind == "cpu" for d in direct.devices)
    assert Network(direct).gpu_route(0, 1).devices[:2] == ("n0.gpu0", "n0.nic0")
    # phb without a forwarding limit: NCCL's path class (no LL128 across nodes), but the NIC
    # stays beside its GPU, keeping the nearest-NIC affinity; the CPU hop would change nothing
    unlimited = pair(host_p2p=None)
    assert unlimited.nic_gpu_path == "phb" and unlimited.shared == ()
    assert Network(unlimited).gpu_route(0, 1).devices[:2] == ("n0.gpu0", "n0.nic0")


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_both_ways_share_the_forwarding_and_one_way_keeps_the_wire(engine):
    """By hand: one way (broadcast, reduce) the HCA's 25 GB/s binds (PCIe 31.5, forwarding 30);
    both ways at once (ring all_reduce, sendrecv, all_gather) the 30 GB/s the CPU forwards
    splits 15 + 15. At 60 GB/s the forwarding binds nothing: 25 both ways."""
    topo = pair()
    assert busbw_gbps(topo, "broadcast", "chain", engine) == pytest.approx(25.0, rel=0.01)
    assert busbw_gbps(topo, "all_reduce", "ring", engine) == pytest.approx(15.0, rel=0.01)
    assert busbw_gbps(topo, "sendrecv", "p2p", engine) == pytest.approx(15.0, rel=0.01)
    roomy = pair("60GB/s")
    assert busbw_gbps(roomy, "all_reduce", "ring", engine) == pytest.approx(25.0, rel=0.01)


def test_engine_and_model_agree_at_every_size():
    w = WhatIf(pair())
    for collective, algorithm in [("all_reduce", "ring"), ("all_gather", "ring"),
                                  ("sendrecv", "p2p"), ("broadcast", "chain")]:  # fmt: skip
        for size in (1 << 20, 64 << 20):
            sched = build_schedule(collective, algorithm, nranks=2, count=size // 4,
                                   layout=w.layout)  # fmt: skip
            des = simulate(sched, w.fabric).time_s
            ana = float(AnalyticModel(w).predict(collective, algorithm, np.array([size]))[0])
            assert ana == pytest.approx(des, rel=0.01), (collective, size)


def test_the_catalog_pair_predicts_its_logs_uncalibrated():
    """The catalog's 37 GB/s is PCIe wire rate: at NCCL's PCIe payload fraction (12/15.75) the
    CPU forwards 28.2 GB/s, 14.1 GB/s each way when both are busy, where the six two-way logs
    measured 13.5-14.7; one way the 24 GB/s of a Gen4 root port at that fraction binds, as the
    broadcast log's 24.06 GB/s does."""
    predictor = Predictor(WhatIf(load_topology("a100-pcie-ib-2node")), uncalibrated_params())
    rate = {}
    for collective in ("broadcast", "all_reduce", "sendrecv"):
        t, _ = predictor.predict(collective, np.array([GIB]))
        rate[collective] = GIB / float(np.asarray(t)[0]) / 1e9
    assert rate["broadcast"] == pytest.approx(31.5 * 12 / 15.75, rel=0.01)
    assert rate["all_reduce"] == pytest.approx(37 * 12 / 15.75 / 2, rel=0.01)
    assert rate["sendrecv"] == pytest.approx(37 * 12 / 15.75 / 2, rel=0.01)


def test_export_keeps_the_path_and_the_capacity():
    topo = pair()
    again = topology_from_dict(yaml.safe_load(to_explicit_yaml(topo)))
    assert again.shared == topo.shared
    assert busbw_gbps(again, "all_reduce", "ring", "analytic") == pytest.approx(15.0, rel=0.01)


def test_phb_in_other_node_shapes():
    """A PCIe node with P2P hangs its NIC on the switch's CPU instead of the switch; an NVLink
    node with two GPUs per NIC keeps their PCIe switch and puts the NIC on the CPU above it."""
    doc = yaml.safe_load((CATALOG_DIR / "a100-pcie-2gpu.yaml").read_text())
    doc["node"]["nics"] = {"count": 2, "gpu_path": "phb",
                           "link": {"kind": "infiniband", "bandwidth": "200Gbps"}}  # fmt: skip
    doc["node"]["intra"]["host_p2p_bandwidth"] = "37GB/s"
    topo = topology_from_dict(doc)
    nic_links = {(lk.a, lk.b) for lk in topo.links if "nic" in lk.b}
    assert nic_links == {("n0.cpu0", "n0.nic0"), ("n0.cpu1", "n0.nic1")}
    into = {sh.name: {a for a, _ in sh.directions} for sh in topo.shared}
    assert into == {
        "n0.cpu0 peer-to-peer forwarding": {"n0.pcie0", "n0.nic0"},
        "n0.cpu1 peer-to-peer forwarding": {"n0.pcie1", "n0.nic1"},
    }
    nvl = yaml.safe_load((CATALOG_DIR / "dgx1-v100.yaml").read_text())
    nvl["node"]["nics"]["gpu_path"] = "phb"
    beside = {(lk.a, lk.b) for lk in topology_from_dict(nvl).links}  # no limit: NICs stay
    assert ("n0.pcie0", "n0.nic0") in beside
    nvl["node"]["intra"]["host_p2p_bandwidth"] = "37GB/s"
    links = {(lk.a, lk.b) for lk in topology_from_dict(nvl).links}
    assert ("n0.gpu0", "n0.pcie0") in links and ("n0.pcie0", "n0.nic0") not in links
    assert any(b == "n0.nic0" and a.startswith("n0.cpu") for a, b in links)


def test_topo_show_names_the_forwarding_capacity():
    out = CliRunner().invoke(cli, ["topo", "show", "a100-pcie-ib-2node"])
    assert out.exit_code == 0, out.output
    assert "n0.cpu0 peer-to-peer forwarding: 37 GB/s" in out.output
