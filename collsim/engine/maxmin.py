"""Max-min fair rates by progressive filling, in two bit-identical implementations.

:func:`max_min_rates` is vectorised (pair lists, ``np.bincount``, ``np.minimum.reduceat``) and
pays ~15 numpy calls per round whatever the size; :func:`max_min_small` runs the very same
arithmetic on Python floats and wins below a few hundred (flow, link) pairs, which is what the
incremental replay mostly hands over (a flow or a small group of colliding flows).

Both settle flows round by round in the same order and add fixed flows' rates to each link's
load in flow order (as ``np.bincount`` does), so for flows given in the same order they return
the same floats, bit for bit. Max-min fairness decomposes over connected components (flows
linked through shared links), and each round treats every component on its own, so running
either function on a union of whole components gives exactly the rates a run over all flows
gives them: this is what lets :mod:`collsim.engine.network` recompute only what changed.

Weights (weighted max-min, weighted progressive filling; Bertsekas and Gallager, *Data
Networks*, 2nd ed., section 6.5.2): a flow of weight ``w`` claims ``w`` shares of each link, so
a link's fair share is per unit of weight (remaining capacity / the weights of its unsettled
flows) and a flow runs at ``w`` times its bottleneck's share. A transfer split over several
paths (:mod:`collsim.topology.multipath`) is one sub-flow per path, each weighted by its share
of the transfer's bytes: adaptive routing or packet spraying spreads one flow's bytes, it does
not multiply its claim, so at a link all of a transfer's sub-flows together weigh what one
unsplit flow does. Without weights (``None``, or every weight 1) the unweighted code runs, so
those results are bit-identical to what they were before weights existed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

_INF = float("inf")


def max_min_rates(
    pair_link: np.ndarray,
    nlinks: np.ndarray,
    capacity_bytes_per_s: np.ndarray,
    ceiling_bytes_per_s: np.ndarray | None = None,
    weight: np.ndarray | None = None,
) -> np.ndarray:
    """Max-min fair rates (bytes/s) of flows crossing links.

    Flow ``f`` crosses ``nlinks[f] >= 1`` links, listed contiguously in ``pair_link`` (flows in
    order). Each round computes every link's fair share (remaining capacity / unfrozen flows on
    it) and freezes, at their path minimum, all flows through any link whose share is the
    smallest seen by every flow crossing it (a local bottleneck). Several bottleneck levels are
    settled per round; a flow limited elsewhere gets more than an equal split.

    ``ceiling_bytes_per_s`` (per flow, ``inf`` for none): a rate the flow never exceeds (its NCCL
    channel's), exactly as if it crossed one more link of its own with that capacity: its
    minimum share is capped by the ceiling, and a flow at its ceiling is settled.

    ``weight`` (per flow, > 0; ``None``: all 1): weighted max-min (module doc). Shares are then
    per unit of weight, a flow's ceiling counts as ``ceiling / weight`` of them, and it runs at
    ``weight`` times its share.
    """
    nflows = nlinks.shape[0]
    if weight is not None and not np.all(weight == 1.0):
        return _weighted_rates(pair_link, nlinks, capacity_bytes_per_s, ceiling_bytes_per_s,
                               np.asarray(weight, dtype=np.float64))  # fmt: skip
    rates = np.empty(nflows, dtype=np.float64)
    if nflows == 0:
        return rates
    if capacity_bytes_per_s.shape[0] <= 4 * pair_link.shape[0]:
        local, remaining = pair_link, capacity_bytes_per_s.astype(np.float64, copy=True)
    else:  # few active links in a large fabric: work on those only
        links, local = np.unique(pair_link, return_inverse=True)
        remaining = capacity_bytes_per_s[links].astype(np.float64, copy=True)
    nl = remaining.shape[0]
    flows = np.arange(nflows)
    lengths = nlinks
    ceil = ceiling_bytes_per_s
    while flows.shape[0]:
        count = np.bincount(local, minlength=nl)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = remaining / count
        starts = np.zeros(lengths.shape[0], dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        pair_share = share[local]
        flow_min = np.minimum.reduceat(pair_share, starts)
        capped = None
        if ceil is not None:
            capped = ceil <= flow_min  # its own link is its bottleneck
            flow_min = np.minimum(flow_min, ceil)
        if count.max() <= 1:  # no link shared: every flow runs at its path's bottleneck
            rates[flows] = flow_min
            break
        pair_min = np.repeat(flow_min, lengths)
        link_min = np.full(nl, np.inf)
        np.minimum.at(link_min, local, pair_min)
        fixed = np.logical_or.reduceat((link_min == share)[local], starts)
        if capped is not None:
            fixed |= capped
        rates[flows[fixed]] = flow_min[fixed]
        pair_fixed = np.repeat(fixed, lengths)
        remaining -= np.bincount(local[pair_fixed], weights=pair_min[pair_fixed], minlength=nl)
        np.maximum(remaining, 0.0, out=remaining)
        keep = ~fixed
        flows, lengths, local = flows[keep], lengths[keep], local[~pair_fixed]
        if ceil is not None:
            ceil = ceil[keep]
    return rates


def _weighted_rates(
    pair_link: np.ndarray,
    nlinks: np.ndarray,
    capacity_bytes_per_s: np.ndarray,
    ceiling_bytes_per_s: np.ndarray | None,
    weight: np.ndarray,
) -> np.ndarray:
    """:func:`max_min_rates` with per-flow weights: the same rounds on shares per unit of weight
    (``remaining / sum of weights``); each settled flow adds ``weight x share`` to its links.
    No "no link shared" shortcut: a link's weight sum stays at or below 1 with two sub-flows on
    it, and the general round settles lone flows in one round anyway."""
    nflows = nlinks.shape[0]
    rates = np.empty(nflows, dtype=np.float64)
    if nflows == 0:
        return rates
    if capacity_bytes_per_s.shape[0] <= 4 * pair_link.shape[0]:
        local, remaining = pair_link, capacity_bytes_per_s.astype(np.float64, copy=True)
    else:
        links, local = np.unique(pair_link, return_inverse=True)
        remaining = capacity_bytes_per_s[links].astype(np.float64, copy=True)
    nl = remaining.shape[0]
    flows = np.arange(nflows)
    lengths = nlinks
    w = weight
    unit_ceil = None if ceiling_bytes_per_s is None else ceiling_bytes_per_s / w
    while flows.shape[0]:
        pair_w = np.repeat(w, lengths)
        load = np.bincount(local, weights=pair_w, minlength=nl)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = remaining / load
        starts = np.zeros(lengths.shape[0], dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        flow_min = np.minimum.reduceat(share[local], starts)
        capped = None
        if unit_ceil is not None:
            capped = unit_ceil <= flow_min
            flow_min = np.minimum(flow_min, unit_ceil)
        pair_min = np.repeat(flow_min, lengths)
        link_min = np.full(nl, np.inf)
        np.minimum.at(link_min, local, pair_min)
        fixed = np.logical_or.reduceat((link_min == share)[local], starts)
        if capped is not None:
            fixed |= capped
        rates[flows[fixed]] = w[fixed] * flow_min[fixed]
        pair_fixed = np.repeat(fixed, lengths)
        used = (pair_w * pair_min)[pair_fixed]
        remaining -= np.bincount(local[pair_fixed], weights=used, minlength=nl)
        np.maximum(remaining, 0.0, out=remaining)
        keep = ~fixed
        flows, lengths, local, w = flows[keep], lengths[keep], local[~pair_fixed], w[keep]
        if unit_ceil is not None:
            unit_ceil = unit_ceil[keep]
    return rates


CAPPED = -2
"""The bottleneck :func:`max_min_small` reports for a flow settled at its own ceiling."""


def max_min_small(
    paths: Sequence[Sequence[int]],
    capacity: Sequence[float] | Mapping[int, float],
    ceiling: Sequence[float] | None = None,
    weight: Sequence[float] | None = None,
) -> tuple[list[float], list[int]]:
    """:func:`max_min_rates` for flows given as link lists, on Python floats (see module doc),
    and each flow's bottleneck: a link it crosses that is saturated and on which no flow is
    faster (the link it was settled at), or :data:`CAPPED` for a flow at its ``ceiling``.

    Same rounds, same comparisons, same order of additions: ``remaining / count`` per link,
    each flow's minimum share, a flow settles if one of its links has no flow with a smaller
    minimum, settled rates are summed per link in flow order and subtracted, clamped at zero
    the way ``np.maximum`` clamps (``-0.0`` stays).

    ``weight`` (per flow; ``None``: all 1): weighted max-min, as :func:`max_min_rates` (the
    bottleneck is then a saturated link on which no flow has a larger rate per unit weight).
    """
    if weight is not None and any(x != 1.0 for x in weight):
        return _weighted_small(paths, capacity, ceiling, weight)
    rates = [0.0] * len(paths)
    bottleneck = [-1] * len(paths)
    remaining: dict[int, float] = {}
    for path in paths:
        for link in path:
            remaining[link] = capacity[link]
    todo = list(range(len(paths)))
    while todo:
        count: dict[int, int] = {}
        for f in todo:
            for link in paths[f]:
                count[link] = count.get(link, 0) + 1
        share = {link: remaining[link] / c for link, c in count.items()}
        flow_min = [min([share[link] for link in paths[f]]) for f in todo]
        capped: set[int] = set()
        if ceiling is not None:
            for i, f in enumerate(todo):
                if ceiling[f] <= flow_min[i]:
                    capped.add(f)
                    flow_min[i] = ceiling[f]
        if max(count.values()) <= 1:  # no link shared: every flow at its path's bottleneck
            for f, m in zip(todo, flow_min, strict=True):
                rates[f] = m
                bottleneck[f] = (
                    CAPPED if f in capped else next(lk for lk in paths[f] if share[lk] == m)
                )
            break
        link_min: dict[int, float] = {}
        for f, m in zip(todo, flow_min, strict=True):
            for link in paths[f]:
                if m < link_min.get(link, _INF):
                    link_min[link] = m
        load: dict[int, float] = {}
        keep = []
        for f, m in zip(todo, flow_min, strict=True):
            path = paths[f]
            if f in capped:
                link = CAPPED
            else:
                for link in path:
                    if link_min[link] == share[link]:
                        break
                else:
                    keep.append(f)
                    continue
            rates[f] = m
            bottleneck[f] = link
            for link in path:
                load[link] = load.get(link, 0.0) + m
        for link, used in load.items():
            left = remaining[link] - used
            remaining[link] = left if left >= 0.0 else 0.0
        todo = keep
    return rates, bottleneck


def _weighted_small(
    paths: Sequence[Sequence[int]],
    capacity: Sequence[float] | Mapping[int, float],
    ceiling: Sequence[float] | None,
    weight: Sequence[float],
) -> tuple[list[float], list[int]]:
    """:func:`max_min_small` with per-flow weights: :func:`_weighted_rates`'s arithmetic on
    Python floats (weights summed per link in flow order, as ``np.bincount`` sums them)."""
    rates = [0.0] * len(paths)
    bottleneck = [-1] * len(paths)
    remaining: dict[int, float] = {}
    for path in paths:
        for link in path:
            remaining[link] = capacity[link]
    unit_ceil = None if ceiling is None else [c / w for c, w in zip(ceiling, weight, strict=True)]
    todo = list(range(len(paths)))
    while todo:
        load: dict[int, float] = {}
        for f in todo:
            w = weight[f]
            for link in paths[f]:
                load[link] = load.get(link, 0.0) + w
        share = {link: remaining[link] / x for link, x in load.items()}
        flow_min = [min([share[link] for link in paths[f]]) for f in todo]
        capped: set[int] = set()
        if unit_ceil is not None:
            for i, f in enumerate(todo):
                if unit_ceil[f] <= flow_min[i]:
                    capped.add(f)
                    flow_min[i] = unit_ceil[f]
        link_min: dict[int, float] = {}
        for f, m in zip(todo, flow_min, strict=True):
            for link in paths[f]:
                if m < link_min.get(link, _INF):
                    link_min[link] = m
        used: dict[int, float] = {}
        keep = []
        for f, m in zip(todo, flow_min, strict=True):
            path = paths[f]
            if f in capped:
                link = CAPPED
            else:
                for link in path:
                    if link_min[link] == share[link]:
                        break
                else:
                    keep.append(f)
                    continue
            rates[f] = weight[f] * m
            bottleneck[f] = link
            for lk in path:
                used[lk] = used.get(lk, 0.0) + weight[f] * m
        for link, x in used.items():
            left = remaining[link] - x
            remaining[link] = left if left >= 0.0 else 0.0
        todo = keep
    return rates, bottleneck
