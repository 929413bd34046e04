"""Multi-node NVLink domains (GB200/GB300 NVL72): trays joined through NVLink switches, racks filled
in order, routes inside a domain never on a NIC, NICs that follow the GPUs, one-line errors."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.cli import cli
from collsim.errors import TopologyError
from collsim.model.mapping import intra_inter_bandwidth
from collsim.model.nccl import inputs_from_topology
from collsim.model.system import layout_for
from collsim.topology.graph import Network, count_by_kind
from collsim.topology.loader import load_topology, topology_from_dict

from .conftest import template


def _nvlink_links(topo):
    return [lk for lk in topo.links if lk.kind == "nvlink"]


@pytest.mark.parametrize(
    ("trays", "domains", "fill"), [(1, 1, [1]), (18, 1, [18]), (32, 2, [18, 14])]
)
def test_trays_fill_racks_in_order(trays, domains, fill):
    topo = load_topology("gb200-nvl72", nodes=trays)
    kinds = count_by_kind(topo.devices)
    assert (kinds["gpu"], kinds["nic"], kinds["nvswitch"]) == (4 * trays, 4 * trays, domains)
    links = _nvlink_links(topo)
    assert len(links) == 4 * trays  # one link per GPU, to its domain's switch chips
    assert {lk.bandwidth_bytes_per_s for lk in links} == {900e9}  # 18 x 50 GB/s
    assert (topo.nvlink_domain_nodes, topo.nvlink_domains) == (18, domains)
    assert topo.nvlink_domain_gpus == min(72, 4 * trays)
    switch_of = {lk.a: lk.b for lk in links}
    per_domain = [sum(1 for s in switch_of.values() if s == f"nvl{d}.nvswitch") // 4
                  for d in range(domains)]  # fmt: skip
    assert per_domain == fill
    if trays == 32:  # tray 17 closes rack 0, tray 18 opens rack 1
        assert switch_of["n17.gpu3"] == "nvl0.nvswitch"
        assert switch_of["n18.gpu0"] == "nvl1.nvswitch"


def test_routes_inside_a_domain_never_touch_a_nic_and_between_domains_do():
    net = Network(load_topology("gb200-nvl72", nodes=32))  # InfiniBand, D-mod-k routing
    for src in ("n0.gpu0", "n5.gpu2", "n17.gpu3"):
        for dst in ("n0.gpu1", "n1.gpu0", "n9.gpu3", "n17.gpu0"):
            if src == dst:
                continue
            route = net.route(src, dst)
            assert route.devices == (src, "nvl0.nvswitch", dst)
    for src, dst in (("n18.gpu0", "n31.gpu3"), ("n31.gpu1", "n20.gpu1")):
        assert net.route(src, dst).devices == (src, "nvl1.nvswitch", dst)
    across = net.route("n3.gpu1", "n21.gpu1")
    kinds = [net.topology.device(d).kind for d in across.devices]
    assert "nic" in kinds and "nvswitch" not in kinds


def test_gpu_nic_affinity_follows_each_tray():
    gb200 = Network(load_topology("gb200-nvl72", nodes=18))
    assert gb200.nics_of("n5.gpu2") == ["n5.nic2"]
    gb300 = Network(load_topology("gb300-nvl72", nodes=18))
    assert gb300.nics_of("n5.gpu2") == ["n5.nic4", "n5.nic5"]


def test_nics_per_gpu_follow_gpus_per_node_and_a_count_stays():
    gb300 = load_topology("gb300-nvl72", nodes=2, gpus_per_node=2)
    assert count_by_kind(gb300.devices)["nic"] == 2 * 2 * 2  # 2 per GPU, 2 GPUs, 2 trays
    hgx = load_topology("hgx-b200", nodes=1, gpus_per_node=4)
    assert count_by_kind(hgx.devices)["nic"] == 8  # `count: 8` stays


def test_nvls_reaches_one_domain_not_two():
    one = load_topology("gb300-nvl72", nodes=16)
    assert one.reduces_for_all_gpus
    two = load_topology("gb300-nvl72", nodes=32)
    assert not two.reduces_for_all_gpus
    assert two.reduces_for([g.name for g in two.gpus[:72]])
    assert not two.reduces_for([g.name for g in two.gpus[70:74]])


def test_the_cost_models_take_a_domain_as_their_node():
    topo = load_topology("gb200-nvl72", nodes=32)
    layout = layout_for(topo)
    assert (layout.ranks_per_node, layout.nnodes, layout.last_node_size) == (72, 2, 56)
    assert layout.grid is None  # 72 + 56 is no grid
    assert layout_for(load_topology("gb200-nvl72", nodes=36)).grid == (2, 72)
    intra, inter, nvlink = intra_inter_bandwidth(topo)
    assert nvlink and intra == pytest.approx(900e9) and inter == pytest.approx(50e9)
    inputs = inputs_from_topology(topo, 8)
    assert (inputs.n_nodes, inputs.n_ranks) == (2, 128)  # NCCL's node: the NVLink clique


def test_topo_show_reports_the_domain():
    result = CliRunner().invoke(cli, ["topo", "show", "gb200-nvl72", "--nodes", "32"])
    assert result.exit_code == 0, result.output
    assert "NVLink domain: 18 nodes x 4 = 72 GPUs; this system fills 2 (18 + 14 nodes); " \
           "900 GB/s NVLink per GPU" in result.output  # fmt: skip
    assert "gpu0->nic0; gpu1->nic1" in result.output
    result = CliRunner().invoke(cli, ["topo", "show", "gb300-nvl72", "--nodes", "20", "--json"])
    domain = json.loads(result.output)["nvlink_domain"]
    assert domain["nodes_per_domain"] == [18, 2]
    assert domain["switches"] == ["nvl0.nvswitch", "nvl1.nvswitch"]
    assert domain["nvlink_bandwidth_gbps_per_gpu"] == pytest.approx(900)


def _domain_doc(nodes=4, per_domain=2, gpus=4, nics=None):
    doc = template(nodes=nodes, gpus=gpus, intra={"kind": "none"},
                   nics=nics or {"per_gpu": 1, "link": {"kind": "infiniband",
                                                        "bandwidth": "400Gbps"}})  # fmt: skip
    doc["nvlink_domain"] = {"nodes": per_domain, "switch_trays": 9,
                            "link": {"kind": "nvlink", "bandwidth": "50GB/s"}}  # fmt: skip
    return doc


def test_one_domain_needs_no_fabric_and_several_do():
    doc = _domain_doc(nodes=2, per_domain=2)
    doc["fabric"] = {"kind": "none"}
    assert topology_from_dict(doc).n_gpus == 8
    with pytest.raises(TopologyError) as err:
        topology_from_dict(doc, nodes=3)
    assert err.value.field == "fabric.kind"


@pytest.mark.parametrize(
    ("change", "flags", "field", "value"),
    [
        ({"nodes": 145}, {}, "nvlink_domain.nodes", 145),  # 580 GPUs > 576
        ({}, {"gpus_per_node": 40}, "--gpus-per-node", 40),  # 2 x 40 x 18 links on 18 chips
        ({"switch_trays": 4}, {}, "nvlink_domain.links_per_gpu", 18),  # 8 chips
        ({"nodes": 72, "switch_trays": 9}, {"gpus_per_node": 8}, "--gpus-per-node", 8),
    ],
)
def test_impossible_domains_are_one_line(change, flags, field, value):
    doc = _domain_doc()
    doc["nvlink_domain"].update(change)
    with pytest.raises(TopologyError) as err:
        topology_from_dict(doc, **flags)
    assert (err.value.field, err.value.value) == (field, value)


def test_ports_short_of_the_gpus_links_name_the_switch_trays():
    doc = _domain_doc(per_domain=18, gpus=8)  # 144 GPUs x 18 links: 144 ports per chip
    with pytest.raises(TopologyError) as err:
        topology_from_dict(doc)
    assert (err.value.field, err.value.value) == ("nvlink_domain.switch_trays", 9)
    assert "144 ports" in err.value.message


def test_nics_per_gpu_that_gpus_per_node_makes_fractional_name_the_flag():
    doc = _domain_doc(nics={"per_gpu": 0.5, "link": {"kind": "infiniband",
                                                     "bandwidth": "400Gbps"}})  # fmt: skip
    assert count_by_kind(topology_from_dict(doc).devices)["nic"] == 2 * 4
    with pytest.raises(TopologyError) as err:
        topology_from_dict(doc, gpus_per_node=3)
    assert (err.value.field, err.value.value) == ("--gpus-per-node", 3)


def test_intra_domain_pairs_never_use_a_nic_on_any_route():
    net = Network(load_topology("gb300-nvl72", nodes=18))
    fabric_kinds = np.array([lk.kind for lk in net.topology.links])
    gpus = [g.name for g in net.topology.gpus]
    for src in gpus[::7]:
        for dst in gpus[1::5]:
            if src != dst:
                hops = net.route(src, dst).devices
                assert len(hops) == 3 and hops[1] == "nvl0.nvswitch", (src, dst, hops)
    assert "roce" in set(fabric_kinds)  # the trays' NICs are there, on the fabric
