"""Rings and tree chains across nodes whose GPUs form a mesh of direct links (DGX-1, p3dn)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from collsim.collectives.common import DEFAULT_CHUNK_BYTES, BuildSpec
from collsim.collectives.ring import ring_order
from collsim.collectives.tree import nccl_tree_parents
from collsim.topology.loader import load_topology
from collsim.whatif import WhatIf


def _direct(layout, path: np.ndarray) -> bool:
    """Every hop of ``path`` (local indices) is a link some direct-link cycle of the node takes."""
    hops = {
        frozenset((int(r[i - 1]), int(r[i]))) for r in layout.local_rings for i in range(len(r))
    }
    return all(frozenset((int(x), int(y))) in hops for x, y in itertools.pairwise(path))


def _rings(name: str, nodes: int, channels: int) -> tuple[WhatIf, list[np.ndarray]]:
    whatif = WhatIf(load_topology(name, nodes=nodes))
    n = whatif.topology.n_gpus
    spec = BuildSpec(collective="all_reduce", algorithm="ring", nranks=n, count=n * channels,
                     elem_bytes=4, layout=whatif.layout, channels=channels,
                     chunk_bytes=DEFAULT_CHUNK_BYTES, root=0)  # fmt: skip
    return whatif, [ring_order(spec, c).ravel() for c in range(channels)]


def test_dgx1_rings_across_nodes_take_nvlink_only_and_balance_their_exits():
    """On a DGX-1 the rank-order path 0, 7, 6, ... hops 0 -> 7 over PCIe and the CPUs (no NVLink
    joins them), which capped every multi-node ring at a PCIe link's rate. Each node's part of
    a ring now runs on NVLink, and the channels enter and leave the nodes through every GPU
    equally often, so the NICs share the traffic evenly."""
    whatif, rings = _rings("dgx1-v100", 2, 8)
    layout = whatif.layout
    entries, exits = np.zeros(8, int), np.zeros(8, int)
    for order in rings:
        for node in (order[:8], order[8:]):
            assert _direct(layout, node % 8)
        entries[order[0] % 8] += 1
        exits[order[7] % 8] += 1
        assert order[8] % 8 == order[7] % 8  # the inter-node hop stays on one rail
    assert list(entries) == [1] * 8 and list(exits) == [1] * 8
    busbw = {}
    for algo in ("ring", "tree"):
        size = 1 << 30
        t = float(whatif.cost_model().predict("all_reduce", algo, [size], channels=8)[0])
        busbw[algo] = size / t / 1e9 * 2 * 15 / 16
    # four 100G EDR NICs per node: 50 GB/s; the PCIe-bound rings gave 15.75 and 27 GB/s
    assert busbw["ring"] == pytest.approx(50, rel=0.02)
    assert busbw["tree"] > 45
    for c in range(8):
        for parents in nccl_tree_parents(layout, c, 8):
            for child in range(16):  # every chain hop inside a node is an NVLink
                p = parents[child]
                if p >= 0 and p // 8 == child // 8:
                    assert _direct(layout, np.array([p % 8, child % 8]))


def _ring_busbw(whatif: WhatIf, channels: int) -> float:
    n, size = whatif.topology.n_gpus, 1 << 30
    t = float(whatif.cost_model().predict("all_gather", "ring", [size], channels=channels)[0])
    return size / t / 1e9 * (n - 1) / n


@pytest.mark.parametrize("name", ["h100-4gpu-ib", "mi300x"])
def test_full_meshes_spread_rings_over_links_and_nics(name):
    """On a fully connected mesh every walk is direct; the channels still have to spread over
    the mesh's links (MI300X: one 64 GB/s xGMI link per pair, which rank-order rings all
    crossed: 73 GB/s busbw at 8 channels on 2 nodes) and over the NICs (a first version left
    two of a 4-GPU node's NICs idle: 50 GB/s). Entries and exits now cover every GPU equally
    and busbw does not fall as channels are added."""
    whatif, rings = _rings(name, 2, 16)
    g = whatif.layout.ranks_per_node
    exits = np.bincount([order[g - 1] % g for order in rings], minlength=g)
    assert list(exits) == [16 // g] * g
    bw = [_ring_busbw(whatif, c) for c in (4, 8, 16)]
    assert bw[0] <= bw[1] * 1.001 and bw[1] <= bw[2] * 1.001
    if name == "h100-4gpu-ib":  # 4 x 200G NICs per node bound it at every channel count
        assert bw == pytest.approx([100, 100, 100], rel=0.01)
    else:
        assert bw[1] > 200


@pytest.mark.parametrize(("n", "g"), [(64, 36), (100, 36), (12, 8), (10, 4)])
def test_a_partial_last_node_is_crossed_through_every_channels_own_nic(n, g):
    """Every channel's ring is a permutation of the ranks, and with a partial last node (36 +
    28 ranks: a 128-GPU job's TP2 data-parallel group on two NVL72 racks) the channels still
    cross between nodes on different GPUs: in plain rank order all of them shared the single
    hop ``g-1 -> g``, so one NIC pair carried the whole collective."""
    from collsim.collectives.layout import RankLayout

    channels = 8
    spec = BuildSpec(collective="all_gather", algorithm="ring", nranks=n, count=n * channels,
                     elem_bytes=4, layout=RankLayout(n, g), channels=channels,
                     chunk_bytes=DEFAULT_CHUNK_BYTES, root=0)  # fmt: skip
    into_last, out_of_last = set(), set()
    first_last = (n // g) * g
    for c in range(channels):
        ring = ring_order(spec, c).ravel()
        assert sorted(ring.tolist()) == list(range(n))
        for a, b in zip(ring.tolist(), np.roll(ring, -1).tolist(), strict=True):
            if a < first_last <= b:
                into_last.add(b)
            if b < first_last <= a:
                out_of_last.add(a)
    assert len(into_last) >= min(channels, n - first_last) // 2
    assert len(out_of_last) >= min(channels, n - first_last) // 2
