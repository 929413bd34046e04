"""Closed forms of the tree family: NCCL's double binary tree all-reduce and the pipelined chain
and binary-tree broadcast / reduce (``collsim/collectives/tree.py``, ``pipeline.py``).

The schedules cut each tree's data into pipeline chunks that depend only on their own data, and
every chunk of an edge is in flight at once, sharing that edge's links; so an edge moves its
whole share in ``latency + bytes / share`` and the tree runs level by level. The critical path is
a longest path over the tree (a few numpy passes, one per level):

* up (reduce): ``t(x) = max over children t(c) + cost(x -> parent)``, a fused receive-reduce
  except the root's first child (plain into the root's output), then the root's local reductions
  (serialised on its GPU across channels);
* down (broadcast): ``t(x) = t(parent) + cost(parent -> x)``.

Flows that run together share links: edges are grouped into waves by *slot* (an up edge's slot is
its sender's height, a down edge's is the root's height plus its depth), across both trees and
all channels, and each wave's flows get their max-min shares.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collsim.collectives.tree import Tree, chain_parents, double_tree_parents, heap_parents
from collsim.model.envelope import Aff
from collsim.model.flows import FlowCosts

Oracle = Callable[[float], Aff]


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


def tree_family(
    costs: FlowCosts,
    parents: list[np.ndarray],
    frac: float,
    *,
    up: bool,
    down: bool,
    channels: int,
) -> Oracle:
    """Longest path of ``parents`` trees run together: reduce up and/or broadcast down.

    ``frac``: payload bytes per edge per collective byte (one tree's share of one channel).
    """
    trees = [Tree.from_parents(p) for p in parents]
    heights = [_heights(t) for t in trees]
    depths = [_depths(t) for t in trees]
    top = max(int(h[t.root]) for t, h in zip(trees, heights, strict=True)) + 1
    # Gather every edge with its slot, then cost each slot's wave together.
    rows = []  # (tree, child, parent, is_up, slot)
    for i, (t, h, d) in enumerate(zip(trees, heights, depths, strict=True)):
        child = np.flatnonzero(t.parent >= 0)
        if up:
            rows.append((i, child, t.parent[child], True, h[child]))
        if down:
            slot = d[child] + (top if up else 0)
            rows.append((i, child, t.parent[child], False, slot))
    edge_lat: dict[tuple[int, bool], np.ndarray] = {}
    edge_b: dict[tuple[int, bool], np.ndarray] = {}
    n = trees[0].parent.shape[0]
    for i, _, _, is_up, _ in rows:
        edge_lat[(i, is_up)] = np.zeros(n)
        edge_b[(i, is_up)] = np.zeros(n)
    slots = np.unique(np.concatenate([r[4] for r in rows])) if rows else np.zeros(0, np.int64)
    for slot in slots:
        parts = [(i, c[s == slot], p[s == slot], u) for i, c, p, u, s in rows]
        parts = [x for x in parts if x[1].size]
        src = np.concatenate([c if u else p for _, c, p, u in parts])
        dst = np.concatenate([p if u else c for _, c, p, u in parts])
        wave = costs.wave(src, dst, channels, load_bytes=frac * channels, size=1.0)
        lo = 0
        for i, c, _, u in parts:
            hi = lo + c.size
            edge_lat[(i, u)][c] = wave.lat_s[lo:hi]
            edge_b[(i, u)][c] = frac * wave.s_per_byte[lo:hi]
            lo = hi
    red = costs.reduce_bytes_per_s
    plans = []
    for i, t in enumerate(trees):
        child = np.flatnonzero(t.parent >= 0)
        first = int(t.children[t.root, 0])
        if up:
            b = edge_b[(i, True)]
            fused = np.maximum(b, frac / red[np.maximum(t.parent, 0)])
            fused[first] = b[first]  # the root's first child delivers plain into the output
            fused[t.root] = 0.0
            up_cost = Aff(edge_lat[(i, True)], np.where(t.parent >= 0, fused, 0.0))
        else:
            up_cost = None
        down_cost = Aff(edge_lat[(i, False)], edge_b[(i, False)]) if down else None
        root_red = channels * frac / red[t.root] if up else 0.0
        root_copy = frac / costs.copy_bytes_per_s[t.root] if (down and not up) else 0.0
        plans.append((t, child, up_cost, down_cost, root_red, root_copy))

    def oracle(s: float) -> Aff:
        ends = []
        for t, _child, up_cost, down_cost, root_red, root_copy in plans:
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

    return oracle


def double_tree(costs: FlowCosts, n: int, channels: int) -> Oracle:
    """NCCL's double binary tree all-reduce: half of each channel's data per tree."""
    t0, t1 = double_tree_parents(n)
    return tree_family(costs, [t0, t1], 0.5 / channels, up=True, down=True, channels=channels)


def rooted(costs: FlowCosts, collective: str, algorithm: str, n: int, channels: int) -> Oracle:
    """Pipelined chain / binary-tree broadcast or reduce from/to rank 0."""
    parents = chain_parents(n, 0) if algorithm == "chain" else heap_parents(n, 0)
    bcast = collective == "broadcast"
    return tree_family(
        costs, [parents], 1.0 / channels, up=not bcast, down=bcast, channels=channels
    )
