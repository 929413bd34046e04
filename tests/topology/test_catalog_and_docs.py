"""The catalog cites its figures, and every example in the format documentation loads."""

import re
from pathlib import Path

import pytest
import yaml

from collsim.topology.graph import Network
from collsim.topology.loader import CATALOG_DIR, catalog_names, load_topology, topology_from_dict

DOC = Path(__file__).resolve().parents[2] / "docs" / "topology-format.md"


@pytest.mark.parametrize("name", catalog_names())
def test_every_catalog_section_with_numbers_has_a_source(name):
    doc = yaml.safe_load((CATALOG_DIR / f"{name}.yaml").read_text())
    missing = []
    if not doc.get("source"):
        missing.append("(top level)")
    if not doc["gpu"].get("source"):
        missing.append("gpu")
    if "node" in doc:
        for key in ("intra", "nics", "pcie"):
            section = doc["node"].get(key)
            if section and not section.get("source"):
                missing.append(f"node.{key}")
        if doc.get("fabric", {}).get("kind", "none") != "none" and not doc["fabric"].get("source"):
            missing.append("fabric")
    else:
        missing += [f"links.{i}" for i, lk in enumerate(doc["links"]) if not lk.get("source")]
    assert not missing, f"{name}: no source: note in {missing}"


def _examples():
    return re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def test_the_format_doc_has_an_example_per_feature():
    text = "\n".join(_examples())
    for feature in ("nvswitch", "hybrid_cube_mesh", "mesh", "pcie", "p2p: false",
                    "integrated", "single_switch", "fat_tree", "oversubscription",
                    "rail_optimized", "dragonfly", "torus", "ring", "in_network_reduction",
                    "devices:"):  # fmt: skip
        assert feature in text, feature


@pytest.mark.parametrize("index", range(len(_examples())))
def test_every_format_doc_example_loads_and_routes(index):
    topo = topology_from_dict(yaml.safe_load(_examples()[index]), file=f"{DOC.name}#{index}")
    net = Network(topo)
    for dst in net.gpu_names[1:]:
        net.route(net.gpu_names[0], dst)


def test_doc_template_and_explicit_pair_are_the_same_system():
    loaded = {}
    for text in _examples():
        topo = topology_from_dict(yaml.safe_load(text))
        loaded[topo.name] = topo
    a, b = loaded["pair-template"], loaded["pair-explicit"]
    assert sorted(a.devices, key=str) == sorted(b.devices, key=str)
    assert sorted(a.links, key=str) == sorted(b.links, key=str)


def test_the_catalog_table_lists_every_system():
    from pathlib import Path

    from collsim.topology.loader import catalog_names

    table = (Path(__file__).resolve().parents[2] / "topologies" / "README.md").read_text()
    missing = [name for name in catalog_names() if f"| `{name}` |" not in table]
    assert not missing, f"topologies/README.md lacks {missing}"


def test_true_false_inside_nested_lists_is_refused():
    """`pairs: [[0, true, 2]]` was read as the pair (0, 1, 2): a boolean for a number is an
    error at any depth of a list, while a nested model's own true/false fields stay valid."""
    import pytest
    from pydantic import ValidationError

    from collsim.topology.schema import IntraIn

    link = {"kind": "nvlink", "bandwidth": "50GB/s"}
    with pytest.raises(ValidationError, match="not true/false"):
        IntraIn(kind="mesh", link=link, pairs=[[0, True, 2]])
    ok = IntraIn(kind="mesh", link=link, pairs=[[0, 1, 2]], in_network_reduction=True)
    assert ok.pairs == [(0, 1, 2)] and ok.in_network_reduction


@pytest.mark.parametrize(("name", "floor_gbps"), [("p5", 360), ("oci-h100", 360), ("gaudi2", 135)])
def test_a_gpu_with_several_nics_of_its_own_uses_them_all(name, floor_gbps):
    """p5 (4 x 100G EFA per GPU), OCI H100 (2 x 200G) and Gaudi2 (3 x 100 GbE per HPU) were
    given as separate NICs, and collsim sends a GPU pair's traffic along one path: a ring
    all-reduce across two p5 nodes ran at one EFA per GPU, 50 GB/s busbw of the node's 400.
    A GPU's own NICs are one NIC of their combined rate, so the ring reaches the node's rate
    (400 GB/s; separate NICs gave 50 on p5, 200 on OCI, 100 on Gaudi2, whose ring its intra-node
    mesh then bounds at ~150). On NCCL's 16 channels: 8 would be held to 8 x 38.7 GB/s, an
    H100 channel's rate."""
    from collsim.whatif import WhatIf

    whatif = WhatIf(load_topology(name, nodes=2))
    g = whatif.topology.gpus_per_node
    nics = [d for d in whatif.topology.devices if d.kind == "nic" and d.node == 0]
    assert len(nics) == g
    size, n = 1 << 30, whatif.topology.n_gpus
    t = float(whatif.cost_model().predict("all_reduce", "ring", [size], channels=16)[0])
    busbw = size / t / 1e9 * 2 * (n - 1) / n
    assert busbw > floor_gbps
