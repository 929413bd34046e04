"""Flow-level network model: active flows share directed links by max-min fairness.

Every in-flight transfer is a *flow* of wire bytes over a fixed set of directed links. Whenever
the set of flows changes, rates are recomputed by progressive filling (water-filling), fully
vectorised over all active flows: the flow/link incidence is a pair list sorted by flow, link
loads come from ``np.bincount`` and per-flow minima from ``np.minimum.reduceat``.

Exactness: a flow's finish time is ``anchor_s + remaining_bytes / rate``, and the anchor moves
only when the flow's rate changes, so an uncontended flow of ``S`` bytes started at ``t`` on a
bottleneck of ``B`` bytes/s ends at exactly ``t + S / B`` whatever else happens elsewhere.
"""

from __future__ import annotations

import numpy as np

_EMPTY_I = np.zeros(0, dtype=np.int64)
_EMPTY_F = np.zeros(0, dtype=np.float64)


def max_min_rates(
    pair_link: np.ndarray, nlinks: np.ndarray, capacity_bytes_per_s: np.ndarray
) -> np.ndarray:
    """Max-min fair rates (bytes/s) of flows crossing links.

    Flow ``f`` crosses ``nlinks[f] >= 1`` links, listed contiguously in ``pair_link`` (flows in
    order). Each round computes every link's fair share (remaining capacity / unfrozen flows on
    it) and freezes, at their path minimum, all flows through any link whose share is the
    smallest seen by every flow crossing it (a local bottleneck). Several bottleneck levels are
    settled per round; a flow limited elsewhere gets more than an equal split.
    """
    nflows = nlinks.shape[0]
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
    while flows.shape[0]:
        count = np.bincount(local, minlength=nl)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = remaining / count
        starts = np.zeros(lengths.shape[0], dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        pair_share = share[local]
        flow_min = np.minimum.reduceat(pair_share, starts)
        if count.max() <= 1:  # no link shared: every flow runs at its path's bottleneck
            rates[flows] = flow_min
            break
        pair_min = np.repeat(flow_min, lengths)
        link_min = np.full(nl, np.inf)
        np.minimum.at(link_min, local, pair_min)
        fixed = np.logical_or.reduceat((link_min == share)[local], starts)
        rates[flows[fixed]] = flow_min[fixed]
        pair_fixed = np.repeat(fixed, lengths)
        remaining -= np.bincount(local[pair_fixed], weights=pair_min[pair_fixed], minlength=nl)
        np.maximum(remaining, 0.0, out=remaining)
        keep = ~fixed
        flows, lengths, local = flows[keep], lengths[keep], local[~pair_fixed]
    return rates


class FlowNetwork:
    """The set of active flows, their rates and finish times, and per-link busy time."""

    def __init__(self, capacity_bytes_per_s: np.ndarray) -> None:
        self.capacity_bytes_per_s = np.asarray(capacity_bytes_per_s, dtype=np.float64)
        nl = self.capacity_bytes_per_s.shape[0]
        self.op = _EMPTY_I  # owning operation of each active flow
        self.remaining_bytes = _EMPTY_F  # wire bytes left at anchor_s
        self.anchor_s = _EMPTY_F
        self.rate_bytes_per_s = _EMPTY_F
        self.end_s = _EMPTY_F
        self.nlinks = _EMPTY_I
        self.pair_link = _EMPTY_I  # links of active flows, contiguous per flow, flows in order
        self.link_flows = np.zeros(nl, dtype=np.int64)
        self.busy_since_s = np.zeros(nl)
        self.busy_s = np.zeros(nl)
        self._dirty = False
        self._next_end_s = np.inf

    def __len__(self) -> int:
        return int(self.op.shape[0])

    def next_end_s(self) -> float:
        """Earliest finish time among active flows (``inf`` when none)."""
        return self._next_end_s

    def add(
        self,
        now_s: float,
        op: np.ndarray,
        wire_bytes: np.ndarray,
        nlinks: np.ndarray,
        links: np.ndarray,
    ) -> None:
        """Start flows at ``now_s`` (each with > 0 bytes and >= 1 link; ``links`` concatenated)."""
        if op.shape[0] == 0:
            return
        self.op = np.concatenate((self.op, op))
        self.remaining_bytes = np.concatenate((self.remaining_bytes, wire_bytes))
        self.anchor_s = np.concatenate((self.anchor_s, np.full(op.shape[0], now_s)))
        self.rate_bytes_per_s = np.concatenate((self.rate_bytes_per_s, np.zeros(op.shape[0])))
        self.end_s = np.concatenate((self.end_s, np.full(op.shape[0], np.inf)))
        self.nlinks = np.concatenate((self.nlinks, nlinks))
        self.pair_link = np.concatenate((self.pair_link, links))
        # Repeated link ids only ever write the same value, so no np.unique is needed here.
        self.busy_since_s[links[self.link_flows[links] == 0]] = now_s
        np.add.at(self.link_flows, links, 1)
        self._dirty = True

    def pop_finished(self, now_s: float, until_s: float) -> np.ndarray:
        """Remove flows finishing by ``until_s`` (treated as finishing at ``now_s``, the batch's
        time); returns their operations, with repeats for multi-flow operations."""
        done = self.end_s <= until_s
        if not done.any():
            return _EMPTY_I
        pair_done = np.repeat(done, self.nlinks)
        gone = self.pair_link[pair_done]
        np.subtract.at(self.link_flows, gone, 1)
        idle = gone[self.link_flows[gone] == 0]
        # Assignment (not +=) so a link listed twice is still credited once.
        self.busy_s[idle] = self.busy_s[idle] + (now_s - self.busy_since_s[idle])
        finished = self.op[done]
        keep = ~done
        self.op = self.op[keep]
        self.remaining_bytes = self.remaining_bytes[keep]
        self.anchor_s = self.anchor_s[keep]
        self.rate_bytes_per_s = self.rate_bytes_per_s[keep]
        self.end_s = self.end_s[keep]
        self.nlinks = self.nlinks[keep]
        self.pair_link = self.pair_link[~pair_done]
        self._dirty = True
        self._next_end_s = float(self.end_s.min()) if self.end_s.shape[0] else np.inf
        return finished

    def close_busy(self, now_s: float) -> None:
        """Credit busy time to links still carrying flows at ``now_s`` (used at the very end)."""
        busy = self.link_flows > 0
        self.busy_s[busy] += now_s - self.busy_since_s[busy]
        self.busy_since_s[busy] = now_s

    def reshare(self, now_s: float) -> None:
        """Recompute max-min rates if flows came or went; re-anchor flows whose rate changed."""
        if not self._dirty:
            return
        self._dirty = False
        if self.op.shape[0] == 0:
            self._next_end_s = np.inf
            return
        new = max_min_rates(self.pair_link, self.nlinks, self.capacity_bytes_per_s)
        changed = new != self.rate_bytes_per_s
        if changed.all():
            moved = self.rate_bytes_per_s * (now_s - self.anchor_s)
            self.remaining_bytes = np.maximum(self.remaining_bytes - moved, 0.0)
            self.anchor_s = np.full(new.shape[0], now_s)
            self.end_s = now_s + self.remaining_bytes / new
        elif changed.any():
            old = self.rate_bytes_per_s[changed]
            left = self.remaining_bytes[changed] - old * (now_s - self.anchor_s[changed])
            left = np.maximum(left, 0.0)
            self.remaining_bytes[changed] = left
            self.anchor_s[changed] = now_s
            self.end_s[changed] = now_s + left / new[changed]
        self.rate_bytes_per_s = new
        self._next_end_s = float(self.end_s.min())
