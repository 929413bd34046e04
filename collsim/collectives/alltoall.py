"""All-to-all: block ``j`` of rank ``i``'s input lands in block ``i`` of rank ``j``'s output.

* ``direct``: NCCL's grouped send-recv (``ncclGroupStart``, a send and a receive per peer), in
  NCCL's peer order (:func:`p2p_peers`: node by node, so that the rounds in flight together
  spread over the NICs), and the rounds go on NCCL's ``C`` peer-to-peer channels: round ``k`` on
  channel ``k mod C``, where it waits for that channel's previous round (send and receive), so
  ``C`` rounds are in flight at once (``C = 1``: the classic step-synchronous pairwise exchange of
  MPICH). Each round carries whole blocks. With more channels than peers (``C > n - 1``) each
  peer's round stands for ``C / (n - 1)`` channels (schedule ``meta["channels_per_transfer"]``),
  as NCCL spreads its ``p2pnChannels`` over the peers in flight: fewer channels per peer the
  more peers there are. Both are marked ``point_to_point`` (NCCL's per-channel point-to-point
  rate over the network, :mod:`collsim.channel_rates`).
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


def p2p_peers(n: int, per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """``(send, recv)``, each ``(n, n)``: whom rank ``r`` sends to and receives from in round
    ``t`` (round 0: itself). NCCL's peer-to-peer schedule (``src/init.cc``, p2pSchedule): nodes
    ``delta = t // L`` apart, local ranks ``t mod L`` apart (``L`` ranks per node), so each
    round pairs every node with one other node and every GPU with a GPU of another rail: the
    rounds in flight together load every NIC alike. Nodes of unequal size: ``r + t``."""
    r = np.arange(n, dtype=np.int64)
    t = np.arange(n, dtype=np.int64)[:, None]
    if per_node < 1 or n % per_node:
        return (r + t) % n, (r - t) % n
    nodes = n // per_node
    node, local = r // per_node, r % per_node
    dn, dl = t // per_node, t % per_node
    send = ((node + dn) % nodes) * per_node + (local + dl) % per_node
    recv = ((node - dn) % nodes) * per_node + (local - dl) % per_node
    return send, recv


def _pairwise(b: ScheduleBuilder, n: int, per_node: int, blk: int, lanes: int) -> None:
    """Rounds ``1..n-1`` of whole blocks in NCCL's peer order, round ``k`` on channel
    ``k mod lanes`` after that channel's previous round (its send and its receive)."""
    r = np.arange(n, dtype=np.int64)
    send, _ = p2p_peers(n, per_node)
    self_copy(b, r, blk, "input", r * blk, "output", r * blk, np.full((n, 0), -1), 0)
    sent: dict[int, np.ndarray] = {}
    for k in range(1, n):
        dst = send[k]
        before = k - lanes  # the round this channel ran last: its send, and its receive
        deps = None
        if before >= 1:
            into = np.empty(n, dtype=np.int64)
            into[send[before]] = sent[before]  # the transfer of that round into each rank
            deps = np.stack([sent[before], into], axis=1)
        sent[k] = b.transfers(
            r, dst, blk, "input", dst * blk, "output", r * blk, deps=deps, channel=k % lanes
        )


def build_direct(spec: BuildSpec) -> Schedule:
    """NCCL's grouped send-recv: ``n - 1`` rounds, ``channels`` of them in flight at once."""
    b = ScheduleBuilder()
    lanes = min(spec.channels, max(1, spec.nranks - 1))
    if spec.block:
        _pairwise(b, spec.nranks, spec.layout.ranks_per_node, spec.block, lanes)
    return spec.finish(b, point_to_point=True, channels_per_transfer=spec.channels / lanes)


def build_hierarchical(spec: BuildSpec) -> Schedule:
    """Intra-node hand-off to relays, then one aggregated inter-node message per relay and peer."""
    n, blk, lay = spec.nranks, spec.block, spec.layout
    lpn, nn = lay.ranks_per_node, lay.nnodes
    if lpn == 1 or nn == 1:
        b = ScheduleBuilder()
        lanes = min(spec.channels, max(1, n - 1))
        if blk:
            _pairwise(b, n, lpn, blk, lanes)
        return spec.finish(b, fallback="direct", point_to_point=True,
                           channels_per_transfer=spec.channels / lanes)  # fmt: skip
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
    return spec.finish(b, point_to_point=True)
