"""Rings on point-to-point meshes: each channel's ring takes other links, as NCCL's search does."""

from __future__ import annotations

import pytest

from collsim.topology.loader import load_topology
from collsim.topology.rings import mesh_rings
from collsim.whatif import WhatIf


@pytest.mark.parametrize("name", ["h100-4gpu-ib", "dgx1-v100", "mi300x"])
def test_rings_are_cycles_over_direct_links_that_spread(name):
    topo = load_topology(name, nodes=1)
    rings = mesh_rings(topo)
    assert rings is not None and len(rings) >= 2
    local = {d.name: d.index for d in topo.devices if d.kind == "gpu"}
    direct = {(local[x.a], local[x.b]) for x in topo.links if x.a in local and x.b in local}
    direct |= {(b, a) for a, b in direct}
    g = topo.gpus_per_node
    arcs = []
    for ring in rings:
        assert sorted(ring) == list(range(g))
        hops = list(zip(ring, ring[1:] + ring[:1], strict=True))
        assert all(h in direct for h in hops)  # every hop is a direct link
        arcs.append(set(hops))
    assert not arcs[0] & arcs[1]  # the second channel's ring uses other links
    assert mesh_rings(topo) == rings  # deterministic


@pytest.mark.parametrize("name", ["dgx-h100", "rtx4090-4gpu-pcie"])
def test_switched_and_pcie_nodes_keep_rank_order(name):
    assert mesh_rings(load_topology(name, nodes=1)) is None


def test_channels_add_bandwidth_on_a_mesh():
    """HGX H100 4-GPU: 150 GB/s per GPU pair; one ring uses one pair per GPU, eight channels
    spread over all three."""
    w = WhatIf(load_topology("h100-4gpu-ib", nodes=1))
    one, _ = w.run("all_reduce", "ring", 1 << 30, channels=1)
    eight, _ = w.run("all_reduce", "ring", 1 << 30, channels=8)
    assert one.time_s / eight.time_s > 2.4
