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

from dataclasses import dataclass

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
    """The flows of one stage: routes, per-flow latency, payload bytes per chunk byte, the GPU
    that reduces what the flow delivers (-1: none), the op each flow belongs to, its weight and
    each copy's rate ceiling."""

    links: list[np.ndarray]
    lat_s: list[float]
    traffic: list[float]
    reducer: list[int]
    op: list[int]
    weight: list[float]
    """Channels running the flow's slice (same routes: one flow of that weight)."""
    ceil: list[float]
    """Wire bytes/s each copy may reach (its channel's, as the engine caps a transfer); ``inf``:
    none (in-network reductions, fabrics without channels)."""

    @classmethod
    def empty(cls) -> _Flows:
        return cls([], [], [], [], [], [], [])

    def add(self, links: np.ndarray, lat: float, traffic: float, reducer: int, op: int,
            weight: float = 1.0, ceil: float = np.inf) -> None:  # fmt: skip
        self.weight.append(float(weight))
        self.ceil.append(float(ceil))
        self.links.append(np.asarray(links, dtype=np.int64))
        self.lat_s.append(float(lat))
        self.traffic.append(float(traffic))
        self.reducer.append(int(reducer))
        self.op.append(int(op))


def _add_p2p(costs: FlowCosts, flows: _Flows, src: list[int], dst: list[int], fused: bool,
             op0: int, weight: float) -> int:  # fmt: skip
    """Point-to-point flows ``src[i] -> dst[i]``, each its own op from ``op0``, each copy at
    most at its channel's ceiling for the slowest link class on its route (the engine's
    ``route_ceiling``: a collective's transfer stands for one channel)."""
    ptr, links, lat = costs.routes(np.asarray(src), np.asarray(dst))
    by_kind = costs.ceiling[False]
    worst = costs.route_kinds(ptr, links)
    for i in range(len(src)):
        red = dst[i] if fused else -1
        ceil = np.inf if by_kind is None else float(by_kind[worst[i]])
        flows.add(links[ptr[i] : ptr[i + 1]], lat[i], 1.0, red, op0 + i, weight, ceil)
    return op0 + len(src)


def _add_in_network(costs: FlowCosts, flows: _Flows, srcs: list[int], dsts: list[int],
                    op: int, weight: float) -> int:  # fmt: skip
    """One in-network reduction: a flow per source up to the switch, one per destination down,
    at its latency (as the engine: the larger of path + switch and the slowest class's hop
    latency, :func:`collsim.protocols.step_latency_s`)."""
    fabric = costs.fabric
    s, d = np.asarray(srcs), np.asarray(dsts)
    up_ptr, up_links, down_ptr, down_links, lat = fabric.in_network(s, d)  # type: ignore[attr-defined]
    every = np.concatenate((up_links, down_links)).astype(np.int64)
    worst = int(costs.link_kind[every].max()) if every.size else 0
    latency = float(step_latency_s(float(lat), float(costs.hop_s[worst])))
    traffic = getattr(fabric, "in_network_traffic", None)
    share = float(traffic(s, d)) if traffic is not None else 1.0
    for ptr, links in ((up_ptr, up_links), (down_ptr, down_links)):
        for i in range(len(ptr) - 1):
            flows.add(links[ptr[i] : ptr[i + 1]], latency, share, -1, op, weight)
    return op + 1


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
        stages = [_Flows.empty() for _ in range(4)]
        op = 0
        for t, w in zip(trees, on_tree.tolist(), strict=True):
            if not w:
                continue
            child = np.flatnonzero(t.parent >= 0)
            for h in range(heads.shape[1]):
                x = heads[:, h]
                for m, node in enumerate(nodes):
                    op = _add_in_network(costs, stages[0], node, [int(x[m])], op, w)
                    op = _add_in_network(costs, stages[3], [int(x[m])], node, op, w)
                if child.size:
                    up_src, up_dst = x[child].tolist(), x[t.parent[child]].tolist()
                    op = _add_p2p(costs, stages[1], up_src, up_dst, True, op, w)
                    op = _add_p2p(costs, stages[2], up_dst, up_src, False, op, w)
        used = [t for t, w in zip(trees, on_tree.tolist(), strict=True) if w]
        return stages, max(len(t.levels) - 1 for t in used)
    stages = [_Flows.empty() for _ in range(3)]
    op = 0
    for h in range(heads.shape[1]):
        x = heads[:, h]
        src = [r for m, node in enumerate(nodes) for r in node if r != x[m]]
        dst = [int(x[m]) for m, node in enumerate(nodes) for r in node if r != x[m]]
        op = _add_p2p(costs, stages[0], src, dst, True, op, channels)
        op = _add_in_network(costs, stages[1], x.tolist(), x.tolist(), op, channels)
        op = _add_p2p(costs, stages[2], dst, src, False, op, channels)
    return stages, 1


def _rates(costs: FlowCosts, parts: list[_Flows]) -> list[np.ndarray]:
    """Max-min rates of the flows of ``parts`` running together (each its weight's copies,
    each copy at most at its ceiling)."""
    links = [x for p in parts for x in p.links]
    weight = np.array([w for p in parts for w in p.weight], dtype=np.float64)
    ceil = np.array([c for p in parts for c in p.ceil], dtype=np.float64)
    lengths = np.array([x.size for x in links], dtype=np.int64)
    ptr = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    flat = np.concatenate(links) if links else np.zeros(0, dtype=np.int64)
    rates = max_min_rates(
        ptr, flat, weight, costs.capacity, ceil if np.isfinite(ceil).any() else None
    )
    out, lo = [], 0
    for p in parts:
        out.append(rates[lo : lo + len(p.links)])
        lo += len(p.links)
    return out


def _stage_cost(costs: FlowCosts, flows: _Flows, rates: np.ndarray, per_byte: float) -> Aff:
    """A stage's latency and seconds per collective byte of one chunk round: its slowest op
    (ops end with their last flow; a fused receive-reduce ends no earlier than its reduction)."""
    wire = np.asarray(flows.traffic) * costs.wire * per_byte
    with np.errstate(divide="ignore"):
        b = np.where(np.isfinite(rates), wire / rates, 0.0)
    red = np.asarray(flows.reducer)
    fused = red >= 0
    b[fused] = np.maximum(b[fused], per_byte / costs.reduce_bytes_per_s[red[fused]])
    lat = np.asarray(flows.lat_s)
    ops = np.asarray(flows.op)
    cost_b = np.zeros(ops.max() + 1)
    np.maximum.at(cost_b, ops, b)
    cost_a = np.zeros(ops.max() + 1)
    np.maximum.at(cost_a, ops, lat)
    used = np.unique(ops)
    return Aff(cost_a[used], cost_b[used])


def cross_node(costs: FlowCosts, algorithm: str, layout: RankLayout, channels: int) -> Pipeline:
    """The pipeline of ``nvls_tree`` or ``collnet`` (module docstring) on ``channels``."""
    streams = channels * head_count(layout)
    per_byte = 1.0 / streams  # payload bytes of one slice's chunk per collective byte of chunk
    stages, depth = _stages(costs, algorithm, layout, channels)
    lone = [_stage_cost(costs, f, _rates(costs, [f])[0], per_byte) for f in stages]
    # Steady state: a chunk round puts every flow's bytes on its links and every fused
    # reduction's on its GPU; the round lasts as long as the busiest of them needs (max-min
    # sharing re-shares as flows finish, so no link idles while it has bytes to carry).
    # A copy at its channel's ceiling needs its own bytes' time however idle its links are.
    round_s = np.zeros(costs.capacity.shape[0])
    reduce_s = np.zeros(costs.reduce_bytes_per_s.shape[0])
    capped_s = 0.0
    for f in stages:
        slowest: tuple[float, float] | None = None  # the stage's slowest copy at its ceiling
        for links, traffic, lat, red, w, ceil in zip(
            f.links, f.traffic, f.lat_s, f.reducer, f.weight, f.ceil, strict=True
        ):
            wire = w * per_byte * traffic * costs.wire / costs.capacity[links]
            np.add.at(round_s, links, wire)
            np.add.at(costs.load_s_per_byte, links, wire)  # the link-load bound
            np.minimum.at(costs.load_lat_s, links, lat)
            if red >= 0:
                reduce_s[red] += w * per_byte / costs.reduce_bytes_per_s[red]
            if links.size and np.isfinite(ceil):
                own = per_byte * traffic * costs.wire / ceil
                capped_s = max(capped_s, own)
                if slowest is None or own > slowest[1]:
                    slowest = (float(lat), own)
        if slowest is not None:  # the load bound's line for this stage's slowest copy
            costs.ceiling_lines.append(slowest)
    every_b = float(max(round_s.max(initial=0.0), reduce_s.max(initial=0.0), capped_s))
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
