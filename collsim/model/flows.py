"""Flows on the topology: per-transfer latency and the bandwidth each flow gets, as the engine does.

A *wave* is a set of transfers an algorithm runs at the same time (one ring phase on every
channel, one recursive-halving step, one tree level). For each transfer this module gives

* its latency, exactly as ``collsim/engine/prepare.py`` charges it: the larger of the route's
  latency (links and the switches between them) and the protocol's per-hop latency (NCCL
  ``hwLat``) for the slowest link class on the route (:func:`collsim.protocols.step_latency_s`)
  -- with the calibratable per-class latency scales of :class:`~collsim.model.params.ModelParams`;
* its seconds per payload byte: ``1 / (bandwidth_fraction * rate)``, where ``rate`` is the
  max-min fair share (progressive filling, the engine's sharing rule) of the wave's flows over
  the link capacities (times the per-class bandwidth efficiency). Identical flows (channels
  following the same route) are one entry with a weight.

It also accumulates every link's total wire seconds per collective byte, for the link-load bound
(no schedule can finish before its busiest link has carried its bytes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from collsim.engine.prepare import channel_ceiling, route_flush
from collsim.model.params import ModelParams, ProtocolParams
from collsim.model.shares import Shares, WaveShares
from collsim.protocols import HW_NET, step_latency_s
from collsim.transports import PROTOCOL_INDEX, append_links, route_overhead_s

if TYPE_CHECKING:  # the engine's narrow Fabric interface; TopologyFabric implements it
    from collsim.engine.fabric import Fabric


def max_min_rates(
    ptr: np.ndarray,
    links: np.ndarray,
    weight: np.ndarray,
    capacity: np.ndarray,
    ceiling: np.ndarray | None = None,
) -> np.ndarray:
    """Max-min fair rate of each flow copy (bytes/s); flow ``f`` has ``weight[f]`` copies and
    crosses ``links[ptr[f]:ptr[f+1]]``. Flows without links get ``inf``. ``ceiling`` (per flow,
    per copy): a rate no copy exceeds, as a private link of that capacity per copy (the
    engine's rule, :func:`collsim.engine.maxmin.max_min_rates`).

    A fractional weight is weighted max-min: the returned rate is then per unit of weight (a
    flow of weight ``w`` moves ``w`` times it, and ``ceiling`` is per unit of weight too), as
    the engine weighs the sub-flows of a transfer split over paths (:func:`_split_unit`).

    Progressive filling: every round computes each link's fair share (remaining capacity /
    unfrozen copies on it) and freezes, at their path minimum, the flows through every link whose
    share is the smallest any of its flows sees (a local bottleneck) -- the engine's rule, several
    bottleneck levels per round.
    """
    nf = ptr.shape[0] - 1
    rates = np.full(nf, np.inf)
    lengths = np.diff(ptr)
    live = np.flatnonzero(lengths > 0)
    if live.size == 0:
        return rates
    # Links by their own ids (no np.unique: its sort was a third of the time of an all-to-all
    # wave on 1024 GPUs); every per-link figure is the same, summed in the same order.
    local = np.asarray(links, dtype=np.int64)
    remaining = np.array(capacity, dtype=np.float64)
    nl = remaining.size
    flows = live
    lens = lengths[live]
    starts_all = ptr[:-1][live]
    pos = np.repeat(starts_all - np.r_[0, np.cumsum(lens)[:-1]], lens) + np.arange(lens.sum())
    loc = local[pos]
    w = weight[flows].astype(np.float64)
    ceil = None if ceiling is None else np.asarray(ceiling, dtype=np.float64)[flows]
    while flows.size:
        w_pair = np.repeat(w, lens)
        load = np.bincount(loc, weights=w_pair, minlength=nl)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, remaining / load, np.inf)
        starts = np.r_[0, np.cumsum(lens)[:-1]]
        pair_share = share[loc]
        flow_min = np.minimum.reduceat(pair_share, starts)
        capped = None
        if ceil is not None:
            capped = ceil <= flow_min * (1 + 1e-12)
            flow_min = np.minimum(flow_min, ceil)
        pair_min = np.repeat(flow_min, lens)
        link_min = np.full(nl, np.inf)
        np.minimum.at(link_min, loc, pair_min)
        fixed = np.logical_or.reduceat(pair_share <= link_min[loc] * (1 + 1e-12), starts)
        if capped is not None:
            fixed |= capped
        rates[flows[fixed]] = flow_min[fixed]
        pair_fixed = np.repeat(fixed, lens)
        remaining -= np.bincount(
            loc[pair_fixed], weights=(w_pair * pair_min)[pair_fixed], minlength=nl
        )
        np.maximum(remaining, 0.0, out=remaining)
        keep = ~fixed
        flows, lens, w, loc = flows[keep], lens[keep], w[keep], loc[~pair_fixed]
        if ceil is not None:
            ceil = ceil[keep]
    return rates


def fluid_finish(
    ptr: np.ndarray,
    links: np.ndarray,
    weight: np.ndarray,
    size: np.ndarray,
    capacity: np.ndarray,
    ceiling: np.ndarray | None = None,
) -> np.ndarray:
    """Finish time of each flow (``size[f]`` bytes, ``weight[f]`` copies, all starting at 0) when
    rates are re-shared max-min every time a flow ends -- the engine's rule, exact for flows
    that start together. Scaling every size scales every finish time, so one pass per wave
    serves all message sizes."""
    nf = ptr.shape[0] - 1
    finish = np.zeros(nf)
    lengths = np.diff(ptr)
    left = np.where(lengths > 0, size.astype(np.float64), 0.0)
    active = left > 0
    now = 0.0
    starts = ptr[:-1]
    for _ in range(nf + 1):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        sub_len = lengths[idx]
        sub_ptr = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum(sub_len, out=sub_ptr[1:])
        pos = np.repeat(starts[idx] - sub_ptr[:-1], sub_len) + np.arange(sub_ptr[-1])
        sub_ceiling = None if ceiling is None else ceiling[idx]
        rate = max_min_rates(sub_ptr, links[pos], weight[idx], capacity, sub_ceiling)
        dt = left[idx] / rate
        step = dt.min()
        now += step
        done = dt <= step * (1 + 1e-9)
        left[idx] -= rate * step
        finish[idx[done]] = now
        left[idx[done]] = 0.0
        active[idx[done]] = False
    return finish


def _split_unit(
    split: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    copies: np.ndarray,
    rel: np.ndarray,
    fluid: bool,
    capacity: np.ndarray,
    ceiling: np.ndarray | None = None,
) -> np.ndarray:
    """Seconds per wire byte of flows split over paths: each path a sub-flow with its share
    ``weight`` of the bytes, sharing links max-min with every other sub-flow (re-shared as they
    end where ``fluid``, else at their static shares); a flow ends with its last sub-flow, as
    in the engine. Weighted max-min, as the engine: a sub-flow claims its share of a link (its
    copies times its weight), so the sub-flows of one flow together claim what an unsplit flow
    does. In units per weight a sub-flow moves the flow's bytes (``rel``) at its flow's channel
    ``ceiling`` (one channel drives all paths, split by their shares), so its time per flow byte
    is ``1 / rate``."""
    pair_ptr, weight, ptr, links = split
    npaths = np.diff(pair_ptr)
    sub_claim = np.repeat(copies, npaths) * weight
    sub_ceiling = None if ceiling is None else np.repeat(ceiling, npaths)
    if fluid:
        sub_rel = np.repeat(rel, npaths)
        finish = fluid_finish(ptr, links, sub_claim, sub_rel, capacity, sub_ceiling)
        last = np.maximum.reduceat(finish, pair_ptr[:-1])
        return last / np.where(rel > 0, rel, 1.0)
    rates = max_min_rates(ptr, links, sub_claim, capacity, sub_ceiling)
    per_byte = np.where(np.isinf(rates), 0.0, 1.0 / np.where(rates > 0, rates, 1.0))
    return np.maximum.reduceat(per_byte, pair_ptr[:-1])


FLUID_MAX_FLOWS = 20_000
"""Waves with more flows than this (a direct all-reduce on 1024 GPUs has a million) keep their
static max-min shares instead of being re-shared at every finish: re-sharing costs one max-min
per distinct finish time, and static shares are exact when the flows are symmetric."""

FLUID_MAX_SPLIT = 2048
"""The same for waves whose flows are split over paths (:func:`_split_unit`), counted in
sub-flows. Their sub-flows end at many more distinct times (a detour's before a direct path's):
an all-to-all round on 256 GH200 GPUs routed adaptively (~2.5k sub-flows) re-shared ~114 times,
173 s for the 255 rounds. Past this they keep static shares. Since sub-flows claim their share
of a link (weighted max-min) those are close: rtx6000d's direct reduce-scatter at 64 MiB (1.2k
sub-flows) is 0.8% slower than the engine statically or re-shared alike (when each sub-flow
claimed a whole flow's share, static shares made it 7x slower, re-shared 0.6%)."""


@dataclass
class Wave:
    """A wave's per-flow latency (s) and payload seconds per byte."""

    lat_s: np.ndarray
    s_per_byte: np.ndarray
    src: np.ndarray
    dst: np.ndarray


def _scaled(ceiling: np.ndarray | None, factor: float) -> np.ndarray | None:
    """A channel ceiling times a calibration's channel efficiency (``None``: no ceiling)."""
    return ceiling if ceiling is None or factor == 1.0 else ceiling * factor


class FlowCosts:
    """Latencies and fair shares of rank-to-rank flows on one fabric, under one parameter set.

    ``cache``: max-min results to reuse and add to, a dict that holds for this fabric and this
    parameter set's capacities (a model shares one between its protocols and channel counts),
    or a :class:`WaveShares` of the fabric, from which the set for these capacities is taken
    (:attr:`cache` then holds it)."""

    def __init__(
        self,
        fabric: Fabric,
        params: ModelParams,
        protocol: ProtocolParams,
        cache: Shares | WaveShares | None = None,
        both_ways: bool = False,
        trees: int = 0,
    ) -> None:
        self.fabric = fabric
        self.trees = int(trees)
        self.params = params
        self.protocol = protocol
        self.nranks = int(fabric.nranks)
        kind = np.asarray(fabric.link_kind, dtype=np.int64)
        self.link_kind = kind
        eff = np.asarray(params.bandwidth_efficiency)[kind]
        self.eff = eff
        self.capacity = np.asarray(fabric.capacity_bytes_per_s, dtype=np.float64) * eff
        self.cache: Shares = (
            cache.for_capacity(self.capacity)
            if isinstance(cache, WaveShares)
            else ({} if cache is None else cache)
        )
        network = getattr(fabric, "network", None)
        self.link_latency_s = np.zeros(kind.shape[0])  # per link, the proxies' (last) 0
        if network is not None:
            own = np.asarray(network.latency_s, dtype=np.float64)
            self.link_latency_s[: own.shape[0]] = own
        self.hop_s = np.asarray(protocol.hop_latency_s, dtype=np.float64)
        # The net transport's per-step overhead per link for this protocol (transports.py).
        table = getattr(fabric, "transport_overhead_s", None)
        row = PROTOCOL_INDEX.get(protocol.name.lower())
        # A calibration's latency scale of the link's class covers it, as it covers the hops.
        self.transport_s = (
            np.asarray(table[row], dtype=np.float64)
            * np.asarray(params.route_latency_scale, dtype=np.float64)[kind]
            if table is not None and row is not None
            else np.zeros(kind.shape[0])
        )
        self.wire = 1.0 / protocol.bandwidth_fraction
        self.reduce_bytes_per_s = (
            np.asarray(fabric.reduce_bytes_per_s, dtype=np.float64) * params.reduce_efficiency
        )
        self.copy_bytes_per_s = (
            np.asarray(fabric.copy_bytes_per_s, dtype=np.float64) * params.copy_efficiency
        )
        self.load_s_per_byte = np.zeros(kind.shape[0])
        self.load_lat_s = np.full(kind.shape[0], np.inf)
        self.ceiling = {p2p: _scaled(channel_ceiling(fabric, protocol, {"point_to_point": p2p,
                                                                        "both_ways": both_ways,
                                                                        "trees": trees}),
                                     params.channel_efficiency)
                        for p2p in (False, True)}  # fmt: skip
        """Wire bytes/s one channel's flow may reach per link class, for collectives and for
        point-to-point operations (``None``: no ceiling), as the engine caps its flows;
        ``both_ways``: the schedule's ranks send and receive at once (the engine's
        ``Schedule.copies_both_ways``), which slows host-staged channels, shared by the flows
        of a channel's ``trees`` (the schedule's ``meta["trees"]``; ``flows_per_channel``)."""
        self.ceiling_lines: list[tuple[float, float]] = []
        """Per wave, the flow whose bytes take longest at its ceiling: ``(latency, s per byte)``,
        a bound beside the links' (one channel's flow moves at most its channel's rate)."""

    def route_kinds(self, ptr: np.ndarray, links: np.ndarray) -> np.ndarray:
        """The slowest link class on each route (NVLink for an empty one)."""
        lengths = np.diff(ptr)
        worst = np.zeros(lengths.shape[0], dtype=np.int64)
        nonempty = lengths > 0
        if nonempty.any():
            worst[nonempty] = np.maximum.reduceat(self.link_kind[links], ptr[:-1][nonempty])
        return worst

    def routes(
        self, src: np.ndarray, dst: np.ndarray, split: object = False, point_to_point: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR routes and step latency (max of route and protocol hop, with the parameter scales)
        per pair. ``split``: the pairs' :meth:`paths` where the caller has them already.
        ``point_to_point``: through the GPUs' proxies (:meth:`proxies`), as the engine does."""
        ptr, links, lat = self.fabric.routes(src, dst)
        ptr = np.asarray(ptr, dtype=np.int64)
        links = np.asarray(links, dtype=np.int64)
        lat = np.asarray(lat, dtype=np.float64)
        lengths = np.diff(ptr)
        worst = self.route_kinds(ptr, links)
        nonempty = lengths > 0
        scale = np.asarray(self.params.route_latency_scale)
        if np.any(scale != 1.0) and links.size:
            n = lengths.shape[0]
            owner = np.repeat(np.arange(n), lengths)
            link_lat = self.link_latency_s[links]
            extra = (scale[self.link_kind[links]] - 1.0) * link_lat
            # devices' forwarding latency on the route (switches, host staging): its worst class's
            device = np.maximum(lat - np.bincount(owner, weights=link_lat, minlength=n), 0.0)
            lat = (
                lat + np.bincount(owner, weights=extra, minlength=n) + (scale[worst] - 1.0) * device
            )
        if split is False:
            split = self.paths(src, dst)
        if split is not None:  # the slowest class over all paths, as the engine's union route
            pair_ptr, _, p_ptr, p_links = split
            per_path = np.zeros(pair_ptr[-1], dtype=np.int64)
            has = np.diff(p_ptr) > 0
            if has.any():
                per_path[has] = np.maximum.reduceat(self.link_kind[p_links], p_ptr[:-1][has])
            worst = np.maximum(worst, np.maximum.reduceat(per_path, pair_ptr[:-1]))
        # a transport's overhead sits on its NIC cables, which every path of a pair shares
        transport = route_overhead_s(self.transport_s, ptr, links)
        proxies = self.proxies(src, dst, ptr, links) if point_to_point else None
        if proxies is not None:
            extra, message_s = proxies
            ptr, links = append_links(ptr, links, extra)
            transport = transport + message_s
        lat = np.where(nonempty, step_latency_s(lat, self.hop_s[worst], transport), 0.0)
        return ptr, links, lat

    def proxies(
        self, src: np.ndarray, dst: np.ndarray, ptr: np.ndarray, links: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The proxy links of point-to-point pairs over routes ``(ptr, links)`` and the proxy's
        per-message time on their critical path (the fabric's ``proxy_links``, scaled by the
        network class's latency scale as the transport's overhead is); ``None``: no proxy."""
        proxy_links = getattr(self.fabric, "proxy_links", None)
        found = None if proxy_links is None else proxy_links(src, dst, ptr, links)
        if found is None:
            return None
        extra, message_s = found
        return extra, message_s * float(self.params.route_latency_scale[HW_NET])

    def paths(
        self, src: np.ndarray, dst: np.ndarray, point_to_point: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """``(pair_ptr, weight, ptr, links)``: every path of each pair with its share of the
        bytes, where the fabric splits some pair's flow over several paths
        (:mod:`collsim.topology.multipath`); ``None`` where each pair has one path (the route).
        ``point_to_point``: each path through the pair's proxies (:meth:`proxies`)."""
        if not getattr(self.fabric, "multipath", False) or src.shape[0] == 0:
            return None
        pair_ptr, weight, ptr, links, _ = self.fabric.paths(src, dst)  # type: ignore[attr-defined]
        pair_ptr = np.asarray(pair_ptr, dtype=np.int64)
        if np.all(np.diff(pair_ptr) == 1):
            return None
        ptr, links = np.asarray(ptr, dtype=np.int64), np.asarray(links, dtype=np.int64)
        if point_to_point:  # every path of a pair crosses the pair's proxies, as in the engine
            first = pair_ptr[:-1]
            lengths = ptr[first + 1] - ptr[first]
            route_ptr = np.zeros(first.shape[0] + 1, dtype=np.int64)
            np.cumsum(lengths, out=route_ptr[1:])
            route = links[np.repeat(ptr[first], lengths) + np.arange(int(route_ptr[-1]))
                          - np.repeat(route_ptr[:-1], lengths)]  # fmt: skip
            proxies = self.proxies(src, dst, route_ptr, route)
            if proxies is not None:
                owner = np.repeat(np.arange(src.shape[0]), np.diff(pair_ptr))
                ptr, links = append_links(ptr, links, proxies[0][owner])
        return pair_ptr, np.asarray(weight, dtype=np.float64), ptr, links

    def wave(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        weight: np.ndarray | int = 1,
        *,
        load_bytes: np.ndarray | float = 0.0,
        size: np.ndarray | float | None = None,
        point_to_point: bool = False,
        channels_per_transfer: float = 1.0,
    ) -> Wave:
        """Latency and seconds per payload byte of concurrent flows ``src[i] -> dst[i]``.

        ``weight``: identical copies of each flow (channels on the same route). ``load_bytes``:
        payload bytes per collective byte this pair carries over the whole collective (all
        copies and steps), added to the link-load bound. ``size``: relative bytes of each flow
        when the wave runs once and its flows end at different times (the shares are then
        re-computed as flows finish, :func:`fluid_finish`); ``None`` for steady waves (a ring's
        edges are busy step after step, so each keeps its max-min share throughout).
        ``point_to_point`` / ``channels_per_transfer``: the channel ceiling each flow copy gets
        (NCCL's point-to-point rate over the network; the channels one flow stands for), as the
        schedule's ``meta`` tells the engine.
        """
        src = np.asarray(src, dtype=np.int64).reshape(-1)
        dst = np.asarray(dst, dtype=np.int64).reshape(-1)
        w = np.broadcast_to(np.asarray(weight, dtype=np.float64), src.shape)
        split = self.paths(src, dst, point_to_point)
        ptr, links, lat = self.routes(src, dst, split, point_to_point)
        # Shares scale with a uniform weight (channels), so cache them per normalised weights;
        # the protocol's wire factor multiplies them, its channel ceilings are in the key.
        scale = float(w.min()) if w.size else 1.0
        flows = src.shape[0] if split is None else int(split[0][-1])
        fluid = size is not None and flows <= (
            FLUID_MAX_FLOWS if split is None else FLUID_MAX_SPLIT
        )
        rel = np.broadcast_to(np.asarray(1.0 if size is None else size, np.float64), src.shape)
        # A copy's ceiling in the normalised problem (rates there are `scale` times the copies').
        by_kind = self.ceiling[bool(point_to_point)]
        ceil = (
            None
            if by_kind is None
            else by_kind[self.route_kinds(ptr, links)] * (float(channels_per_transfer) * scale)
        )
        # A digest of the wave, not its bytes: an all-to-all on 2,160 GPUs has ~8,000 waves of
        # ~8,600 flows, whose raw keys alone would hold gigabytes.
        key = hashlib.blake2b(b"".join((src.tobytes(), dst.tobytes(), (w / scale).tobytes(),
                                        rel.tobytes(), bytes([fluid]),
                                        b"" if ceil is None else ceil.tobytes())),
                              digest_size=20).digest()  # fmt: skip
        unit = self.cache.get(key)
        if unit is None:
            if split is not None:
                unit = (_split_unit(split, w / scale, rel, fluid, self.capacity, ceil),)
            elif fluid:
                finish = fluid_finish(ptr, links, w / scale, rel, self.capacity, ceil)
                unit = (finish / np.where(rel > 0, rel, 1.0),)
            else:
                rates = max_min_rates(ptr, links, w / scale, self.capacity, ceil)
                unit = (np.where(np.isinf(rates), 0.0, 1.0 / np.where(rates > 0, rates, 1.0)),)
            self.cache[key] = unit
        spb = self.wire * scale * unit[0]
        # A flushed receive holds each step back in series (the engine adds it to the latency).
        flush = route_flush(self.fabric, self.protocol.name, ptr, links, self.trees, 1.0 / self.eff)
        if flush is not None:
            spb = spb + flush
        load = np.broadcast_to(np.asarray(load_bytes, dtype=np.float64), src.shape)
        if np.any(load > 0):
            share = np.ones(links.shape[0])
            if split is not None:  # each path's links carry its share of the pair's bytes
                pair_ptr, weight, p_ptr, links = split
                path_pair = np.repeat(np.arange(src.shape[0]), np.diff(pair_ptr))
                share = np.repeat(weight, np.diff(p_ptr))
                owner = np.repeat(path_pair, np.diff(p_ptr))
            else:
                owner = np.repeat(np.arange(src.shape[0]), np.diff(ptr))
            np.add.at(self.load_s_per_byte, links,
                      share * load[owner] * self.wire / self.capacity[links])  # fmt: skip
            np.minimum.at(self.load_lat_s, links, lat[owner])
            if ceil is not None:  # each copy's bytes at its own ceiling
                per_byte = self.wire * scale / ceil + (0.0 if flush is None else flush)
                per_copy = np.where(np.diff(ptr) > 0, load / w * per_byte, 0.0)
                worst = int(np.argmax(per_copy))
                if per_copy[worst] > 0:
                    self.ceiling_lines.append((float(lat[worst]), float(per_copy[worst])))
        return Wave(lat, spb, src, dst)

    def load_lines(self) -> tuple[np.ndarray, np.ndarray]:
        """Load bound lines ``(a, b)``: per link, first latency + all wire bytes / capacity; per
        wave, its slowest flow's bytes at its channel's ceiling (:attr:`ceiling_lines`)."""
        used = self.load_s_per_byte > 0
        a, b = self.load_lat_s[used], self.load_s_per_byte[used]
        if self.ceiling_lines:
            extra = np.array(self.ceiling_lines, dtype=np.float64)
            a, b = np.concatenate((a, extra[:, 0])), np.concatenate((b, extra[:, 1]))
        return a, b
