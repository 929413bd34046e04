"""The schedule: the one contract between collective algorithms and the engines that time them.

A :class:`Schedule` is a DAG of operations on *ranks* (0..n-1). It says what moves where and what
must finish before what; it knows nothing of links, bandwidths or time. Algorithms build schedules;
the discrete-event engine replays them over a topology; ``verify`` executes them on numpy arrays to
prove they compute their collective.

Data model. Every rank owns three buffers of elements: ``input`` (the collective's send buffer),
``output`` (its receive buffer) and ``scratch`` (staging space, any size). Offsets and counts are in
*elements*; bytes are ``count * elem_bytes``. Operation kinds:

* ``TRANSFER`` -- copy ``count`` elements from rank ``src``'s ``src_buf[src_off:]`` into rank
  ``dst``'s ``dst_buf[dst_off:]`` over the network. With ``reduce`` set the destination
  *accumulates* (``dst += data``), NCCL's fused receive-reduce; the engine then also charges the
  destination GPU a local reduction of that size.
* ``REDUCTION`` -- on rank ``src`` (== ``dst``): ``dst_buf[dst_off:] += src_buf[src_off:]``, a local
  reduction whose cost comes from the GPU's memory bandwidth.
* ``NETWORK_REDUCE`` -- an in-network reduction (NVLS on NVSwitch, SHARP on switches): the
  slices of the ranks in ``groups[src]`` (sources) are summed inside the network and the sum is
  written to every rank in ``groups[dst]`` (destinations).

``deps`` (CSR: ``dep_ptr``/``dep_idx``) name operations that must complete first. Dependencies
always point to earlier operations, so the operation order is a valid execution order.

``after`` (optional column ``arrays["after"]``, -1 for none): the earlier transfer this one follows
on its connection. Sends over one connection go in order (NCCL's fixed slots per peer), but a send
need not wait for the previous one to *arrive*: its bytes may go on the wire as soon as the
previous send's are off it, so per-hop latency overlaps with the previous transfer instead of
adding to it. Engines start the transfer's flow no earlier than the ``after`` op ends; its
latency runs from its dependencies as usual. It orders timing only, never data.

The schedule is stored column-wise in numpy arrays: a 1 GiB ring all-reduce on 1024 GPUs has two
million transfers, and the engine consumes them in vectorised batches. Columns are stored in the
narrowest integer type that holds them (:func:`int_dtype`; ranks, counts and offsets at least
int32, op ids int32 below 2**31 operations), so a 4096-GPU ring's 33 million operations take
about 1.2 GB rather than 3.5 GB. Readers must not assume int64: widen before arithmetic that
could overflow (``count * elem_bytes``, ``src * nranks + dst``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

TRANSFER, REDUCTION, NETWORK_REDUCE = 0, 1, 2
KIND_NAMES = ("transfer", "reduction", "network_reduce")
BUFFERS = ("input", "output", "scratch")
INPUT, OUTPUT, SCRATCH = 0, 1, 2
_BUF_INDEX = {name: i for i, name in enumerate(BUFFERS)}

_INT_FIELDS = ("kind", "src", "dst", "count", "src_buf", "src_off", "dst_buf", "dst_off", "channel")
_FIELDS = (*_INT_FIELDS, "reduce")
_ENUM_FIELDS = frozenset({"kind", "src_buf", "dst_buf", "channel"})
"""Small codes: stored in the narrowest type. The other integer columns are at least int32, so
callers' arithmetic on them (``src * nranks``, ``off + count``) keeps a sane range."""
_EXTENT_FIELDS = ("count", "src_off", "dst_off")
"""One type for all three, wide enough for ``offset + count`` (buffer bounds checks add them)."""


def int_dtype(lo: int, hi: int, floor: type = np.int8) -> np.dtype:
    """The narrowest signed integer type, no narrower than ``floor``, holding ``lo..hi``."""
    for dt in (np.int8, np.int16, np.int32):
        if np.dtype(dt).itemsize < np.dtype(floor).itemsize:
            continue
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return np.dtype(dt)
    return np.dtype(np.int64)


def index_dtype(n: int) -> np.dtype:
    """Type for op ids and CSR offsets up to ``n``: int32 when it fits, else int64."""
    return int_dtype(-1, n, np.int32)


def _span(values: np.ndarray) -> tuple[int, int]:
    return (int(values.min()), int(values.max())) if values.size else (0, 0)


class Op(NamedTuple):
    """One operation, as a readable record (for verification, tests and traces)."""

    id: int
    kind: int
    src: int
    dst: int
    count: int
    src_buf: int
    src_off: int
    dst_buf: int
    dst_off: int
    reduce: bool
    channel: int
    deps: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Schedule:
    """A collective as a DAG of operations on ``nranks`` ranks, and what it is meant to compute.

    ``count`` is the collective's element count as nccl-tests prints it: the per-rank buffer for
    all_reduce, broadcast, reduce and sendrecv; the *total* (all ranks') buffer for all_gather
    (output), reduce_scatter (input) and alltoall (per-rank send buffer).
    """

    collective: str
    algorithm: str
    nranks: int
    count: int
    elem_bytes: int
    arrays: dict[str, np.ndarray]
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    groups: tuple[tuple[int, ...], ...] = ()
    root: int = 0
    channels: int = 1
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.arrays["kind"].shape[0])

    def __getattr__(self, name: str) -> np.ndarray:
        # Column access: schedule.src, schedule.count, ... (only for the stored fields).
        if name in _FIELDS:
            return self.arrays[name]
        raise AttributeError(name)

    @property
    def size_bytes(self) -> int:
        """The collective's size as nccl-tests prints it (``count * elem_bytes``)."""
        return self.count * self.elem_bytes

    @property
    def after(self) -> np.ndarray:
        """Per op, the transfer it follows on its connection (-1: none)."""
        got = self.arrays.get("after")
        return got if got is not None else np.full(len(self), -1, dtype=np.int64)

    def deps_of(self, op_id: int) -> tuple[int, ...]:
        lo, hi = self.dep_ptr[op_id], self.dep_ptr[op_id + 1]
        return tuple(int(d) for d in self.dep_idx[lo:hi])

    def op(self, op_id: int) -> Op:
        a = self.arrays
        return Op(
            op_id,
            *(int(a[name][op_id]) for name in _INT_FIELDS[:-1]),
            bool(a["reduce"][op_id]),
            int(a["channel"][op_id]),
            self.deps_of(op_id),
        )

    def __iter__(self) -> Iterator[Op]:
        return (self.op(i) for i in range(len(self)))

    def _network_mask(self) -> np.ndarray:
        a = self.arrays
        return (a["kind"] == TRANSFER) & (a["src"] != a["dst"])

    def bytes_sent(self) -> np.ndarray:
        """Bytes each rank sends over the network (transfers to other ranks; no local copies)."""
        mask = self._network_mask()
        return np.bincount(
            self.arrays["src"][mask],
            weights=self.arrays["count"][mask].astype(np.int64) * self.elem_bytes,
            minlength=self.nranks,
        )

    def n_transfers(self) -> int:
        """Transfers between different ranks (local copies are not counted)."""
        return int(np.count_nonzero(self._network_mask()))

    def copies_both_ways(self) -> bool:
        """Whether some rank both sends to and receives from other ranks (every rank of a ring
        or an all-to-all, a tree's inner ranks, a chain's middle; not a 2-rank broadcast or a
        direct one). A channel staged through host memory copies slower where it does
        (:mod:`collsim.channel_rates`, host-staged copies)."""
        mask = self._network_mask()
        a = self.arrays
        return bool(np.intersect1d(a["src"][mask], a["dst"][mask]).size)


class ScheduleBuilder:
    """Accumulates operations, one at a time or in numpy batches; ``build`` freezes a Schedule.

    Every add method returns the id(s) of what it added, to be used as later dependencies.
    Dependencies may be given as ``None``/negative to mean "nothing" (handy at a pipeline's start).
    """

    def __init__(self) -> None:
        self._chunks: dict[str, list[np.ndarray]] = {name: [] for name in _FIELDS}
        self._spans: dict[str, tuple[int, int]] = {}
        self._dep_counts: list[np.ndarray] = []
        self._dep_values: list[np.ndarray] = []
        self._rows: list[tuple[int, ...]] = []
        self._row_deps: list[tuple[int, ...]] = []
        self._after_parts: list[tuple[int, np.ndarray]] = []
        self._n = 0
        self.groups: list[tuple[int, ...]] = []

    def __len__(self) -> int:
        return self._n

    # -- single operations -------------------------------------------------------------------
    def _add(self, row: tuple[int, ...], deps: Sequence[int | None] | None) -> int:
        self._rows.append(row)
        self._row_deps.append(_clean(deps))
        self._n += 1
        return self._n - 1

    def transfer(
        self,
        src: int,
        dst: int,
        count: int,
        src_buf: str,
        src_off: int,
        dst_buf: str,
        dst_off: int,
        *,
        reduce: bool = False,
        deps: Sequence[int | None] | None = (),
        channel: int = 0,
        after: int = -1,
    ) -> int:
        """Send ``count`` elements from ``src`` to ``dst`` (accumulate there if ``reduce``);
        ``after``: the earlier transfer it follows on its connection (-1: none)."""
        row = (
            TRANSFER, src, dst, count, _BUF_INDEX[src_buf], src_off, _BUF_INDEX[dst_buf],
            dst_off, channel, int(reduce),
        )  # fmt: skip
        return self._follow(self._add(row, deps), after)

    def _follow(self, op: int, after: int) -> int:
        """Record that ``op`` follows ``after`` (nothing for a negative ``after``)."""
        if after >= 0:
            self._after_parts.append((op, np.array([after], dtype=np.int64)))
        return op

    def reduction(
        self,
        rank: int,
        count: int,
        src_buf: str,
        src_off: int,
        dst_buf: str,
        dst_off: int,
        *,
        deps: Sequence[int | None] | None = (),
        channel: int = 0,
    ) -> int:
        """On ``rank``: ``dst_buf[dst_off:+count] += src_buf[src_off:+count]``."""
        row = (
            REDUCTION, rank, rank, count, _BUF_INDEX[src_buf], src_off, _BUF_INDEX[dst_buf],
            dst_off, channel, 1,
        )  # fmt: skip
        return self._add(row, deps)

    def network_reduce(
        self,
        srcs: Sequence[int],
        dsts: Sequence[int],
        count: int,
        src_buf: str,
        src_off: int,
        dst_buf: str,
        dst_off: int,
        *,
        deps: Sequence[int | None] | None = (),
        channel: int = 0,
        after: int = -1,
    ) -> int:
        """Sum ``srcs``' slices inside the network and write the sum on every rank of ``dsts``;
        ``after``: the earlier in-network reduction of the same switch port this one follows
        (a pipeline's previous chunk; -1: none), as ``after`` for transfers."""
        self.groups.append(tuple(srcs))
        src_group = len(self.groups) - 1
        self.groups.append(tuple(dsts))
        dst_group = len(self.groups) - 1
        row = (
            NETWORK_REDUCE, src_group, dst_group, count, _BUF_INDEX[src_buf], src_off,
            _BUF_INDEX[dst_buf], dst_off, channel, 1,
        )  # fmt: skip
        return self._follow(self._add(row, deps), after)

    # -- batches -----------------------------------------------------------------------------
    def transfers(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        count: np.ndarray | int,
        src_buf: str,
        src_off: np.ndarray | int,
        dst_buf: str,
        dst_off: np.ndarray | int,
        *,
        reduce: bool = False,
        deps: np.ndarray | None = None,
        channel: np.ndarray | int = 0,
        after: np.ndarray | None = None,
    ) -> np.ndarray:
        """Add ``len(src)`` transfers at once; returns their ids.

        ``deps`` is ``None``, a 1-D array (one dependency per transfer, negative for none) or a 2-D
        array of shape ``(len(src), k)`` padded with negatives. ``after``: per transfer, the
        earlier transfer it follows on its connection (negative for none; see the module doc).
        """
        self._flush_rows()
        m = np.shape(src)[0]
        if after is not None:
            after = np.broadcast_to(_narrow(np.asarray(after), np.int32), (m,))
            self._after_parts.append((self._n, after))
        cols = {
            "kind": TRANSFER,
            "src": src,
            "dst": dst,
            "count": count,
            "src_buf": _BUF_INDEX[src_buf],
            "src_off": src_off,
            "dst_buf": _BUF_INDEX[dst_buf],
            "dst_off": dst_off,
            "channel": channel,
            "reduce": bool(reduce),
        }
        for name, value in cols.items():
            self._append(name, np.asarray(value), m)
        if deps is None:
            self._dep_counts.append(np.broadcast_to(np.int8(0), (m,)))
        else:
            d = np.asarray(deps)
            if d.ndim == 1:
                d = d[:, None]
            valid = d >= 0
            self._dep_counts.append(valid.sum(axis=1, dtype=int_dtype(0, d.shape[1])))
            self._dep_values.append(_narrow(d[valid], np.int32))
        ids = np.arange(self._n, self._n + m, dtype=np.int64)
        self._n += m
        return ids

    def _append(self, name: str, values: np.ndarray, m: int) -> None:
        """Store a column chunk of ``m`` entries (a scalar is broadcast, not copied), narrowed."""
        if name == "reduce":
            self._chunks[name].append(np.broadcast_to(values.astype(np.bool_, copy=False), (m,)))
            return
        lo, hi = _span(values)
        if name in self._spans:
            lo, hi = min(lo, self._spans[name][0]), max(hi, self._spans[name][1])
        self._spans[name] = (lo, hi)
        floor = np.int8 if name in _ENUM_FIELDS else np.int32
        self._chunks[name].append(np.broadcast_to(_narrow(values, floor), (m,)))

    def _flush_rows(self) -> None:
        if not self._rows:
            return
        table = np.array(self._rows, dtype=np.int64)
        for i, name in enumerate(_FIELDS):
            self._append(name, table[:, i], table.shape[0])
        self._dep_counts.append(np.array([len(d) for d in self._row_deps], dtype=np.int64))
        flat = [d for deps in self._row_deps for d in deps]
        self._dep_values.append(np.array(flat, dtype=np.int64))
        self._rows.clear()
        self._row_deps.clear()

    def build(
        self,
        collective: str,
        algorithm: str,
        nranks: int,
        count: int,
        elem_bytes: int,
        *,
        root: int = 0,
        channels: int = 1,
        meta: dict[str, Any] | None = None,
    ) -> Schedule:
        self._flush_rows()
        n = self._n
        arrays: dict[str, np.ndarray] = {}
        spans = self._spans
        extent = max((spans.get(f, (0, 0)) for f in _EXTENT_FIELDS[1:]), key=lambda x: x[1])
        extent_lo = min(spans.get(f, (0, 0))[0] for f in _EXTENT_FIELDS)
        for name in _FIELDS:
            if name == "reduce":
                dtype = np.dtype(np.bool_)
            elif name in _EXTENT_FIELDS:
                dtype = int_dtype(extent_lo, spans.get("count", (0, 0))[1] + extent[1], np.int32)
            else:
                floor = np.int8 if name in _ENUM_FIELDS else np.int32
                dtype = int_dtype(*spans.get(name, (0, 0)), floor)
            arrays[name] = _concat(self._chunks[name], dtype)
            self._chunks[name] = [arrays[name]]  # the chunks' memory goes; the builder stays valid
        counts = _concat(self._dep_counts, None)
        self._dep_counts = [counts]
        total = int(counts.sum(dtype=np.int64))
        dep_ptr = np.zeros(n + 1, dtype=index_dtype(total))
        np.cumsum(counts, dtype=dep_ptr.dtype, out=dep_ptr[1:])
        top = max((_span(v)[1] for v in self._dep_values), default=0)
        dep_idx = _concat(self._dep_values, index_dtype(max(n, top)))  # a bad id stays visible
        self._dep_values = [dep_idx]
        _check_deps_earlier(dep_ptr, dep_idx)
        if self._after_parts:
            after = np.full(n, -1, dtype=index_dtype(n))
            for first, values in self._after_parts:
                ahead = values >= np.arange(first, first + values.shape[0], dtype=after.dtype)
                if ahead.any():
                    bad = first + int(np.argmax(ahead))
                    raise ValueError(f"operation {bad} follows itself or a later operation")
                after[first : first + values.shape[0]] = np.where(values >= 0, values, -1)
            self._after_parts = [(0, after)]
            arrays["after"] = after
        return Schedule(
            collective=collective,
            algorithm=algorithm,
            nranks=nranks,
            count=count,
            elem_bytes=elem_bytes,
            arrays=arrays,
            dep_ptr=dep_ptr,
            dep_idx=dep_idx,
            groups=tuple(self.groups),
            root=root,
            channels=channels,
            meta=dict(meta or {}),
        )


def _check_deps_earlier(dep_ptr: np.ndarray, dep_idx: np.ndarray, block: int = 1 << 20) -> None:
    """Raise if some operation depends on itself or a later one; ``block`` ops at a time, so the
    check's temporaries stay small however many operations there are."""
    n = dep_ptr.shape[0] - 1
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        first, last = int(dep_ptr[lo]), int(dep_ptr[hi])
        if first == last:
            continue
        owner = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(dep_ptr[lo : hi + 1]))
        late = dep_idx[first:last] >= owner
        if late.any():
            bad = int(owner[np.argmax(late)])
            raise ValueError(f"operation {bad} depends on itself or a later operation")


def _narrow(values: np.ndarray, floor: type = np.int8) -> np.ndarray:
    """``values`` (integer or bool) in the narrowest type holding them, ``floor`` or wider."""
    return values.astype(int_dtype(*_span(values), floor), copy=False)


def _concat(parts: list[np.ndarray], dtype: np.dtype | None) -> np.ndarray:
    """Concatenate column chunks into one array of ``dtype`` (no intermediate int64 copy)."""
    if not parts:
        return np.zeros(0, dtype=dtype or np.int64)
    return np.concatenate(parts, dtype=dtype)


def _clean(deps: Sequence[int | None] | None) -> tuple[int, ...]:
    """Dependencies as a sorted tuple without duplicates, ``None`` or negatives."""
    if not deps:
        return ()
    return tuple(sorted({int(d) for d in deps if d is not None and d >= 0}))
