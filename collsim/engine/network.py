"""Flow-level network model: active flows share directed links by max-min fairness.

Every in-flight transfer is a *flow* of wire bytes over a fixed set of directed links. Whenever
the set of flows changes, rates are recomputed by progressive filling
(:mod:`collsim.engine.maxmin`) -- but only for the flows the change can affect
(:mod:`collsim.engine.incremental`): the links touched since the last recomputation (those of
flows that started or ended) are the seeds, the per-link member sets lead from them to the
flows to recompute, and every other flow keeps its rate and its finish time untouched. The
``mode`` picks the scheme: "components" (bit-identical to "all"), "local" (fastest under heavy
contention; equal up to rounding), "auto" (the default: "components" until a component spans
half of the active flows -- ECMP collisions percolating into a giant component -- then "local"
for the rest of the run), "all" (recompute every active flow: the old behaviour, kept as the
tests' reference). A batch touching more links than ``_MAX_SEEDS`` or than there are active
flows, or an affected set beyond a fraction of the active flows, is recomputed all at once,
vectorised; while "local" keeps giving up, it waits longer and longer before trying again
(``_MAX_BACKOFF``).

Storage: flows live in *slots* of preallocated arrays that double when full, and a finished
flow's slot is reused, so starting or ending flows never copies the other flows' state. Each
flow has a start sequence number; flows always reach the rate computation in that order (the
order the old concatenated arrays had), which is what keeps results bit-identical. The Python
side (each slot's links as a tuple, each link's member set) serves the incremental walks; the
numpy side (per-slot arrays, a -1 padded slot x link table) serves vectorised recomputation,
finish detection (``end_s <= until``) and the next finish time (``end_s.min()``).

Exactness: a flow's finish time is ``anchor_s + remaining_bytes / rate``, and the anchor moves
only when the flow's rate changes, so an uncontended flow of ``S`` bytes started at ``t`` on a
bottleneck of ``B`` bytes/s ends at exactly ``t + S / B`` whatever else happens elsewhere.

Weights: a flow may carry a weight (the sub-flows of a transfer split over several paths, each
its path's share of the transfer's bytes); once some flow has a weight other than 1, every
recomputation is weighted max-min (:mod:`collsim.engine.maxmin`). Until then the unweighted
solvers run, bit-identical to what they gave before weights existed.
"""

from __future__ import annotations

import numpy as np

from collsim.engine.incremental import component, settle
from collsim.engine.maxmin import max_min_rates, max_min_small

__all__ = ["FlowNetwork", "max_min_rates", "max_min_small"]

_EMPTY_I = np.zeros(0, dtype=np.int64)
MODES = ("auto", "components", "local", "all")
_MAX_SEEDS = 4096
"""More changed (flow, link) pairs than this in one batch, or than active flows: recompute
everything (vectorised) at once."""
_SMALL_PAIRS = 192
"""Components with at most this many (flow, link) pairs are solved on Python floats."""
_COMPONENT_FLOWS = 64
"""The component walk gives up past max(this, half of the active flows)."""
_LOCAL_FLOWS = 256
"""The local re-settling gives up past max(this, a quarter of the active flows)."""
_MAX_BACKOFF = 64
"""After a re-settling gives up, the next reshares recompute everything without trying it:
1, then 2, 4, ... up to this many while it keeps giving up. A failed attempt costs a few
vectorised recomputations' time (a 64-chip torus's direct all-gather, every flow crossing
others, spent 70% of its run in attempts that gave up); one success resets the wait."""


class FlowNetwork:
    """The set of active flows, their rates and finish times, and per-link busy time.

    ``mode`` picks which flows a reshare recomputes (see the module doc).
    """

    def __init__(self, capacity_bytes_per_s: np.ndarray, *, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"reshare mode must be one of {MODES}, not {mode!r}")
        self.capacity_bytes_per_s = np.asarray(capacity_bytes_per_s, dtype=np.float64)
        self.mode = mode
        self._scheme = "components" if mode == "auto" else mode  # the one in use now
        nl = self.capacity_bytes_per_s.shape[0]
        self._capacity = self.capacity_bytes_per_s.tolist()
        self.link_flows = np.zeros(nl, dtype=np.int64)
        self.busy_since_s = np.zeros(nl)
        self.busy_s = np.zeros(nl)
        self._members: dict[int, set[int]] = {}  # link -> slots of the flows crossing it
        self._touched: list[int] = []  # links whose flows changed since the last reshare
        self._free: list[int] = []  # free slots, a stack
        self._paths: list[tuple[int, ...]] = []  # per slot, its links
        self._seq: list[int] = []  # per slot, the start order of its flow
        self._rate: list[float] = []  # per slot, rate_bytes_per_s as Python floats
        self._bottleneck: list[int] = []  # per slot, a link its rate is settled at (-1: unknown)
        self._ceil: list[float] = []  # per slot, its rate ceiling as a Python float
        self._capped = False  # some flow has had a finite ceiling
        self._weight: list[float] = []  # per slot, its max-min weight as a Python float
        self._weighted = False  # some flow has had a weight other than 1
        self._skip = 0  # reshares left to recompute in full before settling locally again
        self._backoff = 1  # the next wait after a re-settling that gives up (_MAX_BACKOFF)
        self._next_seq = 0
        self._active = 0
        self._dirty = False
        self._next_end_s = np.inf
        self._grow(64, 4)

    _FIELDS = (  # per-slot arrays: name, fill value of a free slot, dtype
        ("op", 0, np.int64),  # owning operation
        ("remaining_bytes", 0.0, np.float64),  # wire bytes left at anchor_s
        ("anchor_s", 0.0, np.float64),
        ("rate_bytes_per_s", 0.0, np.float64),
        ("end_s", np.inf, np.float64),
        ("nlinks", 0, np.int64),
        ("order", 0, np.int64),  # start sequence number
        ("live", False, np.bool_),
        ("ceiling", np.inf, np.float64),  # the flow's own rate ceiling (its NCCL channel's)
        ("weight", 1.0, np.float64),  # its claim on a shared link (a path's share of its bytes)
    )

    def _grow(self, slots: int, width: int) -> None:
        """Make room for ``slots`` slots (at least doubling) of up to ``width`` links each."""
        old = len(self._paths)
        size = max(slots, 2 * old) if slots > old else old
        for name, fill, dtype in self._FIELDS:
            out = np.full(size, fill, dtype=dtype)
            if old:
                out[:old] = getattr(self, name)
            setattr(self, name, out)
        w = self._links.shape[1] if old else 0
        links = np.full((size, max(width, w)), -1, dtype=np.int64)  # per slot, -1 padded
        if old:
            links[:old, :w] = self._links
        self._links = links
        self._paths.extend([()] * (size - old))
        self._seq.extend([0] * (size - old))
        self._rate.extend([0.0] * (size - old))
        self._bottleneck.extend([-1] * (size - old))
        self._ceil.extend([float("inf")] * (size - old))
        self._weight.extend([1.0] * (size - old))
        self._free.extend(range(size - 1, old - 1, -1))

    def __len__(self) -> int:
        return self._active

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
        ceiling_bytes_per_s: np.ndarray | None = None,
        weight: np.ndarray | None = None,
    ) -> None:
        """Start flows at ``now_s`` (each with > 0 bytes and >= 1 link; ``links`` concatenated),
        each at most at its ``ceiling_bytes_per_s`` (``None``: no ceiling) and claiming
        ``weight`` shares of each link (``None``: 1; weighted max-min, see the module doc)."""
        k = op.shape[0]
        if k == 0:
            return
        width = int(nlinks.max())
        if k > len(self._free) or width > self._links.shape[1]:
            self._grow(len(self._paths) - len(self._free) + k, width)
        slots_list = self._free[-k:][::-1]
        del self._free[-k:]
        slots = np.array(slots_list, dtype=np.int64)
        self.op[slots] = op
        self.remaining_bytes[slots] = wire_bytes
        self.anchor_s[slots] = now_s
        self.rate_bytes_per_s[slots] = 0.0
        self.end_s[slots] = np.inf
        self.nlinks[slots] = nlinks
        self.live[slots] = True
        ceil = np.full(k, np.inf) if ceiling_bytes_per_s is None else ceiling_bytes_per_s
        self.ceiling[slots] = ceil
        ceil_list = ceil.tolist()
        if not self._capped and np.isfinite(ceil).any():
            self._capped = True
        wts = np.ones(k) if weight is None else np.asarray(weight, dtype=np.float64)
        self.weight[slots] = wts
        wts_list = wts.tolist()
        if not self._weighted and weight is not None and np.any(wts != 1.0):
            self._weighted = True
        seq0 = self._next_seq
        self._next_seq += k
        self.order[slots] = np.arange(seq0, seq0 + k)
        first = np.cumsum(nlinks) - nlinks
        column = np.arange(links.shape[0]) - np.repeat(first, nlinks)
        self._links[np.repeat(slots, nlinks), column] = links
        flat = links.tolist()
        members, paths, seqs = self._members, self._paths, self._seq
        rate, bottleneck = self._rate, self._bottleneck
        lo = 0
        for i, (s, n) in enumerate(zip(slots_list, nlinks.tolist(), strict=True)):
            path = tuple(flat[lo : lo + n])
            lo += n
            paths[s] = path
            seqs[s] = seq0 + i
            self._ceil[s] = ceil_list[i]
            self._weight[s] = wts_list[i]
            rate[s] = 0.0
            bottleneck[s] = -1
            for link in path:
                got = members.get(link)
                if got is None:
                    members[link] = {s}
                else:
                    got.add(s)
        self._touched.extend(flat)
        # Repeated link ids only ever write the same value, so no np.unique is needed here.
        self.busy_since_s[links[self.link_flows[links] == 0]] = now_s
        np.add.at(self.link_flows, links, 1)
        self._active += k
        self._dirty = True

    def pop_finished(self, now_s: float, until_s: float) -> np.ndarray:
        """Remove flows finishing by ``until_s`` (treated as finishing at ``now_s``, the batch's
        time); returns their operations in start order, with repeats for multi-flow ops."""
        if self._next_end_s > until_s:
            return _EMPTY_I
        done = np.flatnonzero(self.end_s <= until_s)
        if done.shape[0] > 1:
            done = done[np.argsort(self.order[done])]
        members, paths = self._members, self._paths
        gone_list: list[int] = []
        done_list = done.tolist()
        for s in done_list:
            path = paths[s]
            paths[s] = ()
            for link in path:
                members[link].discard(s)
            gone_list.extend(path)
        self._touched.extend(gone_list)
        gone = np.array(gone_list, dtype=np.int64)
        np.subtract.at(self.link_flows, gone, 1)
        idle = gone[self.link_flows[gone] == 0]
        # Assignment (not +=) so a link listed twice is still credited once.
        self.busy_s[idle] = self.busy_s[idle] + (now_s - self.busy_since_s[idle])
        finished = self.op[done]
        self.end_s[done] = np.inf
        self.rate_bytes_per_s[done] = 0.0
        self.live[done] = False
        self._links[done] = -1
        self._free.extend(done_list)
        self._active -= len(done_list)
        self._dirty = True
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
        touched, self._touched = self._touched, []
        if self._active == 0:
            self._next_end_s = np.inf
            return
        # Changes on the scale of the whole network (a batch as large as what is in flight):
        # recompute everything at once rather than walk out from each change.
        small = len(touched) <= min(_MAX_SEEDS, self._active)
        found = self._affected(touched) if small else None
        if found is None:  # everything, in start order, vectorised
            idx = np.flatnonzero(self.live)
            idx = idx[np.argsort(self.order[idx])]
            rows = self._links[idx]
            new = max_min_rates(rows[rows >= 0], self.nlinks[idx], self.capacity_bytes_per_s,
                                self.ceiling[idx] if self._capped else None,
                                self.weight[idx] if self._weighted else None)  # fmt: skip
            if self._scheme == "local":
                self._bottleneck = [-1] * len(self._paths)
        else:
            slots, new = found
            if not slots:
                self._next_end_s = float(self.end_s.min())
                return
            idx = np.array(slots, dtype=np.int64)
        old = self.rate_bytes_per_s[idx]
        changed = new != old
        if changed.any():
            idx, old, new = idx[changed], old[changed], new[changed]
            left = self.remaining_bytes[idx] - old * (now_s - self.anchor_s[idx])
            left = np.maximum(left, 0.0)
            self.remaining_bytes[idx] = left
            self.anchor_s[idx] = now_s
            self.end_s[idx] = now_s + left / new
            self.rate_bytes_per_s[idx] = new
            if self._scheme == "local" and found is None:
                self._rate = self.rate_bytes_per_s.tolist()
            elif self._scheme == "local":
                for s, r in zip(idx.tolist(), new.tolist(), strict=True):
                    self._rate[s] = r
        self._next_end_s = float(self.end_s.min())

    def _affected(self, touched: list[int]) -> tuple[list[int], np.ndarray] | None:
        """Flows to recompute after changes on ``touched`` links and their new rates, by the
        current scheme; ``None``: recompute everything."""
        if self._scheme == "local":
            if self._skip:
                self._skip -= 1
                return None
            limit = max(_LOCAL_FLOWS, self._active // 4)
            found = settle(
                touched,
                self._members,
                self._paths,
                self._rate,
                self._bottleneck,
                self._capacity,
                self._seq,
                limit,
                self._ceil if self._capped else None,
                self._weight if self._weighted else None,
            )
            if found is None:
                self._skip = min(self._backoff, _MAX_BACKOFF)
                self._backoff = min(2 * self._backoff, _MAX_BACKOFF)
                return None
            self._backoff = 1
            slots, rates, bottlenecks = found
            for s, b in zip(slots, bottlenecks, strict=True):
                self._bottleneck[s] = b
            return slots, np.array(rates)
        if self._scheme != "components":
            return None
        limit = max(_COMPONENT_FLOWS, self._active // 2)
        slots = component(touched, self._members, self._paths, self._seq, limit)
        if slots is None:
            if self.mode == "auto":  # a giant component: settle locally from now on
                self._scheme = "local"
                self._rate = self.rate_bytes_per_s.tolist()
            return None
        nlinks = self.nlinks[slots]
        if int(nlinks.sum()) <= _SMALL_PAIRS:
            caps = [self._ceil[s] for s in slots] if self._capped else None
            wts = [self._weight[s] for s in slots] if self._weighted else None
            rates, _ = max_min_small([self._paths[s] for s in slots], self._capacity, caps, wts)
            return slots, np.array(rates)
        rows = self._links[slots]
        return slots, max_min_rates(rows[rows >= 0], nlinks, self.capacity_bytes_per_s,
                                    self.ceiling[slots] if self._capped else None,
                                    self.weight[slots] if self._weighted else None)  # fmt: skip
