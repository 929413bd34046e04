"""All-to-all: block ``j`` of rank ``i``'s input lands in block ``i`` of rank ``j``'s output.

* ``direct``: the pairwise exchange of MPICH / NCCL's grouped send-recv, shifted so that round
  ``k`` pairs rank ``r`` with ``r + k`` (sending) and ``r - k`` (receiving); a rank's round ``k``
  send waits for its round ``k - 1`` send and receive, the classic step-synchronous schedule.
* ``hierarchical``: two-hop aggregation (as in the 2D all-to-all of Horovod/DeepEP-style MoE
  dispatch and of Sanders & Träff's hierarchical all-to-all): each rank first hands, inside its
  node, every block bound for another node to the *relay* -- the rank of its node with the
  destination's local index -- then each relay sends one aggregated message per destination
  (everything its node has for it) across nodes. Inter-node messages drop from ``n - L`` to
  ``N - 1`` per rank and grow ``L``-fold. Blocks for the own node go directly. With one rank per
  node, or a single node, it is the direct algorithm.
"""

from __future__ import annotations

import numpy as np

from collsim.collectives.common import BuildSpec, self_copy
from collsim.collectives.schedule import Schedule, ScheduleBuilder


def _pairwise(b: ScheduleBuilder, n: int, blk: int, lo: int, cnt: int, channel: int) -> None:
    r = np.arange(n, dtype=np.int64)
    self_copy(
        b, r, cnt, "input", r * blk + lo, "output", r * blk + lo, np.full((n, 0), -1), channel
    )
    prev = None
    for k in range(1, n):
        dst = (r + k) % n
        # Wait for this rank's previous send and its previous receive (from r - k + 1).
        deps = None if prev is None else np.stack([prev, prev[(r - k + 1) % n]], axis=1)
        prev = b.transfers(
            r, dst, cnt, "input", dst * blk + lo, "output", r * blk + lo, deps=deps, channel=channel
        )


def build_direct(spec: BuildSpec) -> Schedule:
    """Pairwise-exchange all-to-all, ``n - 1`` shifted rounds per channel."""
    b = ScheduleBuilder()
    for c, lo, cnt in spec.channel_pieces(spec.block):
        _pairwise(b, spec.nranks, spec.block, lo, cnt, c)
    return spec.finish(b)


def build_hierarchical(spec: BuildSpec) -> Schedule:
    """Intra-node hand-off to relays, then one aggregated inter-node message per relay and peer."""
    n, blk, lay = spec.nranks, spec.block, spec.layout
    lpn, nn = lay.ranks_per_node, lay.nnodes
    if lpn == 1 or nn == 1:
        b = ScheduleBuilder()
        for c, lo, cnt in spec.channel_pieces(blk):
            _pairwise(b, n, blk, lo, cnt, c)
        return spec.finish(b, fallback="direct")
    b = ScheduleBuilder()
    r = np.arange(n, dtype=np.int64)
    node, local = r // lpn, r % lpn
    size = np.where(node == nn - 1, lay.last_node_size, lpn)
    src, dst = np.meshgrid(r, r, indexing="ij")  # every (source, destination) pair
    same = node[src] == node[dst]
    relay = node[src] * lpn + local[dst] % size[src]
    slot = (dst * lpn + local[src]) * blk  # scratch slot at the relay, laid out like the output
    for c, lo, cnt in spec.channel_pieces(blk):
        # Hop 1: own-node blocks straight to the destination, the rest to the relay's scratch.
        s, d = src[same], dst[same]
        b.transfers(s, d, cnt, "input", d * blk + lo, "output", s * blk + lo, channel=c)
        s, d = src[~same], dst[~same]
        hop1 = np.full((n, n), -1, dtype=np.int64)
        hop1[s, d] = b.transfers(
            s, relay[s, d], cnt, "input", d * blk + lo, "scratch", slot[s, d] + lo, channel=c
        )
        # Hop 2: relay h of node k sends node k's blocks for d in one message when a channel's
        # share is the whole block (contiguous), else one message per source block.
        k_nodes, dests = np.meshgrid(np.arange(nn), r, indexing="ij")
        keep = node[dests] != k_nodes
        k_nodes, dests = k_nodes[keep], dests[keep]
        first = k_nodes * lpn
        ksize = np.where(k_nodes == nn - 1, lay.last_node_size, lpn)
        h = first + local[dests] % ksize
        srcs = first[:, None] + np.arange(lpn)[None, :]
        valid = np.arange(lpn)[None, :] < ksize[:, None]
        deps = np.where(valid, hop1[np.minimum(srcs, n - 1), dests[:, None]], -1)
        if cnt == blk:
            b.transfers(
                h, dests, ksize * blk, "scratch", dests * lpn * blk, "output", first * blk,
                deps=deps, channel=c,
            )  # fmt: skip
        else:
            m = valid.sum()
            s_all = srcs[valid]
            hh = np.broadcast_to(h[:, None], srcs.shape)[valid]
            dd = np.broadcast_to(dests[:, None], srcs.shape)[valid]
            b.transfers(
                hh, dd, cnt, "scratch", slot[s_all, dd] + lo, "output", s_all * blk + lo,
                deps=hop1[s_all, dd].reshape(m, 1), channel=c,
            )  # fmt: skip
    return spec.finish(b)
