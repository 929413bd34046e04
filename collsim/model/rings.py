"""Closed forms of the ring family: ring all-reduce / all-gather / reduce-scatter, and the
two-level (hierarchical, 2D-ring) algorithms built from ring and recursive phases.

Ring (``collsim/collectives/ring.py``): on a ring of ``m`` positions with edge ``i`` from position
``i`` to ``i + 1``, a send at step ``s`` waits for the block it forwards (position ``i - 1``, step
``s - 1``) plus its own latency, and follows its own previous send on the connection (its bytes
queue behind those). The time is the longest path over (position, step)
(:func:`~collsim.model.grid.longest_path`), with per-edge costs ``r_i`` (a fused receive-reduce
step: latency + bytes x max(wire time, reduction time), as the engine charges it) and ``g_i`` (a
plain step): all-reduce ``m-1`` r-steps then ``m-1`` g-steps; reduce-scatter in place ``m-1``
r-steps, into another buffer ``m-2`` r-steps, a plain last hop and the owner's reduction
(serialised on its GPU over channels); all-gather ``m-1`` g-steps. On a uniform ring all-reduce is
the textbook ``2(m-1)(alpha + S/(mB))``.

Every edge's bandwidth is its max-min share among *all* ring edges of all channels (they all run
at once: several ring edges through one NIC or PCIe switch split it). Where a ring mixes fast and
slow edges, blocks pile up in front of the slow link and the ring runs at its pace; the link-load
bound (``flows.FlowCosts.load_lines``) covers that regime.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collsim.collectives.common import DEFAULT_CHUNK_BYTES, BuildSpec
from collsim.collectives.layout import RankLayout
from collsim.collectives.ring import ring_order
from collsim.model.envelope import Aff
from collsim.model.exchange import rhd
from collsim.model.flows import FlowCosts
from collsim.model.grid import longest_path

Oracle = Callable[[float], Aff]

AR, RS_INPLACE, RS_OUT, AG = "ar", "rs_inplace", "rs_out", "ag"
_STEPS = {AR: 2, RS_INPLACE: 1, RS_OUT: 1, AG: 1}


def ring_orders(collective: str, n: int, channels: int, layout: RankLayout) -> np.ndarray:
    """The ring order of each channel, ``(C, n)``, exactly as the ring builders pick it.

    Uses the builders' own ``ring_order`` (channels rotated inside nodes so they leave through
    different NICs).
    """
    spec = BuildSpec(
        collective=collective, algorithm="ring", nranks=n, count=n * channels, elem_bytes=4,
        layout=layout, channels=channels, chunk_bytes=DEFAULT_CHUNK_BYTES, root=0,
    )  # fmt: skip
    return np.stack([np.asarray(ring_order(spec, c)).reshape(-1) for c in range(channels)])


def scatter_max(n: int, ranks: np.ndarray, values: Aff, s: float, base: Aff | None = None) -> Aff:
    """Per rank (0..n-1) the largest of ``values`` at its ``ranks`` entries (and ``base``)."""
    out = Aff.zeros(n) if base is None else Aff(base.a.copy(), base.b.copy())
    r = ranks.reshape(-1)
    a, b = values.a.reshape(-1), values.b.reshape(-1)
    order = np.lexsort((a + b * s, r))  # by rank, then value: the last of each rank wins
    last = np.r_[r[order][1:] != r[order][:-1], True]
    pick, who = order[last], r[order][last]
    better = a[pick] + b[pick] * s > out.at(s)[who]
    out.a[who[better]], out.b[who[better]] = a[pick][better], b[pick][better]
    return out


def ring_phase(
    costs: FlowCosts,
    rings: np.ndarray,
    frac: float,
    mode: str,
    *,
    weight: int = 1,
    red_mult: int = 1,
    copy: bool = False,
    pieces: int = 1,
) -> Oracle:
    """Time of one ring phase over the rings ``rings`` (K, m), all running at once.

    ``frac``: payload bytes per transfer per collective byte. ``weight``: identical copies of
    every ring (channels on the same order). ``red_mult``: local reductions serialised on an
    owner's GPU (one per channel). ``copy``: the owner also copies its block locally (side work).
    ``pieces``: transfers each step's block is sent as at once (a strided block: one per node),
    each its own flow with its channel's rate ceiling, as the engine runs them.
    """
    rings = np.atleast_2d(np.asarray(rings, dtype=np.int64))
    k, m = rings.shape
    if m < 2:
        return lambda s: Aff.zeros(())
    src = rings.reshape(-1)
    dst = np.roll(rings, -1, axis=1).reshape(-1)
    steps = _STEPS[mode] * (m - 1)
    wave = costs.wave(src, dst, weight, load_bytes=frac * steps * weight,
                      channels_per_transfer=pieces)  # fmt: skip
    lat = wave.lat_s.reshape(k, m)
    g_b = frac * wave.s_per_byte.reshape(k, m)
    red_rate = costs.reduce_bytes_per_s[dst].reshape(k, m)
    r_b = np.maximum(g_b, frac / red_rate)
    own_red_b = red_mult * frac / costs.reduce_bytes_per_s[rings]  # reduction at the owner
    copy_b = frac / costs.copy_bytes_per_s[rings]
    r = Aff(lat, r_b)
    g = Aff(lat, g_b)
    zeros = np.zeros((k, m))
    red = Aff(zeros, own_red_b)
    if mode == AR:
        plan = [r] * (m - 1) + [g] * (m - 1)
    elif mode == RS_INPLACE:
        plan = [r] * (m - 1)
    elif mode == RS_OUT:
        plan = [r] * (m - 2) + [g]
    else:
        plan = [g] * (m - 1)

    def run(s: float, ready: Aff | None = None) -> Aff:
        """Per-rank done times, ranks starting at ``ready`` (n,)."""
        rp = Aff.zeros((k, m)) if ready is None else ready[rings]
        start = rp
        if mode != AG:  # a reduce-scatter also waits for the receiver's buffer
            start = rp.maximum(Aff(np.roll(rp.a, -1, axis=1), np.roll(rp.b, -1, axis=1)), s)
        t = longest_path(plan, s, start)
        done = Aff(np.roll(t.a, 1, axis=1), np.roll(t.b, 1, axis=1))  # the last hop into i
        if mode == RS_OUT:  # the owner adds its own part after the last hop into it
            done = done.maximum(rp, s) + red
        if copy:
            done = done.maximum(rp + Aff(zeros, copy_b), s)
        every = Aff(np.concatenate((t.a, done.a)), np.concatenate((t.b, done.b)))
        ranks2 = np.concatenate((np.roll(rings, -1, axis=1), rings))
        return scatter_max(costs.nranks, ranks2, every, s, ready)

    def grid(s: float) -> Aff:
        return run(s).max(s)

    grid.run = run  # type: ignore[attr-defined]
    return grid


def chain(*phases: Oracle, groups: tuple[np.ndarray | None, ...] = ()) -> Oracle:
    """Phases one after the other, each rank waiting for its own previous phase.

    Phases that report per-rank times (``.run``) are chained rank by rank (``groups[i]``: the
    member -> rank table of a grouped phase such as the inter-node recursive halving-doubling);
    otherwise the sum of the phases' maxima (exact on symmetric systems, an upper bound else).
    """
    if all(hasattr(p, "run") for p in phases):

        def per_rank(s: float) -> Aff:
            ready: Aff | None = None
            for i, phase in enumerate(phases):
                grp = groups[i] if i < len(groups) else None
                if grp is None:
                    ready = phase.run(s, ready)  # type: ignore[attr-defined]
                else:
                    n = int(grp.max()) + 1
                    base = Aff.zeros(n) if ready is None else ready
                    done = phase.run(s, base[grp])  # type: ignore[attr-defined]
                    ready = scatter_max(n, grp, done, s, base)
            return ready.max(s)  # type: ignore[union-attr]

        return per_rank

    def total(s: float) -> Aff:
        out = Aff.zeros(())
        for phase in phases:
            out = out + phase(s)
        return out

    return total


# -- the families ----------------------------------------------------------------------------


def flat_ring(costs: FlowCosts, collective: str, channels: int, layout: RankLayout) -> Oracle:
    """Ring all_reduce / all_gather / reduce_scatter on every rank (``ring.py``'s builders)."""
    n = layout.nranks
    orders = ring_orders(collective, n, channels, layout)
    frac = 1.0 / (n * channels)
    if collective == "all_reduce":
        return ring_phase(costs, orders, frac, AR, copy=True)
    if collective == "reduce_scatter":
        return ring_phase(costs, orders, frac, RS_OUT, red_mult=channels)
    return ring_phase(costs, orders, frac, AG, copy=True)


def _nodes(n: int, per_node: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(intra-node rings (N, L), inter-node groups (L, N)) for full nodes; None if flat."""
    nn = -(-n // per_node)
    if per_node == 1 or nn == 1:
        return None
    if n % per_node:  # a partial last node: its ranks stand in for the missing local indices
        rings = np.arange(n, dtype=np.int64)
        last = n - (nn - 1) * per_node
        k, loc = np.meshgrid(np.arange(nn), np.arange(per_node))
        groups = np.where(k == nn - 1, k * per_node + loc % last, k * per_node + loc)
        full = rings[: (nn - 1) * per_node].reshape(nn - 1, per_node)
        return full, groups
    ranks = np.arange(n, dtype=np.int64).reshape(nn, per_node)
    return ranks, ranks.T.copy()


def two_level_all_reduce(
    costs: FlowCosts, channels: int, layout: RankLayout, per_node: int, inter: str
) -> Oracle:
    """Intra-node ring reduce-scatter, inter-node all-reduce (``rhd`` or ``ring``), all-gather
    (``hierarchical.two_level_all_reduce``)."""
    n = layout.nranks
    split = _nodes(n, per_node)
    if split is None:
        if inter == "ring":
            return flat_ring(costs, "all_reduce", channels, layout)
        groups = np.arange(n, dtype=np.int64)[None, :]
        if n <= per_node:  # a single node: a plain ring
            return ring_phase(costs, groups, 1.0 / (n * channels), AR, weight=channels, copy=True)
        return rhd(costs, groups, 1.0 / channels, in_place=False, channels=channels)
    rings, groups = split
    frac = 1.0 / (channels * per_node)
    rs = ring_phase(costs, rings, frac, RS_OUT, weight=channels, red_mult=channels)
    if inter == "rhd":
        mid = rhd(costs, groups, frac, in_place=True, channels=channels)
    else:
        mid = ring_phase(costs, groups, frac / groups.shape[1], AR, weight=channels)
    ag = ring_phase(costs, rings, frac, AG, weight=channels)
    if inter == "rhd":
        return chain(rs, mid, ag, groups=(None, groups, None))
    return chain(rs, mid, ag)


def hierarchical_gather_scatter(
    costs: FlowCosts, collective: str, channels: int, layout: RankLayout
) -> Oracle:
    """Hierarchical all_gather (inter ring, then intra ring) and reduce_scatter (the mirror)."""
    n, per_node = layout.nranks, layout.ranks_per_node
    split = _nodes(n, per_node)
    if split is None:
        return flat_ring(costs, collective, channels, layout)
    rings, groups = split
    small = 1.0 / (n * channels)  # one rank's block per channel
    big = 1.0 / (per_node * channels)  # what a node position holds after the inter phase
    if collective == "all_gather":
        inter = ring_phase(costs, groups, small, AG, weight=channels, copy=True)
        intra = ring_phase(costs, rings, big, AG, weight=channels, pieces=groups.shape[1])
        return chain(inter, intra)
    intra = ring_phase(costs, rings, big, RS_INPLACE, weight=channels, pieces=groups.shape[1])
    inter = ring_phase(costs, groups, small, RS_OUT, weight=channels, red_mult=channels)
    return chain(intra, inter)
