"""Ring orders inside a node whose GPUs are linked point to point (NVLink/xGMI meshes).

On an NVSwitch any ring order crosses the same switch ports, and on a PCIe tree NCCL keeps rank
order. On a *mesh* -- GPUs wired directly to each other (HGX 4-GPU boards, DGX-1's hybrid
cube-mesh, MI300X and Gaudi 2 all-to-all meshes) -- a ring in rank order uses only the links
between neighbours, so NCCL and RCCL search rings on the real topology (``ncclTopoCompute``) and
give each channel another ring, whose edges are other links: more channels, more links, more
bandwidth. :func:`mesh_rings` does the same for collsim's ring builders: it picks directed
Hamiltonian cycles over the direct GPU-GPU links of one node, greedily -- each next cycle
minimises the largest load per unit of bandwidth on the links it uses (ties go to the
lexicographically first cycle) -- so successive channels spread over every link.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from collsim.topology.spec import Topology

MAX_RINGS = 8
"""Distinct rings returned (channels beyond reuse them in turn), as NCCL's ring search caps them."""
MAX_MESH_GPUS = 8
"""Largest node searched exhaustively ((g-1)! cycles); larger nodes keep rank order."""


def mesh_rings(topology: Topology) -> tuple[tuple[int, ...], ...] | None:
    """Per channel, the order of a node's local GPU indices around its ring; ``None`` where the
    node is not a point-to-point mesh with a Hamiltonian cycle (rank order is then used)."""
    g = topology.gpus_per_node
    if not 3 <= g <= MAX_MESH_GPUS:
        return None
    local = {d.name: d.index for d in topology.devices if d.kind == "gpu" and d.node == 0}
    bw = np.zeros((g, g))
    for link in topology.links:
        i, j = local.get(link.a), local.get(link.b)
        if i is None or j is None or i == j:
            continue
        bw[i, j] += link.bandwidth_bytes_per_s * link.bandwidth_factor[0]
        bw[j, i] += link.bandwidth_bytes_per_s * link.bandwidth_factor[1]
    if not bw.any():
        return None
    return _greedy_cycles(tuple(map(tuple, bw.tolist())))


@functools.lru_cache(maxsize=64)
def _greedy_cycles(bw_rows: tuple[tuple[float, ...], ...]) -> tuple[tuple[int, ...], ...] | None:
    bw = np.asarray(bw_rows)
    g = bw.shape[0]
    tails = np.array(list(itertools.permutations(range(1, g))), dtype=np.int64)
    cycles = np.hstack([np.zeros((tails.shape[0], 1), dtype=np.int64), tails])
    src, dst = cycles, np.roll(cycles, -1, axis=1)
    cycles = cycles[(bw[src, dst] > 0).all(axis=1)]
    if not cycles.shape[0]:
        return None
    src, dst = cycles, np.roll(cycles, -1, axis=1)
    arc_bw = bw[src, dst]
    load = np.zeros((g, g))
    chosen: list[tuple[int, ...]] = []
    for _ in range(min(MAX_RINGS, cycles.shape[0])):
        after = (load[src, dst] + 1.0) / arc_bw
        worst, total = after.max(axis=1), after.sum(axis=1)
        best = int(np.lexsort((total, worst))[0])  # smallest worst load, then smallest total
        chosen.append(tuple(int(x) for x in cycles[best]))
        np.add.at(load, (src[best], dst[best]), 1.0)
    return tuple(chosen)
