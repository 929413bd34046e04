"""Execute a schedule on numpy data and check it computes its collective.

:func:`verify` is the ground truth for every algorithm: it runs the schedule's operations on random
float64 data, in several random topological orders that respect *only* the declared dependencies,
with outputs and scratch poisoned with NaN. A missing dependency then shows up as a read of stale
or poisoned data in some order, a missing write as NaN, a wrong offset as a wrong element.

The collectives' semantics live here (:func:`buffer_counts`, :func:`expected_outputs`), and the
builders take their buffer sizes from the same functions.
"""

from __future__ import annotations

import heapq

import numpy as np

from collsim.collectives.schedule import (
    BUFFERS,
    NETWORK_REDUCE,
    OUTPUT,
    REDUCTION,
    SCRATCH,
    TRANSFER,
    Schedule,
)
from collsim.errors import ScheduleError
from collsim.metrics import COLLECTIVES


class VerificationError(Exception):
    """A schedule does not compute its collective (or is malformed)."""


def buffer_counts(collective: str, nranks: int, count: int) -> tuple[int, int]:
    """(input, output) element counts per rank, as nccl-tests sizes them from ``count``."""
    blk = count // nranks
    sizes = {
        "all_reduce": (count, count),
        "broadcast": (count, count),
        "reduce": (count, count),
        "sendrecv": (count, count),
        "all_gather": (blk, blk * nranks),
        "reduce_scatter": (blk * nranks, blk),
        "alltoall": (blk * nranks, blk * nranks),
    }
    if collective not in sizes:
        raise ScheduleError(
            f"unknown collective; valid: {', '.join(COLLECTIVES)}",
            field="collective",
            value=collective,
        )
    return sizes[collective]


def expected_outputs(collective: str, inputs: np.ndarray, root: int = 0) -> list[np.ndarray | None]:
    """Each rank's correct output for ``inputs`` (shape ``(nranks, input_count)``).

    ``None`` marks an output the collective leaves unspecified (non-root ranks of ``reduce``).
    """
    n = inputs.shape[0]
    if collective == "all_reduce":
        total = inputs.sum(axis=0)
        return [total.copy() for _ in range(n)]
    if collective == "broadcast":
        return [inputs[root].copy() for _ in range(n)]
    if collective == "reduce":
        return [inputs.sum(axis=0) if r == root else None for r in range(n)]
    if collective == "all_gather":
        flat = inputs.reshape(-1)
        return [flat.copy() for _ in range(n)]
    if collective == "reduce_scatter":
        blocks = inputs.sum(axis=0).reshape(n, -1)
        return [blocks[r].copy() for r in range(n)]
    if collective == "alltoall":
        blocks = inputs.reshape(n, n, -1)  # [sender, destination, :]
        return [blocks[:, r, :].reshape(-1).copy() for r in range(n)]
    if collective == "sendrecv":
        return [inputs[(r - 1) % n].copy() for r in range(n)]
    raise ScheduleError(
        f"unknown collective; valid: {', '.join(COLLECTIVES)}", field="collective", value=collective
    )


def verify(schedule: Schedule, *, seed: int = 0, orders: int = 3) -> None:
    """Run ``schedule`` in ``orders`` random dependency-respecting orders; raise on any mismatch."""
    s = schedule
    n = s.nranks
    in_count, out_count = buffer_counts(s.collective, n, s.count)
    scratch = _check_static(s, in_count, out_count)
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((n, in_count))
    expected = expected_outputs(s.collective, inputs, s.root)
    succ_ptr, succ_idx = _successors(s)
    for trial in range(orders):
        order = _random_topological_order(s, succ_ptr, succ_idx, rng)
        bufs = [
            [inputs[r].copy(), np.full(out_count, np.nan), np.full(scratch[r], np.nan)]
            for r in range(n)
        ]
        _execute(s, bufs, order)
        for r in range(n):
            want = expected[r]
            if want is None:
                continue
            got = bufs[r][OUTPUT]
            ok = np.isclose(got, want, rtol=1e-9, atol=1e-9)
            if not ok.all():
                i = int(np.flatnonzero(~ok)[0])
                raise VerificationError(
                    f"{s.collective}/{s.algorithm} on {n} ranks (count {s.count}, "
                    f"order {trial}): rank {r} output[{i}] = {got[i]!r}, expected {want[i]!r}"
                )


def _describe(s: Schedule, i: int) -> str:
    return f"{s.collective}/{s.algorithm}: op {i} ({s.op(i)})"


def _check_static(s: Schedule, in_count: int, out_count: int) -> np.ndarray:
    """Validate ranks, buffers and bounds; return the scratch size each rank needs."""
    a = s.arrays
    n = s.nranks
    m = len(s)
    scratch = np.zeros(n, dtype=np.int64)
    if m == 0:
        return scratch
    bad = (a["count"] < 0) | (a["src_off"] < 0) | (a["dst_off"] < 0)
    bad |= (a["src_buf"] < 0) | (a["src_buf"] > 2) | (a["dst_buf"] < 0) | (a["dst_buf"] > 2)
    bad |= (a["kind"] < 0) | (a["kind"] > 2)
    if bad.any():
        raise VerificationError(f"negative or invalid field in {_describe(s, int(np.argmax(bad)))}")
    p2p = a["kind"] != NETWORK_REDUCE
    rank_bad = p2p & ((a["src"] < 0) | (a["src"] >= n) | (a["dst"] < 0) | (a["dst"] >= n))
    rank_bad |= (a["kind"] == REDUCTION) & (a["src"] != a["dst"])
    if rank_bad.any():
        raise VerificationError(f"bad rank in {_describe(s, int(np.argmax(rank_bad)))}")
    sizes = np.array([in_count, out_count, np.iinfo(np.int64).max])
    for side in ("src", "dst"):
        end = a[f"{side}_off"] + a["count"]
        over = end > sizes[a[f"{side}_buf"]]
        if over.any():
            i = int(np.argmax(over))
            buf = BUFFERS[int(a[f"{side}_buf"][i])]
            raise VerificationError(f"out-of-bounds {side} {buf} access in {_describe(s, i)}")
    for i in np.flatnonzero(~p2p):
        srcs, dsts = s.groups[int(a["src"][i])], s.groups[int(a["dst"][i])]
        if not srcs or any(not 0 <= r < n for r in (*srcs, *dsts)):
            raise VerificationError(f"bad group in {_describe(s, int(i))}")
        for buf_key, off_key, ranks in (("src_buf", "src_off", srcs), ("dst_buf", "dst_off", dsts)):
            if a[buf_key][i] == SCRATCH:
                need = a[off_key][i] + a["count"][i]
                for r in ranks:
                    scratch[r] = max(scratch[r], need)
    for side in ("src", "dst"):
        mask = p2p & (a[f"{side}_buf"] == SCRATCH)
        if mask.any():
            np.maximum.at(scratch, a[side][mask], a[f"{side}_off"][mask] + a["count"][mask])
    return scratch


def _successors(s: Schedule) -> tuple[np.ndarray, np.ndarray]:
    m = len(s)
    owner = np.repeat(np.arange(m), np.diff(s.dep_ptr))
    order = np.argsort(s.dep_idx, kind="stable")
    succ_idx = owner[order]
    succ_ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(s.dep_idx, minlength=m), out=succ_ptr[1:])
    return succ_ptr, succ_idx


def _random_topological_order(
    s: Schedule, succ_ptr: np.ndarray, succ_idx: np.ndarray, rng: np.random.Generator
) -> list[int]:
    """Kahn's algorithm picking, among ready operations, the one with the smallest random key."""
    m = len(s)
    indeg = np.diff(s.dep_ptr).tolist()
    keys = rng.random(m).tolist()
    ptr, idx = succ_ptr.tolist(), succ_idx.tolist()
    heap = [(keys[i], i) for i in range(m) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for j in idx[ptr[i] : ptr[i + 1]]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (keys[j], j))
    if len(order) != m:
        raise VerificationError(f"{s.collective}/{s.algorithm}: dependency cycle")
    return order


def _execute(s: Schedule, bufs: list[list[np.ndarray]], order: list[int]) -> None:
    a = s.arrays
    cols = [
        a[k].tolist()
        for k in ("kind", "src", "dst", "count", "src_buf", "src_off", "dst_buf", "dst_off")
    ]
    red = a["reduce"].tolist()
    kind, src, dst, cnt, sbuf, soff, dbuf, doff = cols
    for i in order:
        c = cnt[i]
        so, do = soff[i], doff[i]
        if kind[i] == NETWORK_REDUCE:
            srcs, dsts = s.groups[src[i]], s.groups[dst[i]]
            total = sum(bufs[r][sbuf[i]][so : so + c] for r in srcs)
            for r in dsts:
                bufs[r][dbuf[i]][do : do + c] = total
            continue
        data = bufs[src[i]][sbuf[i]][so : so + c].copy()
        target = bufs[dst[i]][dbuf[i]]
        if kind[i] == TRANSFER and not red[i]:
            target[do : do + c] = data
        else:
            target[do : do + c] += data
