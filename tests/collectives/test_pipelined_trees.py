"""Trees and chains pipeline by chunks, and NCCL's tree spans nodes through per-channel heads."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.collectives.layout import RankLayout
from collsim.collectives.tree import Tree, nccl_tree_parents
from collsim.topology.loader import load_topology
from collsim.whatif import WhatIf


@pytest.mark.parametrize("n, g, channels", [(16, 8, 4), (8, 4, 2), (11, 4, 3), (6, 1, 2)])
def test_only_heads_cross_nodes_and_channels_use_different_heads(n, g, channels):
    lay = RankLayout(n, g)
    node = np.arange(n) // g
    heads_per_channel = []
    for c in range(channels):
        for parent in nccl_tree_parents(lay, c, channels):
            Tree.from_parents(parent)  # a tree: one root, no cycle
            assert (parent < 0).sum() == 1
            crossing = np.flatnonzero((parent >= 0) & (node[np.maximum(parent, 0)] != node))
            # an edge between nodes joins two heads: the child has no parent inside its node
            for x in crossing:
                inside = [y for y in range(n) if node[y] == node[x] and parent[y] == x]
                assert len(inside) <= 1  # the head's chain below it
            if lay.nnodes > 1:
                assert crossing.size == lay.nnodes - 1  # a spanning tree over the nodes
        heads_per_channel.append(int(np.flatnonzero(nccl_tree_parents(lay, c, channels)[0] < 0)[0]))
    if g >= channels > 1:
        assert len(set(heads_per_channel)) == channels  # channels leave through different GPUs


def test_chain_broadcast_pipelines():
    """One node on an NVSwitch: a chain broadcast of K chunks takes about (n - 1 + K - 1) chunk
    steps, not (n - 1) whole-buffer hops."""
    w = WhatIf(load_topology("dgx-a100", nodes=1))
    size = 1 << 30
    sim, _ = w.run("broadcast", "chain", size)
    n, k = 8, 64
    link_bytes_per_s = 300e9
    chunk_s = size / k / link_bytes_per_s
    assert sim.time_s < (n - 1 + k - 1) * chunk_s * 1.25  # pipelined (latencies on top)
    assert sim.time_s < (n - 1) * size / link_bytes_per_s / 4  # far from hop-by-hop
    # the analytic pipeline form agrees with the engine where nothing contends
    pred = float(w.cost_model("collsim").predict("broadcast", "chain", [size])[0])
    assert pred == pytest.approx(sim.time_s, rel=1e-3)


def test_two_node_tree_all_reduce_beats_the_ring_bound():
    """NCCL's tree moves about the whole buffer across each node boundary, a ring 2(n-1)/n of it:
    with 2 nodes the tree's large-message bus bandwidth exceeds what the NICs allow a ring."""
    w = WhatIf(load_topology("h100-4gpu-ib", nodes=2))
    size = 1 << 30
    ring, _ = w.run("all_reduce", "ring", size, channels=8)
    tree, _ = w.run("all_reduce", "tree", size, channels=8)
    assert tree.time_s < 0.75 * ring.time_s
