"""Pipelined broadcast and reduce from/to a root: a chain (NCCL's ring broadcast/reduce) or a tree.

* ``chain``: each channel's ring (:func:`~collsim.collectives.ring.ring_order`, the all-reduce's
  rings), followed from the root, forms a pipeline; each chunk hops along it, so a message of
  ``K`` chunks takes ``n - 1 + K - 1`` chunk-steps (NCCL's ``ncclBroadcast`` and ``ncclReduce``
  run exactly this on their rings). Channels whose rings leave nodes through other NICs spread
  over them.
* ``tree``: a binary tree rooted at ``root``, pipelined by chunks: ``log2 n`` depth, but inner
  ranks send each chunk twice (MPICH's binary pipelined trees). It is topology-aware
  (:func:`~collsim.collectives.tree.binary_tree_parents`): a binary tree over nodes between one
  head rank per node, and one inside each node; each channel takes other heads, so channels
  spread over the NICs as the chain's do.

Both reuse :func:`~collsim.collectives.tree.tree_broadcast` / ``tree_reduce`` with a different
parent array.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collsim.collectives.common import BuildSpec
from collsim.collectives.ring import ring_order
from collsim.collectives.schedule import Schedule, ScheduleBuilder
from collsim.collectives.tree import (
    Tree,
    binary_tree_parents,
    chain_along,
    pipeline_chunk_cap,
    tree_broadcast,
    tree_reduce,
)

ParentFn = Callable[[BuildSpec, int], np.ndarray]
"""The tree of one channel: (request, channel) -> parent array."""


def _ring_chain(spec: BuildSpec, channel: int) -> np.ndarray:
    # Data flows forward along the ring: a broadcast from the root on, a reduce from the root's
    # successor round to the root (each rank's parent is then its successor).
    order = ring_order(spec, channel).ravel()
    return chain_along(order if spec.collective == "broadcast" else order[::-1], spec.root)


def _binary(spec: BuildSpec, channel: int) -> np.ndarray:
    return binary_tree_parents(spec.layout, channel, spec.channels, spec.root)


def _trees(spec: BuildSpec, parents: ParentFn) -> tuple[list[Tree], int]:
    ps = [parents(spec, c) for c in range(spec.channels)]
    return [Tree.from_parents(p) for p in ps], pipeline_chunk_cap(ps)


def _broadcast(spec: BuildSpec, parents: ParentFn) -> Schedule:
    b = ScheduleBuilder()
    trees, cap = _trees(spec, parents)
    for c, lo, cnt in spec.channel_pieces(spec.count):
        bounds = spec.chunks(lo, cnt, max_chunks=cap)
        tree_broadcast(b, trees[c], bounds, src_buf="input", channel=c, copy_root=True)
    return spec.finish(b)


def _reduce(spec: BuildSpec, parents: ParentFn) -> Schedule:
    b = ScheduleBuilder()
    trees, cap = _trees(spec, parents)
    for c, lo, cnt in spec.channel_pieces(spec.count):
        tree_reduce(b, trees[c], spec.chunks(lo, cnt, max_chunks=cap), channel=c)
    return spec.finish(b)


def build_broadcast_chain(spec: BuildSpec) -> Schedule:
    """Pipelined chain broadcast from the root."""
    return _broadcast(spec, _ring_chain)


def build_broadcast_tree(spec: BuildSpec) -> Schedule:
    """Pipelined binary-tree broadcast from the root."""
    return _broadcast(spec, _binary)


def build_reduce_chain(spec: BuildSpec) -> Schedule:
    """Pipelined chain reduce into the root (partial sums flow back along the chain)."""
    return _reduce(spec, _ring_chain)


def build_reduce_tree(spec: BuildSpec) -> Schedule:
    """Pipelined binary-tree reduce into the root."""
    return _reduce(spec, _binary)
