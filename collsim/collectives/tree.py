"""Trees: NCCL's double binary tree all-reduce, and pipelined reduce-up / broadcast-down helpers.

Double binary tree (NCCL 2.4, after Sanders, Speck & Träff, "Two-tree algorithms for full
bandwidth broadcast, reduction and scan", Parallel Computing 2009): two binary trees, built so
that a member is a leaf in one where it is an inner node in the other; each tree carries half the
data, so every member sends and receives about the whole buffer once up and once down, at
logarithmic latency. Tree 0 is NCCL's ``ncclGetBtree``; tree 1 is its mirror image (even ``n``)
or its shift by one (odd ``n``), as in ``ncclGetDtree``. As in NCCL the trees span *nodes*:
inside a node the ranks form a chain below a head rank, and each channel picks another head
(:func:`nccl_tree_parents`), so channels spread over the nodes' NICs.

Each half is cut into pipeline chunks (``chunk_bytes``); chunk ``k`` goes up the tree (children
reduce into their parent, NCCL's recvReduceSend, as ``reduce=True`` transfers into the parent's
input) and then down from the root (recvCopySend). Every edge sends its chunks in order, and an
engine overlaps chunk ``k`` going down with chunk ``k + 1`` going up.

:func:`tree_reduce` and :func:`tree_broadcast` take any parent array, so the pipelined chain and
binary-tree broadcast/reduce (``pipeline.py``) use them too. They emit one numpy batch per tree
level.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from collsim.collectives.common import (
    MAX_CHUNKS,
    PIPELINE_BUDGET,
    PIPELINE_FILL,
    BuildSpec,
    add_reductions,
    self_copy,
    split_bounds,
)
from collsim.collectives.layout import RankLayout
from collsim.collectives.schedule import Schedule, ScheduleBuilder


@dataclass(frozen=True)
class Tree:
    """A rooted tree over ranks: ``parent`` (-1 at the root), children and depth levels."""

    parent: np.ndarray
    children: np.ndarray  # (n, max_children), padded with -1; first child first
    levels: tuple[np.ndarray, ...]  # levels[d]: ranks at depth d (levels[0] == [root])

    @property
    def root(self) -> int:
        return int(self.levels[0][0])

    @classmethod
    def from_parents(cls, parent: np.ndarray) -> Tree:
        parent = np.asarray(parent, dtype=np.int64)
        n = parent.shape[0]
        depth = np.full(n, -1, dtype=np.int64)
        depth[parent < 0] = 0
        par = parent.tolist()
        dep = depth.tolist()
        for x in range(n):
            path = []
            while dep[x] < 0:
                path.append(x)
                x = par[x]
                if len(path) > n:
                    raise ValueError("parent array has a cycle")
            d = dep[x]
            for y in reversed(path):
                d += 1
                dep[y] = d
        depth = np.asarray(dep, dtype=np.int64)
        order = np.argsort(depth, kind="stable")
        levels = tuple(order[depth[order] == d] for d in range(int(depth.max()) + 1))
        kids: list[list[int]] = [[] for _ in range(n)]
        for x in range(n):
            if par[x] >= 0:
                kids[par[x]].append(x)
        width = max(1, max(len(k) for k in kids))
        children = np.full((n, width), -1, dtype=np.int64)
        for x, k in enumerate(kids):
            children[x, : len(k)] = k
        return cls(parent, children, levels)


def btree_parents(n: int) -> np.ndarray:
    """NCCL's ``ncclGetBtree`` rooted at rank 0 (the root has a single child)."""
    parent = np.full(n, -1, dtype=np.int64)
    for rank in range(1, n):
        bit = 1
        while bit < n and not bit & rank:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        parent[rank] = up if up < n else rank ^ bit
    return parent


def double_tree_parents(n: int) -> tuple[np.ndarray, np.ndarray]:
    """NCCL's ``ncclGetDtree``: the btree and its mirror (even n) or shift by one (odd n)."""
    t0 = btree_parents(n)
    r = np.arange(n)
    if n % 2:
        src = t0[(r - 1) % n]
        t1 = np.where(src < 0, -1, (src + 1) % n)
    else:
        src = t0[n - 1 - r]
        t1 = np.where(src < 0, -1, n - 1 - src)
    return t0, t1


def nccl_tree_parents(
    layout: RankLayout, channel: int, channels: int
) -> tuple[np.ndarray, np.ndarray]:
    """NCCL's two trees of one channel over ranks: a chain inside each node, a double binary
    tree (:func:`double_tree_parents`) over the nodes between the chains' heads.

    As NCCL builds them (``ncclTopoPreset`` / ``connectTrees``): inside a node the ranks form a
    chain that hangs off one *head* rank, and only heads talk across nodes. Channel ``c`` of
    ``C`` starts its chain at local index ``c * g // C`` (as :func:`~collsim.collectives.ring.
    ring_order` rotates its rings), so channels leave their nodes through different GPUs and so
    different NICs; the chain follows the channel's local cycle (direct links only on a mesh
    such as the DGX-1's: :meth:`~collsim.collectives.layout.RankLayout.local_cycle`). One rank
    per node gives NCCL's plain double binary tree; one node, a chain.
    """
    n, nodes = layout.nranks, layout.nnodes
    heads = np.zeros(nodes, dtype=np.int64)
    chain = np.full(n, -1, dtype=np.int64)  # intra-node parents
    for m, order in enumerate(_node_orders(layout, channel, channels)):
        heads[m] = order[0]
        chain[order[1:]] = order[:-1]
    trees = []
    for node_parent in double_tree_parents(nodes):
        parent = chain.copy()
        up = node_parent >= 0
        parent[heads[up]] = heads[node_parent[up]]
        trees.append(parent)
    return trees[0], trees[1]


def _node_orders(layout: RankLayout, channel: int, channels: int) -> list[np.ndarray]:
    """Each node's ranks in the order ``channel``'s tree takes them, its head first: from local
    index ``entry`` (channels leave by the NICs in turn) along the channel's direct-link cycle on
    a mesh, rank order elsewhere and on a partial last node."""
    g = layout.ranks_per_node
    a = layout.entry(channel, channels)
    cycle = layout.local_cycle(channel)
    local = cycle[(int(np.flatnonzero(cycle == a)[0]) + np.arange(g)) % g]
    out = []
    for m in range(layout.nnodes):
        size = layout.node_size(m)
        out.append(m * g + (local if size == g else (a + np.arange(size)) % size))
    return out


def binary_tree_parents(layout: RankLayout, channel: int, channels: int, root: int) -> np.ndarray:
    """The binary tree of the pipelined tree broadcast / reduce on ``channel`` of ``channels``
    from ``root``: a binary tree over the nodes (heap order from the root's node) between one
    head rank per node, and a binary tree inside each node over its direct links.

    Heads are picked per channel as NCCL's trees pick them (:func:`_node_orders`), so channels
    cross the network through different GPUs and NICs rather than all through the same ones. A
    node's tree hangs from its head, except the root's, which hangs from the root with its head
    as near the top as the links allow (next to it on a switch): hanging it from the head and
    turning the path to the root round made it deeper (5 levels instead of 3 on 8 GPUs, a third
    more latency). A head sends each chunk to up to two other nodes and two GPUs of its own."""
    n = layout.nranks
    parent = np.full(n, -1, dtype=np.int64)
    orders = _node_orders(layout, channel, channels)
    heads = np.array([o[0] for o in orders], dtype=np.int64)
    top = layout.node_of(root)
    for m, order in enumerate(orders):
        if m == top:
            order = np.r_[root, order[order != root]]
        parent[order[1:]] = order[_spanning_parents(order - m * layout.ranks_per_node, layout)]
    node_parent = heap_parents(layout.nnodes, top)
    up = node_parent >= 0
    parent[heads[up]] = heads[node_parent[up]]
    return parent


def _spanning_parents(local: np.ndarray, layout: RankLayout) -> np.ndarray:
    """A binary tree over a node's ranks (local indices, top first, in order of preference) by
    direct links: each rank, breadth first, adopts the first two unplaced ranks it links to
    directly. Returns each non-top rank's parent as a position in ``local``.

    Where every pair is linked (a switch, or no mesh known) this is heap order. On a mesh
    (:attr:`~collsim.collectives.layout.RankLayout.local_rings`, as on the DGX-1's hybrid cube
    mesh) only the rings' links count, so no edge detours over PCIe; a rank no tree member can
    adopt within two children joins the least-loaded linked member."""
    g = local.size
    if not layout.local_rings or g != layout.ranks_per_node:
        return (np.arange(1, g) - 1) // 2
    near = _linked(layout.local_rings)[np.ix_(local, local)]  # by position
    par = np.full(g, -1, dtype=np.int64)
    kids = np.zeros(g, dtype=np.int64)
    placed = np.zeros(g, dtype=bool)
    placed[0], queue = True, [0]
    while queue:
        x = queue.pop(0)
        for y in np.flatnonzero(near[x] & ~placed)[:2]:
            par[y], placed[y], kids[x] = x, True, kids[x] + 1
            queue.append(int(y))
    while not placed.all():  # ranks whose linked members all had two children already
        y = int(np.flatnonzero(~placed & (near[:, placed].any(axis=1)))[0])
        hosts = np.flatnonzero(near[y] & placed)
        par[y], placed[y] = hosts[np.argmin(kids[hosts])], True
        kids[par[y]] += 1
    return par[1:]


@functools.lru_cache(maxsize=64)
def _linked(rings: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Which local indices a mesh's rings join directly (once per mesh, not per node and
    channel)."""
    g = len(rings[0])
    linked = np.zeros((g, g), dtype=bool)
    for ring in rings:
        r = np.asarray(ring)
        linked[r, np.roll(r, 1)] = linked[np.roll(r, 1), r] = True
    linked.flags.writeable = False
    return linked


def pipeline_chunk_cap(
    parents: list[np.ndarray],
    stages: int = 1,
    floor: int = MAX_CHUNKS,
    budget: int | None = PIPELINE_BUDGET,
) -> int:
    """How many chunks a pipeline over the trees ``parents`` may cut a buffer into: enough to fill
    its depth (``stages`` passes: 2 for reduce-then-broadcast) :data:`PIPELINE_FILL` times over,
    within ``budget`` transfers (the engine's :data:`PIPELINE_BUDGET`, bounding the schedule it
    replays), never fewer than ``floor``. The schedule builders and the analytic model
    (:mod:`collsim.model.trees`) both take it, so they agree; the model, whose cost does not grow
    with the chunks, has no budget (``None``): from a few hundred ranks on, where the budget binds,
    it cuts the buffer as NCCL does, finely enough to keep the fill small, and the engine's
    coarser pipeline is slower."""
    trees = [Tree.from_parents(p) for p in parents]
    depth = stages * max(len(t.levels) - 1 for t in trees)
    want = PIPELINE_FILL * depth
    if budget is not None:
        edges = stages * sum(int((np.asarray(p) >= 0).sum()) for p in parents)
        want = min(want, budget // max(1, edges))
    return max(floor, want)


def all_tree_parents(layout: RankLayout, channels: int) -> list[np.ndarray]:
    """The distinct trees of NCCL's tree all-reduce over all channels (``nccl_tree_parents``)."""
    seen: dict[bytes, np.ndarray] = {}
    for c in range(channels):
        for p in nccl_tree_parents(layout, c, channels):
            seen.setdefault(np.asarray(p).tobytes(), p)
    return list(seen.values())


def heap_parents(n: int, root: int) -> np.ndarray:
    """A balanced binary tree on ranks relabelled so that ``root`` is 0 (heap order)."""
    v = np.arange(n)
    return np.where(v == 0, -1, ((v - 1) // 2 + root) % n)[(np.arange(n) - root) % n]


def chain_along(order: np.ndarray, root: int) -> np.ndarray:
    """The chain that follows the ring ``order`` (every rank once) from ``root``: each rank's
    parent is its predecessor on the ring, the root has none (NCCL's broadcast and reduce run
    so on each channel's ring, so channels whose rings leave nodes through other NICs spread
    over them)."""
    seq = np.roll(np.asarray(order, dtype=np.int64).reshape(-1), -int(np.argmax(order == root)))
    parents = np.empty(seq.size, dtype=np.int64)
    parents[seq[0]] = -1
    parents[seq[1:]] = seq[:-1]
    return parents


def _in_order(first_id: int, shape: tuple[int, int]) -> np.ndarray:
    """Each edge sends its chunks in order: the ids (K * m,) of the same edge's previous chunk.

    A batch of ``K x m`` transfers (chunk-major) gets ids ``first_id ...``; chunk ``k`` on edge
    ``j`` follows chunk ``k - 1`` on edge ``j`` (``after``; none for the first). Without this
    every chunk of an edge is in flight at once, they share the edge and finish together, and a
    chain or tree does not pipeline at all: each hop moves the whole buffer before the next.
    """
    nk, m = shape
    prev = first_id + (np.arange(nk)[:, None] - 1) * m + np.arange(m)[None, :]
    prev[0] = -1
    return prev.reshape(-1)


def tree_reduce(b: ScheduleBuilder, tree: Tree, bounds: np.ndarray, *, channel: int) -> np.ndarray:
    """Reduce each chunk ``bounds[k]:bounds[k+1]`` of the inputs up ``tree`` into the root's output.

    Inner ranks accumulate their children's partial sums in place in their input; the root's first
    child delivers plain into the root's output and a REDUCTION adds the root's own partial.
    Returns the ids (K,) after which each chunk is complete at the root.
    """
    off, cnt = bounds[:-1, None], np.diff(bounds)[:, None]
    nk, n = off.shape[0], tree.parent.shape[0]
    up = np.full((nk, n), -1, dtype=np.int64)
    root = tree.root
    first = int(tree.children[root, 0])
    for d in range(len(tree.levels) - 1, 0, -1):
        xs = tree.levels[d]
        for group, buf, reduce in (
            (xs[xs != first], "input", True),
            (xs[xs == first], "output", False),
        ):
            if not group.size:
                continue
            ch = tree.children[group]
            deps = np.where(ch[None] >= 0, up[:, ch], -1)
            shape = (nk, group.size)
            ids = b.transfers(
                np.broadcast_to(group, shape).reshape(-1),
                np.broadcast_to(tree.parent[group], shape).reshape(-1),
                np.broadcast_to(cnt, shape).reshape(-1),
                "input",
                np.broadcast_to(off, shape).reshape(-1),
                buf,
                np.broadcast_to(off, shape).reshape(-1),
                reduce=reduce,
                deps=deps.reshape(nk * group.size, -1),
                channel=channel,
                after=_in_order(len(b), shape),
            )
            up[:, group] = ids.reshape(shape)
    kids = tree.children[root]
    if first < 0:  # a lone rank: the reduction is a copy
        return self_copy(
            b, np.full(nk, root), cnt[:, 0], "input", off[:, 0], "output", off[:, 0],
            np.full((nk, 0), -1), channel,
        )  # fmt: skip
    deps = np.where(kids[None] >= 0, up[:, kids], -1)
    return add_reductions(
        b, np.full(nk, root), cnt[:, 0], "input", off[:, 0], "output", off[:, 0], deps, channel
    )


def tree_broadcast(
    b: ScheduleBuilder,
    tree: Tree,
    bounds: np.ndarray,
    *,
    src_buf: str,
    channel: int,
    ready: np.ndarray | None = None,
    copy_root: bool = False,
) -> None:
    """Send each chunk from the root's ``src_buf`` down ``tree`` into every output.

    ``ready`` (K,) or (K, k): what each chunk waits for at the root. ``copy_root``: also copy it
    into the root's own output (broadcast's root).
    """
    off, cnt = bounds[:-1, None], np.diff(bounds)[:, None]
    nk, n = off.shape[0], tree.parent.shape[0]
    ready = np.full((nk, 0), -1) if ready is None else np.asarray(ready).reshape(nk, -1)
    root = tree.root
    if copy_root:  # chunk by chunk, each after the one before (one GPU's memory copies them)
        before = np.r_[-1, len(b) + np.arange(nk - 1)][:, None]
        self_copy(
            b, np.full(nk, root), cnt[:, 0], src_buf, off[:, 0], "output", off[:, 0],
            np.concatenate([ready, before], axis=1), channel,
        )  # fmt: skip
    down = np.full((nk, n), -1, dtype=np.int64)
    for d in range(1, len(tree.levels)):
        xs = tree.levels[d]
        par = tree.parent[xs]
        shape = (nk, xs.size)
        deps = (
            np.broadcast_to(ready[:, None, :], (*shape, ready.shape[1])) if d == 1 else down[:, par]
        )
        ids = b.transfers(
            np.broadcast_to(par, shape).reshape(-1),
            np.broadcast_to(xs, shape).reshape(-1),
            np.broadcast_to(cnt, shape).reshape(-1),
            src_buf if d == 1 else "output",
            np.broadcast_to(off, shape).reshape(-1),
            "output",
            np.broadcast_to(off, shape).reshape(-1),
            deps=deps.reshape(nk * xs.size, -1),
            channel=channel,
            after=_in_order(len(b), shape),
        )
        down[:, xs] = ids.reshape(shape)


def build_all_reduce(spec: BuildSpec) -> Schedule:
    """NCCL's tree all-reduce: per channel two trees (chains in nodes, a double binary tree
    across them), half the data each, reduced up then broadcast down, pipelined by chunks."""
    b = ScheduleBuilder()
    cap = pipeline_chunk_cap(
        all_tree_parents(spec.layout, spec.channels), stages=2, floor=max(1, MAX_CHUNKS // 2)
    )
    for c, lo, cnt in spec.channel_pieces(spec.count):
        parents = nccl_tree_parents(spec.layout, c, spec.channels)
        trees = [Tree.from_parents(p) for p in parents]
        halves = lo + split_bounds(cnt, 2)
        for t, tree in enumerate(trees):
            h_lo, h_hi = int(halves[t]), int(halves[t + 1])
            if h_hi == h_lo:
                continue
            bounds = spec.chunks(h_lo, h_hi - h_lo, max_chunks=cap)
            done = tree_reduce(b, tree, bounds, channel=c)
            tree_broadcast(b, tree, bounds, src_buf="output", channel=c, ready=done)
    return spec.finish(b, trees=2)
