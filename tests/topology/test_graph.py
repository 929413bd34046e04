"""Graph and routing: directed links, deterministic ECMP, GPUs that never relay, derived figures."""

import itertools

import networkx as nx
import pytest

from collsim.topology.graph import Network, link_cost, to_networkx
from collsim.topology.loader import load_topology, topology_from_dict

from .conftest import template


@pytest.fixture(scope="module")
def net():
    return Network(topology_from_dict(template(nodes=4, gpus=4)))


def test_two_directed_edges_per_link():
    topo = topology_from_dict(template())
    graph = to_networkx(topo)
    assert isinstance(graph, nx.DiGraph)
    assert graph.number_of_edges() == 2 * len(topo.links)
    ids = sorted(data["id"] for _, _, data in graph.edges(data=True))
    assert ids == list(range(2 * len(topo.links)))


def test_routes_are_deterministic_and_valid(net):
    again = Network(net.topology)
    for src in range(16):
        for dst in range(16):
            r1, r2 = net.gpu_route(src, dst), again.gpu_route(src, dst)
            assert r1 == r2
            names = r1.devices
            assert names[0] == net.gpu_names[src] and names[-1] == net.gpu_names[dst]
            # consecutive links chain up, and no GPU relays
            for link, (u, v) in zip(r1.links, itertools.pairwise(names), strict=True):
                assert net.link_names[link] == f"{u}->{v}"
            assert not any(n.split(".")[-1].startswith("gpu") for n in names[1:-1])


def test_ecmp_spreads_flows_over_spines():
    net = Network(topology_from_dict(template(nodes=8, gpus=4)))  # radix 8: 4 down, 4 spines
    spines = {net.gpu_route(s, d).devices[3] for s in range(4) for d in range(16, 32)}
    assert len(spines) > 1
    assert all(name.startswith("spine") for name in spines)


def _rail_shift_load(kind: str) -> int:
    """Most flows on one fabric link when GPU i of every node sends to GPU i of the next node
    (a ring's node-to-node hops), on 8 nodes of 4 GPUs under radix-8 leaves (4 down, 4 spines)."""
    doc = template(
        nodes=8, gpus=4, nics={"count": 4, "link": {"kind": kind, "bandwidth": "200Gbps"}}
    )
    net = Network(topology_from_dict(doc))
    load: dict[str, int] = {}
    for node in range(8):
        for i in range(4):
            route = net.route(f"n{node}.gpu{i}", f"n{(node + 1) % 8}.gpu{i}")
            for k in route.links:
                name = net.link_names[k]
                if "spine" in name:
                    load[name] = load.get(name, 0) + 1
    return max(load.values())


def test_infiniband_routes_by_destination_without_collisions():
    """InfiniBand forwards by destination, its subnet manager spreading destinations over the
    up-links (D-mod-k): the shift a ring makes between nodes crosses the non-blocking fabric one
    flow per link. Ethernet hashes flows (ECMP), and some up-link carries two of them."""
    assert _rail_shift_load("infiniband") == 1
    assert _rail_shift_load("efa") == 1
    assert _rail_shift_load("roce") >= 2


@pytest.mark.parametrize(
    ("name", "gpus", "node_rate"),
    [("h100-4gpu-ib", 4, 100e9), ("p5", 8, 400e9), ("selene", 8, 200e9)],
)
def test_ring_keeps_the_nic_rate_across_the_fabric(name, gpus, node_rate):
    """A ring all-reduce's bus bandwidth is the node's NIC rate on 16 nodes, as on 2: snellius-
    like nodes (4 x 200G InfiniBand, 2-tier fat tree, 8 nodes a leaf) and p5 (32 x 100G EFA)
    route by destination; hashed routes had halved both (two flows on an up-link). Selene's
    rail-optimized leaves keep each rail's ring traffic on one leaf (a plain fat tree of 2.5
    servers a leaf had halved it at 8 and 48 nodes)."""
    from collsim.training.comm import make_timer

    for nodes in (2, 8, 16, 48) if name == "selene" else (2, 16):
        topo = load_topology(name, nodes=nodes)
        size, n = 8 * 2**30, gpus * nodes
        t = make_timer("analytic", topo).time_s("all_reduce", Network(topo).gpu_names, size, "ring")
        assert size / t * 2 * (n - 1) / n == pytest.approx(node_rate, rel=0.02)


def test_latency_sums_links_and_switches(net):
    route = net.route("n0.gpu0", "n3.gpu0")
    # gpu -pcie(0.5us)- nic -ib- leaf(0.1us) -ib- spine(0.1us) -ib- leaf(0.1us) -ib- nic -pcie- gpu
    assert route.latency_s == pytest.approx(2 * 0.5e-6 + 3 * 0.1e-6)


def test_nvlink_preferred_over_pcie_inside_a_node(net):
    assert net.route("n0.gpu0", "n0.gpu1").devices == ("n0.gpu0", "n0.nvswitch", "n0.gpu1")


def test_link_cost_prefers_bandwidth():
    assert link_cost(450e9) < link_cost(64e9) < link_cost(12.5e9)


def test_derived_figures_of_dgx_h100():
    net = Network(load_topology("dgx-h100", nodes=4))
    assert net.injection_bandwidth_bytes_per_s() == pytest.approx(50e9)
    assert net.intra_bandwidth_bytes_per_s() == pytest.approx(450e9)
    assert net.bisection_bandwidth_bytes_per_s() == pytest.approx(16 * 50e9, rel=1e-6)
    assert net.diameter_hops() == 6
    assert net.nic_affinity()["n1.gpu5"] == ["n1.nic5"]


def test_single_node_bisection_splits_the_node():
    net = Network(topology_from_dict(template(nodes=1, gpus=4, fabric={"kind": "none"})))
    # two GPUs on each side, each with 100 GB/s NVLink into the NVSwitch
    assert net.bisection_bandwidth_bytes_per_s() == pytest.approx(200e9, rel=1e-6)


@pytest.mark.parametrize("fabric", ["fat_tree", "rail_optimized"])
def test_fast_server_fabric_router_matches_global_shortest_paths(fabric):
    import numpy as np

    doc = template(nodes=12, gpus=4, fabric={"kind": fabric, "radix": 8, "tiers": 3})
    net = Network(topology_from_dict(doc))
    assert net._fast is not None
    rng = np.random.default_rng(1)
    for s, d in rng.integers(0, 48, size=(200, 2)):
        src, dst = net.index[net.gpu_names[s]], net.index[net.gpu_names[d]]
        if src == dst:
            continue
        fast, generic = net._fast.links(src, dst), net._generic.links(src, dst)
        assert net.graph.cost[fast].sum() == net.graph.cost[generic].sum()


def test_tori_use_the_generic_router():
    nics = {"count": 1, "link": {"kind": "roce", "bandwidth": "100Gbps"}}
    doc = template(nodes=4, gpus=2, fabric={"kind": "ring"}, nics=nics)
    net = Network(topology_from_dict(doc))
    assert net._fast is None
    assert len(net.route("n0.gpu0", "n2.gpu0").links) >= 4


def test_injection_is_capped_by_the_gpus_own_path_to_its_nics():
    """One GPU left in a DGX H100 node reaches its 8 NICs through its own PCIe link: it can send
    63 GB/s off-node, not the 400 GB/s the NICs could take."""
    net = Network(load_topology("dgx-h100", nodes=2, gpus_per_node=1))
    assert net.injection_bandwidth_bytes_per_s() == pytest.approx(63e9)
