"""Which of ring and tree NCCL runs an all-reduce with across nodes: its own tuning table on its
own graphs, not whichever collsim times faster.

NCCL picks an algorithm and protocol per call by the smallest time in its tuning table
(``src/enqueue.cc`` ``topoGetAlgoInfo`` over ``comm->latencies`` / ``comm->bandwidths``, filled by
``ncclTopoTuneModel`` in ``src/graph/tuning.cc``, :func:`collsim.model.nccl.tune_table`). Where
that table's ranking differs from the hardware's, NCCL still runs its own pick, and so must a
prediction of a log. The table reads the graphs NCCL's topology search found
(:func:`collsim.model.nccl_channels.nccl_graph`), not a collsim route's bandwidth:

* the **ring** graph across nodes has ``bwIntra = bwInter``, the per-channel speed the search
  settled on (``search.cc``: ``tmpGraph.bwIntra = tmpGraph.bwInter = speedArray[...]``), on
  ``graph->nChannels`` channels (before ``ncclTopoPostset`` doubles them);
* the **tree** graph starts from the same speed, and the search then raises its ``bwIntra`` one
  step of the speed array at a time while it is below twice ``bwInter`` and the node's links
  carry it ("increase bwIntra for trees (2 nodes or collnet)", ``search.cc`` v2.21.5
  l.1024-1027); ``ncclTopoTuneModel`` reads ``bwIntra`` on one or two nodes and ``bwInter`` on
  more (``tuning.cc`` v2.21.5 l.192).

On two nodes the tree's doubled ``bwIntra`` then meets ``perChMaxTreeBw`` (``tuning.cc`` v2.21.5
l.108-112: 24.0 / 23.6 / 17.8 GB/s per channel on Ampere for 1 / 2 / more nodes; Volta
26.5 / 18.5 / 10.0, Hopper 38.7 / 41.4 / 36.0): ``busBw = min(0.92 busBw, nChannels
perChMaxTreeBw)``, halved to an algorithm bandwidth, against the ring's ``nChannels bwIntra
nRanks / nsteps``. On ALCF Polaris (A100, one 24 GB/s channel per 200 Gb/s NIC, two NICs) the
tree is capped at 23.6 per channel, 11.8 GB/s algbw per channel against the ring's 24 x 8 / 14 =
13.7: NCCL runs the ring at large sizes on 2 nodes, and the log's all-reduce busbw equals its
all-gather's (36.6 / 36.5 GB/s), where a tree would double it. On A100 EFA (12 GB/s channels)
and H100 (Hopper's 41.4 cap) the tree stays ahead, as their logs show.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from collsim.model.nccl import (
    PROTOS,
    RING,
    TREE,
    NcclInputs,
    algo_time_us,
    compute_capability,
    ll128_by_default,
)
from collsim.model.nccl_channels import NcclGraph, gpu_links_nvlink, inter_speeds, nccl_graph
from collsim.topology.graph import Network
from collsim.topology.spec import Topology


def tree_bw_intra_gbps(graph: NcclGraph, comp_cap: int) -> float:
    """The tree graph's ``bwIntra`` per channel: the ring's speed raised one step of the speed
    array at a time while below twice the ring's and within the node's links (``search.cc``)."""
    speeds = sorted(inter_speeds(comp_cap))
    bw = graph.speed_gbps
    for faster in (s for s in speeds if s > graph.speed_gbps):
        if bw >= 2.0 * graph.speed_gbps:
            break
        if graph.intra_gbps > 0 and faster * graph.channels > graph.intra_gbps * (1 + 1e-9):
            break
        bw = faster
    return bw


def graph_inputs(
    topology: Topology, graph: NcclGraph, algorithm: str, *, ll128: bool, intra_nvlink: bool = True
) -> NcclInputs:
    """NCCL's tuning inputs for ``algorithm`` (``ring`` or ``tree``) on ``graph``."""
    cc = compute_capability(topology.gpu.model)
    intra = graph.speed_gbps if algorithm == RING else tree_bw_intra_gbps(graph, cc)
    return NcclInputs(
        n_ranks=topology.n_gpus,
        n_nodes=topology.nvlink_domains,
        comp_cap=cc,
        n_channels=graph.channels,
        bw_intra_gbps=intra,
        bw_inter_gbps=graph.speed_gbps,
        intra_nvlink=intra_nvlink,
        ll128_enabled=ll128,
    )


def nccl_all_reduce_algorithms(
    topology: Topology,
    graph: NcclGraph,
    n_bytes: np.ndarray,
    protocols: tuple[str, ...],
    intra_nvlink: bool = True,
) -> np.ndarray:
    """``ring`` or ``tree`` per all-reduce of ``n_bytes`` (the buffer's bytes), the one NCCL's
    tuning table ranks first over ``protocols`` (LL128 only where NCCL enables it)."""
    nb = np.asarray(n_bytes, dtype=np.int64)
    cc = compute_capability(topology.gpu.model)
    ll128 = ll128_by_default(intra_nvlink, cc, topology.nvlink_domains > 1, topology.nic_gpu_path)
    best = {RING: np.full(nb.shape, np.inf), TREE: np.full(nb.shape, np.inf)}
    for algorithm in (RING, TREE):
        inp = graph_inputs(topology, graph, algorithm, ll128=ll128, intra_nvlink=intra_nvlink)
        for proto in protocols:
            if proto not in PROTOS or (proto == "LL128" and not ll128):
                continue
            t = algo_time_us(inp, "all_reduce", algorithm, proto, nb)
            best[algorithm] = np.minimum(best[algorithm], t)
    return np.where(best[TREE] < best[RING], TREE, RING)


def follow_nccl(
    tuning: Any,
    topology: Topology,
    network: Network | None = None,
    *,
    protocols: tuple[str, ...] = PROTOS,
    elem_bytes: int = 4,
) -> Any:
    """``tuning`` (a :class:`collsim.model.tuner.Tuning`) with each all-reduce across nodes on
    the algorithm NCCL's table picks of ring and tree (:func:`nccl_all_reduce_algorithms`),
    where the fastest choice was one of them: the fastest protocol and channel count of that
    algorithm. Unchanged elsewhere (one node, another collective, an algorithm outside ring and
    tree, a system without NCCL's graph, no candidate of NCCL's pick).

    Only the algorithm follows NCCL's table: its protocol thresholds are NCCL 2.19-2.21's
    (:mod:`collsim.model.nccl`), and following them moved the NCCL 2.8/2.9 p4d logs from the
    tree's Simple to its LL128 at 1 GiB (busbw error -0.9 -> +15.6%, +29 -> +64%)."""
    if tuning.collective != "all_reduce" or topology.nvlink_domains < 2:
        return tuning
    if not {RING, TREE} <= {c.algorithm for c in tuning.choices}:
        return tuning
    net = network or Network(topology)
    graph = nccl_graph(topology, net)
    if graph is None:
        return tuning
    sizes = np.asarray(tuning.sizes_bytes, dtype=np.int64)
    n_bytes = sizes // elem_bytes * elem_bytes  # NCCL's count x type size
    picks = nccl_all_reduce_algorithms(topology, graph, n_bytes, protocols, gpu_links_nvlink(net))
    best = np.array(tuning.best, copy=True)
    algorithm = np.array([c.algorithm for c in tuning.choices])
    for i, pick in enumerate(picks):
        if algorithm[best[i]] not in (RING, TREE) or algorithm[best[i]] == pick:
            continue
        rows = np.flatnonzero(algorithm == pick)
        times = tuning.times_s[rows, i]
        if rows.size and np.isfinite(times).any():
            best[i] = rows[int(np.argmin(np.where(np.isfinite(times), times, np.inf)))]
    return replace(tuning, best=best)


__all__ = [
    "follow_nccl",
    "graph_inputs",
    "nccl_all_reduce_algorithms",
    "tree_bw_intra_gbps",
]
