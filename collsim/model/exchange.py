"""Closed forms of the exchange family: recursive halving/doubling, direct (one-shot) algorithms,
all-to-all, send/recv and in-network reduction.

* ``rhd`` (``recursive.py``, Thakur, Rabenseifner & Gropp 2005): ``log2 p`` halving steps at
  distances ``p/2, p/4, ...`` moving ``d/p`` of the buffer (fused receive-reduce), ``log2 p``
  doubling steps back, and for non-powers of two a fold-in/fold-out of the whole buffer. A step's
  send waits for the member's previous send and previous receive, so the critical path is a
  longest path over the hypercube, evaluated exactly per member (``p`` wide, ``2 log2 p`` deep).
* ``direct``: all ``n(n-1)`` flows at once, each with its max-min share; reductions then run one
  after another on each GPU as their data arrives (a FIFO queue:
  ``end = max_i(ready_i + remaining_i x reduction time)``).
* ``alltoall direct``: ``n-1`` pairwise rounds, a rank's round ``k`` waiting for its own round
  ``k-1`` send and receive; longest path over rounds x ranks. ``hierarchical``: intra-node hand-off
  to relays (one wave), then one aggregated message per relay and remote destination.
* ``sendrecv``: ``n`` flows ``r -> r+1`` at once. ``in_network``: one flow up to the reducing switch
  per rank and one down, all at once (NVLS/SHARP, ``TopologyFabric.in_network``); NCCL's NVLS
  all-reduce at NCCL's NVLS latency, its chunks' route trips added per size by the model
  (:mod:`collsim.nvls`, ``AnalyticModel``'s ``SerialChunks``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collsim.collectives.alltoall import p2p_peers
from collsim.collectives.recursive import Fold
from collsim.model.envelope import Aff
from collsim.model.flows import FlowCosts, max_min_rates
from collsim.nvls import NVLS_LATENCY_S
from collsim.protocols import step_latency_s

Oracle = Callable[[float], Aff]


def _pairs_wave(
    costs: FlowCosts, groups: np.ndarray, src_m: np.ndarray, dst_m: np.ndarray, frac: float, w: int
) -> Aff:
    """Cost (G, k) of transfers member ``src_m`` -> ``dst_m`` in every group, one wave."""
    src, dst = groups[:, src_m], groups[:, dst_m]
    wave = costs.wave(src, dst, w, load_bytes=frac * w, size=1.0)
    shape = src.shape
    return Aff(wave.lat_s.reshape(shape), frac * wave.s_per_byte.reshape(shape))


def _fused(costs: FlowCosts, plain: Aff, dst: np.ndarray, frac: float) -> Aff:
    return Aff(plain.a, np.maximum(plain.b, frac / costs.reduce_bytes_per_s[dst]))


def rhd(
    costs: FlowCosts, groups: np.ndarray, region: float, *, in_place: bool, channels: int
) -> Oracle:
    """Recursive halving-doubling all-reduce of ``region`` (bytes per collective byte, per
    channel) inside every group of ``groups`` (G, n) at once."""
    groups = np.atleast_2d(groups)
    n = groups.shape[1]
    fold = Fold(n)
    p, depth, sv = fold.p, fold.steps, fold.survivor
    v = np.arange(p)
    w = channels
    fold_in = fold_out = None
    e = fold.extra
    if fold.r:
        c = _pairs_wave(costs, groups, e, e + 1, region, w)
        fold_in = _fused(costs, c, groups[:, e + 1], region)
        fold_out = _pairs_wave(costs, groups, e + 1, e, region, w)
    halving = []
    nsteps = depth if in_place else depth - 1
    for k in range(nsteps):
        d = p >> (k + 1)
        frac = region * d / p
        c = _pairs_wave(costs, groups, sv[v], sv[v ^ d], frac, w)
        halving.append(_fused(costs, c, groups[:, sv[v ^ d]], frac))
    last = own_red = None
    if not in_place and depth:
        last = _pairs_wave(costs, groups, sv[v], sv[v ^ 1], region / p, w)
        own_red = channels * (region / p) / costs.reduce_bytes_per_s[groups[:, sv]]
    doubling = [
        _pairs_wave(costs, groups, sv[v], sv[v ^ (1 << k)], region * (1 << k) / p, w)
        for k in range(depth)
    ]

    def run(s: float, ready: Aff | None = None) -> Aff:
        """Per-member done times (G, n), members starting at ``ready`` (G, n)."""
        g = groups.shape[0]
        ready = Aff.zeros((g, n)) if ready is None else ready
        rx = ready[:, sv]
        first = rx
        if fold_in is not None:
            fin = ready[:, e].maximum(ready[:, e + 1], s) + fold_in
            head = first[:, : fold.r].maximum(fin, s)
            first = Aff(
                np.concatenate((head.a, first.a[:, fold.r :]), axis=1),
                np.concatenate((head.b, first.b[:, fold.r :]), axis=1),
            )
        out = Aff(ready.a.copy(), ready.b.copy())
        if depth == 0:
            out.a[:, sv], out.b[:, sv] = first.a, first.b
            return out
        prev, prev_d = None, 0
        for k, cost in enumerate(halving):
            d = p >> (k + 1)
            start = first if prev is None else prev.maximum(prev[:, v ^ prev_d], s)
            prev, prev_d = start.maximum(rx[:, v ^ d], s) + cost, d
        if in_place:
            done = prev.maximum(prev[:, v ^ 1], s)  # type: ignore[union-attr]
        else:
            start = first if prev is None else prev.maximum(prev[:, v ^ prev_d], s)
            end = start.maximum(rx[:, v ^ 1], s) + last  # type: ignore[operator]
            done = end.maximum(end[:, v ^ 1], s) + Aff(np.zeros_like(own_red), own_red)  # type: ignore[arg-type]
        prev, prev_d = None, 0
        for k, cost in enumerate(doubling):
            start = done if prev is None else prev.maximum(prev[:, v ^ prev_d], s)
            prev, prev_d = start + cost, 1 << k
        final = prev.maximum(prev[:, v ^ (p >> 1)], s)  # type: ignore[union-attr]
        out.a[:, sv], out.b[:, sv] = final.a, final.b
        if fold_out is not None:
            extra = final[:, : fold.r] + fold_out
            out.a[:, e], out.b[:, e] = extra.a, extra.b
        return out

    def oracle(s: float) -> Aff:
        return run(s).max(s)

    oracle.run = run  # type: ignore[attr-defined]
    return oracle


def direct(costs: FlowCosts, collective: str, n: int, channels: int) -> Oracle:
    """One-shot all_reduce / reduce_scatter / all_gather (``direct.py``)."""
    frac = 1.0 / channels if collective == "all_reduce" else 1.0 / (n * channels)
    j = np.arange(n)
    k = np.arange(1, n)
    src = (j[None, :] - k[:, None]) % n  # round k delivers (j - k) -> j
    dst = np.broadcast_to(j, src.shape)
    wave = costs.wave(src, dst, channels, load_bytes=frac * channels, size=1.0)
    arr = Aff(wave.lat_s.reshape(src.shape), frac * wave.s_per_byte.reshape(src.shape))
    copy_b = frac / costs.copy_bytes_per_s
    if collective == "all_gather":
        side = Aff(np.zeros(n), copy_b)
        return lambda s: Aff(
            np.concatenate((arr.a.ravel(), side.a)), np.concatenate((arr.b.ravel(), side.b))
        ).max(s)
    red_b = frac / costs.reduce_bytes_per_s  # per reduction, at rank j
    m = n - 1  # reductions per channel: own + rounds 2..n-1

    def oracle(s: float) -> Aff:
        if n == 1:
            return Aff(np.zeros(()), copy_b[0])
        seed = arr[0]
        ready = Aff(
            np.concatenate((seed.a[None], arr.a[1:])), np.concatenate((seed.b[None], arr.b[1:]))
        )
        ready = ready.maximum(Aff(np.broadcast_to(seed.a, ready.a.shape),
                                  np.broadcast_to(seed.b, ready.b.shape)), s)  # fmt: skip
        order = np.argsort(ready.at(s), axis=0, kind="stable")
        ra = np.take_along_axis(ready.a, order, 0)
        rb = np.take_along_axis(ready.b, order, 0)
        left = channels * (m - np.arange(m))[:, None]  # reductions still queued from here
        return Aff(ra, rb + left * red_b[None, :]).max(s)

    return oracle


def alltoall_direct(costs: FlowCosts, n: int, channels: int, per_node: int = 1) -> Oracle:
    """NCCL's grouped send-recv (``alltoall.py``): ``n-1`` rounds of whole blocks in NCCL's peer
    order (:func:`~collsim.collectives.alltoall.p2p_peers`), round ``k`` on channel ``k mod C``
    after that channel's previous round (send and receive); the ``C`` rounds in flight at once
    share links as one wave."""
    frac = 1.0 / n
    lanes = min(channels, max(1, n - 1))
    r = np.arange(n)
    send, recv = p2p_peers(n, per_node)
    rounds: dict[int, Aff] = {}
    for first in range(1, n, lanes):
        ks = list(range(first, min(first + lanes, n)))
        src = np.tile(r, len(ks))
        dst = np.concatenate([send[k] for k in ks])
        wave = costs.wave(src, dst, 1, load_bytes=frac, size=1.0, point_to_point=True,
                          channels_per_transfer=channels / lanes)  # fmt: skip
        for i, k in enumerate(ks):
            cut = slice(i * n, (i + 1) * n)
            rounds[k] = Aff(wave.lat_s[cut], frac * wave.s_per_byte[cut])
    copy = Aff(np.zeros(n), frac / costs.copy_bytes_per_s)

    def oracle(s: float) -> Aff:
        end: dict[int, Aff] = {}
        for k in range(1, n):
            before = k - lanes
            start = (Aff.zeros(n) if before < 1
                     else end[before].maximum(end[before][recv[before]], s))  # fmt: skip
            end[k] = start + rounds[k]
        done = copy
        for k in range(max(1, n - lanes), n):  # each channel's last round
            done = done.maximum(end[k], s)
        return done.max(s)

    return oracle


def alltoall_hierarchical(costs: FlowCosts, n: int, per_node: int, channels: int) -> Oracle:
    """Intra-node hand-off to relays, then aggregated inter-node messages (``alltoall.py``)."""
    nn = -(-n // per_node)
    if per_node == 1 or nn == 1:
        return alltoall_direct(costs, n, channels, per_node)
    frac = 1.0 / (n * channels)
    r = np.arange(n)
    node, local = r // per_node, r % per_node
    last = n - (nn - 1) * per_node
    size = np.where(node == nn - 1, last, per_node)
    src, dst = np.meshgrid(r, r, indexing="ij")
    same = node[src] == node[dst]
    target = np.where(same, dst, node[src] * per_node + local[dst] % size[src])
    off = src != dst
    pairs, mult = np.unique(src[off] * n + target[off], return_counts=True)
    ps, pt = pairs // n, pairs % n
    net = ps != pt
    hop1 = Aff(np.zeros(pairs.size), frac / costs.copy_bytes_per_s[ps])
    wave = costs.wave(
        ps[net], pt[net], mult[net] * channels, load_bytes=frac * mult[net] * channels, size=1.0,
        point_to_point=True,
    )  # fmt: skip
    hop1.a[net] = wave.lat_s
    hop1.b[net] = frac * wave.s_per_byte
    # hop 2: relay h of node k -> remote d, after every hop-1 transfer into h bound for d
    k_nodes, dests = np.meshgrid(np.arange(nn), r, indexing="ij")
    keep = node[dests] != k_nodes
    k_nodes, dests = k_nodes[keep], dests[keep]
    ksize = np.where(k_nodes == nn - 1, last, per_node)
    relay = k_nodes * per_node + local[dests] % ksize
    w2 = np.ones_like(ksize) if channels == 1 else ksize * channels
    per_msg = np.where(channels == 1, ksize * frac, frac)
    wave2 = costs.wave(relay, dests, w2, load_bytes=ksize * frac * channels, size=per_msg / frac,
                       point_to_point=True)  # fmt: skip
    hop2 = Aff(wave2.lat_s, per_msg * wave2.s_per_byte)
    index = {int(x): i for i, x in enumerate(pairs)}
    # every (node k, local l): the hop-1 pairs s -> relay for s in node k
    feeds = np.full((k_nodes.size, per_node), -1, dtype=np.int64)
    for q, (kk, h) in enumerate(zip(k_nodes.tolist(), relay.tolist(), strict=True)):
        for t, s_rank in enumerate(range(kk * per_node, min(n, (kk + 1) * per_node))):
            feeds[q, t] = index.get(s_rank * n + h, -1)

    def oracle(s: float) -> Aff:
        valid = feeds >= 0
        fa = np.where(valid, hop1.a[np.maximum(feeds, 0)], 0.0)
        fb = np.where(valid, hop1.b[np.maximum(feeds, 0)], 0.0)
        start = Aff(fa, fb).max(s, axis=1)
        ends = start + hop2
        return Aff(np.concatenate((hop1.a, ends.a)), np.concatenate((hop1.b, ends.b))).max(s)

    return oracle


def sendrecv(costs: FlowCosts, n: int, channels: int) -> Oracle:
    """Every rank sends its buffer to the next (``p2p.py``): one wave."""
    r = np.arange(n)
    wave = costs.wave(r, (r + 1) % n, channels, load_bytes=1.0, size=1.0, point_to_point=True)
    cost = Aff(wave.lat_s, wave.s_per_byte / channels)
    return lambda s: cost.max(s)


def in_network(costs: FlowCosts, n: int) -> Oracle:
    """NVLS / SHARP all-reduce: every rank's flow up to the reducing switch and one down, at once;
    all of them carry the whole buffer (all chunks and channels share them)."""
    ranks = np.arange(n)
    fabric = costs.fabric
    up_ptr, up_links, down_ptr, down_links, lat = fabric.in_network(ranks, ranks)  # type: ignore[attr-defined]
    up_ptr, down_ptr = np.asarray(up_ptr), np.asarray(down_ptr)
    ptr = np.concatenate((up_ptr, up_ptr[-1] + down_ptr[1:])).astype(np.int64)
    links = np.concatenate((up_links, down_links)).astype(np.int64)
    rates = max_min_rates(ptr, links, np.ones(ptr.size - 1), costs.capacity)
    worst = int(costs.link_kind[links].max()) if links.size else 0
    nvls = getattr(fabric, "nvls_all_reduce", None)
    hop = NVLS_LATENCY_S if nvls is not None and nvls(ranks, ranks) else costs.hop_s[worst]
    latency = float(step_latency_s(lat, hop))
    traffic = getattr(fabric, "in_network_traffic", None)
    per_byte = costs.wire * (float(traffic(ranks, ranks)) if traffic is not None else 1.0)
    np.add.at(costs.load_s_per_byte, links, per_byte / costs.capacity[links])
    np.minimum.at(costs.load_lat_s, links, latency)
    finite = rates[np.isfinite(rates)]
    spb = per_byte / finite.min() if finite.size else 0.0
    line = Aff.const(latency, spb)
    return lambda s: line
