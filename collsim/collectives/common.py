"""Plumbing shared by every algorithm module: the validated request, data splits, dependency tables.

Dependency tables are 2-D int64 arrays, one row per operation (or per rank / ring position), padded
with ``-1`` -- the format :meth:`ScheduleBuilder.transfers` takes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from collsim.collectives.layout import RankLayout
from collsim.collectives.schedule import Schedule, ScheduleBuilder
from collsim.collectives.verify import buffer_counts

DEFAULT_CHUNK_BYTES = 512 * 1024
"""Pipelining granularity of tree, chain and in-network algorithms (NCCL's default is similar)."""

MAX_CHUNKS = 64
"""Pipeline chunks per channel a shallow pipeline may take at most (a deep one takes more:
:func:`collsim.collectives.tree.pipeline_chunk_cap`), so schedules of huge buffers stay small."""

PIPELINE_FILL = 16
"""Chunks per stage of a pipeline's depth that a huge buffer may be cut into. NCCL cuts a buffer
into fixed-size chunks however many there are, so a deep chain or tree runs full for all but its
fill and drain; 16 chunks per stage keep those under ~6% of the time."""

PIPELINE_BUDGET = 1 << 21
"""Transfers the chunks of one pipeline may add up to (chunks x edges), bounding the schedule of a
very deep chain (its fill then costs more than 6%)."""


@dataclass(frozen=True)
class BuildSpec:
    """A validated ``build_schedule`` request, handed to every algorithm builder."""

    collective: str
    algorithm: str
    nranks: int
    count: int
    elem_bytes: int
    layout: RankLayout
    channels: int
    chunk_bytes: int
    root: int

    @property
    def buffers(self) -> tuple[int, int]:
        """(input, output) elements per rank."""
        return buffer_counts(self.collective, self.nranks, self.count)

    @property
    def block(self) -> int:
        """Per-rank block of the blocked collectives (all_gather, reduce_scatter, alltoall)."""
        return self.count // self.nranks

    def channel_pieces(self, total: int) -> Iterator[tuple[int, int, int]]:
        """(channel, offset, count) of each channel's share of ``total``; empty shares skipped.

        Like NCCL, every channel carries ~1/C of the data; the remainder goes to the first ones.
        """
        offs, cnts = split_even(total, self.channels)
        for c in range(self.channels):
            if cnts[c]:
                yield c, int(offs[c]), int(cnts[c])

    def chunks(self, offset: int, count: int, max_chunks: int = MAX_CHUNKS) -> np.ndarray:
        """Pipeline chunk boundaries (K+1 absolute offsets) of ``count`` elements at ``offset``.

        Whole ``chunk_bytes`` chunks and the remainder last, as NCCL cuts a buffer (so 64 bytes
        more than one chunk adds a 64-byte chunk, not two half-size ones: time never falls as
        the size grows); more than ``max_chunks`` of them: ``max_chunks`` equal, larger ones."""
        per_chunk = max(1, self.chunk_bytes // self.elem_bytes)
        k = max(1, -(-count // per_chunk))
        if k > max_chunks:
            return offset + split_bounds(count, max_chunks)
        bounds = np.minimum(np.arange(k + 1, dtype=np.int64) * per_chunk, count)
        return offset + bounds

    def finish(self, builder: ScheduleBuilder, **meta: Any) -> Schedule:
        """Freeze ``builder`` into this request's Schedule."""
        meta.setdefault("ranks_per_node", self.layout.ranks_per_node)
        return builder.build(
            self.collective,
            self.algorithm,
            self.nranks,
            self.count,
            self.elem_bytes,
            root=self.root,
            channels=self.channels,
            meta=meta,
        )


def split_bounds(total: int, parts: int) -> np.ndarray:
    """``parts + 1`` boundaries splitting ``total`` as evenly as possible (larger parts first)."""
    base, extra = divmod(int(total), int(parts))
    sizes = np.full(parts, base, dtype=np.int64)
    sizes[:extra] += 1
    bounds = np.zeros(parts + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return bounds


def split_even(total: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, counts) of ``parts`` near-equal pieces of ``total``."""
    bounds = split_bounds(total, parts)
    return bounds[:-1], np.diff(bounds)


def no_deps(*shape: int) -> np.ndarray:
    """An empty dependency table for ``shape`` operations."""
    return np.full((*shape, 0), -1, dtype=np.int64)


def cat_deps(shape: tuple[int, ...], *parts: np.ndarray) -> np.ndarray:
    """Concatenate dependency columns, each broadcast to ``shape + (k_i,)``; flatten to 2-D."""
    cols = [np.broadcast_to(p, (*shape, p.shape[-1])) for p in parts if p.shape[-1]]
    if not cols:
        return np.full((int(np.prod(shape)), 0), -1, dtype=np.int64)
    out = np.concatenate(cols, axis=-1)
    return out.reshape(-1, out.shape[-1])


def deps_by_rank(nranks: int, ranks: np.ndarray, deps: np.ndarray) -> np.ndarray:
    """Gather dependency rows by rank: ``(nranks, k)`` holding every ``deps[i]`` of ``ranks[i]``.

    A rank may appear several times (a rank in several groups); its rows are merged.
    """
    ranks = np.asarray(ranks, dtype=np.int64).reshape(-1)
    deps = np.asarray(deps, dtype=np.int64).reshape(ranks.shape[0], -1)
    rr = np.repeat(ranks, deps.shape[1])
    dd = deps.reshape(-1)
    keep = dd >= 0
    rr, dd = rr[keep], dd[keep]
    order = np.argsort(rr, kind="stable")
    rr, dd = rr[order], dd[order]
    counts = np.bincount(rr, minlength=nranks)
    width = int(counts.max()) if counts.size else 0
    out = np.full((nranks, width), -1, dtype=np.int64)
    if rr.size:
        start = np.cumsum(counts) - counts
        out[rr, np.arange(rr.size) - start[rr]] = dd
    return out


def add_reductions(
    b: ScheduleBuilder,
    ranks: np.ndarray,
    counts: np.ndarray,
    src_buf: str,
    src_off: np.ndarray,
    dst_buf: str,
    dst_off: np.ndarray,
    deps: np.ndarray,
    channel: int,
) -> np.ndarray:
    """Local ``dst += src`` reductions, one per element of ``ranks``; returns their ids."""
    flat = [np.asarray(x, dtype=np.int64).reshape(-1) for x in (ranks, counts, src_off, dst_off)]
    dep_rows = np.asarray(deps, dtype=np.int64).reshape(flat[0].shape[0], -1).tolist()
    ids = [
        b.reduction(r, c, src_buf, so, dst_buf, do, deps=d, channel=channel)
        for r, c, so, do, d in zip(*(x.tolist() for x in flat), dep_rows, strict=True)
    ]
    return np.asarray(ids, dtype=np.int64).reshape(np.shape(ranks))


def self_copy(
    b: ScheduleBuilder,
    ranks: np.ndarray,
    counts: np.ndarray,
    src_buf: str,
    src_off: np.ndarray,
    dst_buf: str,
    dst_off: np.ndarray,
    deps: np.ndarray,
    channel: int,
) -> np.ndarray:
    """Local copies (a TRANSFER from a rank to itself), one per element of ``ranks``."""
    shape = np.shape(ranks)
    ranks = np.asarray(ranks).reshape(-1)
    ids = b.transfers(
        ranks,
        ranks,
        np.broadcast_to(counts, shape).reshape(-1),
        src_buf,
        np.broadcast_to(src_off, shape).reshape(-1),
        dst_buf,
        np.broadcast_to(dst_off, shape).reshape(-1),
        deps=np.asarray(deps, dtype=np.int64).reshape(ranks.shape[0], -1),
        channel=channel,
    )
    return ids.reshape(shape)


def merge_by_rank(nranks: int, parts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """:func:`deps_by_rank` over several (ranks, deps) pairs of different widths."""
    if not parts:
        return np.full((nranks, 0), -1, dtype=np.int64)
    rows = [(np.asarray(r).reshape(-1), np.asarray(d).reshape(np.size(r), -1)) for r, d in parts]
    width = max(d.shape[1] for _, d in rows)
    padded = [np.pad(d, ((0, 0), (0, width - d.shape[1])), constant_values=-1) for _, d in rows]
    return deps_by_rank(nranks, np.concatenate([r for r, _ in rows]), np.concatenate(padded))
