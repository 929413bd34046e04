"""The network proxy's message rate for point to point (``collsim/transports.py``, "The proxy's
message rate"): one proxy thread per GPU moves NCCL's 128 KiB point-to-point chunks, its sends
and receives together, at ``proxy_message_us`` each (Slingshot's CXI with software receive
matching, ALCF Polaris: 13.7 us). Both engines
put every network point-to-point flow through its sender's and its receiver's proxy link and add
one message's proxy time to its step latency; collectives and verbs transports are untouched."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.cli import cli
from collsim.topology.loader import load_topology
from collsim.transports import P2P_NET_CHUNK_BYTES, TRANSPORTS, append_links
from collsim.whatif import WhatIf

GIB = 2**30
CXI_PROXY_BYTES_PER_S = 131072 / 13.7e-6
"""9.57 GB/s: one Polaris GPU's proxy, sends and receives together."""


def test_append_links_adds_each_rows_extra_after_its_own() -> None:
    ptr, links = append_links(
        np.array([0, 2, 2, 3]), np.array([5, 6, 7]), np.array([[10, 11], [-1, -1], [-1, 12]])
    )
    assert ptr.tolist() == [0, 4, 4, 6]
    assert links.tolist() == [5, 6, 10, 11, 7, 12]
    _, share = append_links(
        np.array([0, 1, 2]), np.array([0.5, 0.25]), np.array([[3], [-1]]), np.ones((2, 1))
    )
    assert share.tolist() == [0.5, 1.0, 0.25]


def test_only_cxi_with_software_matching_has_a_proxy_rate() -> None:
    """Polaris' runs (FI_CXI_RX_MATCH_MODE=software) have the figure; plain CXI does not (GH200
    Slingshot nodes reach 24 GB/s point to point, NVIDIA/nccl#1272), nor verbs, EFA, sockets.
    cxi_swmatch is cxi in every other figure."""
    sw, cxi = TRANSPORTS["cxi_swmatch"], TRANSPORTS["cxi"]
    assert sw.proxy_bytes_per_s == pytest.approx(CXI_PROXY_BYTES_PER_S)
    assert (sw.step_overhead_s, sw.bandwidth_fraction) == (cxi.step_overhead_s, 0.73)
    assert P2P_NET_CHUNK_BYTES == 1 << 17  # NCCL_P2P_NET_CHUNKSIZE, src/init.cc
    for name in ("cxi", "ib_verbs", "efa", "efa_host", "socket", "tcpx", "tcpxo"):
        assert TRANSPORTS[name].proxy_bytes_per_s == float("inf")
    assert load_topology("polaris").transport == "cxi_swmatch"
    assert load_topology("gh200-slingshot").transport == ""  # the slingshot default: cxi
    assert WhatIf(load_topology("gh200-slingshot", nodes=2)).fabric.proxy_first is None


def test_polaris_gpus_get_one_proxy_link_each_on_network_pairs_only() -> None:
    w = WhatIf(load_topology("polaris", nodes=2))
    fabric = w.fabric
    first = fabric.proxy_first
    assert first == len(fabric.network.link_names)
    assert fabric.link_names[first] == f"{fabric.gpus[0]}.proxy"
    assert fabric.capacity_bytes_per_s[first:].tolist() == pytest.approx(
        [CXI_PROXY_BYTES_PER_S] * 8
    )
    src, dst = np.array([0, 3, 7]), np.array([1, 4, 0])  # same node; across; across
    ptr, links, _ = fabric.routes(src, dst)
    extra, message_s = fabric.proxy_links(src, dst, ptr, links)
    assert extra.tolist() == [[-1, -1], [first + 3, first + 4], [first + 7, first]]
    assert message_s.tolist() == pytest.approx([0.0, 13.7e-6, 13.7e-6])


def test_infiniband_has_no_proxy_links() -> None:
    fabric = WhatIf(load_topology("dgx-h100", nodes=2)).fabric
    assert fabric.proxy_first is None
    assert len(fabric.link_names) == len(fabric.capacity_bytes_per_s)


def test_sendrecv_across_slingshot_runs_at_the_proxy_rate_in_both_engines() -> None:
    """One GPU per Polaris node: the send leaves through GPU 0's proxy and lands through GPU 1's,
    each carrying it (and the other direction's flow): 2 flows per proxy, 9.57 / 2 GB/s each --
    below the NIC (0.73 x 25 GB/s) and two channels' 2 x 14 GB/s. Engine and model agree."""
    w = WhatIf(load_topology("polaris", nodes=2, gpus_per_node=1))
    sim, _ = w.run("sendrecv", "p2p", GIB, channels=2)
    rate = GIB / sim.time_s
    assert rate == pytest.approx(CXI_PROXY_BYTES_PER_S / 2, rel=0.01)
    pred = float(w.cost_model("collsim").predict("sendrecv", "p2p", [GIB], channels=2)[0])
    assert pred == pytest.approx(sim.time_s, rel=0.01)
    # a collective over the same NICs is not a proxy's message stream: the ring runs at the NIC
    ring, _ = w.run("all_gather", "ring", GIB, channels=2)
    assert GIB / 2 / ring.time_s > 2 * CXI_PROXY_BYTES_PER_S / 2


def test_alltoall_on_polaris_is_proxy_bound_and_the_engines_agree() -> None:
    """Two Polaris nodes, NCCL's 4 channels: each GPU's proxy carries its 4 remote sends and 4
    remote receives (half the buffer each way), so 1 GiB takes about 2 x 0.5 GiB / 9.57 GB/s
    (measured 110.9 ms, a100-polaris-slingshot-2n-alltoall-1); the small size pays one
    message's proxy time per round in each engine alike."""
    w = WhatIf(load_topology("polaris", nodes=2))
    model = w.cost_model("collsim")
    for size in (GIB, 64 * 1024):
        sim, _ = w.run("alltoall", "direct", size, channels=4)
        pred = float(model.predict("alltoall", "direct", [size], channels=4)[0])
        assert pred == pytest.approx(sim.time_s, rel=0.01)
        if size == GIB:
            assert sim.time_s == pytest.approx(GIB / CXI_PROXY_BYTES_PER_S, rel=0.03)


def test_simulate_names_the_proxy_as_the_alltoall_bottleneck() -> None:
    args = "simulate alltoall -t polaris --nodes 2 -a direct -b 1G -e 1G --channels 4"
    out = CliRunner().invoke(cli, args.split())
    assert out.exit_code == 0, out.output
    assert ".proxy" in out.output


def test_topo_show_prints_the_proxy_cost_where_the_transport_has_one() -> None:
    out = CliRunner().invoke(cli, ["topo", "show", "polaris", "--nodes", "2"])
    assert out.exit_code == 0, out.output
    assert "via cxi_swmatch" in out.output
    assert "point to point 13.7 us per 128 KiB message on each GPU's proxy" in out.output
    out = CliRunner().invoke(cli, ["topo", "show", "dgx-h100", "--nodes", "2"])
    assert out.exit_code == 0, out.output
    assert "per 128 KiB message" not in out.output
