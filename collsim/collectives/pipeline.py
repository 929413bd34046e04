"""Pipelined broadcast and reduce from/to a root: a chain (NCCL's ring broadcast/reduce) or a tree.

* ``chain``: the ranks ``root, root+1, ...`` form a pipeline; each chunk hops along it, so a
  message of ``K`` chunks takes ``n - 1 + K - 1`` chunk-steps (NCCL's ``ncclBroadcast`` and
  ``ncclReduce`` run exactly this on their ring).
* ``tree``: a balanced binary tree rooted at ``root``, pipelined by chunks: ``log2 n`` depth, but
  inner ranks send each chunk twice (MPICH's binomial/binary pipelined trees).

Both reuse :func:`~collsim.collectives.tree.tree_broadcast` / ``tree_reduce`` with a different
parent array.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collsim.collectives.common import BuildSpec
from collsim.collectives.schedule import Schedule, ScheduleBuilder
from collsim.collectives.tree import (
    Tree,
    chain_parents,
    heap_parents,
    pipeline_chunk_cap,
    tree_broadcast,
    tree_reduce,
)

ParentFn = Callable[[int, int], np.ndarray]


def _broadcast(spec: BuildSpec, parents: ParentFn) -> Schedule:
    b = ScheduleBuilder()
    p = parents(spec.nranks, spec.root)
    tree, cap = Tree.from_parents(p), pipeline_chunk_cap([p])
    for c, lo, cnt in spec.channel_pieces(spec.count):
        bounds = spec.chunks(lo, cnt, max_chunks=cap)
        tree_broadcast(b, tree, bounds, src_buf="input", channel=c, copy_root=True)
    return spec.finish(b)


def _reduce(spec: BuildSpec, parents: ParentFn) -> Schedule:
    b = ScheduleBuilder()
    p = parents(spec.nranks, spec.root)
    tree, cap = Tree.from_parents(p), pipeline_chunk_cap([p])
    for c, lo, cnt in spec.channel_pieces(spec.count):
        tree_reduce(b, tree, spec.chunks(lo, cnt, max_chunks=cap), channel=c)
    return spec.finish(b)


def build_broadcast_chain(spec: BuildSpec) -> Schedule:
    """Pipelined chain broadcast from the root."""
    return _broadcast(spec, chain_parents)


def build_broadcast_tree(spec: BuildSpec) -> Schedule:
    """Pipelined binary-tree broadcast from the root."""
    return _broadcast(spec, heap_parents)


def build_reduce_chain(spec: BuildSpec) -> Schedule:
    """Pipelined chain reduce into the root (partial sums flow back along the chain)."""
    return _reduce(spec, chain_parents)


def build_reduce_tree(spec: BuildSpec) -> Schedule:
    """Pipelined binary-tree reduce into the root."""
    return _reduce(spec, heap_parents)
