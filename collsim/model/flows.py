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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from collsim.model.params import ModelParams, ProtocolParams
from collsim.protocols import step_latency_s
from collsim.transports import PROTOCOL_INDEX, route_overhead_s

if TYPE_CHECKING:  # the engine's narrow Fabric interface; TopologyFabric implements it
    from collsim.engine.fabric import Fabric


def max_min_rates(
    ptr: np.ndarray, links: np.ndarray, weight: np.ndarray, capacity: np.ndarray
) -> np.ndarray:
    """Max-min fair rate of each flow copy (bytes/s); flow ``f`` has ``weight[f]`` copies and
    crosses ``links[ptr[f]:ptr[f+1]]``. Flows without links get ``inf``.

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
    uniq, local = np.unique(links, return_inverse=True)
    remaining = capacity[uniq].astype(np.float64)
    nl = uniq.size
    flows = live
    lens = lengths[live]
    starts_all = ptr[:-1][live]
    pos = np.repeat(starts_all - np.r_[0, np.cumsum(lens)[:-1]], lens) + np.arange(lens.sum())
    loc = local[pos]
    w = weight[flows].astype(np.float64)
    while flows.size:
        w_pair = np.repeat(w, lens)
        load = np.bincount(loc, weights=w_pair, minlength=nl)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, remaining / load, np.inf)
        starts = np.r_[0, np.cumsum(lens)[:-1]]
        pair_share = share[loc]
        flow_min = np.minimum.reduceat(pair_share, starts)
        pair_min = np.repeat(flow_min, lens)
        link_min = np.full(nl, np.inf)
        np.minimum.at(link_min, loc, pair_min)
        fixed = np.logical_or.reduceat(pair_share <= link_min[loc] * (1 + 1e-12), starts)
        rates[flows[fixed]] = flow_min[fixed]
        pair_fixed = np.repeat(fixed, lens)
        remaining -= np.bincount(
            loc[pair_fixed], weights=(w_pair * pair_min)[pair_fixed], minlength=nl
        )
        np.maximum(remaining, 0.0, out=remaining)
        keep = ~fixed
        flows, lens, w, loc = flows[keep], lens[keep], w[keep], loc[~pair_fixed]
    return rates
    owner = np.repeat(np.arange(nf), lengths)
    uniq, local = np.unique(links, return_inverse=True)
    remaining = capacity[uniq].astype(np.float64)
    w_pair = weight[owner].astype(np.float64)
    active = live.copy()
    for _ in range(nf + 1):
        pair_on = active[owner]
        if not pair_on.any():
            break
        load = np.bincount(local[pair_on], weights=w_pair[pair_on], minlength=uniq.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, remaining / load, np.inf)
        level = share.min()
        hit = share[local] <= level * (1 + 1e-12)
        frozen = np.zeros(nf, dtype=bool)
        frozen[owner[hit & pair_on]] = True
        frozen &= active
        rates[frozen] = level
        fp = frozen[owner]
        remaining -= np.bincount(local[fp], weights=w_pair[fp] * level, minlength=uniq.size)
        np.maximum(remaining, 0.0, out=remaining)
        active &= ~frozen
    return rates


def fluid_finish(
    ptr: np.ndarray,
    links: np.ndarray,
    weight: np.ndarray,
    size: np.ndarray,
    capacity: np.ndarray,
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
        rate = max_min_rates(sub_ptr, links[pos], weight[idx], capacity)
        dt = left[idx] / rate
        step = dt.min()
        now += step
        done = dt <= step * (1 + 1e-9)
        left[idx] -= rate * step
        finish[idx[done]] = now
        left[idx[done]] = 0.0
        active[idx[done]] = False
    return finish


FLUID_MAX_FLOWS = 20_000
"""Waves with more flows than this (a direct all-reduce on 1024 GPUs has a million) keep their
static max-min shares instead of being re-shared at every finish: re-sharing costs one max-min
per distinct finish time, and static shares are exact when the flows are symmetric."""


@dataclass
class Wave:
    """A wave's per-flow latency (s) and payload seconds per byte."""

    lat_s: np.ndarray
    s_per_byte: np.ndarray
    src: np.ndarray
    dst: np.ndarray


class FlowCosts:
    """Latencies and fair shares of rank-to-rank flows on one fabric, under one parameter set."""

    def __init__(
        self,
        fabric: Fabric,
        params: ModelParams,
        protocol: ProtocolParams,
        cache: dict[bytes, tuple[np.ndarray, ...]] | None = None,
    ) -> None:
        self.fabric = fabric
        self.cache = {} if cache is None else cache
        self.params = params
        self.protocol = protocol
        self.nranks = int(fabric.nranks)
        kind = np.asarray(fabric.link_kind, dtype=np.int64)
        self.link_kind = kind
        eff = np.asarray(params.bandwidth_efficiency)[kind]
        self.capacity = np.asarray(fabric.capacity_bytes_per_s, dtype=np.float64) * eff
        network = getattr(fabric, "network", None)
        self.link_latency_s = (
            np.asarray(network.latency_s, dtype=np.float64)
            if network is not None
            else np.zeros(kind.shape[0])
        )
        self.hop_s = np.asarray(protocol.hop_latency_s, dtype=np.float64)
        # The net transport's per-step overhead per link for this protocol (transports.py).
        table = getattr(fabric, "transport_overhead_s", None)
        row = PROTOCOL_INDEX.get(protocol.name.lower())
        self.transport_s = (
            np.asarray(table[row], dtype=np.float64)
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

    def routes(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR routes and step latency (max of route and protocol hop, with the parameter scales)
        per pair."""
        ptr, links, lat = self.fabric.routes(src, dst)
        ptr = np.asarray(ptr, dtype=np.int64)
        links = np.asarray(links, dtype=np.int64)
        lat = np.asarray(lat, dtype=np.float64)
        lengths = np.diff(ptr)
        worst = np.zeros(lengths.shape[0], dtype=np.int64)
        nonempty = lengths > 0
        if nonempty.any():
            worst[nonempty] = np.maximum.reduceat(self.link_kind[links], ptr[:-1][nonempty])
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
        transport = route_overhead_s(self.transport_s, ptr, links)
        lat = np.where(nonempty, step_latency_s(lat, self.hop_s[worst], transport), 0.0)
        return ptr, links, lat

    def wave(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        weight: np.ndarray | int = 1,
        *,
        load_bytes: np.ndarray | float = 0.0,
        size: np.ndarray | float | None = None,
    ) -> Wave:
        """Latency and seconds per payload byte of concurrent flows ``src[i] -> dst[i]``.

        ``weight``: identical copies of each flow (channels on the same route). ``load_bytes``:
        payload bytes per collective byte this pair carries over the whole collective (all
        copies and steps), added to the link-load bound. ``size``: relative bytes of each flow
        when the wave runs once and its flows end at different times (the shares are then
        re-computed as flows finish, :func:`fluid_finish`); ``None`` for steady waves (a ring's
        edges are busy step after step, so each keeps its max-min share throughout).
        """
        src = np.asarray(src, dtype=np.int64).reshape(-1)
        dst = np.asarray(dst, dtype=np.int64).reshape(-1)
        w = np.broadcast_to(np.asarray(weight, dtype=np.float64), src.shape)
        ptr, links, lat = self.routes(src, dst)
        # Shares scale with a uniform weight (channels), so cache them per normalised weights;
        # they do not depend on the protocol (its wire factor multiplies them).
        scale = float(w.min()) if w.size else 1.0
        fluid = size is not None and src.shape[0] <= FLUID_MAX_FLOWS
        rel = np.broadcast_to(np.asarray(1.0 if size is None else size, np.float64), src.shape)
        key = b"".join((src.tobytes(), dst.tobytes(), (w / scale).tobytes(), rel.tobytes(),
                        bytes([fluid])))  # fmt: skip
        unit = self.cache.get(key)
        if unit is None:
            if fluid:
                finish = fluid_finish(ptr, links, w / scale, rel, self.capacity)
                unit = (finish / np.where(rel > 0, rel, 1.0),)
            else:
                rates = max_min_rates(ptr, links, w / scale, self.capacity)
                unit = (np.where(np.isinf(rates), 0.0, 1.0 / np.where(rates > 0, rates, 1.0)),)
            self.cache[key] = unit
        spb = self.wire * scale * unit[0]
        load = np.broadcast_to(np.asarray(load_bytes, dtype=np.float64), src.shape)
        if np.any(load > 0):
            owner = np.repeat(np.arange(src.shape[0]), np.diff(ptr))
            np.add.at(self.load_s_per_byte, links, load[owner] * self.wire / self.capacity[links])
            np.minimum.at(self.load_lat_s, links, lat[owner])
        return Wave(lat, spb, src, dst)

    def load_lines(self) -> tuple[np.ndarray, np.ndarray]:
        """Link-load bound lines ``(a, b)``: first latency + all wire bytes / capacity."""
        used = self.load_s_per_byte > 0
        return self.load_lat_s[used], self.load_s_per_byte[used]
