"""Trees and chains pipeline by chunks, and NCCL's tree spans nodes through per-channel heads."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.channel_rates import SIMPLE_GBPS
from collsim.collectives.layout import RankLayout
from collsim.collectives.tree import Tree, binary_tree_parents, nccl_tree_parents
from collsim.topology.loader import load_topology
from collsim.whatif import WhatIf, layout_for


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


@pytest.mark.parametrize(
    ("n", "g", "channels", "root"),
    [(32, 8, 8, 0), (32, 8, 4, 13), (11, 4, 3, 10), (6, 1, 2, 5), (8, 8, 2, 3)],
)
def test_binary_tree_spans_nodes_through_per_channel_heads(n, g, channels, root):
    """The tree broadcast / reduce: rooted at the root, binary across nodes (a head feeds at
    most two other nodes) and inside them (at most two GPUs), one edge into each other node, as
    shallow as a heap inside a node, and channels cross nodes through different GPUs."""
    lay = RankLayout(n, g)
    node = np.arange(n) // g
    senders = []
    for c in range(channels):
        parent = binary_tree_parents(lay, c, channels, root)
        tree = Tree.from_parents(parent)
        assert tree.root == root and (parent < 0).sum() == 1
        crossing = np.flatnonzero((parent >= 0) & (node[np.maximum(parent, 0)] != node))
        inside = np.flatnonzero(parent >= 0)
        inside = inside[node[parent[inside]] == node[inside]]
        assert np.bincount(parent[crossing], minlength=n).max(initial=0) <= 2
        assert np.bincount(parent[inside], minlength=n).max(initial=0) <= 2
        depth_in_node = int(np.log2(g)) + 1  # a heap's levels, plus one hop to the head
        assert len(tree.levels) - 1 <= depth_in_node * lay.nnodes.bit_length()
        if lay.nnodes == 1:
            assert len(tree.levels) == int(np.log2(n)) + 1  # a heap: no deeper for any root
        assert sorted(node[crossing].tolist()) == sorted(set(range(lay.nnodes)) - {node[root]})
        senders.append(frozenset(parent[crossing].tolist()))
    if lay.nnodes > 1 and g >= channels > 1:
        assert len(set(senders)) == channels  # each channel leaves its nodes by other GPUs


def test_binary_tree_on_a_mesh_takes_direct_links_only():
    """On the DGX-1's hybrid cube mesh not every pair of GPUs shares an NVLink: the tree inside a
    node is built over the links, so no edge detours over PCIe and QPI (heap order over the ring
    had put 3-4 of its 7 edges there), at every root and channel, and it stays shallow."""
    topo = load_topology("dgx1-v100", nodes=2)
    lay = layout_for(topo)
    gpus = {d.name: d.index for d in topo.devices if d.kind == "gpu"}  # local index
    nvlink = {
        frozenset((gpus[link.a], gpus[link.b]))
        for link in topo.links
        if link.a in gpus and link.b in gpus and link.kind == "nvlink"
    }
    assert lay.local_rings
    for channels in (1, 2, 4):
        for c in range(channels):
            for root in (0, 5, 11):
                parent = binary_tree_parents(lay, c, channels, root)
                tree = Tree.from_parents(parent)
                assert tree.root == root
                for x in np.flatnonzero(parent >= 0):
                    if x // 8 == parent[x] // 8:
                        assert frozenset((int(x) % 8, int(parent[x]) % 8)) in nvlink
                assert len(tree.levels) <= 2 * 4 + 1


@pytest.mark.parametrize(
    ("topology", "channels", "limit_us"), [("dgx-h100", 8, 16.0), ("dgx1-v100", 8, 20.0)]
)
def test_small_tree_broadcast_is_no_slower_than_the_chain(topology, channels, limit_us):
    """A binary tree's point is latency: on one node a 1 KiB tree broadcast takes log-depth hops
    (about 14.7 us on a DGX H100, where the chain of 8 takes about 29 us), at any channel count."""
    w = WhatIf(load_topology(topology, nodes=1))
    tree, _ = w.run("broadcast", "tree", 1024, channels=channels)
    chain, _ = w.run("broadcast", "chain", 1024, channels=channels)
    assert tree.time_s * 1e6 < limit_us
    assert tree.time_s < chain.time_s


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_tree_channels_spread_over_the_nics(collective):
    """Across four DGX H100 nodes (8 NICs each) 8 channels of the tree broadcast / reduce move
    256 MiB several times as fast as one. A rank-order binary tree had sent every channel
    through the same NICs (8 channels no faster than one, slower at mid sizes). The model
    follows the same trees."""
    w = WhatIf(load_topology("dgx-h100", nodes=4))
    size = 256 << 20
    one, _ = w.run(collective, "tree", size, channels=1)
    eight, _ = w.run(collective, "tree", size, channels=8)
    assert one.time_s / eight.time_s > 5
    for mid in (4 << 20, 16 << 20):
        t1, _ = w.run(collective, "tree", mid, channels=1)
        t8, _ = w.run(collective, "tree", mid, channels=8)
        assert t8.time_s < t1.time_s
    pred = float(w.cost_model("collsim").predict(collective, "tree", [size], channels=8)[0])
    assert pred == pytest.approx(eight.time_s, rel=0.02)


def test_chain_broadcast_pipelines():
    """One node on an NVSwitch: a chain broadcast of K chunks takes about (n - 1 + K - 1) chunk
    steps, not (n - 1) whole-buffer hops. One channel runs at its own rate (an A100 channel's
    24 GB/s, :mod:`collsim.channel_rates`), not the 300 GB/s port's."""
    w = WhatIf(load_topology("dgx-a100", nodes=1))
    size = 1 << 30
    sim, _ = w.run("broadcast", "chain", size)
    n, k = 8, 64
    link_bytes_per_s = min(300e9, SIMPLE_GBPS["ampere"] * 1e9)
    chunk_s = size / k / link_bytes_per_s
    assert sim.time_s < (n - 1 + k - 1) * chunk_s * 1.25  # pipelined (latencies on top)
    assert sim.time_s < (n - 1) * size / link_bytes_per_s / 4  # far from hop-by-hop
    # the analytic pipeline form agrees with the engine where nothing contends
    pred = float(w.cost_model("collsim").predict("broadcast", "chain", [size])[0])
    assert pred == pytest.approx(sim.time_s, rel=1e-3)


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_chain_channels_follow_the_rings_over_every_nic(collective):
    """NCCL's broadcast and reduce run on each channel's ring, and the rings of different
    channels cross nodes through different NICs: across two DGX H100 nodes (8 NICs each), 8
    channels move the data about 6.6x as fast as one (one NIC). Before, every channel took the
    same chain, so --channels changed nothing. The model follows the same chains (within 2%)."""
    from collsim.collectives.common import BuildSpec
    from collsim.collectives.registry import build_schedule
    from collsim.collectives.ring import ring_order
    from collsim.collectives.schedule import TRANSFER

    w = WhatIf(load_topology("dgx-h100", nodes=2))
    size = 256 << 20
    one, _ = w.run(collective, "chain", size, channels=1)
    eight, _ = w.run(collective, "chain", size, channels=8)
    assert one.time_s / eight.time_s > 5
    pred = float(w.cost_model("collsim").predict(collective, "chain", [size], channels=8)[0])
    assert pred == pytest.approx(eight.time_s, rel=0.02)
    # each channel's chain is its ring, followed from the root (here rank 3)
    lay = RankLayout(16, 8)
    sched = build_schedule(collective, "chain", nranks=16, count=1 << 20, layout=lay,
                           channels=4, root=3)  # fmt: skip
    spec = BuildSpec(collective, "chain", 16, 1 << 20, 4, lay, 4, 1 << 16, 3)
    moves = (sched.kind == TRANSFER) & (sched.src != sched.dst)
    crossings = set()
    for c in range(4):
        ring = ring_order(spec, c).ravel()
        order = np.roll(ring, -int(np.argmax(ring == 3)))
        edges = set(zip(order[:-1].tolist(), order[1:].tolist(), strict=True))
        mine = moves & (sched.channel == c)
        pairs = set(zip(sched.src[mine].tolist(), sched.dst[mine].tolist(), strict=True))
        if collective == "reduce":  # forward along the ring too, from the root's successor
            order = np.roll(order, -1)
            edges = set(zip(order[:-1].tolist(), order[1:].tolist(), strict=True))
        assert pairs == edges
        crossings |= {e for e in edges if (e[0] < 8) != (e[1] < 8)}
    assert len(crossings) >= 4  # the channels cross between nodes on different GPUs


def test_two_node_tree_all_reduce_beats_the_ring_bound():
    """NCCL's tree moves about the whole buffer across each node boundary, a ring 2(n-1)/n of it:
    with 2 nodes the tree's large-message bus bandwidth exceeds what the NICs allow a ring."""
    w = WhatIf(load_topology("h100-4gpu-ib", nodes=2))
    size = 1 << 30
    ring, _ = w.run("all_reduce", "ring", size, channels=8)
    tree, _ = w.run("all_reduce", "tree", size, channels=8)
    assert tree.time_s < 0.75 * ring.time_s
