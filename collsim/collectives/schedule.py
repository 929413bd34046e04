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
million transfers, and the engine consumes them in vectorised batches.
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
            weights=self.arrays["count"][mask] * self.elem_bytes,
            minlength=self.nranks,
        )

    def n_transfers(self) -> int:
        """Transfers between different ranks (local copies are not counted)."""
        return int(np.count_nonzero(self._network_mask()))


class ScheduleBuilder:
    """Accumulates operations, one at a time or in numpy batches; ``build`` freezes a Schedule.

    Every add method returns the id(s) of what it added, to be used as later dependencies.
    Dependencies may be given as ``None``/negative to mean "nothing" (handy at a pipeline's start).
    """

    def __init__(self) -> None:
        self._chunks: dict[str, list[np.ndarray]] = {name: [] for name in _FIELDS}
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
    ) -> int:
        """Send ``count`` elements from ``src`` to ``dst`` (accumulate there if ``reduce``)."""
        row = (
            TRANSFER, src, dst, count, _BUF_INDEX[src_buf], src_off, _BUF_INDEX[dst_buf],
            dst_off, channel, int(reduce),
        )  # fmt: skip
        return self._add(row, deps)

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
    ) -> int:
        """Sum ``srcs``' slices inside the network and write the sum on every rank of ``dsts``."""
        self.groups.append(tuple(srcs))
        src_group = len(self.groups) - 1
        self.groups.append(tuple(dsts))
        dst_group = len(self.groups) - 1
        row = (
            NETWORK_REDUCE, src_group, dst_group, count, _BUF_INDEX[src_buf], src_off,
            _BUF_INDEX[dst_buf], dst_off, channel, 1,
        )  # fmt: skip
        return self._add(row, deps)

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
        src = np.asarray(src, dtype=np.int64)
        m = src.shape[0]
        if after is not None:
            self._after_parts.append(
                (self._n, np.broadcast_to(np.asarray(after, dtype=np.int64), (m,)))
            )
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
            "reduce": int(reduce),
        }
        for name, value in cols.items():
            self._chunks[name].append(np.broadcast_to(np.asarray(value, dtype=np.int64), (m,)))
        if deps is None:
            self._dep_counts.append(np.zeros(m, dtype=np.int64))
            self._dep_values.append(np.zeros(0, dtype=np.int64))
        else:
            d = np.asarray(deps, dtype=np.int64)
            if d.ndim == 1:
                d = d[:, None]
            valid = d >= 0
            self._dep_counts.append(valid.sum(axis=1))
            self._dep_values.append(d[valid])
        ids = np.arange(self._n, self._n + m, dtype=np.int64)
        self._n += m
        return ids

    def _flush_rows(self) -> None:
        if not self._rows:
            return
        table = np.array(self._rows, dtype=np.int64)
        for i, name in enumerate(_FIELDS):
            self._chunks[name].append(table[:, i])
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
        arrays: dict[str, np.ndarray] = {}
        for name in _FIELDS:
            parts = self._chunks[name]
            col = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            arrays[name] = col.astype(np.bool_ if name == "reduce" else np.int64)
        counts = np.concatenate(self._dep_counts) if self._dep_counts else np.zeros(0, np.int64)
        dep_ptr = np.zeros(self._n + 1, dtype=np.int64)
        np.cumsum(counts, out=dep_ptr[1:])
        dep_idx = (
            np.concatenate(self._dep_values).astype(np.int64)
            if self._dep_values
            else np.zeros(0, dtype=np.int64)
        )
        owner = np.repeat(np.arange(self._n), counts)
        if dep_idx.size and np.any(dep_idx >= owner):
            bad = int(owner[np.argmax(dep_idx >= owner)])
            raise ValueError(f"operation {bad} depends on itself or a later operation")
        if self._after_parts:
            after = np.full(self._n, -1, dtype=np.int64)
            for first, values in self._after_parts:
                after[first : first + values.shape[0]] = np.where(values >= 0, values, -1)
            if np.any(after >= np.arange(self._n)):
                bad = int(np.argmax(after >= np.arange(self._n)))
                raise ValueError(f"operation {bad} follows itself or a later operation")
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


def _clean(deps: Sequence[int | None] | None) -> tuple[int, ...]:
    """Dependencies as a sorted tuple without duplicates, ``None`` or negatives."""
    if not deps:
        return ()
    return tuple(sorted({int(d) for d in deps if d is not None and d >= 0}))
