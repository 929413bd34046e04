"""Closed forms of the tree family: NCCL's double binary tree all-reduce and the pipelined chain
and binary-tree broadcast / reduce (``collsim/collectives/tree.py``, ``pipeline.py``).

The schedules cut each tree's data into ``K`` pipeline chunks and every edge sends its chunks in
order, so a tree is a pipeline: chunk ``k`` crosses edge ``e`` once chunk ``k`` has crossed the
edge before it (plus ``e``'s latency) and chunk ``k - 1``'s bytes are off ``e`` (its latency
overlaps them). Each (chunk, edge) cell costs the chunk's bytes over the edge's share; the time
is the longest path through the (chunk x edge) grid, which runs along one root-to-leaf path
(paying each edge's latency once) and lingers ``K - 1`` cells at its slowest stage:

    T = fill(chunk) + (K - 1) * step(chunk)

* ``fill``: one chunk's longest path through the tree(s) -- up (reduce): ``t(x) = max over
  children t(c) + cost(x -> parent)``, a fused receive-reduce except the root's first child
  (plain into the root's output), then the root's local reduction; down (broadcast):
  ``t(x) = t(parent) + cost(parent -> x)``;
* ``step``: the slowest cell's bytes (edge, or the root's reduction, serialised on its GPU over
  the channels).

In steady state every edge of every tree and channel is busy at once, so the edges get their
max-min shares as one wave. Both ``fill`` and ``step`` are affine in the chunk's size, hence
lines (:func:`~collsim.model.envelope.discover`); :class:`Pipeline` combines them per size.
(The longest path can only be shorter when the slowest stage lies off the longest fill path.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from collsim.collectives.common import DEFAULT_CHUNK_BYTES, MAX_CHUNKS
from collsim.collectives.layout import RankLayout
from collsim.collectives.tree import (
    Tree,
    all_tree_parents,
    binary_tree_parents,
    chain_along,
    nccl_tree_parents,
    pipeline_chunk_cap,
)
from collsim.model.envelope import Aff, Lines, discover, evaluate
from collsim.model.flows import FlowCosts
from collsim.model.rings import ring_orders

Oracle = Callable[[float], Aff]

CHAIN_GRAIN_BYTES = {"LL": 512 * 8, "LL128": 20 * 1920}
"""How far a chain's data has advanced before the next rank forwards it, per protocol, where it
is finer than the chunk (bytes of payload per channel). NCCL's broadcast and reduce cut each
channel's part into chunks of one FIFO step (``BROADCAST_CHUNKSTEPS`` = ``REDUCE_CHUNKSTEPS`` = 1,
``src/include/collectives.h``; ``calcCollChunking``, ``src/enqueue.cc``): 512 KiB for Simple, whose
receiver waits for a whole slice's flag before it forwards the slice (``prims_simple.h``: the slice
is the chunk, ``SlicePerChunk`` = 1), so :data:`~collsim.collectives.common.DEFAULT_CHUNK_BYTES` is
its grain. LL and LL128 carry a flag in every line, and the receiver forwards each line as soon
as its flag arrives: LL one 16-byte line (8 bytes of data) per thread per trip of the thread
block, ``NCCL_LL_MAX_NTHREADS`` = 512 threads (``prims_ll.h``, ``src/include/device.h``): 4 KiB;
LL128 one warp slice of ``ncclProtoGrainSize(LL128)`` = 1920 data bytes per warp per trip, 20 warps
of ``NCCL_LL128_MAX_NTHREADS`` = 640 threads (``prims_ll128.h``): 37.5 KiB. A chain of ``n`` ranks
then fills in ``n - 1`` such grains, not ``n - 1`` whole chunks."""


def _heights(tree: Tree) -> np.ndarray:
    n = tree.parent.shape[0]
    h = np.zeros(n, dtype=np.int64)
    for level in reversed(tree.levels[1:]):
        np.maximum.at(h, tree.parent[level], h[level] + 1)
    return h


def _depths(tree: Tree) -> np.ndarray:
    d = np.zeros(tree.parent.shape[0], dtype=np.int64)
    for k, level in enumerate(tree.levels):
        d[level] = k
    return d


def _edge_costs(
    costs: FlowCosts, rows: list, n: int, frac: float, copies: list[int], *, steady: bool
) -> tuple[dict, dict]:
    """Per (tree, direction): each edge's latency and seconds per collective byte, indexed by
    the edge's child. ``steady``: all edges share links as one wave (pipeline steady state);
    otherwise wave by wave of ``rows``' slots, which also carry the link-load bound."""
    lat = {(r[0], r[3]): np.zeros(n) for r in rows}
    per_byte = {(r[0], r[3]): np.zeros(n) for r in rows}
    if steady:
        waves = [[(i, c, p, u) for i, c, p, u, _ in rows]]
    else:
        slots = np.unique(np.concatenate([r[4] for r in rows])) if rows else []
        waves = [[(i, c[s == k], p[s == k], u) for i, c, p, u, s in rows] for k in slots]
    for parts in waves:
        parts = [x for x in parts if x[1].size]
        if not parts:
            continue
        src = np.concatenate([c if u else p for _, c, p, u in parts])
        dst = np.concatenate([p if u else c for _, c, p, u in parts])
        w = np.concatenate([np.full(c.size, copies[i], dtype=np.float64) for i, c, _, _ in parts])
        if steady:
            wave = costs.wave(src, dst, w)
        else:
            wave = costs.wave(src, dst, w, load_bytes=frac * w, size=1.0)
        lo = 0
        for i, c, _, u in parts:
            hi = lo + c.size
            lat[(i, u)][c] = wave.lat_s[lo:hi]
            per_byte[(i, u)][c] = frac * wave.s_per_byte[lo:hi]
            lo = hi
    return lat, per_byte


@dataclass(frozen=True)
class Pipeline:
    """A chunk-pipelined family: its time from per-chunk lines (see the module docstring)."""

    fill: Lines
    step: Lines
    streams: int
    """Independent chunk streams the collective's bytes are split into (channels x trees)."""
    max_chunks: int
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    def chunks(self, size_bytes: np.ndarray) -> np.ndarray:
        """Chunks per stream at each size (as ``BuildSpec.chunks`` cuts them)."""
        per_stream = np.asarray(size_bytes, dtype=np.float64) / self.streams
        return np.clip(np.ceil(per_stream / self.chunk_bytes), 1, self.max_chunks)

    def time_s(
        self,
        size_bytes: np.ndarray,
        latency: float = 1.0,
        bandwidth: float = 1.0,
        stretch: np.ndarray | float = 1.0,
    ) -> np.ndarray:
        """Time at each size; ``latency`` scales intercepts and ``bandwidth`` divides slopes.

        ``k`` chunks as ``BuildSpec.chunks`` cuts them: whole chunks and a remainder, the first
        fills the pipeline and each later one adds a step at its own size; above ``max_chunks``,
        that many equal ones. (``fill`` and ``step`` take the collective size whose chunk is
        timed: a chunk of ``c`` bytes per stream is the chunk of a ``c x streams`` collective.)
        ``stretch`` multiplies the bytes each chunk moves (a profile's size efficiency), not
        where the buffer is cut."""
        size = np.asarray(size_bytes, dtype=np.float64)
        per_stream = size / self.streams
        whole = np.maximum(1.0, np.ceil(per_stream / self.chunk_bytes))
        k = np.minimum(whole, self.max_chunks)
        fill = Lines(self.fill.a_s * latency, self.fill.b_s_per_byte / bandwidth)
        step = Lines(self.step.a_s * latency, self.step.b_s_per_byte / bandwidth)
        grow = np.broadcast_to(np.asarray(stretch, dtype=np.float64), size.shape)
        x = size / k * grow
        equal = evaluate(fill, x) + (k - 1.0) * evaluate(step, x)
        c = float(self.chunk_bytes * self.streams)
        rest = np.maximum(size - (whole - 1.0) * c, 0.0) * grow
        cut = (
            evaluate(fill, c * grow)
            + np.maximum(whole - 2.0, 0.0) * evaluate(step, c * grow)
            + evaluate(step, rest)
        )
        return np.where((whole > self.max_chunks) | (whole <= 1.0), equal, cut)


def tree_family(
    costs: FlowCosts,
    parents: list[np.ndarray],
    frac: float,
    *,
    up: bool,
    down: bool,
    copies: list[int],
) -> tuple[Oracle, Oracle]:
    """The ``fill`` and ``step`` oracles of ``parents`` trees run together (reduce up and/or
    broadcast down), each a function of the collective size whose chunk is being timed.

    ``frac``: payload bytes per edge per collective byte (one tree's share of one channel);
    ``copies[i]``: how many channels run tree ``i`` (identical copies share its links).
    """
    trees = [Tree.from_parents(p) for p in parents]
    heights = [_heights(t) for t in trees]
    depths = [_depths(t) for t in trees]
    top = max(int(h[t.root]) for t, h in zip(trees, heights, strict=True)) + 1
    rows = []  # (tree, child, parent, is_up, slot)
    for i, (t, h, d) in enumerate(zip(trees, heights, depths, strict=True)):
        child = np.flatnonzero(t.parent >= 0)
        if up:
            rows.append((i, child, t.parent[child], True, h[child]))
        if down:
            rows.append((i, child, t.parent[child], False, d[child] + (top if up else 0)))
    n = trees[0].parent.shape[0]
    # The fill's chunk meets the edges wave by wave (an up edge's slot is its sender's height, a
    # down edge's the root's height plus its depth); in steady state every edge is busy at once.
    lone = _edge_costs(costs, rows, n, frac, copies, steady=False)
    busy = _edge_costs(costs, rows, n, frac, copies, steady=True)
    red = costs.reduce_bytes_per_s
    # Roots reduce their chunks on their GPU, serialised over every tree rooted there.
    rooted_at = np.zeros(n)
    for t, k in zip(trees, copies, strict=True):
        rooted_at[t.root] += k
    plans = []
    cells: list[Aff] = []
    for i, t in enumerate(trees):
        child = np.flatnonzero(t.parent >= 0)
        first = int(t.children[t.root, 0])
        root_red = rooted_at[t.root] * frac / red[t.root] if up else 0.0
        root_copy = frac / costs.copy_bytes_per_s[t.root] if (down and not up) else 0.0
        costs_of = []
        for lat, per_byte in (lone, busy):
            up_cost = down_cost = None
            if up:
                b = per_byte[(i, True)]
                fused = np.maximum(b, frac / red[np.maximum(t.parent, 0)])
                fused[first] = b[first]  # the root's first child delivers plain into the output
                fused[t.root] = 0.0
                up_cost = Aff(lat[(i, True)], np.where(t.parent >= 0, fused, 0.0))
            if down:
                down_cost = Aff(lat[(i, False)], per_byte[(i, False)])
            costs_of.append((up_cost, down_cost))
        (up_cost, down_cost), steady = costs_of
        # a chunk's latency overlaps the previous chunk's bytes on the edge (it follows it on the
        # connection): a stage's step is its bytes' time only
        cells += [Aff(np.zeros(child.size), c.b[child]) for c in steady if c is not None]
        cells.append(Aff.const(np.zeros(1), np.array([root_red + root_copy])))
        plans.append((t, up_cost, down_cost, root_red, root_copy))
    every = Aff(np.concatenate([c.a for c in cells]), np.concatenate([c.b for c in cells]))

    def step(s: float) -> Aff:
        return every.max(s)

    def fill(s: float) -> Aff:
        ends = []
        for t, up_cost, down_cost, root_red, root_copy in plans:
            n_t = t.parent.shape[0]
            done = Aff.zeros(n_t)
            if up_cost is not None:
                for level in reversed(t.levels):  # deepest first: children before parents
                    kids = t.children[level]
                    inn = Aff.zeros(level.size)
                    for col in range(kids.shape[1]):
                        ok = kids[:, col] >= 0
                        if ok.any():
                            cand = Aff(
                                np.where(ok, done.a[np.maximum(kids[:, col], 0)], 0.0),
                                np.where(ok, done.b[np.maximum(kids[:, col], 0)], 0.0),
                            )
                            inn = inn.maximum(cand, s)
                    done.a[level] = inn.a + up_cost.a[level]
                    done.b[level] = inn.b + up_cost.b[level]
                root_done = Aff(done.a[t.root] - up_cost.a[t.root], done.b[t.root] + root_red)
            else:
                root_done = Aff.const(0.0)
            ends.append(Aff(np.atleast_1d(root_done.a), np.atleast_1d(root_done.b)))
            if down_cost is not None:
                at = Aff.zeros(n_t)
                at.a[t.root], at.b[t.root] = root_done.a, root_done.b
                for level in t.levels[1:]:
                    par = t.parent[level]
                    at.a[level] = at.a[par] + down_cost.a[level]
                    at.b[level] = at.b[par] + down_cost.b[level]
                ends.append(at)
                ends.append(Aff.const(np.zeros(1), np.array([root_copy])))
            elif up_cost is not None:
                ends.append(done)
        return Aff(np.concatenate([e.a for e in ends]), np.concatenate([e.b for e in ends])).max(s)

    return fill, step


def _pipeline(oracles: tuple[Oracle, Oracle], streams: int, max_chunks: int) -> Pipeline:
    fill, step = oracles
    return Pipeline(discover(fill), discover(step), streams, max_chunks)


def double_tree(costs: FlowCosts, layout: RankLayout, channels: int) -> Pipeline:
    """NCCL's tree all-reduce: per channel two trees (:func:`nccl_tree_parents`), half of the
    channel's data each; channels whose trees coincide are copies sharing the same links."""
    distinct: dict[bytes, tuple[np.ndarray, int]] = {}
    for c in range(channels):
        for p in nccl_tree_parents(layout, c, channels):
            key = p.tobytes()
            tree, k = distinct.get(key, (p, 0))
            distinct[key] = (tree, k + 1)
    parents = [p for p, _ in distinct.values()]
    copies = [k for _, k in distinct.values()]
    oracles = tree_family(costs, parents, 0.5 / channels, up=True, down=True, copies=copies)
    cap = pipeline_chunk_cap(
        all_tree_parents(layout, channels), stages=2, floor=max(1, MAX_CHUNKS // 2), budget=None
    )
    return _pipeline(oracles, 2 * channels, cap)


def rooted(
    costs: FlowCosts, collective: str, algorithm: str, layout: RankLayout, channels: int
) -> Pipeline:
    """Pipelined chain / binary-tree broadcast or reduce from/to rank 0: a chain follows each
    channel's ring (as the schedules: :func:`~collsim.model.rings.ring_orders`), a binary tree
    takes the channel's heads (:func:`~collsim.collectives.tree.binary_tree_parents`); channels
    whose trees coincide are copies sharing the same links. The model, like nccl-tests' default,
    times root 0; the schedules take any root (``build_schedule(..., root=r)``), which on the
    bundled (node-symmetric) topologies moves the root's node in the heap over nodes and puts the
    root above its node's head, keeping the trees' depth."""
    n = layout.nranks
    if algorithm == "chain":
        orders = ring_orders(collective, n, channels, layout)
        chains = [chain_along(o if collective == "broadcast" else o[::-1], 0) for o in orders]
    else:
        chains = [binary_tree_parents(layout, c, channels, 0) for c in range(channels)]
    distinct: dict[bytes, tuple[np.ndarray, int]] = {}
    for p in chains:
        tree, k = distinct.get(p.tobytes(), (p, 0))
        distinct[p.tobytes()] = (tree, k + 1)
    parents = [p for p, _ in distinct.values()]
    copies = [k for _, k in distinct.values()]
    bcast = collective == "broadcast"
    oracles = tree_family(costs, parents, 1.0 / channels, up=not bcast, down=bcast, copies=copies)
    fill, step = oracles
    grain = CHAIN_GRAIN_BYTES.get(costs.protocol.name.upper(), DEFAULT_CHUNK_BYTES)
    cap = pipeline_chunk_cap(chains, budget=None)
    return Pipeline(discover(fill), discover(step), channels, cap, grain)
