"""NCCL's in-network all-reduces across nodes: NVLS+tree (``NVLS_TREE``) and CollNet/SHARP
(``COLLNET_DIRECT``), both as NCCL runs them (``src/device/all_reduce.h``).

Both cut each channel's share into ``H`` slices, one per *head*: a GPU of every node (NVLink
domain) with its own NIC (:func:`head_ranks`). For each slice, pipelined chunk by chunk (NCCL's
128 KiB NVLS chunk unless another is asked for, up to :func:`chunk_cap` chunks):

1. **in the node**, the slice is reduced onto the node's head -- by the NVSwitch
   (``nvls_tree``: one ``NETWORK_REDUCE`` from the node's ranks to the head, NVLink SHARP's
   ``multimem.ld_reduce``) or by point-to-point sends that the head reduces as they arrive
   (``collnet``: NCCL's ``recvReduceDirectSend``, every other rank of the node sending to it);
2. **across nodes**, the heads of that slice join the node sums -- up and down NCCL's double
   binary tree over the nodes (``nvls_tree``: ``ncclGetDtree``, channel ``c`` on tree ``c % 2``
   as in NCCL's ``connectNvls``, so one channel uses one tree, which NCCL never runs: it needs
   two NVLS channels at least), or in one ``NETWORK_REDUCE`` on the scale-out switch that
   reaches them all (``collnet``: SHARP on InfiniBand);
3. **in the node**, the head hands the sum back to every rank -- by NVSwitch multicast
   (``nvls_tree``: a ``NETWORK_REDUCE`` from the head alone to the node, ``multimem.st``) or by
   point-to-point sends (``collnet``: ``directRecvCopyDirectSend``).

Every stage sends its chunks in order (``after``: a chunk waits for the previous one to be off
the wire, not for it to arrive), so the stages overlap as NCCL's warp groups do. On a GPU's
NVLink port an ``nvls_tree`` all-reduce carries ``S (1 + 1/H)`` each way, as NVLS in one node
does, and each head's NIC ``S / H`` each way (two nodes) -- which is why it beats the ring's
NIC-bound busbw across nodes (the ring sends ``2 (n-1)/n S`` through the NICs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from collsim.collectives.common import DEFAULT_CHUNK_BYTES, MAX_CHUNKS, BuildSpec, split_bounds
from collsim.collectives.layout import RankLayout
from collsim.collectives.schedule import Schedule, ScheduleBuilder
from collsim.collectives.tree import Tree, double_tree_parents, pipeline_chunk_cap

MAX_HEADS = 32
"""The most heads (slices) per node: NCCL's ``NCCL_MAX_NVLS_ARITY`` (``src/include/device.h``);
a 72-GPU NVLink domain uses 32 of its GPUs' NICs, spread over its trays."""


def head_count(layout: RankLayout) -> int:
    """Heads per node: every GPU of the smallest node (each with its NIC), at most
    :data:`MAX_HEADS`."""
    smallest = min(layout.ranks_per_node, layout.last_node_size)
    return max(1, min(MAX_HEADS, smallest))


def head_ranks(layout: RankLayout) -> np.ndarray:
    """``(nodes, H)``: the rank that is head ``h`` of node ``m``, at local index ``h * g // H``
    (spread over a node's GPUs, hence its NICs and trays)."""
    h_count = head_count(layout)
    rows = []
    for m in range(layout.nnodes):
        size = layout.node_size(m)
        rows.append(m * layout.ranks_per_node + np.arange(h_count) * size // h_count)
    return np.asarray(rows, dtype=np.int64)


def node_trees(layout: RankLayout) -> tuple[np.ndarray, np.ndarray]:
    """NCCL's two trees over the nodes (``ncclGetDtree``) as node parent arrays."""
    return double_tree_parents(layout.nnodes)


def chunk_cap(layout: RankLayout) -> int:
    """Chunks per slice at most: enough to fill the stages (node reduce, tree up and down,
    multicast) 16 times over, as :func:`~collsim.collectives.tree.pipeline_chunk_cap`; the
    schedule and the analytic model take the same cut."""
    parents = list(node_trees(layout))
    return pipeline_chunk_cap(parents, stages=2, floor=max(1, MAX_CHUNKS // 2), budget=None)


def _node_ranks(layout: RankLayout) -> list[tuple[int, ...]]:
    g = layout.ranks_per_node
    return [tuple(range(m * g, m * g + layout.node_size(m))) for m in range(layout.nnodes)]


NVLS_CHUNK_BYTES = 128 * 1024
"""The pipelining chunk of both, unless one is asked for: NCCL's ``NCCL_NVLS_CHUNKSIZE`` default
(``nvlsChunkSize``, 128 KiB; ``src/transport/nvls.cc``)."""


def tree_of(channel: int) -> int:
    """The tree (0 or 1) channel ``channel`` runs on: ``c % 2``, as NCCL's ``connectNvls``."""
    return channel % 2


def _nccl_chunk(spec: BuildSpec) -> BuildSpec:
    """``spec`` with NCCL's NVLS chunk where the caller left the default chunk."""
    if spec.chunk_bytes != DEFAULT_CHUNK_BYTES:
        return spec
    return dataclasses.replace(spec, chunk_bytes=NVLS_CHUNK_BYTES)


def _slices(spec: BuildSpec) -> Iterator[tuple[int, int, int, np.ndarray]]:
    """(channel, tree, head, chunk bounds) of every slice with data: each channel's share cut
    into one slice per head (NCCL's ``loopCount = nHeads * chunkCount``)."""
    h_count = head_count(spec.layout)
    cap = chunk_cap(spec.layout)
    for c, lo, cnt in spec.channel_pieces(spec.count):
        parts = lo + split_bounds(cnt, h_count)
        for h in range(h_count):
            size = int(parts[h + 1] - parts[h])
            if size:
                yield c, tree_of(c), h, spec.chunks(int(parts[h]), size, max_chunks=cap)


def build_nvls_tree(spec: BuildSpec) -> Schedule:
    """NVLS+tree all-reduce: NVSwitch reduce onto the heads, the double binary tree across
    nodes, NVSwitch multicast back (module docstring)."""
    b = ScheduleBuilder()
    spec = _nccl_chunk(spec)
    lay = spec.layout
    heads = head_ranks(lay)
    nodes = _node_ranks(lay)
    trees = [Tree.from_parents(p) for p in node_trees(lay)]
    for c, t, h, bounds in _slices(spec):
        tree = trees[t]
        x = heads[:, h]
        last_r = [-1] * lay.nnodes
        last_m = [-1] * lay.nnodes
        last_up: dict[int, int] = {}
        last_down: dict[int, int] = {}
        for k in range(bounds.size - 1):
            off, cnt = int(bounds[k]), int(bounds[k + 1] - bounds[k])
            red = [
                b.network_reduce(
                    nodes[m],
                    (int(x[m]),),
                    cnt,
                    "input",
                    off,
                    "scratch",
                    off,
                    channel=c,
                    after=last_r[m],
                )
                for m in range(lay.nnodes)
            ]
            last_r = red
            ready: list[int | tuple[int, ...]] = list(red)  # a head's subtree sum waits for
            for level in reversed(tree.levels[1:]):
                for m in level.tolist():
                    p = int(tree.parent[m])
                    op = b.transfer(int(x[m]), int(x[p]), cnt, "scratch", off, "scratch", off,
                                    reduce=True, deps=(*_deps(ready[m]), red[p]), channel=c,
                                    after=last_up.get(m, -1))  # fmt: skip
                    last_up[m] = op
                    ready[p] = (*_deps(ready[p]), op)
            final: list[int | tuple[int, ...]] = list(ready)
            for level in tree.levels[1:]:
                for m in level.tolist():
                    p = int(tree.parent[m])
                    op = b.transfer(int(x[p]), int(x[m]), cnt, "scratch", off, "scratch", off,
                                    deps=_deps(final[p]), channel=c,
                                    after=last_down.get(m, -1))  # fmt: skip
                    last_down[m] = op
                    final[m] = op
            last_m = [
                b.network_reduce(
                    (int(x[m]),),
                    nodes[m],
                    cnt,
                    "scratch",
                    off,
                    "output",
                    off,
                    deps=_deps(final[m]),
                    channel=c,
                    after=last_m[m],
                )
                for m in range(lay.nnodes)
            ]
    return spec.finish(b, in_network=True, heads=int(heads.shape[1]))


def _deps(x: int | tuple[int, ...]) -> tuple[int, ...]:
    """A head's sum as dependencies: its node reduce and every child's transfer into it."""
    return x if isinstance(x, tuple) else (x,)


def build_collnet(spec: BuildSpec) -> Schedule:
    """CollNet Direct all-reduce: every rank of a node sends each head its slice, which the head
    reduces as it arrives; the heads of a slice all-reduce it in one ``NETWORK_REDUCE`` on the
    scale-out switches that reach them all (SHARP); each head sends the sum back to its node."""
    b = ScheduleBuilder()
    spec = _nccl_chunk(spec)
    lay = spec.layout
    heads = head_ranks(lay)
    nodes = _node_ranks(lay)
    for c, _, h, bounds in _slices(spec):
        x = heads[:, h]
        heads_t = tuple(int(r) for r in x)
        last_up: dict[tuple[int, int], int] = {}
        last_down: dict[tuple[int, int], int] = {}
        last_net = -1
        for k in range(bounds.size - 1):
            off, cnt = int(bounds[k]), int(bounds[k + 1] - bounds[k])
            gathered: list[int] = []
            for m in range(lay.nnodes):
                for r in nodes[m]:
                    if r != x[m]:
                        op = b.transfer(r, int(x[m]), cnt, "input", off, "input", off,
                                        reduce=True, channel=c,
                                        after=last_up.get((m, r), -1))  # fmt: skip
                        last_up[(m, r)] = op
                        gathered.append(op)
            last_net = b.network_reduce(heads_t, heads_t, cnt, "input", off, "output", off,
                                        deps=gathered, channel=c, after=last_net)  # fmt: skip
            for m in range(lay.nnodes):
                for r in nodes[m]:
                    if r != x[m]:
                        last_down[(m, r)] = b.transfer(
                            int(x[m]), r, cnt, "output", off, "output", off, deps=(last_net,),
                            channel=c, after=last_down.get((m, r), -1),
                        )  # fmt: skip
    return spec.finish(b, in_network=True, heads=int(heads.shape[1]))
