"""Per-transport costs (collsim/transports.py): the table, how topologies pick a transport, and
that the engine and the analytic model both charge a transport's per-step overhead and attainable
bandwidth, with hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.cli import cli
from collsim.topology.fabric import TopologyFabric
from collsim.topology.graph import Network
from collsim.topology.loader import load_topology
from collsim.transports import (
    DEFAULT_TRANSPORT,
    PROTOCOL_INDEX,
    TRANSPORTS,
    route_overhead_s,
    transport_for,
)
from collsim.whatif import WhatIf


def _fabric(name: str, **kw: object) -> TopologyFabric:
    return TopologyFabric(Network(load_topology(name, **kw)))


def test_simple_pays_the_overhead_twice_as_nccl_adds_the_plugin_latency():
    # tuning.cc: interLat += latencyInter; Simple adds it again (the flush)
    socket = TRANSPORTS["socket"]
    assert socket.step_overhead_s == pytest.approx((35e-6, 35e-6, 70e-6))
    assert TRANSPORTS["ib_verbs"].step_overhead_s == (0.0, 0.0, 0.0)
    assert PROTOCOL_INDEX == {"ll": 0, "ll128": 1, "simple": 2}


def test_default_transport_per_link_kind_and_the_override():
    assert transport_for("infiniband").name == "ib_verbs"
    assert transport_for("roce").name == "ib_verbs"
    assert transport_for("efa").name == "efa"
    assert transport_for("slingshot").name == "cxi"
    assert transport_for("ethernet").name == "socket"
    assert transport_for("ethernet", "tcpxo").name == "tcpxo"
    assert transport_for("nvlink") is None and transport_for("pcie", "socket") is None
    assert set(DEFAULT_TRANSPORT.values()) <= set(TRANSPORTS)


def test_route_overhead_is_the_largest_link_overhead_per_route():
    per_link = np.array([0.0, 5.0, 20.0, 0.0])
    # routes: [0, 1] -> 5; [] -> 0; [3, 2, 0] -> 20
    ptr = np.array([0, 2, 2, 5])
    links = np.array([0, 1, 3, 2, 0])
    assert route_overhead_s(per_link, ptr, links).tolist() == [5.0, 0.0, 20.0]


def test_catalog_transports_from_the_topology_files():
    assert load_topology("a3-mega").transport == "tcpxo"
    assert load_topology("a3-high").transport == "tcpx"
    assert load_topology("g4dn-socket").transport == "socket"
    assert load_topology("g4dn-efa").transport == "efa_host"
    assert load_topology("p3dn").transport == "efa_host"
    assert load_topology("p4d").transport == ""  # GPUDirect EFA: the efa default


def test_efa_splits_by_datapath():
    # GPUDirect EFA (p4d/p4de): the NIC moves GPU memory, the proxy posts and polls (60 us per
    # step, line rate: the three GPUDirect EFA logs); host-staged EFA (p3dn, g4dn: no RDMA, no
    # GPUDirect): 15 us, and every chunk staged in host memory and reassembled from ~8 KiB SRD
    # packets (0.5 of line rate)
    gdr, host = TRANSPORTS["efa"], TRANSPORTS["efa_host"]
    assert gdr.step_overhead_s == pytest.approx((60e-6, 60e-6, 120e-6))
    assert gdr.bandwidth_fraction == 1.0
    assert host.step_overhead_s == pytest.approx((15e-6, 15e-6, 30e-6))
    assert host.bandwidth_fraction == 0.5


def test_nic_cables_run_at_the_transport_fraction_and_carry_its_overhead():
    sock = _fabric("g4dn-socket")
    net = sock.network
    nic = [
        k
        for k in range(net.n_directed_links)
        if "nic" in (net.devices[net.link_src[k]].kind, net.devices[net.link_dst[k]].kind)
        and net.link_kind[k] == "efa"
    ]
    assert nic  # NIC -> switch and switch -> NIC, both nodes
    # 50 Gb/s = 6.25 GB/s per direction, x 0.32 for kernel sockets = 2.0 GB/s
    assert sock.capacity_bytes_per_s[nic] == pytest.approx(2.0e9)
    assert sock.transport_overhead_s[:, nic] == pytest.approx(
        np.array([[35e-6], [35e-6], [70e-6]]) * np.ones(len(nic))
    )
    # the same machines driven by aws-ofi-nccl, host-staged: half the line rate, 15 us
    efa = _fabric("g4dn-efa")
    assert efa.capacity_bytes_per_s[nic] == pytest.approx(3.125e9)
    assert efa.transport_overhead_s[2, nic] == pytest.approx(30e-6)
    # the PCIe link GPU -> NIC is no transport's
    others = np.setdiff1d(np.arange(net.n_directed_links), nic)
    assert not sock.transport_overhead_s[:, others].any()


def test_switch_to_switch_cables_keep_their_line_rate():
    # Polaris: Slingshot everywhere, but only NIC cables run at CXI's 0.73 (2 x 200 Gb/s NICs
    # top out at 36.5 GB/s busbw); router-to-router cables stay at 200 Gb/s = 25 GB/s
    fabric = _fabric("polaris", nodes=8)
    net = fabric.network
    kinds = [d.kind for d in net.devices]
    at_nic = [
        k
        for k in range(net.n_directed_links)
        if "nic" in (kinds[net.link_src[k]], kinds[net.link_dst[k]])
    ]
    between = [
        k
        for k in range(net.n_directed_links)
        if kinds[net.link_src[k]] == "switch" and kinds[net.link_dst[k]] == "switch"
    ]
    slingshot_at_nic = [k for k in at_nic if net.link_kind[k] == "slingshot"]
    assert slingshot_at_nic and between
    assert fabric.capacity_bytes_per_s[slingshot_at_nic] == pytest.approx(0.73 * 25e9)
    assert fabric.capacity_bytes_per_s[between] == pytest.approx(25e9)
    assert not fabric.transport_overhead_s[:, between].any()


def test_infiniband_is_unchanged():
    fabric = _fabric("dgx-h100", nodes=2)
    assert not fabric.transport_overhead_s.any()
    assert np.array_equal(fabric.capacity_bytes_per_s, fabric.network.capacity_bytes_per_s)


@pytest.mark.parametrize("protocol", ["LL", "Simple"])
def test_engine_and_model_charge_the_transport_overhead(protocol):
    # Two g4dn nodes, one T4 each: a ring all-reduce of 2 ranks is 2 network steps. Sockets and
    # host-staged aws-ofi-nccl differ only in the per-step overhead (35 vs 15 us, Simple twice)
    # at 8 bytes (the bandwidth term is nanoseconds): the socket run takes 2 x 20 us longer
    # (LL), 2 x 40 us (Simple), in the engine and in the analytic model alike.
    extra = {"LL": 20e-6, "Simple": 40e-6}[protocol]
    times = {}
    for name in ("g4dn-socket", "g4dn-efa"):
        whatif = WhatIf(load_topology(name))
        sim, _ = whatif.run("all_reduce", "ring", 8, protocol=protocol)
        model = whatif.cost_model("collsim")
        pred = float(model.predict("all_reduce", "ring", [8], protocol=protocol)[0])
        times[name] = (sim.time_s, pred)
    for engine_or_model in (0, 1):
        gap = times["g4dn-socket"][engine_or_model] - times["g4dn-efa"][engine_or_model]
        assert gap == pytest.approx(2 * extra, abs=0.05e-6)


def test_engine_and_model_see_the_transport_bandwidth():
    # 1 GiB ring all-reduce on 2 g4dn nodes over sockets: each rank sends S/2 twice over its
    # 2.0 GB/s socket (50 Gb/s x 0.32): about S / 2.0 GB/s = 537 ms in both engines
    whatif = WhatIf(load_topology("g4dn-socket"))
    size = 1 << 30
    sim, _ = whatif.run("all_reduce", "ring", size)
    pred = float(whatif.cost_model("collsim").predict("all_reduce", "ring", [size])[0])
    assert sim.time_s == pytest.approx(size / 2.0e9, rel=0.01)
    assert pred == pytest.approx(sim.time_s, rel=0.01)


def test_topo_show_prints_the_transport():
    runner = CliRunner()
    result = runner.invoke(cli, ["topo", "show", "g4dn-socket"])
    assert result.exit_code == 0, result.output
    assert (
        "transport:   efa NICs via socket: +35 us per network step (Simple +70 us), "
        "0.32 of line rate" in result.output
    )
    result = runner.invoke(cli, ["topo", "show", "dgx-h100"])
    assert "infiniband NICs via ib_verbs: +0 us per network step" in result.output


def test_one_efa_connection_attains_half_the_line_rate_and_topo_show_says_so():
    # one GPUDirect EFA connection: 0.5 of 100 Gb/s (fi_rdm_tagged_bw one endpoint pair 0.55;
    # p4d's NCCL 2.9 tree 0.47); every other transport's connection fills its NIC
    assert TRANSPORTS["efa"].connection_fraction == 0.5
    assert all(t.connection_fraction == 1.0 for n, t in TRANSPORTS.items() if n != "efa")
    result = CliRunner().invoke(cli, ["topo", "show", "p4d"])
    assert result.exit_code == 0, result.output
    assert "1 of line rate, one connection 0.5 of it" in result.output
    assert "one connection" not in CliRunner().invoke(cli, ["topo", "show", "dgx-h100"]).output


def test_topo_show_prints_the_gpu_to_nic_path_and_what_it_means_for_ll128():
    runner = CliRunner()
    result = runner.invoke(cli, ["topo", "show", "polaris"])
    assert result.exit_code == 0, result.output
    assert "0.73 of line rate; GPU to NIC PHB (no LL128 across nodes)" in result.output
    result = runner.invoke(cli, ["topo", "show", "dgx-h100"])
    assert "1 of line rate; GPU to NIC PIX\n" in result.output
