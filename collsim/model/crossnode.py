"""Closed forms of NCCL's in-network all-reduces across nodes: NVLS+tree and CollNet Direct
(``collsim/collectives/crossnode.py``).

Both are pipelines of stages over ``C x H`` independent slices (channels x heads; channel
``c`` on tree ``c % 2``), each slice cut into chunks that every stage sends in order:

* ``nvls_tree``: node reduce onto the head (an in-network reduction on the node's NVSwitch),
  ``depth`` tree edges up and ``depth`` down between heads of different nodes, multicast back;
* ``collnet``: every rank sends its slice to the head (fused receive-reduce), one in-network
  reduction on the scale-out switch among the heads (SHARP), the head sends the sum back.

As for the trees (:mod:`collsim.model.trees`), ``T = fill(chunk) + (K - 1) step(chunk)``:

* ``fill``: one chunk through every stage on the critical path, each stage at the max-min
  shares of its own flows (every slice's chunk 0 reaches a stage together): latency plus its
  slowest flow's bytes;
* ``step``: in steady state every stage of every slice is busy at once; a chunk round lasts
  as long as its busiest link needs for the round's bytes (or a GPU for its fused
  reductions): flows re-share a link as others finish, so none idles while it has bytes.

Channels' slices take the same routes, so they are one flow of weight ``C``. The link-load
bound adds every flow's bytes per collective byte on its links.

Each point-to-point flow copy (one channel's transfer) runs at most at its channel's rate
ceiling (:attr:`FlowCosts.ceiling`, :mod:`collsim.channel_rates`), as the engine caps a
transfer's flow: in the fill (max-min shares with the ceiling), the steady state (a round lasts
at least as long as the copy needs at its ceiling) and the load bound (a line per stage for its
slowest copy at its ceiling). In-network reductions have no ceiling, in either engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from collsim.collectives.crossnode import (
    NVLS_CHUNK_BYTES,
    chunk_cap,
    head_count,
    head_ranks,
    node_trees,
    tree_of,
)
from collsim.collectives.layout import RankLayout
from collsim.collectives.tree import Tree
from collsim.model.envelope import Aff, discover
from collsim.model.flows import FlowCosts, max_min_rates
from collsim.model.trees import Pipeline
from collsim.protocols import step_latency_s


@dataclass
class _Flows:
    """The flows of one stage, gathered in batches: routes (CSR ``ptr``/``links``), per-flow
    latency, payload bytes per chunk byte, the GPU that reduces what the flow delivers (-1:
    none), the op each flow belongs to, its weight (channels running the flow's slice on the
    same routes: one flow of that weight) and each copy's rate ceiling (wire bytes/s its
    channel may reach, as the engine caps a transfer; ``inf``: none, as for in-network
    reductions and fabrics without channels)."""

    batches: list[tuple[np.ndarray, ...]] = field(default_factory=list)

    def add(self, ptr: np.ndarray, links: np.ndarray, lat: np.ndarray, traffic: np.ndarray,
            reducer: np.ndarray, op: np.ndarray, weight: float,
            ceil: np.ndarray) -> None:  # fmt: skip
        n = ptr.size - 1
        per_flow = (lat, traffic, reducer, op, np.full(n, float(weight)), ceil)
        self.batches.append((np.diff(ptr), np.asarray(links, dtype=np.int64),
                             *(np.broadcast_to(x, n) for x in per_flow)))  # fmt: skip

    def _column(self, k: int, dtype: type) -> np.ndarray:
        return np.concatenate([np.asarray(b[k], dtype=dtype) for b in self.batches] or [[]])

    @cached_property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """``(ptr, links, lat, traffic, reducer, op, weight, ceil)`` of every flow, in order."""
        lengths = self._column(0, np.int64)
        ptr = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=ptr[1:])
        kinds = (np.int64, np.float64, np.float64, np.int64, np.int64, np.float64, np.float64)
        return (ptr, *(self._column(k, t) for k, t in enumerate(kinds, start=1)))


def _add_p2p(costs: FlowCosts, flows: _Flows, src: np.ndarray, dst: np.ndarray, fused: bool,
             op0: int, weight: float) -> int:  # fmt: skip
    """Point-to-point flows ``src[i] -> dst[i]``, each its own op from ``op0``, each copy at
    most at its channel's ceiling for the slowest link class on its route (the engine's
    ``route_ceiling``: a collective's transfer stands for one channel)."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    ptr, links, lat = costs.routes(src, dst)
    by_kind = costs.ceiling[False]
    ceil = np.inf if by_kind is None else np.asarray(by_kind, dtype=np.float64)[
        costs.route_kinds(ptr, links)]  # fmt: skip
    red = dst if fused else -1
    flows.add(ptr, links, lat, 1.0, red, op0 + np.arange(src.size), weight, ceil)
    return op0 + src.size


def _add_in_network(costs: FlowCosts, flows: _Flows, groups: list[tuple[list[int], list[int]]],
                    op0: int, weight: float) -> int:  # fmt: skip
    """In-network reductions ``(sources, destinations)``, each its own op from ``op0``: a flow
    per source up to the switch, one per destination down, at its latency (as the engine: the
    larger of path + switch and the slowest class's hop latency,
    :func:`collsim.protocols.step_latency_s`)."""
    found = costs.fabric.in_network_many(groups)  # type: ignore[attr-defined]
    owner = np.repeat(found.group, np.diff(found.ptr))  # each route entry's reduction
    worst = np.zeros(len(groups), dtype=np.int64)
    np.maximum.at(worst, owner, costs.link_kind[found.links])
    latency = step_latency_s(found.latency_s, costs.hop_s[worst])
    g = found.group
    flows.add(found.ptr, found.links, latency[g], found.share[g], -1, op0 + g, weight, np.inf)
    return op0 + len(groups)


def _stages(
    costs: FlowCosts, algorithm: str, layout: RankLayout, channels: int
) -> tuple[list[_Flows], int]:
    """Every stage's flows over all distinct slices (trees x heads; a slice's channels are one
    flow of their count's weight), and how many times the tree stages lie on the critical path
    (the trees' depth; 1 for collnet)."""
    heads = head_ranks(layout)
    g = layout.ranks_per_node
    nodes = [list(range(m * g, m * g + layout.node_size(m))) for m in range(layout.nnodes)]
    trees = [Tree.from_parents(p) for p in node_trees(layout)]
    on_tree = np.bincount([tree_of(c) for c in range(channels)], minlength=2)
    if algorithm == "nvls_tree":
        stages = [_Flows() for _ in range(4)]
        op = 0
        for t, w in zip(trees, on_tree.tolist(), strict=True):
            if not w:
                continue
            child = np.flatnonzero(t.parent >= 0)
            for h in range(heads.shape[1]):
                x = heads[:, h].tolist()
                op = _add_in_network(costs, stages[0], [(n, [x[m]]) for m, n in enumerate(nodes)],
                                     op, w)  # fmt: skip
                op = _add_in_network(costs, stages[3], [([x[m]], n) for m, n in enumerate(nodes)],
                                     op, w)  # fmt: skip
                if child.size:
                    up_src, up_dst = heads[child, h], heads[t.parent[child], h]
                    op = _add_p2p(costs, stages[1], up_src, up_dst, True, op, w)
                    op = _add_p2p(costs, stages[2], up_dst, up_src, False, op, w)
        used = [t for t, w in zip(trees, on_tree.tolist(), strict=True) if w]
        return stages, max(len(t.levels) - 1 for t in used)
    stages = [_Flows() for _ in range(3)]
    op = 0
    for h in range(heads.shape[1]):
        x = heads[:, h]
        src = [r for m, node in enumerate(nodes) for r in node if r != x[m]]
        dst = [int(x[m]) for m, node in enumerate(nodes) for r in node if r != x[m]]
        op = _add_p2p(costs, stages[0], np.array(src), np.array(dst), True, op, channels)
        op = _add_in_network(costs, stages[1], [(x.tolist(), x.tolist())], op, channels)
        op = _add_p2p(costs, stages[2], np.array(dst), np.array(src), False, op, channels)
    return stages, 1


def _rates(costs: FlowCosts, flows: _Flows) -> np.ndarray:
    """Max-min rates of the flows of one stage running together (each its weight's copies,
    each copy at most at its ceiling)."""
    ptr, links, _, _, _, _, weight, ceil = flows.arrays
    return max_min_rates(
        ptr, links, weight, costs.capacity, ceil if np.isfinite(ceil).any() else None
    )


def _stage_cost(costs: FlowCosts, flows: _Flows, rates: np.ndarray, per_byte: float) -> Aff:
    """A stage's latency and seconds per collective byte of one chunk round: its slowest op
    (ops end with their last flow; a fused receive-reduce ends no earlier than its reduction)."""
    _, _, lat, traffic, red, ops, _, _ = flows.arrays
    wire = traffic * costs.wire * per_byte
    with np.errstate(divide="ignore"):
        b = np.where(np.isfinite(rates), wire / rates, 0.0)
    fused = red >= 0
    b[fused] = np.maximum(b[fused], per_byte / costs.reduce_bytes_per_s[red[fused]])
    cost_b = np.zeros(ops.max() + 1)
    np.maximum.at(cost_b, ops, b)
    cost_a = np.zeros(ops.max() + 1)
    np.maximum.at(cost_a, ops, lat)
    used = np.unique(ops)
    return Aff(cost_a[used], cost_b[used])


def _round(costs: FlowCosts, stages: list[_Flows], per_byte: float) -> float:
    """Seconds per collective byte of one chunk round in steady state, where every flow's bytes
    are on its links and every fused reduction's on its GPU at once: the busiest of them
    (max-min sharing re-shares as flows finish, so no link idles while it has bytes to carry),
    or a copy at its channel's ceiling, which needs its own bytes' time however idle its links
    are. Adds every flow to the link-load bound on the way (a line per stage for its slowest
    copy at its ceiling)."""
    round_s = np.zeros(costs.capacity.shape[0])
    reduce_s = np.zeros(costs.reduce_bytes_per_s.shape[0])
    capped_s = 0.0
    for f in stages:
        ptr, links, lat, traffic, red, _, w, ceil = f.arrays
        lengths = np.diff(ptr)
        each = np.repeat(w * per_byte * traffic * costs.wire, lengths)
        wire = each / costs.capacity[links]
        np.add.at(round_s, links, wire)
        np.add.at(costs.load_s_per_byte, links, wire)  # the link-load bound
        np.minimum.at(costs.load_lat_s, links, np.repeat(lat, lengths))
        fused = red >= 0
        np.add.at(reduce_s, red[fused], w[fused] * per_byte / costs.reduce_bytes_per_s[red[fused]])
        capped = np.flatnonzero((lengths > 0) & np.isfinite(ceil))
        if capped.size:  # the load bound's line for this stage's slowest copy at its ceiling
            own = per_byte * traffic[capped] * costs.wire / ceil[capped]
            slowest = int(np.argmax(own))
            capped_s = max(capped_s, float(own[slowest]))
            costs.ceiling_lines.append((float(lat[capped[slowest]]), float(own[slowest])))
    return float(max(round_s.max(initial=0.0), reduce_s.max(initial=0.0), capped_s))


def cross_node(costs: FlowCosts, algorithm: str, layout: RankLayout, channels: int) -> Pipeline:
    """The pipeline of ``nvls_tree`` or ``collnet`` (module docstring) on ``channels``."""
    streams = channels * head_count(layout)
    per_byte = 1.0 / streams  # payload bytes of one slice's chunk per collective byte of chunk
    stages, depth = _stages(costs, algorithm, layout, channels)
    lone = [_stage_cost(costs, f, _rates(costs, f), per_byte) for f in stages]
    every_b = _round(costs, stages, per_byte)
    repeat = [1, depth, depth, 1] if algorithm == "nvls_tree" else [1, 1, 1]

    def fill(s: float) -> Aff:
        path = Aff.const(0.0, 0.0)
        for k, cost in zip(repeat, lone, strict=True):
            slowest = cost.max(s)  # the stage's slowest op at this size
            path = path + Aff.const(k * slowest.a, k * slowest.b)
        return path

    def step(s: float) -> Aff:
        return Aff.const(0.0, every_b)

    return Pipeline(discover(fill), discover(step), streams, chunk_cap(layout), NVLS_CHUNK_BYTES)
