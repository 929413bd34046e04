"""Hierarchical (two-level) algorithms: fast intra-node rings around an inter-node exchange.

all_reduce (NCCL's "2D"/hierarchical all-reduce; Horovod's hierarchical allreduce; Jia et al.
2018): intra-node ring reduce-scatter -> inter-node all-reduce of each rank's reduced block among
the ranks with the same local index -> intra-node ring all-gather. Only ``1/L`` of the buffer
crosses nodes per rank. The inter-node phase is Rabenseifner's recursive halving-doubling
(``recursive.py``): ``2 log2 N`` steps instead of the ring's ``2(N - 1)``, which keeps a 16k-rank
schedule at a few hundred thousand operations. ``ring2d`` is the same skeleton with a ring there.

all_gather: inter-node ring all-gather among same-local-index ranks, then an intra-node ring
all-gather of what each rank collected. reduce_scatter: the mirror image (intra-node first, in
place in the input, then inter-node). Their intra-node blocks are strided (one piece per node).

Partial last node (``nranks % ranks_per_node != 0``): its ``L'`` ranks stand in for the missing
local indices, local rank ``l'`` taking indices ``l' + t L'`` (so it joins several inter-node
groups and owns several intra-node pieces). With one rank per node or a single node the
algorithms reduce to the flat ring.
"""

from __future__ import annotations

import numpy as np

from collsim.collectives.common import BuildSpec, merge_by_rank, split_even
from collsim.collectives.recursive import Fold, rhd_all_reduce
from collsim.collectives.ring import (
    RingBlocks,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)
from collsim.collectives.ring import build_all_gather as flat_all_gather
from collsim.collectives.ring import build_all_reduce as flat_all_reduce
from collsim.collectives.ring import build_reduce_scatter as flat_reduce_scatter
from collsim.collectives.schedule import Schedule, ScheduleBuilder


class Nodes:
    """``n`` ranks on nodes of ``L``: the intra-node rings and the inter-node groups."""

    def __init__(self, n: int, per_node: int) -> None:
        self.n, self.L = n, per_node
        self.N = -(-n // per_node)
        self.last = n - (self.N - 1) * per_node
        full = self.N if self.last == per_node else self.N - 1
        # Intra-node rings (ranks (R, m)) with the local indices each position stands for (m, P).
        self.rings: list[tuple[np.ndarray, np.ndarray]] = []
        if full:
            self.rings.append(
                (np.arange(full * per_node).reshape(full, per_node), np.arange(per_node)[:, None])
            )
        if self.last < per_node:
            p = -(-per_node // self.last)
            idx = np.arange(self.last)[:, None] + self.last * np.arange(p)[None, :]
            ranks = (self.N - 1) * per_node + np.arange(self.last)[None, :]
            self.rings.append((ranks, np.where(idx < per_node, idx, -1)))
        # Inter-node groups: group l holds node k's stand-in for local index l, (L, N).
        k, loc = np.meshgrid(np.arange(self.N), np.arange(per_node))
        self.groups = np.where(k == self.N - 1, k * per_node + loc % self.last, k * per_node + loc)

    @property
    def flat(self) -> bool:
        return self.L == 1 or self.N == 1

    def owner(self) -> tuple[np.ndarray, np.ndarray]:
        """Rank whose block group member (l, k) stands for, and whether it exists, (L, N)."""
        k, loc = np.meshgrid(np.arange(self.N), np.arange(self.L))
        q = k * self.L + loc
        return np.minimum(q, self.n - 1), q < self.n

    def strided(self, owned: np.ndarray, blk: int, lo: int, cnt: int) -> tuple[np.ndarray, ...]:
        """(count, offset) of the pieces (node k', local l) for each position's local indices."""
        q = np.arange(self.N)[None, None, :] * self.L + owned[:, :, None]
        ok = (owned[:, :, None] >= 0) & (q < self.n)
        m = owned.shape[0]
        return (
            np.where(ok, cnt, 0).reshape(m, -1),
            np.where(ok, q * blk + lo, 0).reshape(m, -1),
        )


def two_level_all_reduce(spec: BuildSpec, node_size: int, inter: str) -> Schedule:
    """Intra-node reduce-scatter, inter-node all-reduce (``inter``: "rhd" or "ring"), all-gather."""
    nodes = Nodes(spec.nranks, node_size)
    if nodes.flat and inter == "ring":
        return flat_all_reduce(spec)
    b = ScheduleBuilder()
    n, per_node = spec.nranks, node_size
    for c, lo, cnt in spec.channel_pieces(spec.count):
        if nodes.flat:  # one rank per node, or a single node
            _inter_all_reduce(b, np.arange(n)[None], np.array([lo]), np.array([cnt]), "input",
                              inter if nodes.N > 1 else "ring", c, None)  # fmt: skip
            continue
        boffs, bcnts = split_even(cnt, per_node)
        boffs = boffs + lo
        blocks = []
        for ranks, owned in nodes.rings:
            ok = owned >= 0
            bc = np.where(ok, bcnts[owned], 0)
            bo = np.where(ok, boffs[owned], lo)
            blocks.append(RingBlocks.of(ranks, bc[None], bo[None], bo[None]))
        parts = []
        for blk in blocks:
            d = ring_reduce_scatter(b, blk, acc_buf="input", dst_buf="output", channel=c)
            parts.append((blk.ranks, d))
        ready = merge_by_rank(n, parts)
        g = nodes.groups
        done = _inter_all_reduce(b, g, boffs, bcnts, "output", inter, c, ready[g])
        ready = merge_by_rank(n, [(g, done)])
        for blk in blocks:
            ring_all_gather(
                b, blk, own_buf="output", dst_buf="output", channel=c, ready=ready[blk.ranks]
            )
    return spec.finish(b, inter=inter)


def _inter_all_reduce(
    b: ScheduleBuilder,
    groups: np.ndarray,
    offs: np.ndarray,
    cnts: np.ndarray,
    acc_buf: str,
    inter: str,
    channel: int,
    ready: np.ndarray | None,
) -> np.ndarray:
    """All-reduce region ``offs[g]:+cnts[g]`` within each group ``g`` of ``groups`` (G, m)."""
    m = groups.shape[1]
    parts = Fold(m).p if inter == "rhd" else m
    bounds = offs[:, None] + (cnts[:, None] * np.arange(parts + 1)[None, :]) // parts
    if inter == "rhd":
        return rhd_all_reduce(
            b, groups, bounds, acc_buf=acc_buf, dst_buf="output", channel=channel, ready=ready
        )
    so = bounds[:, :-1]
    blk = RingBlocks.of(groups, np.diff(bounds, axis=1), so, so)
    return ring_all_reduce(b, blk, acc_buf=acc_buf, dst_buf="output", channel=channel, ready=ready)


def build_all_reduce(spec: BuildSpec) -> Schedule:
    """Hierarchical all-reduce with recursive halving-doubling between nodes."""
    return two_level_all_reduce(spec, spec.layout.ranks_per_node, "rhd")


def build_all_gather(spec: BuildSpec) -> Schedule:
    """Inter-node ring all-gather per local index, then intra-node ring all-gather."""
    nodes = Nodes(spec.nranks, spec.layout.ranks_per_node)
    if nodes.flat:
        return flat_all_gather(spec)
    b = ScheduleBuilder()
    n, blk_n = spec.nranks, spec.block
    q, ok = nodes.owner()
    for c, lo, cnt in spec.channel_pieces(blk_n):
        inter = RingBlocks.of(
            nodes.groups,
            np.where(ok, cnt, 0),
            np.full(q.shape, lo),
            np.where(ok, q * blk_n + lo, 0),
        )
        done = ring_all_gather(b, inter, own_buf="input", dst_buf="output", channel=c)
        ready = merge_by_rank(n, [(nodes.groups, done)])
        for ranks, owned in nodes.rings:
            pc, po = nodes.strided(owned, blk_n, lo, cnt)
            intra = RingBlocks.of(ranks, pc[None], po[None], po[None])
            ring_all_gather(
                b, intra, own_buf="output", dst_buf="output", channel=c, ready=ready[ranks]
            )
    return spec.finish(b)


def build_reduce_scatter(spec: BuildSpec) -> Schedule:
    """Intra-node ring reduce-scatter (in the input), then inter-node ring reduce-scatter."""
    nodes = Nodes(spec.nranks, spec.layout.ranks_per_node)
    if nodes.flat:
        return flat_reduce_scatter(spec)
    b = ScheduleBuilder()
    n, blk_n = spec.nranks, spec.block
    q, ok = nodes.owner()
    for c, lo, cnt in spec.channel_pieces(blk_n):
        parts = []
        for ranks, owned in nodes.rings:
            pc, po = nodes.strided(owned, blk_n, lo, cnt)
            intra = RingBlocks.of(ranks, pc[None], po[None], po[None])
            d = ring_reduce_scatter(b, intra, acc_buf="input", dst_buf="input", channel=c)
            parts.append((ranks, d))
        ready = merge_by_rank(n, parts)
        inter = RingBlocks.of(
            nodes.groups,
            np.where(ok, cnt, 0),
            np.where(ok, q * blk_n + lo, 0),
            np.full(q.shape, lo),
        )
        ring_reduce_scatter(
            b, inter, acc_buf="input", dst_buf="output", channel=c, ready=ready[nodes.groups]
        )
    return spec.finish(b)
