"""Replay a schedule's DAG over a fabric: the discrete-event loop, batched and vectorised.

simpy's ``Environment`` is the clock and event queue, driven by a single process. That process
does not model messages one by one (a process or Resource per message costs ~54 s for a
two-million-transfer ring); it advances from one *event time* to the next and handles every
operation that changes state at that time as one numpy batch:

1. flows that finish are removed from the :class:`FlowNetwork`;
2. timed events due now (latencies elapsed -> flows start; local copies, reductions and fused
   receive-reduces finishing) are popped from a heap of batches;
3. finished operations decrement their successors' dependency counters (CSR successor lists,
   ``np.subtract.at``); operations whose counters reach zero start now: network transfers
   after their latency, copies and reductions (reductions serialised per GPU) for their local
   duration (a schedule orders copies that must not overlap, e.g. a broadcast root's chunks);
4. link shares are recomputed once (max-min fairness) if any flow came or went, for the flows
   the change can affect only (:mod:`collsim.engine.incremental`).

A transfer that follows another on its connection (the schedule's ``after``) starts its flow at
the later of ``latency`` after its dependencies and the end of that transfer; if the latter is
still running, the transfer waits as *pending* and is resumed when it ends.

Per-rank start times (stragglers, :mod:`collsim.engine.skew`): an op whose dependencies are met
before its rank has entered the collective is deferred with a release event at that time.

Events within a relative 1e-12 of the batch time are handled with it, so rounding noise does
not split one logical instant into many batches. Authoritative times are the exactly computed
floats (``t + latency``, ``t + bytes / rate``); ``env.now`` follows them.

:func:`simulate` first tries the contention-free fast path (:mod:`collsim.engine.uncontended`),
which returns these same results without events when no resource is ever shared; the replay
runs when something is (or with ``fast_path=False``).

Types: :func:`prepare` stores op ids and CSR offsets narrow (int32) and recomputes latency and
wire bytes on demand, to keep the fast path's memory down. The replay's batches are small
(often a handful of ops), where numpy's fixed costs dominate: fancy indexing or ``ufunc.at``
with int32 indices casts them on every call (~5x slower), and a recomputation is several calls
where a lookup is one. So the replay first takes its own copies (:class:`_Hot`) in ``intp``,
with per-op latency and wire bytes precomputed; that memory is spent only when the replay runs.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Generator

import numpy as np
import simpy

from collsim.collectives.schedule import Schedule
from collsim.engine._csr import gather_rows
from collsim.engine.fabric import Fabric
from collsim.engine.kernel_replay import compiled_replay, supported
from collsim.engine.network import MODES, FlowNetwork
from collsim.engine.prepare import (
    COPY,
    IN_NETWORK,
    LOCAL_REDUCE,
    NET,
    Prepared,
    chunks,
    prepare,
)
from collsim.engine.results import SimResult
from collsim.engine.summarize import Timeline, build_result
from collsim.engine.uncontended import contention_free
from collsim.errors import ScheduleError
from collsim.protocols import Protocol, get_protocol

_FLOW_START, _DONE, _RELEASE = 0, 1, 2
_REL_TOL = 1e-12
_EMPTY = np.zeros(0, dtype=np.int64)
KERNELS = ("compiled", "python")


def simulate(
    schedule: Schedule,
    fabric: Fabric,
    *,
    protocol: str | Protocol = "Simple",
    fast_path: bool = True,
    reshare: str = "auto",
    rank_start_s: np.ndarray | None = None,
    rank_slowdown: np.ndarray | None = None,
    kernel: str = "compiled",
) -> SimResult:
    """Time ``schedule`` on ``fabric`` with NCCL ``protocol`` (LL, LL128, Simple or a Protocol).

    With ``fast_path`` (the default) the schedule is first timed as if no two flows ever shared
    a link (:mod:`collsim.engine.uncontended`); if that assumption is then verified, its times
    are exactly the replay's and are returned. Otherwise (or with ``fast_path=False``) the event
    replay runs. ``result.meta["engine_path"]`` says which: "contention_free" or "replay".

    Stragglers (:mod:`collsim.engine.skew`): ``rank_start_s`` (seconds >= 0 per rank) is when
    each rank enters the collective; no operation a rank issues starts before it.
    ``rank_slowdown`` (factor per rank) stretches each rank's local GPU work (copies,
    reductions, fused receive-reduces). ``None`` (the default) changes nothing.

    ``kernel``: "compiled" (the default) runs the replay compiled (:mod:`collsim.engine.
    kernel_replay`) where it handles the schedule, "python" always runs the simpy process here;
    ``result.meta["replay_kernel"]`` says which ran.

    Raises ``ScheduleError`` if the schedule does not fit the fabric (ranks, groups, an
    in-network reduction on a fabric without a reducing switch) or the per-rank arrays are bad.
    """
    if kernel not in KERNELS:
        raise ValueError(f"replay kernel must be one of {KERNELS}, not {kernel!r}")
    proto = get_protocol(protocol)
    prep = prepare(schedule, fabric, proto, rank_start_s=rank_start_s, rank_slowdown=rank_slowdown)
    if fast_path:
        result = contention_free(schedule, fabric, proto, prep)
        if result is not None:
            return result
    if kernel == "compiled" and supported(prep):
        return _compiled(schedule, fabric, proto, prep, reshare)
    replay = Replay(schedule, fabric, proto, prep, reshare=reshare)
    env = simpy.Environment()
    env.process(replay.run(env))
    env.run()
    result = replay.result()
    result.meta["replay_kernel"] = "python"
    return result


def _compiled(
    schedule: Schedule, fabric: Fabric, proto: Protocol, prep: Prepared, reshare: str
) -> SimResult:
    """The replay by :func:`collsim.engine.kernel_replay.compiled_replay`, as a result."""
    if reshare not in MODES:
        raise ValueError(f"reshare mode must be one of {MODES}, not {reshare!r}")
    hot = _Hot(prep, schedule.arrays["src"])
    start_s, flow_start_s, end_s, busy_s, counts = compiled_replay(
        prep, hot.src, hot.latency_s, hot.wire_bytes, fabric.capacity_bytes_per_s,
        fabric.nranks, reshare,
    )  # fmt: skip
    del hot
    _check_complete(end_s)
    timeline = Timeline(
        start_s=start_s,
        flow_start_s=flow_start_s,
        end_s=end_s,
        busy_s=busy_s,
        in_network_link_bytes=np.zeros(len(fabric.capacity_bytes_per_s)),
    )
    result = build_result(schedule, fabric, proto, prep, timeline, "replay")
    result.meta["replay_kernel"] = "compiled"
    result.meta["replay_counts"] = counts
    return result


def _check_complete(end_s: np.ndarray) -> None:
    """Refuse a replay in which some operation never completed (a dependency cycle)."""
    if np.isnan(end_s).any():
        stuck = int(np.flatnonzero(np.isnan(end_s))[0])
        raise ScheduleError("operation never completed", field="schedule", value=stuck)


def _intp(values: np.ndarray | None) -> np.ndarray | None:
    return None if values is None else values.astype(np.intp, copy=False)


class _Hot:
    """The per-op arrays the event loop indexes, in ``intp`` (see the module doc): successor
    and follower lists, ``after``, routes and issuing ranks, dependency counters (a copy: the
    replay decrements them in place), latency and wire bytes."""

    def __init__(self, prep: Prepared, src: np.ndarray) -> None:
        n = prep.cls.shape[0]
        self.succ_ptr, self.succ_idx = _intp(prep.succ_ptr), _intp(prep.succ_idx)
        self.follow_ptr, self.follow_idx = _intp(prep.follow_ptr), _intp(prep.follow_idx)
        self.after, self.route, self.src = _intp(prep.after), _intp(prep.route), _intp(src)
        self.waiting = prep.waiting.astype(np.intp)
        self.latency_s = np.zeros(n)
        self.wire_bytes = np.zeros(n)
        self.tail_s = None if prep.route_flush_s_per_byte is None else np.zeros(n)
        for part in chunks(n):
            ids = np.arange(part.start, part.stop)
            self.latency_s[part] = prep.latency_s(ids)
            self.wire_bytes[part] = prep.wire_bytes(part)
            if self.tail_s is not None:
                self.tail_s[part] = prep.tail_s(ids)


class Replay:
    """State of one replay: per-op times, dependency counters, the heap and the network."""

    def __init__(
        self,
        schedule: Schedule,
        fabric: Fabric,
        protocol: Protocol,
        prep: Prepared | None = None,
        *,
        reshare: str = "auto",
    ) -> None:
        self.schedule = schedule
        self.fabric = fabric
        self.protocol = protocol
        self.prep: Prepared = prep if prep is not None else prepare(schedule, fabric, protocol)
        n = len(schedule)
        self.hot = _Hot(self.prep, schedule.arrays["src"])
        self.start_s = np.full(n, np.nan)
        self.flow_start_s = np.full(n, np.nan)
        self.end_s = np.full(n, np.nan)
        self.flows_left = np.zeros(n, dtype=np.int64)
        self.fused_end_s = np.zeros(n)
        # Transfers whose latency has elapsed but whose connection is still busy with the
        # transfer they follow (``after``): when their flow may start, once that one ends.
        self.pending = np.zeros(n, dtype=bool)
        self.latency_done_s = np.full(n, np.nan)
        self.n_pending = 0
        self.gpu_free_s = np.zeros(fabric.nranks)
        self.network = FlowNetwork(fabric.capacity_bytes_per_s, mode=reshare)
        self.in_network_link_bytes = np.zeros(len(fabric.capacity_bytes_per_s))
        self._heap: list[tuple[float, int, int, np.ndarray]] = []
        self._seq = itertools.count()
        self.now_s = 0.0

    # -- the event loop ----------------------------------------------------------------------
    def run(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        """The single simpy process: one iteration per distinct event time."""
        ready = np.flatnonzero(self.hot.waiting == 0)
        self._complete([], 0.0, ready)
        self.network.reshare(0.0)
        while True:
            t_heap = self._heap[0][0] if self._heap else np.inf
            t = min(t_heap, self.network.next_end_s())
            if t == np.inf:
                break
            if t > env.now:
                yield env.timeout(t - env.now)
            self.now_s = t
            self._step(t)
        self.network.close_busy(self.now_s)

    def _step(self, t: float) -> None:
        until = t + _REL_TOL * t
        done: list[np.ndarray] = []
        finished = self.network.pop_finished(t, until)
        if finished.size:
            done.append(self._flows_finished(finished, t))
        due: list[np.ndarray] = []
        while self._heap and self._heap[0][0] <= until:
            _, _, etype, ids = heapq.heappop(self._heap)
            if etype == _RELEASE:
                due.append(ids)
            else:
                done.append(self._start_flows(ids, t) if etype == _FLOW_START else ids)
        self._complete(done, t, np.sort(np.concatenate(due)) if due else _EMPTY, held=False)
        self.network.reshare(t)

    def _complete(
        self, parts: list[np.ndarray], t: float, ready: np.ndarray = _EMPTY, held: bool = True
    ) -> None:
        """Mark ops done at ``t``, start what they release, repeat for zero-time ops.

        ``held``: whether ``ready`` may still have to wait for its rank's start time (False
        for ops whose release event is due now)."""
        done = np.concatenate(parts) if parts else _EMPTY
        if held:
            ready = self._hold(ready, t)
        while done.size or ready.size:
            resumed = _EMPTY
            if done.size:
                self.end_s[done] = t
                ready = np.concatenate((ready, self._hold(self._release(done), t)))
                resumed = self._resume(done, t)
            if ready.size > 1:  # sorted, without the repeats _release may return
                ready.sort()
                keep = np.empty(ready.shape[0], dtype=bool)
                keep[0] = True
                np.not_equal(ready[1:], ready[:-1], out=keep[1:])
                ready = ready[keep]
            done = self._dispatch(ready, t) if ready.size else _EMPTY
            if resumed.size:
                done = np.concatenate((done, resumed))
            ready = _EMPTY

    def _resume(self, done: np.ndarray, t: float) -> np.ndarray:
        """Start the flows of pending transfers that follow ``done`` (ended at ``t``) on their
        connection; returns those complete at once."""
        hot = self.hot
        if hot.follow_ptr is None or not self.n_pending:
            return _EMPTY
        positions, _ = gather_rows(hot.follow_ptr, done)
        followers = hot.follow_idx[positions]
        followers = followers[self.pending[followers]]
        if not followers.size:
            return _EMPTY
        self.pending[followers] = False
        self.n_pending -= followers.shape[0]
        at = np.maximum(self.latency_done_s[followers], t)
        now = at <= t
        self._push(at[~now], followers[~now], _FLOW_START)
        return self._start_flows(followers[now], t) if now.any() else _EMPTY

    def _release(self, done: np.ndarray) -> np.ndarray:
        """Decrement successors' counters; return those with no unmet dependency left (an op
        released by several of ``done`` is listed that many times: the caller drops repeats)."""
        positions, _ = gather_rows(self.hot.succ_ptr, done)
        if positions.size == 0:
            return _EMPTY
        targets = self.hot.succ_idx[positions]
        waiting = self.hot.waiting
        np.subtract.at(waiting, targets, 1)
        return targets[waiting[targets] == 0]

    def _hold(self, ready: np.ndarray, t: float) -> np.ndarray:
        """Defer ops whose rank has not entered the collective yet to its start time (a release
        event); return those that may start at ``t``."""
        release = self.prep.release_s
        if release is None or not ready.size:
            return ready
        ready = np.unique(ready)  # _release lists an op once per dependency it met
        late = release[ready] > t
        if late.any():
            self._push(release[ready[late]], ready[late], _RELEASE)
            ready = ready[~late]
        return ready

    def _push(self, times: np.ndarray, ids: np.ndarray, etype: int) -> None:
        """Schedule ``ids`` at ``times`` on the heap, one entry per distinct time."""
        if times.shape[0] == 0:
            return
        first = times[0]
        if (times == first).all():
            heapq.heappush(self._heap, (float(first), next(self._seq), etype, ids))
            return
        order = np.argsort(times, kind="stable")
        times, ids = times[order], ids[order]
        cuts = np.flatnonzero(times[1:] != times[:-1]) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, times.shape[0]], strict=True):
            heapq.heappush(self._heap, (float(times[lo]), next(self._seq), etype, ids[lo:hi]))

    # -- starting operations -----------------------------------------------------------------
    def _dispatch(self, ready: np.ndarray, t: float) -> np.ndarray:
        """Start ``ready`` ops at ``t``; return those that complete at ``t`` already."""
        prep = self.prep
        self.start_s[ready] = t
        cls = prep.cls[ready]
        instant: list[np.ndarray] = []
        flows = ready[(cls == NET) | (cls == IN_NETWORK)]
        if flows.size:
            at = t + self.hot.latency_s[flows]
            if self.hot.after is not None:  # not before the transfer each follows has ended
                pred = self.hot.after[flows]
                pred_end = np.where(pred >= 0, self.end_s[np.maximum(pred, 0)], -np.inf)
                busy = np.isnan(pred_end)
                at = np.maximum(at, np.where(busy, -np.inf, pred_end))
                if busy.any():
                    self.pending[flows[busy]] = True
                    self.n_pending += int(busy.sum())
                    self.latency_done_s[flows[busy]] = at[busy]
                    flows, at = flows[~busy], at[~busy]
            now = at <= t
            if now.any():
                instant.append(self._start_flows(flows[now], t))
            self._push(at[~now], flows[~now], _FLOW_START)
        copies = ready[cls == COPY]
        if copies.size:
            at = t + prep.local_s[copies]
            now = at <= t
            instant.append(copies[now])
            self._push(at[~now], copies[~now], _DONE)
        reductions = ready[cls == LOCAL_REDUCE]
        if reductions.size:
            instant.append(self._reduce(reductions, t))
        return np.concatenate(instant) if instant else _EMPTY

    def _reduce(self, ops: np.ndarray, t: float) -> np.ndarray:
        """Local reductions: one at a time per GPU, in op order; returns those ending at ``t``."""
        rank = self.hot.src[ops]
        duration = self.prep.local_s[ops]
        if np.unique(rank).shape[0] == ops.shape[0]:
            begin = np.maximum(t, self.gpu_free_s[rank])
            end = begin + duration
        else:  # several on one GPU: each starts when the one before it (in op order) ends
            order = np.argsort(rank, kind="stable")
            r, d = rank[order], duration[order]
            first = np.r_[True, r[1:] != r[:-1]]
            lead = np.maximum.accumulate(np.where(first, np.arange(r.shape[0]), 0))
            before = np.cumsum(d) - d
            start = np.maximum(t, self.gpu_free_s[r]) + before - before[lead]
            begin, end = np.empty(ops.shape[0]), np.empty(ops.shape[0])
            begin[order], end[order] = start, start + d
        self.gpu_free_s[rank] = np.maximum(self.gpu_free_s[rank], end)
        self.start_s[ops] = begin
        now = end <= t
        self._push(end[~now], ops[~now], _DONE)
        return ops[now]

    def _start_flows(self, ops: np.ndarray, t: float) -> np.ndarray:
        """Latency has elapsed: put the bytes of ``ops`` on the wire. Returns ops done at once
        (no bytes, or an empty route)."""
        prep = self.prep
        self.flow_start_s[ops] = t
        instant: list[np.ndarray] = []
        net = ops[prep.cls[ops] == NET]
        if net.size and prep.path_ptr is not None:
            fused = net[prep.fused[net]]
            self.fused_end_s[fused] = t + prep.local_s[fused]
            instant.append(self._start_paths(net, t))
        elif net.size:
            fused = net[prep.fused[net]]
            self.fused_end_s[fused] = t + prep.local_s[fused]
            positions, lengths = gather_rows(prep.route_ptr, self.hot.route[net])
            wire = self.hot.wire_bytes[net]
            self.flows_left[net] = 1
            flowing = (lengths > 0) & (wire > 0)
            links = prep.route_links[positions]
            if not flowing.all():
                instant.append(net[~flowing])
                links = links[np.repeat(flowing, lengths)]
            ceiling = prep.route_ceiling
            if ceiling is not None:  # each transfer's flow at most at its channel's rate
                ceiling = ceiling[self.hot.route[net][flowing]]
            self.network.add(t, net[flowing], wire[flowing], lengths[flowing], links, ceiling)
        for op in ops[prep.cls[ops] == IN_NETWORK]:
            nlinks, links = prep.in_network[int(op)]
            wire = float(self.hot.wire_bytes[op])
            flowing = nlinks > 0 if wire > 0 else np.zeros(nlinks.shape[0], dtype=bool)
            count = int(flowing.sum())
            self.flows_left[op] = max(count, 1)
            if count == 0:
                instant.append(np.array([op]))
                continue
            links = links[np.repeat(flowing, nlinks)]
            self.network.add(t, np.full(count, op), np.full(count, wire), nlinks[flowing], links)
            np.add.at(self.in_network_link_bytes, links, wire)
        return self._flows_finished(np.concatenate(instant), t) if instant else _EMPTY

    def _start_paths(self, net: np.ndarray, t: float) -> np.ndarray:
        """Network transfers whose routes may be several paths: one flow per path, carrying
        the path's share of the wire bytes. Returns the transfers with no bytes to send."""
        prep = self.prep
        assert prep.path_ptr is not None and prep.path_weight is not None
        assert prep.path_link_ptr is not None and prep.path_links is not None
        paths, npaths = gather_rows(prep.path_ptr, self.hot.route[net])
        positions, lengths = gather_rows(prep.path_link_ptr, paths)
        owner = np.repeat(net, npaths)
        wire = np.repeat(self.hot.wire_bytes[net], npaths) * prep.path_weight[paths]
        flowing = (lengths > 0) & (wire > 0)
        links = prep.path_links[positions]
        if not flowing.all():
            links = links[np.repeat(flowing, lengths)]
        count = np.bincount(np.repeat(np.arange(net.shape[0]), npaths), weights=flowing,
                            minlength=net.shape[0]).astype(np.int64)  # fmt: skip
        self.flows_left[net] = np.maximum(count, 1)
        share = prep.path_weight[paths]
        ceiling = prep.route_ceiling
        if ceiling is not None:  # one channel drives all paths: its rate split by their shares
            route_ceiling = np.repeat(ceiling[self.hot.route[net]], npaths)
            ceiling = (route_ceiling * share)[flowing]
        # Each path's flow claims its share of a link, so the transfer's flows together claim
        # what one unsplit flow does (weighted max-min: routing splits bytes, not claims).
        self.network.add(t, owner[flowing], wire[flowing], lengths[flowing], links, ceiling,
                         share[flowing])  # fmt: skip
        return net[count == 0]

    def _flows_finished(self, ops: np.ndarray, t: float) -> np.ndarray:
        """Flows of ``ops`` (one entry per flow) ended at ``t``; returns ops now complete.

        A fused receive-reduce completes at max(flow end, flow start + reduction time); a
        flushed receive after its flushes (:meth:`Prepared.tail_s`)."""
        if self.prep.in_network or self.prep.path_ptr is not None:  # several flows per op
            ops, counts = np.unique(ops, return_counts=True)
            self.flows_left[ops] -= counts
        else:  # one flow per operation: ``ops`` has no repeats
            self.flows_left[ops] -= 1
        complete = ops[self.flows_left[ops] == 0]
        done_at = np.where(self.prep.fused[complete], self.fused_end_s[complete], t)
        if self.hot.tail_s is not None:
            done_at = np.maximum(done_at, t + self.hot.tail_s[complete])
        late = done_at > t
        if late.any():
            self._push(done_at[late], complete[late], _DONE)
            complete = complete[~late]
        return complete

    # -- the result --------------------------------------------------------------------------
    def result(self) -> SimResult:
        """Collect the records (see :mod:`collsim.engine.results`)."""
        _check_complete(self.end_s)
        timeline = Timeline(
            start_s=self.start_s,
            flow_start_s=self.flow_start_s,
            end_s=self.end_s,
            busy_s=self.network.busy_s,
            in_network_link_bytes=self.in_network_link_bytes,
        )
        return build_result(
            self.schedule, self.fabric, self.protocol, self.prep, timeline, "replay"
        )
