"""Per-rank start times and slowdowns: stragglers as the engine sees them.

Two optional per-rank arrays change how a schedule is timed, and both engine paths (the event
replay and the contention-free fast path) honour them identically:

* ``rank_start_s`` (seconds, >= 0, one per rank): when each rank enters the collective. An
  operation *issued* by rank ``r`` -- a transfer whose source is ``r`` (its send), a local copy
  or reduction on ``r`` -- cannot start before ``rank_start_s[r]``, even if its dependencies
  are met; an in-network reduction cannot start before its last source rank has entered. The
  receiving side of a transfer is not gated: NCCL's sender writes into the receiver's
  pre-registered buffers, and everything the receiver does next is its own operation, gated by
  its own start.
* ``rank_slowdown`` (factor > 0, one per rank; stragglers have factors >= 1): the rank's local
  GPU work takes ``factor`` times longer: its copies and reductions, and the receive-reduce half
  of fused transfers it receives. Network transfers are unchanged.

``None`` (the default) leaves every time bit-identical to a run without them.
:func:`op_release_s` turns the start times into one earliest start per operation, which the
replay (a deferred dispatch) and the fast path (the initial ready time) read from
:class:`~collsim.engine.prepare.Prepared`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collsim.collectives.schedule import NETWORK_REDUCE, Schedule
from collsim.errors import ScheduleError


def _per_rank(values: Any, nranks: int, field: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (nranks,):
        raise ScheduleError(
            f"needs one value per rank ({nranks})", field=field, value=tuple(arr.shape)
        )
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ScheduleError("must be finite", field=field, value=float(arr[bad][0]))
    return arr


def check_rank_start(values: Any, nranks: int) -> np.ndarray:
    """``values`` as a float array of ``nranks`` finite start times >= 0 (else ScheduleError)."""
    arr = _per_rank(values, nranks, "rank_start_s")
    if (arr < 0).any():
        raise ScheduleError("start times must be >= 0", field="rank_start_s", value=arr.min())
    return arr


def check_rank_slowdown(values: Any, nranks: int) -> np.ndarray:
    """``values`` as a float array of ``nranks`` finite factors > 0 (else ScheduleError)."""
    arr = _per_rank(values, nranks, "rank_slowdown")
    if (arr <= 0).any():
        raise ScheduleError("slowdown factors must be > 0", field="rank_slowdown", value=arr.min())
    return arr


def op_release_s(schedule: Schedule, rank_start_s: np.ndarray) -> np.ndarray:
    """Earliest start of every operation: its issuing rank's start (see module doc)."""
    a = schedule.arrays
    kind, src = a["kind"], a["src"]
    release = np.zeros(len(schedule))
    p2p = kind != NETWORK_REDUCE
    release[p2p] = rank_start_s[src[p2p]]
    for op in np.flatnonzero(~p2p):  # in-network: when its last source has entered
        members = np.asarray(schedule.groups[src[op]], dtype=np.int64)
        release[op] = rank_start_s[members].max() if members.size else 0.0
    return release


def slow_local(
    local_s: np.ndarray, slowdown: np.ndarray, schedule: Schedule, fused: np.ndarray
) -> np.ndarray:
    """``local_s`` with each op's local GPU work stretched by its rank's factor: the issuing rank
    for copies and reductions, the receiving rank for fused receive-reduces (in-network
    reductions have no local work)."""
    a = schedule.arrays
    factor = np.ones(len(schedule))
    p2p = a["kind"] != NETWORK_REDUCE
    factor[p2p] = slowdown[a["src"][p2p]]
    factor[fused] = slowdown[a["dst"][fused]]
    return local_s * factor
