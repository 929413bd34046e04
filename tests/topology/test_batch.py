"""Batch routing (``collsim/topology/batch.py``) gives exactly the per-pair router's answer:
the same links in the same order, the same latency bits, the same paths and weights."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.topology.batch import mix_np
from collsim.topology.batch_pairs import paths, routes
from collsim.topology.graph import Network
from collsim.topology.loader import load_topology
from collsim.topology.routing import mix


def _pairs(net: Network, m: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    gpus = np.array([net.index[g] for g in net.gpu_names], dtype=np.int64)
    rng = np.random.default_rng(seed)
    return gpus[rng.integers(0, gpus.size, m)], gpus[rng.integers(0, gpus.size, m)]


def test_mix_np_is_mix() -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, 1 << 63, 200, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    b = rng.integers(0, 1 << 63, 200, dtype=np.int64).astype(np.uint64)
    got = mix_np(a, b, -1)
    want = [mix(int(x), int(y), -1) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    assert got.tolist() == want


# polaris at 540 nodes: a 3-group dragonfly whose inter-group routes tie (hashed walks), adaptive
# multipath; roce-400g: hashed ECMP over a fat tree; gb300-nvl72 at 32 trays: two NVLink domains;
# dgx-h100 at 64 and 40 nodes, dgx-a100 at 20: InfiniBand fat trees routed D-mod-k (40 and 20
# leave leaves and spines partly used, where D-mod-k's choices wrap).
CASES = [("polaris", 540), ("roce-400g", None), ("gb300-nvl72", 32), ("gh200-slingshot", 64),
         ("dgx-h100", 64), ("dgx-h100", 40), ("dgx-a100", 20)]  # fmt: skip


@pytest.mark.parametrize(("name", "nodes"), CASES)
def test_batch_routes_equal_per_pair_routes(name: str, nodes: int | None) -> None:
    net = Network(load_topology(name, nodes=nodes))
    assert net.batch.enabled
    src, dst = _pairs(net, 3000)
    ptr, links, lat = routes(net, src, dst)
    reference = Network(net.topology)  # its own caches: nothing shared with the batch
    for i in range(src.size):
        r = reference.route_index(int(src[i]), int(dst[i]))
        assert tuple(links[ptr[i] : ptr[i + 1]].tolist()) == r.links
        assert lat[i] == r.latency_s  # to the bit


def test_batch_routes_on_the_contended_benchmark_fabric() -> None:
    """D-mod-k on an explicit two-level fat tree with GPUs scattered over the leaves (the
    contended benchmark's): every pair of an all-to-all, batch against per pair."""
    import sys
    from pathlib import Path

    from collsim.topology.loader import topology_from_dict

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from contended_scaling import fat_tree

    net = Network(topology_from_dict(fat_tree(32, 3)))
    assert net.batch.enabled and net._fast._dmodk is not None
    gpus = np.array([net.index[g] for g in net.gpu_names], dtype=np.int64)
    src, dst = np.repeat(gpus, gpus.size), np.tile(gpus, gpus.size)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    ptr, links, lat = routes(net, src, dst)
    reference = Network(net.topology)
    for i in range(src.size):
        r = reference.route_index(int(src[i]), int(dst[i]))
        assert tuple(links[ptr[i] : ptr[i + 1]].tolist()) == r.links
        assert lat[i] == r.latency_s


@pytest.mark.parametrize(("name", "nodes"), [("polaris", 540), ("gh200-slingshot", 64)])
def test_batch_paths_equal_per_pair_paths(name: str, nodes: int) -> None:
    net = Network(load_topology(name, nodes=nodes))
    src, dst = _pairs(net, 1500, seed=2)
    pair_ptr, weight, ptr, links, lat = paths(net, src, dst)
    reference = Network(net.topology)
    split = 0
    for i in range(src.size):
        want = reference.paths_index(int(src[i]), int(dst[i]))
        got = tuple(
            (tuple(links[ptr[j] : ptr[j + 1]].tolist()), float(weight[j]))
            for j in range(pair_ptr[i], pair_ptr[i + 1])
        )
        assert got == want
        assert lat[i] == reference.route_index(int(src[i]), int(dst[i])).latency_s
        split += len(want) > 1
    assert split > 100  # the multipath case is exercised, not only single routes


@pytest.mark.parametrize(("name", "nodes"), [("dgx-h100", 8), ("dgx1-v100", 3), ("hgx-b200", 4),
                                             ("gb300-nvl72", 32), ("mi300x", 3)])  # fmt: skip
def test_routes_inside_copied_servers_equal_per_pair_routes(name: str, nodes: int) -> None:
    """Every GPU pair inside a server, routed as a copy of the representative server's route
    (``collsim/topology/servers.py``), is the per-pair router's route: links and latency bits.
    Template nodes are copies, so most pairs are moved (all but a server's own pairs of one GPU
    and walks with ties)."""
    net = Network(load_topology(name, nodes=nodes))
    gpus = np.array([net.index[g] for g in net.gpu_names], dtype=np.int64)
    g = len(gpus) // nodes
    s = np.repeat(np.arange(gpus.size), g)
    d = (s // g) * g + np.tile(np.arange(g), gpus.size)
    src, dst = gpus[s], gpus[d]
    ptr, links, lat = routes(net, src, dst)
    for i in range(src.size):
        want = net.route_index(int(src[i]), int(dst[i]))
        assert tuple(links[ptr[i] : ptr[i + 1]].tolist()) == tuple(want.links)
        assert lat[i] == want.latency_s
    assert net.copies is not None
    moved = net.copies.routes(src, dst)[0]
    if name in ("dgx-h100", "dgx1-v100"):  # one NVSwitch / direct NVLinks: no ties inside
        assert moved.sum() == src.size - gpus.size
        assert np.unique(net.copies.rep[net.copies.rep >= 0]).size == 1
